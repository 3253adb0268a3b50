"""The SQL database holding device: SQLite embedded by default, PostgreSQL for a store shared by brokers.

Rows (SQLAlchemy Core, names prefixed by ``table_prefix``, default ``pymq_``; the layout is specified in
``spec/storage.md``, section "SQL device"):

* ``message``   (broker_id, key) -> destination, seq, persistent, size, data
* ``reference`` (broker_id, key, queue): a queue or subscription still owes ``key`` to a consumer
* ``catalog``   (broker_id, name) -> value
* ``pending``   id -> target broker_id (NULL: any), destination, persistent, data, created_ms: messages
  an application wrote in its own transaction (:func:`send_in_transaction`) that no broker has claimed

Invariants:

* Every row belongs to one broker (``broker_id``); a broker reads, recovers and frees only its own rows,
  so several brokers can share one PostgreSQL database.  :meth:`SqlDevice.take_over` moves another
  broker's messages to this one (new keys), a chunk per transaction.
* Writes are buffered (see :mod:`._buffered`) and ``sync`` commits them as one transaction; a message
  row exists in the database only while at least one reference row names it (the commit that drops the
  last reference deletes the message in the same transaction).
* Non-persistent rows are a paging area: ``open`` deletes this broker's non-persistent rows, ``recover``
  never yields them.
* A pending row becomes a message of exactly one broker: :meth:`SqlDevice.claim_pending` inserts the
  message and deletes the pending row in one transaction (``FOR UPDATE SKIP LOCKED`` on PostgreSQL, the
  database write lock on SQLite), so a crash leaves it either pending or claimed, never both or neither.
* The broker learns of committed pending rows without polling: PostgreSQL ``NOTIFY`` sent in the
  application's transaction (delivered only at commit), or on SQLite an in-process signal raised when
  the application's connection commits (see :class:`PendingListener`).
"""
from __future__ import annotations

import os
import re
import select
import shutil
import threading
import time
import weakref
from dataclasses import dataclass
from typing import Any
from collections.abc import Callable, Iterable, Iterator, Sequence

import sqlalchemy as sa
from sqlalchemy import event
from sqlalchemy.engine import Connection, Engine

from pymq.errors import ConfigError, StorageError

from ._buffered import ADD, DROP, BufferedDevice, WriteBatch
from .ha.fence import NO_FENCE, Fence, Fenced
from .device import StoredMessage

__all__ = [
    "SqlDevice", "PendingMessage", "PendingListener", "send_in_transaction", "create_tables",
    "drop_tables", "DEFAULT_TABLE_PREFIX", "SCHEMA_VERSION",
]

SCHEMA_VERSION = 1
DEFAULT_TABLE_PREFIX = "pymq_"
_PREFIX_RE = re.compile(r"[a-z][a-z0-9_]{0,40}\Z")
_BROKER_ID_RE = re.compile(r"[A-Za-z0-9_.:-]{1,64}\Z")
_CHUNK = 500                      # keys per IN (...) list: well under SQLite's variable limit


# -- tables -------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class _Tables:
    metadata: sa.MetaData
    message: sa.Table
    reference: sa.Table
    catalog: sa.Table
    pending: sa.Table
    channel: str                  # NOTIFY channel of the pending table


_TABLES: dict[str, _Tables] = {}
_TABLES_LOCK = threading.Lock()


def _tables(prefix: str) -> _Tables:
    if not _PREFIX_RE.match(prefix):
        raise ConfigError(f"table prefix {prefix!r} must match {_PREFIX_RE.pattern}", prefix=prefix)
    with _TABLES_LOCK:
        found = _TABLES.get(prefix)
        if found is not None:
            return found
        md = sa.MetaData()
        broker = lambda **kw: sa.Column("broker_id", sa.String(64), **kw)  # noqa: E731
        message = sa.Table(
            f"{prefix}message", md,
            broker(primary_key=True),
            sa.Column("key", sa.BigInteger, primary_key=True, autoincrement=False),
            sa.Column("destination", sa.Text, nullable=False),
            sa.Column("seq", sa.BigInteger, nullable=False),
            sa.Column("persistent", sa.Boolean, nullable=False),
            sa.Column("size", sa.Integer, nullable=False),
            sa.Column("data", sa.LargeBinary, nullable=False),
            # recovery reads each broker's messages in (seq, key) order
            sa.Index(f"{prefix}message_order", "broker_id", "seq", "key"),
        )
        reference = sa.Table(
            f"{prefix}reference", md,
            broker(primary_key=True),
            sa.Column("key", sa.BigInteger, primary_key=True, autoincrement=False),
            sa.Column("queue", sa.Text, primary_key=True),
        )
        catalog = sa.Table(
            f"{prefix}catalog", md,
            broker(primary_key=True),
            sa.Column("name", sa.String(512), primary_key=True),
            sa.Column("value", sa.LargeBinary, nullable=False),
        )
        pending = sa.Table(
            f"{prefix}pending", md,
            # INTEGER PRIMARY KEY on SQLite is the rowid: the only autoincrementing column it has
            sa.Column("id", sa.BigInteger().with_variant(sa.Integer, "sqlite"), primary_key=True,
                      autoincrement=True),
            sa.Column("broker_id", sa.String(64), nullable=True),
            sa.Column("destination", sa.Text, nullable=False),
            sa.Column("persistent", sa.Boolean, nullable=False),
            sa.Column("data", sa.LargeBinary, nullable=False),
            sa.Column("created_ms", sa.BigInteger, nullable=False),
        )
        found = _Tables(md, message, reference, catalog, pending, f"{prefix}pending")
        _TABLES[prefix] = found
        return found


