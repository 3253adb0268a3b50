"""Temporary queues and topics (``/temp-queue/``, ``/temp-topic/``), part of the destinations layer: a
connection's queues and topics, named ``tmp.<connection>-<nonce>.<name>`` once shared in a ``reply-to``;
anyone may send or publish to one while its connection lives, only that connection consumes or subscribes
(spec/stomp.md §3), and a lost link's queues are kept for its client's re-claim.  Also JMS ``delete()`` of
a connection's temporary queues and topics, and :class:`TemporaryNames`: who holds which global names, and
who may take them back after a lost link or a takeover (spec/ha.md §4.7).
"""
from __future__ import annotations

import base64
import hashlib
import hmac
import re
import secrets
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NamedTuple

from pymq_server.broker.queue import MessageQueue, QueueHost
from pymq_server.broker.routes import Generation
from pymq_server.broker.topic import Topic
from pymq_server.broker import vhosts
from pymq_server.config import BrokerConfig

from pymq.errors import AccessDenied, DestinationError, IllegalStateError, PymqError, UnknownDestination

if TYPE_CHECKING:
    from pymq_server.broker.clients import Client


#: the catalog record of the key that signs re-claim tokens: in the store, so a restarted broker and the
#: backup of an HA pair (which recovers the same store) verify what the former process signed
NAMES_KEY_RECORD = "temporary-names-key"
#: ``c12`` or, with several workers, ``w1c12`` (server/cores/home.py)
_CONNECTION_ID = re.compile(r"(w[0-9]{1,5})?c[0-9]{1,19}")
_NONCE = re.compile(r"[0-9a-f]{16}")
_MAX_TOKEN = 96
#: the most names kept for a re-claim (lost links, DISCONNECTs of the first window), oldest forgotten first:
#: a client dropping logged-in links as fast as it can holds at most this many (~150 bytes each)
MAX_KEPT = 100_000
#: the most temporary queues of lost links kept for a re-claim at once, over every link (each ~4 KiB besides
#: its messages, which count in the broker's memory as any queue's do); past it a lost link's go at once
MAX_ORPHANED = 10_000


class Reclaimed(NamedTuple):
    """The answer to a CONNECT's ``pymq-reclaim``: ``names`` (``c12-<nonce>``) the connection's temporaries
    are named under, ``token`` for CONNECTED, ``refused`` why an offered token re-claimed nothing, ``holder``
    the id of a connection of the same client still open with those names (close it and ask again)."""

    names: str
    token: str
    refused: str = ""
    holder: str = ""


