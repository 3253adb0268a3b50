"""The web console in a real browser (headless Chromium driven by Playwright) against a real broker
process: log in, every page, the live charts, a queue's depth following sends, purge, browse and show a
message, move / retry / delete dead letters, close a connection, create a queue — and a non-admin user
refused what the API refuses.  Screenshots are saved under test-artifacts/console/."""
from __future__ import annotations

import json
import os
import re
import threading
import time
import uuid

import pytest

import pymq
from pymq.errors import PymqError
from tests.admin.conftest import ADMIN, ADMIN_PW, APP, APP_PW, BrokerProcess, wait_until
from tests.browser import artifacts_dir, chromium  # noqa: F401 - fixture
from tests.storage.services import redis_url  # noqa: F401 - fixture



def expect(target):
    """Playwright's auto-waiting assertions (imported late: without Playwright the fixture says why)."""
    from playwright.sync_api import expect as playwright_expect
    return playwright_expect(target)


TIMEOUT = 15_000       # ms: the console refreshes every 2 s on a busy machine


class Console:
    """One browser context (its own cookies) looking at one broker's console."""

    def __init__(self, browser, broker: BrokerProcess, name: str) -> None:
        self.broker = broker
        self.name = name
        self.context = browser.new_context(viewport={"width": 1280, "height": 860})
        self.page = self.context.new_page()
        self.page.set_default_timeout(TIMEOUT)
        self.requests: list[str] = []
        self.errors: list[str] = []
        self.dialogs: list[str] = []
        self.page.on("request", lambda r: self.requests.append(r.url))
        self.page.on("pageerror", lambda e: self.errors.append(str(e)))
        self.page.on("dialog", lambda d: (self.dialogs.append(d.message), d.dismiss()))

    def open(self) -> None:
        self.page.goto(self.broker.admin_url + "/")

    def login(self, user: str = ADMIN, password: str = ADMIN_PW) -> None:
        self.open()
        page = self.page
        expect(page.locator("#login")).to_be_visible()
        page.fill("#login-user", user)
        page.fill("#login-password", password)
        page.click("#login-submit")
        expect(page.locator("#app")).to_be_visible()
        expect(page.locator("#whoami")).to_contain_text(user)

    def go(self, route: str) -> None:
        self.page.evaluate("route => { location.hash = route; }", "#/" + route)

    def row(self, attr: str, value: str):
        return self.page.locator(f'tr[data-{attr}="{value}"]')

    def cell(self, attr: str, value: str, column: str):
        return self.row(attr, value).locator(f'td[data-col="{column}"]')

    def shot(self, step: str) -> str:
        path = os.path.join(artifacts_dir("console"), f"{self.name}-{step}.png")
        self.page.screenshot(path=path, full_page=True)
        return path

    def close(self) -> None:
        try:
            assert not self.errors, f"JavaScript errors on the page: {self.errors}"
            assert not self.dialogs, f"unexpected dialogs (script injection?): {self.dialogs}"
            own = self.broker.admin_url
            foreign = [u for u in self.requests if not u.startswith(own) and not u.startswith("data:")]
            assert not foreign, f"the console fetched from other origins: {foreign}"
        finally:
            self.context.close()


@pytest.fixture
def console(chromium, broker_process, request):  # noqa: F811
    consoles: list[Console] = []

    def make(name: str | None = None, broker: BrokerProcess | None = None) -> Console:
        c = Console(chromium, broker or broker_process, name or request.node.name.replace("test_", ""))
        consoles.append(c)
        return c
    yield make
    for c in consoles:
        c.close()


def send(broker, queue, bodies, user=ADMIN, password=ADMIN_PW, **props):
    with pymq.connect(broker.url, username=user, password=password) as conn:
        session = conn.create_session()
        producer = session.create_producer(pymq.Queue(queue))
        for body in bodies:
            producer.send(session.create_text_message(body, properties=props) if props else body)


def depth(broker, queue):
    return broker.op("queue-info", name=queue)["metrics"]["depth"]


