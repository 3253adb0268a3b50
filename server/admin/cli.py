"""``pymq-admin``: manage a running broker from the command line, over its admin HTTP API.

    pymq-admin [--url URL] [--user U] [--password P] [--json] COMMAND ... [the same options]

Every command is one admin operation (spec/admin.md) sent as ``POST /api/<operation>``, so the CLI is
refused exactly what the console and STOMP clients are refused.  Output is a human table, or the
operation's JSON result with ``--json``.  Credentials come from flags, then the environment
(``PYMQ_ADMIN_URL``, ``PYMQ_ADMIN_USER``, ``PYMQ_ADMIN_PASSWORD``), then a YAML file (``--config``,
``PYMQ_ADMIN_CONFIG`` or ``~/.config/pymq/admin.yaml``: ``url``, ``user``, ``password``, ``cafile``),
then the defaults (``http://127.0.0.1:8161``, guest/guest).  Exit codes are in :data:`EXIT_CODES`
(docs/cli.md): scripts can tell a refused operation from an unreachable broker or a wrong password.
"""
from __future__ import annotations

import argparse
import base64
import getpass
import http.client
import json
import os
import ssl
import stat
import sys
import urllib.error
import urllib.parse
import urllib.request
from typing import Any
from collections.abc import Callable, Sequence

import yaml

import pymq
from pymq_server.broker import vhosts

OK, FAILED, USAGE, UNREACHABLE, AUTH, DENIED, NOT_FOUND = 0, 1, 2, 3, 4, 5, 6
CLOSED_PIPE = 141      # 128 + SIGPIPE: what a shell reports for a C tool whose reader went away
EXIT_CODES = {
    OK: "success",
    FAILED: "the broker refused or could not complete the operation (the message says why); "
            "also: `health` found the broker not ready",
    USAGE: "wrong command line or a bad local input (file, password)",
    UNREACHABLE: "no admin endpoint answered at the URL (refused, timed out, TLS failure, not pymq)",
    AUTH: "authentication failed (wrong user or password, or a localhost-only user from afar)",
    DENIED: "the user may not do this (access-denied)",
    NOT_FOUND: "what the command names does not exist (queue, message, user, connection)",
    CLOSED_PIPE: "the output's reader went away (`pymq-admin ... | head`): the rest is not printed",
}
_HTTP_EXIT = {401: AUTH, 403: DENIED, 404: NOT_FOUND}
DEFAULT_URL = "http://127.0.0.1:8161"
DEFAULT_CONFIG = os.path.join("~", ".config", "pymq", "admin.yaml")


class CliError(Exception):
    def __init__(self, message: str, code: int, payload: dict | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.code = code
        self.payload = payload


# -- talking to the broker ---------------------------------------------------------------------------
class AdminClient:
    def __init__(self, url: str, user: str, password: str, timeout: float = 30.0,
                 cafile: str | None = None, insecure: bool = False) -> None:
        self.url = url.rstrip("/")
        self.vhost: str | None = None        # --vhost: names and lists inside that virtual host (in_vhost)
        self.auth = "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode("ascii")
        self.timeout = timeout
        self.context: ssl.SSLContext | None = None
        if self.url.startswith("https://"):
            self.context = ssl.create_default_context(cafile=cafile)
            if insecure:
                self.context.check_hostname = False
                self.context.verify_mode = ssl.CERT_NONE

    def request(self, method: str, path: str, body: dict | None = None, auth: bool = True) -> tuple[int, bytes]:
        data = json.dumps(body).encode("utf-8") if body is not None else None
        req = urllib.request.Request(self.url + path, data=data, method=method)
        if auth:
            req.add_header("Authorization", self.auth)
        if data is not None:
            req.add_header("Content-Type", "application/json")
        try:
            with urllib.request.urlopen(req, timeout=self.timeout, context=self.context) as resp:
                return resp.status, resp.read()
        except urllib.error.HTTPError as err:
            return err.code, err.read()
        except (urllib.error.URLError, http.client.HTTPException, OSError, ValueError) as err:
            reason = getattr(err, "reason", err)
            raise CliError(f"cannot reach the broker's admin endpoint at {self.url}: {reason}", UNREACHABLE) \
                from None

    def call(self, op: str, **args: Any) -> Any:
        if self.vhost is not None:
            return self.in_vhost(op, args)
        status, raw = self.request("POST", "/api/" + op, {k: v for k, v in args.items() if v is not None})
        try:
            answer = json.loads(raw)
        except ValueError:
            raise CliError(f"{self.url} answered HTTP {status} without JSON: is it a pymq admin port?",
                           UNREACHABLE) from None
        if not isinstance(answer, dict) or "ok" not in answer:
            raise CliError(f"{self.url} answered an unexpected document (HTTP {status})", UNREACHABLE)
        if not answer["ok"]:
            error = answer.get("error") or {}
            raise CliError(f"{error.get('code', 'error')}: {error.get('message', 'failed')}",
                           _HTTP_EXIT.get(status, FAILED), answer)
        return answer["result"]

    def in_vhost(self, op: str, args: dict[str, Any]) -> Any:
        """``op`` as seen from inside the virtual host ``--vhost`` names (spec/admin.md "Virtual hosts"): the
        names given are the vhost's (``orders`` is ``$vh.shop.orders``), lists hold that vhost's only, and what
        comes back names things as the vhost's clients do."""
        vh = self.vhost
        assert vh is not None
        prefix = vhosts.prefix(vh)
        args = dict(args)
        if op in VHOST_LISTS:
            args["vhost"] = vh
        for key in ("name", "target", "queue", "destination", "from", "to"):
            value = args.get(key)
            if isinstance(value, str) and prefix:
                args[key] = vhosts.inside(value, prefix) if value.startswith("/") else prefix + value
        vhost, self.vhost = self.vhost, None
        try:
            return _vhost_names(self.call(op, **args), prefix)
        finally:
            self.vhost = vhost


#: the operations whose ``vhost`` argument narrows what they list (server/admin/vhost_ops.py)
VHOST_LISTS = frozenset({"list-queues", "list-topics", "list-subscriptions", "list-destinations", "metrics",
                         "connections", "list-consumers", "list-dead-letter-queues"})


def _vhost_names(value: Any, prefix: str) -> Any:
    """A result with a vhost's core names (``$vh.shop.orders``, ``/queue/$vh.shop.orders``) as its clients
    name them."""
    if not prefix:
        return value
    if isinstance(value, str):
        if value.startswith(prefix):
            return value[len(prefix):]
        return vhosts.outside(value) if prefix in value else value
    if isinstance(value, list):
        return [_vhost_names(v, prefix) for v in value]
    if isinstance(value, dict):
        return {_vhost_names(k, prefix): _vhost_names(v, prefix) for k, v in value.items()}
    return value


# -- output ------------------------------------------------------------------------------------------
def table(rows: list[dict], columns: Sequence[tuple[str, str]], out=None) -> None:
    """Rows as aligned columns: ``columns`` is (heading, key); numbers right-aligned."""
    out = out or sys.stdout
    if not rows:
        print("(none)", file=out)
        return
    cells = [[_cell(row.get(key)) for _, key in columns] for row in rows]
    numeric = [all(isinstance(row.get(key), (int, float)) and not isinstance(row.get(key), bool)
                   for row in rows) for _, key in columns]
    widths = [max(len(head), *(len(c[i]) for c in cells)) for i, (head, _) in enumerate(columns)]

    def line(values: list[str]) -> str:
        return "  ".join(v.rjust(w) if num else v.ljust(w)
                         for v, w, num in zip(values, widths, numeric, strict=True)).rstrip()
    print(line([head for head, _ in columns]), file=out)
    for c in cells:
        print(line(c), file=out)


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:.1f}" if value != int(value) else str(int(value))
    if isinstance(value, (list, tuple)):
        return ",".join(str(v) for v in value) or "-"
    if isinstance(value, dict):
        return ", ".join(f"{k}={v}" for k, v in value.items()) or "-"
    return str(value)