class TemporaryNames:
    """Who holds which global names of temporary destinations, and who may take them back (spec/ha.md §4.7).

    A connection's temporaries are named ``tmp.<names>.<local>`` with ``names`` = ``<connection id>-<nonce>``,
    the nonce 64 random bits: unique in a process and across processes (connection ids start again at c1 in
    every process, so a ``tmp.c12.reply`` a responder kept across a restart or a takeover would otherwise
    name whichever new c12 made a ``reply``, and the reply would reach another user).  CONNECTED gives the
    connection a token, ``<connection id>.<nonce>.<mac>``, the mac an HMAC of (vhost, user, connection id,
    nonce) under a key kept in the store's catalog; a later connection offering it in CONNECT takes the same
    names again when (1) the mac verifies for *its* user and vhost (another principal re-claims nothing),
    (2) no other client holds them (a connection of the same client still open, a half-open link, is closed
    first: the token is only ever sent to that client), (3) within ``temporary_reclaim_ms`` of the link's
    loss here (a connection ended by DISCONNECT keeps nothing), or, for names this process never held
    (another process's: a restart, a takeover), of this process starting to serve, and (4) on the worker the
    names belong to.  Sans-IO: the clock is given."""

    def __init__(self, window_ms: int, clock: Callable[[], float]) -> None:
        self.window = window_ms / 1000
        self.clock = clock
        self.key: bytes | None = None
        self.serving_since = clock()
        self.held: dict[str, str] = {}          # names -> id of the connection holding them
        self.lost: dict[str, float] = {}        # names whose link was lost (no DISCONNECT) -> when
        #: names whose connection ended with DISCONNECT while this process serves its first window (past it, the
        #: window alone refuses what this process does not hold or keep, and the set is dropped)
        self.disconnected: set[str] = set()
        #: a connection handed over to this worker (spec/cores.md §2.4): the token its first worker's CONNECTED
        #: gave -> (the names it holds here, vhost, user); its client offers that token to come back
        self.aliases: dict[str, tuple[str, str, str]] = {}

    def start(self, key: bytes | None) -> bytes:
        """Serving from now on (after recovery: a takeover's new live too), with the store's key, or a new one
        to store when it had none (returned)."""
        self.key = key if key else secrets.token_bytes(32)
        self.serving_since = self.clock()
        return self.key

    def _mac(self, vhost: str, user: str, names: str) -> str:
        if self.key is None:
            self.start(None)
        assert self.key is not None
        message = "\0".join(("pymq-temporary-names", vhost, user, names)).encode("utf-8", "surrogatepass")
        digest = hmac.new(self.key, message, hashlib.sha256).digest()[:16]
        return base64.urlsafe_b64encode(digest).rstrip(b"=").decode("ascii")

    def issue(self, conn_id: str, vhost: str, user: str) -> Reclaimed:
        """New names for connection ``conn_id`` (no token offered, or one that re-claimed nothing)."""
        names = f"{conn_id}-{secrets.token_hex(8)}"
        while names in self.held or names in self.lost:       # 64 random bits: never, but cheap to be sure
            names = f"{conn_id}-{secrets.token_hex(8)}"
        self.held[names] = conn_id
        return Reclaimed(names, self._token(names, vhost, user))

    def _token(self, names: str, vhost: str, user: str) -> str:
        return names.replace("-", ".", 1) + "." + self._mac(vhost, user, names) if self.window else ""

    def token_of(self, names: str, vhost: str, user: str) -> str:
        """The token CONNECTED gave the holder of ``names`` ('' when re-claiming is off)."""
        return self._token(names, vhost, user)

    def alias(self, token: str, names: str, vhost: str, user: str) -> None:
        """A connection another worker handed over holds ``names`` here; its client knows ``token`` (that worker's
        CONNECTED): offered here by the same user in the same vhost, it re-claims ``names``. Bounded (MAX_KEPT)."""
        if not self.window or not token or len(token) > _MAX_TOKEN:
            return
        if len(self.aliases) >= MAX_KEPT:
            del self.aliases[next(iter(self.aliases))]
        self.aliases[token] = (names, vhost, user)

    def reclaim(self, token: str, conn_id: str, vhost: str, user: str) -> Reclaimed:
        """Connection ``conn_id`` of ``user`` offers ``token``: its old names, or new ones with why not."""
        aliased = self.aliases.get(token) if self.window else None
        if aliased is not None and aliased[1:] == (vhost, user):
            # the token of the worker this client's connection was handed over from: the names it got here, and
            # this worker's own token for them from now on
            names = aliased[0]
            token = self._token(names, vhost, user)
        else:
            checked = self._check(token, conn_id, vhost, user)
            if isinstance(checked, str):
                return self.issue(conn_id, vhost, user)._replace(refused=checked)
            names = checked.names
        holder = self.held.get(names)
        if holder is not None:
            return Reclaimed(names, token, holder=holder)
        if names in self.disconnected:
            return self.issue(conn_id, vhost, user)._replace(
                refused="the connection that held the names ended them with DISCONNECT")
        lost = self.lost.pop(names, None)
        since = self.serving_since if lost is None else lost
        if self.clock() - since > self.window:
            return self.issue(conn_id, vhost, user)._replace(
                refused=f"the names were not re-claimed within temporary_reclaim_ms ({self.window * 1000:.0f} ms)")
        self.held[names] = conn_id
        return Reclaimed(names, token)

    def _check(self, token: str, conn_id: str, vhost: str, user: str) -> Reclaimed | str:
        if not self.window:
            return "re-claiming temporary names is off (temporary_reclaim_ms: 0)"
        parts = token.split(".") if len(token) <= _MAX_TOKEN else []
        if len(parts) != 3 or not _CONNECTION_ID.fullmatch(parts[0]) or not _NONCE.fullmatch(parts[1]):
            return "the token is not one this broker gives"
        names = f"{parts[0]}-{parts[1]}"
        if not hmac.compare_digest(parts[2], self._mac(vhost, user, names)):
            # another user's token, or a forged one: the same answer, which tells nothing about either
            return "the token does not verify for this user"
        if _worker(parts[0]) != _worker(conn_id):
            return "the names belong to another worker of this broker (spec/cores.md)"
        return Reclaimed(names, token)

    def released(self, names: str, conn_id: str, lost: bool) -> None:
        """Connection ``conn_id`` ended; ``lost``: without DISCONNECT (its client may come back for them)."""
        if self.held.get(names) != conn_id:
            return
        del self.held[names]
        now = self.clock()
        if not lost:
            if now - self.serving_since <= self.window and len(self.disconnected) < MAX_KEPT:
                self.disconnected.add(names)
            elif self.disconnected:
                self.disconnected = set()
        elif self.window:
            if self.lost:                     # forget what can no longer be re-claimed (bounded: one window)
                stale = now - self.window
                for old in [n for n, at in self.lost.items() if at < stale]:
                    del self.lost[old]
            if len(self.lost) >= MAX_KEPT:
                del self.lost[next(iter(self.lost))]
            self.lost[names] = now


