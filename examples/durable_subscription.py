"""Durable subscriptions: a subscriber that goes away keeps receiving — the broker holds what is published
to the topic while it is gone and delivers it when it comes back under the same client id and name.

    publisher ──▶ /topic/news ──┬─▶ durable subscription "archive" (client id "archiver"): keeps everything
                                └─▶ plain subscriber: only what is published while it is connected

Run it:  python examples/durable_subscription.py [--url stomp://127.0.0.1:61613]

A durable subscription is named by (client id, subscription name); persistent messages for it survive a
broker restart too.  ``session.unsubscribe(name)`` removes it.  Shared subscriptions
(``create_shared_durable_consumer``) split one subscription's messages between several consumers.
"""
from __future__ import annotations

import argparse
import sys
import uuid

import pymq

# this run's own topic and client id: on a shared broker another program's "news" is left alone; the
# durable subscription is removed at the end and the topic, created by use, goes once idle
RUN = uuid.uuid4().hex[:8]
NEWS, ARCHIVER = pymq.Topic(f"example-news-{RUN}"), f"archiver-{RUN}"


def read_all(consumer: pymq.MessageConsumer) -> list[str]:
    out = []
    while (message := consumer.receive(timeout=0.5)) is not None:
        out.append(message.text)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", default="vm://example-durable")
    args = parser.parse_args()
    with pymq.connect(args.url) as publisher_conn:
        publish = publisher_conn.create_session().create_producer(NEWS)

        # 1. the archiver subscribes durably, reads one item, and disconnects
        with pymq.connect(args.url, client_id=ARCHIVER) as conn:
            archive = conn.create_session().create_durable_consumer(NEWS, "archive")
            publish.send("morning edition")
            first = read_all(archive)
        print("archiver, first visit:", first)

        # 2. news while it is away: a plain subscriber sees only what comes while it listens
        with pymq.connect(args.url) as conn:
            live = conn.create_session().create_consumer(NEWS)
            publish.send("noon edition")
            publish.send("evening edition")
            live_seen = read_all(live)
        publish.send("late edition")                          # nobody but the durable subscription
        print("plain subscriber saw:  ", live_seen)

        # 3. the archiver comes back under the same client id and subscription name
        with pymq.connect(args.url, client_id=ARCHIVER) as conn:
            session = conn.create_session()
            archive = session.create_durable_consumer(NEWS, "archive")
            caught_up = read_all(archive)
            archive.close()
            session.unsubscribe("archive")                    # done with it: the broker forgets it
        print("archiver, second visit:", caught_up)
    ok = (first == ["morning edition"] and live_seen == ["noon edition", "evening edition"]
          and caught_up == ["noon edition", "evening edition", "late edition"])
    print("durable: nothing was lost while the subscriber was away" if ok else "durable: MESSAGES MISSING")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
