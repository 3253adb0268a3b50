"""TLS on the broker's own listeners — STOMP (``tls_port``), WebSocket (``websocket.tls``) and the admin
HTTP port (``admin_tls``) — with a CA and certificates made in the test: the SDK end to end over
``stomps://``, stomp.py as an independent client, mutual TLS mapping a certificate's subject to a user,
certificate rotation by reload, and certificate problems reported before anything listens."""
from __future__ import annotations

import asyncio
import datetime
import ssl
import subprocess
import sys
import tempfile
import threading
import time

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

import pymq
from pymq.errors import AuthenticationFailed, PymqError
from pymq_server.broker.auth import save_user
from tests.client.tls import Authority
from tests.conftest import RunningBroker


@pytest.fixture
def ca(tmp_path):
    return Authority(tmp_path)


@pytest.fixture
def server_cert(ca):
    return ca.issue("broker", dns=("localhost",), ips=("127.0.0.1",))


def _tls(server_cert, **extra) -> dict:
    return {"cert_file": str(server_cert.cert), "key_file": str(server_cert.key), **extra}


def _wait(predicate, timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return False


def test_sdk_over_stomps_end_to_end(broker_factory, ca, server_cert):
    broker = broker_factory(tls=_tls(server_cert), tls_port=0)
    port = broker.server.tls_port
    with pymq.connect(f"stomps://127.0.0.1:{port}", tls=pymq.TlsOptions(ca_file=str(ca.ca_file))) as conn:
        s = conn.create_session()
        s.create_producer(pymq.Queue("secure")).send("over TLS")
        assert s.create_consumer(pymq.Queue("secure")).receive(5).text == "over TLS"
    # the URL form, and the plain port still works beside it
    with pymq.connect(f"stomp+ssl://127.0.0.1:{port}?ca_file={ca.ca_file}") as conn:
        conn.create_session().create_producer(pymq.Queue("secure")).send("again")
    with pymq.connect(broker.url) as conn:
        assert conn.create_session().create_consumer(pymq.Queue("secure")).receive(5).text == "again"
    # a client that does not trust the broker's CA refuses it, and the broker keeps no session
    with pytest.raises(PymqError, match="certificate"):
        pymq.connect(f"stomps://127.0.0.1:{port}", timeout=5).close()
    assert _wait(lambda: broker.call(lambda: len(broker.broker.sessions)) == 0)


def test_stomp_py_over_tls(broker_factory, ca, server_cert):
    stomp = pytest.importorskip("stomp")
    broker = broker_factory(tls=_tls(server_cert), tls_port=0)
    port = broker.server.tls_port
    received: list = []
    done = threading.Event()

    class Listener(stomp.ConnectionListener):
        def on_message(self, frame):
            received.append(frame.body)
            done.set()

    conn = stomp.Connection12([("127.0.0.1", port)])
    conn.set_ssl(for_hosts=[("127.0.0.1", port)], ca_certs=str(ca.ca_file))
    conn.set_listener("l", Listener())
    conn.connect("guest", "guest", wait=True)
    try:
        conn.subscribe("/queue/stomppy-tls", id="1", ack="auto")
        conn.send("/queue/stomppy-tls", "from stomp.py over TLS", headers={"receipt": "r1"})
        assert done.wait(10)
        assert received == ["from stomp.py over TLS"]
    finally:
        conn.disconnect()
    with pymq.connect(broker.url) as sdk:        # and the SDK on the plain port sees what stomp.py sent
        sdk.create_session().create_producer(pymq.Queue("stomppy-tls")).send("x")


def test_mutual_tls_maps_the_certificate_subject_to_a_user(broker_factory, tmp_path, ca, server_cert):
    users = tmp_path / "users.yaml"
    save_user(str(users), "bob", "bob-pw", ["app"])
    users.write_text(users.read_text() + "  alice: {certificate_subject: 'CN=alice', roles: [app]}\n")
    broker = broker_factory(users_file=str(users), tls_port=0,
                            tls=_tls(server_cert, ca_file=str(ca.ca_file), client_certificates="required"))
    url = f"stomps://127.0.0.1:{broker.server.tls_port}"
    alice = ca.issue("alice", client=True)
    mallory = ca.issue("mallory", client=True)

    def user_names():
        return broker.call(lambda: sorted(s.user.name for s in broker.broker.sessions.values() if s.user))

    # alice's certificate is her login: no password
    with pymq.connect(url, tls=pymq.TlsOptions(ca_file=str(ca.ca_file), cert_file=str(alice.cert),
                                               key_file=str(alice.key))) as conn:
        conn.create_session().create_producer(pymq.Queue("mtls")).send("signed by alice's key")
        assert user_names() == ["alice"]
    # a certificate no user lists: the CONNECT's own login decides (bob's password works, none is refused)
    mallory_tls = pymq.TlsOptions(ca_file=str(ca.ca_file), cert_file=str(mallory.cert), key_file=str(mallory.key))
    with pymq.connect(url, username="bob", password="bob-pw", tls=mallory_tls) as conn:
        assert user_names() == ["bob"]
    with pytest.raises(AuthenticationFailed, match="login required"):
        pymq.connect(url, tls=mallory_tls).close()
    # alice's certificate with another login does not make that login: its password is checked
    alice_tls = pymq.TlsOptions(ca_file=str(ca.ca_file), cert_file=str(alice.cert), key_file=str(alice.key))
    with pytest.raises(AuthenticationFailed):
        pymq.connect(url, username="bob", password="wrong", tls=alice_tls).close()
    # no client certificate at all: the handshake fails and nothing reaches the broker
    before = broker.call(lambda: repr(broker.broker._conn_ids))      # count(n): the next connection id
    with pytest.raises(PymqError):
        pymq.connect(url, tls=pymq.TlsOptions(ca_file=str(ca.ca_file)), timeout=5).close()
    (tmp_path / "other").mkdir()
    other_ca = Authority(tmp_path / "other", "other CA")
    stranger = other_ca.issue("alice", client=True)       # same name, wrong issuer
    with pytest.raises(PymqError):
        pymq.connect(url, tls=pymq.TlsOptions(ca_file=str(ca.ca_file), cert_file=str(stranger.cert),
                                              key_file=str(stranger.key)), timeout=5).close()
    assert broker.call(lambda: repr(broker.broker._conn_ids)) == before   # no session was ever made
    assert _wait(lambda: user_names() == [])


def _subject_cert(ca: Authority, directory, subject: x509.Name):
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(subject).issuer_name(ca.cert.subject)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
            .sign(ca.key, hashes.SHA256()))
    cert_path, key_path = directory / "subject.crt", directory / "subject.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return cert, cert_path, key_path