def human_bytes(n: int | None) -> str:
    if n is None:
        return "-"
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024  # type: ignore[assignment]
    return str(n)


def pairs(items: Sequence[tuple[str, Any]]) -> None:
    width = max(len(k) for k, _ in items)
    for key, value in items:
        print(f"{key.ljust(width)}  {_cell(value)}")


# -- commands ----------------------------------------------------------------------------------------
# each: (client, args) -> (result, printer); the printer runs unless --json
Command = Callable[[AdminClient, argparse.Namespace], tuple[Any, Callable[[Any], None]]]
COMMANDS: dict[tuple[str, ...], Command] = {}


def command(*path: str):
    def register(fn: Command) -> Command:
        COMMANDS[path] = fn
        return fn
    return register


def _ha_pairs(ha: dict) -> list[tuple[str, object]]:
    holder = ha.get("holder") or {}
    took = ha.get("last_takeover_s")
    return [("role", ha["role"]), ("epoch", ha["epoch"]), ("store", f"{ha['store']}, lease {ha['lease_ms']} ms"),
            ("holder", f"{holder.get('host', '?')} pid {holder.get('pid', '?')}"
                       + (" (OS lock)" if holder.get("os_locked") else "") if holder else "none yet"),
            ("this process", f"{ha['me']['host']} pid {ha['me']['pid']}"
                             + (", the watching backup" if ha.get("candidate") else "")),
            ("takeovers", ha["takeovers"] if took is None else f"{ha['takeovers']} (the last live "
                                                                f"{took:.2f} s after taking the store)"),
            ("fenced", ha["fenced"] or "no")]


@command("ha")
def _ha(c: AdminClient, a):
    def show(s):
        ha = s.get("ha")
        if ha is None:
            print("not part of a high-availability group (no ha: section)")
            return
        pairs(_ha_pairs(ha))
    return c.call("status"), show


@command("status")
def _status(c: AdminClient, a):
    def show(s):
        checks = s["checks"]
        if s.get("role") not in (None, "live"):        # a backup has no broker core to describe
            pairs([("node", s["node"]), ("version", f"{s['version']} (Python {s['python']})"),
                   ("ready", s["ready"]), *_ha_pairs(s["ha"])])
            return
        pairs([("node", s["node"]), ("version", f"{s['version']} (Python {s['python']}, {s['core']} core)"),
               ("ready", s["ready"]),
               ("storage", "open" if checks["storage"] else "NOT READY: " + ", ".join(
                   n for n, ok in checks["devices"].items() if not ok)),
               ("uptime", f"{s['uptime_s']:.0f} s"), ("connections", s["connections"]),
               ("queues", s["queues"]), ("topics", s["topics"]), ("subscriptions", s["subscriptions"]),
               ("messages", f"{s['messages']['depth']} ({s['messages']['ready']} ready, "
                            f"{s['messages']['in_flight']} in flight, {s['messages']['scheduled']} scheduled)"),
               ("rates", f"in {s['rates']['rate_in']}/s, out {s['rates']['rate_out']}/s, "
                         f"ack {s['rates']['rate_ack']}/s"),
               ("memory", f"{human_bytes(s['memory']['held_bytes'])} held of "
                          f"{human_bytes(s['memory']['max_memory'])}, process {human_bytes(s['memory']['rss_bytes'])}"
                          + (" (producers paused)" if s['memory']['memory_high'] else "")),
               ("cluster", ", ".join(s["cluster"]["members"]) if s["cluster"] else "not clustered")])
    return c.call("status"), show


