# cython: language_level=3
"""Compiled evaluator of selectors and storage rules (twin of pymq/selector/_evaluator_py.py).

``build(ir)`` turns the tuple tree of pymq/selector/_ir.py into a tree of cdef nodes, so evaluating a
selector is a chain of C virtual calls with no Python frames.  Numbers are classified once per operand
into C ``long long`` / ``double``; the rules (NULL and unlike types give unknown, int promotes to
float, '/' is real division and NULL on zero, int overflow is NULL) are those of the Python twin, which
is the reference: tests/selector/test_differential.py checks both agree on random selectors and values.
A header value with no declared type that reads as a number (``UntypedNumber``) is classified by its number
and compared by its text against strings (spec/selector.md §3).

Stack use: ``ev`` and ``compile_node`` recurse once per level of the tree.  The parser refuses a tree
higher than ``SelectorLimits.max_depth`` (at most 64) before it gets here, and ``build`` checks the
height again (``MAX_HEIGHT``) for trees that did not come from the parser, so the C stack holds at most
that many frames whatever the selector.  LIKE never uses a regular expression: the plan of
``pymq.selector._ir.like_plan`` is matched with ``str.find``/``startswith`` and no backtracking.
"""
from cpython.dict cimport PyDict_GetItem
from cpython.object cimport PyObject
from cpython.float cimport PyFloat_AS_DOUBLE
from cpython.mem cimport PyMem_Calloc, PyMem_Free
from cpython.unicode cimport PyUnicode_DATA, PyUnicode_KIND, PyUnicode_READ
from libc.stdint cimport uint64_t

from pymq.errors import InvalidSelector
from pymq.selector._ir import MAX_HEIGHT, UntypedNumber, like_plan

IMPLEMENTATION = "c"

cdef extern from "Python.h":
    long long PyLong_AsLongLongAndOverflow(object, int*) except? -1

cdef extern from *:
    """
    static inline int pymq_add_ovf(long long a, long long b, long long *r) { return __builtin_add_overflow(a, b, r); }
    static inline int pymq_sub_ovf(long long a, long long b, long long *r) { return __builtin_sub_overflow(a, b, r); }
    static inline int pymq_mul_ovf(long long a, long long b, long long *r) { return __builtin_mul_overflow(a, b, r); }
    #define PYMQ_LLONG_MIN (-9223372036854775807LL - 1)
    """
    int pymq_add_ovf(long long a, long long b, long long *r)
    int pymq_sub_ovf(long long a, long long b, long long *r)
    int pymq_mul_ovf(long long a, long long b, long long *r)
    long long PYMQ_LLONG_MIN

# value classes
cdef enum:
    K_NULL = 0
    K_INT = 1
    K_FLOAT = 2
    K_BOOL = 3
    K_STR = 4
    K_OTHER = 5

# comparison and arithmetic operators
cdef enum:
    OP_EQ = 0
    OP_NE = 1
    OP_LT = 2
    OP_GT = 3
    OP_LE = 4
    OP_GE = 5
    OP_ADD = 6
    OP_SUB = 7
    OP_MUL = 8
    OP_DIV = 9

#: a header value with no declared type that reads as a number (pymq/selector/_ir.py): classified by its number,
#: compared by its text against strings
cdef type UNTYPED = UntypedNumber

cdef dict _OPS = {"=": OP_EQ, "<>": OP_NE, "<": OP_LT, ">": OP_GT, "<=": OP_LE, ">=": OP_GE,
                  "+": OP_ADD, "-": OP_SUB, "*": OP_MUL, "/": OP_DIV}


