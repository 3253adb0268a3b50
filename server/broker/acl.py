"""Access control: who may do what to each destination (seed 001; the matrix is spec/admin.md).

Principals are ``user:<name>``, ``role:<name>`` and ``*`` (every authenticated user, ``anonymous``
included). Permissions: ``produce``, ``consume``, ``browse``, ``purge``, ``create`` (declare a new queue,
or claim one that belongs to no one) and ``manage`` (what an owner may do: declare again, drop, purge,
grant, revoke, claim; it implies every other permission).

Who holds what:

* the administrator (role ``admin``) passes every check here; temporary queues, private to their
  connection, are checked where they are handed out (destinations.py);
* a queue declared with ``create-queue`` is *owned* by its creator, who holds every permission on it;
* a destination with no access list of its own (auto-created by use, configured in the YAML, a topic)
  belongs to no one and follows ``default_permissions``; an administrator's first grant gives it a list
  of its own, starting from the defaults so that nobody loses access by someone else's grant;
* a *system-owned* destination (a dead-letter queue, the expiry queue) has no owner and no defaults: only
  an administrator declares, drops and grants on it, and ``consume``/``browse``/``purge`` are inherited
  from the access list of the queue it serves (:attr:`AccessControl.system_source`, which the
  destinations layer provides), read at every check so that a grant on the source applies at once.

A grant on a topic *pattern* (``/topic/stocks.*``, spec/routing.md §5) applies to every topic and every
pattern it covers (:func:`pymq.routing.topics.covers`: every topic the subscription could receive is one
the granted pattern matches): a topic without an access list of its own follows the access lists of the
patterns that cover it, if any (allowed when one of them allows; the defaults otherwise). So a user
granted ``consume`` on ``stocks.*`` may subscribe to ``stocks.ibm`` and to ``stocks.*``, not to
``stocks.#`` nor ``#``, which match topics the grant does not cover.

Every refusal is an :class:`AccessDenied` naming the user, the destination and the missing permission,
raised before anything changes.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING
from collections.abc import Callable, Iterable, Iterator

from pymq.errors import AccessDenied, ConfigError
from pymq.routing import topics as topic_patterns
from pymq_server.broker.routes import Generation

if TYPE_CHECKING:
    from pymq_server.broker.auth import User

PERMISSIONS = ("produce", "consume", "browse", "purge", "create", "manage")
#: what a broker without ``default_permissions`` allows everyone on destinations nobody owns: everything
#: but ``manage`` (dropping or re-granting a queue nobody owns stays the administrator's)
OPEN_DEFAULTS = ("produce", "consume", "browse", "purge", "create")
#: what a dead-letter queue takes from the queue it serves
INHERITED = frozenset({"consume", "browse", "purge"})
ADMIN_ROLE = "admin"
#: reads every destination's metrics (Prometheus ``/metrics``, the ``metrics`` operation) and nothing else
MONITOR_ROLE = "monitor"


def _check_permissions(perms: Iterable[str]) -> set[str]:
    perms = set(perms)
    bad = perms - set(PERMISSIONS)
    if bad:
        raise ConfigError(f"unknown permission(s) {sorted(bad)}; use {', '.join(PERMISSIONS)}")
    return perms


def _check_principal(principal: str) -> str:
    if principal == "*" or principal.startswith(("user:", "role:")) and len(principal.split(":", 1)[1]) > 0:
        return principal
    raise ConfigError(f"principal {principal!r} must be '*', 'user:<name>' or 'role:<name>'")


@dataclass
class DestinationAcl:
    owner: str | None = None
    grants: dict[str, set[str]] = field(default_factory=dict)

    def allows(self, user: User, permission: str) -> bool:
        """The owner holds everything; a grant of ``permission`` or of ``manage`` allows it."""
        if self.owner is not None and user.name == self.owner:
            return True
        return self.granted(user, permission)

    def granted(self, user: User, permission: str, *, manage_implies: bool = True) -> bool:
        for principal in _principals(user):
            have = self.grants.get(principal)
            if have and (permission in have or (manage_implies and "manage" in have)):
                return True
        return False

    def any_for(self, user: User) -> bool:
        """``user`` holds some permission here (it may see the destination)."""
        if self.owner is not None and user.name == self.owner:
            return True
        return any(self.grants.get(p) for p in _principals(user))

    def to_dict(self) -> dict:
        return {"owner": self.owner, "grants": {p: sorted(v) for p, v in sorted(self.grants.items())}}

    @classmethod
    def from_dict(cls, data: dict) -> DestinationAcl:
        return cls(data.get("owner"), {p: set(v) for p, v in (data.get("grants") or {}).items()})


def _principals(user: User) -> Iterator[str]:
    yield "*"
    yield "user:" + user.name
    for role in user.roles:
        yield "role:" + role


def is_admin(user: User) -> bool:
    return ADMIN_ROLE in user.roles


def may_monitor(user: User) -> bool:
    return ADMIN_ROLE in user.roles or MONITOR_ROLE in user.roles


def _no_system(destination: str) -> DestinationAcl | None:
    return None


TOPIC = "/topic/"


def _is_topic_pattern(destination: str) -> bool:
    return destination.startswith(TOPIC) and topic_patterns.is_pattern(destination[len(TOPIC):])


class _AclTable(dict):
    """destination -> access list, knowing which keys are topic patterns (whatever writes it), so a check
    on a topic looks for covering patterns only when some exist; every change bumps ``generation``
    (routes.py: connections' kept SEND decisions)."""

    def __init__(self, generation: Generation) -> None:
        super().__init__()
        self.generation = generation
        self.patterns: dict[str, DestinationAcl] = {}
        #: destination -> the pattern access lists covering it, until the patterns change
        self.covering: dict[str, list[DestinationAcl]] = {}

    def __setitem__(self, destination: str, acl: DestinationAcl) -> None:
        self.generation.bump()
        super().__setitem__(destination, acl)
        if _is_topic_pattern(destination):
            self.patterns[destination] = acl
            self.covering.clear()

    def __delitem__(self, destination: str) -> None:
        self.generation.bump()
        super().__delitem__(destination)
        if self.patterns.pop(destination, None) is not None:
            self.covering.clear()

    def pop(self, destination, *default):
        self.generation.bump()
        if self.patterns.pop(destination, None) is not None:
            self.covering.clear()
        return super().pop(destination, *default)


class AccessControl:
    def __init__(self, default_permissions: dict | None = None) -> None:
        defaults = default_permissions if default_permissions is not None else {"*": list(OPEN_DEFAULTS)}
        #: moves with every change of a decision below (routes.py); the destinations layer shares it
        self.generation = Generation()
        self._defaults = DestinationAcl(None, {_check_principal(p): _check_permissions(v)
                                               for p, v in defaults.items()})
        self.acls: _AclTable = _AclTable(self.generation)
        #: destination -> the access list a system-owned destination inherits from (its source queue's,
        #: or an empty one), None for destinations that are not system-owned (set by destinations.py)
        self.system_source: Callable[[str], DestinationAcl | None] = _no_system

    @property
    def defaults(self) -> DestinationAcl:
        """What a destination without an access list of its own allows (``default_permissions``)."""
        return self._defaults

    @defaults.setter
    def defaults(self, defaults: DestinationAcl) -> None:      # a reload's new default_permissions
        self.generation.bump()
        self._defaults = defaults

    # -- checks ------------------------------------------------------------------------------------
    def authorize(self, user: User, destination: str, permission: str) -> None:
        """AccessDenied unless ``user`` holds ``permission`` on ``destination``.  A temporary queue or
        topic is open to every sender (replies); only the connection that made it may consume or browse,
        which the broker checks where it hands one out."""
        if destination.startswith(("/temp-queue/", "/temp-topic/")):
            return
        self.check(user, destination, permission)

    def allows(self, user: User, destination: str, permission: str) -> bool:
        if is_admin(user):
            return True
        inherited = self.system_source(destination)
        own = self.acls.get(destination)
        if inherited is not None:
            # system-owned: no owner, no defaults, never create/manage; the administrator's own grants
            # (exactly the permission asked), and what the source queue allows for the inherited ones
            if permission in ("create", "manage"):
                return False
            if own is not None and own.granted(user, permission, manage_implies=False):
                return True
            return permission in INHERITED and inherited.allows(user, permission)
        if own is None and self.acls.patterns and destination.startswith(TOPIC):
            covering = self._covering(destination)
            if covering:
                return any(acl.allows(user, permission) for acl in covering)
        return (own if own is not None else self.defaults).allows(user, permission)

    def _covering(self, destination: str) -> list[DestinationAcl]:
        """The access lists of the topic patterns that cover ``destination`` (a topic or a pattern)."""
        cache = self.acls.covering
        found = cache.get(destination)
        if found is None:
            name = topic_patterns.normalize(destination[len(TOPIC):])
            # a pattern of the default vhost never covers a virtual host's topic ('$vh.<vhost>.', vhosts.py)
            own_vhost = name.startswith("$vh.")
            found = [acl for pattern, acl in self.acls.patterns.items()
                     if pattern.startswith("/topic/$vh.") == own_vhost
                     and topic_patterns.covers(pattern[len(TOPIC):], name)]
            if len(cache) >= 4096:
                cache.clear()
            cache[destination] = found
        return found

    def check(self, user: User, destination: str, permission: str) -> None:
        if ADMIN_ROLE in user.roles:        # allows() says so first; asked here, it is one call per SEND
            return
        if not self.allows(user, destination, permission):
            raise AccessDenied(f"user '{user.name}' may not {permission} on {destination}: missing permission "
                               f"'{permission}'", user=user.name, destination=destination, permission=permission)

    def sees(self, user: User, destination: str) -> bool:
        """``user`` may see ``destination`` in lists and metrics: it holds some permission on it."""
        if is_admin(user):
            return True
        inherited = self.system_source(destination)
        own = self.acls.get(destination)
        if inherited is not None:
            return (own is not None and own.any_for(user)) or \
                any(inherited.allows(user, p) for p in INHERITED)
        if own is None and self.acls.patterns and destination.startswith(TOPIC):
            covering = self._covering(destination)
            if covering:
                return any(acl.any_for(user) for acl in covering)
        return (own if own is not None else self.defaults).any_for(user)

    def check_sees(self, user: User, destination: str) -> None:
        if not self.sees(user, destination):
            raise AccessDenied(f"user '{user.name}' may not see {destination}: no permission on it",
                               user=user.name, destination=destination, permission="browse")

    def check_manage(self, user: User, destination: str, what: str) -> None:
        """What only the owner, a ``manage`` holder or an administrator may do (drop, grant, declare
        again); on a system-owned destination only an administrator."""
        if self.allows(user, destination, "manage"):
            return
        acl = self.acls.get(destination)
        if self.system_source(destination) is not None:
            who = "it is system-owned: only an administrator may"
        elif acl is not None and acl.owner:
            who = f"only its owner '{acl.owner}', a holder of 'manage' or an administrator may"
        else:
            who = "it has no owner: only a holder of 'manage' or an administrator may"
        raise AccessDenied(f"user '{user.name}' may not {what} {destination}: {who}", user=user.name,
                           destination=destination, permission="manage")

    def check_create(self, user: User, destination: str, *, claim: bool) -> None:
        """Declare a queue that does not exist (``create`` through the defaults), or claim one that
        belongs to no one (``create`` or ``manage`` granted on that queue itself: ``create`` in the
        defaults is the right to make new queues, not to take the ones others use); a system-owned name
        only an administrator."""
        if claim and not is_admin(user):
            own = self.acls.get(destination)
            if self.system_source(destination) is None and own is not None and own.allows(user, "create"):
                return
        elif self.allows(user, destination, "create"):
            return
        if self.system_source(destination) is not None:
            reason = "it is system-owned: only an administrator may declare it"
        elif claim:
            reason = ("it exists and belongs to no user: claiming it needs 'create' or 'manage' on it, "
                      "or an administrator")
        else:
            reason = "creating a queue needs the 'create' permission"
        raise AccessDenied(f"user '{user.name}' may not create {destination}: {reason}", user=user.name,
                           destination=destination, permission="create")

    # -- changes -------------------------------------------------------------------------------------
    @staticmethod
    def checked_grants(grants: dict | None) -> dict[str, set[str]]:
        """``grants`` (principal -> permissions) checked: ConfigError naming a bad principal or permission."""
        if grants is not None and not isinstance(grants, dict):
            raise ConfigError("grants must be a mapping of principal to permissions")
        return {_check_principal(p): _check_permissions(v) for p, v in (grants or {}).items()}

    def own(self, destination: str, owner: str | None, grants: dict | None = None, *,
            keep: bool = False) -> DestinationAcl:
        """Give ``destination`` the owner ``owner`` and ``grants``; ``keep``: the grants it had stay
        (a claim keeps what an administrator granted on a queue that belonged to no one)."""
        fresh = self.checked_grants(grants)
        old = self.acls.get(destination)
        if keep and old is not None:
            merged = {p: set(v) for p, v in old.grants.items()}
            for principal, perms in fresh.items():
                merged.setdefault(principal, set()).update(perms)
            fresh = merged
        acl = DestinationAcl(owner, fresh)
        self.acls[destination] = acl
        return acl

    def _manageable(self, actor: User, destination: str) -> DestinationAcl:
        self.check_manage(actor, destination, "change permissions on")
        acl = self.acls.get(destination)
        if acl is None:
            system = self.system_source(destination) is not None
            # the defaults' grants stay (nobody loses access by another's grant), except ``create``: the
            # right to make new queues must not become a right to claim this one
            acl = self.acls[destination] = DestinationAcl(None, {} if system else {
                p: set(v) - {"create"} for p, v in self.defaults.grants.items() if set(v) - {"create"}})
        return acl

    def grant(self, actor: User, destination: str, principal: str, permissions: Iterable[str]) -> DestinationAcl:
        principal = _check_principal(principal)
        perms = _check_permissions(permissions)
        acl = self._manageable(actor, destination)
        acl.grants.setdefault(principal, set()).update(perms)
        self.generation.bump()
        return acl

    def revoke(self, actor: User, destination: str, principal: str, permissions: Iterable[str]) -> DestinationAcl:
        principal = _check_principal(principal)
        perms = _check_permissions(permissions)
        acl = self._manageable(actor, destination)
        self.generation.bump()
        have = acl.grants.get(principal)
        if have is not None:
            have.difference_update(perms)
            if not have:
                del acl.grants[principal]
        return acl

    def forget(self, destination: str) -> None:
        self.acls.pop(destination, None)

    def describe(self, destination: str) -> dict:
        acl = self.acls.get(destination)
        out = (acl or self.defaults).to_dict() | {"default": acl is None}
        inherited = self.system_source(destination)
        if inherited is not None:
            out = (acl or DestinationAcl()).to_dict() | {"default": False, "system": True,
                                                         "inherited": inherited.to_dict()}
        return out
