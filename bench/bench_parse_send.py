"""A SEND's headers into a SendRequest: the compiled ``parse_send`` (_ext/send.pyx) against its twin.

    python bench/bench_parse_send.py [--number 100000] [--repeat 7]

Each frame is encoded and scanned as the broker does (so the header dict is the scanner's), then each twin
parses it ``--number`` times per round; the figure is the best round's µs per SEND and the twin over the
compiled one, in the same run. The frames: bench_core's (destination, persistent), bench_brokers' load
client's (four application headers, content-type, persistent), a JMS producer's (priority, expires,
timestamp, correlation-id, reply-to, type, a receipt) and the rarer path (a delay and a duplicate id).
"""
from __future__ import annotations

import argparse
import os
import sys
import timeit

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from pymq.protocol.scanner import FrameScanner, encode_frame  # noqa: E402
from pymq_server.broker.requests import SEND_IMPLEMENTATIONS  # noqa: E402

BODY = b"x" * 128
FRAMES = {
    "bench_core": {"destination": "/queue/q", "persistent": "true"},
    "load client": {"destination": "/queue/q", "content-type": "text/plain", "persistent": "true", "app-a": "alpha",
                    "app-b": "12345", "app-c": "x" * 20, "app-d": "true"},
    "JMS": {"destination": "/queue/q", "receipt": "r-1", "persistent": "false", "priority": "7",
            "expires": "1790000000000", "timestamp": "1789999999000", "correlation-id": "c-1",
            "reply-to": "/temp-queue/t", "type": "order"},
    "delay+dedup": {"destination": "/queue/q", "persistent": "true", "AMQ_SCHEDULED_DELAY": "5000",
                    "_AMQ_DUPL_ID": "order-17"},
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--number", type=int, default=100_000)
    ap.add_argument("--repeat", type=int, default=7)
    args = ap.parse_args()
    compiled, twin = SEND_IMPLEMENTATIONS["c"], SEND_IMPLEMENTATIONS["py"]
    if compiled is None:
        raise SystemExit("the compiled parse_send is not built (or PYMQ_NO_EXTENSIONS=1): nothing to compare")
    print(f"parse_send, µs per SEND (best of {args.repeat} rounds of {args.number:,}); load average "
          f"{os.getloadavg()[0]:.1f}")
    print(f"{'frame':<14}{'headers':>8}{'python':>10}{'compiled':>10}{'ratio':>8}")
    for name, headers in FRAMES.items():
        frame = FrameScanner(version="1.2").feed(encode_frame("SEND", headers, BODY, "1.2"))[0]
        hd, body = frame.headers, frame.body
        assert compiled.parse_send(hd, body) == twin.parse_send(hd, body)
        times = []
        for module in (twin, compiled):
            best = min(timeit.repeat("parse(hd, body)", globals={"parse": module.parse_send, "hd": hd, "body": body},
                                     number=args.number, repeat=args.repeat))
            times.append(best / args.number * 1e6)
        print(f"{name:<14}{len(hd):>8}{times[0]:>10.3f}{times[1]:>10.3f}{times[0] / times[1]:>7.2f}x")


if __name__ == "__main__":
    main()
