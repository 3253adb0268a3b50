"""A message sent in the application's own database transaction is seen only after it commits (seed 001)."""
from __future__ import annotations

import uuid

import pytest
import sqlalchemy as sa
from sqlalchemy.orm import Session

import pymq
import pymq.aio
from tests.storage.services import postgres_url  # noqa: F401 - fixture


def _storage(url):
    return {"devices": {"memory": {"kind": "memory"}, "file": {"kind": "file"},
                        "db": {"kind": "sql", "url": url}},
            "persistent_device": "file"}


def _exercise(broker, app_engine):
    orders = sa.Table(f"orders_{uuid.uuid4().hex[:6]}", sa.MetaData(),
                      sa.Column("id", sa.Integer, primary_key=True), sa.Column("item", sa.String(50)))
    orders.create(app_engine)
    queue = pymq.Queue(f"shipping-{uuid.uuid4().hex[:6]}")
    with pymq.connect(broker.url) as conn:
        s = conn.create_session()
        p = s.create_producer(queue)
        c = s.create_consumer(queue)
        # committed: the order row and the message together
        with app_engine.begin() as db:
            db.execute(orders.insert().values(id=1, item="book"))
            p.send(pymq.TextMessage("ship order 1", properties={"order": 1}), transaction=db)
            assert c.receive(0.3) is None            # not visible before the commit
        got = c.receive(5)
        assert got is not None and got.text == "ship order 1" and got.properties["order"] == 1
        # rolled back: neither the row nor the message
        with pytest.raises(RuntimeError):
            with Session(app_engine) as orm, orm.begin():
                orm.execute(orders.insert().values(id=2, item="pen"))
                p.send("ship order 2", transaction=orm)
                raise RuntimeError("application failure")
        assert c.receive(0.5) is None
        with app_engine.connect() as db:
            assert db.execute(sa.select(sa.func.count()).select_from(orders)).scalar() == 1


def test_sqlite_embedded(broker_factory, tmp_path):
    url = f"sqlite:///{tmp_path / 'app.sqlite3'}"
    broker = broker_factory(storage=_storage(url))
    _exercise(broker, sa.create_engine(url))


def test_postgresql(broker_factory, postgres_url):  # noqa: F811
    broker = broker_factory(storage=_storage(postgres_url), node_id=f"b{uuid.uuid4().hex[:6]}")
    _exercise(broker, sa.create_engine(postgres_url))


@pytest.mark.parametrize("shell", ["blocking", "aio"])
def test_a_broker_with_another_table_prefix_gets_the_row(broker_factory, tmp_path, shell):
    """The SQL device's ``table_prefix`` (here ``shop_``): the broker names it in CONNECTED and the SDK writes
    the pending row into that device's table, which this broker claims (on main the row went to ``pymq_``'s
    table, which nobody claims, and the message was never delivered)."""
    url = f"sqlite:///{tmp_path / 'app.sqlite3'}"
    storage = _storage(url)
    storage["devices"]["db"]["table_prefix"] = "shop_"
    broker = broker_factory(storage=storage)
    engine = sa.create_engine(url)
    queue = pymq.Queue(f"prefixed-{shell}")
    with pymq.connect(broker.url) as conn:
        assert conn.apptx_table_prefix == "shop_"
        consumer = conn.create_session().create_consumer(queue)
        if shell == "blocking":
            with engine.begin() as db:
                conn.create_session().create_producer(queue).send("in shop_", transaction=db)
        else:
            import asyncio

            async def send() -> None:
                async with pymq.aio.connect(broker.url) as aconn:
                    assert aconn.apptx_table_prefix == "shop_"
                    with engine.begin() as db:
                        await aconn.create_session().create_producer(queue).send("in shop_", transaction=db)
            asyncio.run(send())
        got = consumer.receive(5)
        assert got is not None and got.text == "in shop_"
    tables = sa.inspect(engine).get_table_names()
    assert "shop_pending" in tables or any(t.startswith("shop_") for t in tables)
    assert "pymq_pending" not in tables
