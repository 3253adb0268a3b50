"""asyncio: the same API with ``await`` — a producer task, a transformer task and a consumer task joined
by two queues, one connection shared by the tasks, one session per task.

    producer ──▶ /queue/raw ──▶ transformer (transacted: receive + send commit together) ──▶ /queue/clean
                                                                                              │
                                                       consumer (async for) ◀─────────────────┘

Run it:  python examples/asyncio_pipeline.py [--url stomp://127.0.0.1:61613]

``pymq.aio.connect`` gives an ``AsyncConnection`` on the running loop (``stomp://`` over an asyncio
protocol, or ``vm://`` in-process).  The transformer's session is transacted: each message it takes from
``raw`` and the one it sends to ``clean`` are committed together, so a crash in between neither loses nor
duplicates a reading.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import sys
import uuid

import pymq
import pymq.aio

READINGS = 20
# this run's own queues: on a shared broker, queues of another program (or an earlier run) are left alone,
# and these are dropped at the end
RUN = uuid.uuid4().hex[:8]
RAW, CLEAN = pymq.Queue(f"example-raw-{RUN}"), pymq.Queue(f"example-clean-{RUN}")


async def produce(conn) -> None:
    producer = conn.create_session().create_producer(RAW)
    for i in range(READINGS):
        await producer.send(json.dumps({"sensor": f"s{i % 3}", "celsius": 20 + i * 0.5}))


async def transform(conn) -> None:
    session = conn.create_session(transacted=True)
    raw = await session.create_consumer(RAW)
    clean = session.create_producer(CLEAN)
    for _ in range(READINGS):
        message = await raw.receive(timeout=10)
        reading = json.loads(message.text)
        fahrenheit = round(reading["celsius"] * 9 / 5 + 32, 1)
        await clean.send(pymq.TextMessage(json.dumps({**reading, "fahrenheit": fahrenheit}),
                                          properties={"sensor": reading["sensor"]}))
        await session.commit()


async def consume(conn) -> list[dict]:
    consumer = await conn.create_session().create_consumer(CLEAN)
    out = []
    async for message in consumer:
        out.append(json.loads(message.text))
        if len(out) == READINGS:
            break
    return out


async def main_async(url: str) -> int:
    async with pymq.aio.connect(url) as conn:
        queues = conn.queue_manager()
        for queue in (RAW, CLEAN):
            await queues.create(queue)
        try:
            _, _, results = await asyncio.wait_for(asyncio.gather(produce(conn), transform(conn), consume(conn)),
                                                   60)
        finally:
            for queue in (RAW, CLEAN):
                await queues.drop(queue, force=True)
    for r in results[:3]:
        print(f"{r['sensor']}: {r['celsius']} C = {r['fahrenheit']} F")
    print(f"... {len(results)} readings in all")
    ok = len(results) == READINGS and all(r["fahrenheit"] == round(r["celsius"] * 9 / 5 + 32, 1) for r in results)
    print("asyncio: every reading went through the pipeline once" if ok else "asyncio: READINGS LOST")
    return 0 if ok else 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", default="vm://example-asyncio")
    return asyncio.run(main_async(parser.parse_args().url))


if __name__ == "__main__":
    sys.exit(main())