cdef inline int classify(object v, long long* iv, double* dv) except -1:
    cdef int overflow = 0
    if v is None:
        return K_NULL
    cdef type t = type(v)
    if t is str:
        return K_STR
    if t is float:
        dv[0] = PyFloat_AS_DOUBLE(v)
        return K_FLOAT
    if t is bool:
        return K_BOOL
    if t is int:
        iv[0] = PyLong_AsLongLongAndOverflow(v, &overflow)
        return K_OTHER if overflow else K_INT
    if t is UNTYPED:
        return classify((<object>v).number, iv, dv)     # an int within 64 bits, or a float: never recursive
    # subclasses (IntEnum, str subclasses, ...): classify by their base type
    if isinstance(v, int):
        iv[0] = PyLong_AsLongLongAndOverflow(int(v), &overflow)
        return K_OTHER if overflow else K_INT
    if isinstance(v, float):
        dv[0] = float(v)
        return K_FLOAT
    if isinstance(v, str):
        return K_STR
    return K_OTHER


cdef inline object cmp_ll(int op, long long x, long long y):
    if op == OP_EQ:
        return x == y
    if op == OP_NE:
        return x != y
    if op == OP_LT:
        return x < y
    if op == OP_GT:
        return x > y
    if op == OP_LE:
        return x <= y
    return x >= y


cdef inline object cmp_d(int op, double x, double y):
    if op == OP_EQ:
        return x == y
    if op == OP_NE:
        return x != y
    if op == OP_LT:
        return x < y
    if op == OP_GT:
        return x > y
    if op == OP_LE:
        return x <= y
    return x >= y


cdef object compare(int op, object a, object b):
    cdef long long ia = 0, ib = 0
    cdef double da = 0.0, db = 0.0
    cdef int ka = classify(a, &ia, &da)
    if ka == K_NULL:
        return None
    cdef int kb = classify(b, &ib, &db)
    if kb == K_NULL:
        return None
    return compare_classified(op, a, ka, ia, da, b, kb, ib, db)


cdef inline object compare_classified(int op, object a, int ka, long long ia, double da,
                                      object b, int kb, long long ib, double db):
    cdef bint na = ka == K_INT or ka == K_FLOAT
    cdef bint nb = kb == K_INT or kb == K_FLOAT
    if (op == OP_EQ or op == OP_NE) and (type(a) is UNTYPED and (kb == K_STR or type(b) is UNTYPED)
                                         or type(b) is UNTYPED and ka == K_STR):
        # an untyped value against a string (or another untyped value): their texts, as strings compare
        if op == OP_EQ:
            return <str>a == <str>b
        return <str>a != <str>b
    if na and nb:
        if ka == K_INT and kb == K_INT:
            return cmp_ll(op, ia, ib)
        if ka == K_INT:
            da = <double>ia
        if kb == K_INT:
            db = <double>ib
        return cmp_d(op, da, db)
    if na or nb or ka != kb or ka == K_OTHER:
        return None
    if ka == K_BOOL:
        if op == OP_EQ:
            return a is b
        if op == OP_NE:
            return a is not b
        return None
    # strings
    if op == OP_EQ:
        return <str>a == <str>b
    if op == OP_NE:
        return <str>a != <str>b
    return None


cdef object arith(int op, object a, object b):
    cdef long long ia = 0, ib = 0, r = 0
    cdef double da = 0.0, db = 0.0
    cdef int ka = classify(a, &ia, &da)
    if ka != K_INT and ka != K_FLOAT:
        return None
    cdef int kb = classify(b, &ib, &db)
    if kb != K_INT and kb != K_FLOAT:
        return None
    if op == OP_DIV or ka == K_FLOAT or kb == K_FLOAT:
        if ka == K_INT:
            da = <double>ia
        if kb == K_INT:
            db = <double>ib
        if op == OP_DIV:
            if db == 0.0:
                return None
            return da / db
        if op == OP_ADD:
            return da + db
        if op == OP_SUB:
            return da - db
        return da * db
    if op == OP_ADD:
        if pymq_add_ovf(ia, ib, &r):
            return None
    elif op == OP_SUB:
        if pymq_sub_ovf(ia, ib, &r):
            return None
    else:
        if pymq_mul_ovf(ia, ib, &r):
            return None
    return r


