"""Admin operations on the messages in a queue: browse (paged), show one, move, retry dead letters, drop.

Browsing reads the ready messages in delivery order (priority, then arrival) without acquiring them,
as a JMS ``QueueBrowser`` does; messages a consumer holds unacknowledged are counted, not listed.

Moving a message re-sends a copy through the broker's ordinary SEND path (so the target's schema,
depth limit, overflow policy, storage rules and cluster routing all apply) and only then removes the
original: a crash in between leaves a duplicate, never a loss.  Headers the broker set for the old
place (dead-letter reason, delivery count, expiry of the dead-letter retention, duplicate-detection id,
scheduled delay) are not carried over.  Permissions: browsing needs ``browse`` on the queue; moving,
retrying and dropping need ``consume`` on the source and ``produce`` on the target.

Publishing (the console's form, ``publish``) sends one message through the same SEND path, as the asking
user: it needs ``produce`` on the destination, as a STOMP SEND from that user would.
"""
from __future__ import annotations

import base64
import codecs
from itertools import islice
from typing import Any

from pymq.errors import ConfigError, DestinationError, PymqError, UnknownDestination, UnknownMessage
from pymq_server.admin.checks import MAX_TEXT, bool_arg, ids_arg, int_arg, queue_name, text_arg
from pymq_server.broker import vhosts
from pymq_server.broker.acl import may_monitor
from pymq_server.broker.requests import parse_send

#: most messages one browse page returns
MAX_PAGE = 500
#: default and largest body excerpt in a browse page (a single message is shown whole up to MAX_BODY)
PAGE_BODY = 4096
MAX_BODY = 4 * 1024 * 1024
#: body text one browse page holds at most, as rendered (base64 counted as sent): a page of 500 messages
#: of 4 MiB bodies was built whole in memory (issue 24: 4 such requests held +1,083 MiB); past this the
#: page ends early and says where to go on (``next_offset``).  At least one message is always shown.
MAX_PAGE_BYTES = 4 * 1024 * 1024

#: most messages one move or retry request moves when it names no ids (the answer says if there are more)
MAX_BATCH = 10_000

#: headers that describe a message's previous place; a moved copy starts without them
_PLACE_HEADERS = frozenset({"pymq-dead-letter-reason", "pymq-expiry-reason", "JMSXDeliveryCount", "expires",
                            "pymq-dedup-id", "_AMQ_DUPL_ID", "AMQ_SCHEDULED_DELAY", "AMQ_SCHEDULED_TIME",
                            "AMQ_SCHEDULED_PERIOD", "AMQ_SCHEDULED_REPEAT", "pymq-seq", "subscription",
                            "ack", "redelivered"})
_ORIGIN_HEADERS = frozenset({"pymq-original-destination", "pymq-original-message-id"})


def _queue(broker, name: str):
    queue = broker.queues.get(name)
    if queue is None:
        raise UnknownDestination(f"queue '/queue/{name}' does not exist", destination="/queue/" + name)
    return queue


def render_body(body: bytes, limit: int) -> dict:
    """The body as text when it is UTF-8, else base64; at most ``limit`` bytes of it."""
    shown = body[:limit]
    truncated = len(body) > limit
    try:
        # incremental: a character the cut split at the end is left out, any other bad byte is binary
        text: str | None = codecs.getincrementaldecoder("utf-8")().decode(shown, final=not truncated)
    except UnicodeDecodeError:
        text = None
    out: dict[str, Any] = {"body_size": len(body), "body_truncated": truncated}
    if text is not None:
        out["body"] = text
    else:
        out["body_base64"] = base64.b64encode(shown).decode("ascii")
    return out


def render_message(entry, body_limit: int) -> dict:
    message = entry.message
    return {"message_id": message.message_id, "seq": message.seq, "priority": message.priority,
            "persistent": message.persistent, "timestamp": message.timestamp, "expires": message.expires,
            "deliveries": entry.deliveries, "state": str(entry.state).lower(),
            "headers": message.frame_headers(), **render_body(message.body, body_limit)}


