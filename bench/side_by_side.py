"""Issue 27's rows side by side: what a STOMP user moving from RabbitMQ or ActiveMQ brings, tried with stomp.py
(a client nobody here wrote) against pymq and the peers bench/peers.py starts (RabbitMQ + STOMP plugin,
ActiveMQ Classic), each on 127.0.0.1 with free ports, stopped at the end.

    python bench/side_by_side.py                       # pymq and every peer that can start
    python bench/side_by_side.py --brokers pymq,rabbitmq

Each row is a probe that answers Y (behaves as the row says), N (does not) or - (not a STOMP-visible
behaviour of that broker: the note says why); a peer that cannot start is reported as unavailable. The rows
are the ones issue 27 names; those that need a cluster or a JMS API (ids across nodes, typed properties,
TemporaryQueue.delete) are the tests the table points at, not probes here.
"""
from __future__ import annotations

import argparse
import os
import queue
import sys
import tempfile
import time
import uuid
from collections.abc import Callable

import stomp

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from peers import BROKERS, Broker, PeerUnavailable, PymqBroker  # noqa: E402

WAIT = 3.0          # seconds a probe waits for a message that should come
QUIET = 0.7         # seconds it waits to be sure one that should not come does not


class Listener(stomp.ConnectionListener):
    def __init__(self) -> None:
        self.messages: queue.Queue = queue.Queue()
        self.errors: queue.Queue = queue.Queue()

    def on_message(self, frame) -> None:
        self.messages.put(frame)

    def on_error(self, frame) -> None:
        self.errors.put(frame)

    def bodies(self, wait: float) -> list[str]:
        """Every body that arrives within ``wait`` seconds of the last one."""
        out = []
        while True:
            try:
                out.append(self.messages.get(timeout=wait).body)
            except queue.Empty:
                return out


def connect(b: Broker, host: str | None = None, heartbeats=(0, 0)) -> tuple[stomp.Connection12, Listener]:
    c = stomp.Connection12([("127.0.0.1", b.stomp_port)], heartbeats=heartbeats,
                           vhost=host or b.dialect.connect_host)
    listener = Listener()
    c.set_listener("l", listener)
    c.connect("guest", "guest", wait=True)
    return c, listener


def _topic_probe(b: Broker, pattern: str, sends: list[str], wanted: list[str]) -> tuple[str, str]:
    word = "s" + uuid.uuid4().hex[:6]
    sub, heard = connect(b)
    pub, _ = connect(b)
    try:
        sub.subscribe(b.dialect.topic_prefix + pattern.format(w=word), id="1", headers={"receipt": "s"})
        time.sleep(0.3)       # (RabbitMQ binds asynchronously to the receipt; a bench, not a test)
        for name in sends:
            pub.send(b.dialect.topic_prefix + name.format(w=word), name.format(w=word))
        got = sorted(heard.bodies(QUIET if not wanted else WAIT / 2))
        want = sorted(w.format(w=word) for w in wanted)
        return ("Y" if got == want else "N"), f"got {len(got)} of {len(want)}" + ("" if got == want else f": {got}")
    finally:
        for c in (sub, pub):
            c.disconnect()


def wildcard_star(b: Broker) -> tuple[str, str]:
    """SUBSCRIBE /topic/<w>.* gets <w>.a, not <w>.a.b."""
    return _topic_probe(b, "{w}.*", ["{w}.a", "{w}.a.b"], ["{w}.a"])


def wildcard_hash(b: Broker) -> tuple[str, str]:
    """SUBSCRIBE /topic/<w>.# gets <w>.a and <w>.a.b (RabbitMQ's multi-word wildcard)."""
    return _topic_probe(b, "{w}.#", ["{w}.a", "{w}.a.b"], ["{w}.a", "{w}.a.b"])


def wildcard_gt(b: Broker) -> tuple[str, str]:
    """SUBSCRIBE /topic/<w>.> gets <w>.a and <w>.a.b (ActiveMQ's multi-word wildcard)."""
    return _topic_probe(b, "{w}.>", ["{w}.a", "{w}.a.b"], ["{w}.a", "{w}.a.b"])


def numeric_selector_plain_header(b: Broker) -> tuple[str, str]:
    """A plain STOMP header n:9 matches selector 'n > 5' (and n:3 does not), as ActiveMQ does for STOMP."""
    name = b.dialect.queue_prefix + "sel" + uuid.uuid4().hex[:6]
    c, heard = connect(b)
    try:
        c.subscribe(name, id="1", headers={"selector": "n > 5", "receipt": "s"})
        time.sleep(0.3)
        c.send(name, "nine", headers={"n": "9"})
        c.send(name, "three", headers={"n": "3"})
        got = sorted(heard.bodies(WAIT / 2))
        return ("Y" if got == ["nine"] else "N"), f"delivered {got}"
    finally:
        c.disconnect()


def heartbeat_as_asked(b: Broker) -> tuple[str, str]:
    """A client asking heart-beat:0,500 is sent beats at about 500 ms (RabbitMQ honours the client)."""
    c = stomp.Connection12([("127.0.0.1", b.stomp_port)], heartbeats=(0, 500), vhost=b.dialect.connect_host)
    got: dict = {}

    class Connected(stomp.ConnectionListener):
        def on_connected(self, frame) -> None:
            got.update(frame.headers)
    c.set_listener("c", Connected())
    c.connect("guest", "guest", wait=True)
    c.disconnect()
    sx = int(got.get("heart-beat", "0,0").split(",")[0] or 0)
    return ("Y" if 0 < sx <= 1000 else "N"), f"CONNECTED heart-beat:{got.get('heart-beat')}"


