"""The one URL grammar of both SDKs (pymq/client/url.py): credentials in the URL, explicit arguments
winning over it, ``stomps://`` with TLS options, and precise refusals (issue 13).

TLS runs against a real handshake: a TLS-terminating proxy (tests/client/tls.py) in front of the plain
test broker, with a CA and certificates made in the test.
"""
from __future__ import annotations

import asyncio
import select
import socket
import ssl
import struct
import threading
import uuid
from pathlib import Path

import pytest

import pymq
import pymq.aio
from pymq.client.url import StompAddress, TlsOptions, VmAddress, parse_url
from pymq.errors import AuthenticationFailed, ConnectFailed, TlsError
from pymq_server.broker.auth import save_user
from pymq_server.embedded import stop_embedded
from tests.client.tls import Authority, TlsProxy

SERVER_NAME = "broker.pymq.test"      # the name in the proxy's certificate (not the address it listens on)


def run(coro):  # noqa: ANN001, ANN201 - a test helper
    return asyncio.run(asyncio.wait_for(coro, 60))


# -- the grammar --------------------------------------------------------------------------------------------

def test_urls_parse_into_addresses():
    assert parse_url("stomp://h:1234") == StompAddress("h", 1234)
    assert parse_url("tcp://h") == StompAddress("h", 61613)
    assert parse_url("stomp://al%40ice:p%3Ass@h:1") == StompAddress("h", 1, None, "al@ice", "p:ss")
    assert parse_url("stomp://alice@h:1").password is None
    tls = parse_url("stomps://h?ca_file=/c%20a.pem&cert_file=c.pem&key_file=k.pem&verify=false&server_hostname=n")
    assert tls == StompAddress("h", 61614, TlsOptions("/c a.pem", "c.pem", "k.pem", False, "n"))
    for scheme in ("stomp+ssl", "ssl", "stomps"):
        address = parse_url(f"{scheme}://u:p@h:9")
        assert isinstance(address, StompAddress) and address.tls == TlsOptions() and address.username == "u"
    assert parse_url("vm://name?data_dir=/x") == VmAddress("name", {"data_dir": "/x"})
    assert parse_url("vm://bob:pw@name") == VmAddress("name", {}, "bob", "pw")


@pytest.mark.parametrize("url, words", [
    ("stomps://h?ca=/x.pem", "unknown option 'ca'"),
    ("stomp://h?ca_file=/x.pem", "TLS option 'ca_file' on a plain stomp:// URL"),
    ("stomps://h?verify=maybe", "verify='maybe'"),
    ("stomps://h?ca_file=", "option 'ca_file' is empty"),
    ("stomps://h?verify=true&verify=false", "given twice"),
    ("vm://x?dat_dir=/tmp", "unknown option 'dat_dir'"),
    ("vm://x?port=sixty", "expected a TCP port number"),
    ("vm://x?port=99999999999999999999", "expected a TCP port number"),
    ("stomp://h:99999", "bad URL"),
    ("stomp://h/queue/x", "path is a virtual host name"),
    ("amqp://h", "unsupported URL"),
])
def test_bad_urls_are_refused_before_connecting(url, words):
    with pytest.raises(ConnectFailed) as info:
        pymq.ConnectionFactory(url)
    assert words in str(info.value)
    with pytest.raises(ConnectFailed):
        pymq.aio.AsyncConnectionFactory(url)


def test_a_password_never_appears_in_an_error():
    with pytest.raises(ConnectFailed) as info:
        pymq.ConnectionFactory("stomp://alice:s3cret@h?x=1")
    assert "s3cret" not in str(info.value) and "alice:***@" in str(info.value)


def test_tls_options_for_a_plain_url_are_refused():
    with pytest.raises(ConnectFailed, match="not a TLS URL"):
        pymq.ConnectionFactory("stomp://h", tls=TlsOptions(verify=False))


# -- credentials ------------------------------------------------------------------------------------------------

@pytest.fixture
def users_broker(broker_factory, tmp_path):
    users = tmp_path / "users.yaml"
    save_user(str(users), "alice", "s3cr@t:pw", roles=["admin"])
    save_user(str(users), "bob", "bobpw", roles=["admin"])
    return broker_factory(users_file=str(users))


