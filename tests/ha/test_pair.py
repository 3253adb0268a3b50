"""A live/backup group of real ``pymq-server`` processes over one store (spec/ha.md §1–§3), on a shared data
directory and on PostgreSQL: what a backup answers, a killed live replaced at once, a stopped live fenced
when it wakes (it writes nothing and sends nothing), a clean stop handed over at once.  Each test names the
rules it checks; timings are printed, never asserted."""
from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from tests.conftest import RawStomp, wait_for
from tests.ha.members import port_refuses


def produce(port: int, count: int, prefix: str = "m", destination: str = "/queue/orders") -> None:
    client = RawStomp(port)
    assert client.connect().command == "CONNECTED"
    for i in range(count):
        client.send("SEND", {"destination": destination, "persistent": "true", "receipt": f"r{i}"},
                    f"{prefix}{i}".encode())
    for _ in range(count):
        frame = client.read(20)
        assert frame.command == "RECEIPT", frame
    client.close()


def drain(port: int, destination: str = "/queue/orders", quiet: float = 1.5) -> list:
    client = RawStomp(port)
    assert client.connect().command == "CONNECTED"
    client.send("SUBSCRIBE", {"destination": destination, "id": "d", "ack": "client-individual"})
    frames = []
    while True:
        try:
            frame = client.read(quiet if frames else 20)
        except TimeoutError:
            break
        assert frame.command == "MESSAGE", frame
        frames.append(frame)
        client.send("ACK", {"id": frame.headers["ack"]})
    client.send("DISCONNECT", {"receipt": "bye"})
    client.read(10)
    client.close()
    return frames


