"""The page allocator, against both twins: the only code that moves the free list and the end of file."""
from __future__ import annotations

import pytest
from hypothesis import settings, strategies as st
from hypothesis.stateful import (Bundle, RuleBasedStateMachine, consumes, invariant, multiple, precondition, rule,
                                 run_state_machine_as_test)

from pymq_server.storage import _page_alloc_py as ref
from tests.twins import twin_fixture

alloc_mod = twin_fixture("pymq_server.storage._page_alloc_py", "pymq_server.storage._page_alloc_c")

P, NP, SYS, FREE = ref.PERSISTENT, ref.NON_PERSISTENT, ref.SYSTEM, ref.FREE


def test_lowest_free_first_then_grow(alloc_mod):
    a = alloc_mod.PageAllocator(reserved=3)
    assert [a.allocate(P), a.allocate(NP), a.allocate(P)] == [3, 4, 5]
    assert a.page_count == 6
    a.free(4)                       # non-persistent: reusable at once
    assert a.allocate(P) == 4
    a.check()


def test_persistent_free_waits_for_checkpoint(alloc_mod):
    a = alloc_mod.PageAllocator(reserved=3)
    pages = [a.allocate(P) for _ in range(3)]
    a.free(pages[0])
    assert a.kind(pages[0]) == ref.PENDING
    assert a.allocate(P) == 6       # the freed page is not handed out yet
    table = a.begin_checkpoint()
    assert table[pages[0]] == FREE  # a checkpoint taken now no longer needs it
    a.free(pages[1])                # freed after the snapshot: waits for the next checkpoint
    assert a.kind(pages[1]) == ref.PENDING and a.kind(pages[0]) == ref.RELEASING
    assert a.allocate(NP) == 7
    a.end_checkpoint()
    assert a.kind(pages[0]) == FREE and a.kind(pages[1]) == ref.PENDING
    assert a.allocate(NP) == pages[0]
    a.check()


def test_failed_checkpoint_keeps_pages_waiting(alloc_mod):
    a = alloc_mod.PageAllocator(reserved=1)
    page = a.allocate(P)
    a.free(page)
    a.begin_checkpoint()
    a.end_checkpoint(durable=False)
    assert a.kind(page) == ref.PENDING
    a.begin_checkpoint()
    a.end_checkpoint()
    assert a.kind(page) == FREE
    a.check()


def test_unallocate_gives_a_page_no_checkpoint_named_back_at_once(alloc_mod):
    """A failed checkpoint's own pages were never durable: FREE again at once (``free`` would keep them
    waiting for the next checkpoint, and a disk that keeps failing checkpoints would leak a page each)."""
    alloc = alloc_mod.PageAllocator(3)
    live = alloc.allocate(P)
    ckpt = alloc.allocate(SYS)
    alloc.unallocate(ckpt)
    assert alloc.kind(ckpt) == FREE and alloc.free_count == 1 and alloc.count(SYS) == 3
    assert alloc.allocate(SYS) == ckpt                 # lowest free first: the same page again
    alloc.unallocate(ckpt)
    assert alloc.trim() == live + 1                    # and it can be cut from the end of the file
    with pytest.raises(alloc_mod.AllocatorError):
        alloc.unallocate(ckpt)                         # twice
    alloc.free(live)
    with pytest.raises(alloc_mod.AllocatorError):
        alloc.unallocate(live)                         # a page waiting for a checkpoint is not unnamed
    alloc.check()


def test_lowest_free_names_the_pages_allocate_hands_out_next(alloc_mod):
    alloc = alloc_mod.PageAllocator(3)
    pages = [alloc.allocate(NP) for _ in range(8)]     # 3..10
    for page in (9, 4, 6):
        alloc.free(page)                               # non-persistent: free at once
    assert alloc.lowest_free(2) == [4, 6]
    assert alloc.lowest_free(10) == [4, 6, 9]          # fewer: the rest would grow the file
    assert [alloc.allocate(P) for _ in range(4)] == [4, 6, 9, 11]
    assert alloc.lowest_free(1) == [] and pages[0] == 3


def test_from_table_frees_non_persistent_pages(alloc_mod):
    table = bytes([SYS, SYS, SYS, P, NP, FREE, NP, P, SYS])
    a = alloc_mod.PageAllocator.from_table(table, reserved=3)
    assert [a.kind(p) for p in range(9)] == [SYS, SYS, SYS, P, FREE, FREE, FREE, P, SYS]
    assert a.count(P) == 2 and a.free_count == 3 and a.count(NP) == 0
    assert a.allocate(NP) == 4
    a.check()


def test_from_table_rejects_in_memory_states(alloc_mod):
    with pytest.raises(alloc_mod.AllocatorError):
        alloc_mod.PageAllocator.from_table(bytes([SYS, ref.PENDING]), reserved=1)


def test_errors(alloc_mod):
    a = alloc_mod.PageAllocator(reserved=2)
    page = a.allocate(P)
    with pytest.raises(alloc_mod.AllocatorError):
        a.claim(page, P)            # in use
    with pytest.raises(alloc_mod.AllocatorError):
        a.claim(1, P)               # reserved
    with pytest.raises(alloc_mod.AllocatorError):
        a.free(0)
    with pytest.raises(alloc_mod.AllocatorError):
        a.free(99)
    a.free(page)
    with pytest.raises(alloc_mod.AllocatorError):
        a.free(page)                # double free
    with pytest.raises(alloc_mod.AllocatorError):
        a.allocate(FREE)
    with pytest.raises(alloc_mod.AllocatorError):
        a.end_checkpoint()
    a.begin_checkpoint()
    with pytest.raises(alloc_mod.AllocatorError):
        a.begin_checkpoint()
    a.check()


