"""A small pipeline with the pymq Spark connector.

    orders ──▶ /queue/example-orders-<run> ──▶ Spark streaming query: running totals per customer
                                                                ──▶ /topic/example-order-totals-<run>
                                                                                          │
                                                        a Python consumer prints them ◀───┘

Run it:  python examples/spark_orders_pipeline.py [--url stomp://127.0.0.1:61613] [--orders 200]

Without ``--url`` it starts a ``pymq-server`` of its own (free port, temporary data directory) and stops
it at the end.  Needs the ``spark`` extra (``pip install -e ".[spark]"``) and Java 17+.

What it shows: the query *consumes* the orders queue (``mode=consume``: each order is acknowledged only
once the micro-batch that counted it is committed, so a crash never loses one), keeps per-customer totals
as Spark state (checkpointed), and after each micro-batch sends the whole totals table to a topic
(``outputMode("complete")``: PySpark's Python sinks have no "update" mode) with ``dedup=true``, so a
micro-batch replayed after a crash does not publish its totals twice.  The consumer is plain pymq and
keeps the latest total per customer.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import re
import subprocess
import sys
import tempfile
import time
import uuid

import pymq

# this run's own queue and topic: on a shared broker (--url) another program's "orders" is left alone (and
# not consumed); the queue is created first and dropped at the end, the topic (created by use) goes once idle
RUN = uuid.uuid4().hex[:8]
ORDERS, TOTALS = f"example-orders-{RUN}", f"example-order-totals-{RUN}"


def start_broker(work: str) -> tuple[subprocess.Popen, str]:
    log_path = os.path.join(work, "broker.log")
    with open(log_path, "w") as log:             # a file, not a pipe: nobody has to keep reading it
        proc = subprocess.Popen([sys.executable, "-m", "pymq_server", "--port", "0", "--data-dir",
                                 os.path.join(work, "broker")], stderr=log)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and proc.poll() is None:
        with open(log_path) as log:
            found = re.search(r"listening on ([\d.]+):(\d+)", log.read())
        if found:
            return proc, f"stomp://{found.group(1)}:{found.group(2)}"
        time.sleep(0.1)
    proc.kill()
    raise RuntimeError(f"pymq-server did not start; see {log_path}")


def send_orders(url: str, count: int) -> dict[str, float]:
    """Orders as JSON text messages, grouped by customer (JMSXGroupID); returns the expected totals."""
    rng = random.Random(7)
    totals: dict[str, float] = {}
    with pymq.connect(url) as conn:
        session = conn.create_session(transacted=True)
        producer = session.create_producer(pymq.Queue(ORDERS))
        for i in range(count):
            customer = f"customer-{rng.randint(1, 5)}"
            amount = round(rng.uniform(5, 500), 2)
            totals[customer] = round(totals.get(customer, 0.0) + amount, 2)
            order = pymq.TextMessage(json.dumps({"order": i, "customer": customer, "amount": amount}))
            order.group_id = customer
            producer.send(order)
        session.commit()                            # all orders visible at once
    return totals


def run_query(url: str, checkpoint: str) -> None:
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F

    spark = (SparkSession.builder.master("local[2]").appName("pymq-orders")
             .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
             .config("spark.sql.shuffle.partitions", "2").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    orders = (spark.readStream.format("pymq")          # found without register(): pyspark_pymq
              .option("url", url).option("queue", ORDERS).option("mode", "consume")
              .option("maxMessagesPerTrigger", "100").load()
              .select(F.from_json(F.col("value").cast("string"),
                                  "order INT, customer STRING, amount DOUBLE").alias("o"))
              .select("o.*"))
    totals = (orders.groupBy("customer")
              .agg(F.round(F.sum("amount"), 2).alias("total"), F.count("*").alias("orders"))
              .select(F.col("customer").alias("key"),
                      F.to_json(F.struct("customer", "total", "orders")).alias("value")))
    query = (totals.writeStream.format("pymq").option("url", url).option("topic", TOTALS)
             .option("dedup", "true").outputMode("complete").option("checkpointLocation", checkpoint)
             .trigger(availableNow=True).start())
    query.awaitTermination()
    spark.stop()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", help="a running broker (default: start one)")
    parser.add_argument("--orders", type=int, default=200)
    args = parser.parse_args()
    work = tempfile.mkdtemp(prefix="pymq-orders-")
    broker = None
    url = args.url
    if url is None:
        broker, url = start_broker(work)
    try:
        with pymq.connect(url) as conn:
            queues = conn.queue_manager()
            queues.create(ORDERS)
            try:
                totals_topic = conn.create_session().create_consumer(pymq.Topic(TOTALS))
                expected = send_orders(url, args.orders)
                print(f"sent {args.orders} orders to /queue/{ORDERS}; running the Spark query ...")
                run_query(url, os.path.join(work, "checkpoint"))
                latest: dict[str, dict] = {}
                while (message := totals_topic.receive(timeout=2.0)) is not None:
                    total = json.loads(message.text)
                    latest[total["customer"]] = total
                    print(f"  {message.group_id}: {total['orders']} orders, total {total['total']:.2f}")
            finally:
                queues.drop(ORDERS, force=True)
        ok = {c: t["total"] for c, t in latest.items()} == expected
        print("totals match what was sent" if ok else f"MISMATCH: expected {expected}")
        return 0 if ok else 1
    finally:
        if broker is not None:
            broker.terminate()
            broker.wait(30)


if __name__ == "__main__":
    sys.exit(main())
