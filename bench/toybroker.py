"""A deliberately tiny STOMP broker for the bench's self-check: it lets the harness prove, without any real
broker, that it counts every message and that its loss and duplicate detection can fire.

It keeps nothing: a SEND to /queue/x goes round-robin to the current subscribers of x (or is dropped if there
are none), a SEND to /topic/x to all of them. `faults` names (producer id, sequence) pairs to drop or to deliver
twice, matched on the bench's body layout (see loadclient.py). Loopback only; runs until its process is ended.
"""
from __future__ import annotations

import asyncio
import itertools

from loadclient import FrameReader, _new_loop


class ToyBroker:
    def __init__(self, drop: set[tuple[int, int]] = frozenset(), dup: set[tuple[int, int]] = frozenset()):
        self.subs: dict[bytes, list] = {}
        self.rr: dict[bytes, itertools.count] = {}
        self.drop, self.dup = set(drop), set(dup)
        self.msg_ids = itertools.count()

    def deliver(self, dest: bytes, body: bytes, app: bytes = b"") -> None:
        key = (int(body[0:4]), int(body[4:16])) if len(body) >= 16 and body[:16].isdigit() else None
        if key in self.drop:
            return
        subs = self.subs.get(dest, [])
        if not subs:
            return
        targets = subs if dest.startswith(b"/topic/") else [subs[next(self.rr[dest]) % len(subs)]]
        times = 2 if key in self.dup else 1
        for transport, sid in targets:
            mid = b"%d" % next(self.msg_ids)
            frame = (b"MESSAGE\ndestination:" + dest + b"\nmessage-id:" + mid + b"\nsubscription:" + sid
                     + b"\nack:" + mid + b"\n" + app + b"content-length:%d\n\n" % len(body) + body + b"\0")
            for _ in range(times):
                transport.write(frame)

    def protocol(self):
        broker = self

        class Session(asyncio.Protocol):
            def connection_made(self, transport):
                self.transport, self.reader, self.mine = transport, FrameReader(), []

            def connection_lost(self, exc):
                for dest, sid in self.mine:
                    broker.subs[dest] = [s for s in broker.subs[dest] if s != (self.transport, sid)]

            def data_received(self, data):
                self.reader.feed(data)
                for command, headers, body in self.reader.frames():
                    if command in (b"CONNECT", b"STOMP"):
                        self.transport.write(b"CONNECTED\nversion:1.2\nheart-beat:0,0\n\n\0")
                    elif command == b"SUBSCRIBE":
                        dest, sid = headers[b"destination"], headers[b"id"]
                        broker.subs.setdefault(dest, []).append((self.transport, sid))
                        broker.rr.setdefault(dest, itertools.count())
                        self.mine.append((dest, sid))
                    elif command == b"SEND":
                        # Application headers go back out as they came (the load client checks app-seq).
                        app = b"".join(k + b":" + v + b"\n" for k, v in headers.items() if k.startswith(b"app-"))
                        broker.deliver(headers[b"destination"], body, app)
                    if b"receipt" in headers:
                        self.transport.write(b"RECEIPT\nreceipt-id:" + headers[b"receipt"] + b"\n\n\0")
                    if command == b"DISCONNECT":
                        self.transport.close()

        return Session


def serve(port: int, drop=(), dup=()) -> None:
    loop = _new_loop()
    asyncio.set_event_loop(loop)
    broker = ToyBroker(set(drop), set(dup))
    loop.run_until_complete(loop.create_server(broker.protocol(), "127.0.0.1", port))
    loop.run_forever()


if __name__ == "__main__":          # bench/peers.py's EchoBroker: `toybroker.py PORT`
    import sys

    serve(int(sys.argv[1]))
