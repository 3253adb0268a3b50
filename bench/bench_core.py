"""The broker core's hot path in-process: SEND → MESSAGE → ACK through real sessions, no sockets.

    python bench/bench_core.py [--messages N] [--rounds R] [--workloads q-auto,q-client,q-persist,topic4]
                               [--workloads q-client,q-cumulative]   # one ACK per message vs one per 64
                               [--workloads d4,m4]   # 4+4 on one queue; 4 queues, 1+1 each (auto-ack)
                               [--workloads i1000]   # q-client with a prefetch of 1,000 (bench_brokers' i)

Each connection is the real TCP adapter (``StompServerProtocol``) over a fake transport that only counts
the bytes and MESSAGE frames written, so what is measured is exactly the broker's work per message:
frame parsing, the session, routing and placement, the queue, dispatch, MESSAGE encoding, ACK handling
(and for ``q-persist`` the file device's writes and receipts). Producers write batches of 1,000 SEND
frames in one ``data_received`` (as a pipelining client's read delivers them); consumers acknowledge each
message (client-individual) in one batch per read. The figure is CPU microseconds per message (process
time, median of the rounds), which a busy shared machine disturbs far less than throughput, and the
cheapest batch of 1,000 over all rounds ("best batch"), which filters out most foreign load; compare two
builds by running this script from each checkout back to back.

``q-cumulative`` is ``q-client`` acknowledged as the SDK's AUTO_ACKNOWLEDGE does since issue 30: an ``ack:client``
subscription and one cumulative ACK per 64 messages (pymq.client._core.AUTO_ACK_BATCH) instead of one
``client-individual`` ACK per message (what the SDK sent before): the two side by side are the broker's
saving per message.
"""
from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import tempfile
import time

from pymq.protocol.scanner import encode_frame
from pymq_server.app import BrokerServer
from pymq_server.broker.session import BrokerSession
from pymq_server.config import BrokerConfig
from pymq_server.net.tcp import StompServerProtocol

BATCH = 1000
#: q-cumulative: messages one cumulative ACK covers (the SDK's AUTO_ACK_BATCH)
ACK_BATCH = 64


class CountingTransport:
    """Enough of an asyncio transport for the adapter: keeps counts, drops the bytes."""

    def __init__(self) -> None:
        self.messages = 0
        self.bytes = 0
        self.receipts = 0
        self.closed = False

    def write(self, data: bytes) -> None:
        self.bytes += len(data)
        self.messages += data.count(b"MESSAGE\n")
        self.receipts += data.count(b"RECEIPT\n")

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True

    def set_write_buffer_limits(self, high: int, low: int) -> None:
        pass

    def get_extra_info(self, name: str, default=None):
        return ("127.0.0.1", 1) if name == "peername" else default

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


def _connect(broker, loop, session_type=None) -> tuple[StompServerProtocol, CountingTransport]:
    proto = StompServerProtocol(broker, loop, session_type or BrokerSession)
    transport = CountingTransport()
    proto.connection_made(transport)
    proto.data_received(encode_frame("CONNECT", {"accept-version": "1.2", "host": "/", "login": "guest",
                                                 "passcode": "guest"}, b"", "1.2"))
    return proto, transport


async def _settle(condition, limit: float = 30.0) -> None:
    deadline = time.monotonic() + limit
    while not condition():
        if time.monotonic() > deadline:
            raise RuntimeError("the broker did not deliver everything in time")
        await asyncio.sleep(0)


def _home_sessions(workers: int, destination: str, loop):  # type: ignore[no-untyped-def]
    """The session type of the worker of ``workers`` that owns ``destination`` (spec/cores.md §2.4: after a
    hand-over, or accepted there, a one-destination connection runs entirely in that worker). Several
    destinations (m4) each get their owner's: every stream is counted as it runs in its own worker."""
    import functools

    from pymq_server.cores.home import HomeSession
    from pymq_server.cores.mesh import Mesh
    from pymq_server.cores.ownership import Ownership
    owner = Ownership(0, workers, "bench").owner(destination)
    mesh = Mesh(owner, workers, tempfile.gettempdir(), "bench", loop, 1 << 20)
    return functools.partial(HomeSession, mesh)


#: workloads of several connections: (destinations, producers, consumers) -- d4 is bench_brokers' row d/dn
#: (4 producers and 4 consumers on one queue), m4 its rows m/md (4 queues, one producer and one consumer each)
SHAPES = {"d4": (1, 4, 4), "m4": (4, 4, 4)}


