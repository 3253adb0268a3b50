"""Destinations as the SDK names them: ``Queue("orders")``, ``Topic("prices")``, temporary queues and topics.

A destination is a value (frozen, hashable).  ``str(Queue("orders")) == "/queue/orders"`` is its STOMP
name; :func:`as_destination` also accepts those strings, so ``session.create_producer("/topic/x")``
works as well as ``session.create_producer(pymq.Topic("x"))``.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from pymq.errors import DestinationError, IllegalStateError


class _TemporaryOwner(Protocol):
    """The connection that made a temporary destination (both SDKs' connections)."""

    def _delete_temporary(self, destination: Destination) -> None: ...


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


def _delete(destination: TemporaryQueue | TemporaryTopic) -> None:
    owner = destination._owner
    if owner is None:
        raise IllegalStateError(f"{destination} was not made by this process's session (it came from a "
                                f"message or a name): only the connection that created it may delete it")
    owner._delete_temporary(destination)


@dataclass(frozen=True)
class TemporaryQueue(Queue):
    """A queue that lives as long as the connection that created it; only that connection consumes.
    ``Session.create_temporary_queue()`` makes one bound to its connection, which ``delete()`` needs."""

    _owner: _TemporaryOwner | None = field(default=None, compare=False, hash=False, repr=False)
    prefix = "/temp-queue/"

    def delete(self) -> None:
        """Delete it now, with the messages it holds (JMS ``TemporaryQueue.delete()``): refused with
        IllegalStateError while a consumer of its connection reads it.  Using it afterwards is refused
        too.  A plain call in both SDKs: the broker applies it before anything the connection sends later."""
        _delete(self)


@dataclass(frozen=True)
class TemporaryTopic(Topic):
    """A topic that lives as long as the connection that created it (JMS ``TemporaryTopic``): anyone may
    publish to it, only that connection subscribes; its subscriptions go with the connection."""

    _owner: _TemporaryOwner | None = field(default=None, compare=False, hash=False, repr=False)
    prefix = "/temp-topic/"

    def delete(self) -> None:
        """Delete it now (JMS ``TemporaryTopic.delete()``): refused with IllegalStateError while its
        connection has a consumer on it.  Using it afterwards is refused too.  A plain call in both SDKs."""
        _delete(self)


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
