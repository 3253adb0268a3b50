"""The grid device against a real Redis (PYMQ_TEST_REDIS_URL, see tests/storage/services.py).

Each test uses its own key namespace, deleted afterwards.
"""
from __future__ import annotations

import itertools
import json
import uuid
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import pytest
import redis

from pymq.errors import ConfigError, StorageError
from pymq_server.storage.device import StoredMessage
from pymq_server.storage.grid import GridDevice
from tests.storage import contract
from tests.storage.services import TcpProxy, redis_url  # noqa: F401  (fixture)


@pytest.fixture
def namespace(redis_url):
    name = f"t{uuid.uuid4().hex[:10]}"
    yield name
    client = redis.Redis.from_url(redis_url)
    for key in client.scan_iter(f"{name}:*", count=1000):
        client.delete(key)
    client.close()


@pytest.fixture
def raw(redis_url):
    client = redis.Redis.from_url(redis_url)
    yield client
    client.close()


def grid(redis_url, namespace, broker_id="b1", url=None) -> GridDevice:
    return GridDevice("grid", url or redis_url, broker_id=broker_id, namespace=namespace)


def opened(redis_url, namespace, broker_id="b1") -> GridDevice:
    device = grid(redis_url, namespace, broker_id)
    device.open()
    return device


def msg(key: int, seq: int | None = None, persistent: bool = True, data: bytes | None = None,
        destination: str = "/queue/a") -> StoredMessage:
    return StoredMessage(key, destination, key if seq is None else seq, persistent,
                         data if data is not None else f"body-{key}".encode())


def with_port(url: str, port: int) -> str:
    parts = urlsplit(url)
    return urlunsplit(parts._replace(netloc=f"{parts.hostname}:{port}"))


@pytest.mark.parametrize("check", contract.CHECKS, ids=lambda f: f.__name__)
def test_contract(check, redis_url, namespace):
    check(lambda: grid(redis_url, namespace))


def test_key_layout_is_the_documented_one(redis_url, namespace, raw):
    device = opened(redis_url, namespace)
    try:
        device.write(msg(7, seq=3, data=b"payload"), ["/queue/a", "/queue/b"])
        device.write(msg(8, seq=4, persistent=False), ["/queue/a"])
        device.put_meta("cfg", b"v")
        device.sync()
        p = f"{namespace}:{{b1}}:"
        assert raw.hgetall(f"{p}m:7") == {b"d": b"/queue/a", b"s": b"3", b"p": b"1", b"v": b"payload"}
        assert raw.smembers(f"{p}r:7") == {b"/queue/a", b"/queue/b"}
        assert raw.zrange(f"{p}order", 0, -1, withscores=True) == [(b"00000000000000000007", 3.0)]
        assert raw.smembers(f"{p}volatile") == {b"00000000000000000008"}
        assert raw.hgetall(f"{p}catalog") == {b"cfg": b"v"}
        assert raw.hgetall(f"{p}stats") == {b"messages": b"2", b"bytes": str(7 + len(b"body-8")).encode()}
        assert raw.smembers(f"{namespace}:brokers") == {b"b1"}
        device.remove(7, "/queue/a")
        device.remove(7, "/queue/b")
        device.sync()
        assert not raw.exists(f"{p}m:7", f"{p}r:7") and raw.zcard(f"{p}order") == 0
    finally:
        device.close()


def test_status_reports_the_servers_persistence(redis_url, namespace, raw):
    device = opened(redis_url, namespace)
    try:
        extra = device.status().extra
        aof = bool(raw.info("persistence")["aof_enabled"])
        assert extra["aof"] is aof
        assert extra["appendfsync"] == raw.config_get("appendfsync")["appendfsync"]
        assert extra["redis_version"] == raw.info("server")["redis_version"]
        assert ("AOF is off" in extra["durability"]) is (not aof)
    finally:
        device.close()


def test_unreachable_redis_is_a_storage_error_not_a_crash(redis_url, namespace):
    host, port = urlsplit(redis_url).hostname, urlsplit(redis_url).port or 6379
    proxy = TcpProxy(host, port)
    device = grid(redis_url, namespace, url=with_port(redis_url, proxy.port))
    try:
        device.open()
        device.write(msg(1), ["/queue/a"])
        device.sync()
        proxy.cut()
        device.write(msg(2), ["/queue/a"])
        with pytest.raises(StorageError, match=r"grid device 'grid' \(Redis at redis://.*\): commit failed"):
            device.sync()
        with pytest.raises(StorageError, match="reading message 1"):
            device.read(1)
        assert device.read(2) == msg(2)          # still buffered, so still readable
        status = device.status()
        assert status.online is False and status.errors >= 2 and "error" in status.extra
        proxy.restore()
        device.sync()
        assert device.status().online is True
        device.close()
        device = opened(redis_url, namespace)
        assert [m.key for m, _ in device.recover()] == [1, 2]
    finally:
        device.close()
        proxy.close()


def test_open_without_a_server_is_a_storage_error(redis_url, namespace):
    proxy = TcpProxy("127.0.0.1", 1)
    proxy.cut()
    device = grid(redis_url, namespace, url=with_port(redis_url, proxy.port))
    try:
        with pytest.raises(StorageError, match="open failed"):
            device.open()
        status = device.status()
        assert status.online is False and status.errors == 1
        assert "open failed" in status.extra["last_error"]
        with pytest.raises(StorageError, match="not open"):
            device.write(msg(1), ["/queue/a"])
    finally:
        proxy.close()


