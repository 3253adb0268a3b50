"""bench_queues' depth load counted where the load cannot move it: the broker's Python bytecodes per message.

    python bench/queues_opcodes.py [--persistent] [--depth 20000] [--json new.json]
    PYTHONPATH=<dir linking pymq, pymq_server> python bench/queues_opcodes.py --json old.json    # another tree
    python bench/opcodes.py --compare old.json new.json                                         # per function

The depth part of bench_queues.py times a queue held deep while a producer and a client-individual consumer
(prefetch 1,000) go as fast as they can; its figure, broker µs per event (enqueue, acquire, ack), moves with
the machine's load. This plays the same steps in process, with bench_core's sessions and no sockets: a queue
filled ``--depth`` deep (non-persistent or persistent, the default file store), the consumer subscribed at
prefetch 1,000, then rounds of 100 SENDs (a receipt every 100th, as bench_core's persistent workload asks) and
the ACKs of the 100 oldest deliveries, each round waiting for its MESSAGE frames, so the depth holds. It counts
the bytecodes each function executes (``sys.settrace`` opcode events, bench/opcodes.py's counter) over 1,000
and 3,000 messages; the difference over 2,000 is one message: one enqueue, one acquire and one ack. The event
loop's and the bench's own functions are counted apart ("loop").
"""
from __future__ import annotations

import argparse
import asyncio
import collections
import json
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from bench_core import BrokerConfig, BrokerServer, _connect, _settle, encode_frame  # noqa: E402
from opcodes import LOOP, opcode_tracer  # noqa: E402

#: the event loop's, the benches' and this file's own functions (its rounds of frames): not the broker's
OURS = LOOP | {"queues_opcodes.py"}

ROUND = 100


async def run(messages: int, depth: int, persistent: bool, data_dir: str, tracer) -> None:  # type: ignore[no-untyped-def]
    config = BrokerConfig.from_dict(dict(host="127.0.0.1", port=0, data_dir=data_dir, sync_policy="never"))
    server = BrokerServer(config)
    await server.start_core()
    loop = asyncio.get_running_loop()
    destination = "/queue/depth"
    producer, ptransport = _connect(server.broker, loop)
    consumer, ctransport = _connect(server.broker, loop)
    await _settle(lambda: producer.session.user is not None and consumer.session.user is not None)
    body = b"x" * 128
    flag = "true" if persistent else "false"

    def sends(n: int, first: int) -> bytes:
        return b"".join(encode_frame("SEND", {"destination": destination, "persistent": flag,
                                              **({"receipt": f"r{k}"} if k % 100 == 99 else {})}, body, "1.2")
                        for k in range(first, first + n))

    for first in range(0, depth, 1000):
        producer.data_received(sends(min(1000, depth - first), first))
    await _settle(lambda: ptransport.receipts >= depth // 100, 300)
    consumer.data_received(encode_frame("SUBSCRIBE", {"destination": destination, "id": "s", "ack": "client-individual",
                                                      "prefetch-count": "1000"}, b"", "1.2"))
    await _settle(lambda: ctransport.messages >= 1000)
    acked, sent = 0, depth
    sys.settrace(tracer)
    try:
        while acked < messages:
            producer.data_received(sends(ROUND, sent))
            sent += ROUND
            consumer.data_received(b"".join(b"ACK\nid:%d\n\n\x00" % (acked + i + 1) for i in range(ROUND)))
            acked += ROUND
            await _settle(lambda acked=acked, sent=sent:
                          ctransport.messages >= 1000 + acked and ptransport.receipts >= sent // 100)
    finally:
        sys.settrace(None)
    for proto in (producer, consumer):
        proto.connection_lost(None)
    await server.stop()


def count(messages: int, depth: int, persistent: bool) -> collections.Counter[str]:
    counts: collections.Counter[str] = collections.Counter()
    tracer = opcode_tracer(counts)
    with tempfile.TemporaryDirectory() as tmp:
        asyncio.run(run(messages, depth, persistent, tmp, tracer))
    return counts


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--persistent", action="store_true")
    ap.add_argument("--depth", type=int, default=20_000, help="messages waiting when the consumer subscribes")
    ap.add_argument("--json", help="write the per-function figures here (bench/opcodes.py --compare reads them)")
    ap.add_argument("--top", type=int, default=0, help="print the N dearest functions")
    a = ap.parse_args()
    low, high = count(1000, a.depth, a.persistent), count(3000, a.depth, a.persistent)
    per = {key: (high[key] - low[key]) / 2000 for key in set(low) | set(high)}
    loop = sum(v for k, v in per.items() if k.split(":")[0] in OURS)
    broker = sum(per.values()) - loop
    print(f"depth load, {'persistent' if a.persistent else 'non-persistent'}, {a.depth:,} deep: broker {broker:,.1f} "
          f"bytecodes a message (enqueue + acquire + ack), event loop and bench {loop:,.1f}")
    for key, value in sorted(per.items(), key=lambda kv: -kv[1])[:a.top]:
        if key.split(":")[0] not in OURS:
            print(f"  {value:8.1f}  {key}")
    if a.json:
        with open(a.json, "w") as fh:
            json.dump(per, fh, indent=1, sort_keys=True)


if __name__ == "__main__":
    main()
