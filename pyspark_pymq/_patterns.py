"""``destinationPattern``: which of the broker's destinations a query reads (spec/spark.md §2.1).

One or more comma-separated ``/topic/<pattern>`` or ``/queue/<pattern>``; the pattern is matched against
the destination's name with the broker's own wildcard syntax and matcher (spec/routing.md §5,
``pymq.routing.topics``: ``.`` between words, ``*`` one word, ``#`` zero or more, ``>`` read as ``#``), for
queue names as for topic names.  A word with ``*``, ``?`` or ``[`` inside it is refused rather than read
literally: it is what a glob looked like when ``destinationPattern`` was one, and a literal reading would
turn such a query into one that silently reads nothing.  The JVM source has the same rules
(``io.pymq.spark.DestinationPattern``); both run the ``destination_patterns`` vectors of spec/vectors/spark.json.
"""
from __future__ import annotations

from pymq.errors import ConfigError
from pymq.routing.topics import MANY, MANY_ACTIVEMQ, ONE, SEPARATOR, TopicPattern

KINDS = ("/topic/", "/queue/")
#: characters a glob gave meaning to; inside a word they mark an old glob
_GLOB = frozenset("*?[")
SYNTAX = ("/topic/<pattern> or /queue/<pattern>, comma-separated (spec/routing.md §5: '.' between words, "
          "'*' one word, '#' or '>' zero or more words)")


class DestinationPattern:
    """A parsed ``destinationPattern``: ``matches(stomp_name)``."""

    __slots__ = ("text", "parts")

    def __init__(self, text: str) -> None:
        self.text = text
        parts: list[tuple[str, TopicPattern]] = []
        for item in text.split(","):
            item = item.strip()
            kind = next((k for k in KINDS if item.startswith(k)), None)
            if kind is None:
                raise ConfigError(f"option 'destinationPattern' takes {SYNTAX}; got {item!r}")
            pattern = item[len(kind):]
            if not pattern:
                raise ConfigError(f"option 'destinationPattern' has no pattern after {kind!r} in {text!r}")
            for word in pattern.split(SEPARATOR):
                if word not in (ONE, MANY, MANY_ACTIVEMQ) and not _GLOB.isdisjoint(word):
                    raise ConfigError(
                        f"option 'destinationPattern' uses the broker's wildcard syntax, not a glob: in {item!r} "
                        f"the word {word!r} has '*', '?' or '[' inside it (a glob before); write {SYNTAX}, such as "
                        f"'{kind}orders.#', or name the destinations with 'queue', 'topic' or 'destinations'")
            parts.append((kind, TopicPattern(pattern)))
        self.parts = tuple(parts)

    @property
    def topics_only(self) -> bool:
        return all(kind == "/topic/" for kind, _ in self.parts)

    def matches(self, name: str) -> bool:
        return any(name.startswith(kind) and pattern.matches(name[len(kind):]) for kind, pattern in self.parts)

    def __repr__(self) -> str:
        return f"DestinationPattern({self.text!r})"
