"""A client-individual ACK's steps (acks.DeliveryLedger.settle, session._acknowledge, MessageQueue.complete): the
delivery found and taken out of the ledger by one look-up, and a read's ACKs settled at one instant, so the
queue's depth figures move once for the run instead of once an ACK.

Real sessions and the real TCP adapter over a recording transport, in one process; the Python functions a read
of ACKs runs are counted by a profile hook (tests/calls.py), which no timing or load moves."""
from __future__ import annotations

import asyncio

from pymq.protocol.scanner import encode_frame

from tests.calls import python_calls
from tests.fake_transport import RecordingTransport
from tests.fake_transport import connect as _connect
from tests.fake_transport import memory_broker as _broker
from tests.fake_transport import until as _until

N = 20


def _acks(tokens: list[str]) -> bytes:
    return b"".join(encode_frame("ACK", {"id": t}, b"", "1.2") for t in tokens)


def _tokens(transport: RecordingTransport) -> list[str]:
    return [f.headers["ack"] for f in transport.frames() if f.command == "MESSAGE"]


def test_a_read_of_client_individual_acks_settles_each_by_one_look_up_and_moves_the_depth_figures_once(tmp_path):
    """N ACKs in one read: no resolve/_take_one step per ACK (settle finds and takes the delivery itself), one
    depth-figure update for the run (before: N, each with its own clock reading); the next read's ACKs read
    the clock again; every message acknowledged, the queue empty, its figures consistent."""
    async def run() -> None:
        server = await _broker(str(tmp_path))
        loop = asyncio.get_running_loop()
        consumer, ctransport = _connect(server, loop)
        producer, _ = _connect(server, loop)
        consumer.data_received(encode_frame("SUBSCRIBE", {"destination": "/queue/a", "id": "s", "ack":
                                                          "client-individual"}, b"", "1.2"))
        await _until(lambda: consumer.session.consumers and producer.session.user is not None, "not subscribed")
        queue = server.broker.queues["a"]
        for run_no in range(2):
            producer.data_received(b"".join(encode_frame("SEND", {"destination": "/queue/a"}, b"m%d" % i, "1.2")
                                            for i in range(N)))
            expected = N * (run_no + 1)
            await _until(lambda: len(_tokens(ctransport)) == expected, "not delivered")   # noqa: B023
            tokens = _tokens(ctransport)[N * run_no:]
            before = queue.stats._depth_since
            read = _acks(tokens)
            _, calls = python_calls(lambda: consumer.data_received(read))    # noqa: B023
            assert calls.count("DeliveryLedger.settle") == N
            assert calls.count("DeliveryLedger.resolve") == 0 and calls.count("DeliveryLedger._take_one") == 0
            assert calls.count("MessageQueue.complete") == N
            assert calls.count("MessageQueue._depth_delta") == 1, calls.count("MessageQueue._depth_delta")
            assert queue.stats._depth_since > before        # this read's instant, not the last read's
            assert consumer.session._acks_at is None         # not kept past the read
            assert queue.depth == 0 and queue.acquired == 0
            assert queue.stats.acknowledged == N * (run_no + 1)
            assert not consumer.session.deliveries.tokens and not consumer.session.consumers["s"].unacked
            assert consumer.session.consumers["s"].in_flight == 0
        assert 0 <= queue.stats.average_depth(queue.depth, server.broker.clock()) <= N
        # an ACK of a token already acknowledged: the same precise refusal as before, nothing settled twice
        consumer.data_received(_acks([tokens[0]]))
        errors = [f for f in ctransport.frames() if f.command == "ERROR"]
        assert len(errors) == 1
        assert f"unknown or already acknowledged message (id '{tokens[0]}')" in errors[0].headers["message"]
        assert queue.stats.acknowledged == 2 * N
        await server.stop()

    asyncio.run(run())


def test_a_cumulative_ack_and_a_nack_still_take_the_general_way(tmp_path):
    """``client`` mode's cumulative ACK covers everything up to its token (one ledger walk, the fast path does
    not apply: the token is not popped and put back); a client-individual NACK sends the message back."""
    async def run() -> None:
        server = await _broker(str(tmp_path))
        loop = asyncio.get_running_loop()
        cumulative, ctransport = _connect(server, loop)
        single, stransport = _connect(server, loop)
        producer, _ = _connect(server, loop)
        cumulative.data_received(encode_frame("SUBSCRIBE", {"destination": "/queue/c", "id": "s", "ack": "client"},
                                              b"", "1.2"))
        single.data_received(encode_frame("SUBSCRIBE", {"destination": "/queue/n", "id": "s",
                                                        "ack": "client-individual"}, b"", "1.2"))
        await _until(lambda: cumulative.session.consumers and single.session.consumers
                     and producer.session.user is not None, "not subscribed")
        producer.data_received(b"".join(encode_frame("SEND", {"destination": d}, b"x", "1.2")
                                        for d in ["/queue/c"] * 5 + ["/queue/n"]))
        await _until(lambda: len(_tokens(ctransport)) == 5 and len(_tokens(stransport)) == 1, "not delivered")
        tokens = _tokens(ctransport)
        cumulative.data_received(_acks([tokens[2]]))
        c = server.broker.queues["c"]
        assert c.stats.acknowledged == 3 and c.depth == 2
        assert list(cumulative.session.consumers["s"].unacked) == tokens[3:]
        assert sorted(cumulative.session.deliveries.tokens) == sorted(tokens[3:])
        single.data_received(encode_frame("NACK", {"id": _tokens(stransport)[0]}, b"", "1.2"))
        n = server.broker.queues["n"]
        assert n.stats.acknowledged == 0 and n.depth == 1 and n.stats.failed == 1
        assert [f.command for f in ctransport.frames() + stransport.frames()].count("ERROR") == 0
        await server.stop()

    asyncio.run(run())
