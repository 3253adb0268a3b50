"""pymq: a JMS-style message broker and SDK speaking STOMP.

    import pymq
    with pymq.connect("stomp://127.0.0.1:61613") as conn:      # or "vm://default": in-process broker
        session = conn.create_session()
        session.create_producer(pymq.Queue("orders")).send("hello")
        print(session.create_consumer(pymq.Queue("orders")).receive(timeout=5))

URLs: ``stomp://user:pass@host:port``, ``stomps://host:port?ca_file=ca.pem`` (TLS), ``vm://name``
(:mod:`pymq.client.url`).  Thread-safety follows JMS: ``Connection`` is thread-safe; a ``Session`` and
its producers, consumers and browsers are used by one thread at a time (a second thread gets
``IllegalStateError``).  The asyncio flavour of the same API is :mod:`pymq.aio`.
"""
from pymq.client._core import (AUTO_ACKNOWLEDGE, CLIENT_ACKNOWLEDGE, DUPS_OK_ACKNOWLEDGE, SESSION_TRANSACTED,
                               AckMode, ConnectionStatus, RangeResult, TransportEvent)
from pymq.client.blocking import (Connection, ConnectionFactory, MessageConsumer, MessageProducer, QueueBrowser,
                                  QueueManager, Requestor, Session, connect, reply)
from pymq.client.url import TlsOptions
from pymq.destination import Destination, Queue, TemporaryQueue, TemporaryTopic, Topic
from pymq.errors import PymqError
from pymq.message import NON_PERSISTENT, PERSISTENT, BytesMessage, MapMessage, Message, TextMessage

__version__ = "0.1.0"

__all__ = [
    "connect", "ConnectionFactory", "Connection", "Session", "MessageProducer", "MessageConsumer",
    "QueueBrowser", "Requestor", "reply", "RangeResult", "QueueManager", "TlsOptions", "ConnectionStatus",
    "TransportEvent",
    "AckMode", "Destination", "Queue", "Topic", "TemporaryQueue", "TemporaryTopic",
    "Message", "TextMessage", "BytesMessage", "MapMessage",
    "AUTO_ACKNOWLEDGE", "CLIENT_ACKNOWLEDGE", "DUPS_OK_ACKNOWLEDGE", "SESSION_TRANSACTED",
    "PERSISTENT", "NON_PERSISTENT", "PymqError",
]
