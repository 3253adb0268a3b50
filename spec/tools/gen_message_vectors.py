"""Regenerate spec/vectors/messages.json: how a MESSAGE frame decodes into a JMS message (spec/stomp.md §7).

Run by hand after a deliberate change to §7 or to ``pymq.message.from_frame``:
``python spec/tools/gen_message_vectors.py``.  The expected values are what the Python SDK's
``from_frame`` returns for each frame; ``tests/bindings/test_message_vectors.py`` checks that they still
are, and the Go and TypeScript bindings run the same file.  Inputs stay inside what every language can
express exactly: integers below 2^53, floats that are exact in binary, UTF-8 or Latin-1 text.  A case
with ``expect_jms`` also says, by hand, the Java class a JMS binding gives each property (the
``pymq-jms-types`` rule of §7); the Python SDK and the other bindings ignore it.
"""
from __future__ import annotations

import base64
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))

from pymq.message import BytesMessage, MapMessage, TextMessage, from_frame  # noqa: E402

OUT = os.path.join(os.path.dirname(HERE), "vectors", "messages.json")

DESCRIPTION = (
    "MESSAGE frame -> JMS message, as pymq.message.from_frame decodes it (spec/stomp.md section 7). "
    "Input: 'headers' (pairs, first wins, as the scanner hands them over) and 'body_hex'. Expected: "
    "'kind' text|bytes|map with 'text', 'bytes_hex' or 'map' (JSON; a bytes value is {\"$bytes\": base64}); "
    "the JMS fields (null when absent); 'properties' as {name: {type: string|int|float|bool, value}}, "
    "every header that is not a JMS header or protocol machinery, typed by pymq-types. 'expect_jms' (some "
    "cases): the Java class a JMS binding returns from getObjectProperty, narrowed by pymq-jms-types."
)


def case(name: str, headers: list[tuple[str, str]], body: bytes = b"") -> dict:
    return {"name": name, "headers": [list(h) for h in headers], "body_hex": body.hex()}


CASES = [
    case("text/plain utf-8", [("content-type", "text/plain;charset=utf-8")], "héllo".encode()),
    case("text/plain latin-1", [("content-type", "text/plain; charset=ISO-8859-1")], b"caf\xe9"),
    case("content-type is case-insensitive", [("content-type", "Text/Plain; Charset=UTF-8")], b"ok"),
    case("text/csv is text", [("content-type", "text/csv")], b"a,b\n1,2\n"),
    case("application/json is text", [("content-type", "application/json")], b'{"a": 1}'),
    case("application/xml is text", [("content-type", "application/xml")], b"<a/>"),
    case("octet-stream is bytes", [("content-type", "application/octet-stream")], bytes(range(256))),
    case("any other type is bytes", [("content-type", "image/png")], b"\x89PNG\r\n"),
    case("no content-type, UTF-8 body: text", [], "naïve €".encode()),
    case("no content-type, empty body: text", [], b""),
    case("no content-type, not UTF-8: bytes", [], b"\xff\x00\xfe"),
    case("map message", [("content-type", "application/x-pymq-map+json")],
         json.dumps({"sku": "A-1", "qty": 3, "price": 9.5, "gift": False, "note": None,
                     "blob": {"$bytes": base64.b64encode(b"\x00\x01\xff").decode()}}).encode()),
    case("map by ActiveMQ transformation", [("transformation", "jms-map-json")], b'{"a":"b","n":-7}'),
    case("empty map body", [("content-type", "application/x-pymq-map+json")], b""),
    case("JMS headers", [
        ("message-id", "ID:node1-42"), ("destination", "/queue/orders"), ("subscription", "s1"),
        ("ack", "a-1"), ("persistent", "false"), ("priority", "7"), ("timestamp", "1700000000123"),
        ("expires", "1700000060000"), ("correlation-id", "corr:1"), ("reply-to", "/temp-queue/tmp.c1.r"),
        ("type", "order"), ("redelivered", "true"), ("JMSXDeliveryCount", "3"), ("pymq-seq", "17"),
        ("content-length", "2"), ("content-type", "text/plain;charset=utf-8")], b"hi"),
    case("defaults when headers are absent", [("destination", "/topic/prices")], b"x"),
    case("persistent is case-insensitive, bad numbers fall back",
         [("persistent", "FALSE"), ("priority", "high"), ("timestamp", "soon"), ("pymq-seq", "-1")], b"x"),
    case("typed properties", [
        ("pymq-types", "count=i,ratio=f,flag=b,off=b,neg=i,big=i,exp=f"), ("count", "42"), ("ratio", "0.25"),
        ("flag", "true"), ("off", "false"), ("neg", "-9"), ("big", "9007199254740991"), ("exp", "1e-3"),
        ("label", "plain string"), ("empty", "")], b""),
    case("a typed value that does not parse stays a string",
         [("pymq-types", "n=i,b=b"), ("n", "twelve"), ("b", "yes")], b""),
    case("unlisted names are strings; types of absent names are ignored",
         [("pymq-types", "ghost=i"), ("n", "5")], b""),
    case("group headers", [("JMSXGroupID", "g-1"), ("JMSXGroupSeq", "5")], b""),
    case("reserved headers are not properties", [
        ("content-length", "0"), ("receipt", "r"), ("transaction", "t"), ("browser", "true"),
        ("transformation", "x"), ("expiration", "100"), ("kept", "yes")], b""),
    case("escaped characters survive", [("note", "a:b\nc\\d"), ("k:ey", "v")], b""),
    dict(case("JMS types: a header for Java, not a property", [
        ("pymq-types", "qty=i,tenth=f,s=i,b=i,big=i,r=f"), ("pymq-jms-types", "qty=int,tenth=float,s=short,b=byte"),
        ("qty", "-3"), ("tenth", "0.1"), ("s", "-2"), ("b", "7"), ("big", "9007199254740991"), ("r", "0.5")], b""),
         expect_jms={"qty": "Integer", "tenth": "Float", "s": "Short", "b": "Byte", "big": "Long", "r": "Double"}),
    dict(case("JMS types never change a value: out of range, untyped or not a number", [
        ("pymq-types", "wide=i,n=i,x=f"), ("pymq-jms-types", "wide=int,label=int,n=byte,x=int,ghost=int"),
        ("wide", "2147483648"), ("label", "7"), ("n", "twelve"), ("x", "1.5")], b""),
         expect_jms={"wide": "Long", "label": "String", "n": "String", "x": "Double"}),
]


