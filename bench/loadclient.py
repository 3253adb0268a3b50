"""The bench's own STOMP load client: not the SDK under test, just enough STOMP 1.2 to drive a broker hard.

Producers pipeline SEND frames (no receipts unless a workload asks for them every N messages); consumers
count every MESSAGE. Producers and consumers run in separate OS processes (multiprocessing, fork), each an
asyncio loop (uvloop when installed) holding one or more connections, so one Python interpreter is not the
bottleneck of both sides.

Application headers (`LoadSpec.app_headers`, N of them; bench_brokers.py sends 4 by default): what real
producers put on a message, with values of realistic size that change with every message:
    app-id:<36-char UUID-shaped id>  app-producer:<index>  app-seq:<sequence>  app-ts:<epoch ms>
and from the fifth on `app-attr-<k>:<16 chars>`. Consumers check that `app-seq` came back equal to the
sequence in the body (a mismatch counts as malformed), so a broker that loses or mangles them is caught.

Message body (ASCII, fixed layout, padded with 'x' to the workload's size):
    bytes 0..3    producer id, decimal, zero-padded
    bytes 4..15   sequence number within that producer, from 0
    bytes 16..35  CLOCK_MONOTONIC nanoseconds when the frame was handed to the socket
CLOCK_MONOTONIC is one clock for every process on the machine, so receive time minus that stamp is the
end-to-end latency, whichever process sent it.

Invariants:
- Every message a consumer gets is checked: a (producer, sequence) seen twice by one consumer is counted as a
  duplicate there; the parent merges the consumers' seen-maps and reports any sequence no consumer saw (loss)
  or that two consumers both saw (duplicate across consumers on a queue).
- Every run is bounded: producers stop at their message count or at the deadline, whichever comes first;
  consumers stop when they have everything that was sent, or after an idle timeout once the producers are
  done, or at a hard deadline; the parent kills its own child processes (by pid) if they overstay.
"""
from __future__ import annotations

import array
import asyncio
import multiprocessing as mp
import queue
import resource
import signal
import time
from dataclasses import asdict, dataclass, field

try:
    import uvloop
except ImportError:  # plain asyncio still works, a little slower
    uvloop = None

HEADER_LEN = 36  # producer id (4) + sequence (12) + timestamp (20)
NS = 1_000_000_000
MAX_LATENCY_SAMPLES = 2_000_000
# a paced producer alone in its process sleeps waits shorter than this to the due time (time.sleep)
PRECISE_WAIT = 0.002


# ------------------------------------------------------------------------------------------ STOMP codec
def _escape(value: str) -> bytes:
    # STOMP 1.2 header escaping; the bench's own values rarely need it, but ids echoed back stay escaped.
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace(":", "\\c").encode()


def encode_frame(command: str, headers: dict[str, str] | None = None, body: bytes = b"") -> bytes:
    out = [command.encode(), b"\n"]
    for k, v in (headers or {}).items():
        out += [_escape(k), b":", _escape(str(v)), b"\n"]
    if body:
        out += [b"content-length:", str(len(body)).encode(), b"\n"]
    out += [b"\n", body, b"\0"]
    return b"".join(out)


class FrameReader:
    """Incremental STOMP frame splitter. feed() bytes, then frames() yields (command, headers, body).

    Headers are returned raw (bytes, still escaped): the bench only compares them or echoes them back.
    """

    __slots__ = ("buf", "last_size")

    def __init__(self) -> None:
        self.buf = bytearray()
        self.last_size = 0  # bytes of the frame just yielded, NUL included (a proxy counts them)

    def feed(self, data: bytes) -> None:
        self.buf += data

    def frames(self):
        buf = self.buf
        pos = 0
        n = len(buf)
        while pos < n:
            # Heart-beats and the optional EOLs after a frame's NUL.
            c = buf[pos]
            if c == 10 or c == 13:
                pos += 1
                continue
            end = buf.find(b"\n\n", pos)
            # Bound the CRLF search by the LF one: an unbounded search would rescan the rest of the
            # buffer for every frame (quadratic in the read size).
            crlf = buf.find(b"\n\r\n", pos, end + 2 if end >= 0 else n)
            if crlf >= 0 and (end < 0 or crlf < end):
                end, body_start = crlf, crlf + 3
            elif end >= 0:
                body_start = end + 2
            else:
                break
            lines = bytes(buf[pos:end]).split(b"\n")
            command = lines[0].rstrip(b"\r")
            headers: dict[bytes, bytes] = {}
            for line in lines[1:]:
                k, _, v = line.rstrip(b"\r").partition(b":")
                if k not in headers:  # STOMP: the first occurrence of a repeated header wins
                    headers[k] = v
            cl = headers.get(b"content-length")
            if cl is not None:
                body_end = body_start + int(cl)
                if body_end >= n:
                    break
                if buf[body_end] != 0:
                    raise ValueError(f"frame body not NUL-terminated at {body_end}")
            else:
                body_end = buf.find(b"\0", body_start)
                if body_end < 0:
                    break
            self.last_size = body_end + 1 - pos
            yield command, headers, bytes(buf[body_start:body_end])
            pos = body_end + 1
        del buf[:pos]


