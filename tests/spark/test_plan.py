"""Read plans: partition splits cover each range exactly once; read limits cap and still progress.
The vectors of spec/spark.md are run here too."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pymq.errors import ConfigError
from pyspark_pymq._patterns import DestinationPattern
from pyspark_pymq._plan import (
    Span,
    batch_dedup_base,
    cap_messages,
    dedup_id,
    from_offset,
    split,
    stream_dedup_base,
    to_offset,
)

spans_st = st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 5_000)), min_size=1, max_size=5).map(
    lambda items: [Span(f"/topic/d{i}", start, start + width) for i, (start, width) in enumerate(items)])


@given(spans_st, st.integers(1, 64), st.one_of(st.none(), st.integers(1, 3_000)))
def test_split_reads_every_sequence_number_once(spans, min_partitions, max_per_partition):
    pieces = split(spans, min_partitions, max_per_partition)
    for span in spans:
        mine = [p for p in pieces if p.destination == span.destination]
        covered = [seq for p in mine for seq in range(p.start, p.end)]
        assert covered == list(range(span.start, span.end))            # contiguous, in order, once
        if max_per_partition:
            assert all(p.width <= max_per_partition for p in mine)
    total = sum(s.width for s in spans)
    assert all(p.width > 0 for p in pieces)
    assert len(pieces) >= min(min_partitions, total)


def test_split_shares_partitions_by_width():
    pieces = split([Span("/topic/big", 0, 900), Span("/topic/small", 0, 100), Span("/topic/empty", 5, 5)], 10,
                   None)
    assert [p.destination for p in pieces].count("/topic/big") == 9
    assert [p.destination for p in pieces].count("/topic/small") == 1
    assert split([Span("/queue/x", 3, 3)], 4, None) == []


@given(st.dictionaries(st.sampled_from(["/queue/a", "/queue/b", "/topic/c"]),
                       st.tuples(st.integers(0, 1000), st.integers(0, 1000)), min_size=1),
       st.integers(1, 2000))
def test_cap_messages(ranges, limit):
    start = {d: s for d, (s, _) in ranges.items()}
    end = {d: s + w for d, (s, w) in ranges.items()}
    capped = cap_messages(start, end, limit)
    assert all(start[d] <= capped[d] <= end[d] for d in end)
    taken = sum(capped[d] - start[d] for d in end)
    available = sum(end[d] - start[d] for d in end)
    assert taken == min(limit, available)          # never more than the limit, never stalls


def test_offsets_round_trip_and_refuse_foreign_shapes():
    assert from_offset(to_offset({"/queue/b": 7, "/topic/a": 3})) == {"/queue/b": 7, "/topic/a": 3}
    assert to_offset({"/queue/b": 7}) == {"/queue/b": {"0": 7}}
    for bad in ({"/queue/a": 3}, {"/queue/a": {"0": "3"}}, [1]):
        with pytest.raises(ConfigError, match="not a pymq offset"):
            from_offset(bad)


VECTORS = json.loads((Path(__file__).resolve().parents[2] / "spec" / "vectors" / "spark.json").read_text())


@pytest.mark.parametrize("case", VECTORS["cap"])
def test_cap_vectors(case):
    assert cap_messages(case["start"], case["end"], case["max_messages"]) == case["result"]


@pytest.mark.parametrize("case", VECTORS["split"])
def test_split_vectors(case):
    pieces = split([Span(*s) for s in case["spans"]], case["min_partitions"], case["max_per_partition"])
    assert [[p.destination, p.start, p.end] for p in pieces] == case["result"]


def test_offset_vectors():
    for case in VECTORS["offsets"]["valid"]:
        assert from_offset(case["offset"]) == case["positions"]
        assert to_offset(case["positions"]) == case["offset"]
    for bad in VECTORS["offsets"]["invalid"]:
        with pytest.raises(ConfigError):
            from_offset(bad)


@pytest.mark.parametrize("case", VECTORS["dedup_ids"])
def test_dedup_id_vectors(case):
    base = (stream_dedup_base(case["query_id"], case["batch_id"], case["partition"]) if case["kind"] == "stream"
            else batch_dedup_base(case["prefix"], case["partition"]))
    assert dedup_id(base, case["row"]) == case["id"]


@pytest.mark.parametrize("case", VECTORS["split_by_bytes"])
def test_split_by_bytes_vectors(case):
    from pyspark_pymq._plan import Chunk, split_by_bytes
    chunks = [Chunk(c["start"], c["end"], tuple(c["seqs"]), c["bytes"]) for c in case["chunks"]]
    spans = split_by_bytes(case["destination"], chunks, case["target"])
    assert [[s.start, s.end] for s in spans] == case["result"]
    # whatever the sizes, the pieces are contiguous and cover the probed span once
    live = [c for c in chunks if c.end > c.start]
    if live:
        assert spans[0].start == live[0].start and spans[-1].end == live[-1].end
        assert all(a.end == b.start for a, b in zip(spans, spans[1:]))


# -- exact cases (issue 31: each kills a mutant of _plan.py that the vectors and the properties let live) ----

def test_split_by_bytes_flushes_what_is_pending_before_a_probe_larger_than_the_target():
    from pyspark_pymq._plan import Chunk, split_by_bytes
    d = "/queue/q"
    chunks = [Chunk(0, 10, tuple(range(0, 10)), 100), Chunk(10, 20, tuple(range(10, 20)), 1000),
              Chunk(20, 30, tuple(range(20, 30)), 100), Chunk(30, 40, tuple(range(30, 40)), 100)]
    assert split_by_bytes(d, chunks, 200) == [
        Span(d, 0, 10),                                                  # pending, flushed before the large one
        Span(d, 10, 12), Span(d, 12, 14), Span(d, 14, 16), Span(d, 16, 18), Span(d, 18, 20),   # 1000 B in 5
        Span(d, 20, 40)]                                                 # 100 + 100 is not past 200: one piece


def test_split_by_bytes_starts_counting_again_after_a_piece_ends():
    from pyspark_pymq._plan import Chunk, split_by_bytes
    d = "/queue/q"
    chunks = [Chunk(0, 10, (0, 5), 150), Chunk(10, 20, (10, 15), 100), Chunk(20, 30, (20, 25), 100)]
    assert split_by_bytes(d, chunks, 200) == [Span(d, 0, 10), Span(d, 10, 30)]


def test_split_by_bytes_cuts_a_two_message_probe_and_skips_an_empty_one():
    from pyspark_pymq._plan import Chunk, split_by_bytes
    d = "/queue/q"
    assert split_by_bytes(d, [Chunk(0, 10, (0, 5), 1000)], 300) == [Span(d, 0, 5), Span(d, 5, 10)]
    assert split_by_bytes(d, [Chunk(5, 5, (), 0)], 300) == []


def test_split_by_bytes_cuts_a_probe_of_exactly_twice_the_target_and_not_one_byte_less():
    """spec/spark.md §2: a probe of at least twice the target is cut; below that it stays whole."""
    from pyspark_pymq._plan import Chunk, split_by_bytes
    d = "/queue/q"
    assert split_by_bytes(d, [Chunk(0, 4, (0, 1, 2, 3), 600)], 300) == [Span(d, 0, 2), Span(d, 2, 4)]
    assert split_by_bytes(d, [Chunk(0, 4, (0, 1, 2, 3), 599)], 300) == [Span(d, 0, 4)]


def test_cap_messages_exact_cases():
    # a destination the batch has not started on, or one with nothing new, keeps its end
    assert cap_messages({}, {"a": 5, "b": 7}, 3) == {"a": 5, "b": 7}
    assert cap_messages({"a": 12}, {"a": 10, "b": 100}, 5) == {"a": 10, "b": 100}
    # nothing beyond an end, even for the destination that gets the remainder
    assert cap_messages({"a": 0, "b": 10}, {"a": 100, "b": 10}, 10) == {"a": 10, "b": 10}
    # the remainder goes to the largest fractional share (c: 0.8), not by name
    assert cap_messages({"a": 0, "b": 0, "c": 0}, {"a": 5, "b": 3, "c": 2}, 4) == {"a": 2, "b": 1, "c": 1}


def test_an_offset_position_must_be_an_int_not_a_bool():
    with pytest.raises(ConfigError):
        from_offset({"/queue/q": {"0": True}})


PATTERNS = VECTORS["destination_patterns"]


@pytest.mark.parametrize("case", PATTERNS["cases"], ids=lambda c: c["pattern"])
def test_destination_pattern_vectors(case):
    pattern = DestinationPattern(case["pattern"])
    assert sorted(n for n in PATTERNS["names"] if pattern.matches(n)) == case["matches"]


@pytest.mark.parametrize("case", PATTERNS["refused"], ids=lambda c: c["pattern"])
def test_destination_pattern_refusals(case):
    with pytest.raises(ConfigError, match=re.escape(case["error"])):
        DestinationPattern(case["pattern"])


TOPIC_PATTERNS = json.loads((Path(__file__).resolve().parents[2] / "spec" / "vectors" / "topic_patterns.json")
                            .read_text())


def test_destination_patterns_follow_the_broker_s_topic_pattern_vectors():
    """spec/vectors/topic_patterns.json through destinationPattern, for topics and queues alike: the same
    answer as the broker's matcher, or refused (a word holding '*', '?' or '[', an empty pattern)."""
    checked = 0
    for case in TOPIC_PATTERNS["matches"]:
        pattern, topic = case["pattern"], case["topic"]
        glob_like = any(w not in ("*", "#", ">") and set(w) & set("*?[") for w in pattern.split("."))
        for kind in ("/topic/", "/queue/"):
            if glob_like or not pattern:
                with pytest.raises(ConfigError):
                    DestinationPattern(kind + pattern)
                continue
            assert DestinationPattern(kind + pattern).matches(kind + topic) is case["match"], case
            assert not DestinationPattern(kind + pattern).matches(("/queue/" if kind == "/topic/" else "/topic/")
                                                                  + topic)
            checked += 1
    assert checked > 1000
