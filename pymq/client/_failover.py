"""Failover without I/O (spec/ha.md §4): which broker to try next and when, what a new link is told, and what
becomes of the work in flight when a link is lost.  The shells' reconnect loop (``pymq/aio/client.py``, and the
blocking shell generated from it) drives it; nothing here waits or touches a socket.

A connection's *links* are numbered: every frame the broker delivered belongs to the link it came on, and an
ACK or NACK naming a delivery of an earlier link is never sent (its ack id meant something on that link only;
the broker gives the message back, flagged ``redelivered``).  What :class:`Failover` keeps:

* the receipted frames not yet answered (``inflight``, in the order sent), so a new link can be told them
  again, or their callers told what happened: a SEND goes again with its ``pymq-dedup-id`` (the broker drops
  a copy it already has, §4.4); a consumer's SUBSCRIBE is the resubscription itself; a COMMIT is in doubt
  (§4.5) and never sent again; an UNSUBSCRIBE or a recovery's NACKs are done (the loss returned everything);
  anything else (a browse, a bulk SEND, a durable unsubscription by name) failed with ConnectionInterrupted;
* the window of SENDs nobody waits for (non-persistent ones, or ``sync_send=False``): every SEND asks for a
  receipt under failover, and ``send`` waits while ``window_count`` or ``window_bytes`` are reached;
* frames with no receipt that must not be lost while the link is down (a temporary destination's deletion).
"""
from __future__ import annotations

import random
import uuid
from collections.abc import Iterator
from typing import Literal

from pymq.client.url import BrokerGroup, FailoverOptions, StompAddress, VmAddress
from pymq.errors import ConnectionInterrupted, PymqError, TransactionInDoubt, TransactionRolledBack
from pymq.protocol.frame import Frame

Address = StompAddress | VmAddress

#: at most this many SENDs, and this many bytes of their bodies, wait for their receipts at once
WINDOW_COUNT = 1000
WINDOW_BYTES = 64 * 1024 * 1024

#: error codes of an ERROR caused by the client's own request: final, never a reason to reconnect (§4.3)
FINAL_CODES = frozenset({
    "authentication-failed", "access-denied", "unknown-user", "invalid-selector", "invalid-destination",
    "unknown-destination", "destination-exists", "illegal-state", "message-format", "schema-violation",
    "queue-full", "transaction", "config", "protocol", "malformed-frame", "bad-escape", "frame-too-large",
    "unknown-command", "missing-header", "invalid-header", "unsupported-version", "unknown-subscription",
    "unknown-message", "frame-timeout",
})

#: the receipt a new link's re-subscription asks for (``resubscribe:<link>:<subscription id>``)
RESUBSCRIPTION = "resubscribe:"

Outcome = Literal["resend", "resolve", "fail", "in-doubt"]


def is_final(error: PymqError) -> bool:
    """A loss no reconnection can mend: the broker refused what this client asked (its login, a frame).
    Not a re-subscription refused with ``illegal-state``: the broker still holds that durable subscription
    for the lost link it has not seen end (spec/ha.md §4.3), so the SDK tries again."""
    if refused_resubscription(error):
        return False
    return getattr(error, "code", "") in FINAL_CODES or getattr(error, "receipt_id", None) is not None


def refused_resubscription(error: PymqError) -> bool:
    """``error`` refused a new link's re-subscription because the broker holds it for a lost link."""
    rid = getattr(error, "receipt_id", None)
    return rid is not None and rid.startswith(RESUBSCRIPTION) and getattr(error, "code", "") == "illegal-state"


