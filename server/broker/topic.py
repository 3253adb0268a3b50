"""Topics: every current subscription gets the message, as one shared object.

A subscription is a :class:`MessageQueue` of kind "subscription" plus a filter (selector, no-local).
Non-durable subscriptions live as long as their SUBSCRIBE; durable ones are named (client id + name),
kept in the catalog and keep receiving while their subscriber is away; shared ones (JMS 2.0) have several
consumers on one subscription queue.  Filters run once per subscription at publish time, so a
subscriber never holds entries it would not accept.

A subscription to a pattern (``/topic/stocks.*``, spec/routing.md §5) belongs to a *pattern topic*, named
by the pattern's normal form, which is never published to: a message published to a topic goes to the
topic's own subscriptions and to those of every pattern topic whose pattern matches its name
(:class:`TopicPatterns`, one compiled :class:`~pymq.routing.topics.PatternIndex` per broker). Durable and
shared subscriptions, selectors and no-local work the same on both, since a pattern topic is a topic.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from pymq.routing.topics import PatternIndex
from pymq_server.broker.vhosts import PREFIX as VHOST_PREFIX
from pymq_server.broker.queue import MessageQueue

if TYPE_CHECKING:
    from pymq_server.broker.clients import Client


class TopicSubscription:
    __slots__ = ("topic", "name", "queue", "selector", "no_local", "owner", "durable", "shared",
                 "client_id", "user", "cost")

    def __init__(self, topic: Topic, name: str, queue: MessageQueue, selector=None,
                 no_local: bool = False, owner=None, durable: bool = False, shared: bool = False,
                 client_id: str | None = None) -> None:
        self.topic = topic
        self.name = name
        self.queue = queue
        self.selector = selector
        self.no_local = no_local
        self.owner = owner          # the connection id whose own messages no-local skips
        self.durable = durable
        self.shared = shared
        self.client_id = client_id
        self.user: str | None = None        # a durable one's creator, whose budget it is charged to ...
        self.cost = 0                       # ... this much (budgets.py)

    def wants(self, message) -> bool:
        if self.no_local and message.producer == self.owner:
            return False
        selector = self.selector
        return selector is None or selector.matches(message.selector_values())


class TopicPatterns:
    """The pattern topics that have subscriptions, and which of them a topic name matches.

    The index holds a pattern while its topic has at least one subscription; every change bumps
    :attr:`version`, so a topic remembers the pattern topics it matched until the patterns change (one
    trie walk per topic and change, not per message)."""

    __slots__ = ("index", "topics", "version", "clock")

    def __init__(self) -> None:
        self.index = PatternIndex()
        self.topics: dict[str, Topic] = {}      # normal form -> pattern topic with subscriptions
        self.version = 0
        #: the highest sequence number given to a message a pattern subscription may receive (None: not
        #: known yet since start). A pattern subscription's queue holds messages of many topics, each
        #: numbered by its own topic, and a queue is kept in sequence order: so such a message's number
        #: is at least this + 1 (gaps in a topic's numbers are allowed, going backwards never is), and
        #: the pattern subscription sees its messages in the order they were published.
        self.clock: int | None = None

    def subscribed(self, topic: Topic) -> None:
        self.index.add(topic.name)
        self.topics[topic.name] = topic
        self.version += 1

    def unsubscribed(self, topic: Topic) -> None:
        self.index.remove(topic.name)
        self.topics.pop(topic.name, None)
        self.version += 1

    def matching(self, name: str) -> list[Topic]:
        topics = self.topics
        return [topics[p] for p in self.index.match(name)]


class Topic:
    def __init__(self, name: str, prefix: str = "/topic/", patterns: TopicPatterns | None = None,
                 pattern: bool = False) -> None:
        self.name = name
        self.destination = prefix + name
        self.subscriptions: dict[str, TopicSubscription] = {}
        self.published = 0
        self.owner: Client | None = None   # the connection of a temporary topic (/temp-topic/): gone with it
        self.temporary = prefix != "/topic/"
        #: a pattern topic (``stocks.*``): subscribed to, never published to
        self.pattern = pattern
        self._patterns = patterns
        self._matched: tuple[int, list[Topic]] = (-1, [])

    def matched(self) -> list[Topic]:
        """The pattern topics with subscriptions whose pattern matches this topic's name."""
        patterns = self._patterns
        if patterns is None or not patterns.topics or self.pattern:
            return []
        version, matched = self._matched
        if version != patterns.version:
            matched = patterns.matching(self.name)
            if self.name.startswith(VHOST_PREFIX):
                # a virtual host's topic ('$vh.<vhost>.<name>', vhosts.py): only its own vhost's patterns,
                # which start with the same words; a default-vhost pattern ('#', '*.x.#') never reaches it
                matched = [t for t in matched if t.name.startswith(VHOST_PREFIX)]
            self._matched = (patterns.version, matched)
        return matched

    @property
    def patterns(self) -> TopicPatterns | None:
        return self._patterns

    def targets(self, message, matched: list[Topic]) -> list[TopicSubscription]:
        """The subscriptions that take ``message``: this topic's and those of ``matched`` (:meth:`matched`,
        asked once by the caller, which also needs it for the pattern clock: placement.py)."""
        out = [sub for sub in self.subscriptions.values() if sub.wants(message)]
        for topic in matched:
            out += [sub for sub in topic.subscriptions.values() if sub.wants(message)]
        return out

    def add(self, sub: TopicSubscription) -> None:
        first = not self.subscriptions
        self.subscriptions[sub.name] = sub
        if first and self.pattern and self._patterns is not None:
            self._patterns.subscribed(self)

    def remove(self, name: str) -> TopicSubscription | None:
        sub = self.subscriptions.pop(name, None)
        if sub is not None and not self.subscriptions and self.pattern and self._patterns is not None:
            self._patterns.unsubscribed(self)
        return sub
