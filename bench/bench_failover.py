"""The failover harness of issue 26 item 3: a live/backup pair under load, broken again and again.

    eval "$(.ci/services.sh)"         # PostgreSQL for the sql store kind (exports PYMQ_TEST_POSTGRES_URL)
    python bench/bench_failover.py [--rounds 20] [--stores file,postgresql] [--lease-ms 1000] [--json out.json]

Two ``pymq-server`` processes (tests/ha/members.py) share one store: a data directory (the file store) or a
PostgreSQL database (the SQL device); each has its own STOMP port from the start, and every client names
both, so whoever is live is reached.  The load, all on one queue, all the time:

* a producer through the Python SDK's failover (``failover:(a,b)``): persistent sends, each returning once
  receipted (*acknowledged*: it must arrive);
* a transacted producer through the SDK: transactions of 4 messages; a commit that returns is
  acknowledged (all 4 must arrive), one that raises ``TransactionRolledBack`` must leave none, one that
  raises ``TransactionInDoubt`` all or none;
* stomp.py, a client nobody here wrote, as an outside producer: a persistent SEND with a receipt and a
  ``pymq-dedup-id`` at a time; when its link breaks it connects to the other address and sends the
  unreceipted SEND again with the same id (what an application does without an SDK that fails over);
* a consumer through the SDK with client acknowledgement, acknowledging each message after noting it.

Each round breaks the live one way, in turn:

``kill``            kill -9 of the live; the old live is started again as the new backup;
``stop``            SIGSTOP of the live (a zombie): the backup takes over by lease expiry; the zombie is
                    resumed (SIGCONT) a second after the takeover and must find itself fenced and wait as a
                    backup (``ha.after_fenced: backup``) without a write: its log must say ``fenced``;
``kill-recovering`` kill -9 of the live, then kill -9 of the backup as soon as it took the store (while
                    its recovery runs); both are started again, the first to take the store is live.

Figures per store kind: acknowledged messages lost, duplicates split into copies flagged ``redelivered``
(allowed: a delivery whose acknowledgement was lost) and unflagged ones (never allowed), transactions
partially visible, takeover time (from the fault to the consumer's first delivery by the new live;
p50/p99) and the consumer's messages per second in the 1.5 s before the fault and the 1.5 s from half a
second after the first delivery by the new live.  Exit status 1 when anything acknowledged was lost, a
duplicate came unflagged, a transaction was seen in part or a zombie did not report itself fenced; never
because of speed.  tests/ha/test_harness.py runs a few rounds of the same code.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import socket
import statistics
import sys
import tempfile
import threading
import time
import uuid
from collections import defaultdict
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.append(os.path.dirname(HERE))         # the repository: tests.ha.members starts the members

import stomp  # noqa: E402

import pymq  # noqa: E402
from pymq.errors import PymqError, TransactionInDoubt, TransactionRolledBack  # noqa: E402
from tests.ha.members import Member, ha_config  # noqa: E402

QUEUE = "failover"
TX_SIZE = 4
FAULTS = ("kill", "stop", "kill-recovering")
RECONNECT = "initialReconnectDelay=20&maxReconnectDelay=250&jitter=0"
#: how long a client waits for CONNECTED (and any answer): a stopped live's port still accepts connections
#: (the kernel does), so an attempt there waits this long before the client tries the next address
CLIENT_TIMEOUT = 3.0


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


# -- the pair -------------------------------------------------------------------------------------------------
class Pair:
    """Two members over one store, each at a fixed STOMP port; a killed one is started again at its port."""

    def __init__(self, root: Path, store: str, lease_ms: int, postgres_url: str | None) -> None:
        self.root = root
        self.store = store
        self.lease_ms = lease_ms
        self.url = postgres_url
        self.prefix = "fo" + uuid.uuid4().hex[:8] + "_"
        self.ports = [free_port(), free_port()]
        self.members: list[Member | None] = [None, None]
        self.started = 0
        self.old: list[Member] = []

    def start(self, slot: int) -> Member:
        self.started += 1
        config = ha_config(self.root / f"member-{self.started}.yaml", lease_ms=self.lease_ms, poll_ms=50,
                           postgres_url=self.url if self.store == "postgresql" else None, table_prefix=self.prefix)
        data_dir = self.root / ("shared" if self.store == "file" else f"own-{slot}")
        member = Member(f"{'AB'[slot]}{self.started}", data_dir, config, "--port", str(self.ports[slot]))
        old = self.members[slot]
        if old is not None:
            self.old.append(old)
        self.members[slot] = member
        return member

    def live_slot(self, timeout: float = 60.0) -> int:
        """The slot whose member serves now (the last to announce a STOMP listener)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for slot, member in enumerate(self.members):
                if member is not None and member.exited() is None and self._serving(member):
                    return slot
            time.sleep(0.01)
        raise TimeoutError("no member is live:\n" + "\n".join(m.log[-2000:] for m in self.members if m))

    @staticmethod
    def _serving(member: Member) -> bool:
        log = member.log
        return log.rfind("pymq-server listening") > max(log.rfind("pymq-server fenced"),
                                                         log.rfind("pymq-server backup of node"))

    @property
    def failover_url(self) -> str:
        return f"failover:({','.join(f'stomp://127.0.0.1:{p}' for p in self.ports)})?{RECONNECT}"

    def close(self) -> None:
        for member in [*self.members, *self.old]:
            if member is not None and member.exited() is None:
                member.kill()
        if self.store == "postgresql" and self.url is not None:
            import sqlalchemy as sa
            engine = sa.create_engine(self.url)
            with engine.begin() as conn:
                for table in ("ha", "message", "reference", "catalog", "pending"):
                    conn.execute(sa.text(f"DROP TABLE IF EXISTS {self.prefix}{table}"))
            engine.dispose()