def test_login_overview_and_live_charts(console):
    c = console("overview")
    c.open()
    page = c.page
    expect(page.locator("#login")).to_be_visible()
    c.shot("login")
    page.fill("#login-user", ADMIN)
    page.fill("#login-password", "wrong")
    page.click("#login-submit")
    expect(page.locator("#login-error")).to_contain_text("wrong username or password")
    assert page.locator("#app").is_hidden()
    c.login()
    # the session cookie is HttpOnly + SameSite=Strict: the page's scripts cannot read it
    cookie = next(k for k in c.context.cookies() if k["name"] == "pymq_session")
    assert cookie["httpOnly"] is True and cookie["sameSite"] == "Strict"
    assert page.evaluate("document.cookie") == ""
    # no credentials in any URL the page used
    assert not [u for u in c.requests if ADMIN_PW in u or "password" in u]
    expect(page.locator("#tile-ready .value")).to_have_text("ready")
    expect(page.locator("#node")).to_contain_text(f"node pymq · {pymq.__version__}")
    send(c.broker, "web.traffic", [f"t{i}" for i in range(20)])
    expect(page.locator("#tile-queues .value")).not_to_have_text("0")
    # traffic (bounded: at most 12 s) until the sampled rates show messages in and out
    stop = threading.Event()
    traffic = threading.Thread(target=_traffic, args=(c.broker, stop), daemon=True)
    traffic.start()
    try:
        def flowing():
            queues = {q["name"]: q for q in c.broker.op("list-queues")}
            live = queues.get("web.live")
            return live is not None and live["rate_in"] > 0 and live["rate_out"] > 0
        assert wait_until(flowing, timeout=12)
        expect(page.locator("#tile-rates .value")).not_to_have_text("0 / 0")
        expect(page.locator("#tile-connections .value")).not_to_have_text("0")
        _charts_drawn(page)
        c.shot("overview")
    finally:
        stop.set()
        traffic.join(15)


def _charts_drawn(page):
    """Each of the four charts has ink on its canvas (they draw once two samples exist, one per 2 s)."""
    for chart in ("rates", "depth", "connections", "memory"):
        assert wait_until(lambda chart=chart: page.evaluate(
            """id => { const c = document.getElementById(id); if (!c || !c.width) return false;
                       const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;
                       let ink = 0; for (let i = 3; i < d.length; i += 4) if (d[i]) ink++;
                       return ink > 500; }""", f"chart-{chart}"), timeout=20), chart
    assert page.evaluate("document.querySelectorAll('canvas').length") == 4


def _traffic(broker, stop, seconds=12.0):
    """A producer and a consumer exchanging small batches until ``stop`` (or ``seconds``) — bounded."""
    deadline = time.monotonic() + seconds
    with pymq.connect(broker.url, username=ADMIN, password=ADMIN_PW) as conn:
        session = conn.create_session()
        producer = session.create_producer(pymq.Queue("web.live"))
        consumer = session.create_consumer(pymq.Queue("web.live"))
        while not stop.is_set() and time.monotonic() < deadline:
            for i in range(20):
                producer.send(f"live {i}", delivery_mode=pymq.NON_PERSISTENT)
            for _ in range(15):                 # leave a few behind: the depth chart moves too
                consumer.receive(1)
            time.sleep(0.2)                     # the traffic's pace (the charts move), not a wait


def test_session_survives_a_reload_and_ends_at_log_out(console):
    c = console("logout")
    c.login()
    page = c.page
    page.reload()
    expect(page.locator("#app")).to_be_visible()
    page.click("#logout")
    expect(page.locator("#login")).to_be_visible()
    page.reload()
    expect(page.locator("#login")).to_be_visible()


def test_queue_depth_follows_sends_and_purge_empties_it(console):
    b = console().broker
    b.op("create-queue", name="web.orders")
    send(b, "web.orders", ["a", "b"])
    c = console("queues")
    c.login()
    c.go("queues")
    expect(c.cell("queue", "web.orders", "depth")).to_have_text("2")
    send(b, "web.orders", ["c", "d", "e"])
    expect(c.cell("queue", "web.orders", "depth")).to_have_text("5")       # refreshed by itself
    expect(c.cell("queue", "web.orders", "ready")).to_have_text("5")
    c.shot("before-purge")
    purge = c.row("queue", "web.orders").locator("button.purge")
    purge.click()
    expect(purge).to_have_text("Purge web.orders?")                          # asks first
    assert depth(b, "web.orders") == 5
    purge.click()
    expect(c.page.locator("#flash")).to_contain_text("purged 5 messages from web.orders")
    expect(c.cell("queue", "web.orders", "depth")).to_have_text("0")
    assert depth(b, "web.orders") == 0
    c.shot("after-purge")


def test_create_a_queue(console):
    c = console("create-queue")
    c.login()
    c.go("queues")
    page = c.page
    page.fill("#new-queue-name", "web.created")
    page.fill("#new-queue-max-deliveries", "4")
    page.select_option("#new-queue-overflow", "reject")
    page.click("#create-queue-submit")
    expect(page.locator("#flash")).to_contain_text("queue web.created created")
    expect(c.cell("queue", "web.created", "owner")).to_have_text(ADMIN)
    config = c.broker.op("queue-info", name="web.created")["config"]
    assert config["max_deliveries"] == 4 and config["overflow"] == "reject"
    page.fill("#new-queue-name", "web.created")
    page.fill("#new-queue-max-deliveries", "9")
    page.click("#create-queue-submit")
    expect(page.locator("#flash")).to_contain_text("destination-exists")
    assert c.broker.op("queue-info", name="web.created")["config"]["max_deliveries"] == 4


