"""The definitions import (server/admin/definitions.py) against hostile documents: random JSON of every
shape, and a valid document with one part mutated. Each answer is a precise error of the one error tree
with nothing changed, or the whole document applied; never another exception, never half of it.
Also run as a coverage-guided target (``bench/fuzz_targets.py definitions``, ``python -m bench.fuzz``)."""
from __future__ import annotations

import copy

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pymq.errors import PymqError
from pymq_server.admin import definitions
from pymq_server.broker.acl import PERMISSIONS
from pymq_server.broker.auth import User

ROOT = User("root", "", frozenset({"admin"}))
VALID = {"pymq_definitions": 1,
         "queues": [{"name": "orders", "settings": {"max_depth": 5, "overflow": "reject"},
                     "acl": {"owner": None, "grants": {"role:app": ["produce"]}}}],
         "permissions": [{"destination": "/topic/stocks.*", "owner": None, "grants": {"*": ["consume"]}}],
         "durable_subscriptions": [{"topic": "stocks.*", "owner": "app", "name": "feed", "shared": False,
                                    "no_local": False, "selector": "price > 1", "user": "alice"}],
         "users": [], "storage_rules": None, "vhosts": {}}

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-2 ** 70, 2 ** 70) | st.floats(allow_nan=True) |
    st.text(max_size=40) | st.sampled_from(["/queue/x", "/topic/#", "scrypt$1$1$1$a$b", "*", "role:r", "manage",
                                            "max_depth", "$vh.x.y", "", "\x00", "price >>> 1", "(",
                                            "stocks.#"]),
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(
        st.sampled_from(["name", "settings", "acl", "owner", "grants", "destination", "topic", "selector",
                         "shared", "no_local", "key", "user", "roles", "password_hash", "max_depth", "x"]) |
        st.text(max_size=8), inner, max_size=6),
    max_leaves=30)
NOTHING = {"queues_created": 0, "acls_set": 0, "subscriptions_created": 0, "rules_set": 0, "users_changed": 0}
parts = st.sampled_from(["queues", "permissions", "durable_subscriptions", "users", "storage_rules", "vhosts"])


def _state(broker) -> tuple:
    d = broker.destinations
    return (sorted(d.queues), sorted(d.declared), sorted((k, repr(v.to_dict())) for k, v in d.acl.acls.items()),
            sorted(broker.subscriptions.durable), sorted(d.topics))


@pytest.fixture(scope="module")
def running(tmp_path_factory):
    from pymq_server.config import BrokerConfig
    from tests.conftest import RunningBroker
    rb = RunningBroker(BrokerConfig.from_dict({"host": "127.0.0.1", "port": 0,
                                                 "data_dir": str(tmp_path_factory.mktemp("defs"))}))
    yield rb
    rb.stop()


def _import(rb, doc):
    """The import op on the broker's loop, its offloaded part (no users here) run inline."""
    def run():
        before = _state(rb.broker)
        try:
            offload = rb.server.admin.execute(ROOT, "import-definitions", {"definitions": doc})
            result = offload.finish(offload.work())
        except PymqError as exc:
            assert _state(rb.broker) == before, "a refused document changed the broker"
            return exc
        return result
    return rb.call(run)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                    HealthCheck.function_scoped_fixture])
@given(doc=json_values)
def test_random_documents_are_refused_precisely(running, doc):
    out = _import(running, doc)
    assert isinstance(out, PymqError), out          # nothing random is a valid document


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                    HealthCheck.function_scoped_fixture])
@given(part=parts, value=json_values, index=st.integers(0, 3),
       key=st.sampled_from(["name", "settings", "acl", "grants", "destination", "topic", "selector", "owner",
                            "shared", "no_local", "key", "user"]) | st.text(max_size=12))
def test_a_valid_document_with_one_part_mutated(running, part, value, index, key):
    doc = copy.deepcopy(VALID)
    target = doc.get(part)
    if isinstance(target, list) and target and index % 2:
        entry = target[index % len(target)]
        entry[key or "name"] = value
    else:
        doc[part] = value
    out = _import(running, doc)
    if not isinstance(out, PymqError):
        assert set(out) == set(NOTHING)
        # what was accepted is valid: every access list holds known principals and permissions only
        for acl in running.call(lambda: list(running.broker.destinations.acl.acls.values())):
            for principal, perms in acl.grants.items():
                assert principal == "*" or principal.split(":", 1)[0] in ("user", "role"), principal
                assert set(perms) <= set(PERMISSIONS), perms
        again = _import(running, doc)
        assert again == NOTHING, again


def test_the_valid_document_applies_once(running):
    first = _import(running, copy.deepcopy(VALID))
    assert not isinstance(first, PymqError), first
    assert _import(running, copy.deepcopy(VALID)) == NOTHING


def test_a_huge_list_is_refused_before_it_is_read(running):
    doc = dict(VALID, queues=[{"name": f"q{i}"} for i in range(definitions.MAX_ENTRIES + 1)])
    out = _import(running, doc)
    assert isinstance(out, PymqError) and "at most" in out.message


BAD_PARTS = [
    ("permissions", 0, "grants", {"*": ["fly"]}),
    ("permissions", 0, "grants", {"nobody": ["consume"]}),
    ("permissions", 0, "destination", "/elsewhere/x"),
    ("queues", 0, "settings", {"max_depth": -1}),
    ("queues", 0, "name", "bad\x01name"),
    ("durable_subscriptions", 0, "selector", "price >>> 1"),
    ("durable_subscriptions", 0, "shared", "yes"),
]


@pytest.mark.parametrize("part,index,key,value", BAD_PARTS, ids=lambda v: str(v)[:20])
def test_each_bad_part_refuses_the_whole_document(running, part, index, key, value):
    doc = copy.deepcopy(VALID)
    doc["queues"][0]["name"] = "fresh-" + part                 # parts that would be new here ...
    doc["durable_subscriptions"][0]["name"] = "fresh-" + part
    doc["permissions"].append({"destination": "/topic/fresh." + part, "grants": {"*": ["browse"]}})
    doc[part][index][key] = value                              # ... and one that is wrong
    out = _import(running, doc)
    assert isinstance(out, PymqError), out
    assert running.call(lambda: "fresh-" + part not in running.broker.destinations.queues)