def _url(broker, credentials: str = "") -> str:  # noqa: ANN001
    return f"stomp://{credentials}127.0.0.1:{broker.port}"


def test_blocking_sdk_uses_the_credentials_in_the_url(users_broker):
    with pymq.connect(_url(users_broker, "alice:s3cr%40t%3Apw@")) as conn:
        assert conn.user == "alice"
    with pytest.raises(AuthenticationFailed):
        pymq.connect(_url(users_broker, "alice:wrong@"))
    with pytest.raises(AuthenticationFailed):
        pymq.connect(_url(users_broker, "nobody:bad@"))       # not guest: the URL's credentials count
    # explicit arguments win over the URL, each on its own
    with pymq.connect(_url(users_broker, "alice:wrong@"), username="bob", password="bobpw") as conn:
        assert conn.user == "bob"
    with pymq.connect(_url(users_broker, "alice:wrong@"), password="s3cr@t:pw") as conn:
        assert conn.user == "alice"
    factory = pymq.ConnectionFactory(_url(users_broker, "alice:s3cr%40t%3Apw@"))
    with factory.create_connection("bob", "bobpw") as conn:
        assert conn.user == "bob"


def test_aio_sdk_uses_the_credentials_in_the_url(users_broker):
    async def main() -> None:
        async with pymq.aio.connect(_url(users_broker, "alice:s3cr%40t%3Apw@")) as conn:
            assert conn.user == "alice"
        with pytest.raises(AuthenticationFailed):
            await pymq.aio.connect(_url(users_broker, "nobody:bad@"))
        async with pymq.aio.connect(_url(users_broker, "alice:wrong@"), username="bob", password="bobpw") as conn:
            assert conn.user == "bob"
    run(main())


def test_vm_urls_carry_credentials_too():
    name = f"cred-{uuid.uuid4().hex[:6]}"
    try:
        with pymq.connect(f"vm://{name}") as conn:
            assert conn.user == "guest"
        with pytest.raises(AuthenticationFailed):
            pymq.connect(f"vm://nobody:bad@{name}")
    finally:
        stop_embedded(name)


# -- TLS ----------------------------------------------------------------------------------------------------------

@pytest.fixture
def pki(tmp_path):
    authority = Authority(tmp_path)
    server = authority.issue("server", dns=(SERVER_NAME, "localhost"))
    client = authority.issue("client", client=True)
    other = tmp_path / "other"
    other.mkdir()
    stranger = Authority(other, "stranger CA")
    return authority, server, client, stranger


@pytest.fixture
def proxy(broker, pki):
    authority, server, _, _ = pki
    p = TlsProxy(server, broker.port)
    yield p
    p.close()


@pytest.fixture
def mtls_proxy(broker, pki):
    authority, server, _, _ = pki
    p = TlsProxy(server, broker.port, client_ca=authority.ca_file)
    yield p
    p.close()


def _tls_url(proxy: TlsProxy, query: str = "", host: str = "localhost") -> str:
    return f"stomps://{host}:{proxy.port}" + (f"?{query}" if query else "")


def _round_trip(conn: pymq.Connection) -> None:
    session = conn.create_session()
    queue = pymq.Queue(f"tls-{uuid.uuid4().hex[:6]}")
    session.create_producer(queue).send("over tls")
    got = session.create_consumer(queue).receive(5)
    assert isinstance(got, pymq.TextMessage) and got.text == "over tls"


def _sessions(broker) -> int:  # noqa: ANN001
    return int(broker.call(lambda: len(broker.broker.sessions)))


def test_blocking_sdk_over_tls(proxy, pki):
    ca = pki[0].ca_file
    with pymq.connect(_tls_url(proxy, f"ca_file={ca}")) as conn:
        assert conn.user == "guest"
        _round_trip(conn)
    # scheme spellings, and server_hostname when the address is not the certificate's name
    with pymq.connect(f"stomp+ssl://127.0.0.1:{proxy.port}?ca_file={ca}&server_hostname={SERVER_NAME}") as conn:
        _round_trip(conn)