def browse_queue(admin, user, args: dict) -> dict:
    broker = admin.broker
    name = queue_name(args)
    queue = _queue(broker, name)
    broker.acl.check(user, queue.destination, "browse")
    offset = int_arg(args, "offset", 0, maximum=1 << 40)
    limit = int_arg(args, "limit", 50, minimum=1, maximum=MAX_PAGE)
    body_limit = int_arg(args, "body_limit", PAGE_BODY, maximum=MAX_BODY)
    now = broker.now_ms()
    live = (e for e in queue.ready if not e.message.expired(now))
    page: list[dict] = []
    size = 0
    cut = False
    for entry in islice(live, offset, offset + limit):
        if page and size + _rendered_size(entry.message.body, body_limit) > MAX_PAGE_BYTES:
            cut = True
            break
        shown = render_message(entry, body_limit)
        size += len(shown.get("body") or shown.get("body_base64") or "")
        page.append(shown)
    return {"name": name, "destination": queue.destination, "offset": offset, "limit": limit,
            "ready": queue.ready.count, "in_flight": queue.acquired, "scheduled": queue.scheduled,
            "messages": page, "page_bytes_cut": cut, "next_offset": offset + len(page)}


def _rendered_size(body: bytes, limit: int) -> int:
    """What render_body makes of ``body`` at most, in characters (base64 for binary: 4 per 3 bytes)."""
    shown = min(len(body), limit)
    return (shown + 2) // 3 * 4


def get_message(admin, user, args: dict) -> dict:
    broker = admin.broker
    name = queue_name(args)
    queue = _queue(broker, name)
    broker.acl.check(user, queue.destination, "browse")
    message_id = text_arg(args, "message_id")
    body_limit = int_arg(args, "body_limit", MAX_BODY, maximum=MAX_BODY)
    for entry in queue.ready:
        if entry.message.message_id == message_id:
            return {"name": name, "destination": queue.destination, **render_message(entry, body_limit)}
    raise UnknownMessage(f"no ready message {message_id!r} in queue '/queue/{name}' (it may have been "
                         f"consumed, or be held by a consumer)")


def _batch_limit(args: dict) -> int:
    """How many messages one move/retry without ids takes: ``limit``, at most MAX_BATCH (one request
    never holds the event loop for long; ``more`` in the answer tells the caller to ask again)."""
    return min(int_arg(args, "limit", MAX_BATCH, minimum=1, maximum=1 << 40), MAX_BATCH)


def _selected(queue, ids: list[str] | None, limit: int, accept=None) -> list:
    """The ready entries named by ``ids`` (else the first ``limit`` in delivery order that ``accept``
    takes); an unknown id is an error before anything moves."""
    if ids is None:
        candidates = queue.ready if accept is None else (e for e in queue.ready if accept(e))
        return list(islice(candidates, limit))
    wanted = set(ids)
    found = {}
    for entry in queue.ready:
        mid = entry.message.message_id
        if mid in wanted:
            found[mid] = entry
            if len(found) == len(wanted):
                break
    missing = [i for i in ids if i not in found]
    if missing:
        raise UnknownMessage(f"no ready message(s) {', '.join(missing[:5])}"
                             f"{' ...' if len(missing) > 5 else ''} in {queue.destination}; nothing was changed")
    return [found[i] for i in dict.fromkeys(ids)]


def _target(broker, text: str, verb: str = "moved to") -> str:
    """A destination to move (or publish) to: a queue name, ``/queue/name`` or ``/topic/name``."""
    if not text.startswith("/"):
        text = "/queue/" + text
    if not text.startswith(("/queue/", "/topic/")):
        raise DestinationError(f"messages can be {verb} a queue or a topic, not {text!r}", destination=text)
    broker.resolve(text)            # validates the name
    return text


def _resend(broker, entry, destination: str, keep_origin: bool) -> None:
    message = entry.message
    headers = {k: v for k, v in message.headers.items()
               if k not in _PLACE_HEADERS and (keep_origin or k not in _ORIGIN_HEADERS)}
    headers["destination"] = destination
    broker.send(None, parse_send(headers, message.body))   # None: the broker itself (checked by the caller)
    entry.queue.remove_ready([entry])