@command("health")
def _health(c: AdminClient, a):
    status, raw = c.request("GET", "/readyz", auth=False)
    if status == 404:
        raise CliError(f"{c.url} has no /readyz: is it a pymq admin port?", UNREACHABLE)
    try:
        answer = json.loads(raw)
    except ValueError:
        answer = None
    if not isinstance(answer, dict) or "ready" not in answer:
        raise CliError(f"{c.url}/readyz answered HTTP {status} without a readiness document: is it a pymq "
                       f"admin port?", UNREACHABLE)
    if not answer["ready"]:
        raise CliError("not ready: " + json.dumps(answer.get("checks")), FAILED, answer)
    return answer, lambda r: print("ready")


QUEUE_COLUMNS = [("NAME", "name"), ("DEPTH", "depth"), ("READY", "ready"), ("IN-FLIGHT", "in_flight"),
                 ("SCHED", "scheduled"), ("CONSUMERS", "consumers"), ("IN/S", "rate_in"),
                 ("OUT/S", "rate_out"), ("ACK/S", "rate_ack"), ("DEAD", "dead_lettered"), ("OWNER", "owner")]


@command("queues", "list")
def _queues_list(c: AdminClient, a):
    return c.call("list-queues"), lambda rows: table(rows, QUEUE_COLUMNS)


@command("queues", "show")
def _queues_show(c: AdminClient, a):
    def show(q):
        m = q["metrics"]
        pairs([("queue", q["destination"]), ("declared", q["declared"]), ("owner", q["acl"].get("owner")),
               ("grants", q["acl"].get("grants")), *((k, v) for k, v in m.items()),
               *((k, v) for k, v in q["rates"].items()), *(("config." + k, v) for k, v in q["config"].items())])
    return c.call("queue-info", name=a.name), show


def _setting_value(text: str) -> Any:
    """A --set value as YAML reads it (numbers, booleans, mappings), so `--set max_depth=10` is an int."""
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError:
        return text


_SETTING_FLAGS = ("max_deliveries", "max_depth", "overflow", "delivery_timeout_ms", "default_priority",
                  "dead_letter_prefix")


def _queue_settings(a) -> dict[str, Any]:
    """The queue settings a `queues create` or `queues alter` command line names (flags, then --set)."""
    config: dict[str, Any] = {}
    for flag in _SETTING_FLAGS:
        if getattr(a, flag) is not None:
            config[flag] = getattr(a, flag)
    for item in a.set or []:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise CliError(f"--set needs key=value, got {item!r}", USAGE)
        config[key] = _setting_value(value)
    return config


@command("queues", "create")
def _queues_create(c: AdminClient, a):
    config = _queue_settings(a)
    grants: dict[str, list[str]] = {}
    for item in a.grant or []:
        principal, sep, perms = item.rpartition("=")
        if not sep or not principal:
            raise CliError(f"--grant needs principal=perm[,perm], got {item!r}", USAGE)
        grants.setdefault(principal, []).extend(p for p in perms.split(",") if p)
    result = c.call("create-queue", name=a.name, config=config, grants=grants or None)
    return result, lambda r: print(f"queue {r['queue']['destination']} "
                                   f"{'created' if r['created'] else 'already exists with these settings'}")


@command("queues", "alter")
def _queues_alter(c: AdminClient, a):
    config = _queue_settings(a)
    if not config:
        raise CliError("queues alter needs at least one setting (a flag or --set KEY=VALUE)", USAGE)
    result = c.call("alter-queue", name=a.name, config=config)

    def show(r):
        changes = r["changes"]
        print(f"queue {r['queue']['destination']}: " + ("; ".join(changes) if changes else "no change"))
    return result, show


@command("queues", "drop")
def _queues_drop(c: AdminClient, a):
    result = c.call("drop-queue", name=a.name, force=a.force or None)
    return result, lambda r: print(f"dropped {a.name} ({r['dropped_messages']} messages)")


@command("queues", "purge")
def _queues_purge(c: AdminClient, a):
    result = c.call("purge-queue", name=a.name)
    return result, lambda r: print(f"purged {r['purged_messages']} messages from {a.name}")


VHOST_COLUMNS = [("VHOST", "name"), ("CONNECTIONS", "connections"), ("QUEUES", "queues"), ("TOPICS", "topics"),
                 ("MESSAGES", "depth"), ("MEMORY", "memory_bytes"), ("MAX-CONN", "max_connections"),
                 ("MAX-QUEUES", "max_queues"), ("MAX-MEMORY", "max_memory"), ("PRINCIPALS", "principals")]


@command("vhosts", "list")
def _vhosts_list(c: AdminClient, a):
    def show(rows):
        table([{**r, **r["limits"], "principals": ",".join(r["principals"]) if r["principals"] else None}
               for r in rows], VHOST_COLUMNS)
    return c.call("list-vhosts"), show


@command("topics", "list")
def _topics_list(c: AdminClient, a):
    def show(rows):
        table([{**t, "subs": len(t["subscriptions"])} for t in rows],
              [("TOPIC", "destination"), ("PUBLISHED", "published"), ("IN/S", "rate_in"), ("SUBSCRIPTIONS", "subs")])
    return c.call("list-topics"), show


SUB_COLUMNS = [("TOPIC", "topic"), ("SUBSCRIPTION", "name"), ("DURABLE", "durable"), ("SHARED", "shared"),
               ("DEPTH", "depth"), ("IN-FLIGHT", "in_flight"), ("CONSUMERS", "consumers"),
               ("OUT/S", "rate_out"), ("SELECTOR", "selector")]