def test_claim_grows_the_file_with_free_pages(alloc_mod):
    a = alloc_mod.PageAllocator(reserved=3)
    a.claim(10, P)
    assert a.page_count == 11 and a.free_count == 7
    assert a.allocate(NP) == 3
    a.check()


def test_trim_moves_the_end_of_file_down(alloc_mod):
    a = alloc_mod.PageAllocator(reserved=3)
    pages = [a.allocate(NP) for _ in range(5)]
    for page in pages[2:]:
        a.free(page)
    assert a.trim() == 5 and a.page_count == 5
    a.free(pages[1])
    assert a.trim() == 4            # page 3 still in use
    a.free(pages[0])
    assert a.trim() == 3
    assert a.allocate(P) == 3
    a.check()


def make_machine(mod):
    class AllocatorMachine(RuleBasedStateMachine):
        """Drives one allocator and a plain model; every step compares them."""

        held = Bundle("held")

        def __init__(self):
            super().__init__()
            self.alloc = mod.PageAllocator(reserved=3)
            self.model = {p: SYS for p in range(3)}     # page -> state, the reference bookkeeping
            self.pending: set[int] = set()
            self.releasing: set[int] = set()
            self.in_ckpt = False

        def _free_pages(self):
            return sorted(p for p, k in self.model.items() if k == FREE)

        @rule(target=held, kind=st.sampled_from([P, NP, SYS]))
        def allocate(self, kind):
            free = self._free_pages()
            page = self.alloc.allocate(kind)
            expected = free[0] if free else len(self.model)
            assert page == expected, (page, expected)
            assert self.model.get(page, FREE) == FREE, "handed out a page in use"
            self.model[page] = kind
            return page

        @rule(page=consumes(held))
        def free(self, page):
            kind = self.model[page]
            self.alloc.free(page)
            if kind == NP:
                self.model[page] = FREE
            else:
                self.model[page] = ref.PENDING
                self.pending.add(page)

        @rule(target=held, offset=st.integers(0, 6), kind=st.sampled_from([P, NP]))
        def claim(self, offset, kind):
            page = 3 + offset
            if self.model.get(page, FREE) != FREE:
                with pytest.raises(mod.AllocatorError):
                    self.alloc.claim(page, kind)
                return multiple()
            self.alloc.claim(page, kind)
            for p in range(len(self.model), page):
                self.model[p] = FREE
            self.model[page] = kind
            return page

        @precondition(lambda self: not self.in_ckpt)
        @rule()
        def begin_checkpoint(self):
            table = self.alloc.begin_checkpoint()
            for page in self.pending:
                self.model[page] = ref.RELEASING
            self.releasing, self.pending = self.pending, set()
            self.in_ckpt = True
            expected = bytes(FREE if self.model[p] in (ref.PENDING, ref.RELEASING) else self.model[p]
                             for p in range(len(self.model)))
            assert table == expected

        @precondition(lambda self: self.in_ckpt)
        @rule(durable=st.booleans())
        def end_checkpoint(self, durable):
            self.alloc.end_checkpoint(durable)
            for page in self.releasing:
                self.model[page] = FREE if durable else ref.PENDING
            if not durable:
                self.pending |= self.releasing
            self.releasing = set()
            self.in_ckpt = False

        @rule()
        def trim(self):
            end = len(self.model)
            while end > 3 and self.model[end - 1] == FREE:
                end -= 1
                del self.model[end]
            assert self.alloc.trim() == end

        @invariant()
        def consistent(self):
            self.alloc.check()
            assert self.alloc.page_count == len(self.model)
            assert [self.alloc.kind(p) for p in range(len(self.model))] == \
                [self.model[p] for p in range(len(self.model))]
            for kind in range(6):
                assert self.alloc.count(kind) == sum(1 for k in self.model.values() if k == kind)
            assert self.alloc.kind(len(self.model)) == FREE      # beyond the end of file: nothing

    return AllocatorMachine


def test_state_machine(alloc_mod):
    run_state_machine_as_test(make_machine(alloc_mod),
                              settings=settings(max_examples=150, stateful_step_count=60, deadline=None))


def test_twins_agree_on_random_runs():
    """Same operations, same answers: the compiled twin is the reference, faster."""
    from hypothesis import given
    from pymq_server.storage.page_alloc import IMPLEMENTATIONS
    impls = [m for m in IMPLEMENTATIONS.values() if m is not None]

    @settings(max_examples=100, deadline=None)
    @given(st.lists(st.tuples(st.sampled_from(["alloc", "free", "unalloc", "ckpt", "trim"]), st.integers(0, 40)),
                    max_size=80))
    def run(ops):
        allocs = [m.PageAllocator(reserved=3) for m in impls]
        held: list[int] = []
        for op, arg in ops:
            if op == "alloc":
                pages = {a.allocate((P, NP)[arg % 2]) for a in allocs}
                assert len(pages) == 1
                held.append(pages.pop())
            elif op == "free" and held:
                page = held.pop(arg % len(held))
                for a in allocs:
                    a.free(page)
            elif op == "unalloc" and held:
                page = held.pop(arg % len(held))
                for a in allocs:
                    a.unallocate(page)
                    a.check()
            elif op == "ckpt":
                tables = {a.begin_checkpoint() for a in allocs}
                assert len(tables) == 1
                for a in allocs:
                    a.end_checkpoint()
            elif op == "trim":
                assert len({a.trim() for a in allocs}) == 1
            assert len({tuple(a.lowest_free(arg % 5)) for a in allocs}) == 1
        assert len({a.table() for a in allocs}) == 1
    run()