def test_definitions_export_and_import(console):
    """The console's Definitions page (spec/admin.md): Export shows the broker's document (hashes, never
    passwords); Import applies a pasted one, and a bad one is refused with nothing changed."""
    c = console("definitions")
    c.login()
    c.broker.op("create-queue", name="web.defs", config={"max_depth": 7})
    c.go("definitions")
    page = c.page
    page.click("#definitions-export")
    expect(page.locator("#flash")).to_contain_text("exported")
    doc = json.loads(page.input_value("#definitions-json"))
    assert any(q["name"] == "web.defs" and q["settings"]["max_depth"] == 7 for q in doc["queues"])
    assert ADMIN_PW not in page.input_value("#definitions-json")
    expect(page.locator("#definitions-download")).to_be_visible()
    new = {"pymq_definitions": 1, "queues": [{"name": "web.imported", "settings": {"max_depth": 3}}]}
    page.fill("#definitions-import", json.dumps(new))
    page.click("#definitions-import-submit")
    expect(page.locator("#flash")).to_contain_text("queues created 1")
    assert c.broker.op("queue-info", name="web.imported")["config"]["max_depth"] == 3
    bad = {"pymq_definitions": 1, "queues": [{"name": "web.never", "settings": {"max_depth": -1}}]}
    page.fill("#definitions-import", json.dumps(bad))
    page.click("#definitions-import-submit")
    expect(page.locator("#flash")).to_contain_text("config")
    assert "web.never" not in [q["name"] for q in c.broker.op("list-queues")]


def test_browse_a_message_page_by_page(console):
    b = console().broker
    hostile = '<img src=x onerror="alert(1)"><script>alert(2)</script>'
    send(b, "web.browse", [json.dumps({"order": i, "note": hostile}) for i in range(23)], kind="order")
    c = console("browse")
    c.login()
    c.go("queues/web.browse")
    page = c.page
    expect(page.locator('#queue-summary [data-metric="depth"] .value')).to_have_text("23")
    rows = page.locator("#message-browser tbody tr")
    expect(rows).to_have_count(20)
    expect(page.locator("#page-info")).to_have_text("1–20 of 23")
    page.click("#page-next")
    expect(page.locator("#page-info")).to_have_text("21–23 of 23")
    expect(rows).to_have_count(3)
    page.click("#page-prev")
    expect(page.locator("#page-info")).to_have_text("1–20 of 23")
    first = b.op("browse-queue", name="web.browse", limit=1)["messages"][0]
    page.locator(f'tr[data-message-id="{first["message_id"]}"] a.message-link').click()
    body = page.locator("#message-body")
    expect(body).to_contain_text('"order": 0')
    # other people's data is text, never markup
    assert json.loads(body.inner_text())["note"] == hostile
    assert page.locator("#message-detail img, #message-detail script").count() == 0
    detail = page.locator("#message-detail")
    expect(detail).to_contain_text("kind")
    expect(detail).to_contain_text("/queue/web.browse")
    c.shot("message")
    assert depth(b, "web.browse") == 23                                        # browsing took nothing


def test_move_and_delete_a_message(console):
    b = console().broker
    send(b, "web.move", ["first", "second"])
    c = console("move")
    c.login()
    c.go("queues/web.move")
    page = c.page
    ids = [m["message_id"] for m in b.op("browse-queue", name="web.move")["messages"]]
    page.locator(f'tr[data-message-id="{ids[0]}"] a.message-link').click()
    page.fill("#move-target", "web.moved")
    page.locator("#move-form button").click()
    expect(page.locator("#flash")).to_contain_text("moved 1 message(s) to web.moved")
    assert wait_until(lambda: depth(b, "web.moved") == 1 and depth(b, "web.move") == 1)
    page.locator(f'tr[data-message-id="{ids[1]}"] a.message-link').click()
    page.click("#drop-message")
    expect(page.locator("#drop-message")).to_have_text("Delete this message?")
    page.click("#drop-message")
    expect(page.locator("#flash")).to_contain_text("deleted 1 message(s)")
    assert depth(b, "web.move") == 0


