"""A broker that answers a Spark read with malformed Arrow: the read fails with an error that says so, the
executors go on, and the next read of a real broker works.  A fake broker (it speaks just enough STOMP)
answers every range read with a valid message batch made invalid: cut short, a huge length, garbage where
the values' offsets are.  Each
implementation must refuse it as a task error, never crash the executor or hang; the JVM source's own
fuzz target (io.pymq.spark.Fuzz, run by its unit tests and by ``python -m bench.fuzz --only jvm``) covers
many more mutations without Spark."""
from __future__ import annotations

from tests.spark._spark import need_spark

need_spark()

import socket
import threading

import pyarrow as pa
import pytest

import pymq
from tests.spark.test_batch import send

pytestmark = pytest.mark.spark


def good_answer(n: int = 5) -> bytes:
    from pyspark_pymq._arrow import WIRE_FIELDS
    columns = {
        "seq": pa.array(range(1, n + 1), pa.int64()), "message_id": pa.array([f"ID:x-{i}" for i in range(n)]),
        "timestamp": pa.array([1_700_000_000_000] * n, pa.int64()), "expires": pa.array([0] * n, pa.int64()),
        "priority": pa.array([4] * n, pa.int32()), "delivery_mode": pa.array([2] * n, pa.int32()),
        "body_type": pa.array(["text"] * n), "content_type": pa.array(["text/plain"] * n),
        "body": pa.array([f"m{i}".encode() for i in range(n)], pa.binary()), "group": pa.nulls(n, pa.string()),
        "correlation_id": pa.nulls(n, pa.string()), "type": pa.nulls(n, pa.string()),
        "reply_to": pa.nulls(n, pa.string()), "properties": pa.array([[]] * n, pa.map_(pa.string(), pa.string())),
        "property_types": pa.nulls(n, pa.string()), "dedup_id": pa.nulls(n, pa.string())}
    batch = pa.RecordBatch.from_arrays([columns[name] for name, _ in WIRE_FIELDS], schema=pa.schema(
        [pa.field(name, typ) for name, typ in WIRE_FIELDS]))
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, batch.schema) as writer:
        writer.write_batch(batch)
    return sink.getvalue().to_pybytes()


def mutated(data: bytes, how: str) -> bytes:
    """The answer made structurally invalid in one way (each one a stream no reader may take as it is)."""
    body = bytearray(data)
    # the IPC stream: 0xFFFFFFFF, the schema's metadata length and metadata, then the record batch's
    # continuation, metadata length, metadata and body (spec/spark.md §6 answers are such streams)
    schema_len = int.from_bytes(body[4:8], "little")
    batch_at = 8 + schema_len
    if how == "truncated":
        return bytes(body[: batch_at + 8 + (len(body) - batch_at) // 2])
    if how == "huge metadata length":
        body[batch_at + 4:batch_at + 8] = (0x7FFFFFF0).to_bytes(4, "little")
        return bytes(body)
    # "garbage body": every byte after the record batch's metadata set to 0xFF (offsets of -1, ...)
    meta_len = int.from_bytes(body[batch_at + 4:batch_at + 8], "little")
    start = batch_at + 8 + meta_len
    end = len(body) - 8                      # the end-of-stream marker stays
    body[start:end] = b"\xff" * (end - start)
    return bytes(body)


class HostileBroker:
    """Answers CONNECT, bounds reads (``pymq-max-messages: 0``: a log of sequence numbers 1..5) and range
    reads (the mutated batch, whatever was asked)."""

    def __init__(self, body: bytes) -> None:
        self.body = body
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port = self.server.getsockname()[1]
        self.url = f"stomp://127.0.0.1:{self.port}"
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.server.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        buf = b""
        try:
            while True:
                data = conn.recv(65536)
                if not data:
                    return
                buf += data
                while b"\x00" in buf:
                    raw, buf = buf.split(b"\x00", 1)
                    raw = raw.lstrip(b"\r\n")
                    if raw:
                        self._frame(conn, raw)
        except OSError:
            return
        finally:
            conn.close()

    def _frame(self, conn: socket.socket, raw: bytes) -> None:
        head = raw.split(b"\n\n", 1)[0].decode()
        command, *lines = head.split("\n")
        headers = dict(line.split(":", 1) for line in lines if ":" in line)
        out = []
        if command in ("CONNECT", "STOMP"):
            out.append(frame("CONNECTED", {"version": "1.2", "heart-beat": "0,0"}))
        elif command == "SUBSCRIBE":
            if "receipt" in headers:
                out.append(frame("RECEIPT", {"receipt-id": headers["receipt"]}))
            end = {"subscription": headers["id"], "destination": headers["destination"], "message-id": "browser-end",
                   "browser": "end", "pymq-earliest-seq": "1", "pymq-latest-seq": "5", "pymq-source": "log"}
            if headers.get("pymq-max-messages") == "0" or headers.get("pymq-format") != "arrow":
                out.append(frame("MESSAGE", {**end, "pymq-next-seq": "1", "pymq-count": "0"}))
            else:
                out.append(frame("MESSAGE", {**end, "pymq-next-seq": "6", "pymq-count": "5",
                                             "content-type": "application/vnd.apache.arrow.stream"}, self.body))
        elif "receipt" in headers:
            out.append(frame("RECEIPT", {"receipt-id": headers["receipt"]}))
        for f in out:
            conn.sendall(f)

    def close(self) -> None:
        self.server.close()


def frame(command: str, headers: dict, body: bytes = b"") -> bytes:
    lines = [command, *(f"{k}:{v}" for k, v in headers.items())]
    if body:
        lines.append(f"content-length:{len(body)}")
    return ("\n".join(lines) + "\n\n").encode() + body + b"\x00"


@pytest.mark.parametrize("how", ["truncated", "huge metadata length", "garbage body"])
def test_malformed_arrow_from_the_broker_fails_the_read_and_nothing_else(spark, impl, spark_broker, name, how):
    hostile = HostileBroker(mutated(good_answer(), how))
    try:
        df = (spark.read.format(impl.fmt).option("url", hostile.url).option("topic", "t")
              .option("fetchRetries", "0").option("minPartitions", "1").load())
        with pytest.raises(Exception) as info:
            df.selectExpr("cast(value as string) v").collect()
        text = str(info.value)
        assert "Arrow" in text or "arrow" in text, text[-2000:]
        if impl.name == "jvm":
            assert "is not a valid Arrow IPC stream" in text or "not a pymq message batch" in text, text[-2000:]
    finally:
        hostile.close()
    # the executors are still there: the next read of a real broker works
    send(spark_broker.url, pymq.Topic(name), ["after"])
    after = spark.read.format(impl.fmt).option("url", spark_broker.url).option("topic", name).load()
    assert [r.v for r in after.selectExpr("cast(value as string) v").collect()] == ["after"]


def test_the_hostile_broker_serves_a_good_answer_as_it_is(spark, impl):
    """The harness itself: unmutated, the fake broker's answer is read as five rows."""
    hostile = HostileBroker(good_answer())
    try:
        # one partition: the fake broker answers every range read with the same five rows
        df = spark.read.format(impl.fmt).option("url", hostile.url).option("topic", "t").option("minPartitions", "1") \
            .load()
        assert sorted(r.v for r in df.selectExpr("cast(value as string) v").collect()) == [f"m{i}" for i in range(5)]
    finally:
        hostile.close()