def unknown_vhost_refused(b: Broker) -> tuple[str, str]:
    """CONNECT host:/<no such vhost> is refused (RabbitMQ's vhosts)."""
    c = stomp.Connection12([("127.0.0.1", b.stomp_port)], heartbeats=(0, 0), vhost="/no-such-vhost")
    c.set_listener("l", Listener())
    try:
        c.connect("guest", "guest", wait=True)
    except stomp.exception.ConnectFailedException:
        return "Y", "refused"
    c.disconnect()
    return "N", "connected (the host header is ignored)"


def vhosts_keep_queues_apart(b: Broker) -> tuple[str, str]:
    """A queue of one name in two vhosts is two queues (needs a vhost 'sbs' on the broker)."""
    if b.name == "rabbitmq":
        return "-", "needs the vhost made first (rabbitmqctl add_vhost): not probed here"
    name = b.dialect.queue_prefix + "vq" + uuid.uuid4().hex[:6]
    inside, heard_inside = connect(b, "/sbs")
    outside, heard_outside = connect(b, "/")
    try:
        inside.send(name, "inside")
        outside.send(name, "outside")
        inside.subscribe(name, id="1")
        outside.subscribe(name, id="1")
        got = (sorted(heard_inside.bodies(WAIT / 2)), sorted(heard_outside.bodies(QUIET)))
        return ("Y" if got == (["inside"], ["outside"]) else "N"), f"vhost /sbs got {got[0]}, / got {got[1]}"
    finally:
        for c in (inside, outside):
            c.disconnect()


ROWS: list[tuple[str, Callable[[Broker], tuple[str, str]]]] = [
    ("1 wildcard `*` (one word)", wildcard_star),
    ("1 wildcard `#` (any words)", wildcard_hash),
    ("1 wildcard `>` (ActiveMQ's)", wildcard_gt),
    ("2 unknown vhost refused at CONNECT", unknown_vhost_refused),
    ("2 one queue name in two vhosts", vhosts_keep_queues_apart),
    ("3 numeric selector on a plain header", numeric_selector_plain_header),
    ("5 heart-beat as the client asks", heartbeat_as_asked),
]

#: rows of issue 27 that no STOMP probe shows, and the tests that do against a real broker
ELSEWHERE = [
    ("4 message id kept across cluster nodes", "tests/cluster/test_ids.py (two real nodes)"),
    ("6 TemporaryQueue.delete(), exact Java property types", "tests/client (SDKs), bindings/java tests"),
    ("7 definitions export/import", "tests/admin/test_definitions.py, test_console_browser.py"),
    ("8 per-queue log, app-tx table_prefix, error codes", "tests/broker/test_queue_logs.py, "
                                                          "test_app_transaction.py, tests/docs/test_error_codes.py"),
]


class VhostPymq(PymqBroker):
    """pymq with the vhost the vhost rows use (a configuration file)."""

    def _launch(self):
        config = os.path.join(self.workdir, "broker.yaml")
        with open(config, "w") as fh:
            fh.write("vhosts:\n  sbs: ['*']\n")
        data = os.path.join(self.workdir, "data")
        os.makedirs(data, exist_ok=True)
        return self.popen([self.exe, "--host", "127.0.0.1", "--port", str(self.stomp_port), "--data-dir", data,
                           "--config", config])


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--brokers", default="pymq,rabbitmq,activemq")
    a = p.parse_args(argv)
    names = [n for n in a.brokers.split(",") if n]
    results: dict[str, dict[str, tuple[str, str]]] = {}
    versions: dict[str, str] = {}
    with tempfile.TemporaryDirectory(prefix="pymq-side-") as tmp:
        for name in names:
            quiet = lambda *x: None      # noqa: E731 - the peers' progress lines
            b = VhostPymq(log=quiet) if name == "pymq" else BROKERS[name](log=quiet)
            try:
                b.start(tmp)
            except PeerUnavailable as e:
                print(f"{name}: unavailable: {e}", file=sys.stderr)
                b.stop()
                continue
            versions[name] = b.version.split()[0] if b.version else "?"
            try:
                row_results = {}
                for title, probe in ROWS:
                    try:
                        row_results[title] = probe(b)
                    except (OSError, stomp.exception.StompException) as exc:   # a peer's refusal answers too
                        row_results[title] = ("N", f"{type(exc).__name__}: {exc}"[:80])
                results[name] = row_results
            finally:
                b.stop()
    shown = list(results)
    print("| row | " + " | ".join(f"{n} {versions[n]}" for n in shown) + " |")
    print("|---|" + "---|" * len(shown))
    for title, _ in ROWS:
        print(f"| {title} | " + " | ".join(f"{results[n][title][0]} ({results[n][title][1]})" for n in shown) + " |")
    for title, where in ELSEWHERE:
        print(f"| {title} | " + " | ".join("-" for _ in shown) + f" | (tests: {where})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
