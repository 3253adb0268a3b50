"""The lease of a store on PostgreSQL (spec/ha.md §1.3–§1.7, §2.2): a lease row and advisory locks.

Which and why: **both**, each for what it is good at.  The *lease row* (``<prefix>ha``, one per
``node_id``) decides: its epoch is the fencing token every write transaction of the SQL device checks in
the same transaction (``FOR KEY SHARE``: exact, the database itself refuses the late write), and its
``expires_at`` is judged by the database's one clock (``clock_timestamp()``), so a live that is stopped
(SIGSTOP, a VM pause) loses the store after ``lease_ms`` although its sessions stay open.  A session
*advisory lock* alone cannot do that: PostgreSQL keeps it for as long as the stopped process's TCP
session looks healthy.  But the advisory lock is dropped the moment a process *dies* (its session ends),
so the candidate that gets it knows at once that the holder is gone (1.5) instead of waiting for the
lease: a second advisory lock is the candidate lock (1.6).  ActiveMQ's JDBC locker uses the lease row
alone (and corrects the local clock by the database's); Artemis's JDBC node manager a lease too.

Locks on the row: a write transaction of the live takes ``FOR KEY SHARE``; a renewal is a plain
``UPDATE`` (``FOR NO KEY UPDATE``, which does not wait for the live's own write transactions); a takeover
takes ``FOR UPDATE`` first, which waits for every write transaction in flight, so none commits after the
new epoch (2.2).  A former live stopped inside a transaction would hold it: its sessions carry
``idle_in_transaction_session_timeout`` = ``lease_ms`` and the name ``pymq-ha:<instance>``, and a
candidate that waits longer than ``lease_ms`` ends them with ``pg_terminate_backend``.
"""
from __future__ import annotations

import hashlib
import os
import threading
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql
from sqlalchemy.engine import Connection, Engine

from .medium import LeaseMedium, log
from .record import LeaseRecord

#: attempts of a takeover whose FOR UPDATE waits on a stopped former live's transaction
TAKE_ATTEMPTS = 3


def _advisory_key(*parts: str) -> int:
    """A signed 64-bit advisory lock key for ``parts`` (stable across processes and versions)."""
    digest = hashlib.sha256(":".join(("pymq-ha", *parts)).encode()).digest()
    return int.from_bytes(digest[:8], "big", signed=True)


