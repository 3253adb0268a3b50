"""The HANDOVER envelope's payload as an input surface (spec/cores.md §2.1, §2.4): a connection's state (JSON) and
the bytes read and not yet handled, which the owner adopts as a connection of its own. The channel is the
broker's own, so this is a bug's input rather than an attacker's, but a bug must never take the worker down.

The one property, whatever the bytes: ``unpack_state`` refuses with ValueError (nothing adopted), or what it
accepts holds exactly the fields ``hand_over`` writes, each of its kind; adopting that gives a connection in the
state CONNECTED with the principal and version the state names, or one closed with an ERROR frame (an unknown
vhost, a client id in use, hostile frames in the unread bytes) — never an exception caught by a catch-all
(logged with a traceback), never anything raised. Used by tests/hostile/test_handover_states.py and the
coverage-guided target ``bench/fuzz_targets.py handover``."""
from __future__ import annotations

import asyncio
import functools
import logging
import tempfile
from typing import Any

from pymq_server.cores import handover

from tests.fake_transport import RecordingTransport


def _local_queue() -> str:
    """A queue the adopting worker (1 of 2) owns: a SEND to it is handled there (to another, it is forwarded)."""
    from pymq_server.cores.ownership import Ownership
    ownership = Ownership(1, 2, "pymq")
    return next(n for n in (f"/queue/h.{i}" for i in range(100)) if ownership.owner(n) == 1)


LOCAL = _local_queue()
FIELDS = {"user", "roles", "subject", "version", "client_id", "vhost", "to_client", "to_server", "from", "reclaim"}


def good_state(**changes: Any) -> dict[str, Any]:
    doc: dict[str, Any] = {"user": "guest", "roles": ["admin"], "subject": None, "version": "1.2", "client_id": None,
                           "vhost": "/", "to_client": 0, "to_server": 0, "from": "w0c1",
                           "reclaim": "w0c1.0123456789abcdef.mac"}
    doc.update(changes)
    return doc


class _Traceback(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        if record.exc_info:
            self.records.append(record)


class Adopter:
    """One worker's broker core (in-process, memory storage, a vhost ``shop``) that adopts states in turn."""

    def __init__(self) -> None:
        from pymq_server.app import BrokerServer
        from pymq_server.config import BrokerConfig
        from pymq_server.cores.home import HomeSession
        from pymq_server.cores.mesh import Mesh
        self.tmp = tempfile.mkdtemp(prefix="pymq-handover-states-")
        config = BrokerConfig.from_dict(dict(host="127.0.0.1", port=0, data_dir=self.tmp, sync_policy="never",
                                             storage={"devices": {"memory": {"kind": "memory"}}},
                                             vhosts={"shop": ["*"]}))
        self.loop = asyncio.new_event_loop()
        self.server = BrokerServer(config)
        self.loop.run_until_complete(self.server.start_core())
        self.mesh = Mesh(1, 2, self.tmp, "pymq", self.loop, 1 << 20)
        self.mesh.broker = self.server.broker
        self.session_type = functools.partial(HomeSession, self.mesh)
        self.tracebacks = _Traceback()
        logging.getLogger("pymq").addHandler(self.tracebacks)

    def adopt(self, doc: dict[str, Any], unread: bytes, keep: bool = False) -> tuple[str, Any]:
        proto = handover.AdoptedProtocol(self.server.broker, self.loop, self.session_type, doc, unread)
        transport = RecordingTransport()
        proto.connection_made(transport)
        for _ in range(3):                  # what the adoption scheduled (the output's flush)
            self.loop.run_until_complete(asyncio.sleep(0))
        session = proto.session
        assert session is not None
        if session.closed:
            # an ERROR, or the client's own DISCONNECT among the unread bytes
            assert "ERROR" in transport.commands() or session._disconnected, bytes(transport.data[:300])
            outcome = "failed" if "ERROR" in transport.commands() else "ended"
        else:
            assert session.user.name == doc["user"] and session.version == doc["version"], (doc, session)
            assert session.conn.state.name in ("CONNECTED", "DISCONNECTING"), session.conn.state
            outcome = "adopted"
        if not keep:
            proto.connection_lost(None)
        return outcome, proto

    def close(self) -> None:
        logging.getLogger("pymq").removeHandler(self.tracebacks)
        self.loop.run_until_complete(self.server.stop())
        self.loop.close()


_ADOPTER: list[Adopter] = []


def adopter() -> Adopter:
    if not _ADOPTER:
        _ADOPTER.append(Adopter())
    return _ADOPTER[0]


def check_state(payload: bytes) -> str:
    """``"refused"``, ``"adopted"``, ``"failed"`` (closed with an ERROR) or ``"ended"`` (by a DISCONNECT among the
    unread bytes); an AssertionError when the property does not hold."""
    try:
        doc, unread = handover.unpack_state(payload)
    except ValueError:
        return "refused"
    assert set(doc) <= FIELDS and {"user", "version"} <= set(doc), doc
    assert isinstance(doc["user"], str) and doc["version"] in ("1.0", "1.1", "1.2"), doc
    for key in ("to_client", "to_server"):
        assert key not in doc or (type(doc[key]) is int and 0 <= doc[key] < 2 ** 31), doc
    assert all(isinstance(r, str) for r in doc.get("roles") or ()), doc
    a = adopter()
    before = len(a.tracebacks.records)
    outcome, _ = a.adopt(doc, unread)
    assert len(a.tracebacks.records) == before, [r.getMessage() for r in a.tracebacks.records[before:]]
    return outcome
