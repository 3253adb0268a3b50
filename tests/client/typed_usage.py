"""A user's script over the SDKs' public API, for the type checker only (tests/client/test_typing.py runs
``mypy --strict --disallow-any-expr`` on it; it is never executed).  Every expression must have a
precise type: an ``Any`` anywhere here is an ``Any`` leaking out of the SDK.  The ``reveal_type``
lines are compared with what the test expects."""
# ruff: noqa: F821 - reveal_type is mypy's built-in here (typing.reveal_type needs Python 3.11)
from __future__ import annotations

import ssl

import pymq
import pymq.aio
from pymq.errors import PymqError, TimeoutError


def blocking() -> None:
    with pymq.connect("stomp://alice:secret@127.0.0.1:61613", timeout=5.0) as conn:
        reveal_type(conn)
        conn.exception_listener = lambda error: print(error.message)
        session = conn.create_session(ack_mode=pymq.CLIENT_ACKNOWLEDGE)
        reveal_type(session)
        queue = pymq.Queue("orders")
        producer = session.create_producer(queue)
        producer.priority = 7
        sent = producer.send("hello", delivery_mode=pymq.NON_PERSISTENT, time_to_live=60_000)
        reveal_type(sent)
        producer.send(b"\x00raw")
        producer.send({"n": 1, "ok": True, "name": "x", "raw": b"\x01", "nothing": None})
        producer.send(pymq.TextMessage("typed", properties={"n": 1, "ratio": 0.5}, correlation_id="c1"))
        consumer = session.create_consumer(queue, "n > 0", prefetch=10)
        reveal_type(consumer)
        message = consumer.receive(timeout=1.0)
        reveal_type(message)
        if isinstance(message, pymq.TextMessage):
            text: str = message.text
            print(text, message.get_property("n"), message.redelivered, message.delivery_count)
        elif isinstance(message, pymq.MapMessage):
            print(message["n"], message.body)
        if message is not None:
            message.acknowledge()
        session.acknowledge()
        session.recover()
        consumer.set_message_listener(lambda m: print(m.message_id))
        consumer.close()
        durable = session.create_durable_consumer(pymq.Topic("prices"), "sub-1")
        durable.close()
        session.unsubscribe("sub-1")
        browser = session.create_browser(queue)
        reveal_type(browser.messages())
        for seen in browser:
            print(seen.priority)
        result = session.read_range(queue, from_seq=0, max_messages=10)
        reveal_type(result)
        print(result.messages, result.next_seq, session.bounds(queue))
        session.ack_upto(queue, result.next_seq)
        tx = conn.create_session(transacted=True)
        tx.create_producer().send("in tx", queue)
        tx.commit()
        tx.rollback()
        requestor = pymq.Requestor(session, pymq.Queue("service"))
        try:
            answer = requestor.request("ping", timeout=2.0)
            reveal_type(answer)
            pymq.reply(session, answer, "pong")
        except TimeoutError as exc:
            print(exc.message)
        finally:
            requestor.close()
        manager = conn.queue_manager()
        created = manager.create("jobs", max_deliveries=5)
        reveal_type(created)
        reveal_type(manager.purge("jobs"))
        reveal_type(manager.list())
        reveal_type(session.create_queue("audit", max_depth=100))
        print(conn.status is pymq.ConnectionStatus.OPEN, conn.user, conn.error)
    factory = pymq.ConnectionFactory("stomps://broker:61614?ca_file=/ca.pem", tls=pymq.TlsOptions(verify=True))
    try:
        factory.create_connection("bob", "pw").close()
    except PymqError as error:
        print(error.code)
    pymq.connect("stomps://broker", tls=ssl.create_default_context()).close()


async def asynchronous() -> None:
    async with pymq.aio.connect("vm://typed", username="guest") as conn:
        reveal_type(conn)
        session = conn.create_session(transacted=True)
        producer = session.create_producer(pymq.Queue("orders"))
        sent = await producer.send("hello")
        reveal_type(sent)
        consumer = await session.create_consumer(pymq.Queue("orders"))
        reveal_type(consumer)
        message = await consumer.receive(1.0)
        reveal_type(message)
        await session.commit()
        await session.rollback()
        async for received in consumer:
            print(received.message_id)
            break

        async def listener(m: pymq.Message) -> None:
            print(m.priority)

        consumer.set_message_listener(listener)
        browser = session.create_browser(pymq.Queue("orders"))
        reveal_type(await browser.messages())
        async for seen in browser:
            print(seen.timestamp)
        result = await session.read_range(pymq.Queue("orders"), from_seq=1)
        reveal_type(result)
        async with pymq.aio.AsyncRequestor(session, "/queue/service") as requestor:
            answer = await requestor.request({"q": 1}, timeout=1.0)
            reveal_type(answer)
            await pymq.aio.reply(session, answer, "pong")
        manager = conn.queue_manager()
        reveal_type(await manager.create("jobs", max_depth=10))
        reveal_type(await manager.drop("jobs"))
        reveal_type(await session.create_queue("audit", max_depth=100))
        reveal_type(session.create_temporary_queue())
        print(conn.status is pymq.aio.ConnectionStatus.OPEN)
