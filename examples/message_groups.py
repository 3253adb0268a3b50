"""Message groups: messages with the same group id go to one consumer, in order, while different groups
are spread over the consumers of the queue.

    producer ── JMSXGroupID = customer-A/B/C/D ──▶ /queue/payments ──┬─▶ worker 1
                                                                    └─▶ worker 2

Run it:  python examples/message_groups.py [--url stomp://127.0.0.1:61613]

The group id is ``JMSXGroupID`` (``message.group_id``).  The broker pins each group to one consumer while
that consumer lives (the first message of a group carries ``JMSXGroupFirstForConsumer``); if the
consumer goes away, the group moves to another one and stays in order there.  In a cluster, groups also
pick their node by a hash (spec/routing.md).
"""
from __future__ import annotations

import argparse
import sys
import threading
import time
import uuid

import pymq

CUSTOMERS = ["customer-A", "customer-B", "customer-C", "customer-D"]
# this run's own queue: on a shared broker another program's "payments" is left alone (and not drained);
# created first, dropped at the end
PAYMENTS = pymq.Queue(f"example-payments-{uuid.uuid4().hex[:8]}")


def worker(url: str, name: str, seen: dict, ready: threading.Barrier, done: threading.Event) -> None:
    with pymq.connect(url) as conn:
        session = conn.create_session(ack_mode=pymq.CLIENT_ACKNOWLEDGE)
        consumer = session.create_consumer(PAYMENTS)
        ready.wait()
        while not done.is_set():
            message = consumer.receive(timeout=0.2)
            if message is None:
                continue
            seen.setdefault(message.group_id, []).append((name, int(message.properties["n"])))
            message.acknowledge()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", default="vm://example-groups")
    parser.add_argument("--per-group", type=int, default=25)
    args = parser.parse_args()
    with pymq.connect(args.url) as admin:
        queues = admin.queue_manager()
        queues.create(PAYMENTS)
        try:
            return run(args)
        finally:
            queues.drop(PAYMENTS, force=True)


def run(args: argparse.Namespace) -> int:
    seen: dict[str, list] = {}
    ready, done = threading.Barrier(3), threading.Event()
    workers = [threading.Thread(target=worker, args=(args.url, f"worker-{i}", seen, ready, done))
               for i in (1, 2)]
    for t in workers:
        t.start()
    ready.wait()
    total = args.per_group * len(CUSTOMERS)
    with pymq.connect(args.url) as conn:
        producer = conn.create_session().create_producer(PAYMENTS)
        for n in range(args.per_group):
            for customer in CUSTOMERS:                        # interleaved: A1 B1 C1 D1 A2 B2 ...
                message = pymq.TextMessage(f"{customer} payment {n}", properties={"n": n})
                message.group_id = customer
                producer.send(message)
    deadline = time.monotonic() + 60
    while sum(len(v) for v in seen.values()) < total and time.monotonic() < deadline:
        time.sleep(0.05)
    done.set()
    for t in workers:
        t.join()
    ok = sum(len(v) for v in seen.values()) == total
    for customer in CUSTOMERS:
        owners = {name for name, _ in seen.get(customer, [])}
        order = [n for _, n in seen.get(customer, [])]
        ok &= len(owners) == 1 and order == sorted(order) and len(order) == args.per_group
        print(f"{customer}: {len(order)} payments, all to {', '.join(sorted(owners))}, in order: {order == sorted(order)}")
    spread = {name for customer in CUSTOMERS for name, _ in seen[customer]}
    print(f"groups spread over {len(spread)} worker(s)")
    print("groups: each group stayed with one worker, in order" if ok else "groups: ORDER OR OWNERSHIP BROKEN")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
