"""The broker's configuration schema: every setting typed and range-checked, errors that name the file, the
line, the key path, the value and what was expected, and a broker that exits before listening."""
from __future__ import annotations

import inspect
import os
import subprocess
import sys

import pytest

from pymq.errors import ConfigError
from pymq_server.config import BrokerConfig, QueueConfig, UsersFile, load_users_file, parse_size, queue_config


def _load(tmp_path, text: str, **overrides) -> BrokerConfig:
    path = tmp_path / "broker.yaml"
    path.write_text(text)
    return BrokerConfig.load(str(path), **overrides)


def _problems(tmp_path, text: str) -> tuple[str, list]:
    with pytest.raises(ConfigError) as info:
        _load(tmp_path, text)
    return info.value.message, info.value.problems


# -- the cases, one by one -------------------------------------------------------------------

@pytest.mark.parametrize("text, key, value, expected", [
    ('port: "sixty"\n', "port", "sixty", "expected an integer"),
    ("port: 70000\n", "port", 70000, "<= 65535"),
    ('heartbeat_grace: "2"\n', "heartbeat_grace", "2", "expected a number"),
    ("heartbeat_grace: 0.5\n", "heartbeat_grace", 0.5, ">= 1.0"),
    ("max_memory: lots\n", "max_memory", "lots", "expected a size"),
    ("max_memory: -5\n", "max_memory", -5, ">= 1"),
    ("log_level: LOUD\n", "log_level", "LOUD", "'DEBUG', 'INFO', 'WARNING', 'ERROR' or 'CRITICAL'"),
    ('default_persistent: "no"\n', "default_persistent", "no", "true or false"),
    ("default_persistent: 0\n", "default_persistent", 0, "true or false"),
    ("queues:\n  orders:\n    max_delivries: 5\n", "queues.orders.max_delivries", 5,
     "did you mean 'max_deliveries'"),
    ('queues:\n  orders:\n    max_deliveries: "five"\n', "queues.orders.max_deliveries", "five",
     "expected an integer"),
    ("queues:\n  orders: {overflow: explode}\n", "queues.orders.overflow", "explode",
     "'block', 'reject' or 'drop-oldest'"),
    ("queue_defaults: {default_priority: 12}\n", "queue_defaults.default_priority", 12, "<= 9"),
    ("queue_defaults: {redelivery_multiplier: .inf}\n", "queue_defaults.redelivery_multiplier",
     float("inf"), "finite"),
    ("max_deliveries: 3\n", "max_deliveries", 3, "goes under `queue_defaults:`"),
    ("sync_policy: sometimes\n", "sync_policy", "sometimes", "'always', 'grouped' or 'never'"),
    ("write_buffer_high: 1000\nwrite_buffer_low: 2000\n", "write_buffer_low", 2000,
     "at most write_buffer_high"),
    ("retention: {'/topic/x': {ms: 10, msgs: 3}}\n", "retention./topic/x.msgs", 3, "unknown setting"),
    ("default_permissions: {bob: [produce]}\n", "default_permissions", {"bob": ["produce"]},
     "principal 'bob'"),
    ("default_permissions: {'*': [eat]}\n", "default_permissions.*[0]", "eat", "'produce', 'consume'"),
    ("storage:\n  devices:\n    disk: {kind: file, fsyncc: false}\n", "storage.devices.disk.fsyncc",
     False, "did you mean 'fsync'"),
    ("storage:\n  devices:\n    disk: {kind: floppy}\n", "storage.devices.disk", None, "'floppy'"),
    ("storage:\n  devices:\n    disk: {kind: file, page_size: 1000}\n", "storage.devices.disk.page_size",
     1000, "power of two"),
    ("storage:\n  persistent_device: tape\n", "storage.persistent_device", "tape",
     "one of the devices ['memory', 'file']"),
    ("storage:\n  selection:\n    rules:\n      - {id: a, device: tape, weight: 1, condition: SIZE > 1}\n",
     "storage.selection", None, "unknown device(s) ['tape']"),
    ("storage:\n  selection:\n    rules:\n      - {id: r1, device: file, weight: 1, condition: 'SIZE >'}\n",
     "storage.selection", None, "rule r1"),
    ("cluster: {store: redis://x, secret: s, heartbeat_ms: 500, dead_after_ms: 100}\n",
     "cluster.dead_after_ms", 100, "more than heartbeat_ms"),
    ("cluster: {store: redis://x}\n", "cluster.secret", None, "required"),
    ("tls_port: 61614\n", "(top level)", None, "tls_port need(s) a `tls:` section"),
    ("tls: {cert_file: a.pem, key_file: a.key, client_certificates: required}\n",
     "tls.client_certificates", "required", "needs ca_file"),
    ("websocket: {port: 15674, path: stomp}\n", "websocket.path", "stomp", "matching"),
])
def test_bad_setting_is_named_with_value_and_expectation(tmp_path, text, key, value, expected):
    message, problems = _problems(tmp_path, text)
    assert str(tmp_path / "broker.yaml") in message
    match = [p for p in problems if p.key == key]
    assert match, (key, problems)
    problem = match[0]
    if value is not None:
        assert problem.value == value or (value != value and problem.value != problem.value)
    assert expected in problem.reason, problem
    assert problem.line is not None and f"line {problem.line}: {key}" in message


