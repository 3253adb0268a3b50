"""docs/getting-started.md run as a new operator runs it: every shell command of sections 2 to 6 in the order
written, each Python block against the broker the page has started by then, each configuration block
written to the file the commands name.  Only the paths and ports change (a temporary directory for
/etc/pymq and /var/lib/pymq, free ports for 61613/61614/8161/15674, given as --port to a bare
``pymq-server``, 127.0.0.1 for 0.0.0.0); section 1's
install is what tests/packaging does in clean environments.

On the page as it was, section 4's ``--check-config`` failed: the configuration names a users file that only
section 5 created.
"""
from __future__ import annotations

import re
import shlex
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

import pymq
from tests.client.tls import Authority
from tests.docs._blocks import DOCS

BIN = Path(sys.executable).parent
PASSWORD = "a-long-enough-secret"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def sections() -> list[tuple[str, list[tuple[str, str]]]]:
    """(heading, [(language, text)]) for each numbered section, blocks in page order."""
    text = (DOCS / "getting-started.md").read_text(encoding="utf-8")
    found = []
    for part in re.split(r"^## ", text, flags=re.M)[1:]:
        heading = part.splitlines()[0]
        found.append((heading, re.findall(r"```(\w*)\n(.*?)```", part, re.S)))
    return found


class Page:
    """What the page's commands act on: the files, and the broker started last."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.subst = {"/etc/pymq": str(root / "etc"), "/var/lib/pymq": str(root / "var-lib"),
                      "0.0.0.0": "127.0.0.1"}
        for port in ("61613", "61614", "8161", "15674"):
            self.subst[port] = str(free_port())
        self.broker: subprocess.Popen | None = None
        self.log: list[str] = []

    def sub(self, text: str) -> str:
        for old, new in self.subst.items():
            text = text.replace(old, new)
        return text

    def shell(self, line: str) -> None:
        argv = shlex.split(self.sub(line), comments=True)
        if not argv:
            return
        if argv[0] == "mkdir":
            subprocess.run(argv, check=True, cwd=self.root, timeout=30)
            return
        assert argv[0] == "pymq-server", f"a command the test does not know how to run: {line}"
        argv[0] = str(BIN / "pymq-server")
        if "passwd" in argv or "--check-config" in argv:
            # passwd asks for the password (no terminal here: getpass reads standard input)
            done = subprocess.run(argv, cwd=self.root, capture_output=True, text=True, timeout=120,
                                  input=PASSWORD + "\n", start_new_session=True)
            assert done.returncode == 0, f"{line!r} failed in the order written:\n{done.stdout}{done.stderr}"
            return
        if "--config" not in argv:
            argv += ["--port", self.subst["61613"]]     # the default port, moved like the others
        self.start(argv)

    def start(self, argv: list[str]) -> None:
        self.stop()
        self.log = []
        self.broker = subprocess.Popen(argv, cwd=self.root, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                       text=True)
        deadline = time.monotonic() + 60
        assert self.broker.stderr is not None
        while time.monotonic() < deadline:
            line = self.broker.stderr.readline()
            if not line:
                break
            self.log.append(line)
            if line.startswith("pymq-server listening on"):
                return
        self.stop()
        raise AssertionError("the broker of the page did not start:\n" + "".join(self.log))

    def stop(self) -> None:
        if self.broker is not None:
            self.broker.terminate()
            try:
                assert self.broker.wait(30) == 0
            finally:
                if self.broker.poll() is None:
                    self.broker.kill()
                    self.broker.wait(10)
            self.broker = None


@pytest.fixture
def page(tmp_path):
    p = Page(tmp_path)
    yield p
    p.stop()


def test_the_page_in_the_order_written(page):
    parts = sections()
    headings = [h for h, _ in parts]
    assert headings[:6] == ["1. Install", "2. Start a broker", "3. Send and receive", "4. Users",
                            "5. A configuration file", "6. TLS and browsers"], headings
    install = "".join(text for _, text in parts[0][1])
    assert 'pip install "pymq-broker[server]"' in install      # run by tests/packaging in a clean venv

    ran = {"sh": 0, "python": 0, "yaml": 0}
    for heading, blocks in parts[1:6]:
        for language, text in blocks:
            if language == "sh":
                for line in text.splitlines():
                    page.shell(line)
            elif language == "python" and heading.startswith("3."):
                done = subprocess.run([sys.executable, "-c", page.sub(text)], capture_output=True, text=True,
                                      timeout=60, cwd=page.root)
                assert done.returncode == 0 and done.stdout == "hello\n", done.stdout + done.stderr
            elif language == "yaml" and heading.startswith("5."):
                (page.root / "broker.yaml").write_text(page.sub(text))
            elif language == "yaml" and heading.startswith("6."):
                # "Add to broker.yaml", with a certificate where the page says it lives
                ca = Authority(page.root)
                issued = ca.issue("broker", dns=("localhost",), ips=("127.0.0.1",))
                tls = yaml.safe_load(page.sub(text))
                Path(tls["tls"]["cert_file"]).write_bytes(issued.cert.read_bytes())
                Path(tls["tls"]["key_file"]).write_bytes(issued.key.read_bytes())
                config = yaml.safe_load((page.root / "broker.yaml").read_text())
                (page.root / "broker.yaml").write_text(yaml.safe_dump({**config, **tls}))
                page.shell("pymq-server --config broker.yaml --check-config")
            else:
                continue
            ran[language] += 1
        if heading.startswith("5."):
            # the broker of section 5 runs with the users of section 4: alice logs in, guest is gone
            url = f"stomp://127.0.0.1:{page.subst['61613']}"
            with pymq.connect(url, username="alice", password=PASSWORD) as conn:
                session = conn.create_session()
                session.create_producer(pymq.Queue("orders")).send("from alice")
                assert session.create_consumer(pymq.Queue("orders")).receive(5).text == "from alice"
            with pytest.raises(pymq.errors.AuthenticationFailed):
                pymq.connect(url, username="guest", password="guest").close()
    assert ran == {"sh": 3, "python": 1, "yaml": 2}, ran
    assert (page.root / "etc" / "users.yaml").exists()
    assert (page.root / "var-lib").is_dir()      # section 5's broker kept its data where the file said