def test_aio_sdk_over_tls(proxy, pki):
    ca = pki[0].ca_file

    async def main() -> None:
        async with pymq.aio.connect(_tls_url(proxy, f"ca_file={ca}")) as conn:
            session = conn.create_session()
            queue = pymq.Queue(f"tls-{uuid.uuid4().hex[:6]}")
            await session.create_producer(queue).send("over tls")
            got = await (await session.create_consumer(queue)).receive(5)
            assert isinstance(got, pymq.TextMessage) and got.text == "over tls"
        url = f"stomps://127.0.0.1:{proxy.port}?ca_file={ca}&server_hostname={SERVER_NAME}"
        async with pymq.aio.connect(url) as conn:
            assert conn.user == "guest"
    run(main())


def _refused(call, broker, proxy) -> TlsError:  # noqa: ANN001
    before = _sessions(broker)
    with pytest.raises(TlsError) as info:
        call()
    assert proxy.forwarded == 0 and _sessions(broker) == before     # nothing was created behind it
    return info.value


def test_an_untrusted_certificate_is_refused_precisely(broker, proxy, pki):
    stranger = pki[3]
    for url in (_tls_url(proxy), _tls_url(proxy, f"ca_file={stranger.ca_file}")):
        error = _refused(lambda u=url: pymq.connect(u, timeout=5), broker, proxy)
        assert "certificate is not trusted" in str(error) and error.reason == "CERTIFICATE_VERIFY_FAILED"
        assert "self-signed certificate in certificate chain" in error.verify_message \
            or "unable to get local issuer certificate" in error.verify_message
        error = _refused(lambda u=url: run(pymq.aio.connect(u, timeout=5)), broker, proxy)
        assert "certificate is not trusted" in str(error) and error.reason == "CERTIFICATE_VERIFY_FAILED"


def test_a_certificate_for_another_host_is_refused(broker, proxy, pki):
    ca = pki[0].ca_file
    url = _tls_url(proxy, f"ca_file={ca}", host="127.0.0.1")      # the certificate names no IP address
    error = _refused(lambda: pymq.connect(url, timeout=5), broker, proxy)
    assert "127.0.0.1" in error.verify_message and "mismatch" in error.verify_message.lower()
    error = _refused(lambda: run(pymq.aio.connect(url, timeout=5)), broker, proxy)
    assert "mismatch" in error.verify_message.lower()


def test_verify_false_connects_to_an_untrusted_broker(proxy):
    with pymq.connect(_tls_url(proxy, "verify=false")) as conn:
        _round_trip(conn)

    async def main() -> None:
        async with pymq.aio.connect(_tls_url(proxy, "verify=false", host="127.0.0.1")) as conn:
            assert conn.user == "guest"
    run(main())


def test_explicit_tls_options_win_over_the_url(proxy, pki):
    ca = pki[0].ca_file
    stranger = pki[3].ca_file
    url = _tls_url(proxy, f"ca_file={stranger}")                     # the URL names the wrong CA
    with pymq.connect(url, tls=TlsOptions(ca_file=str(ca))) as conn:
        _round_trip(conn)
    context = ssl.create_default_context(cafile=str(ca))
    with pymq.connect(url, tls=context) as conn:                     # a whole SSLContext, as it is
        _round_trip(conn)

    async def main() -> None:
        async with pymq.aio.connect(url, tls=TlsOptions(ca_file=str(ca))) as conn:
            assert conn.user == "guest"
    run(main())


def test_mutual_tls(broker, mtls_proxy, pki):
    authority, _, client, _ = pki
    ca = authority.ca_file
    plain = _tls_url(mtls_proxy, f"ca_file={ca}")
    with_cert = _tls_url(mtls_proxy, f"ca_file={ca}&cert_file={client.cert}&key_file={client.key}")
    with pymq.connect(with_cert) as conn:
        _round_trip(conn)

    async def main() -> None:
        async with pymq.aio.connect(with_cert) as conn:
            assert conn.user == "guest"
    run(main())
    forwarded = mtls_proxy.forwarded
    before = _sessions(broker)
    for attempt in (lambda: pymq.connect(plain, timeout=5), lambda: run(pymq.aio.connect(plain, timeout=5))):
        with pytest.raises(TlsError) as info:
            attempt()
        # TLS 1.3: an alert (from an OpenSSL server) or a bare close (asyncio's), both worded the same way
        assert "client certificate (cert_file=, key_file=)" in str(info.value) and info.value.reason
    assert mtls_proxy.forwarded == forwarded and _sessions(broker) == before


