"""Temporary destinations across a takeover (spec/ha.md §4.7): a requester's reply queue keeps its global name.

A live/backup pair over one store (a shared directory, PostgreSQL); the requester and the responder use the
Python SDK with a failover URL naming both. The responder got the request, with its ``reply-to``, from the
live; the live is killed with SIGKILL; the requester's SDK reconnects to the new live and re-claims its
temporaries' names with the token the old live gave (the key that signs it is in the shared store's
catalog); the reply the responder sends to the old name afterwards arrives. Without the re-claim the new
live knew no such name and refused the reply (unknown-destination).
"""
from __future__ import annotations

import socket
import threading
import uuid

import pymq

FAST = "initialReconnectDelay=50&maxReconnectDelay=400&jitter=0"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_a_reply_to_a_temporary_queue_arrives_across_a_kill_9_of_the_live(group):
    ports = [_free_port(), _free_port()]
    live = group.start("A", "--port", str(ports[0]))
    live.wait_live()
    backup = group.start("B", "--port", str(ports[1]))
    backup.wait_backup()
    url = f"failover:(stomp://127.0.0.1:{ports[0]},stomp://127.0.0.1:{ports[1]})?{FAST}"
    service = pymq.Queue(f"svc-{uuid.uuid4().hex[:6]}")
    resumed = threading.Event()
    events: list = []

    def heard(event) -> None:  # noqa: ANN001
        events.append(event)
        if event.kind == "resumed":
            resumed.set()

    with pymq.connect(url) as requester, pymq.connect(url) as responder:
        requester.set_transport_listener(heard)
        session = requester.create_session()
        replies = session.create_temporary_queue()
        answers = session.create_consumer(replies)
        session.create_producer(service).send(session.create_text_message("question", reply_to=replies))
        request = responder.create_session().create_consumer(service).receive(10)
        assert request is not None and request.reply_to.name.startswith("tmp.")

        live.kill()
        backup.wait_live(timeout=60)
        assert resumed.wait(60), events
        assert [e.kind for e in events] == ["interrupted", "resumed"] and events[1].temporaries == ()
        # ``resumed`` means the replay was sent; the new live makes the reply queue again when it reads the
        # replayed SUBSCRIBE, and a reply before that is refused (spec/ha.md §4.7, as a restart or takeover
        # keeps no temporaries). A SEND that waits for its receipt on the requester's own link comes after
        # the replay on that link, so once it is answered the queue exists (the reply raced it before, and
        # was refused about once in a whole-suite run under load).
        session.create_producer(pymq.Queue(f"sync-{uuid.uuid4().hex[:6]}")).send("after the replay")
        responder.create_session().create_producer(request.reply_to).send("answer")   # waits for its own link
        got = answers.receive(10)
        assert got is not None and got.text == "answer"
