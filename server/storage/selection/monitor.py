"""The storage monitor (seed 000): a score per holding device, 0 best and negative worse.

Sans-IO: the monitor never sleeps nor starts a task.  The broker's event loop calls
:meth:`StorageMonitor.refresh` with the current (monotonic) time on a timer, at :meth:`next_refresh`;
the monitor asks each device that is due for :meth:`HoldingDevice.status` and turns the figures into a
:class:`DeviceHealth` with :class:`ScoringPolicy` (documented in spec/storage_rules.md §6.2).

Invariants: ``version`` changes exactly when some device's (score, available) pair changes, or a device
is added, removed or pinned, so the rule evaluator re-sorts only then; scores are quantised
(``ScoringPolicy.quantum``) so latency jitter does not re-sort the rules every period.  A device that is
full, offline, failing, or whose ``status()`` raises is *unavailable*: it is never selected.

Room per message: besides the verdict, the monitor keeps each device's free bytes (``status.bytes_free``)
and lowers it as the store places messages between two checks (:meth:`consumed`) or as a device refuses
one (:meth:`refused`); :meth:`lacking_room` names the devices a message of a given size does not fit.
That check is per message and never re-sorts the rules.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Protocol
from collections.abc import Callable, Iterable, Mapping

from pymq.errors import ConfigError
from pymq_server.storage.device import DeviceStatus, HoldingDevice

#: the refresh period range the seed names: "as often as every 10 ms ... as infrequently as several minutes"
MIN_PERIOD_S = 0.010
MAX_PERIOD_S = 3600.0


@dataclass(frozen=True, slots=True)
class DeviceHealth:
    """What the monitor concluded about one device."""

    name: str
    score: float                       # 0 best, negative worse
    available: bool = True             # False: never select this device
    reason: str = ""                   # why unavailable, or what costs it points
    checked_at: float | None = None    # monitor time of the status it is based on (None: not yet)
    pinned: bool = False               # set by an operator, not measured
    durable: bool = True               # what it holds survives a crash of the broker (memory: False)


class HealthSource(Protocol):
    """What the rule evaluator reads: a version that changes with the health, and the health."""

    version: int

    def health(self) -> Mapping[str, DeviceHealth]: ...

    def lacking_room(self, size: int) -> frozenset[str]: ...


@dataclass(frozen=True)
class ScoringPolicy:
    """How a :class:`DeviceStatus` becomes a score.

    ``penalty = space_weight * used + latency_weight * min(1, latency / latency_ceiling_s)
              + error_weight * min(1, error_rate / error_rate_ceiling) + load_weight * load``
    and ``score = -penalty`` rounded to a multiple of ``quantum``.  ``used`` is the used fraction of the
    capacity (0 when the capacity is unknown), ``error_rate`` the errors per second since the previous
    status, ``load`` the device's own 0..1 figure in ``status.extra["load"]`` (0 when it reports none).
    The device is unavailable when offline, when ``used >= full_threshold`` or no byte is free, or when
    ``error_rate >= failing_error_rate``.
    """

    space_weight: float = 40.0
    latency_weight: float = 30.0
    latency_ceiling_s: float = 0.050
    error_weight: float = 30.0
    error_rate_ceiling: float = 1.0
    load_weight: float = 20.0
    full_threshold: float = 0.98
    failing_error_rate: float | None = 10.0
    quantum: float = 1.0

    def __post_init__(self) -> None:
        for name in ("space_weight", "latency_weight", "error_weight", "load_weight"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or isinstance(value, bool) or value < 0 or not math.isfinite(value):
                raise ConfigError(f"scoring {name} must be a finite number >= 0, got {value!r}")
        for name in ("latency_ceiling_s", "error_rate_ceiling", "quantum"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or isinstance(value, bool) or not value > 0:
                raise ConfigError(f"scoring {name} must be a number > 0, got {value!r}")
        if not 0 < self.full_threshold <= 1:
            raise ConfigError(f"scoring full_threshold must be in (0, 1], got {self.full_threshold!r}")
        if self.failing_error_rate is not None and not self.failing_error_rate > 0:
            raise ConfigError(f"scoring failing_error_rate must be > 0 or null, got {self.failing_error_rate!r}")

    @classmethod
    def from_mapping(cls, data: Mapping | None) -> ScoringPolicy:
        data = dict(data or {})
        unknown = set(data) - set(cls.__dataclass_fields__)
        if unknown:
            raise ConfigError(f"unknown scoring settings {sorted(unknown)} "
                              f"(known: {sorted(cls.__dataclass_fields__)})")
        return cls(**data)

    def assess(self, status: DeviceStatus, previous: DeviceStatus | None, elapsed: float) -> tuple[float, bool, str]:
        """(score, available, reason) for ``status``; ``previous`` and ``elapsed`` give the error rate."""
        if not status.online:
            return 0.0, False, "offline"
        used = used_fraction(status)
        if (status.bytes_free is not None and status.bytes_free <= 0) or used >= self.full_threshold:
            return 0.0, False, f"full ({used:.0%} used)"
        rate = 0.0
        if previous is not None and elapsed > 0:
            rate = max(0, status.errors - previous.errors) / elapsed
        if self.failing_error_rate is not None and rate >= self.failing_error_rate:
            return 0.0, False, f"failing ({rate:.1f} errors/s)"
        latency = max(0.0, status.write_latency_s or 0.0)
        load = status.extra.get("load", 0.0) if isinstance(status.extra, Mapping) else 0.0
        if isinstance(load, bool) or not isinstance(load, (int, float)) or not math.isfinite(load):
            load = 0.0
        parts = {
            "space": self.space_weight * used,
            "latency": self.latency_weight * min(1.0, latency / self.latency_ceiling_s),
            "errors": self.error_weight * min(1.0, rate / self.error_rate_ceiling),
            "load": self.load_weight * min(1.0, max(0.0, float(load))),
        }
        penalty = sum(parts.values())
        score = -round(penalty / self.quantum) * self.quantum
        score = score + 0.0   # no -0.0
        costly = [f"{k} {v:.1f}" for k, v in parts.items() if v >= 0.05]
        return score, True, ", ".join(costly)


def used_fraction(status: DeviceStatus) -> float:
    """Fraction of the capacity in use, 0..1 (0 when the capacity is unknown or unbounded)."""
    capacity = status.capacity
    if not capacity or capacity <= 0:
        return 0.0
    if status.bytes_free is not None:
        used = 1.0 - status.bytes_free / capacity
    else:
        used = status.bytes_used / capacity
    return min(1.0, max(0.0, used))


Scorer = Callable[[DeviceStatus, "DeviceStatus | None", float], "tuple[float, bool, str]"]


@dataclass
class _Tracked:
    device: HoldingDevice
    period: float
    due: float = -math.inf
    status: DeviceStatus | None = None
    status_at: float | None = None
    measured: DeviceHealth = field(default=None)  # type: ignore[assignment]  # last measurement
    health: DeviceHealth = field(default=None)    # type: ignore[assignment]  # measured, pin applied
    pin: tuple[float | None, bool | None, str] | None = None
    free: int | None = None                       # bytes a message may still use (None: unbounded)


class StorageMonitor:
    """Scores holding devices from their status, refreshed on a configurable period.

    ``period`` (seconds, 0.01 to 3600) applies to every device; ``periods`` overrides it per device (a
    remote grid checked less often than local memory).  ``scorer`` replaces the policy's formula
    entirely: ``scorer(status, previous_status_or_None, elapsed_s) -> (score, available, reason)``.
    Until a device is first checked it counts as healthy with score 0, so a starting broker can place
    messages before the first refresh.
    """

    def __init__(self, devices: Iterable[HoldingDevice] | Mapping[str, HoldingDevice] = (), *,
                 period: float = 1.0, periods: Mapping[str, float] | None = None,
                 policy: ScoringPolicy | None = None, scorer: Scorer | None = None) -> None:
        self.period = _check_period(period, "period")
        self.periods = {name: _check_period(p, f"period of {name}") for name, p in (periods or {}).items()}
        self.policy = policy or ScoringPolicy()
        self._assess: Scorer = scorer or self.policy.assess
        self._tracked: dict[str, _Tracked] = {}
        self.version = 0
        self.refreshes = 0          # status() calls made, for tests and metrics
        self._health_view: Mapping[str, DeviceHealth] = MappingProxyType({})
        self._bounded: dict[str, _Tracked] = {}     # devices whose free space is known
        items = devices.values() if isinstance(devices, Mapping) else devices
        for device in items:
            self.add_device(device)

    # -- devices -----------------------------------------------------------------------------------

    def add_device(self, device: HoldingDevice) -> None:
        name = device.name
        if name in self._tracked:
            raise ConfigError(f"the storage monitor already watches a device named {name!r}")
        tracked = _Tracked(device, self.periods.get(name, self.period))
        tracked.measured = tracked.health = DeviceHealth(name, 0.0, True, "not checked yet",
                                                         durable=_durable(device))
        self._tracked[name] = tracked
        self._changed()

    def remove_device(self, name: str) -> None:
        if self._tracked.pop(name, None) is None:
            raise ConfigError(f"the storage monitor watches no device named {name!r}")
        self._bounded.pop(name, None)
        self._changed()

    def pin(self, name: str, *, score: float | None = None, available: bool | None = None,
            reason: str = "pinned by operator") -> None:
        """Fix a device's score and/or availability (maintenance, drain) until :meth:`unpin`."""
        tracked = self._get(name)
        tracked.pin = (score, available, reason)
        self._update(tracked)

    def unpin(self, name: str) -> None:
        tracked = self._get(name)
        tracked.pin = None
        self._update(tracked)

    # -- the timer ---------------------------------------------------------------------------------

    def next_refresh(self) -> float:
        """Monitor time at which the next device is due (``-inf`` before the first refresh)."""
        return min((t.due for t in self._tracked.values()), default=math.inf)

    def refresh(self, now: float, *, force: bool = False) -> bool:
        """Check every device that is due at ``now`` (all of them with ``force``); True if health changed."""
        before = self.version
        for tracked in self._tracked.values():
            # a timer may fire a hair early (float sums, the loop's clock resolution): count a
            # device due within a tenth of its period (at most 1 ms) as due, or it would wait a period
            if not force and tracked.due - min(0.001, tracked.period * 0.1) > now:
                continue
            self._check(tracked, now)
            tracked.due = now + tracked.period
        return self.version != before

    def health(self) -> Mapping[str, DeviceHealth]:
        """Device name -> :class:`DeviceHealth` (a read-only view, replaced when anything changes)."""
        return self._health_view

    # -- room per message (no re-sort) ------------------------------------------------------------

    def lacking_room(self, size: int) -> frozenset[str]:
        """Devices a message of ``size`` bytes does not fit, as far as the monitor knows."""
        if not self._bounded:
            return frozenset()
        return frozenset(name for name, t in self._bounded.items() if t.free is not None and t.free < size)

    def free(self, name: str) -> int | None:
        tracked = self._tracked.get(name)
        return tracked.free if tracked is not None else None

    def consumed(self, name: str, size: int) -> None:
        """The store placed ``size`` bytes on ``name``: less room until the next check measures it."""
        tracked = self._bounded.get(name)
        if tracked is not None and tracked.free is not None:
            tracked.free = max(0, tracked.free - size)

    def refused(self, name: str, size: int) -> None:
        """``name`` refused a message of ``size`` bytes: no message that large goes there again until
        the next check (the device counts the refusal among its errors, which lowers its score)."""
        tracked = self._tracked.get(name)
        if tracked is None:
            return
        room = max(0, size - 1)
        tracked.free = room if tracked.free is None else min(tracked.free, room)
        self._bounded[name] = tracked

    # -- internals ---------------------------------------------------------------------------------

    def _get(self, name: str) -> _Tracked:
        try:
            return self._tracked[name]
        except KeyError:
            raise ConfigError(f"the storage monitor watches no device named {name!r}") from None

    def _check(self, tracked: _Tracked, now: float) -> None:
        self.refreshes += 1
        try:
            status = tracked.device.status()
        except Exception as exc:  # noqa: BLE001 - any failure of a device is a verdict on that device
            tracked.status, tracked.status_at = None, now
            tracked.measured = DeviceHealth(tracked.device.name, tracked.measured.score, False,
                                            f"status() failed: {type(exc).__name__}: {exc}", now,
                                            durable=_durable(tracked.device))
            self._update(tracked)
            return
        previous, previous_at = tracked.status, tracked.status_at
        elapsed = now - previous_at if previous_at is not None else 0.0
        score, available, reason = self._assess(status, previous, elapsed)
        tracked.status, tracked.status_at = _copy_status(status), now
        tracked.free = status.bytes_free
        if status.bytes_free is None:
            self._bounded.pop(tracked.device.name, None)
        else:
            self._bounded[tracked.device.name] = tracked
        tracked.measured = DeviceHealth(tracked.device.name, float(score), bool(available), reason, now,
                                        durable=_durable(tracked.device))
        self._update(tracked)

    def _update(self, tracked: _Tracked) -> None:
        """Publish ``measured`` with the pin applied; bump the version if the verdict changed."""
        health = tracked.measured
        if tracked.pin is not None:
            score, available, reason = tracked.pin
            health = replace(health, score=health.score if score is None else float(score),
                             available=health.available if available is None else available,
                             reason=reason, pinned=True)
        old = tracked.health
        tracked.health = health
        if (old.score, old.available, old.pinned) != (health.score, health.available, health.pinned):
            self._changed()
        else:
            self._publish()

    def _changed(self) -> None:
        self.version += 1
        self._publish()

    def _publish(self) -> None:
        self._health_view = MappingProxyType({name: t.health for name, t in self._tracked.items()})