# -- the load ---------------------------------------------------------------------------------------------------
@dataclass
class Ledger:
    """What the clients were told and what the consumer saw."""

    acked: set[str] = field(default_factory=set)                  # bodies whose send returned
    committed: set[int] = field(default_factory=set)
    rolled_back: set[int] = field(default_factory=set)
    in_doubt: set[int] = field(default_factory=set)
    deliveries: dict[str, list[bool]] = field(default_factory=lambda: defaultdict(list))   # body -> redelivered
    times: list[float] = field(default_factory=list)              # monotonic time of every delivery
    resumed: list[float] = field(default_factory=list)            # the consumer's connection resumed
    events: list[str] = field(default_factory=list)               # every connection's transport events
    errors: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)


class Load:
    def __init__(self, pair: Pair) -> None:
        self.pair = pair
        self.ledger = Ledger()
        self.stopping = threading.Event()
        self.threads: list[threading.Thread] = []
        self.conns: list[Any] = []

    def start(self) -> None:
        url = self.pair.failover_url
        consumer_conn = pymq.connect(url, heartbeat=(500, 500), timeout=CLIENT_TIMEOUT)
        self.conns.append(consumer_conn)
        ledger = self.ledger

        def on_transport(event: Any) -> None:
            with ledger.lock:
                if event.kind == "resumed":
                    ledger.resumed.append(time.monotonic())
                ledger.events.append(f"consumer {event.kind} {event.broker} {getattr(event, 'error', '')}")

        consumer_conn.set_transport_listener(on_transport)
        session = consumer_conn.create_session(pymq.CLIENT_ACKNOWLEDGE)
        consumer = session.create_consumer(pymq.Queue(QUEUE))

        def on_message(message: Any) -> None:
            with ledger.lock:
                ledger.deliveries[message.text].append(bool(message.redelivered))
                ledger.times.append(time.monotonic())
            message.acknowledge()

        consumer.set_message_listener(on_message)
        for target in (self._produce, self._transact, self._outside):
            thread = threading.Thread(target=self._guarded, args=(target,), daemon=True, name=target.__name__)
            thread.start()
            self.threads.append(thread)

    def _guarded(self, target: Any) -> None:
        try:
            target()
        except Exception as exc:  # noqa: BLE001 - a harness failure is reported, not a hang
            self.ledger.errors.append(f"{target.__name__}: {type(exc).__name__}: {exc}")

    def _produce(self) -> None:
        conn = pymq.connect(self.pair.failover_url, heartbeat=(500, 500), timeout=CLIENT_TIMEOUT)
        self.conns.append(conn)
        producer = conn.create_session().create_producer(pymq.Queue(QUEUE))
        n = 0
        while not self.stopping.is_set():
            body = f"p-{n}"
            n += 1
            try:
                producer.send(body)                        # persistent: returns once receipted
            except PymqError:
                continue                                   # no answer in time: not acknowledged, may arrive
            with self.ledger.lock:
                self.ledger.acked.add(body)

    def _transact(self) -> None:
        conn = pymq.connect(self.pair.failover_url, heartbeat=(500, 500), timeout=CLIENT_TIMEOUT)
        self.conns.append(conn)
        session = conn.create_session(pymq.SESSION_TRANSACTED)
        producer = session.create_producer(pymq.Queue(QUEUE))
        n = 0
        while not self.stopping.is_set():
            try:
                for k in range(TX_SIZE):
                    producer.send(f"t-{n}-{k}")
                session.commit()
                outcome = self.ledger.committed
            except TransactionRolledBack:
                outcome = self.ledger.rolled_back
            except (TransactionInDoubt, PymqError):        # no answer in time is in doubt too: all or none
                outcome = self.ledger.in_doubt
            with self.ledger.lock:
                outcome.add(n)
            n += 1

    def _outside(self) -> None:
        """stomp.py: one SEND at a time with a receipt and a dedup id; another address when the link breaks."""
        receipts: set[str] = set()
        arrived = threading.Condition()

        class Listener(stomp.ConnectionListener):
            def on_receipt(self, frame: Any) -> None:
                with arrived:
                    receipts.add(frame.headers["receipt-id"])
                    arrived.notify_all()

        ports = self.pair.ports
        conn: Any = None
        turn = 0
        n = 0
        run = uuid.uuid4().hex[:8]
        while not self.stopping.is_set():
            if conn is None or not conn.is_connected():
                conn = None
                try:
                    candidate = stomp.Connection12([("127.0.0.1", ports[turn % 2])], heartbeats=(0, 0),
                                                   reconnect_attempts_max=1)
                    candidate.set_listener("fo", Listener())
                    candidate.connect("guest", "guest", wait=True)
                    conn = candidate
                except Exception:  # noqa: BLE001 - not live there (a backup refuses): the other address
                    turn += 1
                    time.sleep(0.05)
                    continue
            body = f"s-{n}"
            receipt = f"{run}-{n}-{turn}"
            try:
                conn.send(f"/queue/{QUEUE}", body, headers={"persistent": "true", "pymq-dedup-id": f"{run}:{n}",
                                                            "receipt": receipt})
            except Exception:  # noqa: BLE001 - the link broke under the send: the same SEND again elsewhere
                conn = None
                turn += 1
                continue
            deadline = time.monotonic() + 3.0
            with arrived:
                while receipt not in receipts and time.monotonic() < deadline and conn.is_connected():
                    arrived.wait(0.05)
            if receipt in receipts:
                with self.ledger.lock:
                    self.ledger.acked.add(body)
                n += 1
            else:
                try:
                    conn.disconnect()
                except Exception:  # noqa: BLE001
                    pass
                conn = None
                turn += 1
        if conn is not None:
            try:
                conn.disconnect()
            except Exception:  # noqa: BLE001
                pass

    def stop(self) -> None:
        self.stopping.set()
        for thread in self.threads:
            thread.join(60)
            if thread.is_alive():
                self.ledger.errors.append(f"{thread.name} did not stop within 60 s")

    def close(self) -> None:
        for conn in self.conns:
            try:
                conn.close()
            except PymqError:
                pass

    # -- what the ledger says ---------------------------------------------------------------------------------
    def received(self) -> set[str]:
        with self.ledger.lock:
            return set(self.ledger.deliveries)

    def expected(self) -> set[str]:
        with self.ledger.lock:
            return set(self.ledger.acked) | {f"t-{n}-{k}" for n in self.ledger.committed for k in range(TX_SIZE)}

    def rate(self, start: float, end: float) -> float:
        with self.ledger.lock:
            times = list(self.ledger.times)
        return sum(1 for t in times if start <= t < end) / max(end - start, 1e-9)

    def first_after(self, moment: float, timeout: float) -> float | None:
        """The first delivery by the new live: after the consumer's connection resumed past ``moment``."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self.ledger.lock:
                resumed = [t for t in self.ledger.resumed if t > moment]
                later = [t for t in self.ledger.times[-5000:] if resumed and t >= resumed[0]]
            if later:
                return min(later)
            time.sleep(0.005)
        return None

    def settle(self, timeout: float = 60.0) -> None:
        """Wait until every acknowledged message arrived (or the deadline), then for a quiet second."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and not self.expected() <= self.received():
            time.sleep(0.05)
        while time.monotonic() < deadline:
            with self.ledger.lock:
                last = self.ledger.times[-1] if self.ledger.times else 0.0
            if time.monotonic() - last > 1.0:
                break
            time.sleep(0.1)