cdef inline object lookup(object values, object name):
    cdef PyObject* p
    if type(values) is dict:
        p = PyDict_GetItem(<dict>values, name)
        if p == NULL:
            return None
        return <object>p
    return values.get(name)


# -- nodes ---------------------------------------------------------------------------------------------

cdef class Node:
    cdef object ev(self, object values):
        raise NotImplementedError


cdef class Lit(Node):
    cdef object value

    def __cinit__(self, value):
        self.value = value

    cdef object ev(self, object values):
        return self.value


cdef class Prop(Node):
    cdef object name

    def __cinit__(self, name):
        self.name = name

    cdef object ev(self, object values):
        return lookup(values, self.name)


cdef class Field(Node):
    cdef object key
    cdef object name

    def __cinit__(self, key, name):
        self.key = key
        self.name = name

    cdef object ev(self, object values):
        cdef object inner = lookup(values, self.key)
        if inner is None:
            return None
        return lookup(inner, self.name)


cdef class Cond(Node):
    cdef Node inner

    def __cinit__(self, Node inner):
        self.inner = inner

    cdef object ev(self, object values):
        cdef object v = self.inner.ev(values)
        if v is True or v is False:
            return v
        return None


cdef class Not(Node):
    cdef Node inner

    def __cinit__(self, Node inner):
        self.inner = inner

    cdef object ev(self, object values):
        cdef object v = self.inner.ev(values)
        if v is None:
            return None
        return v is False


cdef class And(Node):
    cdef list parts

    def __cinit__(self, list parts):
        self.parts = parts

    cdef object ev(self, object values):
        cdef object result = True
        cdef object r
        for part in self.parts:
            r = (<Node>part).ev(values)
            if r is False:
                return False
            if r is None:
                result = None
        return result


cdef class Or(Node):
    cdef list parts

    def __cinit__(self, list parts):
        self.parts = parts

    cdef object ev(self, object values):
        cdef object result = False
        cdef object r
        for part in self.parts:
            r = (<Node>part).ev(values)
            if r is True:
                return True
            if r is None:
                result = None
        return result


cdef class Cmp(Node):
    cdef int op
    cdef Node left
    cdef Node right

    def __cinit__(self, int op, Node left, Node right):
        self.op = op
        self.left = left
        self.right = right

    cdef object ev(self, object values):
        return compare(self.op, self.left.ev(values), self.right.ev(values))


cdef class CmpLit(Node):
    """``value op literal``, the commonest shape (``color = 'red'``): the literal is classified once."""
    cdef int op
    cdef Node left
    cdef object lit
    cdef int kl
    cdef long long il
    cdef double dl

    def __cinit__(self, int op, Node left, object lit):
        self.op = op
        self.left = left
        self.lit = lit
        self.kl = classify(lit, &self.il, &self.dl)

    cdef object ev(self, object values):
        cdef long long ia = 0
        cdef double da = 0.0
        cdef object a = self.left.ev(values)
        cdef int ka
        if a is None:
            return None
        if type(a) is str and self.kl == K_STR:        # fast path: string equality
            if self.op == OP_EQ:
                return <str>a == <str>self.lit
            if self.op == OP_NE:
                return <str>a != <str>self.lit
            return None
        ka = classify(a, &ia, &da)
        return compare_classified(self.op, a, ka, ia, da, self.lit, self.kl, self.il, self.dl)


cdef class Arith(Node):
    cdef int op
    cdef Node left
    cdef Node right

    def __cinit__(self, int op, Node left, Node right):
        self.op = op
        self.left = left
        self.right = right

    cdef object ev(self, object values):
        cdef object a = self.left.ev(values)
        if a is None:
            return None
        return arith(self.op, a, self.right.ev(values))


