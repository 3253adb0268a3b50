"""Generate the blocking SDK shell from the asyncio one (psycopg 3's ``async_to_sync``, httpcore's ``unasync``).

    python tools/unasync.py            rewrite every generated file from its source
    python tools/unasync.py --check    exit 1 (saying which) when a generated file is not what its source makes

The client API is written once, for asyncio, in ``pymq/aio/client.py``; ``pymq/client/blocking.py`` is
made from it here and committed, and tests/client/test_unasync.py fails when the two disagree (so CI
does).  Everything that differs between tasks and threads is a primitive with the same name in
``pymq/aio/_waiting.py`` and ``pymq/client/_waiting.py``; the transform only swaps the module.

It works on tokens (``tokenize``), so comments and layout stay, and a name inside a string is never
touched by accident:

* ``async def`` / ``async with`` / ``async for`` lose ``async``; ``await`` goes;
* identifiers in :data:`NAMES` and dotted module names in :data:`MODULES` are renamed;
* strings and comments get :data:`TEXT` (class names in docstrings and messages);
* lines between ``# async:`` and ``# sync:`` (or ``# end``) are asyncio-only and dropped; lines between
  ``# sync:`` and ``# end`` are the blocking shell's own, written as comments in the source, and are
  uncommented;
* a continuation line aligned under an opening bracket moves with the bracket when the text before
  the bracket got shorter.
"""
from __future__ import annotations

import argparse
import io
import re
import sys
import tokenize
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

#: source (asyncio) -> generated (blocking)
FILES = {
    "pymq/aio/client.py": "pymq/client/blocking.py",
}

#: identifiers of the asyncio shell -> their blocking names
NAMES = {
    "AsyncConnectionFactory": "ConnectionFactory",
    "AsyncConnection": "Connection",
    "AsyncSession": "Session",
    "AsyncMessageProducer": "MessageProducer",
    "AsyncMessageConsumer": "MessageConsumer",
    "AsyncQueueBrowser": "QueueBrowser",
    "AsyncRequestor": "Requestor",
    "AsyncQueueManager": "QueueManager",
    "AsyncPendingReceipt": "PendingReceipt",
    "AsyncPendingRange": "PendingRange",
    "AsyncTransport": "Transport",
    "_AsyncBrowse": "_Browse",
    "_Connecting": "Connection",
    "AsyncIterator": "Iterator",
    "AsyncIterable": "Iterable",
    "AsyncGenerator": "Generator",
    "StopAsyncIteration": "StopIteration",
    "__aenter__": "__enter__",
    "__aexit__": "__exit__",
    "__aiter__": "__iter__",
    "__anext__": "__next__",
}

#: dotted module names -> their blocking twins
MODULES = {
    "pymq.aio._waiting": "pymq.client._waiting",
    "pymq.aio.transport": "pymq.client.transport",
}

#: phrases in strings and comments
TEXT = [(re.compile(rf"\b{re.escape(old)}\b"), new) for old, new in NAMES.items() if not old.startswith("_")]

ASYNC_ONLY, SYNC_ONLY, END = "# async:", "# sync:", "# end"
HEADER = ("# Generated from {source} by tools/unasync.py: do not edit; change {source} and run\n"
          "# `python tools/unasync.py` (tests/client/test_unasync.py checks the two agree).\n")


class SourceError(Exception):
    """The asyncio source breaks a rule of the transform (a marker out of place)."""


def _markers(text: str, where: str) -> str:
    """Apply the ``# async:`` / ``# sync:`` / ``# end`` blocks."""
    out: list[str] = []
    mode, indent, opened = "both", "", 0
    squeeze = False          # a dropped block stood between blank lines: drop the blank line after it too
    for number, line in enumerate(text.splitlines(keepends=True), 1):
        stripped = line.strip()
        if squeeze:
            squeeze = False
            if not stripped and (not out or not out[-1].strip()):
                continue
        if stripped in (ASYNC_ONLY, SYNC_ONLY, END):
            this = line[:len(line) - len(line.lstrip())]
            if stripped == ASYNC_ONLY:
                if mode != "both":
                    raise SourceError(f"{where}:{number}: '# async:' inside an open block (line {opened})")
                mode, indent, opened = "async", this, number
            elif stripped == SYNC_ONLY:
                if mode != "async" or this != indent:
                    raise SourceError(f"{where}:{number}: '# sync:' must follow '# async:' at its indentation")
                mode = "sync"
            else:
                if mode == "both" or this != indent:
                    raise SourceError(f"{where}:{number}: '# end' without its block at this indentation")
                squeeze = mode == "async"
                mode = "both"
            continue
        if mode == "async":
            continue
        if mode == "sync":
            body = line.rstrip("\n")
            if body.strip() == "#":
                out.append("\n")
            elif body.startswith(indent + "# "):
                out.append(indent + body[len(indent) + 2:] + "\n")
            else:
                raise SourceError(f"{where}:{number}: a line of a '# sync:' block must be a comment at the "
                                  f"block's indentation")
            continue
        out.append(line)
    if mode != "both":
        raise SourceError(f"{where}:{opened}: block not closed with '# end'")
    return "".join(out)