def test_every_problem_is_reported_at_once_in_file_order(tmp_path):
    message, problems = _problems(tmp_path, 'log_level: LOUD\nport: "sixty"\nqueues:\n  q: {max_deliveries: x}\n')
    assert [p.key for p in problems] == ["log_level", "port", "queues.q.max_deliveries"]
    assert [p.line for p in problems] == [1, 2, 4]
    assert message.splitlines()[0] == f"invalid configuration in {tmp_path / 'broker.yaml'}:"


def test_yaml_booleans_sizes_and_case_are_read_as_documented(tmp_path):
    cfg = _load(tmp_path, "default_persistent: no\nmax_memory: 64MiB\nmax_frame_size: 1 MB\n"
                          "write_buffer_high: 64KiB\nwrite_buffer_low: 16384\nlog_level: debug\n"
                          "heartbeat_grace: 2\n")
    assert cfg.default_persistent is False
    assert cfg.max_memory == 64 * 1024 * 1024 and cfg.max_frame_size == 1_000_000
    assert cfg.write_buffer_high == 65536 and cfg.write_buffer_low == 16384
    assert cfg.log_level == "DEBUG" and cfg.heartbeat_grace == 2.0


@pytest.mark.parametrize("text, size", [("0", 0), ("10", 10), ("10B", 10), ("2 KiB", 2048), ("3kb", 3000),
                                        ("1GiB", 2**30), (" 5 TB ", 5 * 10**12)])
def test_sizes(text, size):
    assert parse_size(text) == size


@pytest.mark.parametrize("text", ["lots", "1.5MiB", "-1KiB", "10 parsecs", "", "MiB", "1e6"])
def test_bad_sizes(text):
    with pytest.raises(ValueError, match="expected a size"):
        parse_size(text)


def test_queue_entries_override_defaults_and_keep_the_rest(tmp_path):
    cfg = _load(tmp_path, "queue_defaults: {max_deliveries: 7, default_priority: 2}\n"
                          "queues:\n  orders: {max_deliveries: 3}\n  plain:\n")
    assert cfg.queues["orders"].max_deliveries == 3 and cfg.queues["orders"].default_priority == 2
    assert cfg.queues["plain"] == cfg.queue_defaults
    # the broker reads them through queue_config, which passes a validated QueueConfig through
    assert queue_config(cfg.queues["orders"], "queue orders") is cfg.queues["orders"]


def test_queue_config_from_the_sdk_or_catalog_is_checked_the_same_way():
    base = QueueConfig(max_deliveries=4)
    assert queue_config({"overflow": "reject"}, "queue q", base=base) == QueueConfig(max_deliveries=4,
                                                                                     overflow="reject")
    with pytest.raises(ConfigError, match=r"queue q: max_deliveries: expected an integer"):
        queue_config({"max_deliveries": "5"}, "queue q")
    with pytest.raises(ConfigError, match=r"schema: .*unknown keys"):
        queue_config({"schema": {"amount": {"type": "int", "requird": True}}}, "queue q")
    with pytest.raises(ConfigError, match=r"expected a mapping"):
        queue_config(["max_deliveries"], "queue q")  # type: ignore[arg-type]


