"""Brokers under benchmark: pymq and two peers (RabbitMQ + STOMP plugin, ActiveMQ Classic 5), each started
by the bench as a child process, on 127.0.0.1 only, with its own data/log directories under a temp directory
and free ports, and stopped again at the end.

Invariants:
- A broker is only ever contacted on the loopback address; nothing here listens on another interface.
- Every process started here is stopped here, by its own pid (and the pids of its own process tree); a peer
  that cannot be installed or started is reported as unavailable with the reason and never raises.
- Each broker also states its STOMP dialect (prefetch header, persistence header, destination names), so the
  load client sends every broker the same workload, spelled the way that broker understands it.
"""
from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field

LOOPBACK = "127.0.0.1"
CLK_TCK = os.sysconf("SC_CLK_TCK")


class PeerUnavailable(Exception):
    """A broker could not be installed or started; the message says why."""


def free_port() -> int:
    # Bind to port 0 and release it: the kernel picks a port nobody is using now. A race with another
    # process is possible but harmless: the broker then fails to start and says so.
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((LOOPBACK, 0))
        return s.getsockname()[1]


def wait_for_port(port: int, timeout: float, proc: subprocess.Popen | None = None) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise PeerUnavailable(f"process exited with code {proc.returncode} before port {port} opened")
        try:
            with socket.create_connection((LOOPBACK, port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.2)
    raise PeerUnavailable(f"port {port} did not accept connections within {timeout:.0f} s")


def process_tree(root: int) -> list[int]:
    """The pid `root` and all its descendants (from /proc/<pid>/stat ppid fields)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        # The command name sits in parentheses and may contain spaces: split after the last ')'.
        rest = stat[stat.rfind(b")") + 2 :].split()
        children.setdefault(int(rest[1]), []).append(int(entry))
    tree, todo = [], [root]
    while todo:
        pid = todo.pop()
        tree.append(pid)
        todo.extend(children.get(pid, ()))
    return tree


def cpu_seconds(root: int) -> float:
    """utime + stime (seconds) of a process and its live descendants."""
    total = 0
    for pid in process_tree(root):
        try:
            with open(f"/proc/{pid}/stat", "rb") as f:
                rest = f.read().rsplit(b")", 1)[1].split()
        except OSError:
            continue
        # Fields 14 and 15 of stat (utime, stime) are 11 and 12 after the ')' split (state is field 3).
        total += int(rest[11]) + int(rest[12])
    return total / CLK_TCK


def own_cpu_seconds(pid: int) -> float:
    """utime + stime (seconds) of one process (its threads included, its children not); 0 once it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            rest = f.read().rsplit(b")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(rest[11]) + int(rest[12])) / CLK_TCK


def machine_busy_seconds() -> float:
    """CPU seconds spent busy by all cores so far (/proc/stat: everything but idle and iowait)."""
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    # user nice system idle iowait irq softirq steal [guest guest_nice: already inside user/nice]
    return (sum(fields[:8]) - fields[3] - fields[4]) / CLK_TCK


def apt_install(packages: list[str], log) -> None:
    log(f"installing {' '.join(packages)} with apt-get (not found on this machine)")
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    for cmd in (["apt-get", "update", "-q"], ["apt-get", "install", "-y", "-q", *packages]):
        try:
            r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
        except (OSError, subprocess.TimeoutExpired) as e:
            raise PeerUnavailable(f"{' '.join(cmd)} failed: {e}") from e
        if r.returncode != 0:
            tail = (r.stderr or r.stdout).strip().splitlines()[-3:]
            raise PeerUnavailable(f"{' '.join(cmd)} exited {r.returncode}: {' | '.join(tail)}")


@dataclass
class Dialect:
    """How one broker spells the workload in STOMP headers."""

    queue_prefix: str = "/queue/"
    topic_prefix: str = "/topic/"
    prefetch_header: str | None = "prefetch-count"
    connect_host: str = "/"

    # RabbitMQ reads `persistent` on a SEND to /queue/x also as the durability of the queue it declares:
    # `persistent:false` then clashes with the durable queue the subscriber declared (RESOURCE_LOCKED). Its
    # messages are transient unless `persistent:true`, so there the non-persistent case omits the header.
    explicit_non_persistent: bool = True

    def persistence_headers(self, persistent: bool) -> dict[str, str]:
        if persistent:
            return {"persistent": "true"}
        return {"persistent": "false"} if self.explicit_non_persistent else {}


@dataclass
class Broker:
    name: str = "broker"
    workdir: str = ""
    stomp_port: int = 0
    proc: subprocess.Popen | None = None
    dialect: Dialect = field(default_factory=Dialect)
    log: object = print
    start_timeout: float = 90.0
    extra_pids: list[int] = field(default_factory=list)
    version: str = "?"

    # -- overridden by each broker
    def ensure_installed(self) -> None:
        raise NotImplementedError

    def _launch(self) -> subprocess.Popen:
        raise NotImplementedError

    # -- common machinery
    def start(self, workdir: str) -> None:
        self.workdir = os.path.join(workdir, self.name)
        os.makedirs(self.workdir, exist_ok=True)
        self.ensure_installed()
        self.stomp_port = free_port()
        t0 = time.monotonic()
        self.proc = self._launch()
        try:
            wait_for_port(self.stomp_port, self.start_timeout, self.proc)
        except PeerUnavailable as e:
            self.stop()
            raise PeerUnavailable(f"{e}; see {self.logfile()}: {self.log_tail()}") from None
        self.log(f"{self.name} {self.version} up on {LOOPBACK}:{self.stomp_port} "
                 f"(pid {self.proc.pid}, {time.monotonic() - t0:.1f} s)")

    def logfile(self) -> str:
        return os.path.join(self.workdir, "console.log")

    def log_tail(self, n: int = 4) -> str:
        try:
            with open(self.logfile(), errors="replace") as f:
                lines = [ln.strip() for ln in f.read().splitlines() if ln.strip()]
            return " | ".join(lines[-n:])
        except OSError:
            return "(no log)"

    def popen(self, argv: list[str], env: dict | None = None, cwd: str | None = None) -> subprocess.Popen:
        out = open(self.logfile(), "ab")
        try:
            # A new session: the broker does not get the terminal's ^C, and its group is ours to signal.
            return subprocess.Popen(argv, env=env, cwd=cwd or self.workdir, stdout=out, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, start_new_session=True)
        finally:
            out.close()

    def cpu_seconds(self) -> float:
        if self.proc is None:
            return 0.0
        return cpu_seconds(self.proc.pid) + sum(cpu_seconds(p) for p in self.extra_pids)

    def stop(self) -> None:
        if self.proc is None:
            return
        pids = process_tree(self.proc.pid)
        for pid in pids:
            _signal(pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            for pid in process_tree(self.proc.pid):
                _signal(pid, signal.SIGKILL)
            self.proc.wait(timeout=10)
        # Children that outlived their parent (re-parented to init) are still ours: end them by pid.
        for pid in pids + self.extra_pids:
            _signal(pid, signal.SIGKILL)
        self.proc = None


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


# --------------------------------------------------------------------------------------------------- pymq
@dataclass
class PymqBroker(Broker):
    name: str = "pymq"
    start_timeout: float = 30.0
    # Another build of pymq (e.g. pymq-base: the main branch in a scratch worktree with its own venv) is
    # the same broker started from its own `pymq-server`, so old and new are measured in one run.
    exe: str = ""
    # more than 1: `pymq-server --workers N` (spec/cores.md), run as broker pymq-wN beside pymq
    workers: int = 1

    def ensure_installed(self) -> None:
        exe = self.exe or shutil.which("pymq-server")
        if exe is None or not os.path.exists(exe):
            raise PeerUnavailable(f"{exe or 'pymq-server'} not found (pip install -e . in the repo)")
        self.exe = exe
        r = subprocess.run([exe, "--help"], capture_output=True, text=True, timeout=60)
        if r.returncode != 0:
            tail = (r.stderr or r.stdout).strip().splitlines()[-1:]
            raise PeerUnavailable(f"pymq-server --help exited {r.returncode}: {' '.join(tail)}")
        r = subprocess.run([os.path.join(os.path.dirname(exe), "python"), "-c",
                            "import pymq, os; "
                            "print(getattr(pymq, '__version__', '?'), os.path.dirname(pymq.__file__))"],
                           capture_output=True, text=True, timeout=60, cwd="/")  # not this checkout's pymq
        self.version = r.stdout.strip() or "?"

    def _launch(self) -> subprocess.Popen:
        data = os.path.join(self.workdir, "data")
        os.makedirs(data, exist_ok=True)
        argv = [self.exe, "--host", LOOPBACK, "--port", str(self.stomp_port), "--data-dir", data]
        if self.workers > 1:
            argv += ["--workers", str(self.workers)]
        return self.popen(argv)


# ----------------------------------------------------------------------------------------------- RabbitMQ
RABBIT_BIN = "/usr/lib/rabbitmq/bin/rabbitmq-server"


@dataclass
class RabbitBroker(Broker):
    name: str = "rabbitmq"
    dialect: Dialect = field(default_factory=lambda: Dialect(prefetch_header="prefetch-count", connect_host="/",
                                                             explicit_non_persistent=False))

    def ensure_installed(self) -> None:
        if not os.path.exists(RABBIT_BIN):
            apt_install(["rabbitmq-server"], self.log)
        plugins = [d for d in os.listdir(self._plugins_dir()) if d.startswith("rabbitmq_stomp-")]
        if not plugins:
            raise PeerUnavailable("rabbitmq_stomp plugin not found under " + self._plugins_dir())
        self.version = plugins[0].split("-", 1)[1]

    @staticmethod
    def _plugins_dir() -> str:
        base = "/usr/lib/rabbitmq/lib"
        servers = sorted(d for d in os.listdir(base) if d.startswith("rabbitmq_server-"))
        return os.path.join(base, servers[-1], "plugins")

    def _launch(self) -> subprocess.Popen:
        w = self.workdir
        amqp_port, dist_port, epmd_port = free_port(), free_port(), free_port()
        with open(os.path.join(w, "rabbitmq.conf"), "w") as f:
            f.write(
                f"listeners.tcp.default = {LOOPBACK}:{amqp_port}\n"
                f"stomp.listeners.tcp.1 = {LOOPBACK}:{self.stomp_port}\n"
                "loopback_users.guest = true\n"
                # The bench's data lives in a temp dir that may be small: do not block publishers at 50 MB.
                "disk_free_limit.absolute = 10MB\n"
            )
        # The plugins file is read at boot ("offline" enabling): no rabbitmq-plugins call against a live node.
        with open(os.path.join(w, "enabled_plugins"), "w") as f:
            f.write("[rabbitmq_stomp].\n")
        env = dict(os.environ)
        env.update(
            HOME=w,  # the Erlang cookie is written here, not in root's home
            RABBITMQ_NODENAME=f"pymqbench{os.getpid()}@localhost",
            RABBITMQ_NODE_IP_ADDRESS=LOOPBACK,
            RABBITMQ_NODE_PORT=str(amqp_port),
            RABBITMQ_DIST_PORT=str(dist_port),
            ERL_EPMD_PORT=str(epmd_port),  # a private epmd, so other Erlang nodes on the machine are untouched
            ERL_EPMD_ADDRESS=LOOPBACK,
            RABBITMQ_CONFIG_FILE=os.path.join(w, "rabbitmq.conf"),
            RABBITMQ_ADVANCED_CONFIG_FILE=os.path.join(w, "advanced.config"),
            RABBITMQ_CONF_ENV_FILE=os.path.join(w, "rabbitmq-env.conf"),
            RABBITMQ_ENABLED_PLUGINS_FILE=os.path.join(w, "enabled_plugins"),
            RABBITMQ_MNESIA_BASE=os.path.join(w, "mnesia"),
            RABBITMQ_LOG_BASE=os.path.join(w, "log"),
            RABBITMQ_PID_FILE=os.path.join(w, "rabbitmq.pid"),
            RABBITMQ_LOGS="-",
        )
        # epmd is started by us, in the foreground, so its pid is ours to stop (an Erlang node would
        # otherwise start it as a daemon that outlives the bench).
        epmd = subprocess.Popen(["epmd", "-port", str(epmd_port), "-address", LOOPBACK],
                                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                start_new_session=True, env=env)
        self.extra_pids = [epmd.pid]
        self._epmd = epmd
        wait_for_port(epmd_port, 10, epmd)
        return self.popen([RABBIT_BIN], env=env)

    def stop(self) -> None:
        super().stop()
        epmd = getattr(self, "_epmd", None)
        if epmd is not None:
            epmd.terminate()
            try:
                epmd.wait(timeout=5)
            except subprocess.TimeoutExpired:
                epmd.kill()
            self._epmd = None
        self.extra_pids = []


# ----------------------------------------------------------------------------------------------- ActiveMQ
AMQ_HOME = "/usr/share/activemq"

ACTIVEMQ_XML = """<beans xmlns="http://www.springframework.org/schema/beans"
  xmlns:xsi="http://www.w3.org/2001/XMLSchema-instance"
  xsi:schemaLocation="http://www.springframework.org/schema/beans http://www.springframework.org/schema/beans/spring-beans-2.0.xsd
  http://activemq.apache.org/schema/core http://activemq.apache.org/schema/core/activemq-core.xsd">
  <broker xmlns="http://activemq.apache.org/schema/core" brokerName="pymqbench" useJmx="false"
          dataDirectory="{data}" schedulerSupport="false" advisorySupport="false">
    <persistenceAdapter>
      <kahaDB directory="{data}/kahadb"/>
    </persistenceAdapter>
    <systemUsage>
      <systemUsage>
        <memoryUsage><memoryUsage limit="{mem_mb} mb"/></memoryUsage>
        <storeUsage><storeUsage limit="2 gb"/></storeUsage>
        <tempUsage><tempUsage limit="1 gb"/></tempUsage>
      </systemUsage>
    </systemUsage>
    <transportConnectors>
      <transportConnector name="stomp" uri="stomp://{host}:{port}?transport.tcpNoDelay=true"/>
    </transportConnectors>
  </broker>
</beans>
"""


@dataclass
class ActiveMQBroker(Broker):
    name: str = "activemq"
    dialect: Dialect = field(default_factory=lambda: Dialect(prefetch_header="activemq.prefetchSize",
                                                             connect_host="localhost"))
    heap_mb: int = 512

    def ensure_installed(self) -> None:
        jar = os.path.join(AMQ_HOME, "bin", "activemq.jar")
        if not os.path.exists(jar) or shutil.which("java") is None:
            apt_install(["activemq"], self.log)
        # Debian keeps the versioned jar beside the unversioned link in /usr/share/java.
        versioned = [j for j in os.listdir("/usr/share/java")
                     if j.startswith("activemq-broker-") and j.endswith(".jar")]
        self.version = versioned[0][len("activemq-broker-") : -len(".jar")] if versioned else "5.x"

    def _launch(self) -> subprocess.Popen:
        w = self.workdir
        conf, data, tmp = (os.path.join(w, d) for d in ("conf", "data", "tmp"))
        for d in (conf, data, tmp):
            os.makedirs(d, exist_ok=True)
        with open(os.path.join(conf, "activemq.xml"), "w") as f:
            f.write(ACTIVEMQ_XML.format(data=data, host=LOOPBACK, port=self.stomp_port, mem_mb=self.heap_mb // 2))
        src_log = "/etc/activemq/instances-available/main/log4j2.properties"
        if os.path.exists(src_log):
            # Console logging only: the file appender of Debian's config writes under activemq.data.
            shutil.copy(src_log, os.path.join(conf, "log4j2.properties"))
        # What /usr/bin/activemq would pass, with every directory pointing into our temp dir.
        argv = [
            shutil.which("java"), f"-Xms{self.heap_mb}M", f"-Xmx{self.heap_mb}M",
            "-Djava.awt.headless=true",
            f"-Djava.io.tmpdir={tmp}",
            f"-Dactivemq.classpath={conf}:{AMQ_HOME}/lib/",
            f"-Dactivemq.home={AMQ_HOME}",
            f"-Dactivemq.base={w}",
            f"-Dactivemq.conf={conf}",
            f"-Dactivemq.data={data}",
            f"-Dlog4j2.configurationFile=file:{conf}/log4j2.properties",
            "-jar", os.path.join(AMQ_HOME, "bin", "activemq.jar"),
            "start", f"xbean:file:{conf}/activemq.xml",
        ]
        return self.popen(argv)


# --------------------------------------------------------------------------------------------------- echo
@dataclass
class EchoBroker(Broker):
    """bench/toybroker.py as a broker: a relay that only re-frames each SEND as a MESSAGE (no storage, no
    queue, no acknowledgement), on the same loop (uvloop) as the load client. Not a peer: the floor under
    the latency rows, what the load client, the loop and loopback TCP cost with no broker work at all."""

    name: str = "echo"

    def ensure_installed(self) -> None:
        self.version = "toybroker"

    def _launch(self) -> subprocess.Popen:
        here = os.path.dirname(os.path.abspath(__file__))
        return self.popen([sys.executable, os.path.join(here, "toybroker.py"), str(self.stomp_port)])


BROKERS = {"pymq": PymqBroker, "rabbitmq": RabbitBroker, "activemq": ActiveMQBroker, "echo": EchoBroker}


def main(argv: list[str]) -> int:
    """`python bench/peers.py rabbitmq` starts a broker, prints its port and CPU, and stops it."""
    import tempfile

    names = argv or list(BROKERS)
    with tempfile.TemporaryDirectory(prefix="pymq-bench-") as tmp:
        for name in names:
            b = BROKERS[name]()
            try:
                b.start(tmp)
                print(f"{name}: port {b.stomp_port}, cpu {b.cpu_seconds():.2f} s, tree {process_tree(b.proc.pid)}")
            except PeerUnavailable as e:
                print(f"{name}: unavailable: {e}")
            finally:
                b.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
