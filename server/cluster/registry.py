"""Cluster membership and the durable-subscription assignment map, in a store the cluster already runs.

No consensus protocol of our own: each node writes its record with a heartbeat timestamp and reads
everyone's; the store's own atomic operations (a Redis hash, a SQL upsert) are the only coordination.
Liveness is decided by each reader from the record's age (``dead_after_ms``), so a partitioned node is
dead to the others as soon as its beats stop arriving in the store.

The assignment map records, for each durable subscription, the node hosting it and the subscription's own
record (topic, selector, owner, ...), so that any node can hold messages for a dead host's subscribers
and adopt them (spec/cluster.md §5, §6).  The routing-key map says which id each queue routes on
(spec/routing.md §2.3) for every node, whichever node it was declared through.

**Fenced writes** (spec/ha.md §5): a node with backups writes as the holder of an HA epoch; every write it
makes checks, in the same store operation, that its own membership record does not carry a higher epoch
(a Lua script on Redis, a row lock on SQL), so a former live woken from a pause cannot put its address
back into the record, delete it, or change the maps the new live keeps.  A refused write raises
``ClusterError`` with reason ``stale-epoch``.  Without ``ha:`` (epoch 0) nothing is checked.

Blocking I/O: the cluster node calls these methods from a worker thread (spec/cluster.md §1).
"""
from __future__ import annotations

import abc
import json
import time
from typing import cast

from pymq_server.cluster.records import Hosted, Member

from pymq.errors import ClusterError, ConfigError

__all__ = ["ClusterRegistry", "Hosted", "Member", "RedisRegistry", "SqlRegistry", "now_ms", "open_registry"]


def stale_epoch(node: str, mine: int, stored: int) -> ClusterError:
    return ClusterError(f"cluster store: node {node}'s record is at epoch {stored}, this process holds "
                        f"{mine}: it was taken over (a fenced former live writes nothing)",
                        reason="stale-epoch", node=node, epoch=mine, stored_epoch=stored)


def record_epoch(raw: str | bytes | None) -> int:
    """The epoch a stored membership record carries (0: none, or no record)."""
    if raw is None:
        return 0
    try:
        return int(json.loads(raw).get("epoch") or 0)
    except (ValueError, AttributeError, TypeError):
        return 0


class ClusterRegistry(abc.ABC):
    def __init__(self, cluster: str, node: str | None = None, epoch: int = 0) -> None:
        self.cluster = cluster
        self.node = node            # whose writes these are
        self.epoch = epoch          # their HA epoch (0: not fenced)

    @abc.abstractmethod
    def beat(self, member: Member) -> None:
        """Write (create or refresh) this node's record."""

    @abc.abstractmethod
    def members(self) -> list[Member]:
        """Every record, alive or not (callers judge liveness)."""

    @abc.abstractmethod
    def leave(self, node: str) -> None:
        """Delete a node's record (clean shutdown, after hand-over)."""

    @abc.abstractmethod
    def assign(self, subscription: str, node: str | None, record: dict | None = None) -> None:
        """Record (or with None, forget) which node hosts a durable subscription, and its record."""

    @abc.abstractmethod
    def subscriptions(self) -> dict[str, Hosted]:
        """subscription key -> its host and record."""

    def assignments(self) -> dict[str, str]:
        """subscription key -> hosting node."""
        return {key: hosted.node for key, hosted in self.subscriptions().items()}

    def claim(self, subscription: str, node: str, record: dict | None = None) -> str | None:
        """Record ``node`` as the host of ``subscription``; returns the previous host (None if none)."""
        previous = self.subscriptions().get(subscription)
        self.assign(subscription, node, record if record is not None else
                    (previous.record if previous is not None else None))
        return previous.node if previous is not None else None

    @abc.abstractmethod
    def set_routing_key(self, queue: str, routing_key: str) -> None:
        """Record which id ``queue`` routes on across the cluster."""

    @abc.abstractmethod
    def routing_keys(self) -> dict[str, str]:
        """queue name -> routing key (queues not listed route on their group)."""

    def close(self) -> None:  # noqa: B027 - a store without a connection has nothing to close
        pass


#: one fenced write (KEYS: the members hash, the written hash; ARGV: node, epoch, op, field[, value]): refused
#: with the stored epoch when the node's record carries a higher one, else HSET or HDEL
_FENCED_WRITE = """
local raw = redis.call('HGET', KEYS[1], ARGV[1])
if raw then
  local ok, rec = pcall(cjson.decode, raw)
  if ok and type(rec) == 'table' and tonumber(rec['epoch'] or 0) > tonumber(ARGV[2]) then
    return tonumber(rec['epoch'])
  end
end
if ARGV[3] == 'hset' then
  redis.call('HSET', KEYS[2], ARGV[4], ARGV[5])
else
  redis.call('HDEL', KEYS[2], ARGV[4])
end
return -1
"""