async def run_workload(name: str, messages: int, data_dir: str, workers: int = 1) -> tuple[float, float]:
    """(CPU µs per delivered message over the run, the same for the cheapest batch of the run).

    ``workers`` > 1: every connection is the session of a multi-worker broker's worker (HomeSession) at the
    worker that owns the destination, which is where a one-destination load runs after its hand-over; the
    difference to ``workers`` 1 is what worker mode costs per message in the adopting worker."""
    persistent = name == "q-persist"
    storage = {} if persistent else {"devices": {"memory": {"kind": "memory"}}}
    config = BrokerConfig.from_dict(dict(host="127.0.0.1", port=0, data_dir=data_dir, storage=storage,
                                         sync_policy="never"))
    server = BrokerServer(config)
    await server.start_core()
    loop = asyncio.get_running_loop()
    broker = server.broker
    topic = name == "topic4"
    destination = f"/topic/bench-{name}" if topic else f"/queue/bench-{name}"
    client_acks = name in ("q-client", "q-persist", "q-cumulative", "i1000")
    ack_every = ACK_BATCH if name == "q-cumulative" else 1
    places, producers, subscribers = SHAPES.get(name, (1, 1, 4 if topic else 1))
    # m4's queues are a numbered family (/queue/bench-m4.0 ..), as bench_brokers' row m names them
    destinations = [destination] if places == 1 else [f"{destination}.{i}" for i in range(places)]
    types = [_home_sessions(workers, d, loop) if workers > 1 else None for d in destinations]
    consumers = []
    for i in range(subscribers):
        proto, transport = _connect(broker, loop, types[i % places])
        mode = ("client" if ack_every > 1 else "client-individual") if client_acks else "auto"
        prefetch = str(BATCH) if name == "i1000" else "0"      # i1000: bench_brokers' i/in (prefetch 1000)
        headers = {"destination": destinations[i % places], "id": f"s{i}", "ack": mode, "prefetch-count": prefetch}
        proto.data_received(encode_frame("SUBSCRIBE", headers, b"", "1.2"))
        consumers.append((proto, transport))
    senders = [_connect(broker, loop, types[i % places]) for i in range(producers)]
    producer, ptransport = senders[0]
    # authentication runs in a worker thread: start only once every subscription exists
    await _settle(lambda: all(p.session.user is not None for p, _ in senders)
                  and all(p.session.consumers for p, _ in consumers))
    body = b"x" * 128
    batches = []
    for k in range(producers):      # BATCH messages a round in all: BATCH / producers from each
        frames = []
        for i in range(BATCH // producers):
            headers = {"destination": destinations[k % places], "persistent": "true" if persistent else "false"}
            if persistent and i % 100 == 99:
                headers["receipt"] = f"r{i}"
            frames.append(encode_frame("SEND", headers, body, "1.2"))
        batches.append(b"".join(frames))
    send_batch = batches[0]
    fanout = 4 if topic else 1
    acked = 0
    started = time.process_time()
    sent = 0
    best = float("inf")
    while sent < messages:
        batch_started = time.process_time()
        if producers == 1:
            producer.data_received(send_batch)
        else:
            for (p, _), batch in zip(senders, batches, strict=True):
                p.data_received(batch)
        sent += BATCH
        target = sent * fanout
        await _settle(lambda target=target: sum(t.messages for _, t in consumers) >= target)
        if client_acks:
            proto = consumers[0][0]
            # ack tokens count from 1 per connection; a cumulative ACK names every ack_every-th and the last
            proto.data_received(b"".join(b"ACK\nid:%d\n\n\x00" % (acked + i + 1) for i in range(BATCH)
                                         if (i + 1) % ack_every == 0 or i + 1 == BATCH))
            acked += BATCH
        if persistent:
            await _settle(lambda sent=sent: ptransport.receipts >= sent // 100)
        best = min(best, time.process_time() - batch_started)
    elapsed = time.process_time() - started
    depth = sum(q.depth for q in broker.queues.values())
    if client_acks and depth:
        raise RuntimeError(f"{depth} messages left unacknowledged")
    for proto, _ in consumers + senders:
        proto.connection_lost(None)
    await server.stop()
    return elapsed / (messages * fanout) * 1e6, best / (BATCH * fanout) * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--messages", type=int, default=50_000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--workloads", default="q-auto,q-client,q-persist,topic4")
    ap.add_argument("--workers", type=int, default=1,
                    help="> 1: the sessions of that many workers' broker, at the destination's owner")
    args = ap.parse_args()
    import pymq_server
    print(f"broker core from {os.path.dirname(pymq_server.__file__)}; {args.messages} messages x "
          f"{args.rounds} rounds; CPU µs per delivered message (lower is better)")
    for name in args.workloads.split(","):
        figures = []
        best = []
        for _ in range(args.rounds):
            with tempfile.TemporaryDirectory(prefix="pymq-bench-core-") as tmp:
                overall, cheapest = asyncio.run(run_workload(name, args.messages, tmp, args.workers))
            figures.append(overall)
            best.append(cheapest)
        print(f"  {name:10s} median {statistics.median(figures):6.2f} µs/msg   "
              f"min {min(figures):6.2f}   max {max(figures):6.2f}   best batch {min(best):6.2f}")


if __name__ == "__main__":
    main()