def _dead_letters(b, queue, n):
    b.op("create-queue", name=queue, config={"max_deliveries": 1})
    send(b, queue, [f"{queue}-{i}" for i in range(n)])
    with pymq.connect(b.url, username=ADMIN, password=ADMIN_PW) as conn:
        session = conn.create_session(ack_mode=pymq.CLIENT_ACKNOWLEDGE)
        consumer = session.create_consumer(pymq.Queue(queue))
        for _ in range(n):
            assert consumer.receive(5) is not None
        session.recover()
        consumer.close()
    assert wait_until(lambda: "DLQ." + queue in {q["name"] for q in b.op("list-queues")}
                      and depth(b, "DLQ." + queue) == n)


def test_dead_letters_retry_one_then_all(console):
    b = console().broker
    _dead_letters(b, "web.pay", 3)
    c = console("dlq")
    c.login()
    c.go("dlq")
    page = c.page
    expect(c.cell("queue", "DLQ.web.pay", "source")).to_have_text("web.pay")
    expect(c.cell("queue", "DLQ.web.pay", "depth")).to_have_text("3")
    expect(c.cell("queue", "DLQ.web.pay", "reasons")).to_contain_text("delivered 1 times (maximum 1): 3")
    c.shot("list")
    # one from the message view
    c.row("queue", "DLQ.web.pay").locator("a.queue-link").click()
    one = b.op("browse-queue", name="DLQ.web.pay", limit=1)["messages"][0]["message_id"]
    page.locator(f'tr[data-message-id="{one}"] a.message-link').click()
    expect(page.locator("#retry-message")).to_have_text("Retry to /queue/web.pay")
    c.shot("message")
    page.click("#retry-message")
    expect(page.locator("#flash")).to_contain_text("retried 1 message(s)")
    assert wait_until(lambda: depth(b, "web.pay") == 1 and depth(b, "DLQ.web.pay") == 2)
    # the rest from the list
    c.go("dlq")
    retry = c.row("queue", "DLQ.web.pay").locator("button.retry-all")
    retry.click()
    retry.click()
    expect(page.locator("#flash")).to_contain_text("retried 2 message(s)")
    expect(c.cell("queue", "DLQ.web.pay", "depth")).to_have_text("0")
    assert depth(b, "web.pay") == 3


def test_delete_all_dead_letters(console):
    b = console().broker
    _dead_letters(b, "web.junk", 2)
    c = console("dlq-delete")
    c.login()
    c.go("dlq")
    purge = c.row("queue", "DLQ.web.junk").locator("button.purge")
    purge.click()
    purge.click()
    expect(c.page.locator("#flash")).to_contain_text("deleted 2 dead letter(s)")
    assert depth(b, "DLQ.web.junk") == 0


def test_connections_consumers_topics_and_subscriptions(console):
    b = console().broker
    send(b, "web.held", ["held"])
    client = pymq.connect(b.url, username=APP, password=APP_PW, client_id="web-client")
    try:
        session = client.create_session(ack_mode=pymq.CLIENT_ACKNOWLEDGE)
        consumer = session.create_consumer(pymq.Queue("web.held"))
        assert consumer.receive(5).text == "held"
        session.create_durable_consumer(pymq.Topic("web.news"), "reader", selector="urgent = true")
        session.create_producer(pymq.Topic("web.news")).send("extra!")
        conn_id = next(x["id"] for x in b.op("connections") if x["client_id"] == "web-client")
        c = console("pages")
        c.login()
        c.go("topics")
        expect(c.cell("topic", "web.news", "published")).to_have_text("1")
        c.shot("topics")
        c.go("subscriptions")
        sub = c.row("subscription", "sub:web-client:reader")
        expect(sub.locator('td[data-col="client_id"]')).to_have_text("web-client")
        expect(sub.locator('td[data-col="selector"]')).to_have_text("urgent = true")
        expect(sub.locator('td[data-col="durable"]')).to_have_text("yes")
        c.shot("subscriptions")
        c.go("consumers")
        row = c.row("consumer", f"{conn_id}/" + next(
            x["id"] for x in b.op("list-consumers") if x["connection"] == conn_id and x["queue"] == "/queue/web.held"))
        expect(row.locator('td[data-col="in_flight"]')).to_have_text("1")
        expect(row.locator('td[data-col="user"]')).to_have_text(APP)
        c.shot("consumers")
        c.go("connections")
        expect(c.cell("connection", conn_id, "client_id")).to_have_text("web-client")
        c.shot("connections")
        close = c.row("connection", conn_id).locator("button.close-connection")
        close.click()
        close.click()
        expect(c.page.locator("#flash")).to_contain_text(f"closed {conn_id}")
        expect(c.row("connection", conn_id)).to_have_count(0)
        # the client learns it (an ERROR), and its unacknowledged message is ready again
        assert wait_until(lambda: b.op("queue-info", name="web.held")["metrics"]["ready"] == 1)
        with pytest.raises(PymqError):
            for _ in range(50):
                session.create_producer(pymq.Queue("web.held")).send("after close")
    finally:
        try:
            client.close()
        except PymqError:
            pass


