"""The broker places each message on the device its storage rules choose (seed 000), and recovers
every device after a restart."""
from __future__ import annotations

import pytest

import pymq


def _config(tmp_path):
    return {
        "devices": {
            "memory": {"kind": "memory"},
            "file": {"kind": "file"},
            "db": {"kind": "sql", "url": f"sqlite:///{tmp_path / 'db.sqlite3'}"},
        },
        "persistent_device": "file",
        "selection": {
            "strategy": "first-match",
            "default_device": "file",
            "rules": [
                {"id": "big-to-db", "device": "db", "weight": 80, "condition": "SIZE > 2"},
                {"id": "audit-to-file", "device": "file", "weight": 70,
                 "condition": "HEADER('audit').isPresent()"},
                # persistent messages go to memory only because the rule says so explicitly
                {"id": "chatty-to-memory", "device": "memory", "weight": 60,
                 "condition": "DESTINATION_NAME = '/queue/chatty'", "downgrade_durability": True},
            ],
        },
    }


def test_rules_choose_devices_and_restart_recovers_them(broker_factory, tmp_path):
    data = str(tmp_path / "data")
    b1 = broker_factory(data_dir=data, storage=_config(tmp_path))
    with pymq.connect(b1.url) as conn:
        s = conn.create_session()
        p = s.create_producer(pymq.Queue("orders"))
        p.send(b"x" * 5000)                                           # > 2 KB → db
        p.send(pymq.TextMessage("small", properties={"audit": "yes"}))  # header → file
        p.send("plain")                                               # no rule → default (file)
        s.create_producer(pymq.Queue("chatty")).send("gossip")         # → memory
    placements = b1.call(lambda: b1.server.store.placements())
    by_rule = {(p["device"], p["rule"]): p["messages"] for p in placements}
    assert by_rule == {("db", "big-to-db"): 1, ("file", "audit-to-file"): 1, ("file", "default"): 1,
                       ("memory", "chatty-to-memory"): 1}
    b1.stop()
    b2 = broker_factory(data_dir=data, storage=_config(tmp_path))
    with pymq.connect(b2.url) as conn:
        s = conn.create_session()
        c = s.create_consumer(pymq.Queue("orders"))
        got = [c.receive(5) for _ in range(3)]
        assert [m.body if isinstance(m, pymq.TextMessage) else len(m.data) for m in got] == \
            [5000, "small", "plain"]
        # the memory device keeps nothing across a restart: that is what the rule asked for
        assert s.create_consumer(pymq.Queue("chatty")).receive(0.3) is None


def test_rules_change_at_run_time_through_the_admin_interface(broker_factory, tmp_path):
    """The seed's BPM extension: add, change and remove rules without a restart; the next message obeys."""
    broker = broker_factory(data_dir=str(tmp_path / "data"), storage=_config(tmp_path))
    with pymq.connect(broker.url) as conn:
        qm = conn.queue_manager()
        s = conn.create_session()
        p = s.create_producer(pymq.Queue("rt"))
        p.send("before")                                              # default → file
        qm.call("add-rule", id="rt-to-db", device="db", weight=95, condition="DESTINATION_NAME = '/queue/rt'")
        p.send("while the rule exists")                               # → db
        qm.call("replace-rule", id="rt-to-db", device="memory", weight=95,
                condition="DESTINATION_NAME = '/queue/rt'", downgrade_durability=True)
        p.send("after the change")                                    # → memory
        qm.call("remove-rule", id="rt-to-db")
        p.send("after removal")                                       # → file again
        placed = {(x["device"], x["rule"]): x["messages"] for x in qm.call("storage")["placements"]}
        assert placed[("file", "default")] == 2
        assert placed[("db", "rt-to-db")] == 1 and placed[("memory", "rt-to-db")] == 1
        with pytest.raises(pymq.PymqError, match="storage rule error|position"):
            qm.call("add-rule", id="bad", device="db", weight=1, condition="SIZE >")
        with pytest.raises(pymq.PymqError):
            qm.call("add-rule", id="nodev", device="tape", weight=1, condition="SIZE > 1")