class PgLease(LeaseMedium):
    kind = "postgresql"

    def __init__(self, url: str | sa.URL, node: str, *, table_prefix: str = "pymq_", lease_ms: int = 1000,
                 engine_options: dict[str, Any] | None = None) -> None:
        super().__init__(node)
        self.url = sa.make_url(url)
        if self.url.get_backend_name() != "postgresql":
            raise ValueError(f"a PostgreSQL lease needs a postgresql:// URL, not {self.url.get_backend_name()!r}")
        self.lease_ms = lease_ms
        self.table_name = f"{table_prefix}ha"
        self._engine_options = dict(engine_options or {})
        md = sa.MetaData()
        self.table = sa.Table(
            self.table_name, md,
            sa.Column("node_id", sa.String(64), primary_key=True),
            sa.Column("epoch", sa.BigInteger, nullable=False),
            sa.Column("seq", sa.BigInteger, nullable=False),
            sa.Column("renewals", sa.BigInteger, nullable=False),
            sa.Column("instance", sa.LargeBinary, nullable=False),
            sa.Column("host", sa.Text, nullable=False),
            sa.Column("pid", sa.Integer, nullable=False),
            sa.Column("os_locked", sa.Boolean, nullable=False),
            sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
            sa.Column("renewed_at", sa.DateTime(timezone=True), nullable=False),
        )
        self._metadata = md
        self._live_key = _advisory_key(table_prefix, node, "live")
        self._candidate_key = _advisory_key(table_prefix, node, "candidate")
        self._engine: Engine | None = None
        self._locks: Connection | None = None        # the session holding the advisory locks
        self._holds_live = False
        self._candidate = False
        self._expired: dict[tuple[int, int], bool] = {}
        self._mutex = threading.RLock()             # the lock session is used by one thread at a time
        self._renewing = threading.Lock()

    # -- lifecycle ------------------------------------------------------------------------------------------
    def open(self) -> None:
        options = dict(self._engine_options)
        options.setdefault("pool_pre_ping", True)
        options.setdefault("connect_args", {}).setdefault("application_name", f"pymq-ha-lease:{os.getpid()}")
        self._engine = sa.create_engine(self.url, **options)
        try:
            self._metadata.create_all(self._engine, checkfirst=True)
        except sa.exc.DBAPIError:
            self._metadata.create_all(self._engine, checkfirst=True)     # two processes raced on CREATE
        self._locks = self._engine.connect()

    def close(self) -> None:
        with self._mutex:
            locks, self._locks = self._locks, None
            if locks is not None:
                try:
                    locks.rollback()
                    locks.close()         # the session ends: its advisory locks go with it (1.9)
                except sa.exc.SQLAlchemyError:
                    pass
            self._holds_live = self._candidate = False
            if self._engine is not None:
                self._engine.dispose()
                self._engine = None

    @property
    def engine(self) -> Engine:
        if self._engine is None:
            raise OSError("the PostgreSQL lease is not open")
        return self._engine

    # -- reading --------------------------------------------------------------------------------------------
    def _row_record(self, row: Any) -> LeaseRecord:
        return LeaseRecord(int(row.epoch), int(row.seq), int(row.renewals), bytes(row.instance), self.node,
                           row.host, int(row.pid), bool(row.os_locked))

    def read(self) -> LeaseRecord | None:
        t = self.table
        try:
            with self.engine.connect() as conn:
                row = conn.execute(sa.select(t, (t.c.expires_at < sa.func.clock_timestamp()).label("expired"))
                                   .where(t.c.node_id == self.node)).first()
        except sa.exc.SQLAlchemyError as exc:
            raise OSError(f"reading the lease row: {exc}") from None
        if row is None:
            return None
        record = self._row_record(row)
        self._expired = {(record.epoch, record.seq): bool(row.expired)}
        return record

    def expired(self, record: LeaseRecord) -> bool | None:
        return self._expired.get((record.epoch, record.seq), False)

    # -- advisory locks -------------------------------------------------------------------------------------
    def _advisory(self, sql: str, key: int) -> bool:
        with self._mutex:
            locks = self._locks
            if locks is None:
                raise OSError("the PostgreSQL lease is not open")
            try:
                value = locks.execute(sa.text(sql), {"k": key}).scalar()
                locks.commit()
            except sa.exc.SQLAlchemyError as exc:
                raise OSError(f"the lease's lock session: {exc}") from None
            return bool(value)

    def reset(self) -> None:
        """A new lock session: the old one may be dead, and its advisory locks with it (a backup whose
        session dropped must not believe it is still the candidate, nor keep a second one out forever)."""
        with self._mutex:
            old, self._locks = self._locks, None
            self._holds_live = self._candidate = False
            if old is not None:
                try:
                    old.invalidate()          # never back into the pool: its session ends, its locks with it
                except sa.exc.SQLAlchemyError:
                    pass
            try:
                self._locks = self.engine.connect()
            except sa.exc.SQLAlchemyError as exc:
                raise OSError(f"the lease's lock session: {exc}") from None

    def try_candidate(self) -> bool:
        if not self._candidate:
            self._candidate = self._advisory("SELECT pg_try_advisory_lock(:k)", self._candidate_key)
        return self._candidate

    def release_candidate(self) -> None:
        if self._candidate:
            self._advisory("SELECT pg_advisory_unlock(:k)", self._candidate_key)
            self._candidate = False

    def try_os_lock(self) -> bool:
        if not self._holds_live:
            self._holds_live = self._advisory("SELECT pg_try_advisory_lock(:k)", self._live_key)
        return self._holds_live

    def release_os_lock(self) -> None:
        if self._holds_live:
            self._advisory("SELECT pg_advisory_unlock(:k)", self._live_key)
            self._holds_live = False

    @property
    def holds_os_lock(self) -> bool:
        return self._holds_live

    def os_lock_intact(self) -> bool:
        """Whether this session still holds the advisory lock (a dropped connection loses it)."""
        if not self._holds_live:
            return False
        try:
            held = self._advisory(
                "SELECT count(*) > 0 FROM pg_locks WHERE locktype = 'advisory' AND pid = pg_backend_pid() "
                "AND granted AND ((classid::bigint << 32) | objid::bigint) = :k",
                self._live_key)
        except sa.exc.SQLAlchemyError:
            held = False
        if not held:
            log.error("the advisory lock of the store is no longer held by this process's session")
            self._holds_live = False
        return held

    # -- writing the row ------------------------------------------------------------------------------------
    def take(self, seen: LeaseRecord | None, wanted: LeaseRecord, holder_dead: bool) -> bool:
        t = self.table
        lease = sa.text(f"interval '{int(self.lease_ms)} milliseconds'")
        values = dict(epoch=wanted.epoch, seq=wanted.seq, renewals=0, instance=wanted.instance,
                      host=wanted.host, pid=wanted.pid, os_locked=wanted.os_locked,
                      expires_at=sa.func.clock_timestamp() + lease, renewed_at=sa.func.clock_timestamp())
        if seen is None:
            with self.engine.begin() as conn:
                done = conn.execute(postgresql.insert(t).values(node_id=self.node, **values)
                                    .on_conflict_do_nothing().returning(t.c.node_id)).first() is not None
            if done:
                self.mine, self.fenced_reason = wanted, None
            return done
        for attempt in range(TAKE_ATTEMPTS):
            try:
                with self.engine.begin() as conn:
                    conn.execute(sa.text(f"SET LOCAL lock_timeout = {int(self.lease_ms)}"))
                    # FOR UPDATE: waits for the write transactions of the old epoch in flight (their FOR KEY SHARE)
                    row = conn.execute(sa.select(t.c.epoch, t.c.seq, (t.c.expires_at < sa.func.clock_timestamp())
                                                 .label("expired")).where(t.c.node_id == self.node)
                                       .with_for_update()).first()
                    if row is None or (int(row.epoch), int(row.seq)) != (seen.epoch, seen.seq):
                        return False
                    if not (row.expired or holder_dead):
                        return False
                    conn.execute(t.update().where(t.c.node_id == self.node).values(**values))
                self.mine, self.fenced_reason = wanted, None
                return True
            except sa.exc.OperationalError as exc:
                if "lock timeout" not in str(exc) and "lock_timeout" not in str(exc):
                    raise OSError(f"taking the lease row: {exc}") from None
                ended = self._end_sessions(seen.instance)
                log.warning("taking over: the former live's transactions held the lease row for %d ms; ended "
                            "%d of its sessions (attempt %d)", self.lease_ms, ended, attempt + 1)
        return False

    def _end_sessions(self, instance: bytes) -> int:
        with self.engine.begin() as conn:
            return len(conn.execute(sa.text(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = :name "
                "AND pid <> pg_backend_pid()"), {"name": session_name(instance)}).all())

    def renew(self, os_locked: bool, wait: bool = True) -> LeaseRecord | None:
        mine = self.mine
        if mine is None:
            return None
        if not self._renewing.acquire(timeout=-1 if wait else 0.05):
            raise TimeoutError("a renewal is in progress")
        t = self.table
        try:
            try:
                with self.engine.begin() as conn:
                    if not wait:
                        conn.execute(sa.text("SET LOCAL lock_timeout = 50"))
                        conn.execute(sa.text("SET LOCAL statement_timeout = 200"))
                    lease = sa.text(f"interval '{int(self.lease_ms)} milliseconds'")
                    row = conn.execute(
                        t.update().where(t.c.node_id == self.node, t.c.epoch == mine.epoch,
                                         t.c.instance == mine.instance)
                        .values(seq=t.c.seq + 1, renewals=t.c.renewals + 1, os_locked=os_locked,
                                expires_at=sa.func.clock_timestamp() + lease, renewed_at=sa.func.clock_timestamp())
                        .returning(t)).first()
            except sa.exc.OperationalError as exc:
                if not wait:
                    raise TimeoutError(str(exc)) from None
                raise OSError(f"lease renewal: {exc}") from None
            if row is None:
                self.fenced(self.read())
                return None
            self.mine = self._row_record(row)
            return self.mine
        finally:
            self._renewing.release()

    # -- the fence ------------------------------------------------------------------------------------------
    def guard_sql(self, conn: Any) -> None:
        """First statement of every write transaction of the SQL device (2.2)."""
        self.check()
        mine = self.mine
        t = self.table
        row = conn.execute(sa.select(t.c.epoch, t.c.instance, t.c.seq, t.c.renewals, t.c.host, t.c.pid,
                                     t.c.os_locked).where(t.c.node_id == self.node).with_for_update(key_share=True)
                           ).first()
        if mine is None or row is None or int(row.epoch) != mine.epoch or bytes(row.instance) != mine.instance:
            raise self.fenced(None if row is None else self._row_record(row))

    def sql_connect_args(self, dialect: str) -> dict:
        if dialect != "postgresql":
            return {}
        return {"application_name": session_name(self.instance),
                "options": f"-c idle_in_transaction_session_timeout={int(self.lease_ms)}"}

    def verify(self) -> None:
        self.check()


def session_name(instance: bytes) -> str:
    """The ``application_name`` of a process's SQL device sessions (a candidate may end them: 2.2)."""
    return "pymq-ha:" + instance.hex()
