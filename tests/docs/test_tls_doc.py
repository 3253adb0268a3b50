"""docs/tls.md is true: its OpenSSL commands make a CA, a broker certificate and a client certificate; its
configuration starts a broker with them; the client certificate logs in as the user the doc's users file
maps it to; the admin port answers over HTTPS."""
from __future__ import annotations

import shutil
import ssl
import subprocess
import urllib.request

import pytest
import yaml

import pymq
from pymq_server.config import BrokerConfig
from tests.conftest import RunningBroker
from tests.docs._blocks import marked_block


@pytest.fixture
def made(tmp_path):
    if shutil.which("openssl") is None or shutil.which("bash") is None:
        pytest.skip("openssl and bash are needed to run the doc's commands")
    run = subprocess.run(["bash", "-euo", "pipefail", "-c", marked_block("tls.md", "tls-commands")], cwd=tmp_path,
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip().splitlines()[-1] == "subject=CN=billing-service,O=Example"
    return tmp_path


def test_the_tls_guide_works_as_written(made):
    users = yaml.safe_load(marked_block("tls.md", "tls-users"))
    from pymq_server.broker.auth import hash_password
    users["users"]["alice"]["password"] = hash_password("alice-pw")
    (made / "users.yaml").write_text(yaml.safe_dump(users))
    settings = yaml.safe_load(marked_block("tls.md", "tls-config"))
    for key in ("cert_file", "key_file", "ca_file"):
        settings["tls"][key] = str(made / settings["tls"][key])
    settings.update(port=0, tls_port=0, admin_port=0, users_file=str(made / "users.yaml"),
                    data_dir=str(made / "data"))
    settings["websocket"]["port"] = 0
    broker = RunningBroker(BrokerConfig.from_dict(settings))
    try:
        tls = pymq.TlsOptions(ca_file=str(made / "ca.crt"), cert_file=str(made / "client.crt"),
                              key_file=str(made / "client.key"))
        with pymq.connect(f"stomps://127.0.0.1:{broker.server.tls_port}", tls=tls) as conn:
            conn.create_session().create_producer(pymq.Queue("billing")).send("invoice 1")
            names = broker.call(lambda: [s.user.name for s in broker.broker.sessions.values()])
            assert names == ["billing-service"]
        with pymq.connect(f"stomps://alice:alice-pw@127.0.0.1:{broker.server.tls_port}?ca_file={made / 'ca.crt'}"):
            pass
        ctx = ssl.create_default_context(cafile=str(made / "ca.crt"))
        with urllib.request.urlopen(f"https://localhost:{broker.server.admin_port}/healthz", context=ctx,
                                    timeout=10) as resp:
            assert resp.status == 200
    finally:
        broker.stop()
