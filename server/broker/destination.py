"""Destination names: what a STOMP ``destination`` header may name, and how it is checked.

``/queue/<name>`` (point to point), ``/topic/<name>`` (publish/subscribe), ``/temp-queue/<name>`` and
``/temp-topic/<name>`` (consumed only by the connection that uses it first, gone with it; see
:mod:`server.broker.session`).  Anything else is
refused with a message that lists the accepted prefixes, rather than silently creating an address no
consumer will ever look at.
"""
from __future__ import annotations


from pymq import enums
from pymq.errors import DestinationError


class Kind(enums.Enum):
    QUEUE = "queue"
    TOPIC = "topic"
    TEMP_QUEUE = "temp-queue"
    TEMP_TOPIC = "temp-topic"


PREFIXES = {"/queue/": Kind.QUEUE, "/topic/": Kind.TOPIC, "/temp-queue/": Kind.TEMP_QUEUE,
            "/temp-topic/": Kind.TEMP_TOPIC}
MAX_NAME = 255
#: where administration requests go over STOMP (spec/admin.md); the session hands them to the broker's
#: admin interface (Broker.admin_frames, set by the server: server/admin/stomp_admin.py)
ADMIN_DESTINATION = "/pymq/admin"


def parse(destination: str) -> tuple[Kind, str]:
    """``"/queue/orders"`` -> (Kind.QUEUE, "orders"); raises DestinationError with the reason."""
    for prefix, kind in PREFIXES.items():
        if destination.startswith(prefix):
            name = destination[len(prefix):]
            check_name(name, destination)
            return kind, name
    raise DestinationError(f"destination {destination!r} must start with /queue/, /topic/, /temp-queue/ "
                           f"or /temp-topic/", destination=destination)


def check_name(name: str, destination: str) -> None:
    if not name:
        raise DestinationError(f"destination {destination!r} has an empty name", destination=destination)
    if len(name) > MAX_NAME:
        raise DestinationError(f"destination name is {len(name)} characters long, more than {MAX_NAME}",
                               destination=destination[:80])
    if any(ord(ch) < 32 for ch in name):
        raise DestinationError(f"destination {destination!r} contains a control character",
                               destination=destination)