def create_tables(bind: Engine | Connection, table_prefix: str = DEFAULT_TABLE_PREFIX) -> None:
    """Create the device's tables if missing (``SqlDevice.open`` does it too; for an application
    that wants :func:`send_in_transaction` to work before any broker has opened the database)."""
    _tables(table_prefix).metadata.create_all(bind, checkfirst=True)


def drop_tables(bind: Engine | Connection, table_prefix: str = DEFAULT_TABLE_PREFIX) -> None:
    """Drop the device's tables: every broker's messages, references, catalog and pending rows."""
    _tables(table_prefix).metadata.drop_all(bind, checkfirst=True)


def _insert(conn: Connection, table: sa.Table):
    """INSERT that skips rows whose primary key exists: a batch retried after a commit whose outcome
    was lost (connection dropped after COMMIT) must not fail on its own earlier rows."""
    name = conn.dialect.name
    if name == "postgresql":
        from sqlalchemy.dialects import postgresql
        return postgresql.insert(table).on_conflict_do_nothing()
    if name == "sqlite":
        from sqlalchemy.dialects import sqlite
        return sqlite.insert(table).on_conflict_do_nothing()
    return table.insert()


def _chunks(items: Sequence, size: int = _CHUNK) -> Iterator[Sequence]:
    for start in range(0, len(items), size):
        yield items[start:start + size]


def _grouped(rows: Iterable) -> Iterator[tuple[int, int, list[str]]]:
    """(key, size, queue) rows ordered by key -> (key, size, [queues])."""
    current: tuple[int, int, list[str]] | None = None
    for key, size, queue in rows:
        if current is None or current[0] != key:
            if current is not None:
                yield current
            current = (key, size, [])
        current[2].append(queue)
    if current is not None:
        yield current


def _begin_mode(conn: Connection) -> None:
    """SQLite: open every transaction ourselves (the driver's implicit BEGIN is switched off), as
    BEGIN IMMEDIATE when the connection is marked for writing, so a writer waits for the database
    write lock up front instead of failing on a lock upgrade half way."""
    mode = conn.get_execution_options().get("pymq_begin", "DEFERRED")
    conn.exec_driver_sql(f"BEGIN {mode}")


# -- the device ---------------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class PendingMessage:
    """A message an application committed in its own transaction, waiting for a broker."""

    id: int                       # pending row id: increasing in commit-ish order
    destination: str
    persistent: bool
    data: bytes                   # encoded by the SDK with the broker's message codec
    created_ms: int               # application clock, ms since the epoch
    broker_id: str | None         # the broker it was addressed to; None: any broker


