"""A connection's CONNECT handshake: from a CONNECT frame to CONNECTED, or to the ERROR that refuses it.

What :class:`Handshake` owns, in this order (spec/stomp.md §1 and §6, spec/ha.md §4.7 and §5): the version
and heart-beats the client offers, read from the frame; authentication (a slow hash runs off the loop while
the connection's later frames wait); admission — a peer node's link of a fenced former process refused, the
virtual host's principals and connection limit, the temporary names a reconnecting client re-claims, its
client id; then the heart-beats both sides keep and the CONNECTED frame.  What the handshake decides, the
session (session.py) keeps: its user, vhost, version and temporary names.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from pymq_server.broker import vhosts
from pymq_server.broker.auth import User

from pymq import errors
from pymq.errors import PymqError
from pymq.protocol.connection import negotiate_heartbeat, negotiate_version, offer_heartbeat, parse_heartbeat
from pymq.protocol.frame import Frame

if TYPE_CHECKING:
    from pymq_server.broker.session import BrokerSession

SERVER_NAME = "pymq/0.1"


class Handshake:
    def __init__(self, session: BrokerSession, frame: Frame) -> None:
        self.session = session
        self.frame = frame
        h = self.headers = frame.headers
        self.version = negotiate_version(h.get("accept-version"))
        self.client_hb = parse_heartbeat(h.get("heart-beat"))
        self.vhost = vhosts.select(h.get("host"), session.broker.config.vhosts)

    def start(self) -> None:
        """Authenticate; :meth:`finish` runs now or, after a slow check, from the loop later."""
        session, h = self.session, self.headers
        # the connection limit is checked here, after reading CONNECT, so the client reads the ERROR
        # instead of a reset that may discard it
        session.broker.session_opened(session)
        session.client_id = h.get("client-id") or None
        # the subject of a verified TLS client certificate, set by the transport adapter (mutual TLS)
        certificate = getattr(session.link, "certificate_subject", None)
        # where the login comes from, for loopback-only users: the link may know better than the address
        # (a browser page served from elsewhere, over WebSocket)
        where = getattr(session.link, "login_host", session.peer_host)
        if session.broker.authenticate(h.get("login"), h.get("passcode"), where, certificate, self.finish):
            session.hold_input()        # the check runs in a worker thread: later frames wait for it

    def finish(self, user: User | None, error: PymqError | None) -> None:
        session, frame = self.session, self.frame
        if session.closed:
            return
        if error is not None or user is None:
            session.fail(error or errors.AuthenticationFailed("authentication failed"), frame)
            return
        session.authenticated(user)
        try:
            self._admit(session, user)
        except PymqError as exc:
            session.fail(exc, frame)
            return
        self._connected(session, user)

    def _admit(self, session: BrokerSession, user: User) -> None:
        broker, h = session.broker, self.headers
        if session.is_cluster:      # a peer node's link: one of a fenced former process is refused (spec/ha.md §5)
            broker.cluster.link_admitted(session, h)
        if self.vhost != vhosts.DEFAULT:
            entry = broker.config.vhosts[self.vhost]
            vhosts.check_access(user, self.vhost, entry.principals)
            vhosts.check_connections(self.vhost, entry, broker.sessions.values(), session)
            session.enter_vhost(self.vhost, entry.max_memory)
        # before the client id: a re-claim closes a half-open link of the same client, which frees its id
        reclaim = h.get("pymq-reclaim")
        self.names = broker.temporary_names(session, session.vhost, reclaim)
        session.temporary_names = self.names.names
        if reclaim is not None and not self.names.refused:
            session.temporaries.adopt(self.names.names)
        if session.client_id is not None:
            broker.claim_client_id(session, session.client_id)

    def _connected(self, session: BrokerSession, user: User) -> None:
        cfg = session.broker.config
        client_hb, names, reclaim = self.client_hb, self.names, self.headers.get("pymq-reclaim")
        # the client's intervals, down to heartbeat_min_ms (spec/stomp.md §6)
        server_hb = offer_heartbeat(client_hb, (cfg.heartbeat_send_ms, cfg.heartbeat_recv_ms),
                                    cfg.heartbeat_min_ms) if client_hb != (0, 0) else (0, 0)
        to_server, to_client = negotiate_heartbeat(client_hb, server_hb)
        headers = {"version": self.version, "server": SERVER_NAME,
                   "heart-beat": f"{server_hb[0]},{server_hb[1]}", "session": session.id,
                   "user-name": user.name}
        prefix = session.broker.apptx_table_prefix
        if prefix is not None:
            # where producer.send(..., transaction=conn) writes its pending rows (spec/storage.md)
            headers["pymq-apptx-table-prefix"] = prefix
        if names.token:
            headers["pymq-reclaim-token"] = names.token     # for this client's next CONNECT only: secret
        if reclaim is not None:
            headers["pymq-reclaimed"] = "false" if names.refused else "true"
            if names.refused:
                headers["pymq-reclaim-refused"] = names.refused
        session.connected(self.version, headers, to_client, to_server)
