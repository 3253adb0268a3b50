"""Group routing (spec/routing.md section 2): the vectors, and how many groups move when membership changes."""
from __future__ import annotations

import pytest
from hypothesis import given, settings, strategies as st

from pymq.errors import ClusterError, ConfigError
from pymq.routing import GroupRouter, RoutingStrategy, rendezvous_score, route_modulo, route_rendezvous
from pymq.routing import sort_destinations
from tests.routing._vectors import load
from tests.twins import twin_fixture

bloom = twin_fixture("pymq.routing._bloom_py", "pymq.routing._bloom_c")
VECTORS = load("group_routing.json")
GROUPS = [f"group-{i}" for i in range(6000)]


@pytest.mark.parametrize("case", VECTORS["cases"], ids=lambda c: c["name"])
def test_vector(bloom, case):
    modulo = GroupRouter(case["destinations"], "modulo", implementation=bloom)
    hrw = GroupRouter(case["destinations"], "rendezvous", implementation=bloom)
    assert list(modulo.destinations) == case["sorted"]
    assert [bloom.group_hash(d) for d in case["sorted"]] == case["destination_hashes"]
    assert bloom.group_hash(case["key"]) == case["group_hash"]
    assert bytes.fromhex(case["key_hex"]).decode("utf-8") == case["key"]
    assert modulo.index(case["key"]) == case["modulo_index"]
    assert modulo.route(case["key"]) == case["modulo"]
    assert [hrw.scores(case["key"])[d] for d in case["sorted"]] == case["rendezvous_scores"]
    assert hrw.route(case["key"]) == case["rendezvous"]
    assert hrw.ranking(case["key"]) == case["rendezvous_ranking"]
    # the key may also arrive as bytes (a header value not yet decoded)
    assert hrw.route(case["key"].encode("utf-8")) == case["rendezvous"]


@pytest.mark.parametrize("case", VECTORS["errors"])
def test_error_vector(case):
    with pytest.raises(ClusterError):
        GroupRouter(case["destinations"])


def test_default_strategy_is_rendezvous():
    assert GroupRouter(["a"]).strategy is RoutingStrategy.RENDEZVOUS


def test_unknown_strategy_is_a_config_error():
    with pytest.raises(ConfigError):
        GroupRouter(["a", "b"], "round-robin")


def test_destination_names_must_be_text():
    with pytest.raises(TypeError):
        GroupRouter([b"node-a"])


def test_one_off_helpers_match_the_router():
    dests = ["n3", "n1", "n2"]
    for key in GROUPS[:50]:
        assert route_modulo(key, dests) == GroupRouter(dests, "modulo").route(key)
        assert route_rendezvous(key, dests) == GroupRouter(dests).route(key)
        order = sorted(dests, key=lambda d: d.encode("utf-8"))
        best = max(range(len(order)), key=lambda i: (rendezvous_score(order[i], key), -i))
        assert order[best] == route_rendezvous(key, dests)


def test_modulo_ranking_is_the_rotated_sorted_list():
    router = GroupRouter(["c", "a", "d", "b"], "modulo")
    for key in GROUPS[:50]:
        ranking = router.ranking(key)
        i = router.index(key)
        assert ranking[0] == router.route(key)
        assert ranking == list(router.destinations[i:] + router.destinations[:i])


def test_same_answer_from_both_implementations(bloom):
    from pymq.routing import bloom as chosen
    nodes = [f"node-{i}" for i in range(7)]
    for strategy in RoutingStrategy:
        a = GroupRouter(nodes, strategy, implementation=bloom)
        b = GroupRouter(nodes, strategy, implementation=chosen.IMPLEMENTATIONS["py"])
        assert [a.route(g) for g in GROUPS[:500]] == [b.route(g) for g in GROUPS[:500]]


# -- membership changes ---------------------------------------------------------------------------

def _assign(router: GroupRouter) -> dict[str, str]:
    return {g: router.route(g) for g in GROUPS}


def _moved(before: dict[str, str], after: dict[str, str]) -> float:
    return sum(before[g] != after[g] for g in GROUPS) / len(GROUPS)


@pytest.mark.parametrize("n", [3, 5, 10])
def test_rendezvous_leave_moves_only_the_leavers_groups(bloom, n):
    nodes = [f"node-{i}" for i in range(n)]
    before = _assign(GroupRouter(nodes, implementation=bloom))
    for leaver in nodes:
        after = _assign(GroupRouter([d for d in nodes if d != leaver], implementation=bloom))
        moved = {g for g in GROUPS if before[g] != after[g]}
        assert moved == {g for g in GROUPS if before[g] == leaver}
        assert 0.6 / n < len(moved) / len(GROUPS) < 1.4 / n


