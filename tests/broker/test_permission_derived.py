"""Derived grants, beside the matrix of tests/broker/test_permission_matrix.py (same broker, same helpers):
each of these survived a mutant of server/broker/acl.py (issue 31)."""
from __future__ import annotations

import pytest

from tests.broker.test_permission_matrix import (  # noqa: F401 - matrix_broker is a fixture
    Made,
    Refused,
    _serial,
    admin_stomp,
    grant,
    matrix_broker,
    perform,
    send,
    settle,
    snapshot,
    visible,
)



def test_manage_on_a_dead_letter_queue_does_not_imply_reading_it(matrix_broker):  # noqa: F811 - the imported fixture
    """An administrator's grant of ``manage`` on a system-owned queue is that grant and no other: unlike
    on an ordinary queue it does not imply consume, browse or purge (the DLQ's readers are its source
    queue's); the exact permission granted then does let the user in."""
    rb = matrix_broker
    source = f"msrc{next(_serial)}"
    admin_stomp(rb, "alice", "create-queue", {"name": source})
    made = Made("dead-letter queue", f"/queue/DLQ.{source}", f"DLQ.{source}")
    send(rb, "root", made.destination)
    grant(rb, "root", made.destination, "user:bob", "manage")
    settle(rb, 0)
    before = snapshot(rb)
    for op in ("consume", "browse", "purge"):
        with pytest.raises(Refused) as info:
            perform(rb, op, made, "granted")
        assert info.value.code == "access-denied", (op, info.value)
    settle(rb, 0)
    assert snapshot(rb) == before
    grant(rb, "root", made.destination, "user:bob", "consume")
    perform(rb, "consume", made, "granted")


def test_manage_on_an_ordinary_queue_implies_the_rest(matrix_broker):  # noqa: F811 - the imported fixture
    """The other side of the rule above, so that the test cannot pass by refusing everything."""
    rb = matrix_broker
    name = f"mq{next(_serial)}"
    admin_stomp(rb, "alice", "create-queue", {"name": name})
    grant(rb, "alice", "/queue/" + name, "user:bob", "manage")
    made = Made("declared queue", "/queue/" + name, name)
    for op in ("consume", "browse", "purge"):
        perform(rb, op, made, "granted")


@pytest.mark.parametrize("principal", ["user:", "role:", "", "user", "bob", ":bob"])
def test_an_empty_or_malformed_principal_is_refused_and_nothing_changes(matrix_broker, principal):  # noqa: F811 - the imported fixture
    rb = matrix_broker
    name = f"ep{next(_serial)}"
    admin_stomp(rb, "alice", "create-queue", {"name": name})
    settle(rb, 0)
    before = snapshot(rb)
    for op in ("grant", "revoke"):
        with pytest.raises(Refused) as info:
            admin_stomp(rb, "alice", op, {"destination": "/queue/" + name, "principal": principal,
                                          "permissions": ["consume"]})
        assert "principal" in str(info.value) and info.value.code != "access-denied", info.value
    with pytest.raises(Refused) as info:
        admin_stomp(rb, "alice", "create-queue", {"name": name + "x", "grants": {principal: ["consume"]}})
    assert "principal" in str(info.value), info.value
    settle(rb, 0)
    assert snapshot(rb) == before


@pytest.mark.parametrize("principal", ["user:", "role:", ""])
def test_an_empty_principal_in_default_permissions_is_a_configuration_error(principal):
    from pymq.errors import ConfigError
    from pymq_server.broker.acl import AccessControl
    with pytest.raises(ConfigError, match="principal"):
        AccessControl({principal: ["consume"]})


def test_a_grant_of_no_permissions_shows_nothing_and_allows_nothing(matrix_broker):  # noqa: F811 - the imported fixture
    """An empty grant (permissions []) is no grant: the destination stays out of the user's lists and
    every operation stays refused."""
    rb = matrix_broker
    name = f"none{next(_serial)}"
    admin_stomp(rb, "alice", "create-queue", {"name": name})
    admin_stomp(rb, "alice", "grant", {"destination": "/queue/" + name, "principal": "user:bob", "permissions": []})
    made = Made("declared queue", "/queue/" + name, name)
    assert visible(rb, "list", made, "bob") is False
    for op in ("consume", "browse", "produce"):
        with pytest.raises(Refused):
            perform(rb, op, made, "granted")
