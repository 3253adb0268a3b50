"""Which rows of a sealed segment a range read answers (spec/stomp.md §9, spec/spark.md §6): the range
browse's per-message rules applied column-wise to a retained log's segments (segments.py).

The common case -- no row of the range expired, none stamped before ``pymq-from-timestamp`` -- is known
from the segment itself (its earliest expiry, computed once: sealed rows never change) and answered by
bisection over the body column's offsets, without a compute pass over the rows; every other case applies
each rule to each row (:func:`_select_filtered`, the reference the shortcut must agree with).  Pure
functions over immutable segments: no broker state.
"""
from __future__ import annotations

import bisect
from typing import Any

from pymq_server.broker.segments import Segment, pa, pc


def select(seg: Segment, start: int, stop: int, want: int | None, budget: int | None, from_ts: int | None,
           now: int, first: bool) -> tuple[Any, int, int, int | None, bool]:
    """Rows ``start:stop`` of a segment as a range browse selects them (spec/stomp.md §9, the per-message
    loop's rules, column-wise): expired rows and rows stamped before ``from_ts`` are skipped; at most
    ``want`` rows are kept; a row is not kept once ``budget`` body bytes were kept (the first row of the
    whole read always is, ``first``).  Returns (the kept rows or None, how many, their body bytes, the
    last sequence number examined or None, True when no limit stopped inside these rows)."""
    n = stop - start
    rows = seg.batch.slice(start, n)
    first_expiry = seg.first_expiry()
    if (first_expiry is None or first_expiry > now) and (from_ts is None or (n and seg.timestamp(start) >= from_ts
                                                                            and _stamps_ordered(seg, start, stop))):
        return _select_all_kept(seg, rows, start, n, want, budget, first)
    return _select_filtered(seg, rows, start, n, want, budget, from_ts, now, first)


def _select_filtered(seg: Segment, rows: Any, start: int, n: int, want: int | None, budget: int | None,
                     from_ts: int | None, now: int, first: bool) -> tuple[Any, int, int, int | None, bool]:
    """:func:`select` row by row, column-wise: every rule applied to every row (the reference the
    shortcut :func:`_select_all_kept` must agree with)."""
    gone = pc.and_(pc.greater(rows.column(3), 0), pc.less_equal(rows.column(3), now))
    if from_ts is not None:
        gone = pc.or_(gone, pc.less(rows.column(2), from_ts))
    keep = pc.invert(gone) if pc.any(gone).as_py() else None
    positions = None if keep is None else pc.indices_nonzero(keep)
    available = n if positions is None else len(positions)
    # The per-message loop checks its limits before it examines a row: once ``want`` rows were kept (or
    # the byte budget was reached), the next row -- kept or skipped -- stops the read unexamined.
    limit, binds = available, False
    if want is not None and want <= available:
        limit, binds = max(0, want), True
    sizes: Any = None                           # body lengths of the candidate rows, when a budget counts
    if budget is not None and not first and budget <= 0:
        limit, binds = 0, True                  # the budget was used up before these rows
    elif budget is not None and limit:
        sizes = pc.binary_length(rows.column(8))
        if positions is not None:
            sizes = pc.take(sizes, positions)
        reached = pc.index(pc.greater_equal(pc.cumulative_sum(sizes.cast(pa.int64())), budget), True).as_py()
        if 0 <= reached < limit:
            limit, binds = reached + 1, True
    cut = n
    if binds:
        cut = 0 if limit == 0 else (limit if positions is None else positions[limit - 1].as_py() + 1)
    piece = rows.slice(0, cut) if keep is None else rows.slice(0, cut).filter(keep.slice(0, cut))
    size = 0
    if budget is not None and limit:
        size = pc.sum(sizes.slice(0, limit)).as_py()
    examined = seg.seq(start + cut - 1) if cut else None
    return (piece if piece.num_rows else None), limit, size, examined, cut >= n


def _stamps_ordered(seg: Segment, start: int, stop: int) -> bool:
    """True when no row of ``start:stop`` is stamped before the first one (then a ``from_ts`` the first
    row meets is met by all): rows appended one by one may carry their producers' earlier stamps."""
    stamps = seg._stamps
    first = stamps[start]
    return all(stamps[i] >= first for i in range(start + 1, stop)) if stop - start <= 64 else \
        pc.min(seg.batch.column(2).slice(start, stop - start)).as_py() >= first


def _select_all_kept(seg: Segment, rows: Any, start: int, n: int, want: int | None, budget: int | None,
                     first: bool) -> tuple[Any, int, int, int | None, bool]:
    """:func:`select` when no row of ``rows`` is skipped (nothing expired, nothing stamped too early): the
    common case, decided by the segment's earliest expiry and answered by bisection over the body
    offsets, without a compute pass over the rows."""
    limit, binds = n, False
    if want is not None and want <= n:
        limit, binds = max(0, want), True
    size = 0
    if budget is not None:
        if not first and budget <= 0:
            limit, binds = 0, True                      # the budget was used up before these rows
        elif limit:
            ends = seg.body_ends()
            base = ends[start]
            # the first k (1-based) whose rows reach the budget: the row that crosses it is still kept
            k = bisect.bisect_left(ends, base + budget, start + 1, start + limit + 1) - start
            if k <= limit:
                limit, binds = k, True
            size = ends[start + limit] - base
    cut = limit if binds else n
    piece = rows.slice(0, cut) if cut < n else rows
    examined = seg.seq(start + cut - 1) if cut else None
    return (piece if cut else None), limit, size, examined, cut >= n