cdef class Neg(Node):
    cdef Node inner

    def __cinit__(self, Node inner):
        self.inner = inner

    cdef object ev(self, object values):
        cdef long long iv = 0
        cdef double dv = 0.0
        cdef int k = classify(self.inner.ev(values), &iv, &dv)
        if k == K_INT:
            if iv == PYMQ_LLONG_MIN:
                return None
            return -iv
        if k == K_FLOAT:
            return -dv
        return None


cdef class Pos(Node):
    cdef Node inner

    def __cinit__(self, Node inner):
        self.inner = inner

    cdef object ev(self, object values):
        cdef long long iv = 0
        cdef double dv = 0.0
        cdef object v = self.inner.ev(values)
        cdef int k = classify(v, &iv, &dv)
        if k == K_INT:
            return iv
        if k == K_FLOAT:
            return dv
        return None


cdef class Between(Node):
    cdef Node inner
    cdef Node low
    cdef Node high

    def __cinit__(self, Node inner, Node low, Node high):
        self.inner = inner
        self.low = low
        self.high = high

    cdef object ev(self, object values):
        cdef object v = self.inner.ev(values)
        cdef object a = compare(OP_GE, v, self.low.ev(values))
        if a is False:
            return False
        cdef object b = compare(OP_LE, v, self.high.ev(values))
        if b is False:
            return False
        if a is True and b is True:
            return True
        return None


cdef class NotBetween(Node):
    cdef Node inner
    cdef Node low
    cdef Node high

    def __cinit__(self, Node inner, Node low, Node high):
        self.inner = inner
        self.low = low
        self.high = high

    cdef object ev(self, object values):
        cdef object v = self.inner.ev(values)
        cdef object a = compare(OP_LT, v, self.low.ev(values))
        if a is True:
            return True
        cdef object b = compare(OP_GT, v, self.high.ev(values))
        if b is True:
            return True
        if a is False and b is False:
            return False
        return None


cdef class InStr(Node):
    cdef Node inner
    cdef frozenset items

    def __cinit__(self, Node inner, frozenset items):
        self.inner = inner
        self.items = items

    cdef object ev(self, object values):
        cdef object v = self.inner.ev(values)
        if not isinstance(v, str):
            return None
        return v in self.items


cdef class InNum(Node):
    cdef Node inner
    cdef object exact      # frozenset of ints, or None when the list holds a float
    cdef frozenset floats

    def __cinit__(self, Node inner, object exact, frozenset floats):
        self.inner = inner
        self.exact = exact
        self.floats = floats

    cdef object ev(self, object values):
        cdef long long iv = 0
        cdef double dv = 0.0
        cdef int k = classify(self.inner.ev(values), &iv, &dv)
        if k == K_INT:
            if self.exact is not None:
                return iv in <frozenset>self.exact
            return <double>iv in self.floats
        if k == K_FLOAT:
            return dv in self.floats
        return None


# LIKE shapes with a one-call test, and the general plan
cdef enum:
    LIKE_EQ = 0
    LIKE_PREFIX = 1
    LIKE_SUFFIX = 2
    LIKE_INFIX = 3
    LIKE_ANY = 4
    LIKE_PLAN = 5


cdef bint _group_at(tuple group, str v, Py_ssize_t at):
    cdef tuple piece
    for piece in <tuple>group[1]:
        if not v.startswith(<str>piece[1], at + <Py_ssize_t>piece[0]):
            return False
    return True