class SqlDevice(BufferedDevice):
    """Holding device on a SQL database through SQLAlchemy Core.

    ``url``: ``sqlite:///path/to/pymq.db`` (embedded default; WAL journal) or
    ``postgresql+psycopg://user:pw@host/db`` (shared by several brokers, each with its own
    ``broker_id``).  ``synchronous`` is SQLite's PRAGMA synchronous: FULL (default) makes every
    ``sync`` survive a power cut; NORMAL survives a crash of the process only.
    """

    kind = "sql"
    # a fenced write transaction (spec/ha.md §2.2) fails like one the server refused: nothing committed
    _backend_errors = (sa.exc.SQLAlchemyError, Fenced)

    def __init__(self, name: str, url: str | sa.URL, *, broker_id: str = "broker",
                 table_prefix: str = DEFAULT_TABLE_PREFIX, synchronous: str = "FULL",
                 busy_timeout_s: float = 10.0, engine_options: dict[str, Any] | None = None,
                 fence: Fence = NO_FENCE) -> None:
        super().__init__(name)
        #: high availability's fence (spec/ha.md §2.2): the first statement of every write transaction
        self.fence = fence
        if not _BROKER_ID_RE.match(broker_id):
            raise ConfigError(f"broker id {broker_id!r} must match {_BROKER_ID_RE.pattern}",
                              broker_id=broker_id)
        if synchronous.upper() not in ("OFF", "NORMAL", "FULL", "EXTRA"):
            raise ConfigError(f"synchronous={synchronous!r}: expected OFF, NORMAL, FULL or EXTRA")
        self.url = sa.make_url(url)
        self.broker_id = broker_id
        self.table_prefix = table_prefix
        self._t = _tables(table_prefix)
        self._synchronous = synchronous.upper()
        self._busy_timeout_s = busy_timeout_s
        self._engine_options = dict(engine_options or {})
        self._engine: Engine | None = None
        self._dialect = self.url.get_backend_name()
        if self._dialect not in ("sqlite", "postgresql"):
            raise ConfigError(f"SQL device supports sqlite and postgresql, not {self._dialect!r}")
        if self._dialect == "sqlite" and self.url.database in (None, "", ":memory:"):
            raise ConfigError("the SQL device needs a SQLite file (sqlite:///path), not an in-memory database")
        self._directory = os.path.dirname(os.path.abspath(self.url.database or "."))

    @property
    def _db(self) -> Engine:
        if self._engine is None:
            raise StorageError(f"{self._describe()} is not open", device=self.name)
        return self._engine

    def _describe(self) -> str:
        return f"sql device {self.name!r} ({self.url.render_as_string(hide_password=True)})"

    # -- lifecycle ------------------------------------------------------------------------------
    def open(self) -> None:
        try:
            self._engine = self._make_engine()
            self._create_tables()
            me = self.broker_id
            m, r = self._t.message, self._t.reference
            with self._writer() as conn:
                # Non-persistent rows were only paged out; they do not outlive the broker that wrote them.
                volatile = sa.select(m.c.key).where(m.c.broker_id == me, m.c.persistent.is_(False))
                conn.execute(r.delete().where(r.c.broker_id == me, r.c.key.in_(volatile)))
                conn.execute(m.delete().where(m.c.broker_id == me, m.c.persistent.is_(False)))
                conn.execute(m.delete().where(m.c.broker_id == me, ~self._referenced(m)))
            self._reset_held()
            with self._db.connect() as conn:
                rows = conn.execute(
                    sa.select(r.c.key, m.c.size, r.c.queue)
                    .join_from(r, m, sa.and_(m.c.broker_id == r.c.broker_id, m.c.key == r.c.key))
                    .where(r.c.broker_id == me).order_by(r.c.key)
                    .execution_options(yield_per=10_000))
                self._hold(_grouped(rows))
        except sa.exc.SQLAlchemyError as exc:
            if self._engine is not None:
                self._engine.dispose()
                self._engine = None     # not open: status() must not probe
            raise self._failure("open", exc) from exc
        with self._lock:
            self._online = True
        self._opened = True

    def close(self) -> None:
        if not self._opened:
            return
        try:
            self.sync()
        finally:
            self._opened = False
            if self._engine is not None:
                self._engine.dispose()
                self._engine = None
            self._reset_held()

    def abandon(self) -> None:
        """Let the database go without committing what waits (another process holds the store)."""
        self._opened = False
        with self._lock:
            self._online = False
            self._pending = WriteBatch()
        if self._engine is not None:
            self._engine.dispose()
            self._engine = None

    def _make_engine(self) -> Engine:
        options = dict(self._engine_options)
        if self._dialect == "sqlite":
            os.makedirs(self._directory, exist_ok=True)
            options.setdefault("connect_args", {}).update(
                timeout=self._busy_timeout_s, check_same_thread=False)
            engine = sa.create_engine(self.url, **options)
            pragmas = ("PRAGMA journal_mode=WAL", f"PRAGMA synchronous={self._synchronous}",
                       f"PRAGMA busy_timeout={int(self._busy_timeout_s * 1000)}",
                       "PRAGMA foreign_keys=OFF", "PRAGMA temp_store=MEMORY")

            @event.listens_for(engine, "connect")
            def _configure(dbapi_connection, _record):  # noqa: ANN001
                dbapi_connection.isolation_level = None   # we emit BEGIN ourselves (_begin_mode)
                cursor = dbapi_connection.cursor()
                for pragma in pragmas:
                    cursor.execute(pragma)
                cursor.close()

            event.listen(engine, "begin", _begin_mode)
            return engine
        options.setdefault("pool_pre_ping", True)
        ha_args = self.fence.sql_connect_args(self._dialect)
        if ha_args:
            options["connect_args"] = {**options.get("connect_args", {}), **ha_args}
        return sa.create_engine(self.url, **options)

    def _create_tables(self) -> None:
        try:
            self._t.metadata.create_all(self._db, checkfirst=True)
        except sa.exc.DBAPIError:
            # Two brokers opening one new PostgreSQL database at once race on CREATE TABLE;
            # the loser finds the tables on its second look.
            self._t.metadata.create_all(self._db, checkfirst=True)

    def _writer(self) -> _WriteTransaction:
        """A connection in a write transaction (BEGIN IMMEDIATE on SQLite), committed on exit."""
        return _WriteTransaction(self._db, self.fence)

    def _referenced(self, m: sa.Table):
        r = self._t.reference
        return sa.exists().where(r.c.broker_id == m.c.broker_id, r.c.key == m.c.key)

    # -- BufferedDevice hooks -------------------------------------------------------------------
    def _commit(self, batch: WriteBatch) -> None:
        t, me = self._t, self.broker_id
        messages = [dict(broker_id=me, key=msg.key, destination=msg.destination, seq=msg.seq,
                         persistent=msg.persistent, size=msg.size, data=msg.data)
                    for msg, _ in batch.messages.values()]
        refs = [dict(broker_id=me, key=key, queue=queue)
                for key, (_, queues) in batch.messages.items() for queue in sorted(queues)]
        refs += [dict(broker_id=me, key=key, queue=queue)
                 for (key, queue), op in batch.ref_ops.items() if op == ADD]
        drops = [dict(b_broker=me, b_key=key, b_queue=queue)
                 for (key, queue), op in batch.ref_ops.items() if op == DROP and key not in batch.freed]
        m = t.message
        r = t.reference
        with self._writer() as conn:
            if messages:
                conn.execute(_insert(conn, t.message), messages)
            if refs:
                conn.execute(_insert(conn, r), refs)
            if drops:
                conn.execute(r.delete().where(r.c.broker_id == sa.bindparam("b_broker"),
                                              r.c.key == sa.bindparam("b_key"),
                                              r.c.queue == sa.bindparam("b_queue")), drops)
            for keys in _chunks(sorted(batch.freed)):
                conn.execute(r.delete().where(r.c.broker_id == me, r.c.key.in_(keys)))
                conn.execute(m.delete().where(m.c.broker_id == me, m.c.key.in_(keys)))
            if batch.meta:
                c = t.catalog
                names = sorted(batch.meta)
                for chunk in _chunks(names):
                    conn.execute(c.delete().where(c.c.broker_id == me, c.c.name.in_(chunk)))
                rows = [dict(broker_id=me, name=n, value=v) for n, v in batch.meta.items() if v is not None]
                if rows:
                    conn.execute(c.insert(), rows)

    def _read_stored(self, key: int) -> StoredMessage | None:
        m = self._t.message
        with self._db.connect() as conn:
            row = conn.execute(sa.select(m.c.key, m.c.destination, m.c.seq, m.c.persistent, m.c.data)
                               .where(m.c.broker_id == self.broker_id, m.c.key == key)).first()
        return None if row is None else StoredMessage(row.key, row.destination, row.seq,
                                                      bool(row.persistent), bytes(row.data))

    def _stored_meta(self) -> dict[str, bytes]:
        c = self._t.catalog
        with self._db.connect() as conn:
            rows = conn.execute(sa.select(c.c.name, c.c.value).where(c.c.broker_id == self.broker_id))
            return {name: bytes(value) for name, value in rows}

    def _status_extra(self) -> dict:
        extra: dict[str, Any] = {"dialect": self._dialect, "broker_id": self.broker_id,
                                 "database": self.url.render_as_string(hide_password=True)}
        if self._dialect == "sqlite":
            try:
                extra["disk_free"] = shutil.disk_usage(self._directory).free
            except OSError:
                pass
        if self._engine is None:
            return extra
        p = self._t.pending
        try:     # doubles as the liveness probe the storage monitor relies on
            with self._db.connect() as conn:
                extra["pending"] = conn.execute(
                    sa.select(sa.func.count()).select_from(p)
                    .where(sa.or_(p.c.broker_id.is_(None), p.c.broker_id == self.broker_id))).scalar_one()
        except sa.exc.SQLAlchemyError as exc:
            self._failure("status probe", exc)
            extra["error"] = str(exc).splitlines()[0]
        else:
            with self._lock:
                self._online = True
        return extra

    def status(self):
        status = super().status()
        if "disk_free" in status.extra:
            status.bytes_free = status.extra["disk_free"]
        return status

    # -- recovery and takeover ------------------------------------------------------------------
    def recover(self, broker_id: str | None = None, *, chunk: int = 1000
                ) -> Iterator[tuple[StoredMessage, list[str]]]:
        """Every persistent, referenced message of ``broker_id`` (default: this broker), in (seq, key)
        order, with its queues.  Reads committed rows only, a chunk per short transaction, so a
        huge store streams.  Reading another broker's rows does not change them: see :meth:`take_over`."""
        self._check_open()
        owner = broker_id or self.broker_id
        last: tuple[int, int] | None = None
        while True:
            try:
                with self._db.connect() as conn:
                    found = self._read_chunk(conn, owner, last, chunk, lock=False)
            except sa.exc.SQLAlchemyError as exc:
                raise self._failure("recover", exc) from exc
            yield from found
            if len(found) < chunk:
                return
            last = (found[-1][0].seq, found[-1][0].key)

    def _read_chunk(self, conn: Connection, owner: str, after: tuple[int, int] | None, limit: int,
                    lock: bool) -> list[tuple[StoredMessage, list[str]]]:
        m, r = self._t.message, self._t.reference
        query = sa.select(m.c.key, m.c.destination, m.c.seq, m.c.data).where(
            m.c.broker_id == owner, m.c.persistent.is_(True))
        if after is not None:
            seq, key = after
            query = query.where(sa.or_(m.c.seq > seq, sa.and_(m.c.seq == seq, m.c.key > key)))
        query = query.order_by(m.c.seq, m.c.key).limit(limit)
        if lock and conn.dialect.name == "postgresql":
            query = query.with_for_update(skip_locked=True)
        rows = conn.execute(query).all()
        queues: dict[int, list[str]] = {}
        for chunk in _chunks([row.key for row in rows]):
            for key, queue in conn.execute(sa.select(r.c.key, r.c.queue).where(
                    r.c.broker_id == owner, r.c.key.in_(chunk)).order_by(r.c.key, r.c.queue)):
                queues.setdefault(key, []).append(queue)
        # A message without references is garbage a crash left between two statements of an older
        # layout; the contract says recover yields referenced messages only.
        return [(StoredMessage(row.key, row.destination, row.seq, True, bytes(row.data)), queues[row.key])
                for row in rows if row.key in queues]

    def brokers(self) -> dict[str, int]:
        """Broker ids that hold messages in this database, with their message counts."""
        self._check_open()
        m = self._t.message
        try:
            with self._db.connect() as conn:
                return dict(conn.execute(sa.select(m.c.broker_id, sa.func.count()).group_by(m.c.broker_id)).all())
        except sa.exc.SQLAlchemyError as exc:
            raise self._failure("listing brokers", exc) from exc

    def take_over(self, broker_id: str, rekey: Callable[[StoredMessage], StoredMessage], *,
                  chunk: int = 500) -> Iterator[tuple[StoredMessage, list[str]]]:
        """Move another broker's persistent messages to this broker, yielding each as moved.

        ``rekey(old)`` returns the message as this broker will hold it (a key from this broker's key
        space, possibly a new seq).  Each chunk moves in one transaction: after a crash a message
        belongs to exactly one of the two brokers, and calling ``take_over`` again resumes.  On
        PostgreSQL the rows being moved are locked (SKIP LOCKED), so two brokers taking over the same
        broker split its messages instead of duplicating them; deciding who takes over is the
        cluster's business.  The other broker's catalog and non-persistent rows are left in place.
        """
        self._check_open()
        if broker_id == self.broker_id:
            raise ConfigError("a broker cannot take over its own rows", broker_id=broker_id)
        m, r, me = self._t.message, self._t.reference, self.broker_id
        while True:
            moved: list[tuple[StoredMessage, list[str]]] = []
            try:
                with self._writer() as conn:
                    found = self._read_chunk(conn, broker_id, None, chunk, lock=True)
                    if not found:
                        return
                    rows, refs = [], []
                    for old, queues in found:
                        new = rekey(old)
                        moved.append((new, queues))
                        rows.append(dict(broker_id=me, key=new.key, destination=new.destination,
                                         seq=new.seq, persistent=True, size=new.size, data=new.data))
                        refs += [dict(broker_id=me, key=new.key, queue=q) for q in queues]
                    conn.execute(_insert(conn, m), rows)
                    conn.execute(_insert(conn, r), refs)
                    old_keys = [old.key for old, _ in found]
                    for keys in _chunks(old_keys):
                        conn.execute(r.delete().where(r.c.broker_id == broker_id, r.c.key.in_(keys)))
                        conn.execute(m.delete().where(m.c.broker_id == broker_id, m.c.key.in_(keys)))
            except sa.exc.SQLAlchemyError as exc:
                raise self._failure(f"taking over broker {broker_id!r}", exc) from exc
            self._hold((msg.key, msg.size, queues) for msg, queues in moved)
            yield from moved

    # -- messages written in the application's transaction -------------------------------------
    def claim_pending(self, assign: Callable[[PendingMessage], tuple[StoredMessage, Sequence[str]] | None],
                      *, limit: int = 100) -> list[tuple[StoredMessage, list[str]]]:
        """Turn up to ``limit`` pending rows (addressed to this broker or to any) into messages.

        ``assign(pending)`` runs inside the claiming transaction and returns the message as this
        broker holds it (its key, seq and final encoding) with the queues that owe it, or None to
        discard it (a topic nobody subscribes to).  The inserts and the deletion of the pending rows
        commit together; if ``assign`` raises, nothing is claimed and the exception propagates
        (keys it handed out are simply never used).  Returns the claimed messages in pending-id
        order; a full list (``limit`` long) means more may be waiting: call again.
        """
        self._check_open()
        t, me = self._t, self.broker_id
        p = t.pending
        claimed: list[tuple[StoredMessage, list[str]]] = []
        try:
            with self._writer() as conn:
                query = (sa.select(p).where(sa.or_(p.c.broker_id.is_(None), p.c.broker_id == me))
                         .order_by(p.c.id).limit(limit))
                if conn.dialect.name == "postgresql":
                    query = query.with_for_update(skip_locked=True)
                rows = conn.execute(query).all()
                if not rows:
                    return []
                messages, refs = [], []
                for row in rows:
                    result = assign(PendingMessage(row.id, row.destination, bool(row.persistent),
                                                   bytes(row.data), row.created_ms, row.broker_id))
                    if result is None:
                        continue
                    message, queues = result[0], sorted(set(result[1]))
                    if not queues:
                        continue
                    claimed.append((message, queues))
                    messages.append(dict(broker_id=me, key=message.key, destination=message.destination,
                                         seq=message.seq, persistent=message.persistent,
                                         size=message.size, data=message.data))
                    refs += [dict(broker_id=me, key=message.key, queue=q) for q in queues]
                if messages:
                    conn.execute(_insert(conn, t.message), messages)
                    conn.execute(_insert(conn, t.reference), refs)
                for ids in _chunks([row.id for row in rows]):
                    conn.execute(p.delete().where(p.c.id.in_(ids)))
        except sa.exc.SQLAlchemyError as exc:
            raise self._failure("claiming pending messages", exc) from exc
        self._hold((msg.key, msg.size, queues) for msg, queues in claimed)
        return claimed

    def pending_listener(self) -> PendingListener:
        """A listener that wakes up when an application commits a pending row for this broker.

        Protocol for the broker: create the listener, then call :meth:`claim_pending` once (rows
        committed before the listener existed), then after every wake-up (``wait`` returned True,
        or ``fileno`` became readable and ``drain`` returned True) call it until it returns a short
        list.  Signals coalesce: one wake-up may stand for many rows.
        """
        self._check_open()
        if self._dialect == "postgresql":
            return _PostgresListener(self.url, self._t.channel, self.broker_id)
        return _LocalListener(_local_key(self.url, self.table_prefix))