# -- a run ------------------------------------------------------------------------------------------------------
@dataclass
class RoundResult:
    fault: str
    takeover_s: float | None
    before_msgs_s: float
    after_msgs_s: float
    zombie_fenced: bool | None = None


@dataclass
class StoreResult:
    store: str
    rounds: list[RoundResult]
    acknowledged: int
    lost: int
    lost_sample: list[str]
    duplicates_flagged: int
    duplicates_unflagged: int
    unflagged_sample: list[str]
    transactions_committed: int
    transactions_rolled_back: int
    transactions_in_doubt: int
    transactions_partial: int
    zombies_not_fenced: int
    errors: list[str]

    @property
    def takeovers(self) -> list[float]:
        return [r.takeover_s for r in self.rounds if r.takeover_s is not None]

    def ok(self) -> bool:
        return (self.lost == 0 and self.duplicates_unflagged == 0 and self.transactions_partial == 0
                and self.zombies_not_fenced == 0 and not self.errors
                and all(r.takeover_s is not None for r in self.rounds))


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, int(round(q * (len(ordered) - 1)))))]


def one_round(pair: Pair, load: Load, fault: str, log: Any) -> RoundResult:
    live = pair.live_slot()
    other = 1 - live
    live_member, backup_member = pair.members[live], pair.members[other]
    assert live_member is not None and backup_member is not None
    backup_member.wait_backup()
    time.sleep(1.5)                                        # the rate before: a window of steady load
    fault_at = time.monotonic()
    before = load.rate(fault_at - 1.5, fault_at)
    zombie_fenced = None
    if fault == "kill":
        live_member.kill()
    elif fault == "stop":
        live_member.stop()
    else:   # kill-recovering
        live_member.kill()
        backup_member._wait(lambda text: "now activating" in text or None, 60, "activating")
        backup_member.kill()
        pair.start(live)                                   # both are gone: whichever starts first takes it
        pair.start(other)
    first = load.first_after(fault_at, 60.0)
    takeover = None if first is None else first - fault_at
    if first is None:
        with load.ledger.lock:
            events = load.ledger.events[-6:]
        load.ledger.errors.append(
            f"{fault}: no delivery by a new live within 60 s; consumer {load.conns[0].status}; events {events}; "
            + " | ".join(f"{m.name}: {m.log[-1500:]}" for m in pair.members if m is not None))
    if fault == "kill":
        pair.start(live)                                   # the old live comes back as the new backup
    elif fault == "stop":
        time.sleep(1.0)
        live_member.cont()                                 # the zombie wakes: fenced, then a backup again
        try:
            live_member.wait_fenced(30)
            live_member.wait_backup(30, times=2)
            zombie_fenced = True
        except (TimeoutError, AssertionError):
            zombie_fenced = False
    after_from = (first or time.monotonic()) + 0.5
    wait_until = after_from + 1.5
    while time.monotonic() < wait_until:
        time.sleep(0.05)
    after = load.rate(after_from, after_from + 1.5)
    result = RoundResult(fault, takeover, before, after, zombie_fenced)
    shown = f"{takeover:.3f} s" if takeover is not None else "none"
    log(f"  {fault:16s} takeover {shown:>9}  "
        f"{before:7.0f} -> {after:7.0f} msg/s" + ("" if zombie_fenced is None else f"  zombie fenced: {zombie_fenced}"))
    return result


