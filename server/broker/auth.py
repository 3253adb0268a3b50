"""Authentication: who may connect, with passwords stored only as salted scrypt hashes.

Users file (YAML)::

    users:
      alice: {password: "scrypt$16384$8$1$<salt b64>$<hash b64>", roles: [admin]}

``pymq-server passwd alice --users-file users.yaml`` writes such entries.  A plain-text password in the
file is refused at load time.  With no users file, there is one user, ``guest``/``guest``, accepted only
from a loopback address (what RabbitMQ does), so a fresh broker is never open to the network.

scrypt is deliberately slow (tens of ms), so verification runs off the event loop — every check
:meth:`Authenticator.needs_slow_check` says is slow, by the same rules :meth:`Authenticator.authenticate`
follows — in a small pool of its own, at most ``max_pending_logins`` at once (:class:`PasswordChecks`),
and a successful (user, password) pair is remembered by its SHA-256 for the life of the process:
reconnect storms cost a dictionary lookup, and the cache holds no password.
"""
from __future__ import annotations

import base64
import hashlib
import hmac
import ipaddress
import os
import threading
from dataclasses import dataclass, field

import yaml
from pymq_server.config import load_users_file, normalise_subject

from pymq.errors import AuthenticationFailed, ConfigError, ResourceLimit

SCRYPT_N, SCRYPT_R, SCRYPT_P = 16384, 8, 1


def hash_password(password: str, *, n: int = SCRYPT_N, r: int = SCRYPT_R, p: int = SCRYPT_P) -> str:
    salt = os.urandom(16)
    digest = hashlib.scrypt(password.encode("utf-8"), salt=salt, n=n, r=r, p=p, dklen=32)
    return f"scrypt${n}${r}${p}${base64.b64encode(salt).decode()}${base64.b64encode(digest).decode()}"


def verify_password(password: str, stored: str) -> bool:
    try:
        scheme, n, r, p, salt, digest = stored.split("$")
        if scheme != "scrypt":
            return False
        expected = base64.b64decode(digest)
        got = hashlib.scrypt(password.encode("utf-8"), salt=base64.b64decode(salt), n=int(n), r=int(r),
                             p=int(p), dklen=len(expected))
    except (ValueError, TypeError):
        return False
    return hmac.compare_digest(got, expected)


def is_loopback(host: str | None) -> bool:
    if host is None:
        return True  # in-process (vm://) connections
    try:
        return ipaddress.ip_address(host.split("%")[0]).is_loopback
    except ValueError:
        return False


@dataclass
class User:
    name: str
    password_hash: str
    roles: frozenset = field(default_factory=frozenset)
    loopback_only: bool = False
    certificate_subject: str | None = None


#: the principal of a connection before it has authenticated, and of an anonymous login
#: (``allow_anonymous``): every check reads a user's name and roles, never ``None``
ANONYMOUS = User("anonymous", "", frozenset())