cdef class GroupScan:
    """Shift-and tables of one LIKE group over 64-bit words (twin: ``_evaluator_py._group_masks``).

    Bit ``j`` of a position set stands for "the group's first ``j + 1`` characters end here".  Masks
    for ASCII characters sit in a direct table, the others in a sorted array searched by bisection;
    a character the group does not name gets the '_' positions (``wild``).  One pass over the value,
    ``words`` word operations per character; memory ``(128 + distinct) * words`` words, bounded by
    the LIKE pattern limit.
    """
    cdef Py_ssize_t length, words, count
    cdef uint64_t* ascii        # 128 * words
    cdef uint64_t* wild         # words
    cdef Py_UCS4* chars         # count, sorted
    cdef uint64_t* masks        # count * words
    cdef uint64_t* state        # words (scratch)

    def __cinit__(self, tuple group):
        cdef Py_ssize_t length = group[0], words = (length + 63) // 64, j, k, offset, pos
        cdef Py_UCS4 ch
        cdef dict others = {}
        self.length = length
        self.words = words
        self.ascii = <uint64_t*>PyMem_Calloc(128 * words, sizeof(uint64_t))
        self.wild = <uint64_t*>PyMem_Calloc(words, sizeof(uint64_t))
        self.state = <uint64_t*>PyMem_Calloc(words, sizeof(uint64_t))
        if self.ascii == NULL or self.wild == NULL or self.state == NULL:
            raise MemoryError()
        for j in range(length):
            self.wild[j >> 6] |= (<uint64_t>1) << (j & 63)
        for piece in <tuple>group[1]:
            offset = (<tuple>piece)[0]
            for j, ch in enumerate(<str>(<tuple>piece)[1]):
                pos = offset + j
                self.wild[pos >> 6] &= ~((<uint64_t>1) << (pos & 63))
                if ch >= 128:
                    others.setdefault(ch, [])
        keys = sorted(others)
        self.count = len(keys)
        self.chars = <Py_UCS4*>PyMem_Calloc(self.count + 1, sizeof(Py_UCS4))
        self.masks = <uint64_t*>PyMem_Calloc((self.count + 1) * words, sizeof(uint64_t))
        if self.chars == NULL or self.masks == NULL:
            raise MemoryError()
        for k in range(self.count):
            self.chars[k] = <Py_UCS4>ord(keys[k])
        for k in range(128):
            for j in range(words):
                self.ascii[k * words + j] = self.wild[j]
        for k in range(self.count):
            for j in range(words):
                self.masks[k * words + j] = self.wild[j]
        for piece in <tuple>group[1]:
            offset = (<tuple>piece)[0]
            for j, ch in enumerate(<str>(<tuple>piece)[1]):
                pos = offset + j
                if ch < 128:
                    self.ascii[<Py_ssize_t>ch * words + (pos >> 6)] |= (<uint64_t>1) << (pos & 63)
                else:
                    k = self._index(ch)
                    self.masks[k * words + (pos >> 6)] |= (<uint64_t>1) << (pos & 63)

    def __dealloc__(self):
        PyMem_Free(self.ascii)
        PyMem_Free(self.wild)
        PyMem_Free(self.state)
        PyMem_Free(self.chars)
        PyMem_Free(self.masks)

    cdef Py_ssize_t _index(self, Py_UCS4 ch):
        cdef Py_ssize_t lo = 0, hi = self.count, mid
        while lo < hi:
            mid = (lo + hi) >> 1
            if self.chars[mid] < ch:
                lo = mid + 1
            else:
                hi = mid
        if lo < self.count and self.chars[lo] == ch:
            return lo
        return -1

    cdef Py_ssize_t find(self, str v, Py_ssize_t start, Py_ssize_t stop) except -2:
        """The leftmost start in [start, stop - length] where the group matches, or -1."""
        cdef Py_ssize_t words = self.words, i, j, k, top = self.length - 1
        cdef uint64_t carry, x
        cdef uint64_t* mask
        cdef uint64_t* state = self.state
        cdef Py_UCS4 ch
        cdef int kind = PyUnicode_KIND(v)
        cdef void* data = PyUnicode_DATA(v)
        for j in range(words):
            state[j] = 0
        for i in range(start, stop):
            ch = PyUnicode_READ(kind, data, i)
            if ch < 128:
                mask = self.ascii + <Py_ssize_t>ch * words
            else:
                k = self._index(ch)
                mask = self.wild if k < 0 else self.masks + k * words
            carry = 1
            for j in range(words):
                x = state[j]
                state[j] = ((x << 1) | carry) & mask[j]
                carry = x >> 63
            if (state[top >> 6] >> (top & 63)) & 1:
                return i - top
        return -1