def run_store(store: str, rounds: int, lease_ms: int, postgres_url: str | None, log: Any = print,
              faults: tuple[str, ...] = FAULTS) -> StoreResult:
    with tempfile.TemporaryDirectory(prefix=f"pymq-failover-{store}-") as tmp:
        pair = Pair(Path(tmp), store, lease_ms, postgres_url)
        load = Load(pair)
        results: list[RoundResult] = []
        try:
            pair.start(0).wait_live()
            pair.start(1).wait_backup()
            load.start()
            for i in range(rounds):
                results.append(one_round(pair, load, faults[i % len(faults)], log))
                if results[-1].takeover_s is None:
                    break                                  # reported in the errors: the run is failed already
            load.stop()
            load.settle()
        finally:
            load.stopping.set()
            load.close()
            pair.close()
        return summarise(store, results, load)


def summarise(store: str, rounds: list[RoundResult], load: Load) -> StoreResult:
    ledger = load.ledger
    expected = load.expected()
    received = load.received()
    lost = sorted(expected - received)
    flagged = unflagged = 0
    unflagged_sample = []
    for body, flags in ledger.deliveries.items():
        for flag in flags[1:]:                              # every copy after the first
            if flag:
                flagged += 1
            else:
                unflagged += 1
                unflagged_sample.append(body)
    partial = 0
    for n in ledger.committed | ledger.rolled_back | ledger.in_doubt:
        seen = sum(1 for k in range(TX_SIZE) if f"t-{n}-{k}" in received)
        if 0 < seen < TX_SIZE or (seen and n in ledger.rolled_back):
            partial += 1
    return StoreResult(
        store=store, rounds=rounds, acknowledged=len(expected), lost=len(lost), lost_sample=lost[:10],
        duplicates_flagged=flagged, duplicates_unflagged=unflagged, unflagged_sample=unflagged_sample[:10],
        transactions_committed=len(ledger.committed), transactions_rolled_back=len(ledger.rolled_back),
        transactions_in_doubt=len(ledger.in_doubt), transactions_partial=partial,
        zombies_not_fenced=sum(1 for r in rounds if r.zombie_fenced is False), errors=list(ledger.errors))


