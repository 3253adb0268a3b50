"""The grid holding device: messages held in Redis (redis-py), a namespace per broker.

Keys (``P`` = ``<namespace>:{<broker_id>}:``; the braces are a Redis Cluster hash tag, so every key of
one broker lives in one slot and the Lua scripts below may touch them together):

* ``P m:<key>``   hash ``d`` destination, ``s`` seq (decimal), ``p`` "1"/"0" persistent, ``v`` data
* ``P r:<key>``   set of queues (subscriptions) that still owe the message
* ``P order``     sorted set, member ``%020d`` of the key, score seq: persistent messages in recovery
                  order (equal scores sort by member, i.e. by key; seq is exact up to 2**53)
* ``P volatile``  set of the members of non-persistent messages (deleted by ``open``)
* ``P catalog``   hash name -> value
* ``P stats``     hash ``messages``, ``bytes``: totals kept by the scripts
* ``<namespace>:brokers``  set of broker ids that have used the namespace

Invariants: a message hash exists exactly while its reference set is non-empty (the scripts that
drop references or free a message delete the hash, its reference set and its order entry and adjust
``stats`` in one atomic step); every script is idempotent, so a batch retried after a lost reply does
not double anything.  ``sync`` sends a batch as one MULTI/EXEC pipeline, in the order: writes,
reference additions, reference removals, frees.

Durability is Redis's: with AOF off a Redis restart loses everything; with ``appendfsync everysec``
a sync is durable within about a second; with ``appendfsync always`` (or, on Redis >= 7.2, the
``WAITAOF`` this device issues after each batch when AOF is on) a completed ``sync`` is on disk.
``status().extra["durability"]`` says which applies.
"""
from __future__ import annotations

import re
from typing import Any, cast
from collections.abc import Callable, Iterator

import redis
from redis.backoff import ExponentialBackoff
from redis.retry import Retry

from pymq.errors import ConfigError, StorageError

from ._buffered import ADD, DROP, BufferedDevice, WriteBatch
from .device import StoredMessage

__all__ = ["GridDevice"]

_BROKER_ID_RE = re.compile(r"[A-Za-z0-9_.:-]{1,64}\Z")
_NAMESPACE_RE = re.compile(r"[A-Za-z0-9_.-]{1,64}\Z")
_CHUNK = 500

# KEYS: m, r, order, volatile, stats   ARGV: destination, seq, persistent, data, member, queue...
_WRITE = """
if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
redis.call('HSET', KEYS[1], 'd', ARGV[1], 's', ARGV[2], 'p', ARGV[3], 'v', ARGV[4])
for i = 6, #ARGV do redis.call('SADD', KEYS[2], ARGV[i]) end
if ARGV[3] == '1' then
  redis.call('ZADD', KEYS[3], ARGV[2], ARGV[5])
else
  redis.call('SADD', KEYS[4], ARGV[5])
end
redis.call('HINCRBY', KEYS[5], 'messages', 1)
redis.call('HINCRBY', KEYS[5], 'bytes', string.len(ARGV[4]))
return 1
"""

# KEYS: m, r   ARGV: queue
_ADD_REF = """
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
return redis.call('SADD', KEYS[2], ARGV[1])
"""

# KEYS: m, r, order, volatile, stats   ARGV: queue, member.  Returns the freed size, or -1.
_DROP_REF = """
redis.call('SREM', KEYS[2], ARGV[1])
if redis.call('SCARD', KEYS[2]) > 0 then return -1 end
local size = redis.call('HSTRLEN', KEYS[1], 'v')
if redis.call('DEL', KEYS[1]) == 0 then return -1 end
redis.call('ZREM', KEYS[3], ARGV[2])
redis.call('SREM', KEYS[4], ARGV[2])
redis.call('HINCRBY', KEYS[5], 'messages', -1)
redis.call('HINCRBY', KEYS[5], 'bytes', -size)
return size
"""

# KEYS: m, r, order, volatile, stats   ARGV: member.  Deletes a message whatever references it has left.
_FREE = """
local size = redis.call('HSTRLEN', KEYS[1], 'v')
redis.call('DEL', KEYS[2])
if redis.call('DEL', KEYS[1]) == 0 then return 0 end
redis.call('ZREM', KEYS[3], ARGV[1])
redis.call('SREM', KEYS[4], ARGV[1])
redis.call('HINCRBY', KEYS[5], 'messages', -1)
redis.call('HINCRBY', KEYS[5], 'bytes', -size)
return 1
"""

