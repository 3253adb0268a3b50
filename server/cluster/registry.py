"""Cluster membership and the durable-subscription assignment map, in a store the cluster already runs.

No consensus protocol of our own: each node writes its record with a heartbeat timestamp and reads
everyone's; the store's own atomic operations (a Redis hash, a SQL upsert) are the only coordination.
Liveness is decided by each reader from the record's age (``dead_after_ms``), so a partitioned node is
dead to the others as soon as its beats stop arriving in the store.

Blocking I/O: the cluster node calls these methods from a worker thread (spec/cluster.md §1).
"""
from __future__ import annotations

import abc
import json
import time
from dataclasses import dataclass

from pymq.errors import ClusterError, ConfigError


@dataclass(frozen=True)
class Member:
    node: str
    address: str            # host:port of its STOMP listener
    started: int            # ms since the epoch
    beat: int               # last heartbeat, ms since the epoch

    def alive(self, now_ms: int, dead_after_ms: int) -> bool:
        return now_ms - self.beat < dead_after_ms


class ClusterRegistry(abc.ABC):
    def __init__(self, cluster: str) -> None:
        self.cluster = cluster

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
    def assign(self, subscription: str, node: str | None) -> None:
        """Record (or with None, forget) which node hosts a durable subscription."""

    @abc.abstractmethod
    def assignments(self) -> dict[str, str]:
        """subscription key -> hosting node."""

    def claim(self, subscription: str, node: str) -> str | None:
        """Record ``node`` as the host of ``subscription``; returns the previous host (None if none)."""
        previous = self.assignments().get(subscription)
        self.assign(subscription, node)
        return previous

    def close(self) -> None:
        pass


class RedisRegistry(ClusterRegistry):
    def __init__(self, url: str, cluster: str) -> None:
        super().__init__(cluster)
        try:
            import redis
        except ImportError as exc:
            raise ConfigError(f"a Redis cluster store needs the redis package: {exc}") from None
        self._redis = redis.Redis.from_url(url, socket_timeout=5, socket_connect_timeout=5)
        self._members = f"pymq:cluster:{cluster}:members"
        self._assign = f"pymq:cluster:{cluster}:assignments"
        self._errors = (redis.RedisError,)

    def _call(self, fn, *args):
        try:
            return fn(*args)
        except self._errors as exc:
            raise ClusterError(f"cluster store (Redis) failed: {exc}", reason="store") from exc

    def beat(self, member: Member) -> None:
        self._call(self._redis.hset, self._members, member.node, json.dumps(member.__dict__))

    def members(self) -> list[Member]:
        raw = self._call(self._redis.hgetall, self._members)
        return [Member(**json.loads(v)) for v in raw.values()]

    def leave(self, node: str) -> None:
        self._call(self._redis.hdel, self._members, node)

    def assign(self, subscription: str, node: str | None) -> None:
        if node is None:
            self._call(self._redis.hdel, self._assign, subscription)
        else:
            self._call(self._redis.hset, self._assign, subscription, node)

    def assignments(self) -> dict[str, str]:
        raw = self._call(self._redis.hgetall, self._assign)
        return {k.decode(): v.decode() for k, v in raw.items()}

    def claim(self, subscription: str, node: str) -> str | None:
        def transaction():
            pipe = self._redis.pipeline(transaction=True)
            pipe.hget(self._assign, subscription)
            pipe.hset(self._assign, subscription, node)
            return pipe.execute()[0]
        previous = self._call(transaction)
        return previous.decode() if previous is not None else None

    def close(self) -> None:
        self._redis.close()


class SqlRegistry(ClusterRegistry):
    def __init__(self, url: str, cluster: str) -> None:
        super().__init__(cluster)
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
        self.t_assign = sa.Table("pymq_cluster_assignments", meta,
                                 sa.Column("cluster", sa.String(100), primary_key=True),
                                 sa.Column("subscription", sa.String(500), primary_key=True),
                                 sa.Column("node", sa.String(200), nullable=False))
        try:
            meta.create_all(self.engine)
        except sa.exc.SQLAlchemyError as exc:
            raise ClusterError(f"cluster store (SQL) failed: {exc}", reason="store") from exc

    def _upsert(self, table, keys: dict, values: dict) -> None:
        sa = self.sa
        try:
            with self.engine.begin() as conn:
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
                conn.execute(table.delete().where(sa.and_(*[table.c[k] == v for k, v in keys.items()])))
        except sa.exc.SQLAlchemyError as exc:
            raise ClusterError(f"cluster store (SQL) failed: {exc}", reason="store") from exc

    def beat(self, member: Member) -> None:
        self._upsert(self.t_members, {"cluster": self.cluster, "node": member.node},
                     {"record": json.dumps(member.__dict__), "beat_ms": member.beat})

    def members(self) -> list[Member]:
        t = self.t_members
        rows = self._query(self.sa.select(t.c.record).where(t.c.cluster == self.cluster))
        return [Member(**json.loads(r[0])) for r in rows]

    def leave(self, node: str) -> None:
        self._delete(self.t_members, cluster=self.cluster, node=node)

    def assign(self, subscription: str, node: str | None) -> None:
        if node is None:
            self._delete(self.t_assign, cluster=self.cluster, subscription=subscription)
        else:
            self._upsert(self.t_assign, {"cluster": self.cluster, "subscription": subscription},
                         {"node": node})

    def assignments(self) -> dict[str, str]:
        t = self.t_assign
        rows = self._query(self.sa.select(t.c.subscription, t.c.node).where(t.c.cluster == self.cluster))
        return {s: n for s, n in rows}

    def close(self) -> None:
        self.engine.dispose()


def open_registry(url: str, cluster: str) -> ClusterRegistry:
    if url.startswith(("redis://", "rediss://", "unix://")):
        return RedisRegistry(url, cluster)
    if url.startswith(("postgresql", "sqlite")):
        return SqlRegistry(url, cluster)
    raise ConfigError(f"cluster store {url!r}: use redis://... or postgresql+psycopg://...")


def now_ms() -> int:
    return int(time.time() * 1000)
