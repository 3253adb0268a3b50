"""The blocking SDK shell is generated from the asyncio one (tools/unasync.py, issue 25.5): the committed
pymq/client/blocking.py must be exactly what its source makes, and the transform does what it says."""
from __future__ import annotations

import importlib.util
import shutil
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("pymq_tools_unasync", ROOT / "tools" / "unasync.py")
assert _spec is not None and _spec.loader is not None
unasync_tool = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = unasync_tool
_spec.loader.exec_module(unasync_tool)


@pytest.mark.parametrize("source, target", sorted(unasync_tool.FILES.items()))
def test_the_committed_blocking_shell_is_what_its_source_makes(source, target):
    assert (ROOT / target).read_text(encoding="utf-8") == unasync_tool.generated(source), \
        f"{target} is out of date or edited by hand: change {source} and run python tools/unasync.py"


def test_check_fails_on_a_hand_edit(tmp_path, monkeypatch, capsys):
    for source, target in unasync_tool.FILES.items():
        for path in (source, target):
            (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(ROOT / path, tmp_path / path)
    monkeypatch.setattr(unasync_tool, "ROOT", tmp_path)
    assert unasync_tool.main(["--check"]) == 0
    target = tmp_path / "pymq/client/blocking.py"
    target.write_text(target.read_text().replace("def receive(", "def receive_(", 1))
    assert unasync_tool.main(["--check"]) == 1
    assert "pymq/client/blocking.py" in capsys.readouterr().err
    assert unasync_tool.main([]) == 0 and unasync_tool.main(["--check"]) == 0    # regenerated


def convert(source: str) -> str:
    return unasync_tool.unasync(textwrap.dedent(source))


def test_async_and_await_go_and_names_are_renamed():
    out = convert('''
        from pymq.aio._waiting import Flag
        class AsyncSession:
            async def __aenter__(self) -> AsyncSession:
                async with self.lock:
                    return [m async for m in self.each()]

            async def go(self) -> None:
                await self.commit()
                x = await (await self.f())
                "an AsyncSession, await in a string stays"   # AsyncConnection in a comment
                self.awaited = 1
    ''')
    assert out == textwrap.dedent('''
        from pymq.client._waiting import Flag
        class Session:
            def __enter__(self) -> Session:
                with self.lock:
                    return [m for m in self.each()]

            def go(self) -> None:
                self.commit()
                x = (self.f())
                "an Session, await in a string stays"   # Connection in a comment
                self.awaited = 1
    ''')


def test_marked_blocks():
    out = convert('''
        def f():
            a = 1
            # async:
            b = await g()
            # sync:
            # b = g()
            #
            # c = 3
            # end
            # async:
            only_async()
            # end
            return a
    ''')
    assert out == textwrap.dedent('''
        def f():
            a = 1
            b = g()

            c = 3
            return a
    ''')


@pytest.mark.parametrize("source, complaint", [
    ("# async:\nx = 1\n", "not closed"),
    ("# sync:\n# x = 1\n# end\n", "must follow"),
    ("# async:\n# async:\n# end\n", "inside an open block"),
    ("# end\n", "without its block"),
    ("# async:\nx = 1\n# sync:\ny = 2\n# end\n", "must be a comment"),
])
def test_misplaced_markers_are_refused(source, complaint):
    with pytest.raises(unasync_tool.SourceError, match=complaint):
        unasync_tool.unasync(source)


def test_continuation_lines_follow_their_bracket():
    out = convert('''
        async def receive(self, timeout: float,
                          other: int) -> AsyncSession:
            return await self.call(1,
                                   2)
    ''')
    assert out == textwrap.dedent('''
        def receive(self, timeout: float,
                    other: int) -> Session:
            return self.call(1,
                             2)
    ''')