@command("subscriptions", "list")
def _subscriptions_list(c: AdminClient, a):
    rows = c.call("list-subscriptions")
    if a.topic:
        topic = a.topic if a.topic.startswith("/topic/") else "/topic/" + a.topic
        rows = [r for r in rows if r["topic"] == topic]
    return rows, lambda rows: table(rows, SUB_COLUMNS)


def _print_messages(page: dict) -> None:
    messages = page["messages"]
    first = page["offset"] + 1
    for i, m in enumerate(messages, first):
        print(f"#{i} {m['message_id']}  seq {m['seq']}  priority {m['priority']}  "
              f"{'persistent' if m['persistent'] else 'non-persistent'}  deliveries {m['deliveries']}")
        for key, value in m["headers"].items():
            print(f"    {key}: {value}")
        size = m["body_size"]
        cut = ", truncated" if m["body_truncated"] else ""
        if "body" in m:
            print(f"  body ({size} bytes{cut}):")
            for line in (m["body"].splitlines() or [""]):
                print("    " + line)
        else:
            print(f"  body ({size} bytes, binary, base64{cut}): {m['body_base64']}")
    last = page["offset"] + len(messages)
    shown = f"messages {first}-{last}" if messages else "no messages"
    more = f"; next page: --offset {last}" if last < page["ready"] else ""
    print(f"{shown} of {page['ready']} ready ({page['in_flight']} in flight, {page['scheduled']} scheduled, "
          f"not listed){more}")


@command("messages", "browse")
def _messages_browse(c: AdminClient, a):
    page = c.call("browse-queue", name=a.queue, offset=a.offset, limit=a.limit, body_limit=a.body_limit)
    return page, _print_messages


@command("messages", "show")
def _messages_show(c: AdminClient, a):
    m = c.call("get-message", name=a.queue, message_id=a.message_id)
    return m, lambda m: _print_messages({"messages": [m], "offset": 0, "ready": 1, "in_flight": 0,
                                         "scheduled": 0})


def _moved(r: dict) -> None:
    where = ", ".join(f"{n} to {d}" for d, n in r["by_destination"].items())
    print(f"moved {r['moved']} message(s){': ' + where if where else ''}")
    for s in r["skipped"]:
        print(f"skipped {s['message_id']}: {s['reason']}")


def _check_stopped(r: dict) -> dict:
    if r.get("stopped"):
        _moved(r)
        stop = r["stopped"]
        raise CliError(f"stopped at {stop['message_id']}: {stop['code']}: {stop['message']}", FAILED,
                       {"ok": False, "result": r})
    return r


def _in_batches(c: AdminClient, op: str, a, **args) -> dict:
    """One request per batch (the broker moves at most 10,000 per request) until nothing more is
    there; a single request when ids or --limit say what to take."""
    total: dict[str, Any] = {"moved": 0, "by_destination": {}, "skipped": []}
    repeat = not a.id and a.limit is None
    for _ in range(100_000):
        r = c.call(op, message_ids=a.id, limit=a.limit, **args)
        total["moved"] += r["moved"]
        for dest, n in r["by_destination"].items():
            total["by_destination"][dest] = total["by_destination"].get(dest, 0) + n
        total["skipped"] += r["skipped"]
        total["more"] = r.get("more", False)
        if r.get("stopped"):
            total["stopped"] = r["stopped"]
            break
        if not (repeat and r.get("more") and r["moved"]):
            break
    return _check_stopped(total)


@command("messages", "move")
def _messages_move(c: AdminClient, a):
    return _in_batches(c, "move-messages", a, **{"from": a.source, "to": a.target}), _moved


@command("messages", "drop")
def _messages_drop(c: AdminClient, a):
    r = c.call("drop-messages", name=a.queue, message_ids=a.id)
    return r, lambda r: print(f"dropped {r['dropped']} message(s) from {a.queue}")


@command("dlq", "list")
def _dlq_list(c: AdminClient, a):
    return c.call("list-dead-letter-queues"), lambda rows: table(
        rows, [("DLQ", "name"), ("FOR", "source"), ("DEPTH", "depth"), ("CONSUMERS", "consumers"),
               ("REASONS", "reasons")])


@command("dlq", "retry")
def _dlq_retry(c: AdminClient, a):
    return _in_batches(c, "retry-dead-letters", a, name=a.dlq), _moved


@command("dlq", "move")
def _dlq_move(c: AdminClient, a):
    return _in_batches(c, "move-messages", a, **{"from": a.dlq, "to": a.target}), _moved


@command("dlq", "drop")
def _dlq_drop(c: AdminClient, a):
    if a.all:
        r = c.call("purge-queue", name=a.dlq)
        return r, lambda r: print(f"dropped {r['purged_messages']} dead letter(s) from {a.dlq}")
    if not a.id:
        raise CliError("dlq drop needs --id MESSAGE_ID (repeatable) or --all", USAGE)
    r = c.call("drop-messages", name=a.dlq, message_ids=a.id)
    return r, lambda r: print(f"dropped {r['dropped']} dead letter(s) from {a.dlq}")


@command("consumers", "list")
def _consumers_list(c: AdminClient, a):
    return c.call("list-consumers", queue=a.queue), lambda rows: table(
        rows, [("CONNECTION", "connection"), ("USER", "user"), ("ID", "id"), ("DESTINATION", "destination"),
               ("ACK", "ack"), ("PREFETCH", "prefetch"), ("IN-FLIGHT", "in_flight"), ("SELECTOR", "selector")])


@command("connections", "list")
def _connections_list(c: AdminClient, a):
    return c.call("connections"), lambda rows: table(
        rows, [("ID", "id"), ("USER", "user"), ("PEER", "peer"), ("CLIENT-ID", "client_id"),
               ("STOMP", "version"), ("SUBSCRIPTIONS", "subscriptions"), ("RECEIVED", "received"),
               ("SENT", "sent")])


