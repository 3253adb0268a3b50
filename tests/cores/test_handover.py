"""A connection whose first frame names another worker's destination moves there (spec/cores.md §2.4):
its socket is handed over with its state and unread bytes, and it keeps its receipts, heart-beats,
subscriptions and acknowledgements; hostile input after the move gets the answer it gets anywhere."""
from __future__ import annotations

import socket
import time

from pymq.protocol.scanner import encode_frame
from tests.conftest import RawStomp
from tests.cores.conftest import owned_by
from tests.cores.test_forwarding import _receipt


def _frames_until(c: RawStomp, receipts: set[str], messages: int, timeout: float = 10.0) -> list:
    got: list = []
    deadline = time.monotonic() + timeout
    while receipts or sum(f.command == "MESSAGE" for f in got) < messages:
        f = c.read(max(0.1, deadline - time.monotonic()))
        assert f.command in ("RECEIPT", "MESSAGE"), f
        got.append(f)
        if f.command == "RECEIPT":
            receipts.discard(f.headers["receipt-id"])
    return got


def _heartbeats(sock: socket.socket, seconds: float) -> int:
    """Bytes of heart-beat (EOLs) read from ``sock`` within ``seconds`` (nothing else may come)."""
    count = 0
    deadline = time.monotonic() + seconds
    while (left := deadline - time.monotonic()) > 0:
        sock.settimeout(left)
        try:
            data = sock.recv(4096)
        except TimeoutError:
            break
        assert data and data.strip(b"\r\n") == b"", data
        count += data.count(b"\n")
    return count


def test_a_moved_connection_keeps_its_receipts_heartbeats_subscription_and_acks(broker):
    dest = owned_by(1, prefix="/queue/handover.")[0]
    c = broker.connect(0, **{"heart-beat": "0,250"})        # home 0; it wants a heart-beat every 250 ms
    # the first frame names worker 1's queue; the frames behind it come in the same write, the last one
    # cut in two: all of it is read at worker 0 before the move and handled at worker 1
    later = c.encode("SEND", {"destination": dest, "seq": "2", "receipt": "r2"}, b"two")
    c.send_raw(c.encode("SUBSCRIBE", {"destination": dest, "id": "s", "ack": "client-individual", "receipt": "s"})
               + c.encode("SEND", {"destination": dest, "seq": "1", "receipt": "r1"}, b"one") + later[:20])
    time.sleep(0.05)        # (not synchronisation: the rest of the cut frame arrives in a later read)
    c.send_raw(later[20:])
    got = _frames_until(c, {"s", "r1", "r2"}, 2)
    messages = [f for f in got if f.command == "MESSAGE"]
    assert [m.headers["seq"] for m in messages] == ["1", "2"] and [m.body for m in messages] == [b"one", b"two"]
    # the subscription is worker 1's own, not a shadow of a connection at worker 0 (whose tokens are w1.<n>)
    assert all(not m.headers["ack"].startswith("w") for m in messages), messages
    assert [f.headers["receipt-id"] for f in got if f.command == "RECEIPT"] == ["s", "r1", "r2"]
    assert _heartbeats(c.sock, 1.2) >= 2                    # worker 1 beats for it now
    c.send("ACK", {"id": messages[0].headers["ack"], "receipt": "a"})
    _receipt(c, "a")
    c.sock.close()                                          # lost without DISCONNECT: seq 2 was never acked
    again = broker.connect(0)
    again.send("SUBSCRIBE", {"destination": dest, "id": "t"})
    back = again.read(10)
    assert back.command == "MESSAGE" and back.headers["seq"] == "2" and back.headers.get("redelivered") == "true"
    again.send("SEND", {"destination": dest, "receipt": "end"}, b"end")
    f = _frames_until(again, {"end"}, 1)
    assert [m.body for m in f if m.command == "MESSAGE"] == [b"end"]   # nothing else was left: seq 1 acked