def test_command_line_values_are_checked_and_named(tmp_path):
    with pytest.raises(ConfigError) as info:
        BrokerConfig.load(None, log_level="LOUD")
    assert info.value.problems[0].source == "command line"
    assert "(command line) log_level = 'LOUD'" in info.value.message


def test_from_dict_and_constructor_check_too():
    with pytest.raises(ConfigError, match="max_memory = 'lots'"):
        BrokerConfig.from_dict({"max_memory": "lots"})
    assert BrokerConfig(port=0).port == 0


def test_defaults_are_a_working_broker():
    cfg = BrokerConfig()
    assert (cfg.host, cfg.port, cfg.data_dir, cfg.node_id) == ("127.0.0.1", 61613, "pymq-data", "pymq")
    assert cfg.storage.devices is None and cfg.storage.device_names() == ["memory", "file"]
    assert cfg.tls is None and cfg.websocket is None and cfg.admin_port is None


def test_device_defaults_in_the_schema_are_the_devices_own():
    """The reference documents the schema's defaults; the broker passes only what a file sets, so the
    two must agree or the reference lies."""
    from pymq_server.config import FileDeviceConfig, GridDeviceConfig, MemoryDeviceConfig, SqlDeviceConfig
    from pymq_server.storage.file import FileDevice
    from pymq_server.storage.memory import MemoryDevice
    pairs = [(MemoryDeviceConfig, MemoryDevice), (FileDeviceConfig, FileDevice)]
    try:
        from pymq_server.storage.sql import SqlDevice
        pairs.append((SqlDeviceConfig, SqlDevice))
    except ImportError:
        pass
    try:
        from pymq_server.storage.grid import GridDevice
        pairs.append((GridDeviceConfig, GridDevice))
    except ImportError:
        pass
    for schema, device in pairs:
        params = inspect.signature(device.__init__).parameters
        for name, field in schema.model_fields.items():
            if name == "kind":
                continue
            assert name in params, (schema.__name__, name)
            default = params[name].default
            if default is not inspect.Parameter.empty and field.default is not None:
                assert field.default == default, (schema.__name__, name, field.default, default)


# -- the users file ----------------------------------------------------------------------------------

def test_users_file_without_users_key_is_refused(tmp_path):
    path = tmp_path / "users.yaml"
    path.write_text("alice: {password: x}\n")
    with pytest.raises(ConfigError) as info:
        load_users_file(str(path))
    message = info.value.message
    assert message.startswith(f"invalid users file in {path}:")
    assert "users: a value (required)" in message or "users: expected a value (required)" in message
    assert "alice" in message     # the stray top-level key is named too


@pytest.mark.parametrize("text, expected", [
    ("", "users: expected a value (required)"),
    ("users: {alice: {password: hunter2}}\n", "users.alice.password = 'hunter2': not a scrypt hash"),
    ("users: {alice: {roles: [admin]}}\n", "needs a `password` hash or a `certificate_subject`"),
    ("users: {alice: {password: 'scrypt$1$1$1$YQ==$YQ==', rolez: [admin]}}\n", "did you mean 'roles'"),
    ("users: [alice]\n", "users = ['alice']: expected a mapping"),
])
def test_users_file_errors(tmp_path, text, expected):
    path = tmp_path / "users.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as info:
        load_users_file(str(path))
    assert expected in info.value.message, info.value.message


def test_users_file_subjects_are_unique():
    entry = {"password": "scrypt$1$1$1$YQ==$YQ==", "certificate_subject": "CN=a, O=x"}
    with pytest.raises(Exception, match="same certificate_subject"):
        UsersFile.model_validate({"users": {"a": entry, "b": {**entry, "certificate_subject": "cn=a,o=x"}}})


# -- pymq-server as a process: nothing opened or listened on when the configuration is wrong ----------