@command("connections", "close")
def _connections_close(c: AdminClient, a):
    return c.call("close-connection", id=a.id), lambda r: print(f"closed connection {r['closed']}")


def _new_password(a, name: str) -> str:
    if a.password_stdin:
        password = sys.stdin.readline().rstrip("\n")
    else:
        if not sys.stdin.isatty():
            raise CliError("no terminal to ask for the new password: use --password-stdin", USAGE)
        password = getpass.getpass(f"new password for {name}: ")
        if getpass.getpass("again: ") != password:
            raise CliError("the passwords differ", USAGE)
    if not password:
        raise CliError("empty password refused", USAGE)
    return password


@command("users", "list")
def _users_list(c: AdminClient, a):
    return c.call("list-users"), lambda rows: table(
        rows, [("USER", "name"), ("ROLES", "roles"), ("LOCALHOST-ONLY", "loopback_only")])


@command("users", "add")
def _users_add(c: AdminClient, a):
    r = c.call("add-user", name=a.name, password=_new_password(a, a.name), roles=_roles(a.roles))
    return r, lambda r: print(f"added user {r['added']} (roles: {', '.join(r['roles']) or 'none'})")


@command("users", "passwd")
def _users_passwd(c: AdminClient, a):
    r = c.call("set-password", name=a.name, password=_new_password(a, a.name))
    return r, lambda r: print(f"changed the password of {r['changed']}")


@command("users", "roles")
def _users_roles(c: AdminClient, a):
    r = c.call("set-roles", name=a.name, roles=_roles(a.roles) or [])
    return r, lambda r: print(f"{r['changed']} now has roles: {', '.join(r['roles']) or 'none'}")


@command("users", "remove")
def _users_remove(c: AdminClient, a):
    return c.call("remove-user", name=a.name), lambda r: print(f"removed user {r['removed']}")


@command("definitions", "export")
def _definitions_export(c: AdminClient, a):
    doc = c.call("export-definitions")

    def write(d):
        text = json.dumps(d, indent=2, sort_keys=True) + "\n"
        if a.file in (None, "-"):
            sys.stdout.write(text)
        else:
            with open(a.file, "w", encoding="utf-8") as fh:
                fh.write(text)
            print(f"wrote {a.file}: {len(d['queues'])} queue(s), {len(d['permissions'])} access list(s), "
                  f"{len(d['durable_subscriptions'])} durable subscription(s), {len(d['users'])} user(s)")
    return doc, write


@command("definitions", "import")
def _definitions_import(c: AdminClient, a):
    if a.file == "-":
        text = sys.stdin.read()
    else:
        with open(a.file, encoding="utf-8") as fh:
            text = fh.read()
    r = c.call("import-definitions", definitions=text)
    return r, lambda r: print("imported: " + ", ".join(f"{k.replace('_', ' ')} {v}" for k, v in sorted(r.items())))


@command("reload")
def _reload(c: AdminClient, a):
    def show(r):
        rules = r["storage_rules"]
        print(f"reloaded: {len(r['users'])} user(s) ({', '.join(r['users'])}); "
              f"{'no storage rules' if rules is None else f'{rules} storage rule(s)'}"
              f"{'; TLS certificate reloaded' if r['tls_reloaded'] else ''}")
        if r["restart_needed"]:
            print(f"changed but applied only after a restart: {', '.join(r['restart_needed'])}")
    return c.call("reload"), show


def _roles(text: str | None) -> list[str] | None:
    if text is None:
        return None
    return [r.strip() for r in text.split(",") if r.strip()]


def _destination(text: str) -> str:
    return text if text.startswith("/") else "/queue/" + text


def _show_acl(r: dict) -> None:
    print(f"owner: {r.get('owner') or '-'}{'  (defaults: no ACL of its own)' if r.get('default') else ''}")
    table([{"principal": p, "permissions": v} for p, v in r.get("grants", {}).items()],
          [("PRINCIPAL", "principal"), ("PERMISSIONS", "permissions")])


@command("grants", "show")
def _grants_show(c: AdminClient, a):
    return c.call("acl", destination=_destination(a.destination)), _show_acl


@command("grants", "add")
def _grants_add(c: AdminClient, a):
    return c.call("grant", destination=_destination(a.destination), principal=a.principal,
                  permissions=_roles(a.permissions)), _show_acl


@command("grants", "remove")
def _grants_remove(c: AdminClient, a):
    return c.call("revoke", destination=_destination(a.destination), principal=a.principal,
                  permissions=_roles(a.permissions)), _show_acl


def _show_storage(s: dict) -> None:
    health = (s.get("rules") or {}).get("devices", {})
    rows = [{**d, "used": human_bytes(d["bytes_used"]), "free": human_bytes(d["bytes_free"]),
             "score": health.get(d["name"], {}).get("score"),
             "persistent": d["name"] == s.get("persistent_device")} for d in s["devices"]]
    table(rows, [("DEVICE", "name"), ("KIND", "kind"), ("ONLINE", "online"), ("MESSAGES", "messages"),
                 ("USED", "used"), ("FREE", "free"), ("ERRORS", "errors"), ("SCORE", "score"),
                 ("PERSISTENT", "persistent")])
    if s.get("rules"):
        print()
        _show_rules(s["rules"])


def _show_rules(r: dict) -> None:
    print(f"strategy {r['strategy']}, default device {r['default_device']}")
    table(r["ranking"], [("RULE", "id"), ("DEVICE", "device"), ("WEIGHT", "weight"), ("ADJUSTED", "adjusted"),
                         ("CONDITION", "condition")])


