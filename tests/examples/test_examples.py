"""Every program in examples/ runs as a user would run it, and checks its own result (exit status 0 and
its last line).  The SDK examples run twice: on their default in-process broker (``vm://``) and against a
real broker over TCP (``--url``).  The Spark pipeline runs in the README's own set-up (no PYTHONPATH help,
its own pymq-server); the browser page runs in headless Chromium against ``examples/browser/serve.py``."""
from __future__ import annotations

import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

import pymq
from tests.browser import artifacts_dir, chromium  # noqa: F401 - fixture
from tests.storage.services import service_url

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"

SDK_EXAMPLES = {
    "request_reply.py": "request/reply: all answers matched their requests",
    "selector_routing.py": "selectors: every message went where its selector said",
    "message_groups.py": "groups: each group stayed with one worker, in order",
    "durable_subscription.py": "durable: nothing was lost while the subscriber was away",
    "asyncio_pipeline.py": "asyncio: every reading went through the pipeline once",
}
OTHER_EXAMPLES = {"spark_orders_pipeline.py", "browser/serve.py"}


def _env() -> dict:
    # the README's set-up: the installed package, nothing borrowed from the test run's environment
    return {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH",)}


def _run(args: list[str], timeout: float = 180) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=timeout,
                          cwd=EXAMPLES.parent, env=_env())


def test_every_example_is_run_by_this_module():
    found = {str(p.relative_to(EXAMPLES)) for p in EXAMPLES.rglob("*.py") if "node_modules" not in p.parts}
    assert found == set(SDK_EXAMPLES) | OTHER_EXAMPLES


@pytest.mark.parametrize("name", sorted(SDK_EXAMPLES))
def test_sdk_example_on_its_own_in_process_broker(name):
    run = _run([str(EXAMPLES / name)])
    assert run.returncode == 0, run.stdout + run.stderr
    assert run.stdout.strip().splitlines()[-1] == SDK_EXAMPLES[name]


@pytest.mark.parametrize("name", sorted(SDK_EXAMPLES))
def test_sdk_example_against_a_broker_over_tcp(broker, name):
    run = _run([str(EXAMPLES / name), "--url", broker.url])
    assert run.returncode == 0, run.stdout + run.stderr
    assert run.stdout.strip().splitlines()[-1] == SDK_EXAMPLES[name]


#: names the examples used to take on whatever broker they were pointed at (and drained)
LIVE_QUEUES = ("orders", "payments", "prices", "raw", "clean")


@pytest.mark.parametrize("name", sorted(SDK_EXAMPLES))
def test_sdk_example_leaves_a_live_brokers_destinations_alone(broker, name):
    """Pointed at a live broker, an example makes its own uniquely named destinations and removes them:
    an operator's queues named like the example's keep their messages, an operator's durable subscription
    named like the example's keeps its own, and no queue or subscription is left behind."""
    with pymq.connect(broker.url) as conn:
        producer = conn.create_session().create_producer()
        for queue in LIVE_QUEUES:
            producer.send("the operator's own", pymq.Queue(queue))
    with pymq.connect(broker.url, client_id="archiver") as conn:
        conn.create_session().create_durable_consumer(pymq.Topic("news"), "archive").close()
    with pymq.connect(broker.url) as conn:
        conn.create_session().create_producer(pymq.Topic("news")).send("the operator's own news")
        queues = conn.queue_manager()
        before = sorted(q["name"] for q in queues.list() if not str(q["name"]).startswith("DLQ."))

    run = _run([str(EXAMPLES / name), "--url", broker.url])
    assert run.returncode == 0, run.stdout + run.stderr
    assert run.stdout.strip().splitlines()[-1] == SDK_EXAMPLES[name]

    with pymq.connect(broker.url) as conn:
        queues = conn.queue_manager()
        after = sorted(q["name"] for q in queues.list() if not str(q["name"]).startswith("DLQ."))
        assert after == before, "the example left queues behind (or took the operator's)"
        for queue in LIVE_QUEUES:
            assert queues.metrics(queue)["depth"] == 1, f"{name} drained the operator's queue {queue}"
        subscriptions = conn.queue_manager().call("list-subscriptions")
        names = sorted(str(s.get("name")) for s in subscriptions)
        assert names == ["sub:archiver:archive"], f"subscriptions left behind or removed: {subscriptions}"
    with pymq.connect(broker.url, client_id="archiver") as conn:
        session = conn.create_session()
        archive = session.create_durable_consumer(pymq.Topic("news"), "archive")
        got = archive.receive(5)
        assert got is not None and got.text == "the operator's own news", f"{name} took the operator's news"
        archive.close()
        session.unsubscribe("archive")
    with pymq.connect(broker.url) as conn:
        for queue in LIVE_QUEUES:
            conn.queue_manager().drop(queue, force=True)