# ----------------------------------------------------------------------------------------- workload spec
@dataclass
class Endpoint:
    host: str
    port: int
    connect_host: str = "/"
    login: str = "guest"
    passcode: str = "guest"
    prefetch_header: str | None = "prefetch-count"
    explicit_non_persistent: bool = True  # send `persistent:false` (see peers.Dialect)


@dataclass
class LoadSpec:
    """One run: who sends what where, and how the consumers take it."""

    destination: str                 # full STOMP destination, e.g. /queue/bench.a or /topic/bench.c
    topic: bool = False              # every consumer gets every message (else they share them)
    producers: int = 1
    consumers: int = 1
    size: int = 128
    # True: `persistent:true`; False: `persistent:false` (or no header, for a broker whose dialect says
    # so); None: no `persistent` header at all (each broker's own default: durable in pymq, not in peers).
    persistent: bool | None = False
    app_headers: int = 0             # application headers per SEND (see the module docstring)
    count: int = 100_000             # messages per producer (upper bound)
    duration: float = 10.0           # seconds per producer (upper bound)
    rate: float = 0.0                # messages/s per producer; 0 = as fast as the broker takes them
    receipt_every: int = 0           # ask for a RECEIPT every N messages (0: never)
    max_unconfirmed: int = 0         # with receipts: block when this many messages are unconfirmed
    ack: str = "auto"                # auto | client-individual
    prefetch: int = 1000
    batch: int = 64                  # SEND frames joined into one socket write
    max_in_flight: int = 1000        # per producer: sent but not yet delivered (0: unbounded pipelining)
    producer_procs: int = 1
    consumer_procs: int = 1
    # A consumer gives up this long after its last delivery, once the producers are done. Generous: with a
    # backlog on a loaded machine a broker can pause deliveries for seconds, and a pause must not be
    # reported as loss. It costs nothing when nothing is lost (consumers stop once they have everything).
    idle_timeout: float = 30.0
    extra_send_headers: dict = field(default_factory=dict)
    # Message `seq` of every producer carries rotate_send_headers[seq % len] (e.g. a property a selector
    # reads); consumer `cidx` subscribes with subscribe_headers[cidx % len] added (e.g. its selector).
    rotate_send_headers: list = field(default_factory=list)
    subscribe_headers: list = field(default_factory=list)
    # With rotation: consumer `cidx` must only get the messages of slot cidx % len(rotate_send_headers)
    # (selectors that partition the stream); any other message it gets is counted as misrouted.
    check_rotation: bool = False
    # Consumers subscribe only once every producer is done (needs max_in_flight=0): they drain a backlog of
    # everything sent; RunResult.drain_rate is then the figure (first to last delivery).
    backlog_first: bool = False
    # Destinations: 1 = `destination` itself; N > 1 = `destination.0` .. `destination.N-1`, producer and
    # consumer i on number i % N (several independent streams: what a multi-worker broker can spread).
    destinations: int = 1


def destination_of(spec: LoadSpec, index: int) -> str:
    return spec.destination if spec.destinations <= 1 else f"{spec.destination}.{index % spec.destinations}"


def endpoint_for(ep: Endpoint | list[Endpoint], index: int) -> Endpoint:
    """Producer `index` (or consumer `index`) of a run spread over several brokers (cluster nodes) uses
    endpoint index % len; a single endpoint serves everyone."""
    return ep[index % len(ep)] if isinstance(ep, (list, tuple)) else ep


def _new_loop():
    if uvloop is not None:
        return uvloop.new_event_loop()
    return asyncio.new_event_loop()


def _cpu_self() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


class StompError(Exception):
    pass