@command("storage", "status")
def _storage_status(c: AdminClient, a):
    return c.call("storage"), _show_storage


@command("storage", "quarantine")
def _storage_quarantine(c: AdminClient, a):
    return c.call("list-quarantine"), lambda rows: table(
        rows, [("NODE", "node"), ("DEVICE", "device"), ("KEY", "key"), ("KIND", "kind"),
               ("DESTINATION", "destination"), ("SEQ", "seq"), ("BYTES", "size"), ("REASON", "reason")])


@command("storage", "quarantine-drop")
def _storage_quarantine_drop(c: AdminClient, a):
    r = c.call("drop-quarantined", key=a.key, node=a.node, device=a.device)
    if not r["dropped"]:
        raise CliError(f"no quarantined record {a.key!r}" + (f" on node {a.node}" if a.node else ""), NOT_FOUND)
    return r, lambda r: print(f"dropped {len(r['dropped'])} quarantined record(s): its device frees the space")


@command("storage", "rules")
def _storage_rules(c: AdminClient, a):
    return c.call("list-rules"), _show_rules


def _rule_args(a) -> dict:
    rule: dict[str, Any] = {"id": a.id, "device": a.device, "condition": a.condition}
    if a.weight is not None:
        rule["weight"] = a.weight
    return rule


@command("storage", "rule-add")
def _storage_rule_add(c: AdminClient, a):
    return c.call("add-rule", **_rule_args(a)), _show_rules


@command("storage", "rule-replace")
def _storage_rule_replace(c: AdminClient, a):
    return c.call("replace-rule", **_rule_args(a)), _show_rules


@command("storage", "rule-remove")
def _storage_rule_remove(c: AdminClient, a):
    return c.call("remove-rule", id=a.id), _show_rules


@command("cluster", "members")
def _cluster_members(c: AdminClient, a):
    def show(s):
        rows = [{"node": m, "self": m == s["node"], "link": "-" if m == s["node"] else
                 ("up" if s["links"].get(m) else "down"), "outbox": s["outboxes"].get(m, 0)}
                for m in s["members"]]
        table(rows, [("NODE", "node"), ("THIS", "self"), ("LINK", "link"), ("OUTBOX", "outbox")])
    return c.call("cluster"), show


@command("cluster", "outboxes")
def _cluster_outboxes(c: AdminClient, a):
    return c.call("list-outboxes"), lambda rows: table(
        [{**r, "size": human_bytes(r["bytes"])} for r in rows],
        [("PEER", "node"), ("STATE", "state"), ("HELD", "held"), ("MESSAGES", "messages"),
         ("IN-FLIGHT", "in_flight"), ("BYTES", "size"), ("SUBSCRIPTIONS", "subscriptions")])


@command("cluster", "purge-outbox")
def _cluster_purge_outbox(c: AdminClient, a):
    r = c.call("purge-outbox", node=a.node, forget=a.forget or None)
    return r, lambda r: print(f"purged {r['purged_messages']} message(s) held for {r['node']}"
                              + ("; its membership record is forgotten" if r["forgotten"] else ""))