def test_a_moved_connections_client_id_is_held_where_it_went(broker):
    dest = owned_by(1, prefix="/queue/handover.")[0]
    c = broker.connect(0, **{"client-id": "moving"})
    c.send("SUBSCRIBE", {"destination": dest, "id": "s", "receipt": "s"})
    _receipt(c, "s")
    outcomes = set()
    for _ in range(40):                     # the kernel spreads them over both workers
        other = RawStomp(broker.port)
        f = other.connect(**{"client-id": "moving"})
        if f.command == "CONNECTED":
            outcomes.add(f.headers["pymq-worker"])      # worker 0 let the id go with the connection
            other.send("DISCONNECT", {"receipt": "bye"})
            other.read()
        else:
            assert f.command == "ERROR" and "client id 'moving'" in f.headers["message"], f
            outcomes.add("refused")                     # worker 1 holds it
        other.sock.close()
        if outcomes == {"0", "refused"}:
            break
    assert outcomes == {"0", "refused"}, outcomes


def test_hostile_input_on_a_moved_connection_gets_the_answer_it_gets_anywhere(broker):
    dest = owned_by(1, prefix="/queue/handover.")[0]
    bad = b"SEND\ndestination:" + dest.encode() + b"\ncontent-length:99999999999999999999\n\n\x00"
    for cut in (None, 12, len(bad) - 3):
        answers = []
        for home in (0, 1):                 # moved to worker 1 before the bad frame, or born there
            c = broker.connect(home)
            first = c.encode("SEND", {"destination": dest, "receipt": "ok"}, b"x")
            if cut is None:                 # the bad frame after the move
                c.send_raw(first)
                _receipt(c, "ok")
                c.send_raw(bad)
            else:                           # cut in two across the move: read at worker 0, ended at worker 1
                c.send_raw(first + bad[:cut])
                _receipt(c, "ok")
                c.send_raw(bad[cut:])
            frames = c.read_until_closed(10)
            assert [f.command for f in frames] == ["ERROR"], frames
            answers.append((frames[0].headers.get("pymq-code"), frames[0].headers["message"]))
        assert answers[0] == answers[1] and answers[0][0] == "invalid-header", answers
    # a frame cut inside its header block, then garbage: the same
    c = broker.connect(0)
    c.send_raw(c.encode("SEND", {"destination": dest}, b"y") + b"SEND\ndestination:/queue/x\x00\nnope\n\n\x00")
    frames = c.read_until_closed(10)
    assert frames and frames[-1].command == "ERROR", frames
    # nothing was restarted, and both workers still serve
    for home in (0, 1):
        ok = broker.connect(home)
        ok.send("SEND", {"destination": dest, "receipt": "fine"}, b"z")
        _receipt(ok, "fine")
    assert "restarting" not in "".join(broker.stderr)


def test_a_large_body_being_read_keeps_the_connection_where_it_is(broker):
    """The scanner is inside a large body when the move is decided: its head is parsed and gone, so the
    connection stays and forwards (the fallback); nothing is lost or reordered."""
    dest = owned_by(1, prefix="/queue/handover.")[0]
    consumer = broker.connect(1)
    consumer.send("SUBSCRIBE", {"destination": dest, "id": "s", "receipt": "s"})
    _receipt(consumer, "s")
    c = broker.connect(0)
    big = bytes(range(256)) * 1024                               # 256 KiB: gathered in pieces
    large = c.encode("SEND", {"destination": dest, "seq": "2", "receipt": "r2"}, big)
    c.send_raw(c.encode("SEND", {"destination": dest, "seq": "1", "receipt": "r1"}, b"one") + large[:70_000])
    time.sleep(0.05)        # (not synchronisation: the rest of the body arrives in later reads)
    c.send_raw(large[70_000:])
    _frames_until(c, {"r1", "r2"}, 0)
    got = _frames_until(consumer, set(), 2)
    assert [(m.headers["seq"], len(m.body)) for m in got] == [("1", 3), ("2", len(big))] and got[1].body == big
    # a connection that moved takes the full frame size at once (the small limit before CONNECTED is gone)
    moved = broker.connect(0)
    moved.send("SEND", {"destination": dest, "seq": "3", "receipt": "r3"}, b"three")
    _receipt(moved, "r3")
    moved.send("SEND", {"destination": dest, "seq": "4", "receipt": "r4"}, big)
    _receipt(moved, "r4")
    got = _frames_until(consumer, set(), 2)
    assert [(m.headers["seq"], len(m.body)) for m in got] == [("3", 5), ("4", len(big))] and got[1].body == big


