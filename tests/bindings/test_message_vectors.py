"""spec/vectors/messages.json still describes what the Python SDK decodes (spec/stomp.md section 7).

The bindings run the same file; this test keeps the file honest against ``pymq.message.from_frame``.
"""
from __future__ import annotations

import base64
import json
import pathlib

import pytest

from pymq.message import BytesMessage, MapMessage, TextMessage, from_frame

CASES = json.loads((pathlib.Path(__file__).parents[2] / "spec/vectors/messages.json").read_text())["cases"]


def _typed(value) -> dict:
    kind = {bool: "bool", int: "int", float: "float", str: "string"}[type(value)]
    return {"type": kind, "value": value}


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_message_vector(case):
    headers: dict = {}
    for name, value in case["headers"]:
        headers.setdefault(name, value)
    msg = from_frame(headers, bytes.fromhex(case["body_hex"]))
    want = case["expect"]
    if want["kind"] == "map":
        assert isinstance(msg, MapMessage)
        assert {k: ({"$bytes": base64.b64encode(v).decode()} if isinstance(v, bytes) else v)
                for k, v in msg.map.items()} == want["map"]
    elif want["kind"] == "text":
        assert isinstance(msg, TextMessage) and msg.text == want["text"]
    else:
        assert isinstance(msg, BytesMessage) and msg.data.hex() == want["bytes_hex"]
    got = {
        "message_id": msg.message_id,
        "destination": msg.destination.stomp_name if msg.destination else None,
        "persistent": msg.persistent, "priority": msg.priority, "timestamp": msg.timestamp,
        "expires": msg.expiration, "correlation_id": msg.correlation_id,
        "reply_to": msg.reply_to.stomp_name if msg.reply_to else None, "type": msg.type,
        "redelivered": msg.redelivered, "delivery_count": msg.delivery_count, "sequence": msg.sequence,
        "group_id": msg.group_id, "properties": {k: _typed(v) for k, v in msg.properties.items()},
    }
    assert got == {k: v for k, v in want.items() if k not in ("kind", "text", "bytes_hex", "map")}


def test_vectors_cover_every_kind_and_type():
    kinds = {c["expect"]["kind"] for c in CASES}
    types = {p["type"] for c in CASES for p in c["expect"]["properties"].values()}
    assert kinds == {"text", "bytes", "map"} and types == {"string", "int", "float", "bool"}
