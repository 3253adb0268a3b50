"""Live changes to a running server's configuration (SIGHUP, the admin ``reload`` operation).

What a reload owns: reading the configuration file and the users file again, checking everything before
anything changes, applying what can change while the broker runs (users and ``allow_anonymous``,
``default_permissions``, the storage-selection rules, the TLS certificate and key, ``log_level``), and
naming the settings that differ but need a restart.  It acts on a started
:class:`~pymq_server.app.BrokerServer` (its broker, store, TLS context and periodic work) and changes
nothing else of it.
"""
from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from pymq_server.logs import announce

from pymq.errors import PymqError

if TYPE_CHECKING:
    from pymq_server.app import BrokerServer

log = logging.getLogger("pymq.server")


def reload_logged(server: BrokerServer) -> None:
    """:func:`reload` for a SIGHUP (the CLI's, a worker's): the outcome logged, a refusal or a bug keeping
    the running configuration, never taking the broker down."""
    try:
        result = reload(server)
    except PymqError as exc:
        log.error("reload refused, the running configuration is kept: %s", exc.message)
    except Exception:  # a bug in reload must not take the broker down with it
        log.exception("reload failed, the running configuration is kept")
    else:
        announce(f"pymq-server reloaded: {len(result['users'])} user(s)"
                 + (f", needing a restart: {', '.join(result['restart_needed'])}" if result["restart_needed"]
                    else ""), server.config.log_format)


def reload(server: BrokerServer) -> dict:
    """Read the configuration file and the users file again and apply what can change while the broker
    runs: users (and ``allow_anonymous``), ``default_permissions``, the storage-selection rules, the TLS
    certificate and key, ``log_level``.  Open connections are kept (they keep the user they logged in as).
    Everything is read and checked before anything changes: an invalid file raises ConfigError and the
    broker keeps what it had.  Settings that differ but need a restart are listed under
    ``restart_needed``.  Runs on the broker's event loop."""
    from pymq_server.broker.acl import AccessControl
    from pymq_server.broker.auth import load_users
    broker, store, _ = server.core()
    old = server.config
    new = old.reread()
    users = load_users(new.users_file) if new.users_file else None
    defaults = AccessControl(new.default_permissions).defaults
    layer = None
    if new.storage.selection is not None:
        from pymq_server.config import read_selection
        from pymq_server.storage.selection import AdaptiveSelection
        layer = AdaptiveSelection.from_yaml(read_selection(new.storage.selection),
                                            list(store.devices.values()))
    fresh_tls = None
    ssl_context = server.ssl_context
    if new.tls is not None and ssl_context is not None:
        from pymq_server.net.tls import load_certificates, server_context
        fresh_tls = new.tls
        server_context(new.tls)                     # loads and checks every file; nothing live yet
    # -- everything read and valid: apply ------------------------------------------------------------
    broker.authenticator.replace(new.users_file, users, new.allow_anonymous)
    broker.acl.defaults = defaults
    if layer is not None:
        from pymq_server.broker.stored_form import rule_context_of
        had = store.selection is not None
        store.use_selection(layer, rule_context_of)
        if not had and server.chores is not None:
            server.chores.refresh_selection()
    if fresh_tls is not None and ssl_context is not None:
        load_certificates(ssl_context, fresh_tls)
    logging.getLogger().setLevel(new.log_level)
    applied = {"users_file", "allow_anonymous", "default_permissions", "log_level"}
    for key in applied:
        setattr(old, key, getattr(new, key))
    if layer is not None:
        old.storage = old.storage.model_copy(update={"selection": new.storage.selection})
    restart = sorted(k for k in type(new).model_fields
                     if k not in applied and k not in ("storage", "tls")
                     and getattr(new, k) != getattr(old, k))
    if new.storage.model_copy(update={"selection": None}) != old.storage.model_copy(
            update={"selection": None}) or (layer is None and old.storage.selection is not None):
        restart.append("storage")
    if (new.tls is None) != (old.tls is None) or (
            new.tls is not None and old.tls is not None
            and new.tls.model_copy(update={"cert_file": "", "key_file": "", "key_password": None})
            != old.tls.model_copy(update={"cert_file": "", "key_file": "", "key_password": None})):
        restart.append("tls")
    if fresh_tls is not None:
        old.tls = new.tls
    result = {"users": sorted(broker.authenticator.users),
              "default_permissions": broker.acl.defaults.to_dict()["grants"],
              "storage_rules": len(layer.rules) if layer is not None else None,
              "tls_reloaded": fresh_tls is not None,
              "restart_needed": restart}
    log.info("configuration reloaded from %s: %d user(s), %s storage rule(s)%s",
             old.source or "the command line", len(result["users"]),
             result["storage_rules"] if layer is not None else "no",
             f"; changed but needing a restart: {', '.join(restart)}" if restart else "")
    return result
