"""Hostile bulk SEND bodies against a real ``pymq-server`` (issue 24): a body whose buffers lie is refused
with a precise ``message-format`` ERROR before the RECEIPT, nothing of it is stored or counted, the broker
(one process or ``--workers 2``) keeps serving, and a valid bulk SEND after it is kept through kill -9.

On the landed main the first of these was receipted, then the broker died of SIGSEGV at the first delivery
and at every later start (with two workers the owning worker died four times and the supervisor stopped).
"""
from __future__ import annotations

import pytest

pa = pytest.importorskip("pyarrow")

import pymq
from tests.arrow_rows import rows
from tests.conftest import RawStomp
from tests.hostile.bulk_bodies import bulk_send_headers, segfault_body

WORKERS = pytest.mark.parametrize("workers", [(), ("--workers", "2")], ids=["one", "workers2"])


def _refused(port: int, destination: str, body: bytes) -> dict:
    """The ERROR a bulk SEND of ``body`` gets (asserted: the connection then closes)."""
    raw = RawStomp(port)
    try:
        assert raw.connect().command == "CONNECTED"
        raw.send("SEND", bulk_send_headers(destination, receipt="bad"), body)
        frame = raw.read(timeout=20)
        assert frame.command == "ERROR", f"{frame.command} {frame.headers}"
        assert raw.is_closed(10)
        return frame.headers
    finally:
        raw.close()


def _drain(url: str, queue: str, expect: int) -> list[str]:
    """The texts of the ``expect`` messages waiting in ``queue``, each acknowledged."""
    got = []
    with pymq.connect(url, timeout=20) as conn:
        consumer = conn.create_session().create_consumer(pymq.Queue(queue))
        for _ in range(expect):
            message = consumer.receive(timeout=20)
            assert message is not None, f"only {got} arrived"
            got.append(message.text)
    return got


def _depth(url: str, queue: str) -> int:
    with pymq.connect(url, timeout=20) as conn:
        return int(conn.queue_manager().metrics(queue)["depth"])


@WORKERS
def test_offsets_past_the_data_are_refused_before_the_receipt(broker_processes, tmp_path, workers):
    data = tmp_path / "data"
    bp = broker_processes(data, *workers)
    headers = _refused(bp.port, "/queue/bulk", segfault_body())
    assert headers["pymq-code"] == "message-format", headers
    assert headers["receipt-id"] == "bad"
    assert headers.get("pymq-field-column") == "body" and "offset" in headers["message"], headers
    # nothing was stored or counted, and the broker serves the next (valid) bulk SEND to the same queue
    with pymq.connect(bp.url, timeout=20) as conn:
        receipt = conn.create_session().send_arrow("/queue/bulk", rows(3), timeout=20)
        assert receipt["pymq-count"] == "3"
    assert _depth(bp.url, "bulk") == 3
    bp.kill()                                    # kill -9: the receipted rows must come back, only them
    again = broker_processes(data, *workers)
    assert _drain(again.url, "bulk", 3) == ["r0", "r1", "r2"]
    assert _depth(again.url, "bulk") == 0
    assert again.proc.poll() is None, again.log


def _bodies() -> dict[str, bytes]:
    from tests.hostile.bulk_bodies import body_column, stream, variable
    return {
        "offsets-backwards": body_column([0, 8, 4, 12]),
        "middle-offset-past-the-data": body_column([0, 40, 8, 12]),
        "invalid-utf8-body": body_column([0, 2, 4], b"\xff\xfeok", pa.string()),
        # valid UTF-8, but a NUL cannot travel in a STOMP header: every consumer of the row was closed
        "nul-in-group": stream(pa.RecordBatch.from_pydict({"body": pa.array([b"a"]), "group": pa.array(["g\0"])})),
        "invalid-utf8-group": stream(pa.RecordBatch.from_arrays(
            [pa.array([b"a", b"b"]), variable([0, 1, 3], b"g\xc3\x28", pa.string())], names=["body", "group"])),
    }


@pytest.mark.parametrize("case", list(_bodies()))
def test_bodies_whose_buffers_lie_are_refused_and_nothing_is_kept(broker_processes, tmp_path, case):
    bp = broker_processes(tmp_path / "data")
    headers = _refused(bp.port, "/queue/lies", _bodies()[case])
    assert headers["pymq-code"] == "message-format", headers
    assert headers["receipt-id"] == "bad"
    assert headers.get("pymq-field-column") in ("body", "group"), headers
    with pymq.connect(bp.url, timeout=20) as conn:
        conn.create_session().send_arrow("/queue/lies", rows(2), timeout=20)
    assert _drain(bp.url, "lies", 2) == ["r0", "r1"]          # the refused rows are nowhere
    assert _depth(bp.url, "lies") == 0


def _peak_rss(pid: int) -> int:
    """The process's peak resident set (VmHWM), bytes."""
    with open(f"/proc/{pid}/status") as fh:
        for line in fh:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM")


def test_a_decompression_bomb_is_refused_before_it_is_inflated(broker_processes, tmp_path):
    """Issue 24: an 8.5 KB bulk SEND (ZSTD) inflated to a 256 MiB row; four added 1 GiB of RSS and a
    consumer received a 268 MB MESSAGE, four times max_frame_size."""
    from tests.hostile.bulk_bodies import bomb
    bp = broker_processes(tmp_path / "data")
    body = bomb()
    assert len(body) < 16 * 1024
    before = _peak_rss(bp.proc.pid)
    for _ in range(4):
        headers = _refused(bp.port, "/queue/bomb", body)
        assert headers["pymq-code"] == "message-format" and "max_frame_size" in headers["message"], headers
    assert _peak_rss(bp.proc.pid) - before < 64 * 1024 * 1024
    with pymq.connect(bp.url, timeout=20) as conn:
        conn.create_session().send_arrow("/queue/bomb", rows(1), timeout=20)
    assert _drain(bp.url, "bomb", 1) == ["r0"]


def _metadata_lies() -> dict[str, bytes]:
    from tests.hostile import bulk_bodies as bb
    plain = bb.body_column([0, 1, 2, 3])
    mapped = bb.stream(pa.RecordBatch.from_pydict({
        "body": pa.array([b"ab", b"c"]), "properties": pa.array([[("k", "v")], []], pa.map_(pa.string(), pa.string()))}))
    return {
        "raised-row-count": bb.with_rows(plain, 1000),
        "row-count-2**62": bb.with_rows(plain, 2**62),
        "map-keys-null": bb.with_node(mapped, 3, null_count=1),
        "buffer-past-the-body": bb.with_buffer(plain, 2, length=4096),
        "non-utf8-column-name": plain.replace(b"body", b"b\xffdy", 1),
    }


@pytest.mark.parametrize("case", list(_metadata_lies()))
def test_metadata_that_lies_is_a_precise_error(broker_processes, tmp_path, case):
    bp = broker_processes(tmp_path / "data")
    headers = _refused(bp.port, "/queue/meta", _metadata_lies()[case])
    assert headers["pymq-code"] == "message-format", headers
    assert bp.proc.poll() is None, bp.log
    assert "Traceback" not in bp.log, bp.log
