"""Selectors: each consumer takes only the messages whose properties match its JMS selector.

    producer ──▶ /queue/orders ──┬─ "region = 'EU' AND amount >= 100"   big European orders
                                 ├─ "region = 'US'"                     every American order
                                 └─ (no selector)                       whatever the others left
    producer ──▶ /topic/alerts ──▶ subscriber with "severity IN ('high', 'critical')"

Run it:  python examples/selector_routing.py [--url stomp://127.0.0.1:61613]

Selectors are SQL-92 conditions over message properties and headers (spec/selector.md): ``=``, ``<>``,
``<``, ``BETWEEN``, ``IN``, ``LIKE``, ``IS NULL``, ``AND``/``OR``/``NOT``, arithmetic.  On a queue a
message stays until some consumer's selector takes it; on a topic each subscriber gets its own matching
copy.  A selector the broker cannot parse is refused when the consumer is created, with the position.
"""
from __future__ import annotations

import argparse
import sys
import uuid

import pymq
from pymq.errors import InvalidSelector

# this run's own queue and topic: on a shared broker another program's "orders" is left alone (and not
# drained); the queue is created first and dropped at the end, the topic (created by use) goes once idle
RUN = uuid.uuid4().hex[:8]
ORDERS, ALERTS = pymq.Queue(f"example-orders-{RUN}"), pymq.Topic(f"example-alerts-{RUN}")


def drain(consumer: pymq.MessageConsumer) -> list[str]:
    out = []
    while (message := consumer.receive(timeout=0.5)) is not None:
        out.append(message.text)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", default="vm://example-selectors")
    args = parser.parse_args()
    orders = [("o1", "EU", 250), ("o2", "US", 40), ("o3", "EU", 20), ("o4", "APAC", 900), ("o5", "US", 300),
              ("o6", "EU", 100)]
    with pymq.connect(args.url) as conn:
        queues = conn.queue_manager()
        queues.create(ORDERS)
        try:
            return route(conn, orders)
        finally:
            queues.drop(ORDERS, force=True)


def route(conn: pymq.Connection, orders: list[tuple[str, str, int]]) -> int:
    session = conn.create_session()
    big_eu = session.create_consumer(ORDERS, "region = 'EU' AND amount >= 100")
    us = session.create_consumer(ORDERS, "region = 'US'")
    alerts = session.create_consumer(ALERTS, "severity IN ('high', 'critical')")
    producer = session.create_producer()
    for name, region, amount in orders:
        producer.send(pymq.TextMessage(name, properties={"region": region, "amount": amount}),
                      ORDERS)
    for severity in ("low", "high", "medium", "critical"):
        producer.send(pymq.TextMessage(f"{severity} alert", properties={"severity": severity}),
                      ALERTS)
    got_eu, got_us, got_alerts = drain(big_eu), drain(us), drain(alerts)
    rest = drain(session.create_consumer(ORDERS))
    print("big EU orders:", got_eu)
    print("US orders:    ", got_us)
    print("the rest:     ", rest)
    print("alerts:       ", got_alerts)
    try:
        session.create_consumer(ORDERS, "amount >> 3")
    except InvalidSelector as exc:
        print("refused selector:", exc.message)
    ok = (got_eu == ["o1", "o6"] and got_us == ["o2", "o5"] and sorted(rest) == ["o3", "o4"]
          and got_alerts == ["high alert", "critical alert"])
    print("selectors: every message went where its selector said" if ok else "selectors: WRONG ROUTING")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