def test_non_admin_sees_only_what_the_api_allows(console):
    b = console().broker
    b.op("create-queue", name="web.private")
    send(b, "web.private", ["secret"])
    c = console("non-admin")
    c.login(APP, APP_PW)
    expect(c.page.locator("#whoami")).to_have_text(APP)
    c.go("connections")
    refusal = c.page.locator("#connections-body .refused")
    expect(refusal).to_contain_text("access-denied")
    expect(refusal).to_contain_text(f"user '{APP}' may not list connections: administrators only")
    c.shot("connections-refused")
    for page, what in (("consumers", "list consumers"), ("storage", "read storage status")):
        c.go(page)
        expect(c.page.locator(f"#{page}-body .refused")).to_contain_text(f"may not {what}")
    b.op("create-queue", name="web.shared")
    send(b, "web.shared", ["shared"])
    b.op("grant", destination="/queue/web.shared", principal=f"user:{APP}", permissions=["consume"])
    c.go("queues")
    purge = c.row("queue", "web.shared").locator("button.purge")
    expect(c.row("queue", "web.private")).to_have_count(0)     # lists show what the user may see
    purge.click()
    purge.click()
    expect(c.page.locator("#flash")).to_contain_text(f"access-denied: user '{APP}' may not purge on /queue/web.shared")
    assert depth(b, "web.shared") == 1
    c.go("queues/web.shared")
    expect(c.page.locator("#message-browser .error")).to_contain_text("may not browse")
    c.shot("browse-refused")
    c.go("queues/web.private")
    expect(c.page.locator("#queue-summary .error")).to_contain_text("may not see /queue/web.private")


def test_storage_devices_and_scores(console, tmp_path):
    broker = BrokerProcess(tmp_path / "scored", config={"storage": {
        "devices": {"memory": {"kind": "memory"}, "file": {"kind": "file"}},
        "persistent_device": "file",
        "selection": {"strategy": "first-match", "default_device": "file", "rules": [
            {"id": "chatty", "device": "memory", "weight": 60, "condition": "DESTINATION_NAME = '/queue/chatty'"}]}}})
    broker.start()
    try:
        with pymq.connect(broker.url) as conn:
            conn.create_session().create_producer(pymq.Queue("chatty")).send("gossip")
        c = console("storage", broker)
        c.login("guest", "guest")
        c.go("storage")
        expect(c.cell("device", "memory", "score")).to_have_text(re.compile(r"^-?\d"))
        expect(c.cell("device", "file", "online")).to_have_text("yes")
        expect(c.page.locator("#storage-body")).to_contain_text("chatty")
        expect(c.page.locator("#storage-body")).to_contain_text("DESTINATION_NAME = '/queue/chatty'")
        c.shot("devices")
    finally:
        assert broker.stop() == 0


def test_cluster_nodes(console, tmp_path, redis_url):  # noqa: F811
    from tests.admin.test_cluster_admin import AdminNode, hold_for_dead_peer
    cluster = {"store": redis_url, "secret": "s", "name": f"web{uuid.uuid4().hex[:8]}",
               "heartbeat_ms": 200, "dead_after_ms": 1200}
    nodes = [AdminNode(f"w{i}", str(tmp_path / f"w{i}"), cluster, {"admin_port": 0}).start() for i in range(2)]
    try:
        admin_url = nodes[0].admin_url

        class Shim:                            # what Console needs of a broker
            pass
        shim = Shim()
        shim.admin_url = admin_url
        c = console("cluster", shim)
        c.login("guest", "guest")
        c.go("cluster")
        expect(c.page.locator('tr[data-node="w1"] td[data-col="link"]')).to_have_text("up")
        expect(c.page.locator('tr[data-node="w0"] td[data-col="self"]')).to_have_text("yes")
        expect(c.page.locator('tr[data-outbox="w1"] td[data-col="state"]')).to_have_text("alive")
        assert c.page.locator("button.purge-outbox").count() == 0          # nothing to purge for a live peer
        c.shot("nodes")
        hold_for_dead_peer(nodes[0], nodes[1], 2)
        outbox = c.page.locator('tr[data-outbox="w1"]')
        expect(outbox.locator('td[data-col="state"]')).to_have_text("dead")
        expect(outbox.locator('td[data-col="messages"]')).to_have_text("2")
        c.shot("held")
        purge = outbox.locator("button.purge-outbox")
        purge.click()
        expect(purge).to_have_text("Drop 2 held for w1?")
        purge.click()
        expect(c.page.locator("#flash")).to_contain_text("purged 2 message(s) held for w1")
        expect(outbox.locator('td[data-col="messages"]')).to_have_text("0")
        single = console("not-clustered")
        single.login()
        single.go("cluster")
        expect(single.page.locator("#cluster-body")).to_contain_text("not part of a cluster")
    finally:
        for node in nodes:
            node.stop()
            node.kill()