class StaticHealth:
    """Fixed device scores (the seed's example, tests, or a broker with monitoring switched off)."""

    def __init__(self, scores: Mapping[str, float], unavailable: Mapping[str, str] | None = None,
                 *, non_durable: Iterable[str] = (), free: Mapping[str, int] | None = None) -> None:
        self.version = 0
        self._health: dict[str, DeviceHealth] = {}
        self._free = dict(free or {})
        gone = frozenset(non_durable)
        for name, score in scores.items():
            self._health[name] = DeviceHealth(name, float(score), True, "static", durable=name not in gone)
        for name, reason in (unavailable or {}).items():
            self.set(name, self._health[name].score if name in self._health else 0.0, available=False,
                     reason=reason)
        self.version = 0

    def set(self, name: str, score: float, *, available: bool = True, reason: str = "static") -> None:
        old = self._health.get(name)
        self._health[name] = DeviceHealth(name, float(score), available, reason,
                                          durable=old.durable if old is not None else True)
        self.version += 1

    def health(self) -> Mapping[str, DeviceHealth]:
        return MappingProxyType(dict(self._health))

    def lacking_room(self, size: int) -> frozenset[str]:
        return frozenset(name for name, free in self._free.items() if free < size)


def _durable(device: HoldingDevice) -> bool:
    return bool(getattr(device, "durable", True))


def _check_period(value: float, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not MIN_PERIOD_S <= value <= MAX_PERIOD_S:
        raise ConfigError(f"storage monitor {what} must be between {MIN_PERIOD_S} and {MAX_PERIOD_S} s, "
                          f"got {value!r}")
    return float(value)


def _copy_status(status: DeviceStatus) -> DeviceStatus:
    # devices may hand back the same mutable object each time; keep what we measured
    return replace(status, extra=dict(status.extra))