def report(result: StoreResult) -> str:
    takeovers = result.takeovers
    by_fault = defaultdict(list)
    for r in result.rounds:
        if r.takeover_s is not None:
            by_fault[r.fault].append(r.takeover_s)
    before = [r.before_msgs_s for r in result.rounds]
    after = [r.after_msgs_s for r in result.rounds]
    p50, p99 = percentile(takeovers, 0.5), percentile(takeovers, 0.99)
    lines = [
        f"{result.store}: {len(result.rounds)} rounds, {result.acknowledged} acknowledged messages",
        f"  lost {result.lost}  duplicates flagged {result.duplicates_flagged} / unflagged "
        f"{result.duplicates_unflagged}  transactions partial {result.transactions_partial} "
        f"(committed {result.transactions_committed}, rolled back {result.transactions_rolled_back}, "
        f"in doubt {result.transactions_in_doubt})  zombies not fenced {result.zombies_not_fenced}",
        f"  takeover to first delivery: p50 {p50 if p50 is None else round(p50, 3)} s, "
        f"p99 {p99 if p99 is None else round(p99, 3)} s, max {round(max(takeovers), 3) if takeovers else None} s",
    ]
    for fault, values in sorted(by_fault.items()):
        lines.append(f"    {fault}: p50 {percentile(values, 0.5):.3f} s over {len(values)}")
    if before:
        lines.append(f"  msgs/s before {statistics.median(before):.0f}, after {statistics.median(after):.0f} "
                     f"(medians over rounds)")
    if result.lost_sample:
        lines.append(f"  lost: {result.lost_sample}")
    if result.unflagged_sample:
        lines.append(f"  unflagged duplicates: {result.unflagged_sample}")
    for error in result.errors:
        lines.append(f"  error: {error}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    import logging
    logging.getLogger("stomp.py").setLevel(logging.CRITICAL)     # its refused attempts are expected here
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--stores", default="file,postgresql")
    parser.add_argument("--lease-ms", type=int, default=1000)
    parser.add_argument("--postgres", default=os.environ.get("PYMQ_TEST_POSTGRES_URL"))
    parser.add_argument("--json")
    args = parser.parse_args(argv)
    print(f"failover harness: {args.rounds} rounds per store, lease {args.lease_ms} ms, "
          f"{platform.machine()} x{os.cpu_count()} load average {os.getloadavg()[0]:.1f}", flush=True)
    results = []
    failed = False
    for store in args.stores.split(","):
        if store == "postgresql" and not args.postgres:
            print("postgresql: no PYMQ_TEST_POSTGRES_URL (eval \"$(.ci/services.sh)\"); skipped")
            failed = failed or bool(os.environ.get("CI"))
            continue
        print(f"{store}:", flush=True)
        result = run_store(store, args.rounds, args.lease_ms, args.postgres,
                           log=lambda line: print(line, flush=True))
        print(report(result), flush=True)
        results.append(result)
        failed = failed or not result.ok()
    if args.json:
        Path(args.json).write_text(json.dumps([asdict(r) for r in results], indent=1))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