@pytest.mark.parametrize("n", [3, 5, 10])
def test_rendezvous_join_moves_about_one_in_n_plus_one_all_to_the_newcomer(bloom, n):
    nodes = [f"node-{i}" for i in range(n)]
    before = _assign(GroupRouter(nodes, implementation=bloom))
    after = _assign(GroupRouter(nodes + ["node-new"], implementation=bloom))
    moved = [g for g in GROUPS if before[g] != after[g]]
    assert all(after[g] == "node-new" for g in moved)
    assert 0.6 / (n + 1) < len(moved) / len(GROUPS) < 1.4 / (n + 1)


@pytest.mark.parametrize("n", [3, 5, 10])
def test_modulo_moves_most_groups(bloom, n):
    nodes = [f"node-{i}" for i in range(n)]
    before = _assign(GroupRouter(nodes, "modulo", implementation=bloom))
    joined = _assign(GroupRouter(nodes + ["node-new"], "modulo", implementation=bloom))
    left = _assign(GroupRouter(nodes[1:], "modulo", implementation=bloom))
    assert _moved(before, joined) > 0.5
    assert _moved(before, left) > 0.5


@pytest.mark.parametrize("strategy", list(RoutingStrategy))
def test_groups_spread_evenly(bloom, strategy):
    nodes = [f"node-{i}" for i in range(5)]
    counts = dict.fromkeys(nodes, 0)
    router = GroupRouter(nodes, strategy, implementation=bloom)
    for g in GROUPS:
        counts[router.route(g)] += 1
    expected = len(GROUPS) / len(nodes)
    assert all(0.85 * expected < c < 1.15 * expected for c in counts.values()), counts


names = st.text(alphabet=st.characters(codec="utf-8"), min_size=1, max_size=12)


@settings(max_examples=200, deadline=None)
@given(st.sets(names, min_size=2, max_size=8), st.text(max_size=20))
def test_ranking_is_the_failover_order(dests, key):
    router = GroupRouter(dests)
    ranking = router.ranking(key)
    assert sorted(ranking) == sorted(dests)
    assert ranking[0] == router.route(key)
    # if the first choice leaves, the key goes to the second: ranking agrees with a real membership change
    assert router.with_destinations(set(dests) - {ranking[0]}).route(key) == ranking[1]


@settings(max_examples=200, deadline=None)
@given(st.lists(names, min_size=1, max_size=8))
def test_sort_is_by_utf8_bytes_and_input_order_does_not_matter(dests):
    order = sort_destinations(dests)
    assert [d.encode() for d in order] == sorted({d.encode() for d in dests})
    assert sort_destinations(reversed(dests)) == order
    for key in ("g1", "g2", ""):
        assert GroupRouter(dests).route(key) == GroupRouter(list(reversed(dests))).route(key)
        assert GroupRouter(dests, "modulo").route(key) == GroupRouter(list(reversed(dests)), "modulo").route(key)


# -- the routing key of a destination (spec/routing.md section 2.3, seed 003) ----------------------------
from pymq.routing import KEY_HEADERS, RoutingKey, parse_routing_key, routing_key_of  # noqa: E402


@pytest.mark.parametrize("case", VECTORS["key_cases"], ids=lambda c: c["name"])
def test_key_vector(bloom, case):
    h = case["headers"]
    picked = routing_key_of(case["routing_key"], group_id=h.get("JMSXGroupID"),
                            correlation_id=h.get("correlation-id"), message_id=h.get("message-id"))
    if case["key_source"] is None:
        assert picked is None
        return
    assert picked.source.value == case["key_source"]
    assert picked.key == case["key"] == h[KEY_HEADERS[picked.source]]
    assert GroupRouter(case["destinations"], "modulo", implementation=bloom).route(picked.key) == case["modulo"]
    assert GroupRouter(case["destinations"], implementation=bloom).route(picked.key) == case["rendezvous"]


@pytest.mark.parametrize("case", VECTORS["key_errors"], ids=lambda c: repr(c["routing_key"]))
def test_unknown_routing_key_is_a_config_error(case):
    with pytest.raises(ConfigError) as info:
        routing_key_of(case["routing_key"], correlation_id="c")
    assert info.value.routing_key == case["routing_key"]
    with pytest.raises(ConfigError):
        parse_routing_key(case["routing_key"])


def test_every_routing_key_has_vectors_and_a_header():
    assert {c["routing_key"] for c in VECTORS["key_cases"]} == {k.value for k in RoutingKey}
    assert set(KEY_HEADERS) == set(RoutingKey)
    # a grouped message keeps its group's node whatever the setting
    for setting in RoutingKey:
        assert routing_key_of(setting, group_id="g", correlation_id="c", message_id="m").source is RoutingKey.GROUP