def test_connect_and_the_first_send_in_one_write(broker):
    dest = owned_by(1, prefix="/queue/handover.")[0]
    for _ in range(6):                      # either worker may accept it
        c = RawStomp(broker.port)
        c.send_raw(encode_frame("CONNECT", {"accept-version": "1.2", "host": "/", "login": "guest",
                                            "passcode": "guest"}, b"", "1.2")
                   + c.encode("SEND", {"destination": dest, "receipt": "r"}, b"x"))
        first = c.read(10)
        assert first.command == "CONNECTED", first
        c.frames.extend(c.scanner.feed(b""))    # the RECEIPT may come in the same read as CONNECTED
        _receipt(c, "r")
        c.sock.close()


def test_a_tls_connection_is_not_moved_it_forwards(tmp_path):
    """A TLS session's state cannot leave its process: a TLS connection whose first frame names the other
    worker's queue stays and forwards (spec/cores.md §2.4); moving its socket would hand the owner TLS
    records it cannot read."""
    import socket as socket_mod
    import ssl

    from tests.client.tls import Authority
    from tests.cores.conftest import start_broker, stop_broker
    authority = Authority(tmp_path)
    issued = authority.issue("broker", ips=("127.0.0.1",))
    probe = socket_mod.socket()
    probe.bind(("127.0.0.1", 0))
    tls_port = probe.getsockname()[1]
    probe.close()
    cfg = tmp_path / "broker.yaml"
    cfg.write_text(f"tls_port: {tls_port}\ntls: {{cert_file: {issued.cert}, key_file: {issued.key}}}\n")
    broker = start_broker(str(tmp_path / "data"), "--config", str(cfg))
    try:
        dest = owned_by(1, prefix="/queue/handover.tls.")[0]
        context = ssl.create_default_context(cafile=str(authority.ca_file))
        for _ in range(200):                  # a TLS connection whose home is worker 0
            c = RawStomp(broker.port)
            c.sock.close()
            raw = socket_mod.create_connection(("127.0.0.1", tls_port), timeout=5)
            c.sock = context.wrap_socket(raw, server_hostname="127.0.0.1")
            frame = c.connect()
            if frame.headers.get("pymq-worker") == "0":
                break
            c.sock.close()
        else:
            raise AssertionError("no TLS connection landed on worker 0")
        c.send_raw(c.encode("SEND", {"destination": dest, "receipt": "r1"}, b"over tls")
                   + c.encode("SEND", {"destination": dest, "receipt": "r2"}, b"and again"))
        _receipt(c, "r1")
        _receipt(c, "r2")
        consumer = broker.connect(1)
        consumer.send("SUBSCRIBE", {"destination": dest, "id": "s"})
        got = _frames_until(consumer, set(), 2)
        assert [m.body for m in got] == [b"over tls", b"and again"]
        c.sock.close()
    finally:
        stop_broker(broker)


def _connected_at(broker, worker: int, **headers: str) -> tuple[RawStomp, object]:
    """A connection whose home is ``worker`` and its CONNECTED frame (at most 200 tries)."""
    for _ in range(200):
        c = RawStomp(broker.port)
        frame = c.connect(**headers)
        assert frame.command == "CONNECTED", frame
        if frame.headers.get("pymq-worker") == str(worker):
            return c, frame
        c.send("DISCONNECT", {"receipt": "spare"})
        c.read()
        c.sock.close()
    raise AssertionError(f"no connection landed on worker {worker}")


