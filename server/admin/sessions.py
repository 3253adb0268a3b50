"""Web console log-ins: server-side sessions behind an HttpOnly cookie, with a CSRF token.

A log-in (``POST /api/session`` with user and password in a JSON body — never in a URL) creates a
session: a random 256-bit token in the ``pymq_session`` cookie (``HttpOnly``: page scripts cannot read
it; ``SameSite=Strict``: other sites' pages do not send it; ``Secure`` over TLS) and a second random
token, the CSRF token, that the page keeps in memory and sends back in the ``X-CSRF-Token`` header of
every state-changing request.  A forged cross-site request carries neither.

The session remembers the user's *name* and password hash, not the user object: every request looks
the user up again in the authenticator, so a removed user, a changed password or a role change (from
``pymq-admin users`` or a SIGHUP reload) takes effect on open console sessions at once.  Sessions end
after ``idle_s`` without a request or ``max_age_s`` in all; at most ``limit`` exist (the oldest goes).
"""
from __future__ import annotations

import hmac
import secrets
import time
from collections import OrderedDict
from dataclasses import dataclass, field

COOKIE = "pymq_session"
CSRF_HEADER = "X-CSRF-Token"


@dataclass
class ConsoleSession:
    login: str
    password_hash: str
    csrf: str
    created: float
    last_seen: float = field(default=0.0)


class ConsoleSessions:
    def __init__(self, idle_s: float = 30 * 60, max_age_s: float = 8 * 3600, limit: int = 1000,
                 clock=time.monotonic) -> None:
        self.idle_s = idle_s
        self.max_age_s = max_age_s
        self.limit = limit
        self._clock = clock
        self._sessions: OrderedDict[str, ConsoleSession] = OrderedDict()

    def create(self, login: str, password_hash: str) -> tuple[str, ConsoleSession]:
        now = self._clock()
        token = secrets.token_urlsafe(32)
        session = ConsoleSession(login, password_hash, secrets.token_urlsafe(32), now, now)
        self._sessions[token] = session
        while len(self._sessions) > self.limit:
            self._sessions.popitem(last=False)
        return token, session

    def lookup(self, token: str | None) -> ConsoleSession | None:
        if not token or len(token) > 100:
            return None
        session = self._sessions.get(token)
        if session is None:
            return None
        now = self._clock()
        if now - session.last_seen > self.idle_s or now - session.created > self.max_age_s:
            del self._sessions[token]
            return None
        session.last_seen = now
        return session

    def drop(self, token: str | None) -> None:
        if token:
            self._sessions.pop(token, None)

    def __len__(self) -> int:
        return len(self._sessions)

    @staticmethod
    def csrf_ok(session: ConsoleSession, sent: str | None) -> bool:
        return sent is not None and hmac.compare_digest(session.csrf.encode(), sent.encode())
