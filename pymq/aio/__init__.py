"""pymq for asyncio: the JMS-style API of :mod:`pymq` with ``await`` where it waits.

    import pymq, pymq.aio

    async with pymq.aio.connect("stomp://127.0.0.1:61613") as conn:     # or "vm://default"
        session = conn.create_session()
        await session.create_producer(pymq.Queue("orders")).send("hello")
        consumer = await session.create_consumer(pymq.Queue("orders"))
        print((await consumer.receive(timeout=5)).text)

Same objects, parameters, constants (``pymq.AUTO_ACKNOWLEDGE``...), messages, destinations and errors as
the blocking SDK, over the same sans-IO STOMP core; ``stomp://`` runs on an ``asyncio.Protocol`` and
``vm://name`` reaches the same in-process broker the blocking SDK uses.  Coroutines: connecting,
``start``/``stop``/``close`` of everything, creating consumers (they wait for the broker's receipt),
``send``, ``receive``, ``commit``/``rollback``/``recover``/``acknowledge``, ``unsubscribe``, browsing,
range reads (``read_range``/``bounds``/``ack_upto``), ``create_queue`` (with settings it creates the
queue on the broker), ``request`` and ``reply``, every operation of ``conn.queue_manager()``
(:class:`AsyncQueueManager`), and ``send(..., transaction=db)`` in the application's own database
transaction (SQLAlchemy ``Connection``/``Session`` or their asyncio ``AsyncConnection``/``AsyncSession``).
Plain calls: ``create_session``, ``queue_manager``, ``create_producer``, ``create_browser``,
``create_temporary_queue``, ``create_temporary_topic``, ``create_topic``, the ``create_*_message`` factories,
``set_message_listener``, ``set_transport_listener``, ``TemporaryQueue.delete()`` and
``Message.acknowledge()`` (an ACK needs no answer).  Both SDKs are shells over one client core
(:mod:`pymq.client._core`), so their acknowledgement, transaction and redelivery-order rules are the same
code, and the blocking shell is generated from this one (``tools/unasync.py``); tests/client/test_sdk_surfaces.py
keeps the two surfaces the same (names, parameters, docstrings), ``await`` being the only difference.
A failover URL (``failover:(stomp://a,stomp://b)?options``, spec/ha.md §4) follows the group's brokers,
as the blocking SDK does.

Thread and task safety:
* Everything here belongs to the event loop that opened the connection and is not thread-safe; from
  another thread use ``asyncio.run_coroutine_threadsafe``.  (The blocking ``pymq.Connection`` is the
  thread-safe one.)
* An :class:`AsyncConnection` is shared freely by the tasks of its loop.
* An :class:`AsyncSession` and its producers, consumers and browsers are used by one task at a time: a
  second task calling into the session while the first is suspended inside it (awaiting a receipt or a
  message) gets :class:`~pymq.errors.IllegalStateError` at once.  Use one session per task.
* Message listeners (plain functions or coroutine functions) run in the session's own dispatcher task,
  one message at a time, and may use their own session; ``close()`` waits for a running listener (up
  to the connection's timeout) and ends the dispatcher.
* The exception listener (plain or async) is called once when the connection is lost, not on ``close()``.
"""
from pymq.client._core import (AUTO_ACKNOWLEDGE, CLIENT_ACKNOWLEDGE, DUPS_OK_ACKNOWLEDGE, SESSION_TRANSACTED,
                               AckMode, ConnectionStatus, RangeResult, TransportEvent)
from pymq.client.url import TlsOptions
from pymq.aio.client import (AsyncConnection, AsyncConnectionFactory, AsyncMessageConsumer,
                             AsyncMessageProducer, AsyncQueueBrowser, AsyncQueueManager, AsyncRequestor,
                             AsyncSession, connect, reply)

Requestor = AsyncRequestor

__all__ = [
    "connect", "AsyncConnectionFactory", "AsyncConnection", "AsyncSession", "AsyncMessageProducer",
    "AsyncMessageConsumer", "AsyncQueueBrowser", "AsyncRequestor", "Requestor", "reply", "AsyncQueueManager",
    "ConnectionStatus", "AckMode", "RangeResult", "TlsOptions", "TransportEvent",
    "AUTO_ACKNOWLEDGE", "CLIENT_ACKNOWLEDGE", "DUPS_OK_ACKNOWLEDGE", "SESSION_TRANSACTED",
]
