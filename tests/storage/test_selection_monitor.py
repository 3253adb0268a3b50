"""StorageMonitor: periods, scoring from DeviceStatus, versions, avoidance, pins (sans-IO, fake clock)."""
from __future__ import annotations

import math

import pytest

from pymq.errors import ConfigError
from pymq_server.storage.device import DeviceStatus, HoldingDevice
from pymq_server.storage.selection import ScoringPolicy, StorageMonitor


class FakeDevice(HoldingDevice):
    """A device whose status the test sets; counts status() calls."""

    def __init__(self, name: str, **status) -> None:
        self.name = name
        self.kind = "fake"
        self.current = DeviceStatus(name=name, kind="fake", **status)
        self.calls = 0
        self.fail: Exception | None = None

    def status(self) -> DeviceStatus:
        self.calls += 1
        if self.fail is not None:
            raise self.fail
        return self.current

    def set(self, **changes) -> None:
        for key, value in changes.items():
            setattr(self.current, key, value)

    write = remove = read = recover = None  # type: ignore[assignment]  # not used by the monitor


FakeDevice.__abstractmethods__ = frozenset()


@pytest.mark.parametrize("period", [0.005, 0, -1, 3601, "1", True])
def test_period_range(period):
    with pytest.raises(ConfigError, match="between 0.01 and 3600"):
        StorageMonitor([], period=period)


@pytest.mark.parametrize("period", [0.01, 1, 60, 3600])
def test_period_accepted(period):
    assert StorageMonitor([], period=period).period == period


def test_unchecked_devices_count_as_healthy():
    mon = StorageMonitor([FakeDevice("m")])
    assert mon.next_refresh() == -math.inf
    h = mon.health()["m"]
    assert (h.score, h.available, h.checked_at) == (0.0, True, None)


def test_refresh_polls_only_due_devices():
    fast, slow = FakeDevice("mem"), FakeDevice("grid")
    mon = StorageMonitor([fast, slow], period=0.01, periods={"grid": 5.0})
    mon.refresh(100.0)
    assert (fast.calls, slow.calls) == (1, 1)
    assert mon.next_refresh() == pytest.approx(100.01)
    mon.refresh(100.005)
    assert (fast.calls, slow.calls) == (1, 1)
    for i in range(1, 11):
        mon.refresh(100.0 + i * 0.01)
    assert fast.calls == 11 and slow.calls == 1
    mon.refresh(105.0)
    assert slow.calls == 2
    mon.refresh(105.0, force=True)
    assert (fast.calls, slow.calls) == (13, 3)
    assert mon.refreshes == 16


def test_version_changes_only_with_the_verdict():
    dev = FakeDevice("hdd", capacity=1000, bytes_used=100)
    mon = StorageMonitor([dev])
    v0 = mon.version
    assert mon.refresh(0.0) is True             # 0 -> -4
    assert mon.health()["hdd"].score == -4.0
    v1 = mon.version
    assert v1 == v0 + 1
    assert mon.refresh(1.0) is False            # same figures
    dev.set(write_latency_s=0.0100)             # +6.0
    assert mon.refresh(2.0) is True and mon.health()["hdd"].score == -10.0
    dev.set(write_latency_s=0.0101)             # +6.06: the same after quantisation
    assert mon.refresh(3.0) is False
    assert mon.version == v1 + 1
    assert mon.health()["hdd"].checked_at == 3.0   # the health itself is fresh


def test_full_device_is_avoided_and_comes_back():
    dev = FakeDevice("mem", capacity=100, bytes_free=50)
    mon = StorageMonitor([dev])
    mon.refresh(0.0)
    assert mon.health()["mem"].available
    dev.set(bytes_free=0)
    mon.refresh(1.0)
    h = mon.health()["mem"]
    assert not h.available and h.reason.startswith("full")
    dev.set(bytes_free=60)
    mon.refresh(2.0)
    assert mon.health()["mem"].available and mon.health()["mem"].score == -16.0


