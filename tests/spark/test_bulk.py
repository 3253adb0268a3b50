"""The sink's Arrow path (spec/spark.md §7): Spark rows become bulk batches with the same meaning, and the
same errors, as the per-message path's messages."""
from __future__ import annotations

from tests.spark._spark import need_spark

need_spark()

import datetime
import json

import pyarrow as pa
import pytest

import pymq
from pymq.errors import MessageFormatError
from pyspark_pymq._arrow import batch_to_messages
from pyspark_pymq._bulk import rows_to_bulk
from tests.spark.test_arrow import DEFAULTS

NOW = 1_700_000_000_000


def both(batch, destination=None, dedup=None, first_row=0):
    bulk = rows_to_bulk(batch, destination, DEFAULTS, first_row, dedup, NOW)
    per_message = list(batch_to_messages(batch, destination, DEFAULTS, first_row))
    return bulk, per_message


def test_rows_mean_the_same_in_both_paths():
    later = datetime.datetime.fromtimestamp((NOW + 3_600_000) / 1000, datetime.timezone.utc)
    batch = pa.RecordBatch.from_pylist([
        {"value": "t", "key": b"g1", "priority": 9, "timeToLive": 5, "deliveryMode": "non_persistent",
         "correlationId": "c", "properties": [("n", 1), ("m", 2)], "destination": "/topic/x", "dedupId": "d",
         "type": "k", "replyTo": "/queue/r", "expiration": None, "bodyType": None},
        {"value": None, "key": None, "priority": None, "timeToLive": None, "deliveryMode": None,
         "correlationId": None, "properties": None, "destination": "/queue/y", "dedupId": None, "type": None,
         "replyTo": None, "expiration": later, "bodyType": None},
        {"value": "{\"a\": 1}", "key": "g2", "priority": 0, "timeToLive": 0, "deliveryMode": "2",
         "correlationId": None, "properties": [], "destination": "/topic/x", "dedupId": None, "type": None,
         "replyTo": None, "expiration": None, "bodyType": "map"},
        {"value": "no expiry at all", "key": None, "priority": None, "timeToLive": None, "deliveryMode": None,
         "correlationId": None, "properties": None, "destination": "/topic/x", "dedupId": None, "type": None,
         "replyTo": None, "expiration": None, "bodyType": None},
    ], schema=pa.schema([("value", pa.string()), ("key", pa.binary()), ("priority", pa.int32()),
                         ("timeToLive", pa.int64()), ("deliveryMode", pa.string()), ("correlationId", pa.string()),
                         ("properties", pa.map_(pa.string(), pa.int64())), ("destination", pa.string()),
                         ("dedupId", pa.string()), ("type", pa.string()), ("replyTo", pa.string()),
                         ("expiration", pa.timestamp("us", tz="UTC")), ("bodyType", pa.string())]))
    bulk, per_message = both(batch, dedup="q:7:1", first_row=40)
    assert [d for d, _ in bulk] == ["/topic/x", "/queue/y"]
    rows = {d: b.to_pylist() for d, b in bulk}
    flat = [rows["/topic/x"][0], rows["/queue/y"][0], rows["/topic/x"][1], rows["/topic/x"][2]]
    assert flat[3]["expires"] == 0                 # neither timeToLive nor expiration: never expires
    for r, (row, dest, message, args) in zip(flat, per_message):
        if r["body_type"] == "map":         # the JSON form as given: the same map, spacing aside
            assert json.loads(r["body"]) == json.loads(message._body_bytes())
        else:
            assert r["body"] == message._body_bytes()
        assert r["body_type"] == {pymq.TextMessage: "text", pymq.BytesMessage: "bytes",
                                  pymq.MapMessage: "map"}[type(message)]
        assert r.get("group") == message.group_id
        props = {k: v for k, v in message.properties.items() if k != "JMSXGroupID"}
        assert dict(r.get("properties") or []) == {k: str(v) for k, v in props.items()}
        assert (r.get("correlation_id"), r.get("type"), r.get("reply_to")) == \
            (message.correlation_id, message.type, message.reply_to.stomp_name if message.reply_to else None)
        assert r["dedup_id"] == (message.dedup_id or f"q:7:1:{row}")
        assert (r["priority"], r["delivery_mode"]) == (args["priority"], args["delivery_mode"])
        ttl = args["time_to_live"]
        assert r["expires"] == (NOW + ttl if ttl else 0) or abs(r["expires"] - (NOW + 3_600_000)) < 60_000
    assert flat[0]["property_types"] == "n=i,m=i"


@pytest.mark.parametrize("row, column", [
    ({"value": "x", "destination": None}, "destination"),
    ({"value": "x", "destination": "orders"}, "destination"),
    ({"value": "x", "destination": "/queue/a", "priority": 12}, "priority"),
    ({"value": "x", "destination": "/queue/a", "deliveryMode": "sometimes"}, "deliveryMode"),
    ({"value": b"\xff", "destination": "/queue/a", "bodyType": "text"}, "value"),
    ({"value": "[1]", "destination": "/queue/a", "bodyType": "map"}, "value"),
    ({"value": "x", "destination": "/queue/a", "properties": [("bad,name", "v")]}, "properties"),
    ({"value": "x", "destination": "/queue/a", "properties": [("priority", "v")]}, "properties"),
    ({"value": "x", "destination": "/queue/a", "timeToLive": -5}, "timeToLive"),
    ({"value": "x", "destination": "/queue/a", "replyTo": "nowhere"}, "replyTo"),
])
def test_a_bad_row_gives_the_same_error_as_the_per_message_path(row, column):
    good = {**{k: None for k in row}, "value": row["value"], "destination": "/queue/a"}
    types = {"value": pa.binary() if isinstance(row["value"], bytes) else pa.string(), "destination": pa.string(),
             "priority": pa.int32(), "deliveryMode": pa.string(), "bodyType": pa.string(),
             "properties": pa.map_(pa.string(), pa.string()), "timeToLive": pa.int64(), "replyTo": pa.string()}
    batch = pa.RecordBatch.from_pylist([good, row, good], schema=pa.schema([(k, types[k]) for k in row]))
    with pytest.raises(MessageFormatError) as per_message:
        list(batch_to_messages(batch, None, DEFAULTS, 40))
    with pytest.raises(MessageFormatError) as bulk:
        rows_to_bulk(batch, None, DEFAULTS, 40, None, NOW)
    assert (bulk.value.row, bulk.value.column) == (per_message.value.row, per_message.value.column) == (41, column)
    assert f"row 41 of this partition, column '{column}'" in str(bulk.value)


def test_topic_column_option_and_empty():
    batch = pa.RecordBatch.from_pylist([{"value": "a", "topic": "orders"}, {"value": "b", "topic": "/queue/q"}])
    assert [(d, b.num_rows) for d, b in rows_to_bulk(batch, None, DEFAULTS, 0, None, NOW)] == \
        [("/topic/orders", 1), ("/queue/q", 1)]
    assert [d for d, _ in rows_to_bulk(batch, "/queue/opt", DEFAULTS, 0, None, NOW)] == ["/queue/opt"]
    empty = pa.RecordBatch.from_pylist([], schema=pa.schema([("value", pa.string())]))
    assert rows_to_bulk(empty, "/queue/x", DEFAULTS, 0, None, NOW) == []