def unasync(text: str, where: str = "<source>") -> str:
    """The blocking twin of asyncio source ``text``."""
    text = _markers(text, where)
    lines = text.splitlines(keepends=True)
    starts = [0]
    for line in lines:
        starts.append(starts[-1] + len(line))

    def offset(pos: tuple[int, int]) -> int:
        return starts[pos[0] - 1] + pos[1]

    tokens = list(tokenize.generate_tokens(io.StringIO(text).readline))
    edits: list[tuple[int, int, str]] = []          # absolute start, end, replacement
    shrink: dict[int, list[tuple[int, int]]] = {}   # row -> (column where text before it shrank, by how much)

    def edit(start: tuple[int, int], end: tuple[int, int], new: str) -> None:
        edits.append((offset(start), offset(end), new))
        if start[0] == end[0]:
            shrink.setdefault(start[0], []).append((end[1], (end[1] - start[1]) - len(new)))

    i = 0
    while i < len(tokens):
        tok = tokens[i]
        if tok.type == tokenize.NAME:
            nxt = tokens[i + 1]
            if tok.string == "async" and nxt.string in ("def", "with", "for"):
                edit(tok.start, nxt.start, "")
            elif tok.string == "await":
                edit(tok.start, nxt.start, "")
            else:
                j, dotted = i, tok.string
                while (j + 2 < len(tokens) and tokens[j + 1].string == "." and tokens[j + 2].type == tokenize.NAME):
                    j += 2
                    dotted += "." + tokens[j].string
                    if dotted in MODULES:
                        edit(tok.start, tokens[j].end, MODULES[dotted])
                        i = j
                        break
                else:
                    if tok.string in NAMES:
                        edit(tok.start, tok.end, NAMES[tok.string])
        elif tok.type in (tokenize.STRING, tokenize.COMMENT):
            new = tok.string
            for pattern, replacement in TEXT:
                new = pattern.sub(replacement, new)
            if new != tok.string:
                edit(tok.start, tok.end, new)
        i += 1

    out = text
    for start, end, new in sorted(edits, reverse=True):
        out = out[:start] + new + out[end:]
    return _realign(out, tokens, shrink)


def _realign(out: str, tokens: list[tokenize.TokenInfo], shrink: dict[int, list[tuple[int, int]]]) -> str:
    """Move continuation lines aligned under a bracket (visual indent) with the bracket."""
    shift: dict[int, int] = {}

    def new_column(row: int, col: int) -> int:
        return col + shift.get(row, 0) - sum(by for at, by in shrink.get(row, ()) if at <= col)

    stack: list[tuple[int, int]] = []
    last_row = 0
    for tok in tokens:
        if tok.type in (tokenize.NL, tokenize.NEWLINE, tokenize.COMMENT, tokenize.INDENT, tokenize.DEDENT):
            continue
        row, col = tok.start
        if row != last_row and stack:
            brow, bcol = stack[-1]
            if col == bcol + 1:
                moved = new_column(brow, bcol) + 1 - col
                if moved:
                    shift[row] = moved
        last_row = tok.end[0]
        if tok.type == tokenize.OP and tok.string in "([{":
            stack.append(tok.start)
        elif tok.type == tokenize.OP and tok.string in ")]}" and stack:
            stack.pop()
    if not shift:
        return out
    lines = out.splitlines(keepends=True)
    for row, moved in shift.items():
        line = lines[row - 1]
        body = line.lstrip(" ")
        lines[row - 1] = " " * max(0, len(line) - len(body) + moved) + body
    return "".join(lines)


def generated(source: str) -> str:
    """What the generated twin of ``source`` (a path relative to the repository) must contain."""
    text = (ROOT / source).read_text(encoding="utf-8")
    return HEADER.format(source=source) + unasync(text, source)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="compare instead of writing; exit 1 on a difference")
    args = parser.parse_args(argv)
    stale = []
    for source, target in FILES.items():
        want = generated(source)
        path = ROOT / target
        have = path.read_text(encoding="utf-8") if path.exists() else ""
        if have == want:
            continue
        if args.check:
            stale.append(target)
        else:
            path.write_text(want, encoding="utf-8")
            print(f"wrote {target} from {source}")
    if stale:
        print(f"out of date (run python tools/unasync.py): {', '.join(stale)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