# -- running the broker from the console (issue 28.4) --------------------------------------------------------
def _ink(page, canvas_id: str) -> bool:
    return page.evaluate(
        """id => { const c = document.getElementById(id); if (!c || !c.width) return false;
                   const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;
                   let ink = 0; for (let i = 3; i < d.length; i += 4) if (d[i]) ink++;
                   return ink > 500; }""", canvas_id)


def _shot_is_real(path: str) -> None:
    """The screenshot exists and is a picture of something (not an empty or blank page)."""
    with open(path, "rb") as fh:
        head = fh.read(8)
    assert head == b"\x89PNG\r\n\x1a\n", path
    assert os.path.getsize(path) > 20_000, (path, os.path.getsize(path))


def test_users_roles_and_grants(console):
    b = console().broker
    name = "web-" + uuid.uuid4().hex[:6]
    b.op("create-queue", name="web.granted")
    c = console("users")
    c.login()
    expect(c.page.locator("#nav-users")).to_be_visible()
    c.go("users")
    page = c.page
    expect(c.row("user", ADMIN)).to_be_visible()
    expect(c.cell("user", APP, "roles")).to_have_text("app")
    page.fill("#new-user-name", name)
    page.fill("#new-user-password", "a-password-of-carol")
    page.fill("#new-user-roles", "app")
    page.click("#add-user-submit")
    expect(page.locator("#flash")).to_contain_text(f"user {name} added")
    expect(c.cell("user", name, "roles")).to_have_text("app")
    assert {u["name"]: u["roles"] for u in b.op("list-users")}[name] == ["app"]
    with pymq.connect(b.url, username=name, password="a-password-of-carol"):
        pass                                                  # the new user logs in at once

    roles = c.row("user", name).locator("input.roles-input")
    roles.fill("app, monitor")
    c.row("user", name).locator("button.set-roles").click()
    expect(page.locator("#flash")).to_contain_text(f"roles of {name}: app, monitor")
    expect(c.cell("user", name, "roles")).to_have_text("app, monitor")
    assert {u["name"]: u["roles"] for u in b.op("list-users")}[name] == ["app", "monitor"]

    page.fill("#grants-destination", "/queue/web.granted")
    page.fill("#grant-principal", f"user:{name}")
    page.check("#grant-consume")
    page.check("#grant-browse")
    page.click("#grants-submit")
    expect(page.locator("#flash")).to_contain_text(f"granted consume, browse on /queue/web.granted to user:{name}")
    expect(c.row("principal", f"user:{name}")).to_contain_text("browse, consume")
    expect(page.locator("#grants-owner")).to_contain_text(f"Owner of /queue/web.granted: {ADMIN}")
    assert sorted(b.op("acl", destination="/queue/web.granted")["grants"][f"user:{name}"]) == ["browse", "consume"]
    _shot_is_real(c.shot("users-and-grants"))
    revoke = c.row("principal", f"user:{name}").locator('button.revoke[data-permission="consume"]')
    revoke.click()
    revoke.click()
    expect(page.locator("#flash")).to_contain_text(f"revoked consume on /queue/web.granted from user:{name}")
    expect(c.row("principal", f"user:{name}")).not_to_contain_text("consume")
    assert b.op("acl", destination="/queue/web.granted")["grants"][f"user:{name}"] == ["browse"]

    remove = c.row("user", name).locator("button.remove-user")
    remove.click()
    remove.click()
    expect(page.locator("#flash")).to_contain_text(f"user {name} removed")
    expect(c.row("user", name)).to_have_count(0)
    assert name not in {u["name"] for u in b.op("list-users")}
    with pytest.raises(PymqError):
        pymq.connect(b.url, username=name, password="a-password-of-carol").close()


