"""DISCONNECT with a receipt while other receipts are pending, in the connection's state table.

Regression (issue 10): the table closed the connection on the *first* RECEIPT after a DISCONNECT, so a
broker that still owed the receipt of an earlier persistent SEND sent that one, then could not send the
DISCONNECT's own receipt (a ProtocolError in its log) and never closed; stomp.py's ``with
stomp.Connection(...)`` then waited for ever.  Only the RECEIPT that answers the DISCONNECT closes.
"""
from __future__ import annotations

import pytest

from pymq.errors import ProtocolError
from pymq.protocol.connection import Role, State, StompConnection
from pymq.protocol.frame import Frame


def _server(version: str) -> StompConnection:
    conn = StompConnection(Role.SERVER)
    conn.receive_frame(Frame("CONNECT", {"accept-version": version}))
    conn.send(Frame("CONNECTED", {"version": version}))
    return conn


@pytest.mark.parametrize("version", ["1.0", "1.1", "1.2"])
def test_server_sends_earlier_receipts_then_the_disconnects_and_closes(version):
    conn = _server(version)
    conn.receive_frame(Frame("SEND", {"destination": "/queue/a", "receipt": "send-1"}))
    conn.receive_frame(Frame("SEND", {"destination": "/queue/a", "receipt": "send-2"}))
    conn.receive_frame(Frame("DISCONNECT", {"receipt": "bye"}))
    assert conn.state is State.DISCONNECTING
    conn.send(Frame("RECEIPT", {"receipt-id": "send-1"}))
    conn.send(Frame("RECEIPT", {"receipt-id": "send-2"}))
    assert conn.state is State.DISCONNECTING
    conn.send(Frame("RECEIPT", {"receipt-id": "bye"}))
    assert conn.state is State.CLOSED
    with pytest.raises(ProtocolError):
        conn.send(Frame("RECEIPT", {"receipt-id": "late"}))


@pytest.mark.parametrize("version", ["1.0", "1.1", "1.2"])
def test_nothing_but_receipts_and_error_after_disconnect(version):
    conn = _server(version)
    conn.receive_frame(Frame("DISCONNECT", {"receipt": "bye"}))
    with pytest.raises(ProtocolError):
        conn.send(Frame("MESSAGE", {"destination": "/queue/a", "message-id": "1"}))
    with pytest.raises(ProtocolError):
        conn.receive_frame(Frame("SEND", {"destination": "/queue/a"}))
    conn.send(Frame("ERROR", {"message": "x"}))
    assert conn.state is State.CLOSED


@pytest.mark.parametrize("version", ["1.0", "1.1", "1.2"])
def test_client_stays_disconnecting_until_its_own_receipt(version):
    conn = StompConnection(Role.CLIENT)
    conn.send(Frame("CONNECT", {"accept-version": version}))
    conn.receive_frame(Frame("CONNECTED", {"version": version}))
    conn.send(Frame("SEND", {"destination": "/queue/a", "receipt": "send-1"}))
    conn.send(Frame("DISCONNECT", {"receipt": "bye"}))
    conn.receive_frame(Frame("RECEIPT", {"receipt-id": "send-1"}))
    assert conn.state is State.DISCONNECTING
    conn.receive_frame(Frame("RECEIPT", {"receipt-id": "bye"}))
    assert conn.state is State.CLOSED
