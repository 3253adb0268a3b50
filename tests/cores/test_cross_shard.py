"""What crosses workers: transactions, permissions, durability across a kill -9 of every worker, the
supervisor when a worker dies, and an independent client (stomp.py) (spec/cores.md §3)."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from tests.cores.conftest import owned_by, start_broker, stop_broker
from tests.cores.test_forwarding import _drain_messages, _receipt


def _empty(c, dest, sub="chk"):
    c.send("SUBSCRIBE", {"destination": dest, "id": sub})
    with pytest.raises(TimeoutError):
        c.read(0.7)


@pytest.mark.parametrize("owner", [0, 1])
def test_a_transaction_on_one_owner_commits_atomically(broker, owner):
    a, b = owned_by(owner, count=2)
    p = broker.connect(0)
    p.send("BEGIN", {"transaction": "t"})
    for i in range(5):
        p.send("SEND", {"destination": a if i % 2 else b, "transaction": "t", "seq": str(i)}, b"x")
    c = broker.connect(1)
    c.send("SUBSCRIBE", {"destination": a, "id": "a"})
    c.send("SUBSCRIBE", {"destination": b, "id": "b", "receipt": "subs"})
    _receipt(c, "subs")
    with pytest.raises(TimeoutError):
        c.read(0.5)                        # nothing visible before COMMIT
    p.send("COMMIT", {"transaction": "t", "receipt": "done"})
    _receipt(p, "done")
    got = _drain_messages(c, 5)
    assert sorted(m.headers["seq"] for m in got) == ["0", "1", "2", "3", "4"]


def test_a_transaction_spanning_owners_is_refused_and_nothing_is_applied(broker):
    on0, on1 = owned_by(0)[0], owned_by(1)[0]
    p = broker.connect(0)
    p.send("BEGIN", {"transaction": "t"})
    p.send("SEND", {"destination": on1, "transaction": "t"}, b"one")
    p.send("SEND", {"destination": on0, "transaction": "t", "receipt": "r"}, b"two")
    f = p.read()
    assert f.command == "ERROR" and f.headers.get("receipt-id") == "r", f
    assert "span workers w1" in f.headers["message"] and "w0" in f.headers["message"], f.headers
    assert "nothing of the transaction was applied" in f.headers["message"]
    with pytest.raises(ConnectionError):
        p.read(5)
    c = broker.connect(1)
    _empty(c, on0, "x0")
    _empty(c, on1, "x1")


def test_ack_and_send_of_one_transaction_on_one_remote_owner(broker):
    src, dst = owned_by(1, count=2)
    p = broker.connect(1)
    p.send("SEND", {"destination": src, "receipt": "in"}, b"work")
    _receipt(p, "in")
    c = broker.connect(0)
    c.send("SUBSCRIBE", {"destination": src, "id": "s", "ack": "client-individual"})
    m = c.read()
    c.send("BEGIN", {"transaction": "t"})
    c.send("ACK", {"id": m.headers["ack"], "transaction": "t"})
    c.send("SEND", {"destination": dst, "transaction": "t"}, b"result")
    c.send("ABORT", {"transaction": "t", "receipt": "ab"})
    _receipt(c, "ab")
    c.send("BEGIN", {"transaction": "t2"})
    c.send("ACK", {"id": m.headers["ack"], "transaction": "t2"})
    c.send("SEND", {"destination": dst, "transaction": "t2"}, b"result")
    c.send("COMMIT", {"transaction": "t2", "receipt": "cm"})
    _receipt(c, "cm")
    c.send("DISCONNECT", {"receipt": "bye"})
    _receipt(c, "bye")
    d = broker.connect(0)
    d.send("SUBSCRIBE", {"destination": dst, "id": "d"})
    assert d.read().body == b"result"
    _empty(d, src)                         # the ACK was applied with the SEND


def _passwd(users, name, password, roles=None):
    args = [sys.executable, "-m", "pymq_server.cli", "passwd", name, "--users-file", str(users), "--password-stdin"]
    if roles:
        args += ["--roles", roles]
    subprocess.run(args, input=password + "\n", text=True, check=True, capture_output=True, timeout=60)


def test_permission_refused_through_a_remote_owner_as_through_a_local_one(tmp_path):
    users = tmp_path / "users.yaml"
    _passwd(users, "alice", "alice-pw", "admin")
    _passwd(users, "bob", "bob-pw", "app")
    cfg = tmp_path / "broker.yaml"
    cfg.write_text(f"users_file: {users}\ndefault_permissions: {{'role:app': [consume, browse]}}\n")
    cluster = start_broker(str(tmp_path / "data"), "--config", str(cfg))
    try:
        messages = {}
        for owner in (0, 1):
            dest = owned_by(owner, prefix="/queue/acl.")[0]
            bob = cluster.connect(0, login="bob", passcode="bob-pw")
            bob.send("SEND", {"destination": dest, "receipt": "r"}, b"nope")
            f = bob.read()
            assert f.command == "ERROR" and f.headers.get("receipt-id") == "r", f
            messages[owner] = f.headers["message"].replace(dest, "<dest>")
            alice = cluster.connect(1, login="alice", passcode="alice-pw")
            alice.send("SUBSCRIBE", {"destination": dest, "id": "a"})
            with pytest.raises(TimeoutError):
                alice.read(0.7)
        assert messages[0] == messages[1] and "bob" in messages[1], messages
    finally:
        stop_broker(cluster)


def test_persistent_messages_survive_kill_9_of_every_worker(tmp_path):
    data = str(tmp_path / "data")
    cluster = start_broker(data)
    dests = {k: owned_by(k, prefix="/queue/durable.")[0] for k in (0, 1)}
    try:
        for home in (0, 1):
            p = cluster.connect(home)
            for dest in dests.values():
                for i in range(20):
                    p.send("SEND", {"destination": dest, "persistent": "true", "seq": f"{home}-{i}"}, b"keep")
            p.send("SEND", {"destination": dests[home], "persistent": "true", "receipt": "all",
                            "seq": f"{home}-end"}, b"keep")
            _receipt(p, "all")
        os.killpg(cluster.proc.pid, signal.SIGKILL)     # the supervisor and every worker at once
        cluster.proc.wait(30)
    finally:
        stop_broker(cluster)
    again = start_broker(data)
    try:
        for k, dest in dests.items():
            c = again.connect(1 - k)
            c.send("SUBSCRIBE", {"destination": dest, "id": "s"})
            want = [f"0-{i}" for i in range(20)] + (["0-end"] if k == 0 else [])
            want += [f"1-{i}" for i in range(20)] + (["1-end"] if k == 1 else [])
            got = [m.headers["seq"] for m in _drain_messages(c, len(want))]
            assert got == want
    finally:
        stop_broker(again)


def _wait_for(cluster, text: str, count: int = 1, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if "".join(cluster.stderr).count(text) >= count:
            return
        time.sleep(0.1)
    raise AssertionError(f"{text!r} not {count} times in:\n" + "".join(cluster.stderr))


def test_a_killed_worker_is_restarted_and_its_persistent_messages_come_back(broker):
    dest = owned_by(1, prefix="/queue/restart.")[0]
    local = owned_by(0, prefix="/queue/restart.")[0]
    p = broker.connect(0)
    # a connection that spans workers (it holds a subscription at its home first): it stays at worker 0 and
    # forwards to worker 1 (a connection whose first frame names worker 1's queue moves there instead)
    p.send("SUBSCRIBE", {"destination": local, "id": "held", "receipt": "held"})
    _receipt(p, "held")
    moved = broker.connect(0)
    moved.send("SUBSCRIBE", {"destination": dest, "id": "m", "receipt": "m", "ack": "client-individual"})
    _receipt(moved, "m")                                # handed over to worker 1: it lives there now
    for i in range(10):
        p.send("SEND", {"destination": dest, "persistent": "true", "seq": str(i)}, b"keep")
    p.send("SEND", {"destination": dest, "persistent": "true", "seq": "10", "receipt": "r"}, b"keep")
    _receipt(p, "r")
    bystander = broker.connect(0)                       # used only worker 0's destinations: unaffected
    bystander.send("SUBSCRIBE", {"destination": local, "id": "l", "receipt": "l"})
    _receipt(bystander, "l")
    victim = broker.workers_alive()[1]
    os.kill(victim, signal.SIGKILL)
    _wait_for(broker, f"(pid {victim}) was killed by signal 9 (SIGKILL); restarting it")
    f = p.read(10)                                      # it used worker 1: told, and closed
    assert f.command == "ERROR" and "worker 1" in f.headers["message"] and "reconnect" in f.headers["message"], f
    # the handed-over connection died with its worker, as a one-process broker's connections do: its socket
    # ends (what it had received and not acknowledged is redelivered after the restart: below)
    with pytest.raises(ConnectionError):
        while True:
            moved.read(10)
    _wait_for(broker, "is back")
    assert broker.proc.poll() is None
    bystander.send("SEND", {"destination": local, "receipt": "still"}, b"x")
    frames = [bystander.read(), bystander.read()]
    assert {fr.command for fr in frames} == {"MESSAGE", "RECEIPT"}
    c = broker.connect(0)                               # the restarted worker's queue, from the other
    c.send("SUBSCRIBE", {"destination": dest, "id": "s"})
    got = [m.headers["seq"] for m in _drain_messages(c, 11)]
    assert got == [str(i) for i in range(11)]


def test_too_many_worker_deaths_stop_the_broker_loudly(tmp_path):
    restarts = 2
    cfg = tmp_path / "broker.yaml"
    # a window no machine is slow enough to leave: the count, not the time, decides
    cfg.write_text(f"worker_restarts: {restarts}\nworker_restart_window_ms: 3600000\n")
    broker = start_broker(str(tmp_path / "data"), "--config", str(cfg))
    try:
        _deaths_until_the_broker_stops(broker, restarts)
    finally:
        stop_broker(broker)


def _deaths_until_the_broker_stops(broker, restarts: int) -> None:
    c = broker.connect(0)
    for n in range(restarts + 1):
        pids = broker.workers_alive()
        assert len(pids) == 2, pids
        victim = max(pids)                              # the newest: worker 1 after the first restart
        os.kill(victim, signal.SIGKILL)
        if n < restarts:
            _wait_for(broker, f"(pid {victim}) was killed by signal 9 (SIGKILL); restarting it")
            _wait_for(broker, "is back", count=n + 1)
    broker.proc.wait(60)
    assert broker.proc.returncode == 1
    text = "".join(broker.stderr)
    assert f"worker death {restarts + 1} within 3600s (worker_restarts: {restarts}): stopping the other workers" \
        in text, text
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(_alive(p) for p in pids):
        time.sleep(0.1)
    assert not any(_alive(p) for p in pids)
    with pytest.raises((ConnectionError, OSError)):
        c.read(5)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:   # a zombie not yet reaped counts as gone
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().split()[2] != "Z"
    except FileNotFoundError:
        return False


def test_stomp_py_producer_and_consumer_on_different_workers(broker):
    import stomp

    from tests.stomp_py_client import Collector

    class Homed(Collector):
        home = ""

        def on_connected(self, frame):
            self.home = frame.headers.get("pymq-worker", "")

    dest = owned_by(1, prefix="/queue/stomppy.")[0]
    conns = []
    by_home: dict[str, tuple] = {}
    try:
        for _ in range(100):             # stomp.py cannot choose its worker: connect until both are homes
            c = stomp.Connection12([("127.0.0.1", broker.port)], heartbeats=(0, 0))
            listener = Homed()
            c.set_listener("collector", listener)
            c.connect("guest", "guest", wait=True)
            conns.append(c)
            by_home.setdefault(listener.home, (c, listener))
            if len(by_home) == 2:
                break
        consumer, listener = by_home["0"]         # home 0, owner 1: MESSAGEs and ACKs cross
        producer, _ = by_home["1"]
        consumer.subscribe(dest, id="1", ack="client-individual")
        for i in range(20):
            producer.send(dest, f"m{i}", headers={"seq": str(i)})
        bodies = []
        for _ in range(20):
            frame = listener.next(10)
            bodies.append(frame.body)
            consumer.ack(frame.headers["ack"])
        assert bodies == [f"m{i}" for i in range(20)]
        assert listener.errors.empty()
    finally:
        for c in conns:
            try:
                c.disconnect()
            except Exception:  # noqa: BLE001 - a connection the broker closed already
                pass


def test_the_channels_are_reachable_by_the_brokers_user_only(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    cluster = start_broker(str(tmp_path / "data"), env={"TMPDIR": str(run)})
    try:
        (channel_dir,) = list(run.glob("pymq-cores-*"))
        assert channel_dir.stat().st_mode & 0o777 == 0o700
        sockets = sorted(p.name for p in channel_dir.iterdir())
        assert sockets == ["h0.sock", "h1.sock", "w0.sock", "w1.sock"]     # hand-over and channel sockets
        assert all((channel_dir / s).stat().st_mode & 0o777 == 0o600 for s in sockets)
        c = cluster.connect(0)                  # served as usual
        c.send("SEND", {"destination": owned_by(1)[0], "receipt": "r"}, b"x")
        _receipt(c, "r")
    finally:
        assert stop_broker(cluster) == 0        # a clean stop of every worker: status 0
    assert not list(run.glob("pymq-cores-*"))   # and the channel directory is gone


def test_a_supervisor_killed_with_9_leaves_no_channel_directory(tmp_path):
    """The supervisor's own clean-up cannot run after kill -9: its workers end with it (the parent-death
    signal) and remove the channel directory themselves, so nothing stays in the temporary directory."""
    run = tmp_path / "run"
    run.mkdir()
    cluster = start_broker(str(tmp_path / "data"), env={"TMPDIR": str(run)})
    workers = cluster.workers_alive()
    assert len(workers) == 2 and list(run.glob("pymq-cores-*"))
    os.kill(cluster.proc.pid, signal.SIGKILL)          # the supervisor only: the workers are told by the kernel
    cluster.proc.wait(10)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and (_running(workers) or list(run.glob("pymq-cores-*"))):
        time.sleep(0.1)
    assert not _running(workers)
    assert not list(run.glob("pymq-cores-*"))


def _running(pids: list[int]) -> list[int]:
    alive = []
    for pid in pids:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            continue
        alive.append(pid)
    return alive


def test_a_bulk_send_to_a_queue_another_worker_owns_is_one_block_there(broker):
    # the frame crosses to the owner, which keeps the rows as one block; consumers anywhere get every row
    # once, in order, and acknowledgements settle them at the owner (spec/spark.md §7.1)
    pa = pytest.importorskip("pyarrow")
    (dest,) = owned_by(1)
    batch = pa.RecordBatch.from_pydict({"body": pa.array([f"r{i}".encode() for i in range(300)])})
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, batch.schema) as w:
        w.write_batch(batch)
    p = broker.connect(0)
    p.send("SEND", {"destination": dest, "receipt": "bulk", "pymq-format": "arrow",
                    "content-type": "application/vnd.apache.arrow.stream"}, sink.getvalue().to_pybytes())
    receipt = p.read(10)
    assert receipt.command == "RECEIPT" and receipt.headers["pymq-count"] == "300", receipt
    c = broker.connect(0)
    c.send("SUBSCRIBE", {"destination": dest, "id": "s", "ack": "client-individual"})
    got = _drain_messages(c, 300)
    assert [m.body for m in got] == [f"r{i}".encode() for i in range(300)]
    for m in got:
        c.send("ACK", {"id": m.headers["ack"]})
    c.send("UNSUBSCRIBE", {"id": "s", "receipt": "gone"})
    _receipt(c, "gone")
    _empty(broker.connect(1), dest)