def test_alter_and_drop_a_queue(console):
    b = console().broker
    b.op("create-queue", name="web.alter")
    send(b, "web.alter", ["x", "y"])
    c = console("alter-drop")
    c.login()
    c.go("queues/web.alter")
    page = c.page
    expect(page.locator('#queue-summary [data-metric="depth"] .value')).to_have_text("2")
    page.fill("#alter-max_deliveries", "3")
    page.fill("#alter-max_depth", "50")
    page.select_option("#alter-overflow", "reject")
    page.click("#alter-submit")
    expect(page.locator("#flash")).to_contain_text("altered web.alter")
    config = b.op("queue-info", name="web.alter")["config"]
    assert (config["max_deliveries"], config["max_depth"], config["overflow"]) == (3, 50, "reject")
    page.locator("details summary").click()
    expect(page.locator("#queue-summary details")).to_contain_text("max_depth")
    _shot_is_real(c.shot("altered"))
    # past what the field allows (the browser's own check taken away): the broker refuses, nothing changes
    page.evaluate("document.getElementById('alter-default_priority').removeAttribute('max')")
    page.fill("#alter-default_priority", "12")
    page.click("#alter-submit")
    expect(page.locator("#flash")).to_contain_text("default_priority")
    expect(page.locator("#flash")).to_have_class(re.compile("error"))
    assert b.op("queue-info", name="web.alter")["config"]["default_priority"] != 12
    drop = page.locator("#drop-queue")
    drop.click()
    expect(drop).to_have_text("Drop web.alter and its messages?")
    assert "web.alter" in {q["name"] for q in b.op("list-queues")}
    drop.click()
    expect(page.locator("#flash")).to_contain_text("dropped web.alter (2 message(s))")
    expect(page.locator("#page-queues")).to_be_visible()          # back on the list
    expect(c.row("queue", "web.alter")).to_have_count(0)
    assert "web.alter" not in {q["name"] for q in b.op("list-queues")}


def test_publish_with_headers_and_the_queue_charts(console):
    b = console().broker
    b.op("create-queue", name="web.publish")
    c = console("publish")
    c.login()
    c.go("queues/web.publish")
    page = c.page
    page.fill("#publish-headers", "color: blue\nJMSType: greeting")
    page.fill("#publish-body", "hello from the console")
    page.uncheck("#publish-persistent")
    page.click("#publish-submit")
    expect(page.locator("#flash")).to_contain_text("published 22 byte(s) to /queue/web.publish")
    expect(page.locator("#message-browser td.preview")).to_contain_text("hello from the console")
    expect(page.locator('#message-browser td:nth-child(5)')).to_have_text("no")       # not persistent
    page.locator("#message-browser a.message-link").first.click()
    expect(page.locator('#message-detail tr[data-header="color"]')).to_contain_text("blue")
    # readable timestamps: a date, with the epoch milliseconds after it
    stamp = page.locator('#message-detail tr[data-header="timestamp"] td').nth(1)
    expect(stamp).to_have_text(re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3} UTC \(\d{13}\)$"))
    with pymq.connect(b.url, username=ADMIN, password=ADMIN_PW) as conn:
        got = conn.create_session().create_consumer(pymq.Queue("web.publish")).receive(5)
        assert got is not None and got.text == "hello from the console"
        assert got.properties["color"] == "blue" and got.delivery_mode == pymq.NON_PERSISTENT
    # the queue's own charts: depth and rates sampled every refresh
    send(b, "web.publish", [f"m{i}" for i in range(30)])
    assert wait_until(lambda: _ink(page, "queue-chart-depth") and _ink(page, "queue-chart-rates"), timeout=20)
    expect(page.locator('#queue-summary [data-metric="depth"] .value')).to_have_text("30")
    _shot_is_real(c.shot("queue-charts"))
    # a header the broker owns is refused, nothing is sent
    page.fill("#publish-headers", "destination: /queue/elsewhere")
    page.fill("#publish-body", "misdirected")
    page.click("#publish-submit")
    expect(page.locator("#flash")).to_contain_text("cannot be set here")
    assert depth(b, "web.publish") == 30
    # to a topic, from the topics page, persistent by default
    with pymq.connect(b.url, username=ADMIN, password=ADMIN_PW) as conn:
        listener = conn.create_session().create_consumer(pymq.Topic("web.news"))
        c.go("topics")
        page.fill("#publish-destination", "/topic/web.news")
        page.fill("#publish-body", "extra")
        page.click("#publish-submit")
        expect(page.locator("#flash")).to_contain_text("to /topic/web.news (persistent)")
        heard = listener.receive(5)
        assert heard is not None and heard.text == "extra"


