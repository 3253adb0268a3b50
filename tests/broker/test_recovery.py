"""Recovery of what a restart finds in storage (server/broker/recovery.py)."""
from __future__ import annotations

import uuid

import pymq


def test_a_message_for_an_unknown_queue_is_kept_in_recovered(broker_factory, tmp_path):
    """A stored message whose queue the catalog no longer names (here: a durable subscription whose
    record is gone) is kept in /queue/recovered, and the broker starts."""
    data = str(tmp_path / "data")
    first = broker_factory(data_dir=data)
    topic = pymq.Topic(f"orphans-{uuid.uuid4().hex[:6]}")
    with pymq.connect(first.url, client_id="keeper") as conn:
        session = conn.create_session()
        session.create_durable_subscriber(topic, "kept").close()
        session.create_producer(topic).send("orphan")
    key = "sub:keeper:kept"
    first.call(lambda: first.broker.store.put_meta("dsub:" + key, None))   # the record goes, the message stays
    first.stop()
    second = broker_factory(data_dir=data)
    with pymq.connect(second.url) as conn:
        got = conn.create_session().create_consumer(pymq.Queue("recovered")).receive(5)
    assert got is not None and got.text == "orphan"