class _WriteTransaction:
    """``with`` block: a connection in a write transaction, committed on success."""

    def __init__(self, engine: Engine, fence: Fence = NO_FENCE) -> None:
        self._engine = engine
        self._fence = fence
        self._tx: Any = None

    def __enter__(self) -> Connection:
        conn = self._engine.connect().execution_options(pymq_begin="IMMEDIATE")
        try:
            self._tx = conn.begin()
            self._fence.guard_sql(conn)      # high availability: nothing of an old epoch commits (2.2)
        except BaseException:
            if self._tx is not None and self._tx.is_active:
                self._tx.rollback()
            conn.close()
            raise
        self._conn = conn
        return conn

    def __exit__(self, exc_type, exc, tb) -> None:  # noqa: ANN001
        try:
            if exc_type is None:
                self._tx.commit()
            else:
                self._tx.rollback()
        finally:
            self._conn.close()


# -- listeners ----------------------------------------------------------------------------------------

class PendingListener:
    """Wake-ups for committed pending rows.  Three ways to use one:

    * blocking: ``while running: if listener.wait(1.0): device.claim_pending(...)``;
    * event loop: ``loop.add_reader(listener.fileno(), on_readable)`` where ``on_readable`` calls
      ``listener.drain()`` (never blocks) and claims when it returns True;
    * iteration: ``for _ in listener.wake_ups(timeout): ...`` yields once per wake-up until closed.

    One thread at a time per listener; ``close`` from the thread that uses it.
    """

    def fileno(self) -> int:
        raise NotImplementedError

    def drain(self) -> bool:
        """Consume what has arrived without blocking; True if it includes a wake-up for us."""
        raise NotImplementedError

    def wait(self, timeout: float | None = None) -> bool:
        """Block until a wake-up (True) or ``timeout`` seconds pass (False)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            if self.drain():
                return True
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                return False
            readable, _, _ = select.select([self.fileno()], [], [], left)
            if not readable and left is not None:
                return self.drain()

    def wake_ups(self, timeout: float = 1.0) -> Iterator[None]:
        while not self.closed:
            if self.wait(timeout):
                yield None

    closed = False

    def close(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> PendingListener:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def notification_wakes(payload: str, broker_id: str) -> bool:
    """Whether a NOTIFY on the pending channel concerns ``broker_id``: empty payload means any broker."""
    return payload == "" or payload == broker_id


class _PostgresListener(PendingListener):
    """LISTEN on a dedicated autocommit psycopg connection (NOTIFY is delivered only at commit)."""

    def __init__(self, url: sa.URL, channel: str, broker_id: str) -> None:
        import psycopg
        from psycopg import sql

        self._broker_id = broker_id
        conninfo = url.set(drivername="postgresql").render_as_string(hide_password=False)
        try:
            self._conn = psycopg.connect(conninfo, autocommit=True)
            self._conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(channel)))
        except psycopg.Error as exc:
            raise StorageError(f"cannot LISTEN on {channel!r} at "
                               f"{url.render_as_string(hide_password=True)}: {exc}") from exc
        self._psycopg = psycopg

    def fileno(self) -> int:
        return self._conn.fileno()

    def drain(self) -> bool:
        try:
            return any(notification_wakes(n.payload, self._broker_id) for n in self._conn.notifies(timeout=0))
        except self._psycopg.Error as exc:
            raise StorageError(f"pending listener lost its PostgreSQL connection: {exc}") from exc

    def wait(self, timeout: float | None = None) -> bool:
        deadline = None if timeout is None else time.monotonic() + timeout
        try:
            while True:
                left = None if deadline is None else max(0.0, deadline - time.monotonic())
                wanted = False
                for note in self._conn.notifies(timeout=left, stop_after=1):
                    wanted = wanted or notification_wakes(note.payload, self._broker_id)
                if wanted:
                    self.drain()      # coalesce whatever else already arrived
                    return True
                if deadline is not None and time.monotonic() >= deadline:
                    return False
        except self._psycopg.Error as exc:
            raise StorageError(f"pending listener lost its PostgreSQL connection: {exc}") from exc

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self._conn.close()


def _local_key(url: sa.URL, prefix: str) -> tuple[str, str]:
    return os.path.realpath(url.database or ""), prefix


_LOCAL_LISTENERS: dict[tuple[str, str], set[_LocalListener]] = {}
_LOCAL_LOCK = threading.Lock()


def _signal_local(key: tuple[str, str]) -> None:
    with _LOCAL_LOCK:
        listeners = list(_LOCAL_LISTENERS.get(key, ()))
    for listener in listeners:
        listener.signal()


class _LocalListener(PendingListener):
    """SQLite, same process: a self-pipe written by the application's commit hook."""

    def __init__(self, key: tuple[str, str]) -> None:
        self._key = key
        self._fd_lock = threading.Lock()    # a late signal must never write to a closed (reused) fd
        self._read_fd, self._write_fd = os.pipe()
        os.set_blocking(self._read_fd, False)
        os.set_blocking(self._write_fd, False)
        with _LOCAL_LOCK:
            _LOCAL_LISTENERS.setdefault(key, set()).add(self)

    def signal(self) -> None:
        with self._fd_lock:
            if self.closed:
                return
            try:
                os.write(self._write_fd, b"!")
            except BlockingIOError:
                pass    # pipe full: a wake-up is already pending

    def fileno(self) -> int:
        return self._read_fd

    def drain(self) -> bool:
        got = False
        while True:
            try:
                chunk = os.read(self._read_fd, 4096)
            except BlockingIOError:
                return got
            if not chunk:
                return got
            got = True

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        with _LOCAL_LOCK:
            listeners = _LOCAL_LISTENERS.get(self._key)
            if listeners is not None:
                listeners.discard(self)
                if not listeners:
                    del _LOCAL_LISTENERS[self._key]
        with self._fd_lock:
            os.close(self._read_fd)
            os.close(self._write_fd)