cdef class LikeMatcher:
    """Twin of ``_evaluator_py._LikeMatcher``: first group at the start, last at the end, each middle
    group at its leftmost place (``str.find`` for a plain literal, else a :class:`GroupScan`)."""
    cdef tuple plan
    cdef list scans            # per group: GroupScan, or None for a literal / empty group

    def __cinit__(self, tuple plan):
        self.plan = plan
        self.scans = []
        for group in plan:
            self.scans.append(GroupScan(group) if _needs_scan(group) else None)

    cdef Py_ssize_t find(self, Py_ssize_t k, str v, Py_ssize_t start, Py_ssize_t stop) except -2:
        cdef tuple group = self.plan[k]
        cdef Py_ssize_t length = group[0]
        cdef tuple pieces = group[1]
        if stop - start < length:
            return -1
        if not pieces:
            return start
        scan = self.scans[k]
        if scan is None:
            return v.find(<str>(<tuple>pieces[0])[1], start, stop)
        return (<GroupScan>scan).find(v, start, stop)

    cdef bint match(self, str v) except -1:
        cdef tuple plan = self.plan
        cdef Py_ssize_t n = len(v), tail, at, found, count = len(plan), k
        cdef tuple first = plan[0], last
        if count == 1:
            return n == <Py_ssize_t>first[0] and _group_at(first, v, 0)
        last = plan[count - 1]
        tail = n - <Py_ssize_t>last[0]
        if <Py_ssize_t>first[0] > tail or not _group_at(first, v, 0) or not _group_at(last, v, tail):
            return False
        at = first[0]
        for k in range(1, count - 1):
            found = self.find(k, v, at, tail)
            if found < 0:
                return False
            at = found + <Py_ssize_t>(<tuple>plan[k])[0]
        return True


cdef bint _needs_scan(tuple group):
    cdef Py_ssize_t length = group[0]
    cdef tuple pieces = group[1]
    return len(pieces) > 0 and not (len(pieces) == 1 and (<tuple>pieces[0])[0] == 0
                                    and len((<tuple>pieces[0])[1]) == length)


cdef class Like(Node):
    cdef Node inner
    cdef int shape
    cdef str text
    cdef LikeMatcher matcher

    def __cinit__(self, Node inner, tuple segments):
        self.inner = inner
        self.text = ""
        self.matcher = None
        kinds = tuple(s[0] for s in segments)
        lits = [s[1] for s in segments if s[0] == "lit"]
        if kinds == () or kinds == ("lit",):
            self.shape = LIKE_EQ
            self.text = lits[0] if lits else ""
        elif kinds == ("lit", "any"):
            self.shape = LIKE_PREFIX
            self.text = lits[0]
        elif kinds == ("any", "lit"):
            self.shape = LIKE_SUFFIX
            self.text = lits[0]
        elif kinds == ("any", "lit", "any"):
            self.shape = LIKE_INFIX
            self.text = lits[0]
        elif kinds == ("any",):
            self.shape = LIKE_ANY
        else:
            self.shape = LIKE_PLAN
            self.matcher = LikeMatcher(like_plan(segments))

    cdef object ev(self, object values):
        cdef object v = self.inner.ev(values)
        if not isinstance(v, str):
            return None
        if self.shape == LIKE_EQ:
            return <str>v == self.text
        if self.shape == LIKE_PREFIX:
            return (<str>v).startswith(self.text)
        if self.shape == LIKE_SUFFIX:
            return (<str>v).endswith(self.text)
        if self.shape == LIKE_INFIX:
            return self.text in <str>v
        if self.shape == LIKE_ANY:
            return True
        return self.matcher.match(<str>v)


