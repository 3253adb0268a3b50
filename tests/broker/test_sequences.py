"""The sequence book (server/broker/sequences.py): numbers never go backwards, a reservation is durable
before any of its numbers is used, and bulk SENDs do not sync the catalog for every frame."""
from __future__ import annotations

from pymq_server.broker.sequences import RESERVE_BLOCK, SequenceBook


class Catalog:
    kind = "file"

    def __init__(self) -> None:
        self.meta: dict[str, int] = {}
        self.synced: dict[str, int] = {}
        self.syncs = 0

    def flush(self) -> None:
        pass

    def sync(self) -> None:
        self.syncs += 1
        self.synced = dict(self.meta)


class Store:
    in_unit = False        # never inside a transaction's unit here

    def __init__(self) -> None:
        self.catalog = Catalog()

    def put_meta(self, key: str, value: bytes) -> None:
        self.catalog.meta[key] = int(value)


def test_bulk_takes_reserve_ahead_of_their_size_and_never_use_an_unsynced_number():
    store = Store()
    book = SequenceBook(store)   # type: ignore[arg-type]
    firsts = []
    for _ in range(64):                                   # 64 bulk SENDs of 35,000 rows
        first = book.take("/topic/t", 35_000)
        firsts.append(first)
        # every number handed out is below the durable reservation
        assert first + 35_000 <= store.catalog.synced["seq:/topic/t"]
    assert firsts == [1 + 35_000 * i for i in range(64)]  # consecutive blocks, in order
    # a reservation reaches many frames ahead: not one catalog sync per frame (64 before)
    assert store.catalog.syncs <= 8


def test_a_restart_resumes_past_every_reservation():
    store = Store()
    book = SequenceBook(store)   # type: ignore[arg-type]
    used = [book.take("", 35_000), book.next(""), book.take("", 3)]
    again = SequenceBook(store)  # type: ignore[arg-type]
    again.load({name[4:]: upto for name, upto in store.catalog.synced.items()})
    assert again.next("") > max(used) + 2
    assert again.take("", RESERVE_BLOCK * 5) > max(used)