def test_monitor_user_gets_no_write_controls_and_the_api_refuses_them(console, tmp_path):
    monitor, monitor_pw = "watcher", "watcher-secret"
    b = BrokerProcess(tmp_path / "monitored", users={ADMIN: (ADMIN_PW, ["admin"]), monitor: (monitor_pw, ["monitor"])},
                      config={"default_permissions": {"role:app": ["produce", "consume", "browse", "create"]}})
    b.start()
    try:
        b.op("create-queue", name="web.watched", config={"max_depth": 10})
        send(b, "web.watched", ["kept"])
        c = console("monitor", broker=b)
        c.login(monitor, monitor_pw)
        page = c.page
        expect(page.locator("#nav-users")).to_be_hidden()
        c.go("queues")
        expect(page.locator("#queue-list")).to_be_visible()
        expect(page.locator("#create-queue")).to_have_count(0)
        expect(page.locator("button.purge")).to_have_count(0)
        c.go("topics")
        expect(page.locator("#page-topics")).to_be_visible()
        expect(page.locator("#publish-form")).to_have_count(0)
        c.go("queues/web.watched")
        expect(page.locator("#page-queue")).to_be_visible()
        for absent in ("#drop-queue", "#alter-queue", "#publish-form", "#purge-queue"):
            expect(page.locator(absent)).to_have_count(0)
        c.go("users")
        expect(page.locator("#users-body .refused")).to_contain_text("access-denied")
        expect(page.locator("#add-user")).to_have_count(0)
        _shot_is_real(c.shot("monitor-read-only"))
        # the API refuses what the buttons would have done, with the session's own CSRF token
        answers = page.evaluate("""async () => {
            const post = async (op, args) => {
              const r = await fetch(`/api/${op}`, { method: "POST", credentials: "same-origin",
                headers: { "Content-Type": "application/json", "X-CSRF-Token": state.csrf },
                body: JSON.stringify(args) });
              return [r.status, (await r.json()).error.code];
            };
            return [await post("publish", { destination: "/queue/web.watched", body: "no" }),
                    await post("drop-queue", { name: "web.watched", force: true }),
                    await post("alter-queue", { name: "web.watched", config: { max_depth: 99 } }),
                    await post("purge-queue", { name: "web.watched" }),
                    await post("add-user", { name: "intruder", password: "x-password", roles: ["admin"] }),
                    await post("grant", { destination: "/queue/web.watched", principal: "user:watcher",
                                          permissions: ["produce"] })];
        }""")
        assert answers == [[403, "access-denied"]] * 6, answers
        # and nothing changed
        info = b.op("queue-info", name="web.watched")
        assert info["metrics"]["depth"] == 1 and info["config"]["max_depth"] == 10
        assert "intruder" not in {u["name"] for u in b.op("list-users")}
        assert f"user:{monitor}" not in (b.op("acl", destination="/queue/web.watched")["grants"] or {})
    finally:
        assert b.stop() == 0, "".join(b.log[-30:])


def test_vhost_selector_narrows_the_lists(console, tmp_path):
    """The header's virtual-host selector (spec/admin.md "Virtual hosts"): all, '/', or one vhost, for every list;
    a user who may not list vhosts has none."""
    broker = BrokerProcess(tmp_path / "vhosts", users={ADMIN: (ADMIN_PW, ["admin"]), APP: (APP_PW, ["app"])},
                           config={"vhosts": {"shop": {"principals": ["*"], "max_queues": 10}}})
    broker.start()
    try:
        with pymq.connect(broker.url + "/shop", username=ADMIN, password=ADMIN_PW) as conn:
            conn.create_session().create_producer(pymq.Queue("web.vh")).send("in shop")
        send(broker, "web.vh.default", ["in /"])
        held = pymq.connect(broker.url, username=APP, password=APP_PW, vhost="shop")
        c = console("vhosts", broker)
        c.login()
        c.go("queues")
        page = c.page
        expect(c.row("queue", "$vh.shop.web.vh")).to_be_visible()
        expect(c.row("queue", "web.vh.default")).to_be_visible()
        expect(page.locator("#vhost-pick")).to_be_visible()
        expect(page.locator("#vhost option")).to_have_count(3)                 # all, /, shop
        page.select_option("#vhost", "shop")
        expect(c.row("queue", "web.vh.default")).to_have_count(0)
        expect(c.cell("queue", "$vh.shop.web.vh", "vhost")).to_have_text("shop")
        c.shot("shop-queues")
        c.go("connections")                                                    # the choice holds on every list
        expect(page.locator("#connections-body td[data-col='user']")).to_have_text([APP])
        page.select_option("#vhost", "/")
        expect(page.locator("#connections-body td[data-col='user']", has_text=APP)).to_have_count(0)
        c.go("queues")
        expect(c.row("queue", "web.vh.default")).to_be_visible()
        expect(c.row("queue", "$vh.shop.web.vh")).to_have_count(0)
        page.select_option("#vhost", "")
        expect(c.row("queue", "$vh.shop.web.vh")).to_be_visible()
        held.close()
        other = console("vhosts-app", broker)
        other.login(APP, APP_PW)
        other.go("queues")
        expect(other.page.locator("#queue-list")).to_be_visible()
        expect(other.page.locator("#vhost-pick")).to_be_hidden()
    finally:
        assert broker.stop() == 0
