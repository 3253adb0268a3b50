"""What ``pymq.aio`` gained to match the blocking SDK (issue 9 item 5), used end to end: the queue manager,
``create_queue`` with settings, and ``send(..., transaction=db)`` in the application's own database
transaction (SQLAlchemy's synchronous Connection and Session, and its asyncio AsyncConnection and
AsyncSession on PostgreSQL).  test_sdk_surfaces.py checks the two surfaces match; this checks they work.
"""
from __future__ import annotations

import asyncio
import functools
import uuid

import pytest
import sqlalchemy as sa
from sqlalchemy.orm import Session

import pymq
import pymq.aio
from pymq.errors import ConfigError, DestinationExists, IllegalStateError, UnknownDestination
from tests.storage.services import postgres_url  # noqa: F401 - fixture


def aio(fn):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        asyncio.run(asyncio.wait_for(fn(*args, **kwargs), 60))
    return wrapper


def _name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


@aio
async def test_queue_manager_operations(broker):
    async with pymq.aio.connect(broker.url) as conn:
        manager = conn.queue_manager()
        name = _name("managed")
        queue = await manager.create(name, max_deliveries=3, default_priority=6)
        assert queue == pymq.Queue(name)
        assert await manager.create(name, max_deliveries=3, default_priority=6) == queue    # the same: no-op
        with pytest.raises(DestinationExists, match="max_deliveries: 3 != 5"):
            await manager.create(name, max_deliveries=5, default_priority=6)
        with pytest.raises(ConfigError, match="unknown queue"):
            await manager.create(_name("typo"), max_deliverys=3)
        info = await manager.info(name)
        assert info["config"]["max_deliveries"] == 3 and info["declared"]
        assert any(q["name"] == name for q in await manager.list())
        assert f"/queue/{name}" in (await manager.destinations())["queues"]
        producer = conn.create_session().create_producer(queue)
        for i in range(3):
            await producer.send(f"m{i}")
        assert (await manager.metrics(name))["depth"] == 3
        assert await manager.purge(name) == 3
        await producer.send("left")
        consumer_session = conn.create_session()
        await consumer_session.create_consumer(pymq.Queue(name), "nothing = 1")      # attached, takes nothing
        with pytest.raises(IllegalStateError, match="consumer"):
            await manager.drop(name)                          # a consumer is attached: only with force
        assert await manager.drop(name, force=True) == 1
        with pytest.raises(UnknownDestination):
            await manager.info(name)
        assert conn.error is None


@aio
async def test_create_queue_with_settings_creates_it_on_the_broker(broker):
    async with pymq.aio.connect(broker.url) as conn:
        session = conn.create_session()
        plain = await session.create_queue(_name("value"))        # no settings: only a value
        assert isinstance(plain, pymq.Queue)
        assert plain.name not in [q["name"] for q in await conn.queue_manager().list()]
        name = _name("configured")
        queue = await session.create_queue(name, max_deliveries=2)
        assert (await conn.queue_manager().info(name))["config"]["max_deliveries"] == 2
        assert await session.create_queue(name, max_deliveries=2) == queue
        with pytest.raises(DestinationExists):
            await session.create_queue(name, max_deliveries=4)
        await session.close()
        with pytest.raises(IllegalStateError, match="session is closed"):
            await session.create_queue(_name("late"), max_deliveries=2)


def _storage(url: str) -> dict:
    return {"devices": {"memory": {"kind": "memory"}, "file": {"kind": "file"}, "db": {"kind": "sql", "url": url}},
            "persistent_device": "file"}


async def _received(consumer: pymq.aio.AsyncMessageConsumer, timeout: float) -> str | None:
    message = await consumer.receive(timeout)
    return message.text if isinstance(message, pymq.TextMessage) else None


def test_send_in_a_sync_database_transaction_sqlite(broker_factory, tmp_path):
    """SQLite, the application's synchronous Connection and ORM Session, from asyncio code."""
    url = f"sqlite:///{tmp_path / 'app.sqlite3'}"
    broker = broker_factory(storage=_storage(url))
    engine = sa.create_engine(url)

    async def main() -> None:
        queue = pymq.Queue(_name("shipping"))
        async with pymq.aio.connect(broker.url) as conn:
            session = conn.create_session()
            producer = session.create_producer(queue)
            consumer = await session.create_consumer(queue)
            with engine.begin() as db:
                sent = await producer.send(pymq.TextMessage("one"), transaction=db)
                assert sent.destination == queue
                assert await _received(consumer, 0.3) is None      # not before the commit
            assert await _received(consumer, 5) == "one"
            with pytest.raises(RuntimeError):
                with Session(engine) as orm, orm.begin():
                    await producer.send("never", transaction=orm)
                    raise RuntimeError("the application fails: its transaction rolls back")
            with Session(engine) as orm, orm.begin():
                await producer.send("two", transaction=orm)
            assert await _received(consumer, 5) == "two"
            assert await _received(consumer, 0.3) is None
    asyncio.run(asyncio.wait_for(main(), 60))


def test_send_in_an_asyncio_database_transaction_postgresql(broker_factory, postgres_url):  # noqa: F811
    """PostgreSQL, the application's SQLAlchemy AsyncConnection and AsyncSession (psycopg's async driver)."""
    from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine

    broker = broker_factory(storage=_storage(postgres_url), node_id=f"b{uuid.uuid4().hex[:6]}")

    async def main() -> None:
        engine = create_async_engine(postgres_url)
        queue = pymq.Queue(_name("billing"))
        try:
            async with pymq.aio.connect(broker.url) as conn:
                session = conn.create_session()
                producer = session.create_producer(queue)
                consumer = await session.create_consumer(queue)
                async with engine.begin() as db:
                    await producer.send("one", transaction=db)
                    assert await _received(consumer, 0.3) is None
                assert await _received(consumer, 5) == "one"
                with pytest.raises(RuntimeError):
                    async with AsyncSession(engine) as orm, orm.begin():
                        await producer.send("never", transaction=orm)
                        raise RuntimeError("rolled back")
                async with AsyncSession(engine) as orm, orm.begin():
                    await producer.send("two", transaction=orm)
                assert await _received(consumer, 5) == "two"
                assert await _received(consumer, 0.3) is None
        finally:
            await engine.dispose()
    asyncio.run(asyncio.wait_for(main(), 60))