def typed(value):
    if isinstance(value, bool):
        return {"type": "bool", "value": value}
    if isinstance(value, int):
        return {"type": "int", "value": value}
    if isinstance(value, float):
        return {"type": "float", "value": value}
    return {"type": "string", "value": value}


def jsonable_map(m: dict) -> dict:
    return {k: ({"$bytes": base64.b64encode(v).decode()} if isinstance(v, bytes) else v) for k, v in m.items()}


def expected(c: dict) -> dict:
    headers: dict = {}
    for k, v in c["headers"]:
        headers.setdefault(k, v)
    msg = from_frame(headers, bytes.fromhex(c["body_hex"]))
    out: dict = {}
    if isinstance(msg, MapMessage):
        out["kind"], out["map"] = "map", jsonable_map(msg.map)
    elif isinstance(msg, TextMessage):
        out["kind"], out["text"] = "text", msg.text
    else:
        assert isinstance(msg, BytesMessage)
        out["kind"], out["bytes_hex"] = "bytes", msg.data.hex()
    out.update({
        "message_id": msg.message_id,
        "destination": msg.destination.stomp_name if msg.destination else None,
        "persistent": msg.persistent,
        "priority": msg.priority,
        "timestamp": msg.timestamp,
        "expires": msg.expiration,
        "correlation_id": msg.correlation_id,
        "reply_to": msg.reply_to.stomp_name if msg.reply_to else None,
        "type": msg.type,
        "redelivered": msg.redelivered,
        "delivery_count": msg.delivery_count,
        "sequence": msg.sequence,
        "group_id": msg.group_id,
        "properties": {k: typed(v) for k, v in msg.properties.items()},
    })
    return out


def build() -> dict:
    return {"spec": "spec/stomp.md section 7", "description": DESCRIPTION,
            "cases": [dict(c, expect=expected(c)) for c in CASES]}


if __name__ == "__main__":
    with open(OUT, "w", encoding="utf-8") as f:
        json.dump(build(), f, indent=1, ensure_ascii=False)
        f.write("\n")
    print(f"wrote {OUT} ({len(CASES)} cases)")