# -- the application side -----------------------------------------------------------------------------

#: transaction owner (Connection or Session) -> local signal keys to raise when it commits
_ARMED: weakref.WeakKeyDictionary[Any, set[tuple[str, str]]] = weakref.WeakKeyDictionary()
_ARMED_LOCK = threading.Lock()


def _fire(owner: Any) -> None:
    with _ARMED_LOCK:
        keys = _ARMED.get(owner)
        fired = set(keys) if keys else set()
        if keys:
            keys.clear()
    for key in fired:
        _signal_local(key)


def _disarm(owner: Any) -> None:
    with _ARMED_LOCK:
        keys = _ARMED.get(owner)
        if keys:
            keys.clear()


def _arm(owner: Any, key: tuple[str, str]) -> None:
    """Raise the local signal ``key`` when ``owner``'s transaction commits (once per transaction)."""
    with _ARMED_LOCK:
        first = owner not in _ARMED
        _ARMED.setdefault(owner, set()).add(key)
    if not first:
        return
    if isinstance(owner, Connection):
        # Fires just before the DBAPI commit.  The application's connection holds SQLite's write lock
        # until that commit ends, and claim_pending opens with BEGIN IMMEDIATE, so a broker woken
        # this early waits on the lock and then sees the committed row (or nothing, on failure).
        event.listen(owner, "commit", lambda conn: _fire(owner))
        event.listen(owner, "rollback", lambda conn: _disarm(owner))
    else:
        event.listen(owner, "after_commit", lambda session: _fire(owner))
        event.listen(owner, "after_rollback", lambda session: _disarm(owner))


