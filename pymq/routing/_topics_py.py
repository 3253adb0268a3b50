"""Topic patterns matched against topic names (the pure-Python twin of ``_ext/topics.pyx``).

The syntax (spec/routing.md §5): a topic name is words separated by ``.``; in a pattern the word ``*``
stands for exactly one word and ``#`` for zero or more words, and ActiveMQ's ``>`` is read as ``#``. A
wildcard is a whole word: ``a*b`` is an ordinary word. Patterns are matched in their normal form
(:func:`normalize`: ``>`` written ``#``, runs of ``#`` one ``#``), so ``stocks.>`` and ``stocks.#`` are one
pattern.

:class:`PatternIndex` holds the patterns of a broker's wildcard subscriptions and answers, for a topic
name, every pattern that matches it: a trie over the patterns' words walked as a non-deterministic
automaton, one step per word of the topic (the set of trie nodes the words so far can reach, each node
once per step: its ``stamp``). A topic of ``w`` words costs at most ``w`` × (trie nodes) steps whatever the
patterns, so no pattern (``#.#.#...`` included) can make a match backtrack. Not thread-safe: a broker
calls it from its one thread.
"""
from __future__ import annotations

IMPLEMENTATION = "py"

SEPARATOR = "."
ONE = "*"
MANY = "#"
#: ActiveMQ's spelling of ``#``
MANY_ACTIVEMQ = ">"


def normalize(pattern: str) -> str:
    """The normal form of a pattern: ``>`` written ``#``, consecutive ``#`` words one ``#`` (they match the
    same topics). A name without wildcards is its own normal form."""
    out: list[str] = []
    for word in pattern.split(SEPARATOR):
        if word == MANY_ACTIVEMQ:
            word = MANY
        if word == MANY and out and out[-1] == MANY:
            continue
        out.append(word)
    return SEPARATOR.join(out)


class _Node:
    __slots__ = ("children", "one", "many", "loops", "pattern", "count", "stamp")

    def __init__(self, loops: bool = False) -> None:
        self.children: dict[str, _Node] | None = None   # literal word -> node
        self.one: _Node | None = None                    # the '*' edge
        self.many: _Node | None = None                   # the '#' edge
        self.loops = loops                               # reached by '#': it takes further words itself
        self.pattern: str | None = None                  # the pattern ending here
        self.count = 0                                   # how many times it was added
        self.stamp = 0


class PatternIndex:
    """Patterns (normal form, with a count each) and, for a topic name, the patterns that match it."""

    def __init__(self) -> None:
        self._root = _Node()
        self._patterns: dict[str, int] = {}
        self._gen = 0

    def __len__(self) -> int:
        """How many distinct patterns are held."""
        return len(self._patterns)

    def __contains__(self, pattern: object) -> bool:
        return isinstance(pattern, str) and normalize(pattern) in self._patterns

    def patterns(self) -> list[str]:
        """The distinct patterns held, in normal form, sorted."""
        return sorted(self._patterns)

    def add(self, pattern: str) -> str:
        """Hold ``pattern`` once more; returns its normal form."""
        key = normalize(pattern)
        node = self._root
        for word in key.split(SEPARATOR):
            if word == ONE:
                if node.one is None:
                    node.one = _Node()
                node = node.one
            elif word == MANY:
                if node.many is None:
                    node.many = _Node(loops=True)
                node = node.many
            else:
                if node.children is None:
                    node.children = {}
                child = node.children.get(word)
                if child is None:
                    child = node.children[word] = _Node()
                node = child
        node.pattern = key
        node.count += 1
        self._patterns[key] = node.count
        return key

    def remove(self, pattern: str) -> bool:
        """Hold ``pattern`` once less; False when it was not held. Branches left empty are cut."""
        key = normalize(pattern)
        if key not in self._patterns:
            return False
        path: list[tuple[_Node, str]] = []
        node = self._root
        for word in key.split(SEPARATOR):
            path.append((node, word))
            if word == ONE:
                node = node.one  # type: ignore[assignment]
            elif word == MANY:
                node = node.many  # type: ignore[assignment]
            else:
                node = node.children[word]  # type: ignore[index]
        node.count -= 1
        if node.count:
            self._patterns[key] = node.count
            return True
        del self._patterns[key]
        node.pattern = None
        # cut the nodes nothing ends at and nothing goes through any more, from the leaf up
        for parent, word in reversed(path):
            if node.pattern is not None or node.children or node.one is not None or node.many is not None:
                break
            if word == ONE:
                parent.one = None
            elif word == MANY:
                parent.many = None
            else:
                del parent.children[word]  # type: ignore[union-attr]
                if not parent.children:
                    parent.children = None
            node = parent
        return True

    def match(self, topic: str) -> list[str]:
        """Every held pattern that matches ``topic`` (each once, in no particular order)."""
        if not self._patterns:
            return []
        self._gen += 1
        current: list[_Node] = []
        _enter(self._root, current, self._gen)
        for word in topic.split(SEPARATOR):
            self._gen += 1
            gen = self._gen
            following: list[_Node] = []
            for node in current:
                children = node.children
                if children is not None:
                    child = children.get(word)
                    if child is not None:
                        _enter(child, following, gen)
                if node.one is not None:
                    _enter(node.one, following, gen)
                if node.loops:
                    _enter(node, following, gen)        # its '#' takes this word too
            if not following:
                return []
            current = following
        return [node.pattern for node in current if node.pattern is not None]


def _enter(node: _Node | None, into: list[_Node], gen: int) -> None:
    """``node`` is reached: it, and the '#' nodes below it (a '#' may take no word at all), join ``into``
    once per step."""
    while node is not None and node.stamp != gen:
        node.stamp = gen
        into.append(node)
        node = node.many


def matches(pattern: str, topic: str) -> bool:
    """``topic`` matches ``pattern`` (either may be any name; a name without wildcards matches itself)."""
    index = PatternIndex()
    index.add(pattern)
    return bool(index.match(topic))
