"""The HoldingDevice contract, as plain functions over a device factory (any device runs it).

``make`` is a zero-argument callable returning a *new, unopened* device object bound to the same
backing store every time it is called: ``make()`` after ``close()`` reopens the store, which is how
the contract checks recovery.  Each function opens what it needs and closes it before returning.

Use from a device's test module::

    from tests.storage import contract

    @pytest.mark.parametrize("check", contract.CHECKS, ids=lambda f: f.__name__)
    def test_contract(check, tmp_path):
        check(lambda: MyDevice("d", tmp_path))

The functions only use the interface in ``server/storage/device.py``.
"""
from __future__ import annotations

import os
import threading
from typing import Callable

import pytest

from pymq.errors import StorageError
from pymq_server.storage.device import DeviceStatus, HoldingDevice, StoredMessage

Factory = Callable[[], HoldingDevice]


def _msg(key: int, seq: int | None = None, persistent: bool = True, data: bytes | None = None,
         destination: str = "/queue/a") -> StoredMessage:
    return StoredMessage(key, destination, key if seq is None else seq, persistent,
                         data if data is not None else f"body-{key}".encode())


def _opened(make: Factory) -> HoldingDevice:
    device = make()
    device.open()
    return device


def _durable(device: HoldingDevice) -> None:
    device.flush()
    device.sync()


def _recovered(make: Factory) -> list[tuple[StoredMessage, list[str]]]:
    device = _opened(make)
    try:
        return list(device.recover())
    finally:
        device.close()


# -- the checks ---------------------------------------------------------------------------------------------

def check_write_read(make: Factory) -> None:
    device = _opened(make)
    try:
        for key, persistent in ((1, True), (2, False)):
            device.write(_msg(key, persistent=persistent), ["/queue/a"])
        assert device.read(1) == _msg(1)
        assert device.read(2) == _msg(2, persistent=False)
        with pytest.raises(KeyError):
            device.read(99)
    finally:
        device.close()


def check_allocate_then_write(make: Factory) -> None:
    device = _opened(make)
    try:
        alloc = device.allocate(10, True)
        assert alloc.size == 10 and alloc.persistent and alloc.device == device.name
        device.write(_msg(1, data=b"0123456789"), ["/queue/a"], alloc)
        assert device.read(1).data == b"0123456789"
    finally:
        device.close()


def check_empty_and_binary_bodies(make: Factory) -> None:
    device = _opened(make)
    blob = bytes(range(256)) * 3 + b"\x00\r\n"
    try:
        device.write(_msg(1, data=b""), ["/queue/a"])
        device.write(_msg(2, data=blob), ["/queue/a"])
        _durable(device)
    finally:
        device.close()
    got = {m.key: m.data for m, _ in _recovered(make)}
    assert got == {1: b"", 2: blob}


def check_references_free_message_at_last_remove(make: Factory) -> None:
    device = _opened(make)
    try:
        device.write(_msg(1, destination="/topic/t"), ["sub-a", "sub-b", "sub-c"])
        device.remove(1, "sub-b")
        assert device.read(1).key == 1
        with pytest.raises(KeyError):
            device.remove(1, "sub-b")            # that reference is gone
        device.remove(1, "sub-a")
        device.remove(1, "sub-c")
        with pytest.raises(KeyError):
            device.read(1)
        with pytest.raises(KeyError):
            device.remove(1, "sub-a")
        assert device.status().messages == 0
    finally:
        device.close()


def check_partial_references_survive_reopen(make: Factory) -> None:
    device = _opened(make)
    try:
        device.write(_msg(1, destination="/topic/t"), ["sub-a", "sub-b", "sub-c"])
        device.write(_msg(2, destination="/topic/t"), ["sub-a", "sub-b", "sub-c"])
        device.remove(1, "sub-b")
        device.remove(2, "sub-a")
        device.remove(2, "sub-b")
        device.remove(2, "sub-c")
        _durable(device)
    finally:
        device.close()
    assert [(m.key, sorted(refs)) for m, refs in _recovered(make)] == [(1, ["sub-a", "sub-c"])]


