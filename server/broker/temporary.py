"""Temporary topics (``/temp-topic/``, JMS ``TemporaryTopic``), part of the destinations layer: a connection's
topics, named ``tmp.<connection>-<incarnation>.<name>`` once shared in a ``reply-to``; anyone may publish to one while
its connection lives, only that connection subscribes (spec/stomp.md §3).  Also JMS ``delete()`` of a
connection's temporary queues and topics.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from pymq_server.broker.topic import Topic

from pymq.errors import AccessDenied, DestinationError, IllegalStateError, UnknownDestination

if TYPE_CHECKING:
    from pymq_server.broker.clients import Client
    from pymq_server.broker.queue import MessageQueue


class TemporaryTopics:
    """The temporary topics of :class:`~pymq_server.broker.destinations.Destinations` (a part of it)."""

    temp_topics: dict[str, Topic]
    #: this broker process's mark in global temporary names. Connection ids start again at c1 in every process,
    #: so without it a ``tmp.c12.reply`` a responder kept across a restart or a takeover would name whichever
    #: new connection c12 made a ``reply``, and the reply would reach another user (spec/stomp.md §3)
    incarnation: str

    def temporary_prefix(self, owner: Client) -> str:
        """The start of every global name of ``owner``'s temporary queues and topics."""
        return f"tmp.{owner.id}-{self.incarnation}."

    def delete_temp_queue(self, queue: MessageQueue) -> None: ...

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
        held = owner.temp_queue(name, create=False) if kind == "temp-queue" else owner.temp_topic(name, create=False)
        if held is None:
            return
        users = len(held.consumers) if kind == "temp-queue" else len(held.subscriptions)  # type: ignore[union-attr]
        if users:
            raise IllegalStateError(f"temporary destination '{destination}' has {users} consumer(s); close them "
                                    f"before deleting it (JMS)", destination=destination)
        owner.forget_temporary(kind, name)
        if kind == "temp-queue":
            self.delete_temp_queue(held)  # type: ignore[arg-type]
        else:
            self.forget_temp_topic(held)  # type: ignore[arg-type]

    def create_temp_topic(self, owner: Client, local: str) -> Topic:
        global_name = self.temporary_prefix(owner) + local
        topic = Topic(global_name, "/temp-topic/")
        topic.owner = owner
        self.temp_topics[global_name] = topic
        return topic

    def forget_temp_topic(self, topic: Topic) -> None:
        self.temp_topics.pop(topic.name, None)

    def temp_topic_target(self, client: Client | None, name: str) -> Topic:
        """The temporary topic a SEND names: global names (``tmp.…``) while their connection lives, a
        connection's own local names always."""
        if name.startswith("tmp.") or client is None:
            topic = self.temp_topics.get(name)
            if topic is None:
                raise UnknownDestination(f"temporary topic '/temp-topic/{name}' does not exist "
                                         f"(its connection has closed)", destination="/temp-topic/" + name)
            return topic
        own = client.temp_topic(name)
        assert own is not None
        return own

    def owned_temp_topic(self, client: Client, destination: str, name: str, what: str = "subscribe to") -> Topic:
        """A temporary topic ``client`` may subscribe to or browse: only the connection that made it (JMS);
        another connection learns nothing of it, not even whether it exists."""
        topic = self.temp_topics.get(name) if name.startswith("tmp.") else client.temp_topic(name)
        if topic is None or topic.owner is not client:
            raise AccessDenied(f"only the connection that created temporary topic '{destination}' may "
                               f"{what} it", destination=destination)
        return topic