def test_unreadable_tls_files_are_named(proxy, tmp_path):
    missing = tmp_path / "missing.pem"
    with pytest.raises(ConnectFailed, match="cannot load the CA file .*missing.pem"):
        pymq.connect(_tls_url(proxy, f"ca_file={missing}"))
    with pytest.raises(ConnectFailed, match="cannot load the client certificate .*missing.pem"):
        pymq.connect(_tls_url(proxy, f"verify=false&cert_file={missing}"))
    with pytest.raises(ConnectFailed, match="key_file needs cert_file"):
        pymq.connect(_tls_url(proxy, f"verify=false&key_file={Path(missing)}"))
    assert proxy.forwarded == 0


def test_both_sdks_over_the_brokers_own_tls_port(broker_factory, pki, tmp_path):
    """End to end against the broker's TLS listener (tls_port), credentials in the stomps:// URL, a client
    certificate, and the refusal of a broker certificate nobody vouched for."""
    authority, server, client, stranger = pki
    users = tmp_path / "users.yaml"
    save_user(str(users), "alice", "pw", roles=["admin"])
    broker = broker_factory(users_file=str(users), tls_port=0,
                            tls={"cert_file": str(server.cert), "key_file": str(server.key),
                                 "ca_file": str(authority.ca_file), "client_certificates": "optional"})
    base = f"localhost:{broker.server.tls_port}"
    url = f"stomps://alice:pw@{base}?ca_file={authority.ca_file}&cert_file={client.cert}&key_file={client.key}"
    with pymq.connect(url) as conn:
        assert conn.user == "alice"
        _round_trip(conn)

    async def main() -> None:
        async with pymq.aio.connect(url) as conn:
            assert conn.user == "alice"
            session = conn.create_session()
            queue = pymq.Queue(f"tls-{uuid.uuid4().hex[:6]}")
            await session.create_producer(queue).send("aio over the broker's TLS")
            got = await (await session.create_consumer(queue)).receive(5)
            assert isinstance(got, pymq.TextMessage) and got.text == "aio over the broker's TLS"
        with pytest.raises(AuthenticationFailed):
            await pymq.aio.connect(f"stomps://alice:wrong@{base}?ca_file={authority.ca_file}")
    run(main())
    before = _sessions(broker)
    for attempt in (lambda: pymq.connect(f"stomps://alice:pw@{base}?ca_file={stranger.ca_file}", timeout=5),
                    lambda: run(pymq.aio.connect(f"stomps://alice:pw@{base}", timeout=5))):
        with pytest.raises(TlsError, match="certificate is not trusted"):
            attempt()
    assert _sessions(broker) == before


def test_a_reset_right_after_the_handshake_is_the_certificate_refusal_too(pki):
    """A TLS 1.3 server refusing the client's certificate closes after the handshake; when the client's
    CONNECT is already in its socket, its kernel sends a reset, not a FIN. That race made
    test_mutual_tls fail once with ConnectFailed; here the reset is forced (SO_LINGER 0 after CONNECT
    arrived) and must read as the same TlsError."""
    authority, server, _, _ = pki
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(str(server.cert), str(server.key))
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]

    def serve() -> None:
        for _ in range(2):                                       # the blocking SDK, then pymq.aio
            conn, _ = listener.accept()
            tls = context.wrap_socket(conn, server_side=True)   # the handshake completes
            select.select([tls], [], [], 5)                      # the client's CONNECT has arrived, unread
            tls.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            tls.close()                                          # a reset

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    url = f"stomps://localhost:{port}?ca_file={authority.ca_file}"
    try:
        for attempt in (lambda: pymq.connect(url, timeout=5), lambda: run(pymq.aio.connect(url, timeout=5))):
            with pytest.raises(TlsError) as info:
                attempt()
            assert info.value.reason == "CLOSED_AFTER_HANDSHAKE"
            assert "client certificate (cert_file=, key_file=)" in str(info.value)
    finally:
        thread.join(5)
        listener.close()