def test_offline_and_failing_status_call():
    dev = FakeDevice("db", capacity=100, bytes_used=50)
    mon = StorageMonitor([dev])
    mon.refresh(0.0)
    dev.fail = OSError("connection refused")
    mon.refresh(1.0)
    h = mon.health()["db"]
    assert not h.available and "OSError: connection refused" in h.reason
    assert h.score == -20.0                       # the last measured score is kept
    dev.fail = None
    dev.set(online=False)
    mon.refresh(2.0)
    assert not mon.health()["db"].available and mon.health()["db"].reason == "offline"
    dev.set(online=True)
    mon.refresh(3.0)
    assert mon.health()["db"].available


def test_error_rate_between_refreshes():
    dev = FakeDevice("db", errors=1000)          # history before the broker started: not a rate
    mon = StorageMonitor([dev])
    mon.refresh(0.0)
    assert mon.health()["db"].available and mon.health()["db"].score == 0.0
    dev.set(errors=1020)                          # the same object mutated: the monitor kept a copy
    mon.refresh(1.0)
    assert not mon.health()["db"].available and "failing" in mon.health()["db"].reason
    mon.refresh(2.0)                              # no new errors
    assert mon.health()["db"].available
    dev.set(errors=1021)
    mon.refresh(4.0)                              # 0.5/s -> 15 points
    assert mon.health()["db"].score == -15.0


def test_load_figure_from_extra():
    dev = FakeDevice("grid", extra={"load": 0.75})
    mon = StorageMonitor([dev])
    mon.refresh(0.0)
    assert mon.health()["grid"].score == -15.0


def test_pin_overrides_until_unpinned():
    dev = FakeDevice("hdd", capacity=1000, bytes_used=250)
    mon = StorageMonitor([dev])
    mon.refresh(0.0)
    v = mon.version
    mon.pin("hdd", available=False, reason="maintenance")
    h = mon.health()["hdd"]
    assert (h.available, h.pinned, h.reason, h.score) == (False, True, "maintenance", -10.0)
    assert mon.version == v + 1
    mon.refresh(1.0)
    assert not mon.health()["hdd"].available        # measurement does not undo a pin
    mon.pin("hdd", score=-99)
    assert mon.health()["hdd"].score == -99 and mon.health()["hdd"].available
    mon.unpin("hdd")
    h = mon.health()["hdd"]
    assert (h.available, h.pinned, h.score) == (True, False, -10.0)
    with pytest.raises(ConfigError):
        mon.pin("nope", score=0)


def test_devices_come_and_go():
    mon = StorageMonitor([FakeDevice("a")])
    v = mon.version
    mon.add_device(FakeDevice("b"))
    assert set(mon.health()) == {"a", "b"} and mon.version == v + 1
    with pytest.raises(ConfigError, match="already watches"):
        mon.add_device(FakeDevice("b"))
    mon.remove_device("a")
    assert set(mon.health()) == {"b"} and mon.version == v + 2
    with pytest.raises(ConfigError):
        mon.remove_device("a")


def test_custom_scorer_and_policy():
    dev = FakeDevice("x", write_latency_s=0.05)
    mon = StorageMonitor([dev], scorer=lambda status, previous, elapsed: (-7.5, True, "custom"))
    mon.refresh(0.0)
    assert mon.health()["x"].score == -7.5 and mon.health()["x"].reason == "custom"
    mon2 = StorageMonitor([dev], policy=ScoringPolicy(latency_weight=10))
    mon2.refresh(0.0)
    assert mon2.health()["x"].score == -10.0


@pytest.mark.parametrize("settings, match", [
    ({"space_weight": -1}, "space_weight"), ({"quantum": 0}, "quantum"), ({"full_threshold": 1.5}, "full_threshold"),
    ({"failing_error_rate": 0}, "failing_error_rate"), ({"colour": 1}, "unknown scoring"),
])
def test_policy_validation(settings, match):
    with pytest.raises(ConfigError, match=match):
        ScoringPolicy.from_mapping(settings)
