"""Offsets and read plans: which sequence numbers of which destination a batch or micro-batch reads.

An offset is ``{destination: {"0": next_seq}}``: per destination (its STOMP name) and partition (pymq
destinations have one, ``"0"``), the first sequence number *not yet* read.  A batch reads
``start <= seq < end`` for each destination.  Sequence numbers are strictly increasing per destination and
never reused, with gaps allowed, so a range of width ``w`` holds at most ``w`` messages: read limits and
partition splits work on widths, which bound counts from above without reading anything.

Pure functions on plain values: no pyspark, no broker.
"""
from __future__ import annotations

from dataclasses import dataclass

from pymq.errors import ConfigError

PARTITION = "0"


@dataclass(frozen=True)
class Span:
    """``start <= seq < end`` of one destination."""

    destination: str
    start: int
    end: int

    @property
    def width(self) -> int:
        return max(0, self.end - self.start)


def to_offset(positions: dict[str, int]) -> dict:
    return {dest: {PARTITION: int(seq)} for dest, seq in sorted(positions.items())}


def from_offset(offset: dict) -> dict[str, int]:
    """The positions an offset (from Spark's checkpoint, or ours) holds; refuses what we never wrote."""
    out: dict[str, int] = {}
    if not isinstance(offset, dict):
        raise ConfigError(f"not a pymq offset: {offset!r}")
    for dest, parts in offset.items():
        if not isinstance(parts, dict) or PARTITION not in parts or type(parts[PARTITION]) is not int:
            raise ConfigError(f"not a pymq offset for {dest!r}: {parts!r} (expected {{\"0\": <sequence>}})")
        out[dest] = parts[PARTITION]
    return out


def cap_messages(start: dict[str, int], end: dict[str, int], max_messages: int) -> dict[str, int]:
    """Ends that keep the whole batch at ``max_messages`` or fewer, shared in proportion to what each
    destination has (Kafka's ``maxOffsetsPerTrigger`` rule); always moves forward when anything waits."""
    avail = {d: max(0, end[d] - start.get(d, end[d])) for d in end}
    total = sum(avail.values())
    if total <= max_messages:
        return dict(end)
    shares = {d: max_messages * a // total for d, a in avail.items()}
    left = max_messages - sum(shares.values())
    # the remainder goes to the largest fractional parts, ties by name so the plan is deterministic
    order = sorted(avail, key=lambda d: (-(max_messages * avail[d] % total), d))
    for d in order:
        if left <= 0:
            break
        if shares[d] < avail[d]:
            shares[d] += 1
            left -= 1
    return {d: start.get(d, end[d]) + shares[d] if avail[d] else end[d] for d in end}


def split(spans: list[Span], min_partitions: int, max_per_partition: int | None) -> list[Span]:
    """Cut spans into at least ``min_partitions`` pieces (in proportion to width) and into pieces no
    wider than ``max_per_partition``; empty spans are dropped.  Pieces of one destination are
    contiguous and in order, so together they read each sequence number exactly once."""
    spans = [s for s in spans if s.width > 0]
    total = sum(s.width for s in spans)
    if not spans:
        return []
    out: list[Span] = []
    for span in spans:
        parts = max(1, -(-min_partitions * span.width // total))       # ceil
        if max_per_partition:
            parts = max(parts, -(-span.width // max_per_partition))
        parts = min(parts, span.width)
        step, extra = divmod(span.width, parts)
        lo = span.start
        for i in range(parts):
            hi = lo + step + (1 if i < extra else 0)
            out.append(Span(span.destination, lo, hi))
            lo = hi
    return out


@dataclass(frozen=True)
class Chunk:
    """One probe of a destination's byte layout (spec/spark.md §2, split by bytes): ``start <= seq < end``
    holds the messages ``seqs`` (in order), whose bodies total ``bytes``."""

    start: int
    end: int
    seqs: tuple[int, ...]
    bytes: int


def split_by_bytes(destination: str, chunks: list[Chunk], target: int) -> list[Span]:
    """Spans of about ``target`` body bytes from one destination's probes (in sequence order, covering its
    span): a piece ends at a probe's end when the next probe would take it past the target; a probe of at
    least twice the target is cut into ``floor(bytes / target)`` pieces of equal message counts, at message
    sequence numbers (a probe stops after the message crossing its budget: probed at the target, it holds a
    little more and stays whole).  The JVM source plans with it (bindings/spark ``Plan.splitByBytes``, the
    same vectors)."""
    out: list[Span] = []
    lo = hi = -1
    acc = 0
    for c in chunks:
        if c.end <= c.start:
            continue
        n = len(c.seqs)
        if c.bytes >= 2 * target and n > 1:
            if lo >= 0:
                out.append(Span(destination, lo, hi))
                lo, acc = -1, 0
            pieces = min(n, c.bytes // target)
            start = c.start
            for i in range(1, pieces):
                cut = c.seqs[n * i // pieces]
                out.append(Span(destination, start, cut))
                start = cut
            out.append(Span(destination, start, c.end))
            continue
        if lo >= 0 and acc + c.bytes > target:
            out.append(Span(destination, lo, hi))
            lo, acc = -1, 0
        if lo < 0:
            lo = c.start
        acc += c.bytes
        hi = c.end
    if lo >= 0:
        out.append(Span(destination, lo, hi))
    return out


def stream_dedup_base(query_id: str, batch_id: int | str, partition: int) -> str:
    """The duplicate-detection id of a streamed row is ``<base>:<row>`` (spec/spark.md §3)."""
    return f"{query_id}:{batch_id}:{partition}"


def batch_dedup_base(prefix: str, partition: int) -> str:
    return f"{prefix}:{partition}"


def dedup_id(base: str, row: int) -> str:
    return f"{base}:{row}"
