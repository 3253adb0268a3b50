"""@stomp/stompjs in headless Chromium exchanges messages with the Python SDK over the broker's WebSocket
listener.

The page and the package's own UMD bundle (``PYMQ_STOMPJS``, from ``npm ci`` in tests/interop/browser by
``.ci/interop-clients.sh``) are served from 127.0.0.1 by a small aiohttp server in the test — no CDN, no
downloaded browser: Playwright drives the Debian ``chromium`` (tests/browser.py).  A screenshot of the
page goes to ``test-artifacts/websocket/``.
"""
from __future__ import annotations

import asyncio
import os
import threading

import pytest

import pymq
from tests.browser import artifacts_dir, chromium  # noqa: F401 - fixture
from tests.storage.services import service_url

PAGE = """<!doctype html>
<meta charset="utf-8">
<title>pymq over WebSocket</title>
<script src="/stomp.umd.js"></script>
<pre id="log"></pre>
<script>
  const log = (line) => { document.getElementById("log").textContent += line + "\\n"; };
  window.__received = [];
  window.__state = "starting";
  const client = new StompJs.Client({
    brokerURL: new URLSearchParams(location.search).get("ws"),
    // ?vhost=/name: CONNECT's host header selects a virtual host (spec/stomp.md §1)
    connectHeaders: {login: "browser", passcode: "browser-pw",
                     ...(new URLSearchParams(location.search).get("vhost")
                         ? {host: new URLSearchParams(location.search).get("vhost")} : {})},
    reconnectDelay: 0,
    heartbeatIncoming: 1000, heartbeatOutgoing: 1000,
  });
  client.onConnect = (frame) => {
    window.__state = "connected";
    window.__version = frame.headers["version"];
    window.__subprotocol = client.webSocket.protocol;
    log("connected, STOMP " + frame.headers["version"] + " over " + client.webSocket.protocol);
    client.subscribe("/queue/to-browser", (message) => {
      window.__received.push({body: message.body, color: message.headers["color"],
                              persistent: message.headers["persistent"]});
      log("got: " + message.body);
      // request/reply: answer where the SDK asked, with its correlation id
      client.publish({destination: message.headers["reply-to"], body: "echo: " + message.body,
                      headers: {"correlation-id": message.headers["correlation-id"], "from": "chromium"}});
      message.ack();
    }, {ack: "client-individual"});
    client.subscribe("/topic/prices", (message) => {
      window.__received.push({topic: message.body});
    }, {receipt: "sub-prices"});
    client.watchForReceipt("sub-prices", () => { window.__state = "subscribed"; log("subscribed"); });
    client.publish({destination: "/queue/from-browser", body: "hello from " + navigator.userAgent.split(" ")[0],
                    headers: {"content-type": "text/plain", "priority": "7"}});
    client.publish({destination: "/queue/from-browser-binary",
                    binaryBody: new Uint8Array([0, 1, 2, 253, 254, 255])});
  };
  client.onStompError = (frame) => { window.__state = "error: " + frame.headers["message"]; };
  client.onWebSocketClose = (event) => { if (window.__state !== "closed") log("websocket closed " + event.code); };
  client.activate();
</script>
"""


@pytest.fixture
def stompjs_bundle():
    path = service_url("PYMQ_STOMPJS", "@stomp/stompjs bundle", ".ci/interop-clients.sh")
    if not os.path.exists(path):
        pytest.fail(f"PYMQ_STOMPJS={path} does not exist: run .ci/interop-clients.sh again")
    return path


@pytest.fixture
def page_server(stompjs_bundle):
    """The test page and stomp.umd.js over HTTP on 127.0.0.1 (its own thread and loop)."""
    from aiohttp import web
    loop = asyncio.new_event_loop()
    ready = threading.Event()
    box: dict = {}

    async def start():
        async def index(request):
            return web.Response(text=PAGE, content_type="text/html")

        async def bundle(request):
            return web.FileResponse(stompjs_bundle)

        app = web.Application()
        app.router.add_get("/", index)
        app.router.add_get("/stomp.umd.js", bundle)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        box["runner"] = runner
        box["port"] = site._server.sockets[0].getsockname()[1]

    def run():
        asyncio.set_event_loop(loop)
        loop.run_until_complete(start())
        ready.set()
        loop.run_forever()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    assert ready.wait(10)
    yield f"http://127.0.0.1:{box['port']}/"
    asyncio.run_coroutine_threadsafe(box["runner"].cleanup(), loop).result(10)
    loop.call_soon_threadsafe(loop.stop)
    thread.join(10)