def test_subjects_are_rfc4514_as_cryptography_prints_them(broker_factory, tmp_path, ca, server_cert):
    """The subject string the broker derives from the handshake is the one OpenSSL/cryptography/Java
    print, escapes included — what an operator copies into certificate_subject."""
    subject = x509.Name([x509.NameAttribute(NameOID.COUNTRY_NAME, "DE"),
                         x509.NameAttribute(NameOID.ORGANIZATION_NAME, "Example, Inc."),
                         x509.NameAttribute(NameOID.ORGANIZATIONAL_UNIT_NAME, "R&D + Ops"),
                         x509.NameAttribute(NameOID.COMMON_NAME, "#svc \"orders\" ")])
    cert, cert_path, key_path = _subject_cert(ca, tmp_path, subject)
    expected = cert.subject.rfc4514_string()
    users = tmp_path / "users.yaml"
    import yaml
    users.write_text(yaml.safe_dump({"users": {"orders-service": {"certificate_subject": expected,
                                                                   "roles": ["app"]}}}))
    broker = broker_factory(users_file=str(users), tls_port=0,
                            tls=_tls(server_cert, ca_file=str(ca.ca_file), client_certificates="optional"))
    with pymq.connect(f"stomps://127.0.0.1:{broker.server.tls_port}",
                      tls=pymq.TlsOptions(ca_file=str(ca.ca_file), cert_file=str(cert_path),
                                          key_file=str(key_path))):
        seen = broker.call(lambda: [(s.link.certificate_subject, s.user.name)
                                    for s in broker.broker.sessions.values()])
    assert seen == [(expected, "orders-service")]


def test_websocket_over_tls_with_client_certificates(broker_factory, tmp_path, ca, server_cert):
    import aiohttp
    from tests.interop.test_websocket import WsStomp
    users = tmp_path / "users.yaml"
    users.write_text("users:\n  browser-app: {certificate_subject: 'CN=browser-app'}\n")
    broker = broker_factory(users_file=str(users), websocket={"port": 0, "tls": True},
                            tls=_tls(server_cert, ca_file=str(ca.ca_file), client_certificates="required"))
    client = ca.issue("browser-app", client=True)
    ctx = ssl.create_default_context(cafile=str(ca.ca_file))
    ctx.load_cert_chain(str(client.cert), str(client.key))
    url = f"https://127.0.0.1:{broker.server.websocket_port}/stomp"

    async def go():
        async with aiohttp.ClientSession() as session:
            ws = await session.ws_connect(url, protocols=("v12.stomp",), ssl=ctx)
            stomp = WsStomp(ws)
            await stomp.send("CONNECT", {"accept-version": "1.2", "host": "/"})       # no login: the certificate
            connected = await stomp.read()
            assert connected.command == "CONNECTED" and connected.headers["user-name"] == "browser-app"
            await ws.close()
            with pytest.raises(aiohttp.ClientError):           # plain ws:// on the wss port
                await session.ws_connect(url.replace("https", "http"), protocols=("v12.stomp",))
    asyncio.run(asyncio.wait_for(go(), 30))