class Authenticator:
    def __init__(self, users_file: str | None = None, allow_anonymous: bool = False) -> None:
        self.users_file = users_file
        self.allow_anonymous = allow_anonymous
        self.users: dict[str, User] = {}
        self.by_subject: dict[str, User] = {}     # normalised certificate subject -> user (mutual TLS)
        self.cluster_secret: str | None = None
        self._verified: dict[tuple[str, bytes], bool] = {}
        if users_file:
            self.replace(users_file, load_users(users_file), allow_anonymous)
        else:
            self.users = {"guest": User("guest", _GUEST_HASH, frozenset({"admin"}), loopback_only=True)}

    def reload(self) -> dict:
        """Read the users file again and use it from the next login on (after the admin user operations
        edit it); installed through :meth:`replace`, as SIGHUP's ``BrokerServer.reload`` installs it.
        Open connections keep their user.  An unreadable or invalid file raises ConfigError and the users
        in use stay as they were.  Remembered logins are forgotten, so a changed or removed password stops
        working at once."""
        if not self.users_file:
            raise ConfigError("the broker runs without a users file (only guest/guest from localhost); "
                              "start it with --users-file to manage users")
        users = load_users(self.users_file)
        old = self.users
        self.replace(self.users_file, users, self.allow_anonymous)
        return {"users": len(users), "added": sorted(set(users) - set(old)),
                "removed": sorted(set(old) - set(users)),
                "changed": sorted(n for n in set(users) & set(old) if users[n] != old[n])}

    def replace(self, users_file: str | None, users: dict[str, User] | None, allow_anonymous: bool) -> None:
        """Switch to another set of users at once (BrokerServer.reload, SIGHUP): connections already open
        keep their user; remembered password checks are forgotten, so a changed or removed password takes
        effect.  ``users`` None: no users file, only guest/guest from loopback."""
        self.users_file = users_file
        self.allow_anonymous = allow_anonymous
        if users is None:
            users = {"guest": User("guest", _GUEST_HASH, frozenset({"admin"}), loopback_only=True)}
        self.users = users
        self.by_subject = {normalise_subject(u.certificate_subject): u for u in users.values()
                           if u.certificate_subject}
        self._verified = {}

    def needs_slow_check(self, login: str | None, passcode: str | None, certificate: str | None = None) -> bool:
        """Whether :meth:`authenticate` would compute a password hash for these credentials (scrypt: tens
        of milliseconds, so the caller runs it off the event loop).  The same rules as ``authenticate``
        decide it, so nothing slow is ever answered on the loop: a CONNECT without ``login`` checks
        guest's password when there is no users file, and an unknown user is checked against a dummy
        hash (the answer takes as long as for a known one)."""
        if certificate is not None and self._certificate_user(login, certificate) is not None:
            return False
        credentials = self._password_credentials(login, passcode)
        if credentials is None:
            return False
        return (credentials[0], hashlib.sha256(credentials[1].encode()).digest()) not in self._verified

    def _certificate_user(self, login: str | None, certificate: str) -> User | None:
        if (login or "").startswith("cluster:"):
            return None
        user = self.by_subject.get(normalise_subject(certificate))
        if user is not None and (not login or login == user.name):
            return user
        return None

    def _password_credentials(self, login: str | None, passcode: str | None) -> tuple[str, str] | None:
        """The (login, password) whose hash ``authenticate`` checks; None when it checks no password
        (a cluster node's shared secret, an anonymous login, a CONNECT refused for having no login)."""
        if login is not None and login.startswith("cluster:"):
            return None
        if login is None or login == "":
            if self.users_file:
                return None
            return "guest", passcode if passcode is not None else "guest"
        return login, passcode or ""

    def authenticate(self, login: str | None, passcode: str | None, peer_host: str | None,
                     certificate: str | None = None) -> User:
        """The user, or AuthenticationFailed with a message that does not reveal which part was wrong
        (except the loopback rule, which is a configuration matter worth spelling out).
        ``certificate``: the RFC 4514 subject of the peer's verified TLS client certificate; when a user
        lists it as ``certificate_subject`` and the CONNECT names no other login, that is the user."""
        if certificate is not None:
            user = self._certificate_user(login, certificate)
            if user is not None:
                if user.loopback_only and not is_loopback(peer_host):
                    raise AuthenticationFailed(f"user '{user.name}' can only connect via localhost",
                                               user=user.name)
                return user
        if login is not None and login.startswith("cluster:"):
            # another node of the cluster (spec/cluster.md §2): the shared secret, compared in constant time
            secret = self.cluster_secret
            if not secret or not hmac.compare_digest((passcode or "").encode(), secret.encode()):
                raise AuthenticationFailed(f"access refused for cluster node '{login[8:]}'", user=login)
            return User(login, "", frozenset({"admin", "cluster"}))
        credentials = self._password_credentials(login, passcode)
        if credentials is None:
            if self.allow_anonymous:
                return ANONYMOUS
            raise AuthenticationFailed("login required: CONNECT has no 'login' header")
        login, password = credentials
        user = self.users.get(login)
        key = (login, hashlib.sha256(password.encode()).digest())
        ok = self._verified.get(key)
        if ok is None:
            # an unknown user costs the same hash as a known one (guest's, never accepted for it): the
            # time taken does not tell whether a user exists
            ok = verify_password(password, user.password_hash if user is not None else _GUEST_HASH)
            ok = ok and user is not None
            if ok:
                self._verified[key] = True
        if not ok or user is None:
            raise AuthenticationFailed(f"access refused for user '{login}': wrong username or password",
                                       user=login)
        if user.loopback_only and not is_loopback(peer_host):
            raise AuthenticationFailed(f"user '{login}' can only connect via localhost "
                                       f"(configure a users file to allow remote users)", user=login)
        return user


class PasswordChecks:
    """How many password checks are queued or running in worker threads, broker-wide, and the bound on
    them (``max_pending_logins``).  A check is refused *before* any work is queued once the bound is
    reached, so a flood of CONNECTs with wrong passwords costs the broker a counter, not an unbounded
    queue of scrypt runs in front of everyone's login."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.pending = 0

    def begin(self) -> None:
        if self.pending >= self.limit:
            raise ResourceLimit(f"the broker is already checking {self.pending} passwords "
                                f"(max_pending_logins {self.limit}); try again", limit=self.limit)
        self.pending += 1

    def end(self) -> None:
        self.pending -= 1


def load_users(path: str) -> dict[str, User]:
    """The users of the users file at ``path`` (schema: pymq_server.config.UsersFile); ConfigError naming
    the file, the key and the reason when it is not valid."""
    document = load_users_file(path)
    return {name: User(name, entry.password or "", frozenset(entry.roles), entry.loopback_only,
                       entry.certificate_subject)
            for name, entry in document.users.items()}


# one writer of a users file at a time within this process (admin operations run in worker threads)
_WRITE_LOCK = threading.Lock()


def _read_users_data(path: str) -> dict:
    if not os.path.exists(path):
        return {}
    with open(path, encoding="utf-8") as fh:
        data = yaml.safe_load(fh) or {}
    if not isinstance(data, dict):
        raise ConfigError(f"users file {path} must hold a mapping with a 'users' key")
    return data


def _write_users_data(path: str, data: dict) -> None:
    """Replace the file atomically (readers never see half a file), readable by its owner only."""
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as fh:
        yaml.safe_dump(data, fh, sort_keys=True)
    os.chmod(tmp, 0o600)
    os.replace(tmp, path)


def update_users(path: str, change) -> dict:
    """Apply ``change(users_mapping)`` to the users file under the write lock and write it back.
    ``change`` edits the mapping in place (and may raise to leave the file untouched)."""
    with _WRITE_LOCK:
        data = _read_users_data(path)
        users = data.setdefault("users", {})
        if not isinstance(users, dict):
            raise ConfigError(f"users file {path}: 'users' must be a mapping")
        change(users)
        _write_users_data(path, data)
        return users


def save_user(path: str, name: str, password: str, roles: list[str] | None = None) -> None:
    hashed = hash_password(password)

    def change(users: dict) -> None:
        entry = users.get(name) or {}
        entry["password"] = hashed
        if roles is not None:
            entry["roles"] = list(roles)
        users[name] = entry
    update_users(path, change)


# guest/guest, hashed like any other password (computed once per process, about 50 ms)
_GUEST_HASH = hash_password("guest")
