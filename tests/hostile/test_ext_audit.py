"""What the audit of every ``_ext/*.pyx`` found besides the scanner and selector (issue 10 item 1).

* ``bloom.pyx``: a serialized filter whose ``count`` field is over 2**63-1 — something the encoder never
  writes — was accepted by the Python twin and raised a bare OverflowError in the compiled one (the
  count is an int64 there).  Both now refuse it as ``bad-count``, the documented decoder error.
* ``page_alloc.pyx``: ``claim(page)`` computed ``page + 1 - n`` in C; near PY_SSIZE_T_MAX the sum wrapped
  to a negative size.  It is computed in Python ints now, so both twins fail the same way.
The other computations on sizes and offsets were checked and are bounded by earlier checks (noted in
the modules); none of the four modules recurses.
"""
from __future__ import annotations

import struct

import pytest

from pymq.errors import ClusterError
from tests.twins import twin_fixture

bloom = twin_fixture("pymq.routing._bloom_py", "pymq.routing._bloom_c")
alloc_mod = twin_fixture("pymq_server.storage._page_alloc_py", "pymq_server.storage._page_alloc_c")


@pytest.mark.parametrize("count", [2 ** 63, 2 ** 64 - 1])
def test_filter_with_impossible_count_is_bad_count(bloom, count):
    good = bloom.SubscriptionFilter(8, 2).to_bytes()
    forged = good[:12] + struct.pack(">Q", count) + good[20:]
    with pytest.raises(ClusterError) as info:
        bloom.SubscriptionFilter.from_bytes(forged)
    assert info.value.reason == "bad-count"


def test_filter_with_largest_count_still_loads(bloom):
    good = bloom.SubscriptionFilter(8, 2).to_bytes()
    assert bloom.SubscriptionFilter.from_bytes(good[:12] + struct.pack(">Q", 2 ** 63 - 1) + good[20:]).count \
        == 2 ** 63 - 1


@pytest.mark.parametrize("page", [2 ** 63 - 1, 2 ** 63 - 2])
def test_claim_of_an_absurd_page_fails_alike_and_changes_nothing(alloc_mod, page):
    alloc = alloc_mod.PageAllocator(reserved=3, page_count=8)
    with pytest.raises((OverflowError, MemoryError)):
        alloc.claim(page, alloc_mod.PERSISTENT)
    assert alloc.page_count == 8 and alloc.free_count == 5
    alloc.check()


def test_arrow_decoder_does_not_reserve_first_body_times_rows():
    """``arrow_decode.pyx`` sized a column's first allocation as (first body size x rows): a batch whose
    first message is 8 MiB and whose 60,000 others are tiny asked malloc for ~480 GB and failed with
    MemoryError.  The first reservation is now capped by the column limit (2 GiB)."""
    pytest.importorskip("pyarrow")
    from pymq._accel import NO_EXTENSIONS
    if NO_EXTENSIONS:
        pytest.skip("PYMQ_NO_EXTENSIONS=1: the compiled twin is disabled on purpose")
    from pyspark_pymq import _decode_c as decode
    frames = [({"pymq-seq": "1", "content-type": "application/octet-stream"}, b"\x01" * (8 << 20))]
    frames += [({"pymq-seq": str(i), "content-type": "application/octet-stream"}, b"x")
               for i in range(2, 60_002)]
    batch = decode.frames_to_batch(frames, "/queue/q", "queue", False)
    assert batch.num_rows == 60_001 and batch.column("value")[1].as_py() == b"x"