def check_add_reference(make: Factory) -> None:
    device = _opened(make)
    try:
        device.write(_msg(1), ["/queue/a"])
        device.add_reference(1, "/queue/DLQ")    # moved to a dead-letter queue, bytes kept
        device.remove(1, "/queue/a")
        assert device.read(1).data == b"body-1"
        _durable(device)
    finally:
        device.close()
    assert [(m.key, refs) for m, refs in _recovered(make)] == [(1, ["/queue/DLQ"])]


def check_recover_persistent_only_in_seq_key_order(make: Factory) -> None:
    device = _opened(make)
    try:
        # keys increase at enqueue; seq is per destination, so (seq, key) interleaves destinations
        plan = [(10, 3, "/queue/b"), (11, 1, "/queue/a"), (12, 1, "/queue/b"), (13, 2, "/queue/a"),
                (14, 2, "/queue/b"), (15, 3, "/queue/a")]
        for key, seq, dest in plan:
            device.write(_msg(key, seq=seq, destination=dest), [dest])
        device.write(_msg(16, seq=0, persistent=False), ["/queue/a"])
        _durable(device)
    finally:
        device.close()
    got = [(m.seq, m.key, m.destination, refs) for m, refs in _recovered(make)]
    assert got == sorted((seq, key, dest, [dest]) for key, seq, dest in plan)
    assert all(isinstance(refs, list) for _, _, _, refs in got)


def check_recovered_messages_are_complete(make: Factory) -> None:
    device = _opened(make)
    try:
        device.write(_msg(7, seq=3, destination="/queue/x", data=b"payload"), ["/queue/x"])
        _durable(device)
    finally:
        device.close()
    [(message, refs)] = _recovered(make)
    assert message == StoredMessage(7, "/queue/x", 3, True, b"payload")
    assert refs == ["/queue/x"]


def check_removed_messages_stay_removed(make: Factory) -> None:
    device = _opened(make)
    try:
        for key in range(1, 21):
            device.write(_msg(key), ["/queue/a"])
        for key in range(1, 21, 2):
            device.remove(key, "/queue/a")
        _durable(device)
    finally:
        device.close()
    assert [m.key for m, _ in _recovered(make)] == list(range(2, 21, 2))
    device = _opened(make)                       # and recovered messages can be removed after reopen
    try:
        list(device.recover())
        for key in range(2, 21, 2):
            device.remove(key, "/queue/a")
        _durable(device)
    finally:
        device.close()
    assert _recovered(make) == []


def check_writes_continue_after_reopen(make: Factory) -> None:
    """A reopened store takes new messages next to recovered ones, across several generations."""
    expected: dict[int, bytes] = {}
    key = 0
    for generation in range(4):
        device = _opened(make)
        try:
            assert {m.key: m.data for m, _ in device.recover()} == expected
            for _ in range(25):
                key += 1
                data = os.urandom(key * 7 % 300)
                device.write(_msg(key, data=data, persistent=key % 5 != 0), ["/queue/a"])
                if key % 5 != 0:
                    expected[key] = data
            for old in sorted(expected)[:5]:
                device.remove(old, "/queue/a")
                del expected[old]
            _durable(device)
        finally:
            device.close()
    assert {m.key: m.data for m, _ in _recovered(make)} == expected


def check_non_persistent_dropped_on_reopen(make: Factory) -> None:
    device = _opened(make)
    try:
        device.write(_msg(1, persistent=False), ["/queue/a"])
        device.write(_msg(2), ["/queue/a"])
        _durable(device)
    finally:
        device.close()
    assert [m.key for m, _ in _recovered(make)] == [2]
    device = _opened(make)
    try:
        list(device.recover())
        with pytest.raises(KeyError):
            device.read(1)
    finally:
        device.close()


