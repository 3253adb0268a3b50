"""Definitions: what an operator moves between brokers or keeps in version control, as one JSON document
(spec/admin.md "Definitions"; RabbitMQ's export_definitions, Artemis' data exp).

``export-definitions`` writes declared queues with their settings and access lists, the access lists of
other destinations (topics, topic patterns, queues created by use), durable subscriptions, users with
their roles and password *hashes* (never a password), storage rules and virtual hosts.

``import-definitions`` reads such a document and applies it whole or not at all: every part is checked
first (names, settings, principals and permissions, selectors, hashes, rules, that each virtual host is
configured here, that nothing it declares exists here with other settings), and only then is anything
changed; a refusal names the first problem and changes nothing. Importing the same document twice
changes nothing the second time (idempotent): a queue declared with the same settings, a grant already
held, a durable subscription that exists with the same filter, a user with the same hash and roles, a
rule with the same content are all left as they are. Administrators only. The document is a new input
surface: bench/fuzz.py feeds it hostile documents (FUZZ target ``definitions``).
"""
from __future__ import annotations

import json
from typing import Any

from pymq.errors import ConfigError, DestinationExists, PymqError
from pymq_server.admin.checks import Offload, require_admin
from pymq_server.broker import destination as names
from pymq_server.broker.acl import PERMISSIONS, AccessControl, DestinationAcl
from pymq_server.broker.auth import _read_users_data, update_users
from pymq_server.broker.subscriptions import durable_key
from pymq_server.config import queue_config

FORMAT = 1
#: at most this many entries in each list of a document (a hostile document must not make the broker
#: validate millions of entries on its loop)
MAX_ENTRIES = 100_000
_TOP = {"pymq_definitions", "vhosts", "queues", "permissions", "durable_subscriptions", "users", "storage_rules"}


# -- export ------------------------------------------------------------------------------------------

def export_definitions(admin, user, args: dict) -> Offload:
    require_admin(user, "export definitions")
    broker = admin.broker
    destinations = broker.destinations
    queues = [{"name": name, "settings": record["config"], "acl": record.get("acl")}
              for name, record in sorted(destinations.declared.items())]
    declared = {"/queue/" + name for name in destinations.declared}
    permissions = [{"destination": dest, **acl.to_dict()} for dest, acl in sorted(destinations.acl.acls.items())
                   if dest not in declared]
    subs = [broker.subscriptions.record(sub) for sub in sorted(broker.subscriptions.durable.values(),
                                                                   key=lambda s: s.name)]
    selection = admin.server.store.selection
    rules = None if selection is None else [r.to_mapping() for r in selection.rules]
    doc: dict[str, Any] = {"pymq_definitions": FORMAT, "vhosts": {name: entry.to_dict() for name, entry
                                                                      in sorted(broker.config.vhosts.items())},
                           "queues": queues, "permissions": permissions, "durable_subscriptions": subs,
                           "users": [], "storage_rules": rules}
    path = broker.authenticator.users_file

    def read_users() -> list[dict]:
        if not path:
            return []
        users = (_read_users_data(path).get("users") or {})
        return [{"name": name, "roles": sorted((entry or {}).get("roles") or []),
                 "password_hash": (entry or {}).get("password")}
                for name, entry in sorted(users.items())]

    def finish(users: list[dict]) -> dict:
        doc["users"] = users
        return doc
    return Offload(read_users, finish)


# -- import ------------------------------------------------------------------------------------------

def import_definitions(admin, user, args: dict) -> Offload | dict:
    require_admin(user, "import definitions")
    doc = args.get("definitions")
    if isinstance(doc, str):
        try:
            doc = json.loads(doc)
        except (ValueError, RecursionError) as exc:
            raise ConfigError(f"definitions: not a JSON document: {str(exc)[:200]}") from None
    plan = check(admin, doc)
    path = admin.broker.authenticator.users_file
    if plan.users and not path:
        raise ConfigError("definitions: the document has users but the broker runs without a users file")

    def write_users() -> int:
        if not plan.users:
            return 0
        changed = [0]

        def change(users: dict) -> None:
            for name, (password_hash, roles) in plan.users.items():
                entry = users.get(name) or {}
                if entry.get("password") != password_hash or sorted(entry.get("roles") or []) != roles:
                    entry = dict(entry, password=password_hash, roles=roles)
                    users[name] = entry
                    changed[0] += 1
        update_users(path, change)
        return changed[0]

    def finish(users_changed: int) -> dict:
        if users_changed:
            admin.broker.authenticator.reload()
        # checked again on the loop: what changed while the users file was written refuses here, before
        # any destination, grant, subscription or rule is touched
        summary = apply(admin, check(admin, doc))
        summary["users_changed"] = users_changed
        return summary
    return Offload(write_users, finish)