def test_brokers_share_a_namespace_and_take_over(redis_url, namespace, raw):
    dead = opened(redis_url, namespace, "dead")
    for key in range(1, 6):
        dead.write(msg(key), ["/queue/a", "/queue/audit"] if key == 2 else ["/queue/a"])
    dead.write(msg(6, persistent=False), ["/queue/a"])
    dead.put_meta("name", b"dead")
    dead.sync()
    dead.close()
    heir = opened(redis_url, namespace, "heir")
    try:
        heir.write(msg(1, data=b"heir's own"), ["/queue/b"])
        heir.sync()
        assert heir.brokers() == {"dead": 6, "heir": 1}
        assert [m.data for m, _ in heir.recover(broker_id="dead")] == [f"body-{k}".encode() for k in range(1, 6)]
        keys = itertools.count(100)
        moved = list(heir.take_over("dead", lambda old: StoredMessage(
            next(keys), old.destination, old.seq, True, old.data), chunk=2))
        assert [(m.key, refs) for m, refs in moved] == [
            (100, ["/queue/a"]), (101, ["/queue/a", "/queue/audit"]), (102, ["/queue/a"]),
            (103, ["/queue/a"]), (104, ["/queue/a"])]
        assert list(heir.recover(broker_id="dead")) == []
        assert heir.status().messages == 6
        assert not raw.exists(f"{namespace}:{{dead}}:takeover")      # the lock is released
    finally:
        heir.close()
    heir = opened(redis_url, namespace, "heir")
    try:
        assert [m.key for m, _ in heir.recover()] == [1, 100, 101, 102, 103, 104]
    finally:
        heir.close()


def test_second_takeover_of_the_same_broker_is_refused(redis_url, namespace, raw):
    heir = opened(redis_url, namespace, "heir")
    try:
        raw.set(f"{namespace}:{{dead}}:takeover", "other-heir", ex=60)
        with pytest.raises(StorageError, match="being taken over by other-heir"):
            list(heir.take_over("dead", lambda old: old))
        assert raw.get(f"{namespace}:{{dead}}:takeover") == b"other-heir"   # not ours to release
    finally:
        heir.close()


def test_retried_batch_does_not_double_anything(redis_url, namespace, raw, monkeypatch):
    """A commit whose reply was lost is retried; the idempotent scripts keep the store exact."""
    device = opened(redis_url, namespace)
    real_commit = device._commit
    try:
        device.write(msg(1), ["q1", "q2"])
        device.write(msg(2), ["q1"])
        device.sync()
        device.add_reference(2, "q9")
        device.remove(1, "q1")
        device.write(msg(3), ["q1"])

        def commit_then_lose_reply(batch):
            real_commit(batch)
            raise redis.ConnectionError("connection lost before the reply")

        monkeypatch.setattr(device, "_commit", commit_then_lose_reply)
        with pytest.raises(StorageError):
            device.sync()
        monkeypatch.setattr(device, "_commit", real_commit)
        with pytest.raises(StorageError, match="refuses new messages"):
            device.write(msg(4), ["q1", "q2"])      # offline until a probe or commit succeeds
        assert device.repair()                      # probes, then commits the batch again
        device.write(msg(4), ["q1", "q2"])
        device.remove(3, "q1")          # message 3 reached Redis although the commit "failed"
        device.remove(4, "q2")
        device.sync()
        p = f"{namespace}:{{b1}}:"
        assert raw.hgetall(f"{p}stats") == {b"messages": b"3", b"bytes": b"18"}
        assert raw.smembers(f"{p}r:1") == {b"q2"} and raw.smembers(f"{p}r:2") == {b"q1", b"q9"}
        assert not raw.exists(f"{p}m:3", f"{p}r:3") and raw.smembers(f"{p}r:4") == {b"q1"}
    finally:
        device.close()


def test_configuration_errors():
    with pytest.raises(ConfigError, match="broker id"):
        GridDevice("grid", broker_id="{tag}")
    with pytest.raises(ConfigError, match="namespace"):
        GridDevice("grid", namespace="a b")


# -- language-neutral vectors (spec/vectors/storage_grid.json) ----------------------------------------

VECTORS = json.loads((Path(__file__).resolve().parents[2] / "spec" / "vectors" / "storage_grid.json").read_text())


@pytest.mark.parametrize("case", VECTORS["cases"], ids=lambda case: case["name"])
def test_vector_key_layout(redis_url, namespace, raw, case):
    device = opened(redis_url, namespace, case["broker_id"])
    try:
        for w in case["writes"]:
            device.write(StoredMessage(w["key"], w["destination"], w["seq"], w["persistent"],
                                       bytes.fromhex(w["data_hex"])), w["queues"])
        for name, value_hex in case["catalog"].items():
            device.put_meta(name, bytes.fromhex(value_hex))
        device.sync()
    finally:
        device.close()
    name = lambda key: key.replace("<ns>", namespace)  # noqa: E731
    expect = case["expect"]
    for key, fields in expect["hashes"].items():
        assert {f.decode(): v.hex() for f, v in raw.hgetall(name(key)).items()} == fields, key
    for key, members in expect["sets"].items():
        assert sorted(m.decode() for m in raw.smembers(name(key))) == members, key
    for key, entries in expect["zsets"].items():
        assert [[m.decode(), s] for m, s in raw.zrange(name(key), 0, -1, withscores=True)] == entries, key
    written = {name(k) for group in ("hashes", "sets", "zsets") for k in expect[group]}
    assert {k.decode() for k in raw.scan_iter(f"{namespace}:*")} == written