def test_admin_https(broker_factory, ca, server_cert):
    import urllib.error
    import urllib.request
    broker = broker_factory(tls=_tls(server_cert), admin_port=0, admin_tls=True)
    ctx = ssl.create_default_context(cafile=str(ca.ca_file))
    with urllib.request.urlopen(f"https://127.0.0.1:{broker.server.admin_port}/healthz", context=ctx,
                                timeout=10) as resp:
        assert resp.status == 200
    with pytest.raises((urllib.error.URLError, ConnectionError)):
        urllib.request.urlopen(f"http://127.0.0.1:{broker.server.admin_port}/healthz", timeout=5).read()


def test_certificate_rotation_by_reload(tmp_path, ca):
    first = ca.issue("broker", dns=("localhost",), ips=("127.0.0.1",))
    cert_bytes = first.cert.read_bytes()
    config = tmp_path / "broker.yaml"
    config.write_text(f"port: 0\ntls_port: 0\ndata_dir: {tmp_path / 'data'}\n"
                      f"tls: {{cert_file: {first.cert}, key_file: {first.key}}}\n")
    from pymq_server.config import BrokerConfig
    broker = RunningBroker(BrokerConfig.load(str(config)))
    try:
        port = broker.server.tls_port

        def served_serial():
            ctx = ssl.create_default_context(cafile=str(ca.ca_file))
            import socket
            with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
                with ctx.wrap_socket(sock, server_hostname="127.0.0.1") as tls:
                    return x509.load_der_x509_certificate(tls.getpeercert(binary_form=True)).serial_number

        old_serial = served_serial()
        assert old_serial == x509.load_pem_x509_certificate(cert_bytes).serial_number
        with pymq.connect(f"stomps://127.0.0.1:{port}?ca_file={ca.ca_file}") as kept:
            second = ca.issue("broker", dns=("localhost",), ips=("127.0.0.1",))   # same paths, new files
            assert second.cert == first.cert
            result = broker.call(broker.server.reload)
            assert result["tls_reloaded"] is True and result["restart_needed"] == []
            assert served_serial() != old_serial
            kept.create_session().create_producer(pymq.Queue("kept")).send("the old session lives on")
            # a broken key is refused: the running certificate stays
            first.key.write_text("not a key\n")
            with pytest.raises(PymqError, match="tls.cert_file"):
                broker.call(broker.server.reload)
            assert served_serial() == x509.load_pem_x509_certificate(second.cert.read_bytes()).serial_number
    finally:
        broker.stop()


@pytest.mark.parametrize("problem, expected", [
    ("missing", "tls.cert_file = '{cert}': cannot read it"),
    ("mismatch", "not a PEM certificate and its matching private key"),
    ("bad-ca", "tls.ca_file = '{ca}': not PEM CA certificates"),
])
def test_certificate_problems_stop_the_broker_before_it_listens(tmp_path, ca, server_cert, problem, expected):
    other = ca.issue("other")
    cert, key, ca_file = server_cert.cert, server_cert.key, ca.ca_file
    if problem == "missing":
        cert = tmp_path / "nowhere.crt"
    elif problem == "mismatch":
        key = other.key
    else:
        ca_file = tmp_path / "bad-ca.pem"
        ca_file.write_text("-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n")
    config = tmp_path / "broker.yaml"
    config.write_text(f"port: 0\ntls_port: 0\ntls: {{cert_file: {cert}, key_file: {key}, ca_file: {ca_file}, "
                      f"client_certificates: optional}}\n")
    data = tmp_path / "data"
    run = subprocess.run([sys.executable, "-m", "pymq_server.cli", "--config", str(config), "--data-dir",
                          str(data)], capture_output=True, text=True, timeout=60, cwd=tempfile.gettempdir())
    assert run.returncode == 2, run.stderr
    assert expected.format(cert=cert, ca=ca_file) in run.stderr
    assert "listening" not in run.stderr and not data.exists()