class Plan:
    """A checked document: what :func:`apply` does, in order."""

    def __init__(self) -> None:
        self.queues: list[tuple[str, dict, dict | None]] = []
        self.permissions: list[tuple[str, DestinationAcl]] = []
        self.subscriptions: list[dict] = []
        self.users: dict[str, tuple[str, list[str]]] = {}
        self.rules: list[Any] = []


def _list(doc: dict, key: str) -> list:
    value = doc.get(key)
    if value is None:
        return []
    if not isinstance(value, list):
        raise ConfigError(f"definitions: '{key}' must be a list")
    if len(value) > MAX_ENTRIES:
        raise ConfigError(f"definitions: '{key}' has {len(value)} entries; at most {MAX_ENTRIES}")
    for i, entry in enumerate(value):
        if not isinstance(entry, dict):
            raise ConfigError(f"definitions: {key}[{i}] must be an object")
    return value


def _text(entry: dict, key: str, where: str, *, optional: bool = False) -> str | None:
    value = entry.get(key)
    if value is None and optional:
        return None
    if not isinstance(value, str) or not value or len(value) > 1024:
        raise ConfigError(f"definitions: {where}.{key} must be a non-empty string of at most 1024 characters")
    return value


def _acl(data: Any, where: str) -> DestinationAcl:
    if not isinstance(data, dict):
        raise ConfigError(f"definitions: {where} must be an object with 'owner' and 'grants'")
    owner = data.get("owner")
    if owner is not None and (not isinstance(owner, str) or not owner):
        raise ConfigError(f"definitions: {where}.owner must be a user name or null")
    grants = data.get("grants") or {}
    if not isinstance(grants, dict) or not all(isinstance(v, list) for v in grants.values()):
        raise ConfigError(f"definitions: {where}.grants must map principals to lists of permissions "
                          f"({', '.join(PERMISSIONS)})")
    try:
        checked = AccessControl.checked_grants(grants)
    except ConfigError as exc:
        raise ConfigError(f"definitions: {where}: {exc.message}") from None
    return DestinationAcl(owner, checked)