class Orphaned(NamedTuple):
    """The owner of a lost link's queue kept for a re-claim (spec/ha.md §4.7): no connection, in the lost
    link's vhost.  A SEND to the queue's global name reaches it from that vhost only, as while the link lived
    (``vhosts.same_vhost``: without it an orphan looked like the default vhost's, refusing its own vhost's
    replies and taking another's); nobody may consume from it until the re-claim (it is no client)."""

    vhost: str


def _worker(conn_id: str) -> str:
    return conn_id[:conn_id.index("c")]


class Temporaries:
    """The temporary queues and topics of :class:`~pymq_server.broker.destinations.Destinations` (a part of
    it): made, kept for a re-claim after a lost link, adopted, dropped, and reached by name."""

    config: BrokerConfig
    host: QueueHost
    temp_queues: dict[str, MessageQueue]
    orphaned: dict[str, tuple[int, dict[str, MessageQueue]]]
    orphaned_count: int
    _orphan_generation: int
    temp_topics: dict[str, Topic]
    name_holders: TemporaryNames
    generation: Generation
    #: a process's mark for a client the core is driven with directly (tests): sessions get their names at CONNECT
    incarnation: str

    def temporary_prefix(self, owner: Client) -> str:
        """The start of every global name of ``owner``'s temporary queues and topics."""
        return f"tmp.{getattr(owner, 'temporary_names', '') or f'{owner.id}-{self.incarnation}'}."

    # -- temporary queues --------------------------------------------------------------------------
    def create_temp_queue(self, owner: Client, local: str) -> MessageQueue:
        global_name = self.temporary_prefix(owner) + local
        path = "/temp-queue/" + global_name          # its name and its destination: one string, not two
        queue = MessageQueue(self.host, path, path, kind="temp", config=self.config.queue_defaults, durable=False)
        queue.owner = owner
        self.temp_queues[global_name] = queue
        return queue

    def orphan_temp_queues(self, names: str, queues: dict[str, MessageQueue]) -> int:
        """A link was lost (spec/ha.md §4.7): its temporary queues stay, owned by nobody, taking SENDs to their
        global names until the client re-claims ``names`` (:meth:`adopt_temp_queues`) or the window passes
        (:meth:`drop_orphaned`); past :data:`MAX_ORPHANED` kept queues they go at once, as without re-claim.
        Returns the generation the window's end must name (0: nothing kept)."""
        if not queues or self.orphaned_count + len(queues) > MAX_ORPHANED:
            for queue in queues.values():
                self.delete_temp_queue(queue)
            return 0
        for queue in queues.values():
            queue.owner = Orphaned(getattr(queue.owner, "vhost", vhosts.DEFAULT))
        self.generation.bump()      # a SEND's kept route to one of them asked its owner's vhost (routes.py)
        self._orphan_generation += 1
        self.orphaned[names] = (self._orphan_generation, dict(queues))
        self.orphaned_count += len(queues)
        return self._orphan_generation

    def adopt_temp_queues(self, names: str, owner: Client) -> dict[str, MessageQueue]:
        """``owner`` re-claimed ``names``: the kept queues (local name -> queue) are its own again."""
        kept = self.orphaned.pop(names, None)
        if kept is None:
            return {}
        self.orphaned_count -= len(kept[1])
        for queue in kept[1].values():
            queue.owner = owner
        self.generation.bump()
        return kept[1]

    def drop_orphaned(self, names: str, generation: int) -> None:
        """The re-claim window of ``names``' lost link passed: its kept queues go with their messages."""
        kept = self.orphaned.get(names)
        if kept is None or kept[0] != generation:
            return
        del self.orphaned[names]
        self.orphaned_count -= len(kept[1])
        for queue in kept[1].values():
            self.delete_temp_queue(queue)

    def delete_temp_queue(self, queue: MessageQueue) -> None:
        self.temp_queues.pop(queue.name[len("/temp-queue/"):], None)
        for consumer in list(queue.consumers):
            queue.remove_consumer(consumer)
        queue.purge()

    def temp_target(self, client: Client, name: str) -> MessageQueue:
        """The temporary queue a SEND names (:meth:`_reached`)."""
        return self._reached("queue", client, name)

    def owned_temp_queue(self, client: Client, destination: str, name: str, what: str) -> MessageQueue:
        """A temporary queue ``client`` may consume from or browse (:meth:`_owned`)."""
        return self._owned("queue", client, destination, name, what)

    # -- one rule for both kinds (``kind``: "queue" or "topic") --------------------------------------
    def _reached(self, kind: str, client: Client | None, name: str) -> Any:
        """The temporary queue or topic a SEND names: global names (``tmp.…``) while their connection lives,
        and from its vhost only (another vhost's is as if gone); a connection's own local names always (made
        on first use)."""
        if name.startswith("tmp.") or client is None:
            made = (self.temp_queues if kind == "queue" else self.temp_topics).get(name)
            if made is None or not vhosts.same_vhost(client, made.owner):
                raise UnknownDestination(f"temporary {kind} '/temp-{kind}/{name}' does not exist (its connection "
                                         f"has closed)", destination=f"/temp-{kind}/{name}")
            return made
        own = _own(client, kind, name, True)
        assert own is not None
        return own

    def _owned(self, kind: str, client: Client, destination: str, name: str, what: str) -> Any:
        """A temporary queue or topic ``client`` may consume from, subscribe to or browse: only the connection
        that made it (JMS); another connection learns nothing of it, not even whether it exists."""
        made = ((self.temp_queues if kind == "queue" else self.temp_topics).get(name) if name.startswith("tmp.")
                else _own(client, kind, name, True))
        if made is None or made.owner is not client:
            raise AccessDenied(f"only the connection that created temporary {kind} '{destination}' may "
                               f"{what} it", destination=destination)
        return made

    def delete_temporary(self, owner: Client, destination: str) -> None:
        """JMS ``TemporaryQueue.delete()``/``TemporaryTopic.delete()`` (spec/stomp.md §3): ``owner``'s own
        temporary queue or topic (by its local or its global name) goes with its messages; refused while
        it has a consumer or subscription, or when it is another connection's.  One never used is no-op."""
        kind, _, name = destination.partition("/")[2].partition("/")
        if kind not in ("temp-queue", "temp-topic") or not name:
            raise DestinationError(f"pymq-delete-temporary names a /temp-queue/ or /temp-topic/, not {destination!r}",
                                   destination=destination)
        if name.startswith("tmp."):
            own = self.temporary_prefix(owner)
            if not name.startswith(own):
                raise AccessDenied(f"only the connection that created temporary destination '{destination}' "
                                   f"may delete it", destination=destination)
            name = name[len(own):]
        held = _own(owner, kind[len("temp-"):], name, False)
        if held is None:
            return
        users = len(held.consumers) if kind == "temp-queue" else len(held.subscriptions)
        if users:
            raise IllegalStateError(f"temporary destination '{destination}' has {users} consumer(s); close them "
                                    f"before deleting it (JMS)", destination=destination)
        owner.forget_temporary(kind, name)
        if kind == "temp-queue":
            self.delete_temp_queue(held)
        else:
            self.forget_temp_topic(held)

    def create_temp_topic(self, owner: Client, local: str) -> Topic:
        global_name = self.temporary_prefix(owner) + local
        topic = Topic(global_name, "/temp-topic/")
        topic.owner = owner
        self.temp_topics[global_name] = topic
        return topic

    def forget_temp_topic(self, topic: Topic) -> None:
        self.temp_topics.pop(topic.name, None)

    def temp_topic_target(self, client: Client | None, name: str) -> Topic:
        """The temporary topic a SEND names (:meth:`_reached`)."""
        return self._reached("topic", client, name)

    def owned_temp_topic(self, client: Client, destination: str, name: str, what: str = "subscribe to") -> Topic:
        """A temporary topic ``client`` may subscribe to or browse (:meth:`_owned`)."""
        return self._owned("topic", client, destination, name, what)