class RedisRegistry(ClusterRegistry):
    def __init__(self, url: str, cluster: str, node: str | None = None, epoch: int = 0) -> None:
        super().__init__(cluster, node, epoch)
        try:
            import redis
        except ImportError as exc:
            raise ConfigError(f"a Redis cluster store needs the redis package: {exc}") from None
        self._redis = redis.Redis.from_url(url, socket_timeout=5, socket_connect_timeout=5)
        self._members = f"pymq:cluster:{cluster}:members"
        self._assign = f"pymq:cluster:{cluster}:assignments"
        self._routing = f"pymq:cluster:{cluster}:routing-keys"
        self._errors = (redis.RedisError,)
        self._watch_error = redis.WatchError
        self._fenced_write = self._redis.register_script(_FENCED_WRITE)

    def _call(self, fn, *args):
        try:
            return fn(*args)
        except self._errors as exc:
            raise ClusterError(f"cluster store (Redis) failed: {exc}", reason="store") from exc

    def _write(self, key: str, field: str, value: str | None) -> None:
        """HSET (or with None, HDEL) ``key`` ``field``: fenced under an epoch (the module's docstring)."""
        if not self.epoch:
            if value is None:
                self._call(self._redis.hdel, key, field)
            else:
                self._call(self._redis.hset, key, field, value)
            return
        args = [self.node, self.epoch, "hdel" if value is None else "hset", field]
        stored = self._call(self._fenced_write, [self._members, key], args if value is None else args + [value])
        if int(stored) >= 0:
            raise stale_epoch(self.node or "", self.epoch, int(stored))

    def beat(self, member: Member) -> None:
        self._write(self._members, member.node, member.encode())

    def members(self) -> list[Member]:
        raw = self._call(self._redis.hgetall, self._members)
        return [Member.decode(v) for v in raw.values()]

    def leave(self, node: str) -> None:
        self._write(self._members, node, None)

    def assign(self, subscription: str, node: str | None, record: dict | None = None) -> None:
        self._write(self._assign, subscription, None if node is None else Hosted(node, record).encode())

    def subscriptions(self) -> dict[str, Hosted]:
        raw = self._call(self._redis.hgetall, self._assign)
        return {k.decode(): Hosted.decode(v.decode()) for k, v in raw.items()}

    def claim(self, subscription: str, node: str, record: dict | None = None) -> str | None:
        def transaction():
            # optimistic: retry if the field changed between the read and the write
            with self._redis.pipeline(transaction=True) as pipe:
                while True:
                    try:
                        pipe.watch(self._assign, self._members)
                        if self.epoch:
                            stored = record_epoch(cast("bytes | None", pipe.hget(self._members, self.node or "")))
                            if stored > self.epoch:
                                raise stale_epoch(self.node or "", self.epoch, stored)
                        raw = cast("bytes | None", pipe.hget(self._assign, subscription))   # not decode_responses
                        previous = Hosted.decode(raw.decode()) if raw is not None else None
                        keep = record if record is not None else (previous.record if previous else None)
                        pipe.multi()
                        pipe.hset(self._assign, subscription, Hosted(node, keep).encode())
                        pipe.execute()
                        return previous
                    except self._watch_error:
                        continue
        previous = self._call(transaction)
        return previous.node if previous is not None else None

    def set_routing_key(self, queue: str, routing_key: str) -> None:
        self._write(self._routing, queue, routing_key)

    def routing_keys(self) -> dict[str, str]:
        raw = self._call(self._redis.hgetall, self._routing)
        return {k.decode(): v.decode() for k, v in raw.items()}

    def close(self) -> None:
        self._redis.close()


