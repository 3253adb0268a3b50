"""Access control: who may produce to, consume from and browse each destination (seed 001).

Principals are ``user:<name>``, ``role:<name>`` and ``*`` (every authenticated user).  A destination
created explicitly (SDK ``create_queue``, admin interface) is *owned* by its creator: only the owner,
administrators (role ``admin``) and principals granted a permission may use it, and only the owner or an
administrator may grant and revoke.  A destination with no ACL of its own (auto-created by use) follows
``default_permissions`` (broker setting; by default everyone may do everything, as a broker without an
authorization plugin does).  A refusal names the user, the destination and the missing permission.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Iterator

from pymq.errors import AccessDenied, ConfigError

if TYPE_CHECKING:
    from pymq_server.broker.auth import User

PERMISSIONS = ("produce", "consume", "browse")
ADMIN_ROLE = "admin"


def _check_permissions(perms) -> set[str]:
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
        if self.owner is not None and user.name == self.owner:
            return True
        for principal in _principals(user):
            if permission in self.grants.get(principal, ()):
                return True
        return False

    def to_dict(self) -> dict:
        return {"owner": self.owner, "grants": {p: sorted(v) for p, v in sorted(self.grants.items())}}

    @classmethod
    def from_dict(cls, data: dict) -> "DestinationAcl":
        return cls(data.get("owner"), {p: set(v) for p, v in (data.get("grants") or {}).items()})


def _principals(user: User) -> Iterator[str]:
    yield "*"
    yield "user:" + user.name
    for role in user.roles:
        yield "role:" + role


def is_admin(user: User) -> bool:
    return ADMIN_ROLE in user.roles


class AccessControl:
    def __init__(self, default_permissions: dict | None = None) -> None:
        defaults = default_permissions if default_permissions is not None else {"*": list(PERMISSIONS)}
        self.defaults = DestinationAcl(None, {_check_principal(p): _check_permissions(v)
                                              for p, v in defaults.items()})
        self.acls: dict[str, DestinationAcl] = {}

    def authorize(self, user: User, destination: str, permission: str) -> None:
        """AccessDenied unless ``user`` holds ``permission`` on ``destination``.  A temporary queue is
        open to every sender (replies); only the connection that made it may consume or browse, which
        the broker checks where it hands one out."""
        if destination.startswith("/temp-queue/"):
            return
        self.check(user, destination, permission)

    def check(self, user: User, destination: str, permission: str) -> None:
        if is_admin(user):
            return
        acl = self.acls.get(destination, self.defaults)
        if not acl.allows(user, permission):
            raise AccessDenied(f"user '{user.name}' may not {permission} on {destination}: missing permission "
                               f"'{permission}'", user=user.name, destination=destination, permission=permission)

    def own(self, destination: str, owner: str | None, grants: dict | None = None) -> DestinationAcl:
        acl = DestinationAcl(owner, {_check_principal(p): _check_permissions(v)
                                     for p, v in (grants or {}).items()})
        self.acls[destination] = acl
        return acl

    def _manageable(self, actor: User, destination: str) -> DestinationAcl:
        acl = self.acls.get(destination)
        if acl is None:
            if not is_admin(actor):
                raise AccessDenied(f"{destination} has no owner; only an administrator may set its "
                                   f"permissions", user=actor.name,
                                   destination=destination, permission="manage")
            acl = self.acls[destination] = DestinationAcl(None, {p: set(v) for p, v in self.defaults.grants.items()})
            return acl
        if not is_admin(actor) and actor.name != acl.owner:
            raise AccessDenied(f"user '{actor.name}' may not change permissions on "
                               f"{destination}: only its owner '{acl.owner}' or an administrator may",
                               user=actor.name, destination=destination,
                               permission="manage")
        return acl

    def grant(self, actor: User, destination: str, principal: str, permissions) -> DestinationAcl:
        acl = self._manageable(actor, destination)
        acl.grants.setdefault(_check_principal(principal), set()).update(_check_permissions(permissions))
        return acl

    def revoke(self, actor: User, destination: str, principal: str, permissions) -> DestinationAcl:
        acl = self._manageable(actor, destination)
        have = acl.grants.get(_check_principal(principal))
        if have is not None:
            have.difference_update(_check_permissions(permissions))
            if not have:
                del acl.grants[principal]
        return acl

    def forget(self, destination: str) -> None:
        self.acls.pop(destination, None)

    def describe(self, destination: str) -> dict:
        acl = self.acls.get(destination)
        return (acl or self.defaults).to_dict() | {"default": acl is None}
