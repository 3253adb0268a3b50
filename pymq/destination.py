"""Destinations as the SDK names them: ``Queue("orders")``, ``Topic("prices")``, temporary queues and topics.

A destination is a value (frozen, hashable).  ``str(Queue("orders")) == "/queue/orders"`` is its STOMP
name; :func:`as_destination` also accepts those strings, so ``session.create_producer("/topic/x")``
works as well as ``session.create_producer(pymq.Topic("x"))``.
"""
from __future__ import annotations

from dataclasses import dataclass

from pymq.errors import DestinationError


@dataclass(frozen=True)
class Destination:
    name: str
    prefix = ""

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise DestinationError(f"{type(self).__name__} needs a non-empty name, got {self.name!r}")

    @property
    def stomp_name(self) -> str:
        return self.prefix + self.name

    def __str__(self) -> str:
        return self.stomp_name


@dataclass(frozen=True)
class Queue(Destination):
    prefix = "/queue/"


@dataclass(frozen=True)
class Topic(Destination):
    prefix = "/topic/"


@dataclass(frozen=True)
class TemporaryQueue(Queue):
    """A queue that lives as long as the connection that created it; only that connection consumes."""

    prefix = "/temp-queue/"


@dataclass(frozen=True)
class TemporaryTopic(Topic):
    """A topic that lives as long as the connection that created it (JMS ``TemporaryTopic``): anyone may
    publish to it, only that connection subscribes; its subscriptions go with the connection."""

    prefix = "/temp-topic/"


def as_destination(value: Destination | str) -> Destination:
    if isinstance(value, Destination):
        return value
    if isinstance(value, str):
        for cls in (TemporaryQueue, TemporaryTopic, Queue, Topic):
            if value.startswith(cls.prefix):
                return cls(value[len(cls.prefix):])
        raise DestinationError(f"destination {value!r} must be a Queue, a Topic, or a string starting "
                               f"with /queue/, /topic/, /temp-queue/ or /temp-topic/")
    raise DestinationError(f"expected a destination, got {type(value).__name__}")
