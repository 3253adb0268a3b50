"""The Python SDK's side of the Java interoperability tests (bindings/java, ``InteropTest``).

The Java test runs ``python tests/bindings/python_peer.py`` with one JSON request on stdin and reads one
JSON answer on stdout, so every scenario checks the real SDK (``pymq.connect`` over TCP) against the
real provider.  Requests (``url`` is always given; ``client_id`` optional):

==============  ===========================================================================================
op              fields → answer
==============  ===========================================================================================
send            destination, messages[], transacted (commit, or rollback with ``rollback: true``) → ids
receive         destination, count, timeout, selector, durable (name), shared, transacted, rollback_first,
                ack ("auto" | "client") → messages[] (the received ones, at most ``count``)
serve           queue, count: answer ``count`` requests with ``"re:" + text`` and their correlation id → served
request         queue, body, timeout: a Requestor round trip → message
unsubscribe     name → {}
==============  ===========================================================================================

A message is ``{"kind": "text"|"bytes"|"map", "body": <text | hex | {name: typed}>, "properties":
{name: {"type": "string"|"int"|"float"|"bool", "value": v}}, "correlation_id", "reply_to", "type",
"priority", "persistent", "redelivered", "delivery_count", "destination", "message_id", "group_id"}``;
map values use the same typed form (plus ``{"type": "bytes", "value": hex}`` and ``{"type": "null"}``).
"""
from __future__ import annotations

import json
import sys
from typing import Any

import pymq
from pymq.message import BytesMessage, MapMessage, Message, TextMessage

_TYPES = {bool: "bool", int: "int", float: "float", str: "string"}


def typed(value: Any) -> dict:
    if value is None:
        return {"type": "null"}
    if isinstance(value, bytes):
        return {"type": "bytes", "value": value.hex()}
    return {"type": _TYPES[type(value)], "value": value}


def untyped(spec: dict) -> Any:
    kind, value = spec["type"], spec.get("value")
    if kind == "null":
        return None
    if kind == "bytes":
        return bytes.fromhex(value)
    return {"bool": bool, "int": int, "float": float, "string": str}[kind](value)


def describe(m: Message) -> dict:
    if isinstance(m, TextMessage):
        kind, body = "text", m.text
    elif isinstance(m, MapMessage):
        kind, body = "map", {k: typed(v) for k, v in m.map.items()}
    else:
        kind, body = "bytes", m.data.hex() if isinstance(m, BytesMessage) else ""
    return {"kind": kind, "body": body, "properties": {k: typed(v) for k, v in m.properties.items()},
            "correlation_id": m.correlation_id, "reply_to": m.reply_to.stomp_name if m.reply_to else None,
            "type": m.type, "priority": m.priority, "persistent": m.persistent, "redelivered": m.redelivered,
            "delivery_count": m.delivery_count, "message_id": m.message_id, "group_id": m.group_id,
            "destination": m.destination.stomp_name if m.destination else None, "expiration": m.expiration}


def build(spec: dict) -> Message:
    kind = spec.get("kind", "text")
    if kind == "text":
        m: Message = TextMessage(spec["body"])
    elif kind == "bytes":
        m = BytesMessage(bytes.fromhex(spec["body"]))
    else:
        m = MapMessage({k: untyped(v) for k, v in spec["body"].items()})
    for name, value in spec.get("properties", {}).items():
        m.set_property(name, untyped(value))
    m.correlation_id = spec.get("correlation_id")
    if spec.get("reply_to"):
        m.reply_to = pymq.destination.as_destination(spec["reply_to"])
    m.type = spec.get("type")
    if spec.get("group_id"):
        m.group_id = spec["group_id"]
    return m


def run(req: dict) -> dict:
    op = req["op"]
    options = {"client_id": req["client_id"]} if req.get("client_id") else {}
    with pymq.connect(req["url"], **options) as conn:
        if op == "send":
            session = conn.create_session(transacted=bool(req.get("transacted")))
            producer = session.create_producer(req["destination"])
            ids = []
            for spec in req["messages"]:
                sent = producer.send(build(spec), priority=spec.get("priority"),
                                     delivery_mode=pymq.NON_PERSISTENT if spec.get("persistent") is False else None)
                ids.append(sent.message_id)
            if req.get("transacted"):
                session.rollback() if req.get("rollback") else session.commit()
            return {"ids": ids}
        if op == "receive":
            transacted = bool(req.get("transacted"))
            mode = pymq.CLIENT_ACKNOWLEDGE if req.get("ack") == "client" else pymq.AUTO_ACKNOWLEDGE
            session = conn.create_session(transacted=transacted, ack_mode=mode)
            selector = req.get("selector")
            if req.get("durable"):
                if req.get("shared"):
                    consumer = session.create_shared_durable_consumer(req["destination"], req["durable"], selector)
                else:
                    consumer = session.create_durable_consumer(req["destination"], req["durable"], selector)
            else:
                consumer = session.create_consumer(req["destination"], selector)
            if req.get("rollback_first"):
                first = consumer.receive(timeout=req.get("timeout", 5))
                assert first is not None, "nothing to roll back"
                session.rollback()
            out = []
            wait = req.get("timeout", 5)
            while len(out) < req.get("count", 1):
                m = consumer.receive(timeout=wait)
                if m is None:
                    break
                out.append(describe(m))
                wait = req.get("more_timeout", wait)
            if transacted:
                session.commit()
            elif mode == pymq.CLIENT_ACKNOWLEDGE:
                session.acknowledge()
            consumer.close()
            return {"messages": out}
        if op == "serve":
            session = conn.create_session()
            consumer = session.create_consumer(req["queue"])
            served = 0
            while served < req.get("count", 1):
                m = consumer.receive(timeout=req.get("timeout", 10))
                if m is None:
                    break
                pymq.reply(session, m, pymq.TextMessage("re:" + m.text))
                served += 1
            return {"served": served}
        if op == "request":
            session = conn.create_session()
            requestor = pymq.Requestor(session, req["queue"])
            answer = requestor.request(build(req["message"]), timeout=req.get("timeout", 10))
            return {"message": describe(answer)}
        if op == "unsubscribe":
            conn.create_session().unsubscribe(req["name"], shared=bool(req.get("shared")))
            return {}
    raise ValueError(f"unknown op {op!r}")


def main() -> int:
    request = json.loads(sys.stdin.read())
    try:
        answer = run(request)
    except Exception as exc:  # noqa: BLE001 - the Java side gets the error as data and fails the test
        print(json.dumps({"ok": False, "error": f"{type(exc).__name__}: {exc}"}))
        return 1
    print(json.dumps({"ok": True, **answer}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