# -- argument parsing --------------------------------------------------------------------------------
def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="pymq-admin", description="Manage a running pymq broker over its admin HTTP API.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="exit codes:\n" + "\n".join(f"  {k}  {v}" for k, v in EXIT_CODES.items()) +
               "\n\nreference: docs/cli.md; every command has --help")
    p.add_argument("--version", action="version", version=f"pymq-admin {pymq.__version__}")
    _global_options(p, None)
    groups = p.add_subparsers(dest="group", metavar="COMMAND", required=True)

    def group(name: str, help_text: str):
        g = groups.add_parser(name, help=help_text, description=help_text)
        return g.add_subparsers(dest="action", metavar="ACTION", required=True)

    groups.add_parser("status", help="the broker at a glance: readiness, counts, rates, memory")
    groups.add_parser("health", help="exit 0 when the broker is ready (/readyz), 1 when not")
    groups.add_parser("ha", help="high availability: this process's role (live, backup...), the epoch, the "
                                 "holder of the store, takeovers (spec/ha.md)")
    groups.add_parser("reload", help="what SIGHUP does: read the config and users files again and apply "
                                     "users, permissions, storage rules, TLS certificate, log level")

    group("vhosts", "virtual hosts with their limits and what each holds (--vhost works inside one)").add_parser(
        "list", help="every virtual host: connections, queues, topics, messages, memory, limits, principals")
    q = group("queues", "list, show, create, alter, drop and purge queues")
    q.add_parser("list", help="queues with depth, ready, in-flight, consumers and rates")
    q.add_parser("show", help="one queue's metrics, rates, configuration and permissions").add_argument("name")
    c = q.add_parser("create", help="declare a queue (you own it)")
    al = q.add_parser("alter", help="change some settings of a queue (its owner or an administrator)")
    for parser in (c, al):
        parser.add_argument("name")
        parser.add_argument("--max-deliveries", dest="max_deliveries", type=int)
        parser.add_argument("--max-depth", dest="max_depth", type=int)
        parser.add_argument("--overflow", choices=["block", "reject", "drop-oldest"])
        parser.add_argument("--delivery-timeout-ms", dest="delivery_timeout_ms", type=int)
        parser.add_argument("--default-priority", dest="default_priority", type=int)
        parser.add_argument("--dead-letter-prefix", dest="dead_letter_prefix")
        parser.add_argument("--set", action="append", metavar="KEY=VALUE", help="any queue setting (spec/admin.md)")
    c.add_argument("--grant", action="append", metavar="PRINCIPAL=PERMS",
                   help="e.g. role:app=produce,consume (repeatable)")
    d = q.add_parser("drop", help="delete a queue and its messages")
    d.add_argument("name")
    d.add_argument("--force", action="store_true", help="even while consumers are attached")
    q.add_parser("purge", help="delete every ready message of a queue").add_argument("name")

    t = group("topics", "list topics")
    t.add_parser("list", help="topics with published counts and subscriptions")
    s = group("subscriptions", "list topic subscriptions")
    sl = s.add_parser("list", help="subscriptions with depth, consumers and selector")
    sl.add_argument("--topic", help="only this topic's")

    m = group("messages", "browse, show, move and drop a queue's messages")
    b = m.add_parser("browse", help="ready messages with headers and bodies, a page at a time")
    b.add_argument("queue")
    b.add_argument("--offset", type=int, default=0)
    b.add_argument("--limit", type=int, default=20, help="messages per page (at most 500)")
    b.add_argument("--body-limit", dest="body_limit", type=int, default=1024, help="body bytes shown per message")
    sh = m.add_parser("show", help="one message, whole")
    sh.add_argument("queue")
    sh.add_argument("message_id")
    mv = m.add_parser("move", help="move messages to another queue or topic")
    mv.add_argument("source")
    mv.add_argument("target")
    mv.add_argument("--id", action="append", help="a message id (repeatable); default: all ready messages")
    mv.add_argument("--limit", type=int, help="move at most this many")
    dr = m.add_parser("drop", help="delete messages by id")
    dr.add_argument("queue")
    dr.add_argument("--id", action="append", required=True, help="a message id (repeatable)")

    dl = group("dlq", "dead-letter queues: list, retry, move, drop")
    dl.add_parser("list", help="dead-letter queues, the queue each serves and why messages died")
    r = dl.add_parser("retry", help="send dead letters back to the queue they came from")
    r.add_argument("dlq")
    r.add_argument("--id", action="append", help="a message id (repeatable); default: all")
    r.add_argument("--limit", type=int)
    dm = dl.add_parser("move", help="move dead letters to another queue or topic")
    dm.add_argument("dlq")
    dm.add_argument("target")
    dm.add_argument("--id", action="append")
    dm.add_argument("--limit", type=int)
    dd = dl.add_parser("drop", help="delete dead letters")
    dd.add_argument("dlq")
    dd.add_argument("--id", action="append")
    dd.add_argument("--all", action="store_true", help="every dead letter in the queue")

    co = group("consumers", "list consumers")
    co.add_parser("list", help="every consumer of every connection").add_argument("--queue", help="only this queue's")
    cn = group("connections", "list and close client connections")
    cn.add_parser("list", help="open connections")
    cn.add_parser("close", help="close a connection (its unacknowledged messages return)").add_argument("id")

    u = group("users", "users of the broker's users file, changed on the running broker")
    u.add_parser("list", help="users and their roles")
    for name, help_text in (("add", "add a user"), ("passwd", "change a user's password")):
        up = u.add_parser(name, help=help_text)
        up.add_argument("name")
        up.add_argument("--password-stdin", action="store_true", help="read the new password from stdin")
        if name == "add":
            up.add_argument("--roles", help="comma-separated roles, e.g. admin")
    ur = u.add_parser("roles", help="set a user's roles (comma-separated; '' for none)")
    ur.add_argument("name")
    ur.add_argument("roles")
    u.add_parser("remove", help="remove a user").add_argument("name")

    d = group("definitions", "queues, grants, durable subscriptions, users, storage rules and vhosts as one "
                             "JSON document (spec/admin.md)")
    d.add_parser("export", help="write the broker's definitions (stdout, or FILE)").add_argument(
        "file", nargs="?", default="-")
    d.add_parser("import", help="apply a definitions document whole or not at all (FILE, or - for stdin)"
                 ).add_argument("file")

    g = group("grants", "permissions on a destination")
    g.add_parser("show", help="owner and grants").add_argument("destination")
    for name, help_text in (("add", "grant permissions"), ("remove", "revoke permissions")):
        gp = g.add_parser(name, help=help_text)
        gp.add_argument("destination", help="a queue name, /queue/..., or /topic/...")
        gp.add_argument("principal", help="*, user:<name> or role:<name>")
        gp.add_argument("permissions", help="comma-separated: produce, consume, browse")

    st = group("storage", "holding devices and the storage rules that choose among them")
    st.add_parser("status", help="devices with usage, errors and scores")
    st.add_parser("quarantine", help="stored records recovery could not decode, kept aside (with the reason)")
    qd = st.add_parser("quarantine-drop", help="delete a quarantined record (its references go, the space is freed)")
    qd.add_argument("key")
    qd.add_argument("--node", help="the node (worker) that holds it, as 'quarantine' lists")
    qd.add_argument("--device", help="the device, when two hold the same key")
    st.add_parser("rules", help="the rules, ranked")
    for name in ("rule-add", "rule-replace"):
        rp = st.add_parser(name, help=f"{name.split('-')[1]} a rule (spec/storage_rules.md)")
        rp.add_argument("--id", required=True)
        rp.add_argument("--device", required=True)
        rp.add_argument("--weight", type=float)
        rp.add_argument("--condition", required=True)
    st.add_parser("rule-remove", help="remove a rule").add_argument("id")

    cl = group("cluster", "cluster membership")
    cl.add_parser("members", help="nodes, links and outboxes")
    cl.add_parser("outboxes", help="what this node holds for each peer (held: the peer is not alive)")
    po = cl.add_parser("purge-outbox", help="drop what this node holds for a peer that is not alive")
    po.add_argument("node")
    po.add_argument("--forget", action="store_true", help="also delete the peer's membership record")
    # the global options anywhere on the line (`pymq-admin queues list --json`, as git and kubectl take
    # theirs): every command's parser takes them too, with no default of its own, so one given after the
    # command sets the value and one not given leaves the main parser's
    for sub in _subparsers(p):
        _global_options(sub, argparse.SUPPRESS)
    return p


