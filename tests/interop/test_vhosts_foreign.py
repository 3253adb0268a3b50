"""Virtual hosts (issue 27 item 2, spec/stomp.md §1) with clients this project did not write: go-stomp (its
Host option) and stompit (its connect headers) select a vhost with CONNECT's host header, a queue of one name
is two queues in two vhosts, a MESSAGE names the destination as the vhost's client does, and an unknown vhost
is refused at CONNECT with access-denied. stomp.py's vhost argument is tests/broker/test_vhosts.py's."""
from __future__ import annotations

import uuid

import pymq
import pytest

from tests.interop import foreign

DRIVERS = [("PYMQ_GO_STOMP", "go-stomp"), ("PYMQ_NODE_STOMP", "stompit")]


@pytest.fixture(params=DRIVERS, ids=[label for _, label in DRIVERS])
def driver(request) -> tuple[list[str], str]:
    variable, label = request.param
    return foreign.driver_argv(variable, f"{label} driver"), label


def test_a_foreign_client_selects_a_vhost_with_its_host_header(broker_factory, driver):
    argv, label = driver
    b = broker_factory(vhosts={"interop": ["*"]})
    name = "vh" + uuid.uuid4().hex[:8]
    clients = []
    try:
        inside, outside = foreign.ForeignClient(argv, label), foreign.ForeignClient(argv, label)
        clients += [inside, outside]
        inside.connect(b.port, "1.2", headers={"host": "/interop"})
        outside.connect(b.port, "1.2", headers={"host": "/"})
        inside.send(f"/queue/{name}", "in the vhost", receipt=True)
        outside.send(f"/queue/{name}", "in /", receipt=True)
        with pymq.connect(b.url, vhost="interop") as conn:
            consumer = conn.create_session().create_consumer(pymq.Queue(name))
            assert consumer.receive(5).text == "in the vhost"
            assert consumer.receive(0.2) is None
            conn.create_session().create_producer(pymq.Queue(name + ".back")).send("to the foreign client")
        with pymq.connect(b.url) as conn:
            consumer = conn.create_session().create_consumer(pymq.Queue(name))
            assert consumer.receive(5).text == "in /"
            assert consumer.receive(0.2) is None
        inside.subscribe("s", f"/queue/{name}.back")
        got = inside.receive("s")
        assert got is not None and got.body == b"to the foreign client"
        assert got.headers["destination"] == f"/queue/{name}.back"        # as the vhost's client names it
        assert b.call(lambda: {f"$vh.interop.{name}", name, f"$vh.interop.{name}.back"} <= set(b.broker.queues))
        refused = foreign.ForeignClient(argv, label)
        clients.append(refused)
        reply = refused.call("connect", 20.0, port=b.port, host="127.0.0.1", version="1.2", login="guest",
                             passcode="guest", headers={"host": "/nope"})
        assert not reply.get("ok") and "virtual host" in str(reply), reply
    finally:
        for c in clients:
            c.close()
