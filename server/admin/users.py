"""Admin operations on users (list, add, remove, change a password or roles) and ``reload``.

The users file stays the single record (what ``pymq-server passwd`` writes and an operator may edit);
an operation edits it and then calls :meth:`Authenticator.reload`, which installs the users the way
SIGHUP does (:meth:`Authenticator.replace`), so the change applies from the next login on, without a
restart.  ``reload`` is SIGHUP itself: :meth:`BrokerServer.reload`, the one function for both.  Connections
already open keep the user they logged in with.  Hashing (scrypt, tens of ms) and the file write run in a
worker thread; the reload runs on the loop and reads whatever the file holds last, so concurrent changes cannot install
an older file.  The last administrator cannot be removed or lose the admin role (nobody could manage
the broker after that).  Administrators only.
"""
from __future__ import annotations

from pymq.errors import ConfigError, IllegalStateError, UnknownUser
from pymq_server.admin.checks import MAX_TEXT, Offload, require_admin, text_arg
from pymq_server.broker.acl import ADMIN_ROLE
from pymq_server.broker.auth import hash_password, update_users

MAX_NAME = 128


def _users_file(admin) -> str:
    path = admin.broker.authenticator.users_file
    if not path:
        raise ConfigError("the broker runs without a users file (only guest/guest from localhost); "
                          "start it with --users-file to manage users")
    return path


def _user_arg(args: dict) -> str:
    name = text_arg(args, "name")
    assert name is not None
    if len(name) > MAX_NAME or not name.isprintable() or name.strip() != name:
        raise ConfigError(f"user name {name[:40]!r} must be printable, without surrounding spaces, "
                          f"at most {MAX_NAME} characters")
    if name.startswith("cluster:"):
        raise ConfigError("user names starting with 'cluster:' are reserved for cluster nodes")
    return name


def _roles_arg(args: dict, required: bool) -> list[str] | None:
    roles = args.get("roles")
    if roles is None:
        if required:
            raise ConfigError("argument 'roles' is required (a list of role names, possibly empty)")
        return None
    if isinstance(roles, str):
        roles = [r.strip() for r in roles.split(",") if r.strip()]
    if not isinstance(roles, list) or not all(isinstance(r, str) and r and len(r) <= MAX_NAME and
                                              r.isprintable() and "," not in r for r in roles):
        raise ConfigError("argument 'roles' must be a list of role names")
    return sorted(set(roles))


def _password_arg(args: dict) -> str:
    password = args.get("password")
    if not isinstance(password, str) or not password:
        raise ConfigError("argument 'password' must be a non-empty string")
    if len(password) > MAX_TEXT:
        raise ConfigError(f"a password may have at most {MAX_TEXT} characters")
    return password


def _check_admins_remain(users: dict, path: str) -> None:
    if not any(ADMIN_ROLE in (entry or {}).get("roles", ()) for entry in users.values()):
        raise IllegalStateError(f"refused: the users file {path} would have no user with the "
                                f"'{ADMIN_ROLE}' role left, and nobody could manage the broker")


def _edit(admin, path: str, change, answer) -> Offload:
    """Apply ``change`` to the file in a worker thread, then reload on the loop."""
    def finish(users: dict) -> dict:
        summary = admin.broker.authenticator.reload()
        return answer(summary)
    return Offload(lambda: update_users(path, change), finish)


def list_users(admin, user, args: dict) -> list:
    require_admin(user, "list users")
    auth = admin.broker.authenticator
    return [{"name": u.name, "roles": sorted(u.roles), "loopback_only": u.loopback_only}
            for u in sorted(auth.users.values(), key=lambda u: u.name)]


def add_user(admin, user, args: dict) -> Offload:
    require_admin(user, "add users")
    path = _users_file(admin)
    name, password, roles = _user_arg(args), _password_arg(args), _roles_arg(args, required=False) or []

    def change(users: dict) -> None:
        if name in users:
            raise ConfigError(f"user '{name}' already exists (change its password with set-password)")
        users[name] = {"password": hash_password(password), "roles": roles}
    return _edit(admin, path, change, lambda s: {"added": name, "roles": roles, "users": s["users"]})


def set_password(admin, user, args: dict) -> Offload:
    require_admin(user, "change passwords")
    path = _users_file(admin)
    name, password = _user_arg(args), _password_arg(args)

    def change(users: dict) -> None:
        if name not in users:
            raise UnknownUser(f"no user '{name}' in {path}")
        entry = users[name] or {}
        entry["password"] = hash_password(password)
        users[name] = entry
    return _edit(admin, path, change, lambda s: {"changed": name})


def set_roles(admin, user, args: dict) -> Offload:
    require_admin(user, "change roles")
    path = _users_file(admin)
    name, roles = _user_arg(args), _roles_arg(args, required=True)

    def change(users: dict) -> None:
        if name not in users:
            raise UnknownUser(f"no user '{name}' in {path}")
        entry = users[name] or {}
        entry["roles"] = roles
        users[name] = entry
        _check_admins_remain(users, path)
    return _edit(admin, path, change, lambda s: {"changed": name, "roles": roles})


def remove_user(admin, user, args: dict) -> Offload:
    require_admin(user, "remove users")
    path = _users_file(admin)
    name = _user_arg(args)

    def change(users: dict) -> None:
        if name not in users:
            raise UnknownUser(f"no user '{name}' in {path}")
        del users[name]
        _check_admins_remain(users, path)
    return _edit(admin, path, change, lambda s: {"removed": name, "users": s["users"]})


def reload(admin, user, args: dict) -> dict:
    """What SIGHUP does (:meth:`BrokerServer.reload`, the one reload function): the configuration and
    users files read again and what can change live applied; an invalid file changes nothing."""
    require_admin(user, "reload the configuration")
    return admin.server.reload()
