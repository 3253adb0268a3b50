"""Request/reply: a pricing service answers requests on a queue; a client asks and waits for each answer.

    client ── request (reply-to: a temporary queue, correlation-id) ──▶ /queue/prices ──▶ service
    client ◀── reply (same correlation-id) ── temporary queue ◀──────────────────────────── service

Run it:  python examples/request_reply.py [--url stomp://127.0.0.1:61613]

Without ``--url`` it uses an in-process broker (``vm://``), so it needs nothing running.  The service
runs in a thread with a message listener and answers with ``pymq.reply``, which sends to the request's
``reply-to`` with its correlation id; the client's ``pymq.Requestor`` creates the temporary queue and
matches the answer.  Any STOMP client can play either side: the headers are ``reply-to`` and
``correlation-id`` (spec/stomp.md).
"""
from __future__ import annotations

import argparse
import sys
import uuid

import pymq

PRICES = {"apple": 0.40, "pear": 0.55, "plum": 0.25}
# this run's own request queue: on a shared broker another service's "prices" is left alone; created
# first, dropped at the end (the replies go to the requestor's temporary queue, gone with its connection)
REQUESTS = pymq.Queue(f"example-prices-{uuid.uuid4().hex[:8]}")


def start_service(conn: pymq.Connection) -> None:
    session = conn.create_session()
    requests = session.create_consumer(REQUESTS)

    def answer(request: pymq.Message) -> None:
        item = request.properties.get("item")
        quantity = int(request.properties.get("quantity", 1))
        if item in PRICES:
            response = pymq.MapMessage({"item": item, "quantity": quantity,
                                        "total": round(PRICES[item] * quantity, 2)})
        else:
            response = pymq.MapMessage({"item": item, "error": "unknown item"})
        pymq.reply(session, request, response)

    requests.set_message_listener(answer)       # runs in the session's dispatcher thread


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", default="vm://example-request-reply")
    args = parser.parse_args()
    with pymq.connect(args.url) as service_conn, pymq.connect(args.url) as client_conn:
        queues = service_conn.queue_manager()
        queues.create(REQUESTS)
        try:
            start_service(service_conn)
            session = client_conn.create_session()
            with pymq.Requestor(session, REQUESTS) as requestor:
                answers = []
                for item, quantity in (("apple", 3), ("plum", 10), ("kiwi", 1)):
                    answer = requestor.request(pymq.TextMessage("quote", properties={"item": item,
                                                                                     "quantity": quantity}),
                                               timeout=10)
                    answers.append(answer.body)
                    print(f"{quantity} x {item}: {answer.body}")
        finally:
            queues.drop(REQUESTS, force=True)
    ok = answers[0]["total"] == 1.2 and answers[1]["total"] == 2.5 and answers[2]["error"] == "unknown item"
    print("request/reply: all answers matched their requests" if ok else "request/reply: WRONG ANSWERS")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
