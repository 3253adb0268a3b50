"""A client connection as the broker core sees it: what the layers below the session may ask of one.

The session (session.py) is the only implementation; the core names this protocol instead, so a layer
never reaches into a session's private state and tests can drive the core with a small fake.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from pymq_server.broker.auth import User
    from pymq_server.broker.consumer import Consumer
    from pymq_server.broker.queue import Entry, MessageQueue
    from pymq_server.broker.routes import Routes
    from pymq_server.broker.topic import Topic


class Client(Protocol):
    id: str                          # the connection id ("c12"): no-local and temporary queue names use it
    client_id: str | None            # JMS client id: scopes durable subscriptions
    user: User                       # the authenticated principal (auth.ANONYMOUS before CONNECT)
    closed: bool
    writable: bool                   # its link can take more (backpressure: no deliveries while False)
    is_cluster: bool                 # another node of the cluster (its messages may carry ``pymq-forwarded``)
    routes: Routes                   # what its SENDs to each destination decided (router.py, routes.py)

    def temp_queue(self, local: str, create: bool = True) -> MessageQueue | None:
        """This connection's temporary queue ``/temp-queue/<local>``."""
        ...

    def temp_topic(self, local: str, create: bool = True) -> Topic | None:
        """This connection's temporary topic ``/temp-topic/<local>``."""
        ...

    def forget_temporary(self, kind: str, local: str) -> None:
        """Its temporary ``kind`` (``temp-queue``/``temp-topic``) ``local`` was deleted (JMS ``delete()``)."""
        ...

    def pause_input(self, reason: str) -> None: ...

    def resume_input(self, reason: str) -> None: ...

    def deliver(self, consumer: Consumer, entry: Entry) -> None:
        """Write one MESSAGE for ``entry`` to ``consumer``."""
        ...

    def forget_delivery(self, consumer: Consumer, entry: Entry) -> None:
        """The broker took a delivery back (delivery timeout): a late ACK for it is ignored."""
        ...

    def close(self) -> None:
        """Close the connection (the broker stops, an administrator closes it)."""
        ...


def own_reply_to(client: Client, reply_to: str) -> str | None:
    """The global name (``/temp-queue/tmp.<connection>.<local>``) of ``client``'s own temporary queue or topic
    a ``reply-to`` names by its local name, made on first use so that others can reply to it (spec/stomp.md
    §3); None when ``reply_to`` is already global. One rule for every place a SEND enters: the router, and a
    multi-worker home that forwards the SEND to another worker (server/cores/home.py)."""
    if reply_to.startswith("/temp-queue/"):
        local = reply_to[len("/temp-queue/"):]
        if local.startswith("tmp."):
            return None
        queue = client.temp_queue(local)
        assert queue is not None
        return queue.destination
    local = reply_to[len("/temp-topic/"):]
    if local.startswith("tmp."):
        return None
    topic = client.temp_topic(local)
    assert topic is not None
    return topic.destination


def durable_owner(client: Client) -> str:
    """Who owns a client's durable subscriptions: its client id, else its user (spec/stomp.md §4); in a
    virtual host other than ``/``, that within the vhost (``<vhost>/<owner>``: the same client id in two
    vhosts owns two sets of subscriptions)."""
    owner = client.client_id or client.user.name
    vhost = getattr(client, "vhost", "/")
    return owner if vhost == "/" else f"{vhost}/{owner}"