def _move_all(broker, entries: list, target_of, batch: int | None) -> dict:
    """Move ``entries``; ``more`` says a whole batch was taken, so asking again may find more."""
    result = _move_entries(broker, entries, target_of)
    result["more"] = batch is not None and "stopped" not in result and len(entries) == batch
    return result


def _move_entries(broker, entries: list, target_of) -> dict:
    moved = 0
    skipped: list[dict] = []
    by_destination: dict[str, int] = {}
    for entry in entries:
        destination, why = target_of(entry)
        if destination is None:
            skipped.append({"message_id": entry.message.message_id, "reason": why})
            continue
        try:
            _resend(broker, entry, destination, keep_origin=why != "retry")
        except PymqError as exc:
            # e.g. the target filled up (overflow: reject): what moved stays moved, the rest stays here
            return {"moved": moved, "by_destination": by_destination, "skipped": skipped,
                    "stopped": {"code": exc.code, "message": exc.message,
                                "message_id": entry.message.message_id}}
        moved += 1
        by_destination[destination] = by_destination.get(destination, 0) + 1
    return {"moved": moved, "by_destination": by_destination, "skipped": skipped}


def move_messages(admin, user, args: dict) -> dict:
    broker = admin.broker
    queue = _queue(broker, queue_name(args, "from"))
    target = _target(broker, text_arg(args, "to") or "")
    if target == queue.destination:
        raise ConfigError(f"cannot move messages from {target} to itself")
    broker.acl.check(user, queue.destination, "consume")
    broker.acl.check(user, target, "produce")
    ids = ids_arg(args)
    batch = None if ids is not None else _batch_limit(args)
    entries = _selected(queue, ids, batch or 0)
    return _move_all(broker, entries, lambda entry: (target, "move"), batch)


def retry_dead_letters(admin, user, args: dict) -> dict:
    """Send dead letters back to the queue they came from (``pymq-original-destination``)."""
    broker = admin.broker
    queue = _queue(broker, queue_name(args))
    broker.acl.check(user, queue.destination, "consume")
    ids = ids_arg(args)
    batch = None if ids is not None else _batch_limit(args)
    # the header names the queue as its vhost's clients do (router.py): back inside the dead-letter queue's vhost
    vh = vhosts.split(queue.destination[len("/queue/"):])[0]

    def origin_of(entry) -> str | None:
        origin = entry.message.headers.get("pymq-original-destination")
        if origin is None:
            return None
        origin = vhosts.inside(origin, vh) if vh else origin
        # never out of the dead-letter queue's vhost, whatever the header says
        return origin if vhosts.split(origin.partition("/queue/")[2])[0] == vh else None

    def retryable(entry) -> bool:
        origin = origin_of(entry)
        return origin is not None and origin.startswith("/queue/") and origin != queue.destination
    # without ids, only what can go back is taken: messages that cannot never block the ones behind them
    entries = _selected(queue, ids, batch or 0, None if ids is not None else retryable)
    targets: dict[str, str | None] = {}
    for entry in entries:
        origin = origin_of(entry)
        if origin is not None and origin not in targets:
            targets[origin] = origin if origin.startswith("/queue/") and origin != queue.destination else None
    for target in targets.values():
        if target is not None:
            broker.acl.check(user, target, "produce")     # every refusal before anything moves

    def target_of(entry) -> tuple[str | None, str]:
        origin = origin_of(entry)
        if origin is None:
            return None, "no pymq-original-destination header: not a dead letter (use move)"
        if targets.get(origin) is None:
            return None, (f"came from {origin}; only queue dead letters are retried "
                          f"(move a subscription's to a queue or topic)")
        return origin, "retry"
    return _move_all(broker, entries, target_of, batch)


def drop_messages(admin, user, args: dict) -> dict:
    broker = admin.broker
    queue = _queue(broker, queue_name(args))
    broker.acl.check(user, queue.destination, "consume")
    ids = ids_arg(args)
    if not ids:
        raise ConfigError("drop-messages needs 'message_ids' (to empty the whole queue use purge-queue)")
    entries = _selected(queue, ids, len(ids))
    queue.remove_ready(entries)
    return {"dropped": len(entries)}