def _server(args, cwd, timeout=60):
    return subprocess.run([sys.executable, "-m", "pymq_server.cli", *args], cwd=cwd, capture_output=True,
                          text=True, timeout=timeout)


def test_bad_config_exits_2_before_creating_or_listening(tmp_path):
    cfg = tmp_path / "broker.yaml"
    cfg.write_text('port: 0\nmax_memory: lots\nqueues:\n  orders: {max_delivries: 5}\n')
    data = tmp_path / "never-created"
    run = _server(["--config", str(cfg), "--data-dir", str(data)], tmp_path)
    assert run.returncode == 2, run.stderr
    assert "listening" not in run.stderr and "Traceback" not in run.stderr
    assert f"invalid configuration in {cfg}" in run.stderr
    assert "line 2: max_memory = 'lots': expected a size" in run.stderr
    assert "line 4: queues.orders.max_delivries = 5: unknown queue setting; did you mean 'max_deliveries'?" \
        in run.stderr
    assert not data.exists()


def test_check_config_flag(tmp_path):
    cfg = tmp_path / "broker.yaml"
    cfg.write_text("port: 0\nqueues: {orders: {max_deliveries: 5}}\n")
    ok = _server(["--config", str(cfg), "--check-config"], tmp_path)
    assert ok.returncode == 0 and "is valid" in ok.stderr
    assert not (tmp_path / "pymq-data").exists()
    cfg.write_text("port: 0\nusers_file: users.yaml\n")
    (tmp_path / "users.yaml").write_text("alice: {}\n")
    bad = _server(["--config", str(cfg), "--check-config"], tmp_path)
    assert bad.returncode == 2 and "invalid users file in users.yaml" in bad.stderr


def test_bad_data_dir_is_named_as_such(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    run = _server(["--port", "0", "--data-dir", str(blocker / "data")], tmp_path)
    assert run.returncode == 1
    assert f"cannot use data directory '{blocker / 'data'}' (data_dir)" in run.stderr
    assert "cannot listen" not in run.stderr


def test_unreadable_or_invalid_yaml_is_named(tmp_path):
    run = _server(["--config", str(tmp_path / "missing.yaml")], tmp_path)
    assert run.returncode == 2 and f"cannot read config file {tmp_path / 'missing.yaml'}" in run.stderr
    bad = tmp_path / "bad.yaml"
    bad.write_text("port: [1,\n")
    run = _server(["--config", str(bad)], tmp_path)
    assert run.returncode == 2 and f"config file {bad} is not valid YAML" in run.stderr
    bad.write_text("- port\n")
    run = _server(["--config", str(bad)], tmp_path)
    assert run.returncode == 2 and "expected a mapping of settings at the top level" in run.stderr


@pytest.mark.skipif(os.name != "posix", reason="POSIX sockets")
def test_busy_admin_port_is_named_as_the_admin_port(tmp_path):
    import socket
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        run = _server(["--port", "0", "--admin-port", str(port), "--data-dir", str(tmp_path / "d")], tmp_path)
    assert run.returncode == 1, run.stderr
    assert f"cannot listen on 127.0.0.1:{port} for the admin HTTP port (admin_port)" in run.stderr
    assert "STOMP port" not in run.stderr


def test_reread_gives_the_same_settings_whatever_their_source(tmp_path):
    """SIGHUP's reread: a file is read again; a configuration built in code (tests, embedding) gives its
    own settings again, not the defaults (a reload must not quietly turn a broker into another)."""
    built = BrokerConfig.from_dict({"port": 0, "max_memory": "8MiB", "queues": {"q": {"max_deliveries": 2}}})
    assert built.reread().model_dump() == built.model_dump()
    constructed = BrokerConfig(port=0, users_file=None, heartbeat_grace=3.0)
    assert constructed.reread().model_dump() == constructed.model_dump()
    path = tmp_path / "broker.yaml"
    path.write_text("port: 0\nlog_level: warning\n")
    loaded = BrokerConfig.load(str(path), data_dir=str(tmp_path / "d"))
    path.write_text("port: 0\nlog_level: error\n")
    again = loaded.reread()
    assert again.log_level == "ERROR" and again.data_dir == str(tmp_path / "d")