def check_large_message(make: Factory) -> None:
    data = os.urandom(3 * 1024 * 1024 + 17)
    device = _opened(make)
    try:
        device.write(_msg(1, data=data), ["/queue/a"])
        device.write(_msg(2, data=data[:1000], persistent=False), ["/queue/a"])
        assert device.read(1).data == data
        _durable(device)
    finally:
        device.close()
    [(message, _)] = _recovered(make)
    assert message.data == data


def check_catalog(make: Factory) -> None:
    device = _opened(make)
    try:
        device.put_meta("queue:/queue/a", b'{"redelivery": 3}')
        device.put_meta("queue:/queue/b", b"b")
        device.put_meta("queue:/queue/a", b'{"redelivery": 5}')
        device.put_meta("sub:durable-1", b"\x00\x01")
        device.put_meta("queue:/queue/b", None)
        device.put_meta("never-there", None)
        expected = {"queue:/queue/a": b'{"redelivery": 5}', "sub:durable-1": b"\x00\x01"}
        assert dict(device.iter_meta()) == expected
        _durable(device)
    finally:
        device.close()
    device = _opened(make)
    try:
        assert dict(device.iter_meta()) == expected
    finally:
        device.close()


def check_status(make: Factory) -> None:
    device = _opened(make)
    try:
        status = device.status()
        assert isinstance(status, DeviceStatus)
        assert status.name == device.name and status.kind == device.kind
        assert status.messages == 0 and status.bytes_used == 0
        device.write(_msg(1, data=b"x" * 100), ["q1", "q2"])
        device.write(_msg(2, data=b"y" * 50, persistent=False), ["q1"])
        status = device.status()
        assert (status.messages, status.bytes_used) == (2, 150)
        device.remove(1, "q1")
        assert device.status().messages == 2
        device.remove(1, "q2")
        status = device.status()
        assert (status.messages, status.bytes_used) == (1, 50)
        assert status.online and status.errors == 0
    finally:
        device.close()


def check_reopen_twice_is_stable(make: Factory) -> None:
    device = _opened(make)
    try:
        for key in range(1, 6):
            device.write(_msg(key), ["/queue/a"])
        _durable(device)
    finally:
        device.close()
    first = _recovered(make)
    second = _recovered(make)
    assert first == second and [m.key for m, _ in first] == [1, 2, 3, 4, 5]


def check_sync_concurrent_with_writes(make: Factory) -> None:
    """``sync`` in a worker thread while the broker thread keeps writing and flushing."""
    device = _opened(make)
    stop = threading.Event()
    failures: list[BaseException] = []

    def syncer() -> None:
        try:
            while not stop.is_set():
                device.sync()
        except BaseException as exc:   # surfaced below; a thread must not swallow it
            failures.append(exc)

    worker = threading.Thread(target=syncer)
    worker.start()
    try:
        for key in range(1, 401):
            device.write(_msg(key, data=os.urandom(200)), ["/queue/a"])
            if key % 3 == 0:
                device.remove(key - 1, "/queue/a")
            device.flush()
    finally:
        stop.set()
        worker.join()
    try:
        assert not failures, failures
        device.sync()
        expected = {key: device.read(key).data for key in range(1, 401) if key % 3 != 2}
    finally:
        device.close()
    assert {m.key: m.data for m, _ in _recovered(make)} == expected


def check_closed_device_refuses(make: Factory) -> None:
    device = _opened(make)
    device.close()
    with pytest.raises((StorageError, KeyError)):
        device.write(_msg(1), ["/queue/a"])


CHECKS = [
    check_write_read, check_allocate_then_write, check_empty_and_binary_bodies,
    check_references_free_message_at_last_remove, check_partial_references_survive_reopen,
    check_add_reference, check_recover_persistent_only_in_seq_key_order, check_recovered_messages_are_complete,
    check_removed_messages_stay_removed, check_writes_continue_after_reopen,
    check_non_persistent_dropped_on_reopen, check_large_message,
    check_catalog, check_status, check_reopen_twice_is_stable, check_sync_concurrent_with_writes,
    check_closed_device_refuses,
]