class Failover:
    """The failover state of one connection (see the module docstring)."""

    def __init__(self, group: BrokerGroup, rng: random.Random | None = None) -> None:
        self.group = group
        self.options: FailoverOptions = group.options
        self.rng = rng or random.Random()
        self.current = 0                           # index in group.brokers of the broker of the link in use
        self.inflight: dict[str, Frame] = {}       # receipt id -> frame, in the order sent
        self.window: dict[str, int] = {}           # receipt id -> body size, of SENDs nobody waits for
        self.window_bytes = 0
        #: frames without a receipt kept for the next link, with the link they belong to (None: any)
        self.held: list[tuple[Frame, int | None]] = []
        self.unsent: set[str] = set()             # receipted frames the lost link never took
        self._dedup_prefix = f"{uuid.uuid4().hex[:12]}"
        self._dedup = 0
        self.resent = 0                            # SENDs told again to a new link (tests and logs)

    # -- attempts ----------------------------------------------------------------------------------------
    def attempts(self, after_loss: bool, made: int = 0) -> Iterator[tuple[int, Address, float]]:
        """(attempt number, broker, seconds to wait before it) for one outage (``after_loss``) or for the
        first connect: spec/ha.md §4.2 — the first attempt is immediate, then the back-off with jitter;
        after a loss the list starts after the broker that was lost and wraps, at most
        ``maxReconnectAttempts`` attempts (-1: no end); at the first connect (1 + ``startupMaxReconnectAttempts``)
        passes over the list (-1: no end).  ``randomize`` shuffles the list before each pass.  ``made``:
        attempts of this outage already made (a link whose re-subscription was refused goes on with the
        back-off and the count where its outage stood, rather than starting again)."""
        options, brokers = self.options, self.group.brokers
        count = len(brokers)
        if after_loss:
            limit = options.max_reconnect_attempts
            first = (self.current + 1) % count
        else:
            passes = options.startup_max_reconnect_attempts
            limit = -1 if passes < 0 else (passes + 1) * count
            first = 0
        order = [(first + i) % count for i in range(count)]
        attempt = made if after_loss else 0
        while limit < 0 or attempt < limit:
            if options.randomize:
                self.rng.shuffle(order)
            for index in order:
                if 0 <= limit <= attempt:
                    return
                attempt += 1
                wait = options.jittered(options.delay_ms(attempt), self.rng.random()) / 1000.0
                yield attempt, brokers[index], wait

    def connected_to(self, address: Address) -> None:
        self.current = self.group.brokers.index(address)

    # -- sends -------------------------------------------------------------------------------------------
    def stamp(self, frame: Frame) -> Frame:
        """A SEND outside a transaction with a ``pymq-dedup-id`` (the application's own, if it set one)."""
        if "pymq-dedup-id" in frame.headers or "_AMQ_DUPL_ID" in frame.headers:
            return frame
        self._dedup += 1
        headers = dict(frame.headers)
        headers["pymq-dedup-id"] = f"{self._dedup_prefix}:{self._dedup}"
        return Frame(frame.command, headers, frame.body)

    @property
    def window_full(self) -> bool:
        return len(self.window) >= WINDOW_COUNT or self.window_bytes >= WINDOW_BYTES

    def sent(self, rid: str, frame: Frame, windowed: bool = False) -> None:
        """``frame`` asked for receipt ``rid`` (``windowed``: a SEND whose caller does not wait for it)."""
        self.inflight[rid] = frame
        if windowed:
            self.window[rid] = len(frame.body)
            self.window_bytes += len(frame.body)

    def answered(self, rid: str) -> bool:
        """The broker answered ``rid``; True when that freed room in the window."""
        self.inflight.pop(rid, None)
        size = self.window.pop(rid, None)
        if size is None:
            return False
        self.window_bytes -= size
        return True

    # -- a lost link -----------------------------------------------------------------------------------------
    def while_down(self, frame: Frame, link: int | None = None) -> None:
        """``frame`` could not be sent (the link is down): keep it for the next link or drop it.  A
        receipted frame is in :attr:`inflight` already (and its fate is :meth:`outcome`); a frame bound to
        ``link`` (an ACK, a transaction's BEGIN) is kept only for that link; of the others an ACK, NACK,
        ABORT, COMMIT or DISCONNECT named the lost link's state, and an admin request's answer is lost."""
        rid = frame.headers.get("receipt")
        if rid is not None:
            self.unsent.add(rid)
            return
        if link is None:
            if frame.command in ("ACK", "NACK", "ABORT", "COMMIT", "DISCONNECT"):
                return
            if frame.command == "SEND" and "reply-to" in frame.headers and "transaction" not in frame.headers:
                return
        self.held.append((frame, link))

    def outcome(self, frame: Frame, consumers: set[str]) -> Outcome:
        """What becomes of receipted ``frame`` of a lost link (see the module docstring); ``consumers`` are
        the subscription ids the new link subscribes again."""
        command, h = frame.command, frame.headers
        if command == "SEND":
            if "transaction" in h or h.get("pymq-format") == "arrow":
                return "fail"
            return "resend"
        if command == "SUBSCRIBE":
            return "resend" if h.get("id") in consumers else "fail"
        if command == "COMMIT":
            return "in-doubt"
        if command == "ACK" and "pymq-ack-upto" in h:
            return "resend"                        # acknowledging up to a sequence number again changes nothing
        if command == "UNSUBSCRIBE" and ("pymq-durable-name" in h or "pymq-delete-temporary" in h):
            return "fail"
        return "resolve"                           # UNSUBSCRIBE, NACK, BEGIN/ABORT, DISCONNECT: the loss did it

    def failure(self, frame: Frame, rid: str) -> PymqError:
        """What the caller of receipted ``frame`` (receipt ``rid``) hears when it is not sent again."""
        if frame.command == "COMMIT" and rid in self.unsent:
            return TransactionRolledBack("the connection was lost before COMMIT reached the broker: the broker "
                                         "rolled the transaction back (spec/ha.md §4.5)",
                                         transaction=frame.headers.get("transaction", ""))
        if frame.command == "COMMIT":
            return TransactionInDoubt("the connection was lost after COMMIT was sent and before its receipt: "
                                      "the broker applied the whole transaction or none of it, and a "
                                      "transaction not applied comes back redelivered (spec/ha.md §4.5)",
                                      transaction=frame.headers.get("transaction", ""))
        return ConnectionInterrupted(f"the connection to the broker was lost while {frame.command} waited for "
                                     f"its receipt; whether the broker applied it is unknown (the connection "
                                     f"fails over: try again)")