def check(admin, doc: Any) -> Plan:
    """Everything :func:`apply` will do, checked: ConfigError (or DestinationExists) naming the first
    problem; nothing is changed here."""
    broker = admin.broker
    destinations = broker.destinations
    if not isinstance(doc, dict):
        raise ConfigError("definitions: the document must be a JSON object")
    if doc.get("pymq_definitions") != FORMAT:
        raise ConfigError(f"definitions: 'pymq_definitions' must be {FORMAT} (the format version)")
    unknown = set(doc) - _TOP
    if unknown:
        raise ConfigError(f"definitions: unknown key {sorted(unknown)[0]!r}; keys are {', '.join(sorted(_TOP))}")
    plan = Plan()
    vhosts = doc.get("vhosts") or {}
    if not isinstance(vhosts, dict):
        raise ConfigError("definitions: 'vhosts' must map vhost names to their entries (principals and limits)")
    for name in vhosts:
        if name not in broker.config.vhosts:
            raise ConfigError(f"definitions: virtual host {str(name)[:80]!r} is not configured on this broker "
                              f"(vhosts are set in its configuration file: add it there first)")
    seen: set[str] = set()
    for i, entry in enumerate(_list(doc, "queues")):
        where = f"queues[{i}]"
        name = _text(entry, "name", where)
        assert name is not None
        if name in seen:
            raise ConfigError(f"definitions: queue {name!r} appears twice")
        seen.add(name)
        try:
            destinations.resolve("/queue/" + name)
            settings = entry.get("settings") or {}
            if not isinstance(settings, dict):
                raise ConfigError(f"{where}.settings must be an object")
            config = queue_config(settings, f"queue {name}", base=broker.config.queue_defaults)
        except PymqError as exc:
            raise ConfigError(f"definitions: {where}: {exc.message}") from None
        acl = None if entry.get("acl") is None else _acl(entry["acl"], where + ".acl")
        existing = destinations.queues.get(name)
        if existing is not None and name in destinations.declared and existing.config != config:
            diff = "; ".join(existing.config.differences(config))
            raise DestinationExists(f"definitions: queue '/queue/{name}' exists here with other settings ({diff})",
                                    destination="/queue/" + name)
        plan.queues.append((name, settings, None if acl is None else acl.to_dict()))
    for i, entry in enumerate(_list(doc, "permissions")):
        where = f"permissions[{i}]"
        dest = _text(entry, "destination", where)
        assert dest is not None
        try:
            dest = destinations.grantable(dest)
        except PymqError as exc:
            raise ConfigError(f"definitions: {where}: {exc.message}") from None
        plan.permissions.append((dest, _acl(entry, where)))
    for i, entry in enumerate(_list(doc, "durable_subscriptions")):
        where = f"durable_subscriptions[{i}]"
        topic, owner, sub_name = (_text(entry, k, where) for k in ("topic", "owner", "name"))
        assert topic is not None and owner is not None and sub_name is not None
        shared = entry.get("shared", False)
        no_local = entry.get("no_local", False)
        if not isinstance(shared, bool) or not isinstance(no_local, bool):
            raise ConfigError(f"definitions: {where}: 'shared' and 'no_local' must be true or false")
        key = durable_key(owner, sub_name, shared)
        if entry.get("key", key) != key:
            raise ConfigError(f"definitions: {where}.key must be {key!r} (from owner, name and shared)")
        selector = _text(entry, "selector", where, optional=True)
        creator = _text(entry, "user", where, optional=True)
        try:
            names.check_name(topic, "/topic/" + topic)
            destinations.resolve("/topic/" + topic)
            broker.subscriptions.compile_selector(selector)
        except PymqError as exc:
            raise ConfigError(f"definitions: {where}: {exc.message}") from None
        current = broker.subscriptions.find(key)
        if current is not None and (current.topic.name != topic or current.no_local != no_local or
                                    (None if current.selector is None else current.selector.text) != selector):
            raise DestinationExists(f"definitions: durable subscription {key!r} exists here with another "
                                    f"topic or filter", destination="subscription:" + key)
        plan.subscriptions.append({"key": key, "topic": topic, "selector": selector, "no_local": no_local,
                                   "owner": owner, "shared": shared, "name": sub_name, "user": creator})
    for i, entry in enumerate(_list(doc, "users")):
        where = f"users[{i}]"
        name = _text(entry, "name", where)
        password_hash = _text(entry, "password_hash", where)
        assert name is not None and password_hash is not None
        if not password_hash.startswith("scrypt$") or len(password_hash.split("$")) != 6:
            raise ConfigError(f"definitions: {where}.password_hash must be a pymq scrypt hash "
                              f"('scrypt$N$r$p$salt$digest'); plain passwords are never imported")
        roles = entry.get("roles") or []
        if not isinstance(roles, list) or not all(isinstance(r, str) and r and len(r) <= 128 for r in roles):
            raise ConfigError(f"definitions: {where}.roles must be a list of role names")
        if name in plan.users:
            raise ConfigError(f"definitions: user {name!r} appears twice")
        plan.users[name] = (password_hash, sorted(set(roles)))
    rules = doc.get("storage_rules")
    if rules:
        selection = admin.server.store.selection
        if selection is None:
            raise ConfigError("definitions: the document has storage rules but this broker has no storage "
                              "selection (configure storage.selection)")
        from pymq_server.storage.selection.rules import SelectionRule
        ids: set[str] = set()
        for i, entry in enumerate(_list(doc, "storage_rules")):
            try:
                rule = SelectionRule.from_mapping(entry)
                selection.rules._check(rule)
            except PymqError as exc:
                raise ConfigError(f"definitions: storage_rules[{i}]: {exc.message}") from None
            if rule.id in ids:
                raise ConfigError(f"definitions: storage rule {rule.id!r} appears twice")
            ids.add(rule.id)
            plan.rules.append(rule)
    return plan


def apply(admin, plan: Plan) -> dict:
    """Apply a checked plan (idempotent: what is already as the document says stays as it is)."""
    broker = admin.broker
    destinations = broker.destinations
    made = {"queues_created": 0, "acls_set": 0, "subscriptions_created": 0, "rules_set": 0}
    for name, settings, acl in plan.queues:
        _, created = destinations.declare_queue(name, settings, None)
        made["queues_created"] += created
        if acl is not None:
            destination = "/queue/" + name
            if destinations.acl.acls.get(destination) is None or \
                    destinations.acl.acls[destination].to_dict() != acl:
                destinations.acl.acls[destination] = DestinationAcl.from_dict(acl)
                destinations.declared[name]["acl"] = acl
                destinations.store.put_meta("queue:" + name, json.dumps(destinations.declared[name]).encode())
                made["acls_set"] += 1
    for dest, wanted in plan.permissions:
        current = destinations.acl.acls.get(dest)
        if current is None or current.to_dict() != wanted.to_dict():
            destinations.acl.acls[dest] = wanted
            destinations._persist_acl(dest)
            made["acls_set"] += 1
    subscriptions = broker.subscriptions
    for record in plan.subscriptions:
        if subscriptions.find(record["key"]) is None:
            subscriptions.create_durable(destinations.topic(record["topic"]), record["key"],
                                         subscriptions.compile_selector(record["selector"]), record["no_local"],
                                         record["owner"], record["shared"], record["name"],
                                         creator=record["user"], existing=True)
            made["subscriptions_created"] += 1
    selection = admin.server.store.selection
    for rule in plan.rules:
        if rule.id not in selection.rules:
            selection.rules.add(rule)
            made["rules_set"] += 1
        elif selection.rules.get(rule.id) != rule:
            selection.rules.replace(rule)
            made["rules_set"] += 1
    return made
