"""Topic patterns: the one wildcard syntax of pymq (spec/routing.md §5), and the matcher API.

A topic name is words separated by ``.``. In a pattern, the word ``*`` is exactly one word, ``#`` zero or
more words, and ActiveMQ's ``>`` is read as ``#`` (``stocks.*`` matches ``stocks.ibm``; ``stocks.#`` and
``stocks.>`` match ``stocks``, ``stocks.ibm`` and ``stocks.nyse.ibm``). A wildcard is a whole word: inside
a word ``*``, ``#`` and ``>`` are ordinary characters, so ``a*b`` is a plain name. A name with a wildcard
word is a pattern: it can be subscribed to, granted on and read by, never published to; there is no
escape (a topic cannot be called ``*``).

The matcher, for the broker, the Spark connectors and the cluster's subscription filters:

* :class:`PatternIndex` (compiled, with its pure twin): patterns held with a count, and for a topic name
  every held pattern that matches it — the broker's wildcard subscriptions on every publish to a topic it
  has not seen since its patterns changed;
* :class:`TopicPattern`: one compiled pattern (``matches``, its ``words``, its ``literal_prefix``: the words
  before its first wildcard, which every topic it matches starts with);
* :func:`covers`: whether every topic one pattern matches is matched by another (a grant on ``stocks.*``
  covers a subscription to ``stocks.ibm`` and to ``stocks.*``, not to ``stocks.#`` nor ``#``);
* :func:`is_pattern`, :func:`normalize`, :func:`matches`.
"""
from __future__ import annotations

from types import ModuleType

from pymq._accel import NO_EXTENSIONS, note_missing
from pymq.routing import _topics_py as _py
from pymq.routing._topics_py import MANY, MANY_ACTIVEMQ, ONE, SEPARATOR

try:
    if NO_EXTENSIONS:
        raise ImportError("PYMQ_NO_EXTENSIONS=1")
    from pymq.routing import _topics_c as _c
    from pymq.routing._topics_c import PatternIndex, matches, normalize
except ImportError:
    _c = None  # type: ignore[assignment]
    note_missing("pymq.routing._topics_c")
    from pymq.routing._topics_py import PatternIndex, matches, normalize  # type: ignore[assignment]

IMPLEMENTATIONS: dict[str, ModuleType] = {"py": _py} if _c is None else {"py": _py, "c": _c}
#: the module in use: ``pymq.routing._topics_c`` or ``pymq.routing._topics_py``
implementation: ModuleType = _c if _c is not None else _py

WILDCARDS = frozenset({ONE, MANY, MANY_ACTIVEMQ})
#: the most states :func:`covers` explores before it answers "not covered" (a refusal is the safe answer)
COVERS_LIMIT = 100_000

__all__ = ["IMPLEMENTATIONS", "implementation", "PatternIndex", "TopicPattern", "matches", "normalize",
           "is_pattern", "covers", "SEPARATOR", "ONE", "MANY", "MANY_ACTIVEMQ", "WILDCARDS"]


def is_pattern(name: str) -> bool:
    """``name`` has a wildcard word (``*``, ``#`` or ``>``): a pattern, not a topic one can publish to."""
    return any(word in WILDCARDS for word in name.split(SEPARATOR))


class TopicPattern:
    """One pattern, compiled once: ``matches(topic)`` as often as needed."""

    __slots__ = ("text", "words", "_index")

    def __init__(self, pattern: str) -> None:
        self.text = normalize(pattern)
        self.words: tuple[str, ...] = tuple(self.text.split(SEPARATOR))
        self._index = PatternIndex()
        self._index.add(self.text)

    @property
    def literal_prefix(self) -> tuple[str, ...]:
        """The words before the first wildcard: every topic the pattern matches starts with them (the cluster's
        subscription filters can advertise them instead of match-all; spec/routing.md §3.5)."""
        out = []
        for word in self.words:
            if word == ONE or word == MANY:
                break
            out.append(word)
        return tuple(out)

    @property
    def is_pattern(self) -> bool:
        return any(word == ONE or word == MANY for word in self.words)

    def matches(self, topic: str) -> bool:
        return bool(self._index.match(topic))

    def __repr__(self) -> str:
        return f"TopicPattern({self.text!r})"


def covers(general: str, specific: str) -> bool:
    """Every topic name ``specific`` matches is matched by ``general`` (each a pattern or a plain name).

    Decided exactly over a finite alphabet: the literal words of both patterns and one word neither names
    stand for every word there is (the patterns cannot tell other words apart), and the pairs (a state of
    ``specific``'s automaton, the set of states ``general``'s can be in) reachable on that alphabet are
    explored; ``specific`` reaching its end where ``general`` cannot is a topic only ``specific`` matches.
    At most :data:`COVERS_LIMIT` pairs are explored: past it the answer is False (a grant check refuses)."""
    g = tuple(normalize(general).split(SEPARATOR))
    s = tuple(normalize(specific).split(SEPARATOR))
    if g == s or g == (MANY,):
        return True
    fresh = object()                        # a word neither pattern names
    alphabet: list[object] = sorted({w for w in g + s if w not in (ONE, MANY)}) + [fresh]

    def closure(words: tuple[str, ...], states: frozenset[int] | set[int]) -> frozenset[int]:
        out = set(states)
        todo = list(states)
        while todo:
            i = todo.pop()
            if i < len(words) and words[i] == MANY and i + 1 not in out:   # '#' takes no word
                out.add(i + 1)
                todo.append(i + 1)
        return frozenset(out)

    def step(words: tuple[str, ...], states: frozenset[int], word: object) -> frozenset[int]:
        after: set[int] = set()
        for i in states:
            if i < len(words):
                w = words[i]
                if w == MANY:
                    after.add(i)            # '#' takes this word and may take more
                elif w == ONE or w == word:
                    after.add(i + 1)
        return closure(words, after)

    # a topic name has at least one word ("" is one empty word): only pairs reached by a word are judged
    start = (closure(s, {0}), closure(g, {0}), False)
    seen = {start}
    todo = [start]
    while todo:
        s_states, g_states, named = todo.pop()
        if named and len(s) in s_states and len(g) not in g_states:
            return False                    # a topic ``specific`` matches and ``general`` does not
        for word in alphabet:
            s_next = step(s, s_states, word)
            if not s_next:
                continue
            pair = (s_next, step(g, g_states, word), True)
            if pair not in seen:
                if len(seen) >= COVERS_LIMIT:
                    return False
                seen.add(pair)
                todo.append(pair)
    return True