def test_rule_1_8_and_3_5_a_backup_answers_backup_and_serves_no_stomp_client(file_group):
    live = file_group.start("A")
    port = live.wait_live()
    backup = file_group.start("B")
    backup.wait_backup()
    assert not backup.live and not backup.ports()                   # no STOMP listener at all
    status, ready = backup.http("/readyz", auth=False)
    assert status == 503 and ready["ready"] is False and ready["checks"]["role"] == "backup"
    assert ready["checks"]["epoch"] == 1
    status, ready = live.http("/readyz", auth=False)
    assert status == 200 and ready["checks"]["role"] == "live"
    status, metrics = backup.http("/metrics")
    assert status == 200 and 'pymq_ha_role{role="backup"} 1.0' in metrics and "pymq_ha_epoch 1.0" in metrics
    status, metrics = live.http("/metrics")
    assert 'pymq_ha_role{role="live"} 1.0' in metrics and "pymq_ha_takeovers_total 1.0" in metrics
    assert "pymq_queue_depth" in metrics or "pymq_ready" in metrics           # the broker's own families too
    status, answer = backup.http("/api/status")
    assert status == 200 and answer["result"]["role"] == "backup"
    ha = answer["result"]["ha"]
    assert ha["holder"]["pid"] == live.pid and ha["holder"]["os_locked"] and ha["candidate"]
    status, answer = backup.http("/api/list-queues")
    assert answer["ok"] is False and answer["error"]["code"] == "illegal-state" and "backup" in \
        answer["error"]["message"]
    # the command line and the console's first page say so too
    out = subprocess.run([sys.executable, "-m", "pymq_server.admin.cli", "--url",
                          f"http://127.0.0.1:{backup.admin_port()}", "ha"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and "backup" in out.stdout and str(live.pid) in out.stdout, out
    out = subprocess.run([sys.executable, "-m", "pymq_server.admin.cli", "--url",
                          f"http://127.0.0.1:{backup.admin_port()}", "health"], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 1
    status, overview = backup.http("/api/overview")
    assert overview["result"]["status"]["role"] == "backup"
    produce(port, 3)
    assert backup.log.count("pymq-server listening") == 0


def test_rule_1_5_a_killed_live_is_replaced_at_once_and_3_2_its_messages_come_flagged(group):
    live = group.start("A")
    port = live.wait_live()
    backup = group.start("B", )
    backup.wait_backup()
    produce(port, 20)
    killed = time.monotonic()
    live.kill()
    new_port = backup.wait_live(timeout=60)
    print(f"\n{group.store}: kill -9 -> the backup listening: {time.monotonic() - killed:.3f} s")
    status, answer = backup.http("/api/status")
    assert "OS lock" in answer["result"]["ha"]["take_reason"]       # not the lease: the holder was gone (1.5)
    assert answer["result"]["ha"]["epoch"] == 2
    frames = drain(new_port)
    assert sorted(f.body for f in frames) == sorted(f"m{i}".encode() for i in range(20))
    # 3.2: the store was not closed cleanly: every message may have been delivered, so each comes flagged
    assert all(f.headers.get("redelivered") == "true" for f in frames)
    assert all(int(f.headers["JMSXDeliveryCount"]) >= 2 for f in frames)


def test_rule_1_9_a_clean_stop_hands_over_at_once_and_3_2_nothing_is_flagged(group):
    live = group.start("A")
    port = live.wait_live()
    backup = group.start("B")
    backup.wait_backup()
    produce(port, 10)
    assert live.terminate() == 0
    new_port = backup.wait_live(timeout=60)
    status, answer = backup.http("/api/status")
    assert "OS lock" in answer["result"]["ha"]["take_reason"]
    frames = drain(new_port)
    assert len(frames) == 10
    assert not any(f.headers.get("redelivered") == "true" for f in frames)       # a clean close: exact counts


@pytest.mark.parametrize("after_fenced", ["backup", "exit"])
def test_rule_2_a_stopped_live_wakes_fenced_having_written_and_sent_nothing(group, after_fenced):
    """The correctness core: SIGSTOP the live until the backup has taken over, give the stopped live work in
    its sockets meanwhile (a SEND, ACKs), SIGCONT it: it writes nothing (the store's files or rows are what
    the new live left), sends nothing (no RECEIPT, MESSAGE or ERROR reaches its clients), closes its
    listeners and goes back to being a backup (or exits with status 3)."""
    live = group.start("A", after_fenced=after_fenced)
    port = live.wait_live()
    backup = group.start("B", after_fenced=after_fenced)
    backup.wait_backup()
    produce(port, 30)
    consumer = RawStomp(port)
    assert consumer.connect().command == "CONNECTED"
    consumer.send("SUBSCRIBE", {"destination": "/queue/orders", "id": "c", "ack": "client-individual",
                                "activemq.prefetchSize": "10"})
    held = [consumer.read(10) for _ in range(10)]
    producer = RawStomp(port)
    assert producer.connect().command == "CONNECTED"
    live.stop()
    stopped = time.monotonic()
    new_port = backup.wait_live(timeout=60)
    print(f"\n{group.store}: SIGSTOP -> the backup listening: {time.monotonic() - stopped:.3f} s")
    # work waits in the stopped live's sockets: a SEND that would be stored, ACKs that would remove
    producer.send("SEND", {"destination": "/queue/orders", "persistent": "true", "receipt": "late"}, b"late")
    for frame in held:
        consumer.send("ACK", {"id": frame.headers["ack"], "receipt": "ack-" + frame.headers["ack"]})
    produce(new_port, 5, prefix="b")                       # the new live writes the store
    before = group.state()
    live.cont()
    if after_fenced == "exit":
        assert live.proc.wait(60) == 3
    else:
        live.wait_fenced()
        live.wait_backup(times=2)
    assert port_refuses(port)
    # nothing left the former live after it woke: its clients see their connections end, no frame
    assert consumer.read_until_closed(10) == [] and producer.read_until_closed(10) == []
    # a window for anything late to land (a negative: there is nothing to wait for); then the store must be
    # exactly as the new live left it
    time.sleep(0.5)
    assert group.state() == before
    assert "fenced" in live.log
    frames = drain(new_port)
    bodies = sorted(f.body for f in frames)
    # every message is there once: the 30 (the 10 the stopped live held come flagged), the new live's 5; the
    # late SEND never reached the store (its producer had no receipt and would send it again)
    assert bodies == sorted([f"m{i}".encode() for i in range(30)] + [f"b{i}".encode() for i in range(5)])
    held_bodies = {f.body for f in held}
    assert all(f.headers.get("redelivered") == "true" for f in frames if f.body in held_bodies)


def test_a_group_of_three_takes_over_twice(file_group):
    """1.6: one candidate at a time; the next backup watches the new live."""
    a = file_group.start("A")
    port = a.wait_live()
    b, c = file_group.start("B"), file_group.start("C")
    b.wait_backup()
    c.wait_backup()
    assert wait_for(lambda: sum(m.http("/api/status")[1]["result"]["ha"]["candidate"] for m in (b, c)) == 1, 20)
    produce(port, 5)
    first = next(m for m in (b, c) if m.http("/api/status")[1]["result"]["ha"]["candidate"])
    second = c if first is b else b
    a.kill()
    port = first.wait_live(timeout=60)
    produce(port, 5, prefix="x")
    assert wait_for(lambda: second.http("/api/status")[1]["result"]["ha"]["candidate"], 20)
    first.kill()
    port = second.wait_live(timeout=60)
    _, answer = second.http("/api/status")
    assert answer["result"]["ha"]["epoch"] == 3
    assert len(drain(port)) == 10


@pytest.mark.parametrize("doc, problem", [
    ({"workers": 2}, "workers > 1"),
    ({"storage": {"devices": {"memory": {}, "db": {"kind": "sql"}}, "persistent_device": "db"}}, "SQLite"),
    ({"storage": {"devices": {"memory": {}, "g": {"kind": "grid"}, "file": {}}, "persistent_device": "file"}},
     "grid"),
    ({"storage": {"devices": {"file": {}, "db": {"kind": "sql", "url": "postgresql+psycopg://u@h/d"}},
                  "persistent_device": "file"}}, "one kind"),
])
def test_rule_2_5_what_the_lease_cannot_fence_is_refused(tmp_path, doc, problem):
    import yaml
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump({"ha": {}, **doc}))
    out = subprocess.run([sys.executable, "-m", "pymq_server.cli", "--config", str(path), "--check-config"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and problem in out.stderr, out.stderr


def test_the_status_operation_says_the_role_over_stomp_too(file_group):
    live = file_group.start("A")
    port = live.wait_live()
    client = RawStomp(port)
    assert client.connect().command == "CONNECTED"
    client.send("SUBSCRIBE", {"destination": "/temp-queue/r", "id": "r"})
    client.send("SEND", {"destination": "/pymq/admin", "pymq-admin-op": "status", "reply-to": "/temp-queue/r",
                         "correlation-id": "s"}, b"{}")
    frame = client.read(10)
    assert frame.command == "MESSAGE", frame
    answer = json.loads(frame.body)
    assert answer["result"]["role"] == "live" and answer["result"]["ha"]["role"] == "live"


def test_rule_1_6_a_backup_whose_database_session_drops_keeps_watching(postgres_url, tmp_path):
    """The candidate's lock session is ended under it (a database restart, a network cut, an administrator's
    pg_terminate_backend): it must start afresh and still take over when the live dies, not stop watching
    with its lock gone (found by the failover harness: a backup that never took over)."""
    import sqlalchemy as sa

    from tests.ha.conftest import Group
    group = Group(tmp_path, "postgresql", postgres_url)
    try:
        live = group.start("A")
        live.wait_live()
        backup = group.start("B")
        backup.wait_backup()
        assert wait_for(lambda: backup.http("/api/status")[1]["result"]["ha"]["candidate"], 20)
        engine = sa.create_engine(postgres_url)
        try:
            with engine.begin() as conn:
                ended = conn.execute(sa.text(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = :name"),
                    {"name": f"pymq-ha-lease:{backup.pid}"}).all()
        finally:
            engine.dispose()
        assert ended, "the backup's lock session was not found"
        produce(live.wait_live(), 3)
        live.kill()
        port = backup.wait_live(timeout=30)
        assert len(drain(port)) == 3
        assert "could not be watched" in backup.log
    finally:
        group.close()
