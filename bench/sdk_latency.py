"""End-to-end latency through the pymq SDK (issue 30 item 4): a producer paced at --rate messages/s and a
consumer, each on its own connection, both through the public API of the blocking SDK (`pymq`, two
threads) or the asyncio one (`pymq.aio`, two tasks on one loop); p50/p99/p99.9 of receive time minus send
time, the send time (CLOCK_MONOTONIC, ns) carried in the body.

    python bench/sdk_latency.py --url stomp://127.0.0.1:61613 --api aio --rate 2000 --seconds 10 [--persistent]

bench_brokers.py runs it as rows `es`/`esp` (blocking) and `ea`/`eap` (aio) beside the load client's `e`/`ep`
against the same pymq broker, so the SDK's share of the latency is the difference. The pacing is by
schedule (message i leaves at start + i/rate; one that is late leaves at once): a PERSISTENT send waits for
its receipt (JMS), so a producer that cannot keep the rate is visible as an achieved rate below --rate.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time

BODY = 128


def _body(seq: int) -> bytes:
    head = b"%012d %020d " % (seq, time.monotonic_ns())
    return head + b"x" * max(0, BODY - len(head))


def _summary(sent: int, stamps: list[tuple[int, int]], elapsed: float, rate: float, api: str,
             persistent: bool) -> dict:
    seen: set[int] = set()
    dups = 0
    lat = []
    for seq, us in stamps:
        if seq in seen:
            dups += 1
            continue
        seen.add(seq)
        lat.append(us)
    lat.sort()

    def pct(q: float) -> float:
        return float(lat[min(len(lat) - 1, int(q * len(lat)))]) if lat else 0.0
    return {"api": api, "persistent": persistent, "target_rate": rate, "sent": sent, "received": len(stamps),
            "lost": sent - len(seen), "duplicated": dups, "rate": len(seen) / elapsed if elapsed else 0.0,
            "lat_p50_us": pct(0.50), "lat_p99_us": pct(0.99), "lat_p999_us": pct(0.999),
            "lat_max_us": float(lat[-1]) if lat else 0.0}


def _stamp(body: bytes, now_ns: int) -> tuple[int, int]:
    seq, sent_ns = body.split(b" ", 2)[:2]
    return int(seq), (now_ns - int(sent_ns)) // 1000


def run_blocking(url: str, queue: str, rate: float, seconds: float, persistent: bool) -> dict:
    import pymq

    consumer_conn = pymq.connect(url)
    consumer_conn.start()
    consumer = consumer_conn.create_session().create_consumer(pymq.Queue(queue))
    total = int(rate * seconds)
    sent = [0]

    def produce() -> None:
        conn = pymq.connect(url)
        try:
            producer = conn.create_session().create_producer(pymq.Queue(queue))
            producer.delivery_mode = pymq.PERSISTENT if persistent else pymq.NON_PERSISTENT
            start = time.perf_counter()
            for i in range(total):
                wait = start + i / rate - time.perf_counter()
                if wait > 0:
                    time.sleep(wait)
                producer.send(_body(i))
                sent[0] = i + 1
        finally:
            conn.close()

    t0 = time.perf_counter()
    thread = threading.Thread(target=produce, daemon=True)
    thread.start()
    stamps = []
    last = time.perf_counter()
    try:
        while len(stamps) < total and time.perf_counter() - last < 10:
            m = consumer.receive(timeout=1)
            if m is None:
                continue
            stamps.append(_stamp(bytes(m.body), time.monotonic_ns()))
            last = time.perf_counter()
        thread.join(30)
    finally:
        consumer_conn.close()
    return _summary(sent[0], stamps, time.perf_counter() - t0, rate, "blocking", persistent)


async def _run_aio(url: str, queue: str, rate: float, seconds: float, persistent: bool) -> dict:
    import asyncio

    import pymq
    import pymq.aio

    consumer_conn = await pymq.aio.connect(url)
    await consumer_conn.start()
    consumer = await consumer_conn.create_session().create_consumer(pymq.Queue(queue))
    total = int(rate * seconds)
    sent = [0]

    async def produce() -> None:
        conn = await pymq.aio.connect(url)
        try:
            producer = conn.create_session().create_producer(pymq.Queue(queue))
            producer.delivery_mode = pymq.PERSISTENT if persistent else pymq.NON_PERSISTENT
            start = time.perf_counter()
            for i in range(total):
                wait = start + i / rate - time.perf_counter()
                if wait > 0:
                    await asyncio.sleep(wait)
                await producer.send(_body(i))
                sent[0] = i + 1
        finally:
            await conn.close()

    t0 = time.perf_counter()
    task = asyncio.get_running_loop().create_task(produce())
    stamps = []
    last = time.perf_counter()
    try:
        while len(stamps) < total and time.perf_counter() - last < 10:
            m = await consumer.receive(timeout=1)
            if m is None:
                continue
            stamps.append(_stamp(bytes(m.body), time.monotonic_ns()))
            last = time.perf_counter()
        await asyncio.wait_for(task, 30)
    finally:
        await consumer_conn.close()
    return _summary(sent[0], stamps, time.perf_counter() - t0, rate, "aio", persistent)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--url", required=True)
    ap.add_argument("--api", choices=("blocking", "aio"), default="blocking")
    ap.add_argument("--rate", type=float, default=2000.0)
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--persistent", action="store_true", help="PERSISTENT (each send waits for its receipt)")
    ap.add_argument("--queue", default=f"bench.sdk-latency.{os.getpid()}")
    ap.add_argument("--json", help="'-': the result as one JSON line on stdout")
    a = ap.parse_args(argv)
    if a.api == "aio":
        import asyncio
        r = asyncio.run(_run_aio(a.url, a.queue, a.rate, a.seconds, a.persistent))
    else:
        r = run_blocking(a.url, a.queue, a.rate, a.seconds, a.persistent)
    if a.json == "-":
        print(json.dumps(r))
    else:
        print(f"sdk {r['api']:8} {'persistent' if r['persistent'] else 'non-persistent':14} {r['rate']:8,.0f} msg/s "
              f"p50 {r['lat_p50_us'] / 1000:.2f} ms p99 {r['lat_p99_us'] / 1000:.2f} ms "
              f"p99.9 {r['lat_p999_us'] / 1000:.2f} ms  lost {r['lost']} dup {r['duplicated']}")
    return 1 if (r["lost"] or r["duplicated"]) else 0


if __name__ == "__main__":
    sys.exit(main())
