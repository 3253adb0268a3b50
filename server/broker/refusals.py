"""The words of an ERROR frame (spec/stomp.md §6): what the client is told when the broker refuses a frame or
cannot confirm a receipt, before the connection closes.

Kept apart from the session, which decides *when* to refuse and closes: this module only composes the frame
from the error, the failing frame and the vhost the client names things in.
"""
from __future__ import annotations

from pymq_server.broker import vhosts

from pymq import errors
from pymq.errors import PymqError
from pymq.protocol.frame import Frame


def error_frame(exc: PymqError, frame: Frame | None = None, *, receipt_id: str | None = None, note: str = "",
                vhost_prefix: str = "") -> Frame:
    """ERROR for ``exc``: its code headers, the failing frame's receipt (else ``receipt_id``), and a body
    that says which frame failed and, for a transaction's SEND/ACK/NACK, that nothing of it was applied.
    Names are given back as the client wrote them in its vhost (``vhost_prefix``)."""
    if vhost_prefix:
        exc = vhosts.as_seen_in(exc, vhost_prefix)
    headers = errors.error_headers(exc)
    if frame is not None and frame.headers.get("receipt") is not None:
        headers["receipt-id"] = frame.headers["receipt"]
    elif receipt_id is not None:
        headers["receipt-id"] = receipt_id
    body = exc.message
    if frame is not None:
        body += f"\n\nThe failing frame was {frame.command}."
        tx = frame.headers.get("transaction")
        if tx is not None and frame.command in ("SEND", "ACK", "NACK"):
            body += f" Transaction {tx!r} is rolled back: nothing of it was applied."
    if note:
        body += f"\n\n{note}"
    return Frame("ERROR", headers, body.encode("utf-8"))