@pytest.mark.slow
@pytest.mark.spark
def test_spark_pipeline_in_the_readme_set_up():
    from tests.spark._spark import need_spark
    need_spark()
    run = _run([str(EXAMPLES / "spark_orders_pipeline.py"), "--orders", "60"], timeout=600)
    assert "DATA_SOURCE_NOT_FOUND" not in run.stderr, run.stderr[-3000:]
    assert run.returncode == 0, run.stdout + run.stderr[-3000:]
    assert run.stdout.strip().splitlines()[-1] == "totals match what was sent"


class _Serve:
    def __init__(self, bundle: str) -> None:
        self.proc = subprocess.Popen([sys.executable, str(EXAMPLES / "browser" / "serve.py"), "--http-port", "0",
                                      "--ws-port", "0", "--stomp-port", "0", "--stompjs", bundle],
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=_env())
        self.lines: queue.Queue[str] = queue.Queue()
        self.seen: list[str] = []
        threading.Thread(target=lambda: [self.lines.put(line) for line in self.proc.stdout], daemon=True).start()

    def wait_for(self, pattern: str, timeout: float = 30.0) -> re.Match:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                line = self.lines.get(timeout=0.2)
            except queue.Empty:
                if self.proc.poll() is not None:
                    break
                continue
            self.seen.append(line)
            found = re.search(pattern, line)
            if found:
                return found
        raise AssertionError(f"no line matching {pattern!r}:\n{''.join(self.seen)}")

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
        return self.proc.wait(30)


def test_browser_page_over_websocket(chromium):  # noqa: F811
    bundle = service_url("PYMQ_STOMPJS", "@stomp/stompjs bundle", ".ci/interop-clients.sh")
    serve = _Serve(bundle)
    page = None
    try:
        page_url = serve.wait_for(r"^page:\s+(\S+)").group(1)
        stomp_url = serve.wait_for(r"^broker: (stomp://\S+)").group(1)
        page = chromium.new_page()
        page.goto(page_url)
        page.wait_for_function("document.getElementById('status').textContent.startsWith('connected')",
                               timeout=15_000)
        assert "over v12.stomp" in page.text_content("#status")
        page.wait_for_function("document.getElementById('ticks').children.length >= 1", timeout=15_000)
        with pymq.connect(stomp_url) as conn:
            chat = conn.create_session().create_consumer(pymq.Topic("chat"), "sender = 'browser'")
            page.fill("#text", "hello from Chromium")
            page.click("button")
            heard = chat.receive(10)
            assert heard is not None and heard.text == "hello from Chromium"
        serve.wait_for(r"page says: hello from Chromium")
        page.wait_for_function("document.getElementById('chat').textContent.includes(\"Python got 'hello from Chromium'\")",
                               timeout=10_000)
        page.screenshot(path=os.path.join(artifacts_dir("examples"), "browser-example.png"))
    finally:
        if page is not None:
            page.close()
        assert serve.stop() == 0, "".join(serve.seen)
