# cython: language_level=3
"""Compiled topic-pattern index (twin of pymq/routing/_topics_py.py, the reference).

The same trie of pattern words, walked as a non-deterministic automaton with one stamp per node and step,
in C: no Python frame per node, the word looked up in the node's dict with one C call. Matching a topic of
``w`` words costs at most ``w`` x (trie nodes) node visits whatever the patterns; no recursion (the walk
keeps its own lists), so no pattern can exhaust the C stack. tests/routing/test_topics.py runs every
test against both twins, and spec/vectors/topic_patterns.json.
"""
from cpython.dict cimport PyDict_GetItem
from cpython.object cimport PyObject

IMPLEMENTATION = "c"

SEPARATOR = "."
ONE = "*"
MANY = "#"
MANY_ACTIVEMQ = ">"


cpdef str normalize(str pattern):
    """The normal form of a pattern: ``>`` written ``#``, consecutive ``#`` words one ``#``."""
    cdef list out = []
    cdef str word
    for word in pattern.split("."):
        if word == ">":
            word = "#"
        if word == "#" and out and out[len(out) - 1] == "#":   # (wraparound is off: no [-1])
            continue
        out.append(word)
    return ".".join(out)


cdef class _Node:
    cdef dict children          # literal word -> node, or None
    cdef _Node one              # the '*' edge
    cdef _Node many             # the '#' edge
    cdef bint loops             # reached by '#': it takes further words itself
    cdef object pattern         # the pattern ending here, or None
    cdef Py_ssize_t count
    cdef unsigned long long stamp

    def __cinit__(self, bint loops=False):
        self.children = None
        self.one = None
        self.many = None
        self.loops = loops
        self.pattern = None
        self.count = 0
        self.stamp = 0


cdef inline void _enter(_Node node, list into, unsigned long long gen):
    while node is not None and node.stamp != gen:
        node.stamp = gen
        into.append(node)
        node = node.many


cdef class PatternIndex:
    """Patterns (normal form, with a count each) and, for a topic name, the patterns that match it."""
    cdef _Node _root
    cdef dict _patterns
    cdef unsigned long long _gen

    def __cinit__(self):
        self._root = _Node()
        self._patterns = {}
        self._gen = 0

    def __len__(self):
        return len(self._patterns)

    def __contains__(self, pattern):
        return isinstance(pattern, str) and normalize(pattern) in self._patterns

    def patterns(self):
        return sorted(self._patterns)

    def add(self, str pattern):
        cdef str key = normalize(pattern)
        cdef _Node node = self._root
        cdef _Node child
        cdef str word
        for word in key.split("."):
            if word == "*":
                if node.one is None:
                    node.one = _Node()
                node = node.one
            elif word == "#":
                if node.many is None:
                    node.many = _Node(True)
                node = node.many
            else:
                if node.children is None:
                    node.children = {}
                child = node.children.get(word)
                if child is None:
                    child = _Node()
                    node.children[word] = child
                node = child
        node.pattern = key
        node.count += 1
        self._patterns[key] = node.count
        return key

    def remove(self, str pattern):
        cdef str key = normalize(pattern)
        if key not in self._patterns:
            return False
        cdef list path = []
        cdef _Node node = self._root
        cdef _Node parent
        cdef str word
        for word in key.split("."):
            path.append((node, word))
            if word == "*":
                node = node.one
            elif word == "#":
                node = node.many
            else:
                node = node.children[word]
        node.count -= 1
        if node.count:
            self._patterns[key] = node.count
            return True
        del self._patterns[key]
        node.pattern = None
        cdef tuple step
        for step in reversed(path):
            parent = <_Node>step[0]
            word = <str>step[1]
            if node.pattern is not None or node.children or node.one is not None or node.many is not None:
                break
            if word == "*":
                parent.one = None
            elif word == "#":
                parent.many = None
            else:
                del parent.children[word]
                if not parent.children:
                    parent.children = None
            node = parent
        return True

    def match(self, str topic):
        """Every held pattern that matches ``topic`` (each once, in no particular order)."""
        if not self._patterns:
            return []
        cdef list current = []
        cdef list following
        cdef _Node node
        cdef PyObject* child
        cdef unsigned long long gen
        cdef object word
        self._gen += 1
        _enter(self._root, current, self._gen)
        for word in topic.split("."):
            self._gen += 1
            gen = self._gen
            following = []
            for node in current:
                if node.children is not None:
                    child = PyDict_GetItem(node.children, word)
                    if child != NULL:
                        _enter(<_Node>child, following, gen)
                if node.one is not None:
                    _enter(node.one, following, gen)
                if node.loops:
                    _enter(node, following, gen)
            if not following:
                return []
            current = following
        return [node.pattern for node in current if node.pattern is not None]


def matches(str pattern, str topic):
    """``topic`` matches ``pattern`` (either may be any name; a name without wildcards matches itself)."""
    cdef PatternIndex index = PatternIndex()
    index.add(pattern)
    return bool(index.match(topic))