def test_a_moved_connection_re_claims_its_temporary_queue_with_its_first_workers_token(broker):
    """CONNECTED came from the first worker, with its re-claim token (spec/ha.md §4.7); the connection then
    moved, and its temporary queue lives where it went. After a lost link, a CONNECT offering that token at
    the owner takes the queue back with its global name, and what was sent to it meanwhile."""
    dest = owned_by(1, prefix="/queue/handover.")[0]
    c, connected = _connected_at(broker, 0)
    token = connected.headers["pymq-reclaim-token"]
    c.send("SEND", {"destination": dest, "receipt": "moved"}, b"first")       # moves to worker 1
    _receipt(c, "moved")
    # acked by the client: the answer may reach this subscription before its worker sees the socket closed
    # below, and comes back to the queue when it does (with auto acks it would be gone with the link)
    c.send("SUBSCRIBE", {"destination": "/temp-queue/reply", "id": "t", "ack": "client-individual",
                         "receipt": "t"})
    c.send("SEND", {"destination": dest, "reply-to": "/temp-queue/reply", "receipt": "asked"}, b"question")
    _frames_until(c, {"t", "asked"}, 0)
    d = broker.connect(1)
    d.send("SUBSCRIBE", {"destination": dest, "id": "q"})
    asked = [f for f in _frames_until(d, set(), 2) if f.command == "MESSAGE"][-1]
    reply_to = asked.headers["reply-to"]
    assert reply_to.startswith("/temp-queue/tmp.w1"), reply_to          # the owner's global name
    c.sock.close()                                                      # a lost link, no DISCONNECT
    d.send("SEND", {"destination": reply_to, "receipt": "answered"}, b"answer")
    _receipt(d, "answered")
    again, frame = _connected_at(broker, 1, **{"pymq-reclaim": token})
    assert frame.headers.get("pymq-reclaimed") == "true", frame
    assert frame.headers["pymq-reclaim-token"] != token                 # the owner's own token from now on
    again.send("SUBSCRIBE", {"destination": "/temp-queue/reply", "id": "t2"})
    got = again.read(10)
    assert got.command == "MESSAGE" and got.body == b"answer", got


def test_a_connection_that_began_empty_transactions_moves_and_they_are_its_owners(broker):
    """A JMS transacted session sends BEGIN as it opens, before any SEND: a connection that has handled only its
    CONNECT and BEGINs of empty transactions moves too (spec/cores.md §2.4), its transactions begun again at
    the owner; before, it stayed at its home and forwarded every frame (one relay a message)."""
    from tests.cores.test_placement import _connections
    dest = owned_by(1, prefix="/queue/txmove.")[0]
    c = broker.connect(0, **{"client-id": "transacted"})
    c.send("BEGIN", {"transaction": "t1", "receipt": "b"})
    _receipt(c, "b")                                        # a BEGIN's receipt, written before the move
    c.send("BEGIN", {"transaction": "t2"})
    for n in range(3):
        c.send("SEND", {"destination": dest, "transaction": "t1"}, b"t1.%d" % n)
        c.send("SEND", {"destination": dest, "transaction": "t2"}, b"t2.%d" % n)
    c.send("COMMIT", {"transaction": "t1", "receipt": "c1"})
    _receipt(c, "c1")
    c.send("ABORT", {"transaction": "t2"})
    c.send("SEND", {"destination": dest, "receipt": "m"}, b"after")
    _receipt(c, "m")
    consumer = broker.connect(1)
    consumer.send("SUBSCRIBE", {"destination": dest, "id": "s"})
    assert [consumer.read().body for _ in range(4)] == [b"t1.0", b"t1.1", b"t1.2", b"after"]
    row = next(r for r in _connections(broker) if r["client_id"] == "transacted")
    assert row["id"].startswith("w1c"), row                 # the owner's own connection now: nothing relayed