def test_stompjs_in_chromium_talks_to_the_python_sdk(broker_factory, tmp_path, chromium, page_server):  # noqa: F811
    from pymq_server.broker.auth import save_user
    users = tmp_path / "users.yaml"
    save_user(str(users), "browser", "browser-pw", ["app"])
    save_user(str(users), "sdk", "sdk-pw", ["admin"])
    broker = broker_factory(users_file=str(users), websocket={"port": 0, "allowed_origins": [page_server.rstrip("/")]})
    ws_url = f"ws://127.0.0.1:{broker.server.websocket_port}/stomp"
    page = chromium.new_page()
    try:
        page.goto(f"{page_server}?ws={ws_url}")
        page.wait_for_function("window.__state === 'subscribed' || window.__state.startsWith('error')",
                               timeout=15_000)
        assert page.evaluate("window.__state") == "subscribed"
        assert page.evaluate("window.__version") == "1.2"
        assert page.evaluate("window.__subprotocol") == "v12.stomp"
        with pymq.connect(broker.url, username="sdk", password="sdk-pw") as conn:
            session = conn.create_session()
            # what the browser sent on connecting
            first = session.create_consumer(pymq.Queue("from-browser")).receive(10)
            assert first is not None and first.text.startswith("hello from Mozilla") and first.priority == 7
            raw = session.create_consumer(pymq.Queue("from-browser-binary")).receive(10)
            assert raw is not None and raw.body == bytes([0, 1, 2, 253, 254, 255])
            # request/reply through the browser
            reply = pymq.Requestor(session, pymq.Queue("to-browser")).request(
                pymq.TextMessage("ping ✓", properties={"color": "green"}), timeout=10)
            assert reply is not None and reply.text == "echo: ping ✓" and reply.properties["from"] == "chromium"
            session.create_producer(pymq.Topic("prices")).send("42.17")
            page.wait_for_function("window.__received.length >= 2", timeout=10_000)
            received = page.evaluate("window.__received")
            assert {"body": "ping ✓", "color": "green", "persistent": "false"} in received   # a request
            assert {"topic": "42.17"} in received
        # the browser's ACK reached the broker: nothing left in flight
        q = broker.broker.queues["to-browser"]
        assert broker.call(lambda: (q.depth, q.acquired)) == (0, 0)
        page.screenshot(path=os.path.join(artifacts_dir("websocket"), "stompjs-page.png"))
    finally:
        page.evaluate("window.__state = 'closed'; client.deactivate()")
        page.close()


def test_stompjs_selects_a_vhost_and_replies_stay_in_it(broker_factory, tmp_path, chromium, page_server):  # noqa: F811
    """Issue 27 item 2 with stompjs: connectHeaders.host '/web' puts the page in vhost web; its queues are web's
    (an SDK in '/' sees none of them), and a request/reply through its temporary queue stays inside web."""
    from pymq_server.broker.auth import save_user
    users = tmp_path / "users.yaml"
    save_user(str(users), "browser", "browser-pw", ["app"])
    save_user(str(users), "sdk", "sdk-pw", ["admin"])
    broker = broker_factory(users_file=str(users), vhosts={"web": ["user:browser"]},
                            websocket={"port": 0, "allowed_origins": [page_server.rstrip("/")]})
    ws_url = f"ws://127.0.0.1:{broker.server.websocket_port}/stomp"
    page = chromium.new_page()
    try:
        page.goto(f"{page_server}?ws={ws_url}&vhost=/web")
        page.wait_for_function("window.__state === 'subscribed' || window.__state.startsWith('error')",
                               timeout=15_000)
        assert page.evaluate("window.__state") == "subscribed"
        with pymq.connect(broker.url, username="sdk", password="sdk-pw") as conn:     # the default vhost
            assert conn.create_session().create_consumer(pymq.Queue("from-browser")).receive(0.5) is None
        with pymq.connect(broker.url + "/web", username="sdk", password="sdk-pw") as conn:
            session = conn.create_session()
            first = session.create_consumer(pymq.Queue("from-browser")).receive(10)
            assert first is not None and first.text.startswith("hello from Mozilla")
            reply = pymq.Requestor(session, pymq.Queue("to-browser")).request(pymq.TextMessage("in web"), timeout=10)
            assert reply is not None and reply.text == "echo: in web"
        queues = broker.call(lambda: set(broker.broker.queues))
        assert {"$vh.web.from-browser", "$vh.web.to-browser"} <= queues and "to-browser" not in queues
    finally:
        page.evaluate("window.__state = 'closed'; client.deactivate()")
        page.close()
