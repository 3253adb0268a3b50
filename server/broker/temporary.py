"""Temporary topics (``/temp-topic/``, JMS ``TemporaryTopic``), part of the destinations layer: a connection's
topics, named ``tmp.<connection>.<name>`` once shared in a ``reply-to``; anyone may publish to one while
its connection lives, only that connection subscribes (spec/stomp.md §3).
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from pymq_server.broker.topic import Topic

from pymq.errors import AccessDenied, UnknownDestination

if TYPE_CHECKING:
    from pymq_server.broker.clients import Client


class TemporaryTopics:
    """The temporary topics of :class:`~pymq_server.broker.destinations.Destinations` (a part of it)."""

    temp_topics: dict[str, Topic]

    def create_temp_topic(self, owner: Client, local: str) -> Topic:
        global_name = f"tmp.{owner.id}.{local}"
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