def send_in_transaction(transaction: Any, destination: str, data: bytes, *, persistent: bool = True,
                        broker_id: str | None = None, table_prefix: str = DEFAULT_TABLE_PREFIX,
                        created_ms: int | None = None) -> int:
    """Write a message in the application's own database transaction; return its pending id.

    ``transaction`` is the application's SQLAlchemy ``Connection`` or ``Session`` (anything with a
    ``connection()`` method returning the Connection in use).  The pending row commits or rolls back
    with the application's data; no two-phase commit.  ``data`` is the message encoded with the
    broker's message codec (the SDK does that).  ``broker_id`` addresses one broker of a shared
    database; None lets any broker sharing it claim the message.

    Wake-up: on PostgreSQL a ``NOTIFY`` in the same transaction (delivered at commit only); on SQLite
    an in-process signal when the transaction commits, which reaches a broker embedded in this
    process.  A broker in another process using the same SQLite file finds the row when it next
    claims (at start, or after any other wake-up); use PostgreSQL to share across processes.
    """
    conn: Connection = transaction if isinstance(transaction, Connection) else transaction.connection()
    t = _tables(table_prefix)
    if broker_id is not None and not _BROKER_ID_RE.match(broker_id):
        raise ConfigError(f"broker id {broker_id!r} must match {_BROKER_ID_RE.pattern}", broker_id=broker_id)
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise TypeError(f"data must be bytes (the encoded message), not {type(data).__name__}")
    row = dict(broker_id=broker_id, destination=destination, persistent=bool(persistent), data=bytes(data),
               created_ms=int(time.time() * 1000) if created_ms is None else int(created_ms))
    try:
        inserted = conn.execute(t.pending.insert().values(**row)).inserted_primary_key
        if inserted is None or inserted[0] is None:
            raise StorageError(f"the database returned no id for the new row of {t.pending.name}")
        pending_id = int(inserted[0])
        if conn.dialect.name == "postgresql":
            conn.execute(sa.select(sa.func.pg_notify(t.channel, broker_id or "")))
    except sa.exc.SQLAlchemyError as exc:
        raise StorageError(f"cannot write the pending message to {t.pending.name}: {exc}. "
                           f"The broker creates the tables when it opens the database; "
                           f"pymq_server.storage.sql.create_tables(engine) does it up front.") from exc
    if conn.dialect.name == "sqlite":
        owner = transaction if not isinstance(transaction, Connection) and hasattr(transaction, "dispatch") \
            else conn
        _arm(owner, _local_key(conn.engine.url, table_prefix))
    return pending_id