# KEYS: volatile, stats   ARGV: key prefix, how many.  Deletes up to N non-persistent messages.
# (The prefix builds key names inside the script: all of them carry the same hash tag as KEYS[1].)
_DROP_VOLATILE = """
local members = redis.call('SPOP', KEYS[1], tonumber(ARGV[2]))
for _, member in ipairs(members) do
  local key = tostring(tonumber(member))
  local m = ARGV[1] .. 'm:' .. key
  local size = redis.call('HSTRLEN', m, 'v')
  if redis.call('DEL', m) == 1 then
    redis.call('HINCRBY', KEYS[2], 'messages', -1)
    redis.call('HINCRBY', KEYS[2], 'bytes', -size)
  end
  redis.call('DEL', ARGV[1] .. 'r:' .. key)
end
return #members
"""


def _member(key: int) -> str:
    return f"{key:020d}"


class GridDevice(BufferedDevice):
    """Holding device on a Redis server (or anything speaking its protocol and Lua scripting)."""

    kind = "grid"
    _backend_errors = (redis.RedisError,)

    def __init__(self, name: str, url: str = "redis://127.0.0.1:6379/0", *, broker_id: str = "broker",
                 namespace: str = "pymq", socket_timeout_s: float = 5.0, retries: int = 1,
                 waitaof_timeout_ms: int = 5000, client: redis.Redis | None = None) -> None:
        super().__init__(name)
        if not _BROKER_ID_RE.match(broker_id):
            raise ConfigError(f"broker id {broker_id!r} must match {_BROKER_ID_RE.pattern}",
                              broker_id=broker_id)
        if not _NAMESPACE_RE.match(namespace):
            raise ConfigError(f"namespace {namespace!r} must match {_NAMESPACE_RE.pattern}")
        self.url = url
        self.broker_id = broker_id
        self.namespace = namespace
        self._client_given = client
        self._socket_timeout_s = socket_timeout_s
        self._retries = retries
        self._waitaof_timeout_ms = waitaof_timeout_ms
        self._r: redis.Redis | None = None
        self._server: dict[str, Any] = {}
        self._use_waitaof = False

    @property
    def _redis(self) -> redis.Redis:
        if self._r is None:
            raise StorageError(f"{self._describe()} is not open", device=self.name)
        return self._r

    # -- key names ------------------------------------------------------------------------------
    def _prefix(self, broker_id: str | None = None) -> str:
        return f"{self.namespace}:{{{broker_id or self.broker_id}}}:"

    def _keys(self, key: int, broker_id: str | None = None) -> list[str]:
        """KEYS for the write and drop scripts: m, r, order, volatile, stats."""
        p = self._prefix(broker_id)
        return [f"{p}m:{key}", f"{p}r:{key}", f"{p}order", f"{p}volatile", f"{p}stats"]

    def _describe(self) -> str:
        return f"grid device {self.name!r} (Redis at {self._safe_url()})"

    def _safe_url(self) -> str:
        return re.sub(r"//([^@/]*):([^@/]*)@", r"//\1:***@", self.url)

    # -- lifecycle ------------------------------------------------------------------------------
    def open(self) -> None:
        if self._client_given is not None:
            self._r = self._client_given
        else:
            self._r = redis.Redis.from_url(
                self.url, socket_timeout=self._socket_timeout_s,
                socket_connect_timeout=self._socket_timeout_s,
                retry=Retry(ExponentialBackoff(cap=0.5, base=0.05), self._retries),
                health_check_interval=30)
        self._write = self._redis.register_script(_WRITE)
        self._add_ref = self._redis.register_script(_ADD_REF)
        self._drop_ref = self._redis.register_script(_DROP_REF)
        self._free = self._redis.register_script(_FREE)
        self._drop_volatile = self._redis.register_script(_DROP_VOLATILE)
        p = self._prefix()
        try:
            self._probe_server()
            self._redis.sadd(f"{self.namespace}:brokers", self.broker_id)
            while self._drop_volatile(keys=[f"{p}volatile", f"{p}stats"], args=[p, _CHUNK]):
                pass
            self._reset_held()
            self._load_held()
        except redis.RedisError as exc:
            if self._client_given is None:
                self._r.close()
            self._r = None          # not open: status() must not probe with a half-made client
            raise self._failure("open", exc) from exc
        with self._lock:
            self._online = True
        self._opened = True

    def _load_held(self) -> None:
        p = self._prefix()
        for start in range(0, 1 << 62, _CHUNK):
            # replies are bytes: the client is made without decode_responses (redis-py types them bytes | str)
            members = cast("list[bytes]", self._redis.zrange(f"{p}order", start, start + _CHUNK - 1))
            pipe = self._redis.pipeline(transaction=False)
            for member in members:
                pipe.hstrlen(f"{p}m:{int(member)}", "v")
                pipe.smembers(f"{p}r:{int(member)}")
            results = pipe.execute()
            self._hold((int(member), results[2 * i], [q.decode() for q in results[2 * i + 1]])
                       for i, member in enumerate(members) if results[2 * i + 1])
            if len(members) < _CHUNK:
                return

    def close(self) -> None:
        if not self._opened:
            return
        try:
            self.sync()
        finally:
            self._opened = False
            if self._r is not None and self._client_given is None:
                self._r.close()
            self._r = None
            self._reset_held()

    def _probe_server(self) -> None:
        info = self._redis.info("server")
        info.update(self._redis.info("persistence"))
        info.update(self._redis.info("memory"))
        try:
            appendfsync = self._redis.config_get("appendfsync").get("appendfsync")
        except redis.ResponseError:
            appendfsync = None          # CONFIG disabled (managed Redis): report unknown
        version = tuple(int(x) for x in str(info.get("redis_version", "0")).split(".")[:2] if x.isdigit())
        aof = bool(int(info.get("aof_enabled", 0)))
        self._use_waitaof = aof and version >= (7, 2)
        if not aof:
            durability = "none: AOF is off, a Redis restart loses the messages"
        elif self._use_waitaof:
            durability = "fsync: WAITAOF after every sync"
        elif appendfsync == "always":
            durability = "fsync: appendfsync always"
        elif appendfsync == "everysec":
            durability = "within about 1 s: appendfsync everysec"
        else:
            durability = f"left to the OS: appendfsync {appendfsync or 'unknown'}"
        self._server = {
            "redis_version": info.get("redis_version"), "aof": aof, "appendfsync": appendfsync,
            "durability": durability, "used_memory": info.get("used_memory"),
            "maxmemory": int(info.get("maxmemory", 0) or 0),
        }

    # -- BufferedDevice hooks -------------------------------------------------------------------
    def _commit(self, batch: WriteBatch) -> None:
        pipe = self._redis.pipeline(transaction=True)
        for key, (message, queues) in batch.messages.items():
            self._write(keys=self._keys(key), client=pipe, args=[
                message.destination, message.seq, "1" if message.persistent else "0", message.data,
                _member(key), *sorted(queues)])
        for (key, queue), op in batch.ref_ops.items():
            if op == ADD:
                self._add_ref(keys=self._keys(key)[:2], args=[queue], client=pipe)
        for (key, queue), op in batch.ref_ops.items():
            if op == DROP and key not in batch.freed:
                self._drop_ref(keys=self._keys(key), args=[queue, _member(key)], client=pipe)
        for key in sorted(batch.freed):
            self._free(keys=self._keys(key), args=[_member(key)], client=pipe)
        catalog = f"{self._prefix()}catalog"
        for name, value in batch.meta.items():
            if value is None:
                pipe.hdel(catalog, name)
            else:
                pipe.hset(catalog, name, value)
        pipe.execute()
        if self._use_waitaof:
            local, _replicas = self._redis.execute_command("WAITAOF", 1, 0, self._waitaof_timeout_ms)
            if int(local) < 1:
                raise redis.TimeoutError(f"WAITAOF: the AOF was not fsynced within {self._waitaof_timeout_ms} ms")

    def _read_stored(self, key: int) -> StoredMessage | None:
        fields = cast("dict[bytes, bytes]", self._redis.hgetall(self._keys(key)[0]))
        return _decode(key, fields)

    def _stored_meta(self) -> dict[str, bytes]:
        fields = cast("dict[bytes, bytes]", self._redis.hgetall(f"{self._prefix()}catalog"))
        return {name.decode(): value for name, value in fields.items()}

    def _status_extra(self) -> dict:
        extra: dict[str, Any] = {"broker_id": self.broker_id, "namespace": self.namespace,
                                 "url": self._safe_url()}
        if self._r is None:
            return extra
        try:
            self._probe_server()     # doubles as the liveness probe
        except redis.RedisError as exc:
            self._failure("status probe", exc)
            extra["error"] = str(exc)
        else:
            with self._lock:
                self._online = True
        extra.update(self._server)
        return extra

    def status(self):
        status = super().status()
        maxmemory = self._server.get("maxmemory") or 0
        if maxmemory:
            status.capacity = maxmemory
            status.bytes_free = max(0, maxmemory - int(self._server.get("used_memory") or 0))
        return status

    # -- recovery and takeover ------------------------------------------------------------------
    def recover(self, broker_id: str | None = None, *, chunk: int = 1000
                ) -> Iterator[tuple[StoredMessage, list[str]]]:
        """Every persistent, referenced message of ``broker_id`` (default: this broker), in (seq, key)
        order, with its queues; read-only (see :meth:`take_over` to move another broker's messages)."""
        self._check_open()
        start = 0
        while True:
            try:
                found, scanned = self._read_chunk(broker_id, start, chunk)
            except redis.RedisError as exc:
                raise self._failure("recover", exc) from exc
            yield from found
            if scanned < chunk:
                return
            start += scanned

    def _read_chunk(self, broker_id: str | None, start: int, count: int
                    ) -> tuple[list[tuple[StoredMessage, list[str]]], int]:
        p = self._prefix(broker_id)
        members = cast("list[bytes]", self._redis.zrange(f"{p}order", start, start + count - 1))
        pipe = self._redis.pipeline(transaction=False)
        keys = [int(member) for member in members]
        for key in keys:
            pipe.hgetall(f"{p}m:{key}")
            pipe.smembers(f"{p}r:{key}")
        results = pipe.execute()
        found = []
        for i, key in enumerate(keys):
            message, queues = _decode(key, results[2 * i]), results[2 * i + 1]
            if message is not None and queues:
                found.append((message, sorted(q.decode() for q in queues)))
        return found, len(members)

    def brokers(self) -> dict[str, int]:
        """Broker ids that have used this namespace, with their message counts."""
        self._check_open()
        try:
            ids = sorted(b.decode() for b in cast("set[bytes]", self._redis.smembers(f"{self.namespace}:brokers")))
            pipe = self._redis.pipeline(transaction=False)
            for broker_id in ids:
                pipe.hget(f"{self._prefix(broker_id)}stats", "messages")
            return {b: int(n or 0) for b, n in zip(ids, pipe.execute(), strict=True)}
        except redis.RedisError as exc:
            raise self._failure("listing brokers", exc) from exc

    def take_over(self, broker_id: str, rekey: Callable[[StoredMessage], StoredMessage], *,
                  chunk: int = 500, lock_ttl_s: int = 300) -> Iterator[tuple[StoredMessage, list[str]]]:
        """Move another broker's persistent messages to this broker, yielding each as moved.

        ``rekey(old)`` gives the message as this broker holds it (a key of this broker's key space).
        Each chunk moves in one MULTI/EXEC.  A lock key (``P takeover``, expiring after
        ``lock_ttl_s``) keeps a second broker from taking over the same broker at the same time:
        it gets a StorageError.  Needs a non-cluster Redis (the two brokers' keys are in two slots).
        """
        self._check_open()
        if broker_id == self.broker_id:
            raise ConfigError("a broker cannot take over its own messages", broker_id=broker_id)
        lock = f"{self._prefix(broker_id)}takeover"
        try:
            if not self._redis.set(lock, self.broker_id, nx=True, ex=lock_ttl_s):
                holder = cast("bytes | None", self._redis.get(lock))
                raise StorageError(f"broker {broker_id!r} is being taken over by "
                                   f"{holder.decode() if holder else 'another broker'}", device=self.name)
            while True:
                found, _ = self._read_chunk(broker_id, 0, chunk)
                if not found:
                    return
                pipe = self._redis.pipeline(transaction=True)
                moved = []
                for old, queues in found:
                    new = rekey(old)
                    moved.append((new, queues))
                    self._write(keys=self._keys(new.key), client=pipe, args=[
                        new.destination, new.seq, "1", new.data, _member(new.key), *queues])
                    for queue in queues:
                        self._drop_ref(keys=self._keys(old.key, broker_id), args=[queue, _member(old.key)],
                                       client=pipe)
                pipe.expire(lock, lock_ttl_s)
                pipe.execute()
                self._hold((msg.key, msg.size, queues) for msg, queues in moved)
                yield from moved
        except redis.RedisError as exc:
            raise self._failure(f"taking over broker {broker_id!r}", exc) from exc
        finally:
            try:
                if self._r is not None and self._redis.get(lock) == self.broker_id.encode():
                    self._redis.delete(lock)
            except redis.RedisError:
                pass    # the lock expires on its own


def _decode(key: int, fields: dict[bytes, bytes]) -> StoredMessage | None:
    if not fields:
        return None
    return StoredMessage(key, fields[b"d"].decode(), int(fields[b"s"]), fields[b"p"] == b"1", fields[b"v"])
