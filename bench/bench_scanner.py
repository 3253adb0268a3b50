"""The receive path from bytes to a handled frame's state check, per stage: the scanner's ``feed`` (compiled
and its twin) on the reads a broker gets from bench_brokers' load client, then ``receive_frame``.

    python bench/bench_scanner.py [--rounds 200] [--repeat 7] [--old path/to/_scanner_c.so]

The read: 64 SENDs of the load client's shape (destination, content-type, persistent, four application
headers as bench/loadclient.py makes them, a 128-byte body) in one bytes object, and 16 such reads cut in
16 KiB slices as the TCP adapter's read budget hands them over (a frame split across two feeds). Each
figure is the best round's µs a frame. ``--old`` loads another build of the compiled scanner (for example
main's ``_ext/scanner.pyx`` built with the same cython and -O2) and prints it beside this one, same run.
"""
from __future__ import annotations

import argparse
import importlib.util
import os
import sys
import timeit

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from pymq.protocol.connection import Role, StompConnection  # noqa: E402
from pymq.protocol.scanner import IMPLEMENTATIONS  # noqa: E402

BUDGET = 16 * 1024


def frame(seq: int) -> bytes:
    return (b"SEND\ndestination:/queue/bench-q\ncontent-type:text/plain\npersistent:true\n"
            b"app-id:%08x-4b1d-4c3e-8f00-%012x\napp-producer:%d\napp-seq:%d\napp-ts:%d\n"
            b"content-length:128\n\n" % (seq, seq, 0, seq, 1790000000000 + seq) + b"x" * 128 + b"\x00")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=200, help="reads fed per timing round (compiled)")
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--old", help="another build of the compiled scanner's module, compared in the same run")
    args = ap.parse_args()
    read = b"".join(frame(k) for k in range(64))
    stream = read * 16
    slices = [stream[at:at + BUDGET] for at in range(0, len(stream), BUDGET)]
    impls = {name: module for name, module in IMPLEMENTATIONS.items() if module is not None}
    if args.old:
        spec = importlib.util.spec_from_file_location("_scanner_c", args.old)
        assert spec is not None and spec.loader is not None
        old = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(old)
        impls["old c"] = old
    print(f"feed, µs a frame (best of {args.repeat}); {len(read):,} bytes a 64-SEND read; "
          f"load average {os.getloadavg()[0]:.1f}")
    print(f"{'scanner':<10}{'one read':>10}{'16 KiB slices':>15}")
    for name, module in impls.items():
        scanner_class = module.FrameScanner
        rounds = args.rounds if name != "py" else max(1, args.rounds // 10)

        def whole(scanner_class=scanner_class, rounds=rounds) -> None:
            for _ in range(rounds):
                scanner_class(version="1.2").feed(read)

        def sliced(scanner_class=scanner_class, rounds=rounds) -> None:
            for _ in range(max(1, rounds // 16)):
                scanner = scanner_class(version="1.2")
                for piece in slices:
                    scanner.feed(piece)

        one = min(timeit.repeat(whole, number=1, repeat=args.repeat)) / (rounds * 64) * 1e6
        cut = min(timeit.repeat(sliced, number=1, repeat=args.repeat)) / (max(1, rounds // 16) * 1024) * 1e6
        print(f"{name:<10}{one:>10.3f}{cut:>15.3f}")
    frames = impls["c" if "c" in impls else "py"].FrameScanner(version="1.2").feed(read)
    conn = StompConnection(Role.SERVER)
    conn.receive_frame(impls["py"].FrameScanner().feed(b"CONNECT\naccept-version:1.2\n\n\x00")[0])
    conn.send_frame(type(frames[0])("CONNECTED", {"version": "1.2"}))
    receive = conn.receive_frame

    def handed() -> None:
        for f in frames:
            receive(f)

    best = min(timeit.repeat(handed, number=args.rounds, repeat=args.repeat))
    print(f"receive_frame (the state table's check), µs a frame: {best / (args.rounds * 64) * 1e6:.3f}")


if __name__ == "__main__":
    main()
