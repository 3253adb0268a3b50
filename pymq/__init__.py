"""pymq: a JMS-style message broker and SDK speaking STOMP.

    import pymq
    with pymq.connect("stomp://127.0.0.1:61613") as conn:      # or "vm://default": in-process broker
        session = conn.create_session()
        session.create_producer(pymq.Queue("orders")).send("hello")
        print(session.create_consumer(pymq.Queue("orders")).receive(timeout=5).body)

Thread-safety follows JMS: ``Connection`` is thread-safe; a ``Session`` and its producers, consumers
and browsers are used by one thread at a time (a second thread gets ``IllegalStateError``).
"""
from pymq.client.blocking import (AUTO_ACKNOWLEDGE, CLIENT_ACKNOWLEDGE, DUPS_OK_ACKNOWLEDGE,
                                  SESSION_TRANSACTED, Connection, ConnectionFactory, MessageConsumer,
                                  MessageProducer, QueueBrowser, RangeResult, Requestor, Session, connect, reply)
from pymq.destination import Destination, Queue, TemporaryQueue, Topic
from pymq.errors import PymqError
from pymq.message import (NON_PERSISTENT, PERSISTENT, BytesMessage, MapMessage, Message, TextMessage)

__version__ = "0.1.0"

__all__ = [
    "connect", "ConnectionFactory", "Connection", "Session", "MessageProducer", "MessageConsumer",
    "QueueBrowser", "Requestor", "reply",
    "Destination", "Queue", "Topic", "TemporaryQueue",
    "Message", "TextMessage", "BytesMessage", "MapMessage",
    "AUTO_ACKNOWLEDGE", "CLIENT_ACKNOWLEDGE", "DUPS_OK_ACKNOWLEDGE", "SESSION_TRANSACTED",
    "PERSISTENT", "NON_PERSISTENT", "PymqError",
]