class _Conn(asyncio.Protocol):
    """One STOMP connection. Frames other than MESSAGE go to `control`; MESSAGE frames to `on_message`."""

    def __init__(self, loop, on_message=None) -> None:
        self.loop = loop
        self.reader = FrameReader()
        self.control: asyncio.Queue = asyncio.Queue()
        self.on_message = on_message
        self.transport = None
        self.can_write = asyncio.Event()
        self.can_write.set()
        self.closed = loop.create_future()
        self.receipts: dict[bytes, asyncio.Future] = {}
        self.error: str | None = None

    def connection_made(self, transport):
        self.transport = transport
        # Producers pipeline: let the socket buffer fill before pausing, but not without bound.
        transport.set_write_buffer_limits(high=1 << 20, low=1 << 18)

    def pause_writing(self):
        self.can_write.clear()

    def resume_writing(self):
        self.can_write.set()

    def connection_lost(self, exc):
        self.can_write.set()
        if not self.closed.done():
            self.closed.set_result(exc)
        for fut in self.receipts.values():
            if not fut.done():
                fut.set_exception(StompError(self.error or f"connection lost: {exc}"))

    def data_received(self, data):
        self.reader.feed(data)
        now = time.monotonic_ns()
        on_message = self.on_message
        for command, headers, body in self.reader.frames():
            if command == b"MESSAGE" and on_message is not None:
                on_message(headers, body, now)
            elif command == b"RECEIPT":
                fut = self.receipts.pop(headers.get(b"receipt-id", b""), None)
                if fut is not None and not fut.done():
                    fut.set_result(now)
            else:
                if command == b"ERROR":
                    self.error = (headers.get(b"message", b"").decode(errors="replace") + " "
                                  + body[:200].decode(errors="replace")).strip()
                    for fut in self.receipts.values():
                        if not fut.done():
                            fut.set_exception(StompError(self.error))
                self.control.put_nowait((command, headers, body))
        if on_message is not None and hasattr(on_message, "flush"):
            on_message.flush(self)

    def write(self, data: bytes) -> None:
        self.transport.write(data)

    def expect_receipt(self, rid: str) -> asyncio.Future:
        fut = self.loop.create_future()
        self.receipts[rid.encode()] = fut
        return fut


async def open_connection(ep: Endpoint, on_message=None, timeout: float = 15.0) -> _Conn:
    loop = asyncio.get_running_loop()
    _, conn = await asyncio.wait_for(
        loop.create_connection(lambda: _Conn(loop, on_message), ep.host, ep.port), timeout)
    conn.write(encode_frame("CONNECT", {
        "accept-version": "1.2", "host": ep.connect_host, "login": ep.login, "passcode": ep.passcode,
        "heart-beat": "0,0"}))
    command, headers, body = await asyncio.wait_for(conn.control.get(), timeout)
    if command != b"CONNECTED":
        raise StompError(f"CONNECT refused: {command!r} {headers.get(b'message', b'')!r} {body[:200]!r}")
    return conn


async def close_connection(conn: _Conn, timeout: float = 5.0) -> bool:
    """DISCONNECT with a receipt, then close once our buffers are flushed. True if the broker confirmed.

    The receipt is what proves the broker has taken every earlier frame: a producer's SENDs can still sit
    in our write buffer or the socket while the broker applies back-pressure, and leaving before the
    receipt (or before the flush) would drop them unseen and count them as sent, hence as lost.
    """
    if conn.transport is None or conn.transport.is_closing():
        return False
    fut = conn.expect_receipt("bye")
    conn.write(encode_frame("DISCONNECT", {"receipt": "bye"}))
    confirmed = True
    try:
        await asyncio.wait_for(fut, timeout)
    except (asyncio.TimeoutError, StompError):
        confirmed = False
    conn.transport.close()
    try:
        await asyncio.wait_for(asyncio.shield(conn.closed), 5)
    except asyncio.TimeoutError:
        conn.transport.abort()
    return confirmed


# ------------------------------------------------------------------------------------------- producers
def _body_maker(size: int):
    pad = b"x" * max(0, size - HEADER_LEN)
    if size < HEADER_LEN:
        raise ValueError(f"message size {size} < {HEADER_LEN} bytes of bench header")

    def make(pid: int, seq: int, ts: int) -> bytes:
        return b"%04d%012d%020d" % (pid, seq, ts) + pad

    return make