cdef class IsNull(Node):
    cdef Node inner

    def __cinit__(self, Node inner):
        self.inner = inner

    cdef object ev(self, object values):
        return self.inner.ev(values) is None


cdef class Contains(Node):
    cdef Node inner
    cdef str needle

    def __cinit__(self, Node inner, str needle):
        self.inner = inner
        self.needle = needle

    cdef object ev(self, object values):
        cdef object v = self.inner.ev(values)
        if not isinstance(v, str):
            return False
        return self.needle in <str>v


cdef Node compile_node(tuple node, int height=1):
    if height > MAX_HEIGHT:
        raise InvalidSelector(f"selector error at position 0: expected expressions nested at most "
                              f"{MAX_HEIGHT} deep but found a deeper tree", position=0,
                              expected=f"expressions nested at most {MAX_HEIGHT} deep")
    op = node[0]
    if op == "lit":
        return Lit(node[1])
    if op == "prop":
        return Prop(node[1])
    if op == "field":
        return Field(node[1], node[2])
    if op == "cond":
        return Cond(compile_node(node[1], height + 1))
    if op == "not":
        return Not(compile_node(node[1], height + 1))
    if op == "and":
        return And([compile_node(n, height + 1) for n in node[1]])
    if op == "or":
        return Or([compile_node(n, height + 1) for n in node[1]])
    if op == "cmp":
        if node[3][0] == "lit":
            return CmpLit(_OPS[node[1]], compile_node(node[2], height + 1), node[3][1])
        return Cmp(_OPS[node[1]], compile_node(node[2], height + 1), compile_node(node[3], height + 1))
    if op == "arith":
        return Arith(_OPS[node[1]], compile_node(node[2], height + 1), compile_node(node[3], height + 1))
    if op == "neg":
        return Neg(compile_node(node[1], height + 1))
    if op == "pos":
        return Pos(compile_node(node[1], height + 1))
    if op == "between":
        return Between(compile_node(node[1], height + 1), compile_node(node[2], height + 1),
                       compile_node(node[3], height + 1))
    if op == "notbetween":
        return NotBetween(compile_node(node[1], height + 1), compile_node(node[2], height + 1),
                          compile_node(node[3], height + 1))
    if op == "in":
        items = node[3]
        if node[2] == "str":
            return InStr(compile_node(node[1], height + 1), frozenset(items))
        exact = frozenset(items) if all(type(i) is int for i in items) else None
        return InNum(compile_node(node[1], height + 1), exact, frozenset(float(i) for i in items))
    if op == "like":
        return Like(compile_node(node[1], height + 1), node[2])
    if op == "isnull":
        return IsNull(compile_node(node[1], height + 1))
    if op == "contains":
        return Contains(compile_node(node[1], height + 1), node[2])
    raise ValueError(f"unknown selector node {op!r}")


cdef class Program:
    """A compiled selector: evaluate it against a mapping of identifier -> value."""
    cdef Node root
    cdef readonly object ir

    def __cinit__(self, ir):
        self.ir = ir
        self.root = Lit(True) if ir is None else compile_node(ir)

    cpdef object evaluate(self, object values):
        """The three-valued result: True, False or None (unknown)."""
        return self.root.ev(values)

    cpdef bint matches(self, object values):
        """True only when the selector evaluates to TRUE (unknown and FALSE do not select)."""
        return self.root.ev(values) is True


def build(ir):
    return Program(ir)


def first_match(programs, values):
    """Index of the first program that matches ``values``, or -1."""
    cdef Py_ssize_t i = 0
    for program in programs:
        if (<Program?>program).root.ev(values) is True:
            return i
        i += 1
    return -1


def all_matches(programs, values):
    """Indexes of every program that matches ``values``, in order."""
    cdef Py_ssize_t i = 0
    cdef list out = []
    for program in programs:
        if (<Program?>program).root.ev(values) is True:
            out.append(i)
        i += 1
    return out