#: largest body ``publish`` takes (the admin port's admin_max_body bounds the request before this)
MAX_PUBLISH_BODY = 1024 * 1024
#: most headers one ``publish`` sets
MAX_PUBLISH_HEADERS = 64
#: headers ``publish`` sets itself or that belong to a frame, never to a message an operator types
_FRAME_HEADERS = frozenset({"destination", "content-length", "transaction", "receipt", "message-id",
                            "subscription", "ack", "persistent"})


def publish(admin, user, args: dict) -> dict:
    """Send one message (``body`` text, ``headers`` string to string, ``persistent``) to ``destination``
    (a queue name, ``/queue/name`` or ``/topic/name``) as ``user``."""
    broker = admin.broker
    target = _target(broker, text_arg(args, "destination") or "", "published to")
    body = args.get("body", "")
    if not isinstance(body, str):
        raise ConfigError(f"argument 'body' must be a string, got {type(body).__name__}")
    data = body.encode("utf-8", "surrogatepass") if body else b""
    if len(data) > MAX_PUBLISH_BODY:
        raise ConfigError(f"a published body may have at most {MAX_PUBLISH_BODY} bytes, got {len(data)}")
    raw = args.get("headers") or {}
    if not isinstance(raw, dict):
        raise ConfigError(f"argument 'headers' must be an object of strings, got {type(raw).__name__}")
    if len(raw) > MAX_PUBLISH_HEADERS:
        raise ConfigError(f"at most {MAX_PUBLISH_HEADERS} headers, got {len(raw)}")
    headers: dict[str, str] = {}
    for name, value in raw.items():
        if not isinstance(value, str) or not name or len(name) > MAX_TEXT or len(value) > MAX_TEXT:
            raise ConfigError(f"header {str(name)[:64]!r}: names and values are strings of 1-{MAX_TEXT} "
                              f"characters")
        if name.lower() in _FRAME_HEADERS or name.startswith("pymq-") or any(c in name for c in ":\r\n") \
                or any(c in value for c in "\r\n"):
            raise ConfigError(f"header {name[:64]!r} cannot be set here (a frame's own, the broker's, or "
                              f"a line break)")
        headers[name] = value
    broker.acl.check(user, target, "produce")
    if target.startswith("/queue/") and target[len("/queue/"):] not in broker.queues:
        broker.acl.check(user, target, "create")      # a SEND to a new queue creates it: so does this
    headers["destination"] = target
    headers["persistent"] = "true" if bool_arg(args, "persistent", True) else "false"
    request = parse_send(headers, data)
    broker.send(None, request, pause=False)
    return {"destination": target, "bytes": len(data), "persistent": headers["persistent"] == "true"}


def dead_letter_prefixes(broker) -> set[str]:
    prefixes = {broker.config.queue_defaults.dead_letter_prefix}
    prefixes.update(q.config.dead_letter_prefix for q in broker.queues.values())
    return {p for p in prefixes if p}


def list_dead_letter_queues(admin, user, args: dict) -> list:
    """Every dead-letter queue with the queue it serves and why its messages died."""
    broker = admin.broker
    prefixes = sorted(dead_letter_prefixes(broker), key=len, reverse=True)
    out = []
    with_reasons = bool_arg(args, "reasons", True)
    for name, queue in sorted(broker.queues.items()):
        vh, local = vhosts.split(name)             # a vhost's dead-letter queues are inside it
        prefix = next((p for p in prefixes if local.startswith(p) and len(local) > len(p)), None)
        if prefix is None or not (may_monitor(user) or broker.acl.sees(user, queue.destination)):
            continue
        reasons: dict[str, int] = {}
        if with_reasons:
            for entry in islice(queue.ready, 1000):        # a sample: the newest kinds of failure
                reason = entry.message.headers.get("pymq-dead-letter-reason", "unknown")
                reasons[reason] = reasons.get(reason, 0) + 1
        out.append({"name": name, "destination": queue.destination, "source": vh + local[len(prefix):],
                    "depth": queue.depth, "ready": queue.ready.count, "consumers": len(queue.consumers),
                    "reasons": reasons})
    return out