def _app_header_maker(n: int):
    """The `n` application headers of message (pid, seq), as header lines: what a real producer adds
    (an id, its own index, a sequence number, a wall-clock timestamp), then filler attributes."""
    if n <= 0:
        return None
    fmt = b"app-id:%08x-4b1d-4c3e-8f00-%012x\napp-producer:%d\napp-seq:%d\napp-ts:%d\n"
    lines = fmt.split(b"\n")[:min(n, 4)]
    fmt = b"".join(line + b"\n" for line in lines)
    extra = b"".join(b"app-attr-%d:%s\n" % (k, (b"v%d" % k).ljust(16, b"a")) for k in range(4, n))
    nargs = {1: 2, 2: 3, 3: 4}.get(len(lines), 5)
    time_ns = time.time_ns

    def make(pid: int, seq: int) -> bytes:
        args = (pid, seq, pid, seq, time_ns() // 1_000_000)[:nargs]
        return fmt % args + extra

    return make


async def _produce(ep: Endpoint, spec: LoadSpec, pid: int, start_ns: int, result: dict, shared,
                   alone: bool = False) -> None:
    """One producer connection; ``alone``: the only producer of its process (a paced producer may then
    block the process's loop for less than a millisecond to send each message at its due time)."""
    conn = await open_connection(ep)
    make = _body_maker(spec.size)
    headers = {"destination": destination_of(spec, pid)}
    if spec.persistent or (spec.persistent is not None and ep.explicit_non_persistent):
        headers["persistent"] = "true" if spec.persistent else "false"
    headers.update(spec.extra_send_headers)
    app = _app_header_maker(spec.app_headers)
    tail = b"content-length:%d\n\n" % spec.size

    def frame_head(extra: dict) -> bytes:
        return encode_frame("SEND", {**headers, **extra})[:-2]  # without the blank line and NUL

    head = frame_head({})
    rotation = [frame_head(extra) for extra in spec.rotate_send_headers]
    n_rot = len(rotation)
    head_tail = head + tail
    deadline = start_ns + int(spec.duration * NS)
    interval = NS / spec.rate if spec.rate else 0.0
    # Pace from when this connection is ready, not from the common start: the CONNECT round trip would
    # otherwise be made up by a burst, which shows up as latency the broker did not cause.
    pace_start = time.monotonic_ns()
    monotonic_ns = time.monotonic_ns
    write = conn.write
    can_write = conn.can_write
    pending: list[asyncio.Future] = []  # outstanding receipts, oldest first

    def receipt_frame(seq: int, ts: int) -> bytes:
        rid = b"r%d" % seq
        pending.append(conn.expect_receipt(rid.decode()))
        base = rotation[seq % n_rot] if n_rot else head
        return (base + (app(pid, seq) if app else b"") + b"receipt:" + rid + b"\n" + tail
                + make(pid, seq, ts) + b"\0")

    confirm_wait = 0.0
    seq = 0
    first = last = 0
    count = spec.count
    batch = 1 if spec.rate else spec.batch
    every = spec.receipt_every
    sent_counter, received = shared.sent, shared.received
    # The window over all producers: total sent minus delivered (for a topic, delivered to the slowest
    # subscriber). It keeps the broker's backlog bounded so the latency of a throughput run is the broker's
    # latency under full load, not the age of a backlog that only depends on the message count.
    window = spec.max_in_flight * spec.producers
    while seq < count:
        now = monotonic_ns()
        if now >= deadline:
            break
        if interval:
            due = pace_start + int(seq * interval)
            if due > now:
                wait = (due - now) / NS
                if alone and wait < PRECISE_WAIT:
                    # Each message at its own due time: the loop's timers step in milliseconds, so at
                    # 2,000 msg/s `asyncio.sleep` woke every 1-1.5 ms and sent 2-4 messages back to back,
                    # and the first of each burst waited in the broker for the whole burst to be read and
                    # handled (bench/README.md, issue 30: latency). A thread sleep is exact to the
                    # kernel's timer slack (~50 µs) and, unlike a shorter asyncio sleep, not a busy loop;
                    # blocking this loop is harmless with this process's only producer.
                    time.sleep(wait)  # noqa: ASYNC251
                else:
                    # never below 1 ms: a shorter loop sleep rounds to zero (a busy loop that steals
                    # the broker's core); ahead of the due time by a step, the rest slept above
                    await asyncio.sleep(max(0.001, wait - (PRECISE_WAIT / 2 if alone else 0)))
                continue
        if window:
            sent_counter[pid] = seq
            delivered = min(received) if spec.topic else sum(received)
            if sum(sent_counter) - delivered > window:
                await asyncio.sleep(0.001)
                continue
        if not can_write.is_set():
            await can_write.wait()
        if conn.closed.done():
            raise StompError(conn.error or "connection closed by broker")
        frames = []
        n = min(batch, count - seq)
        if not first:
            first = monotonic_ns()
        for _ in range(n):
            ts = monotonic_ns()
            if every and ((seq + 1) % every == 0 or seq + 1 == count):
                frames.append(receipt_frame(seq, ts))
            elif app:
                frames.append((rotation[seq % n_rot] if n_rot else head) + app(pid, seq) + tail
                              + make(pid, seq, ts) + b"\0")
            elif n_rot:
                frames.append(rotation[seq % n_rot] + tail + make(pid, seq, ts) + b"\0")
            else:
                frames.append(head_tail + make(pid, seq, ts) + b"\0")
            seq += 1
        last = ts
        write(b"".join(frames))
        if interval and alone:
            await asyncio.sleep(0)  # the loop's turn (reads, write completions) between paced messages
        if every and spec.max_unconfirmed:
            # A careful producer: never more than max_unconfirmed messages without a broker confirmation.
            while len(pending) * every > spec.max_unconfirmed:
                t = monotonic_ns()
                await pending.pop(0)
                confirm_wait += (monotonic_ns() - t) / NS
        elif batch > 1:
            await asyncio.sleep(0)  # let the loop flush and read
    if every:
        # The last messages' durability is part of the measurement: the last one always carries a
        # receipt (stopped by the deadline mid-stride, one more message is sent to carry it).
        if seq and seq % every and seq != count:
            last = monotonic_ns()
            write(receipt_frame(seq, last))
            seq += 1
        t = monotonic_ns()
        for fut in pending:
            await asyncio.wait_for(fut, 60)
        confirm_wait += (monotonic_ns() - t) / NS
    confirmed = monotonic_ns()
    result[pid] = {"sent": seq, "first_ns": first, "last_ns": last, "confirmed_ns": confirmed,
                   "confirm_wait_s": confirm_wait}
    if not await close_connection(conn, timeout=spec.idle_timeout + 30):
        raise StompError(f"producer {pid}: the broker did not confirm DISCONNECT within "
                         f"{spec.idle_timeout + 30:.0f} s, so some of its {seq} SENDs may never have reached it")


def _producer_main(ep: Endpoint, spec: LoadSpec, pids: list[int], shared, out_q, ready) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # the parent's handler (stop the brokers) is not ours
    loop = _new_loop()
    asyncio.set_event_loop(loop)
    result: dict = {}
    error = None
    try:
        ready.set()
        shared.go.wait(120)
        cpu0 = _cpu_self()
        start_ns = shared.start_ns.value
        loop.run_until_complete(asyncio.gather(*(_produce(endpoint_for(ep, p), spec, p, start_ns, result, shared,
                                                          alone=len(pids) == 1) for p in pids)))
        cpu = _cpu_self() - cpu0
    except BaseException as e:  # noqa: BLE001 - to the parent, which turns it into a harness error
        error, cpu = f"{type(e).__name__}: {e}", 0.0
    out_q.put(("producer", {"pids": pids, "per_producer": result, "cpu_s": cpu, "error": error}))


# ------------------------------------------------------------------------------------------- consumers
class _Tally:
    """Counts, checks and times the MESSAGE frames of one consumer connection."""

    def __init__(self, n_producers: int, capacity: int, ack: str, cidx: int, shared_received,
                 check_app: bool = False) -> None:
        self.cidx, self.shared_received = cidx, shared_received
        self.check_app = check_app  # application headers were sent: app-seq must come back intact
        self.seen = [bytearray(capacity) for _ in range(n_producers)]
        self.received = 0
        self.dups = 0
        self.bad = 0
        self.first_ns = 0
        self.last_ns = 0
        self.lat = array.array("q")
        self.ack_individual = ack == "client-individual"
        self.acks: list[bytes] = []

    def __call__(self, headers, body, now):
        try:
            pid = int(body[0:4])
            seq = int(body[4:16])
            ts = int(body[16:36])
            mark = self.seen[pid]
            if self.check_app and headers.get(b"app-seq") != b"%d" % seq:
                raise ValueError("app-seq header lost or changed")
            if mark[seq]:
                self.dups += 1
            else:
                mark[seq] = 1
        except (ValueError, IndexError):
            self.bad += 1
            return
        self.received += 1
        if not self.first_ns:
            self.first_ns = now
        self.last_ns = now
        if len(self.lat) < MAX_LATENCY_SAMPLES:
            self.lat.append(now - ts)
        if self.ack_individual:
            self.acks.append(b"ACK\nid:" + headers[b"ack"] + b"\n\n\0")

    def flush(self, conn: _Conn) -> None:
        # Once per read: publish the count (the producers' window and the end-of-run check read it).
        self.shared_received[self.cidx] = self.received
        if self.acks:
            conn.write(b"".join(self.acks))
            self.acks.clear()


async def _consume(ep: Endpoint, spec: LoadSpec, cidx: int, tallies: list, subscribed: list, shared):
    tally = _Tally(spec.producers, spec.count + 1, spec.ack, cidx, shared.received, spec.app_headers >= 3)
    tallies.append(tally)
    conn = await open_connection(ep, on_message=tally)
    sub = {"id": str(cidx), "destination": destination_of(spec, cidx), "ack": spec.ack, "receipt": "sub"}
    if ep.prefetch_header:
        sub[ep.prefetch_header] = str(spec.prefetch)
    if spec.subscribe_headers:
        sub.update(spec.subscribe_headers[cidx % len(spec.subscribe_headers)])
    fut = conn.expect_receipt("sub")
    conn.write(encode_frame("SUBSCRIBE", sub))
    await asyncio.wait_for(fut, 30)
    subscribed.append(conn)
    return conn


async def _consumer_run(ep, spec, cidxs, ready, shared, hard_deadline_s, out):
    tallies: list[_Tally] = []
    conns: list[_Conn] = []
    loop = asyncio.get_running_loop()
    if spec.backlog_first:
        # Subscribe only once the producers are done: the consumers then drain a backlog of everything sent.
        ready.set()
        await loop.run_in_executor(None, shared.go.wait, 120)
        t_go = time.monotonic()
        # a poll: the parent process sets shared.expected, a multiprocessing Value (it cannot set an asyncio.Event)
        while shared.expected.value < 0 and time.monotonic() - t_go < hard_deadline_s:  # noqa: ASYNC110
            await asyncio.sleep(0.02)
        cpu0 = _cpu_self()
        subscribed_ns = time.monotonic_ns()
        await asyncio.gather(*(_consume(endpoint_for(ep, c), spec, c, tallies, conns, shared) for c in cidxs))
    else:
        subscribed_ns = 0
        await asyncio.gather(*(_consume(endpoint_for(ep, c), spec, c, tallies, conns, shared) for c in cidxs))
        ready.set()
        await loop.run_in_executor(None, shared.go.wait, 120)
        cpu0 = _cpu_self()
        t_go = time.monotonic()
    counters = shared.received
    last_progress, last_total = time.monotonic(), -1
    gave_up = None
    while True:
        await asyncio.sleep(0.02)
        mine = sum(t.received for t in tallies)
        now = time.monotonic()
        if mine != last_total:
            last_total, last_progress = mine, now
        for c in conns:
            if c.closed.done():
                raise StompError(c.error or "consumer connection closed by broker")
        expected = shared.expected.value
        if expected >= 0:
            got = sum(counters[:]) if not spec.topic else min(t.received for t in tallies)
            if got >= expected:
                break
            if now - last_progress > spec.idle_timeout:
                # Whatever is missing is reported as loss by the parent.
                gave_up = f"no delivery for {spec.idle_timeout:.0f} s after the producers finished"
                break
        if now - t_go > hard_deadline_s:
            gave_up = f"hard deadline of {hard_deadline_s:.0f} s"
            break
    # Anything still in flight for a topic subscriber or a late duplicate: a short grace read.
    await asyncio.sleep(0.05)
    cpu = _cpu_self() - cpu0
    for c in conns:
        await close_connection(c, timeout=2)
    # one tally per consumer, appended in cidxs order (each _consume appends before its first await)
    for cidx, t in zip(cidxs, tallies, strict=True):
        out.append({"cidx": cidx, "gave_up": gave_up, "received": t.received, "dups": t.dups, "bad": t.bad,
                    "first_ns": t.first_ns, "subscribed_ns": subscribed_ns,
                    "last_ns": t.last_ns, "lat": t.lat.tobytes(), "seen": [bytes(s) for s in t.seen]})
    return cpu


def _consumer_main(ep, spec, cidxs, ready, shared, hard_deadline_s, out_q) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    loop = _new_loop()
    asyncio.set_event_loop(loop)
    out: list = []
    error = None
    cpu = 0.0
    try:
        cpu = loop.run_until_complete(
            _consumer_run(ep, spec, cidxs, ready, shared, hard_deadline_s, out))
    except BaseException as e:  # noqa: BLE001 - to the parent, which turns it into a harness error
        error = f"{type(e).__name__}: {e}"
    out_q.put(("consumer", {"cidxs": cidxs, "per_consumer": out, "cpu_s": cpu, "error": error}))


# ---------------------------------------------------------------------------------------------- parent
@dataclass
class RunResult:
    sent: int = 0
    received: int = 0              # deliveries, over all consumers
    lost: int = 0
    duplicated: int = 0
    malformed: int = 0
    misrouted: int = 0             # with check_rotation: messages a consumer got outside its slot
    elapsed_s: float = 0.0         # first send to last receive
    rate: float = 0.0              # deliveries per second
    send_rate: float = 0.0         # messages per second accepted from the producers
    drain_rate: float = 0.0        # deliveries per second from the first delivery (backlog_first: from the
                                   # start of the subscriptions) to the last
    lat_p50_us: float = 0.0
    lat_p99_us: float = 0.0
    lat_p999_us: float = 0.0
    lat_max_us: float = 0.0
    producer_cpu_s: float = 0.0
    consumer_cpu_s: float = 0.0
    producer_cpu_pct: float = 0.0  # of one core, over the run
    consumer_cpu_pct: float = 0.0
    producer_us_per_msg: float = 0.0   # the load client's own cost, to show it is not the limit
    consumer_us_per_msg: float = 0.0
    confirm_wait_s: float = 0.0
    consumers_gave_up: str = ""    # why a consumer stopped before it had every message (then: lost > 0)
    errors: list = field(default_factory=list)
    # which load client measured it: "asyncio" (this module) or "go" (goload.py: go-stomp, one process,
    # whose CPU is all in the producer's fields)
    client: str = "asyncio"

    def as_dict(self) -> dict:
        return asdict(self)


class _Shared:
    """What the processes of one run share (fork-inherited): the start signal and time, the count the
    consumers must reach (-1 until the producers are done), and running sent/received counters."""

    def __init__(self, ctx, spec: LoadSpec) -> None:
        self.go = ctx.Event()
        self.expected = ctx.Value("q", -1, lock=False)
        self.start_ns = ctx.Value("q", 0, lock=False)
        # Single-writer slots (one per producer / consumer), read by everyone: no lock needed.
        self.sent = ctx.Array("q", spec.producers, lock=False)
        self.received = ctx.Array("q", spec.consumers, lock=False)


def _split(items: list[int], groups: int) -> list[list[int]]:
    groups = max(1, min(groups, len(items)))
    return [items[i::groups] for i in range(groups)]


def _percentile(sorted_vals, q: float) -> float:
    if not sorted_vals:
        return 0.0
    i = min(len(sorted_vals) - 1, max(0, int(round(q * (len(sorted_vals) - 1)))))
    return sorted_vals[i] / 1000.0


def run_load(ep: Endpoint | list[Endpoint], spec: LoadSpec, on_started=None) -> RunResult:
    """Run one workload to completion and check every message. `on_started()` is called at the moment the
    producers are released (the caller samples broker CPU there). With a list of endpoints (cluster
    nodes), producer p connects to ep[p % len] and consumer c to ep[c % len]."""
    ctx = mp.get_context("fork")
    out_q = ctx.Queue()
    shared = _Shared(ctx, spec)
    go, expected_v, start_ns_v = shared.go, shared.expected, shared.start_ns
    hard_deadline = spec.duration + 60 + spec.idle_timeout
    procs = []
    c_ready, p_ready = [], []
    for cidxs in _split(list(range(spec.consumers)), spec.consumer_procs):
        ev = ctx.Event()
        c_ready.append(ev)
        procs.append(ctx.Process(target=_consumer_main, daemon=True,
                                 args=(ep, spec, cidxs, ev, shared, hard_deadline, out_q)))
    for pids in _split(list(range(spec.producers)), spec.producer_procs):
        ev = ctx.Event()
        p_ready.append(ev)
        procs.append(ctx.Process(target=_producer_main, daemon=True,
                                 args=(ep, spec, pids, shared, out_q, ev)))
    result = RunResult()
    messages: list = []
    n_consumer_procs = len(c_ready)
    for p in procs:
        p.start()
    try:
        # Subscriptions are confirmed by RECEIPT before any producer starts: a topic message sent before
        # its subscriber exists would be counted as lost.
        deadline = time.monotonic() + 60
        for ev in c_ready + p_ready:
            while not ev.wait(0.2):
                if time.monotonic() > deadline or not any(p.is_alive() for p in procs[:n_consumer_procs]):
                    break
        # A consumer process that failed to subscribe has already posted its error.
        early = []
        while not out_q.empty():
            early.append(out_q.get())
        if any(kind == "consumer" for kind, _ in early):
            messages.extend(early)
            go.set()  # let the producers run their (short) course rather than hang
            expected_v.value = 0
        else:
            messages.extend(early)
            start_ns_v.value = time.monotonic_ns() + 20_000_000
            if on_started:
                on_started()
            go.set()
        expected_total = None
        n_producer_reports = 0
        wait_until = time.monotonic() + hard_deadline + 30
        while len(messages) < len(procs) and time.monotonic() < wait_until:
            try:
                kind, payload = out_q.get(timeout=0.5)
            except queue.Empty:  # check the children are alive
                if not any(p.is_alive() for p in procs) and out_q.empty():
                    break
                continue
            messages.append((kind, payload))
            if kind == "producer":
                n_producer_reports += 1
            if n_producer_reports == len(p_ready) and expected_total is None:
                sent = sum(r["sent"] for k, pl in messages if k == "producer" for r in pl["per_producer"].values())
                expected_total = sent
                expected_v.value = sent
            if kind == "producer" and payload["error"]:
                expected_v.value = 0 if expected_total is None else expected_v.value
    except BaseException:
        for p in procs:  # interrupted (SIGTERM, ^C): our own children, ended by their handles
            p.kill()
        raise
    finally:
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()  # our own child, by its Process handle
                p.join(5)
                result.errors.append(f"child process {p.pid} overstayed and was killed")
    return _summarise(spec, messages, result)


def _summarise(spec: LoadSpec, messages: list, result: RunResult) -> RunResult:
    per_producer: dict[int, dict] = {}
    per_consumer: list[dict] = []
    for kind, pl in messages:
        if pl["error"]:
            result.errors.append(f"{kind} {pl.get('pids', pl.get('cidxs'))}: {pl['error']}")
        if kind == "producer":
            per_producer.update(pl["per_producer"])
            result.producer_cpu_s += pl["cpu_s"]
        else:
            per_consumer.extend(pl["per_consumer"])
            result.consumer_cpu_s += pl["cpu_s"]
    result.sent = sum(r["sent"] for r in per_producer.values())
    gave_up = {c["gave_up"] for c in per_consumer if c["gave_up"]}
    result.consumers_gave_up = "; ".join(sorted(gave_up))
    result.received = sum(c["received"] for c in per_consumer)
    result.malformed = sum(c["bad"] for c in per_consumer)
    result.confirm_wait_s = max((r["confirm_wait_s"] for r in per_producer.values()), default=0.0)
    # Loss and duplicates, per producer sequence space.
    dup = sum(c["dups"] for c in per_consumer)
    lost = 0
    groups = [[c] for c in per_consumer] if spec.topic else [per_consumer]
    for group in groups:
        for pid in range(spec.producers):
            sent = per_producer.get(pid, {}).get("sent", 0)
            merged = 0
            for c in group:
                bits = int.from_bytes(c["seen"][pid], "little")
                dup += (merged & bits).bit_count()
                merged |= bits
            # Each seen byte is 0 or 1, so bit 8*k is the mark of sequence k.
            mask = int.from_bytes(b"\x01" * sent, "little")
            lost += sent - (merged & mask).bit_count()
            dup_outside = (merged & ~mask).bit_count()
            if dup_outside:  # a sequence nobody sent: count it as malformed
                result.malformed += dup_outside
    if spec.check_rotation and spec.rotate_send_headers:
        slots = len(spec.rotate_send_headers)
        for c in per_consumer:
            mine = c["cidx"] % slots
            for marks in c["seen"]:
                result.misrouted += marks.count(1) - marks[mine::slots].count(1)
    if len(per_consumer) < spec.consumers:
        lost += result.sent * (spec.consumers - len(per_consumer)) if spec.topic else 0
    result.lost, result.duplicated = lost, dup
    first_send = min((r["first_ns"] for r in per_producer.values() if r["first_ns"]), default=0)
    last_recv = max((c["last_ns"] for c in per_consumer), default=0)
    last_send = max((r["confirmed_ns"] for r in per_producer.values()), default=0)
    if first_send and last_recv > first_send:
        result.elapsed_s = (last_recv - first_send) / NS
        result.rate = result.received / result.elapsed_s
    # A backlog's drain starts when the consumers start subscribing: a broker may do all the work of
    # matching before the first delivery leaves.
    first_recv = min((c["subscribed_ns"] or c["first_ns"] for c in per_consumer if c["first_ns"]), default=0)
    if first_recv and last_recv > first_recv:
        result.drain_rate = result.received / ((last_recv - first_recv) / NS)
    if first_send and last_send > first_send:
        result.send_rate = result.sent / ((last_send - first_send) / NS)
    lat = array.array("q")
    for c in per_consumer:
        lat.frombytes(c["lat"])
    vals = sorted(lat)
    result.lat_p50_us = _percentile(vals, 0.50)
    result.lat_p99_us = _percentile(vals, 0.99)
    result.lat_p999_us = _percentile(vals, 0.999)
    result.lat_max_us = vals[-1] / 1000.0 if vals else 0.0
    # Each side's CPU as a share of one core over the time that side was busy: the producers from their first
    # send to their last confirmation, the consumers from the first send to the last delivery.
    if first_send and last_send > first_send:
        result.producer_cpu_pct = 100.0 * result.producer_cpu_s / ((last_send - first_send) / NS)
    if result.sent:
        result.producer_us_per_msg = result.producer_cpu_s * 1e6 / result.sent
    if result.received:
        result.consumer_us_per_msg = result.consumer_cpu_s * 1e6 / result.received
    if result.elapsed_s:
        result.consumer_cpu_pct = 100.0 * result.consumer_cpu_s / result.elapsed_s
    return result
