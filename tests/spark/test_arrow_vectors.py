"""The vectors of spec/spark.md §5–§8 (spec/vectors/spark_arrow.json): range selection over a log in both
forms, bulk rows completed, wire rows read into Spark's schema."""
from __future__ import annotations

from tests.spark._spark import need_spark

need_spark()

import base64
import json
from pathlib import Path

import pyarrow as pa
import pytest
from pymq_server.broker import bulk_rows, segments
from pymq_server.broker.ranges import Browse
from pymq_server.broker.requests import RangeRequest
from pymq_server.broker.log import RetainedLog
from pymq_server.broker.message import message_from_request
from pymq_server.broker.requests import parse_send

from pymq.errors import MessageFormatError
from pyspark_pymq._arrow import WIRE_FIELDS, wire_to_read

VECTORS = json.loads((Path(__file__).resolve().parents[2] / "spec/vectors/spark_arrow.json").read_text())
TYPES = {"binary": pa.binary(), "string": pa.string(), "int32": pa.int32(), "int64": pa.int64()}


class _Broker:
    @staticmethod
    def release_reference(message, name):
        pass

    @staticmethod
    def message_gone(message):
        pass


def _log(rows) -> RetainedLog:
    log = RetainedLog(_Broker(), "/topic/t")
    i = 0
    while i < len(rows):
        kind, seq, stamp, expires, size = rows[i]
        if kind == "one":
            request = parse_send({"destination": "/topic/t", "timestamp": str(stamp), "expires": str(expires)},
                                 b"x" * size)
            log.append(message_from_request(request, key=seq, message_id=f"ID:n-{seq}", seq=seq,
                                            destination="/topic/t", now=stamp), False)
            i += 1
            continue
        j = i
        while j < len(rows) and rows[j][0] == "bulk" and rows[j][1] == seq + (j - i):
            j += 1
        run = rows[i:j]
        batch = pa.RecordBatch.from_pydict({
            "body": pa.array([b"y" * r[4] for r in run]), "timestamp": pa.array([r[2] for r in run], pa.int64()),
            "expires": pa.array([r[3] for r in run], pa.int64())})
        log.append_segment(bulk_rows.complete_bulk(batch, first_seq=seq, first_key=seq, node_id="n", now=0,
                                                  persistent=True, priority=4, ttl=0), seq)
        i = j
    return log


@pytest.mark.parametrize("case", VECTORS["selection"], ids=lambda c: json.dumps(c["request"]))
def test_selection(case):
    req, want = case["request"], case["answer"]
    log = _log(case["rows"])
    batches, count, last, stopped = log.read_arrow(req["from_seq"], req["to_seq"], req["max_messages"],
                                                   req["max_bytes"], req["from_ts"], req["now"])
    assert [s for b in batches for s in b.column("seq").to_pylist()] == want["seqs"] and count == len(want["seqs"])
    assert (last, stopped) == (want["last"], want["stopped"])
    # the per-message browse (server/broker/ranges.py) selects the same rows by the same rules
    request = RangeRequest("/topic/t", "s", from_seq=req["from_seq"], to_seq=req["to_seq"],
                           max_messages=req["max_messages"], max_bytes=req["max_bytes"], from_timestamp=req["from_ts"])
    browse = Browse(request, log.range(req["from_seq"], req["to_seq"]), None, None, 0, 0, lambda: req["now"])
    sent = list(iter(browse.next, None))
    assert [m.seq for m in sent] == want["seqs"] and browse.stopped == want["stopped"]
    assert browse.next_seq == (None if want["last"] is None else want["last"] + 1)


def _column(spec):
    values = spec["values"]
    if spec["type"] == "binary":
        values = [base64.b64decode(v) for v in values]
    return pa.array(values, TYPES[spec["type"]])


@pytest.mark.parametrize("case", VECTORS["bulk"], ids=lambda c: ",".join(c["columns"]))
def test_bulk(case):
    batch = pa.RecordBatch.from_pydict({name: _column(spec) for name, spec in case["columns"].items()})
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, batch.schema) as w:
        w.write_batch(batch)
    if "error" in case:
        with pytest.raises(MessageFormatError, match=f"column '{case['error']['column']}'") as err:
            bulk_rows.read_bulk(sink.getvalue().to_pybytes())
        if case["error"]["row"] is not None:
            assert f"row {case['error']['row']}," in str(err.value)
        return
    rows = bulk_rows.complete_bulk(bulk_rows.read_bulk(sink.getvalue().to_pybytes()), first_seq=100, first_key=7,
                                  node_id="n1", now=1000, persistent=True, priority=4, ttl=50).to_pylist()
    for got, want in zip(rows, case["rows"], strict=True):
        for name, value in want.items():
            assert (base64.b64encode(got[name]).decode() if name == "body" else got[name]) == value, name


@pytest.mark.parametrize("case", VECTORS["read"], ids=lambda c: str(c["wire"]["seq"]))
def test_read(case):
    wire = dict(case["wire"])
    wire["body"] = base64.b64decode(wire["body"])
    wire["properties"] = [tuple(kv) for kv in wire["properties"]]
    batch = pa.RecordBatch.from_pylist([wire], schema=pa.schema([pa.field(n, t) for n, t in WIRE_FIELDS]))
    row = wire_to_read(batch, "/topic/t", "topic", True).to_pylist()[0]
    want = case["row"]
    for name, value in want.items():
        if name.endswith("_us"):
            column = "timestamp" if name == "timestamp_us" else "expiration"
            got = wire_to_read(batch, "/topic/t", "topic", True).column(column).cast(pa.int64())[0].as_py()
            assert got == value, name
        elif name in ("key", "value"):
            assert row[name] == (None if value is None else base64.b64decode(value)), name
        elif name == "properties":
            assert [list(kv) for kv in row[name]] == value
        else:
            assert row[name] == value, name


@pytest.mark.parametrize("case", VECTORS["columns"], ids=lambda c: repr(c["header"]))
def test_columns(case):
    from pymq.errors import InvalidHeader
    from pymq_server.broker.requests import parse_subscribe
    headers = {"destination": "/topic/t", "id": "r", "browser": "true", "pymq-format": "arrow",
               "pymq-columns": case["header"]}
    if case["columns"] is None:
        with pytest.raises(InvalidHeader):
            parse_subscribe(headers)
    else:
        assert list(parse_subscribe(headers).browse.columns) == case["columns"]