class SqlRegistry(ClusterRegistry):
    def __init__(self, url: str, cluster: str, node: str | None = None, epoch: int = 0) -> None:
        super().__init__(cluster, node, epoch)
        try:
            import sqlalchemy as sa
        except ImportError as exc:
            raise ConfigError(f"a SQL cluster store needs SQLAlchemy: {exc}") from None
        self.sa = sa
        self.engine = sa.create_engine(url, pool_pre_ping=True)
        meta = sa.MetaData()
        self.t_members = sa.Table("pymq_cluster_members", meta,
                                  sa.Column("cluster", sa.String(100), primary_key=True),
                                  sa.Column("node", sa.String(200), primary_key=True),
                                  sa.Column("record", sa.Text, nullable=False),
                                  sa.Column("beat_ms", sa.BigInteger, nullable=False))
        # (pymq_cluster_assignments, the layout without records, is no longer read)
        self.t_assign = sa.Table("pymq_cluster_subscriptions", meta,
                                 sa.Column("cluster", sa.String(100), primary_key=True),
                                 sa.Column("subscription", sa.String(500), primary_key=True),
                                 sa.Column("node", sa.String(200), nullable=False),
                                 sa.Column("record", sa.Text, nullable=True))
        self.t_routing = sa.Table("pymq_cluster_routing_keys", meta,
                                  sa.Column("cluster", sa.String(100), primary_key=True),
                                  sa.Column("queue", sa.String(500), primary_key=True),
                                  sa.Column("routing_key", sa.String(40), nullable=False))
        try:
            meta.create_all(self.engine)
        except sa.exc.SQLAlchemyError as exc:
            raise ClusterError(f"cluster store (SQL) failed: {exc}", reason="store") from exc

    def _fence(self, conn) -> None:
        """Under an epoch: lock this node's membership row for the transaction and refuse to go on when it
        carries a higher epoch (the module's docstring)."""
        if not self.epoch:
            return
        t = self.t_members
        raw = conn.execute(self.sa.select(t.c.record).where(t.c.cluster == self.cluster, t.c.node == self.node)
                           .with_for_update()).scalar()
        stored = record_epoch(raw)
        if stored > self.epoch:
            raise stale_epoch(self.node or "", self.epoch, stored)

    def _upsert(self, table, keys: dict, values: dict) -> None:
        sa = self.sa
        try:
            with self.engine.begin() as conn:
                self._fence(conn)
                cond = sa.and_(*[table.c[k] == v for k, v in keys.items()])
                updated = conn.execute(table.update().where(cond).values(**values)).rowcount
                if not updated:
                    conn.execute(table.insert().values(**keys, **values))
        except sa.exc.IntegrityError:
            self._upsert(table, keys, values)    # another writer inserted first: update now
        except sa.exc.SQLAlchemyError as exc:
            raise ClusterError(f"cluster store (SQL) failed: {exc}", reason="store") from exc

    def _query(self, statement):
        try:
            with self.engine.connect() as conn:
                return conn.execute(statement).all()
        except self.sa.exc.SQLAlchemyError as exc:
            raise ClusterError(f"cluster store (SQL) failed: {exc}", reason="store") from exc

    def _delete(self, table, **keys) -> None:
        sa = self.sa
        try:
            with self.engine.begin() as conn:
                self._fence(conn)
                conn.execute(table.delete().where(sa.and_(*[table.c[k] == v for k, v in keys.items()])))
        except sa.exc.SQLAlchemyError as exc:
            raise ClusterError(f"cluster store (SQL) failed: {exc}", reason="store") from exc

    def beat(self, member: Member) -> None:
        self._upsert(self.t_members, {"cluster": self.cluster, "node": member.node},
                     {"record": member.encode(), "beat_ms": member.beat})

    def members(self) -> list[Member]:
        t = self.t_members
        rows = self._query(self.sa.select(t.c.record).where(t.c.cluster == self.cluster))
        return [Member.decode(r[0]) for r in rows]

    def leave(self, node: str) -> None:
        self._delete(self.t_members, cluster=self.cluster, node=node)

    def assign(self, subscription: str, node: str | None, record: dict | None = None) -> None:
        if node is None:
            self._delete(self.t_assign, cluster=self.cluster, subscription=subscription)
        else:
            self._upsert(self.t_assign, {"cluster": self.cluster, "subscription": subscription},
                         {"node": node, "record": json.dumps(record, sort_keys=True) if record else None})

    def subscriptions(self) -> dict[str, Hosted]:
        t = self.t_assign
        rows = self._query(self.sa.select(t.c.subscription, t.c.node, t.c.record)
                           .where(t.c.cluster == self.cluster))
        return {s: Hosted(n, json.loads(r) if r else None) for s, n, r in rows}

    def set_routing_key(self, queue: str, routing_key: str) -> None:
        self._upsert(self.t_routing, {"cluster": self.cluster, "queue": queue}, {"routing_key": routing_key})

    def routing_keys(self) -> dict[str, str]:
        t = self.t_routing
        rows = self._query(self.sa.select(t.c.queue, t.c.routing_key).where(t.c.cluster == self.cluster))
        return {q: k for q, k in rows}

    def close(self) -> None:
        self.engine.dispose()


def open_registry(url: str, cluster: str, node: str | None = None, epoch: int = 0) -> ClusterRegistry:
    """The store of ``url``; ``node`` and ``epoch``: whose writes are fenced (0: none)."""
    if url.startswith(("redis://", "rediss://", "unix://")):
        return RedisRegistry(url, cluster, node, epoch)
    if url.startswith(("postgresql", "sqlite")):
        return SqlRegistry(url, cluster, node, epoch)
    raise ConfigError(f"cluster store {url!r}: use redis://... or postgresql+psycopg://...")


def now_ms() -> int:
    return int(time.time() * 1000)