def _own(client: Client, kind: str, local: str, create: bool) -> Any:
    """``client``'s own temporary queue or topic ``local`` (made on first use when ``create``)."""
    return client.temp_queue(local, create) if kind == "queue" else client.temp_topic(local, create)


class OwnTemporaries:
    """One connection's temporary queues and topics by local name, each charged to the connection's budget
    while it exists (spec/stomp.md §3): made on first use, adopted back by a re-claim, and at the end deleted
    or, for a lost link's queues, kept for its client's re-claim (spec/ha.md §4.7)."""

    __slots__ = ("session", "queues", "topics")

    def __init__(self, session: Any) -> None:
        self.session = session                  # a BrokerSession: its broker, holdings and temporary names
        self.queues: dict[str, MessageQueue] = {}
        self.topics: dict[str, Topic] = {}

    def __bool__(self) -> bool:
        return bool(self.queues or self.topics)

    def queue(self, local: str, create: bool) -> MessageQueue | None:
        return self._made(self.queues, local, create, self.session.broker.create_temp_queue)

    def topic(self, local: str, create: bool) -> Topic | None:
        return self._made(self.topics, local, create, self.session.broker.create_temp_topic)

    def _made(self, made: dict, local: str, create: bool, make: Callable[[Any, str], Any]) -> Any:
        if local not in made and create:
            self.session.holdings.temporary(local)
            made[local] = make(self.session, local)
        return made.get(local)

    def forget(self, kind: str, local: str) -> None:
        """JMS ``delete()`` of one (``temp-queue``/``temp-topic``): its charge goes back."""
        if (self.queues if kind == "temp-queue" else self.topics).pop(local, None) is not None:
            self.session.holdings.temporary_gone(local)

    def adopt(self, names: str) -> None:
        """A re-claim granted: the queues kept under ``names`` are this connection's again, each charged to its
        budget (one that does not fit is deleted)."""
        session = self.session
        for local, queue in session.broker.adopt_temporaries(session, names).items():
            try:
                session.holdings.temporary(local)
            except PymqError:
                session.broker.delete_temp_queue(queue)
                continue
            self.queues[local] = queue

    def end(self, lost: bool, refused: bool) -> None:
        """The connection ended (``lost``: without DISCONNECT; ``refused``: by the broker's ERROR)."""
        session = self.session
        broker = session.broker
        for topic in list(self.topics.values()):
            broker.delete_temp_topic(topic)
        self.topics.clear()
        queues, self.queues = self.queues, {}
        if session.temporary_names:
            broker.temporary_names_released(session, session.temporary_names, lost, queues, keep=not refused)
        else:
            for queue in queues.values():
                broker.delete_temp_queue(queue)