def _subparsers(parser: argparse.ArgumentParser) -> list[argparse.ArgumentParser]:
    """Every command and group parser under ``parser``."""
    found = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in dict.fromkeys(action.choices.values()):
                found += [sub, *_subparsers(sub)]
    return found


def _global_options(p: argparse.ArgumentParser, default) -> None:
    """The options every command takes; ``default`` None on the main parser, SUPPRESS on the commands'."""
    def d(value):
        return value if default is None else default
    p.add_argument("--url", default=d(None), help=f"admin endpoint (env PYMQ_ADMIN_URL; default {DEFAULT_URL})")
    p.add_argument("--user", "-u", default=d(None), help="broker user (env PYMQ_ADMIN_USER; default guest)")
    p.add_argument("--password", "-p", default=d(None),
                   help="password (env PYMQ_ADMIN_PASSWORD; prefer the environment or the config file: "
                        "arguments are visible to other local users)")
    p.add_argument("--config", default=d(None), help=f"YAML file with url, user, password, cafile (env "
                                                     f"PYMQ_ADMIN_CONFIG; default {DEFAULT_CONFIG} when it exists)")
    p.add_argument("--cafile", default=d(None), help="CA certificates to verify an https:// admin endpoint")
    p.add_argument("--insecure", action="store_true", default=d(False), help="do not verify the https certificate")
    p.add_argument("--timeout", type=float, default=d(30.0), help="seconds to wait for an answer (default 30)")
    p.add_argument("--vhost", default=d(None), help="work inside this virtual host: names are its own (`queues show "
                   "orders` is its orders), lists hold its things only (spec/admin.md \"Virtual hosts\"); default: "
                   "the whole broker, a vhost's names as $vh.<vhost>.<name>")
    p.add_argument("--json", action="store_true", default=d(False),
                   help="print the operation's JSON result (for scripts)")


def _settings(a: argparse.Namespace) -> dict:
    env = os.environ
    path = a.config or env.get("PYMQ_ADMIN_CONFIG")
    explicit = path is not None
    path = os.path.expanduser(path or DEFAULT_CONFIG)
    data: dict = {}
    if os.path.exists(path):
        try:
            with open(path, encoding="utf-8") as fh:
                data = yaml.safe_load(fh) or {}
        except (OSError, yaml.YAMLError) as exc:
            raise CliError(f"cannot read {path}: {exc}", USAGE) from None
        if not isinstance(data, dict):
            raise CliError(f"{path} must hold a mapping (url, user, password, cafile)", USAGE)
        unknown = sorted(set(data) - {"url", "user", "password", "cafile", "insecure"})
        if unknown:
            raise CliError(f"{path}: unknown key(s) {', '.join(unknown)} (url, user, password, cafile, insecure)",
                           USAGE)
        if "password" in data and os.stat(path).st_mode & (stat.S_IRWXG | stat.S_IRWXO):
            print(f"pymq-admin: warning: {path} holds a password and others can read it "
                  f"(chmod 600 {path})", file=sys.stderr)
    elif explicit:
        raise CliError(f"config file {path} does not exist", USAGE)

    def pick(flag, env_name: str, key: str, default):
        if flag is not None:
            return flag
        if env.get(env_name):
            return env[env_name]
        value = data.get(key)
        return default if value is None else value
    user = pick(a.user, "PYMQ_ADMIN_USER", "user", None)
    password = pick(a.password, "PYMQ_ADMIN_PASSWORD", "password", None)
    if user is None:
        user, password = "guest", "guest" if password is None else password
    return {"url": str(pick(a.url, "PYMQ_ADMIN_URL", "url", DEFAULT_URL)), "user": str(user),
            "password": "" if password is None else str(password),
            "cafile": a.cafile or data.get("cafile"), "insecure": a.insecure or bool(data.get("insecure"))}


def main(argv: list[str] | None = None) -> int:
    try:
        return _main(argv)
    except BrokenPipeError:
        # the reader went away (`pymq-admin ... | head`): no traceback, as any Unix tool; what Python would
        # still flush at exit goes to /dev/null, and the status is a SIGPIPE death's, 128 + 13
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return CLOSED_PIPE


def _main(argv: list[str] | None) -> int:
    parser = build_parser()
    a = parser.parse_args(argv)
    key = (a.group,) if a.group in ("status", "health", "reload", "ha") else (a.group, a.action)
    try:
        s = _settings(a)
        url = urllib.parse.urlsplit(s["url"])
        if url.scheme not in ("http", "https") or not url.netloc:
            raise CliError(f"--url must be http://host:port or https://host:port, got {s['url']!r}", USAGE)
        client = AdminClient(s["url"], s["user"], s["password"], a.timeout, s["cafile"], s["insecure"])
        if a.vhost is not None:
            try:
                client.vhost = "/" if a.vhost in ("", "/") else vhosts.check_name(a.vhost.removeprefix("/"))
            except ValueError as exc:
                raise CliError(f"--vhost: {exc}", USAGE) from None
        result, printer = COMMANDS[key](client, a)
    except CliError as exc:
        if a.json and exc.payload is not None:
            print(json.dumps(exc.payload, indent=2, default=str))
        print(f"pymq-admin: {exc.message}", file=sys.stderr)
        return exc.code
    except KeyboardInterrupt:
        return 130
    if a.json:
        print(json.dumps(result, indent=2, default=str))
    else:
        printer(result)
    sys.stdout.flush()     # a closed pipe is found here, inside main, not at interpreter exit
    return OK


if __name__ == "__main__":
    sys.exit(main())
