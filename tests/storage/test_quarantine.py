"""Recovery sets aside what it cannot decode and starts (issue 24; spec/storage.md §12).

A real ``pymq-server`` keeps good messages (one by one and a bulk block) in a file store or in SQLite;
while it is stopped, records it would not write are planted in the same store through the device itself:
issue 24's bulk record (offsets ``[0, 2**31 - 256, 8, 12]``: SIGSEGV at every start of the landed main), a
message record that is not a frame, and a catalog record that is not JSON.  The broker starts, the good
messages come back, the three are listed (admin operation, HTTP, metric) with their reasons and stay stored;
one dropped by an administrator is gone after the next restart, the others are listed again.
"""
from __future__ import annotations

import base64
import json
import urllib.request

import pytest

pytest.importorskip("pyarrow")

import pymq
from pymq_server.app import build_devices
from pymq_server.broker import bulk_rows
from pymq_server.broker.message import BrokerMessage
from pymq_server.broker.stored_form import encode_stored
from pymq_server.config import BrokerConfig
from pymq_server.storage.device import StoredMessage
from pymq_server.storage.store import HoldingStore
from tests.admin.conftest import run_cli
from tests.arrow_rows import rows
from tests.hostile.bulk_bodies import segfault_body

BULK_KEY, GARBAGE_KEY = 10**9, 10**9 + 1


def _config(tmp_path, store: str) -> str | None:
    if store == "file":
        return None
    path = tmp_path / "broker.yaml"
    path.write_text(json.dumps({"storage": {"devices": {"db": {"kind": "sql", "url": f"sqlite:///{tmp_path}/db.sqlite3"}},
                                            "persistent_device": "db"}}))
    return str(path)


def _plant(data_dir, config: str | None) -> None:
    """Write records this broker never writes, through the store's own device (the broker is stopped)."""
    cfg = BrokerConfig.load(config, data_dir=str(data_dir))
    devices, persistent = build_devices(cfg)
    store = HoldingStore(devices, persistent_device=persistent)
    store.open()
    device = store.persistent_device
    headers = {bulk_rows.SEGMENT_HEADER: "arrow", bulk_rows.FIRST_KEY_HEADER: str(BULK_KEY),
               "pymq-arrival": "1", "pymq-node": "n", "pymq-defaults": "1,4,0", "pymq-dropped": "",
               "content-type": "application/vnd.apache.arrow.stream"}
    holder = BrokerMessage(BULK_KEY, f"ID:n-{BULK_KEY}", "/queue/poison", 7000, headers, segfault_body(), True, 4,
                           1, 0)
    device.write(StoredMessage(BULK_KEY, "/queue/poison", 7000, True, encode_stored(holder)), ["/queue/poison"])
    device.write(StoredMessage(GARBAGE_KEY, "/queue/poison", 7003, True, b"\x00not a STOMP frame\xff"),
                 ["/queue/poison"])
    store.put_meta("queue:broken", b"{this is not json")
    for d in store.devices.values():
        d.flush()
        d.sync()
    store.close()


def _admin(port: int, path: str) -> tuple[int, bytes]:
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", headers={
        "Authorization": "Basic " + base64.b64encode(b"guest:guest").decode()})
    with urllib.request.urlopen(request, timeout=20) as answer:
        return answer.status, answer.read()


def _drain(url: str, queue: str, n: int) -> list[str]:
    with pymq.connect(url, timeout=20) as conn:
        consumer = conn.create_session().create_consumer(pymq.Queue(queue))
        got = [consumer.receive(timeout=20) for _ in range(n)]
    assert all(m is not None for m in got), got
    return [m.text for m in got]


@pytest.mark.parametrize("store", ["file", "sqlite"])
def test_undecodable_records_are_quarantined_and_the_broker_starts(broker_processes, tmp_path, store):
    data = tmp_path / "data"
    config = _config(tmp_path, store)
    first = broker_processes(data, config=config)
    with pymq.connect(first.url, timeout=20) as conn:
        s = conn.create_session()
        producer = s.create_producer(pymq.Queue("good"))
        for text in ("a", "b", "c"):
            producer.send(text)
        s.send_arrow("/queue/good-bulk", rows(2), timeout=20)
    assert first.terminate() == 0
    _plant(data, config)

    again = broker_processes(data, "--admin-port", "0", config=config)
    admin_port = int(again.wait_log(r"admin listening on http://127\.0\.0\.1:(\d+)").group(1))
    assert _drain(again.url, "good", 3) == ["a", "b", "c"]
    assert _drain(again.url, "good-bulk", 2) == ["r0", "r1"]
    with pymq.connect(again.url, timeout=20) as conn:
        listed = conn.queue_manager().call("list-quarantine")
        s = conn.create_session()
        # the quarantined records' sequence numbers are not handed out again
        assert int(s.send_arrow("/queue/poison", rows(1), timeout=20)["pymq-first-seq"]) > 7003
    by_key = {r["key"]: r for r in listed}
    assert set(by_key) == {str(BULK_KEY), str(GARBAGE_KEY), "queue:broken"}, listed
    assert by_key[str(BULK_KEY)]["kind"] == "bulk" and "offset" in by_key[str(BULK_KEY)]["reason"]
    assert by_key[str(BULK_KEY)]["references"] == ["/queue/poison"] and by_key[str(BULK_KEY)]["seq"] == 7000
    assert by_key[str(GARBAGE_KEY)]["kind"] == "message"
    assert by_key["queue:broken"]["kind"] == "catalog"
    assert "quarantined bulk record" in again.log
    status, body = _admin(admin_port, "/api/list-quarantine")
    assert status == 200 and {r["key"] for r in json.loads(body)["result"]} == set(by_key)
    status, body = _admin(admin_port, "/metrics")
    assert b"pymq_quarantined_records 3.0" in body

    # pymq-admin: the listing, a drop, and a drop of what is not there (exit 6)
    url = f"http://127.0.0.1:{admin_port}"
    cli = run_cli(None, "--json", "storage", "quarantine", url=url, user="guest", password="guest")
    assert cli.returncode == 0 and {r["key"] for r in json.loads(cli.stdout)} == set(by_key), cli.stderr
    cli = run_cli(None, "--json", "storage", "quarantine-drop", str(GARBAGE_KEY), url=url, user="guest",
                  password="guest")
    assert cli.returncode == 0, cli.stderr
    assert [r["key"] for r in json.loads(cli.stdout)["dropped"]] == [str(GARBAGE_KEY)]
    cli = run_cli(None, "storage", "quarantine-drop", "424242", url=url, user="guest", password="guest")
    assert cli.returncode == 6 and "no quarantined record" in cli.stderr
    again.kill()                                          # kill -9: the drop was made durable at once
    third = broker_processes(data, config=config)
    with pymq.connect(third.url, timeout=20) as conn:
        keys = {r["key"] for r in conn.queue_manager().call("list-quarantine")}
    assert keys == {str(BULK_KEY), "queue:broken"}        # still kept, listed again; the dropped one is gone
    with pymq.connect(third.url, timeout=20) as conn:
        # an Arrow range read of the queue hands out the rows that decode, never the quarantined buffers
        answer = conn.create_session().read_range(pymq.Queue("poison"), arrow=True)
        import pyarrow as pa
        table = pa.ipc.open_stream(answer.arrow).read_all()
        table.validate(full=True)
        assert table.column("body").to_pylist() == [b"r0"]
    assert _drain(third.url, "poison", 1) == ["r0"]       # the bulk SEND receipted above survived kill -9
    assert third.proc.poll() is None
