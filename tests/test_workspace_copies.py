"""A machine's copy of a run's workspace kept at the run's tree (``activities/workspaces/copies.py``),
without Temporal: the fast path, the restore, the host's say, a call cut short, calls together."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

import pytest

from durable_agent.activities.sinks import FilesystemExportSink
from durable_agent.activities.workspace_tree import WorkspaceTooLarge, WorkspaceTrees
from durable_agent.activities.workspaces import copies as copies_module
from durable_agent.activities.workspaces.copies import WorkspaceCopies, sweep
from durable_agent.config import WorkspaceCheckpointsConfig


def machine(tmp: Path, name: str, sink: FilesystemExportSink) -> tuple[WorkspaceCopies, Path]:
    """A machine: its own shadow repositories and its own copy of the workspace."""
    trees = WorkspaceTrees(WorkspaceCheckpointsConfig(path=tmp / name / "shadow"), {"s": sink})
    ws = tmp / name / "ws"
    ws.mkdir(parents=True)
    return WorkspaceCopies(trees, f"host-{name}"), ws


def files(ws: Path) -> dict[str, str]:
    return {p.relative_to(ws).as_posix(): p.read_text() for p in sorted(ws.rglob("*")) if p.is_file()}


@pytest.fixture
def sink(tmp_path: Path) -> FilesystemExportSink:
    return FilesystemExportSink(tmp_path / "sink")


async def started(copies: WorkspaceCopies, ws: Path) -> str:
    """A run's start on this machine: its base recorded and the copy marked (``RunPlanner._base``)."""
    (ws / "a.txt").write_text("a\n")
    base = await copies.trees.record(ws, "s", strict=True)
    assert base is not None
    await copies.adopt(ws, base.tree)
    return base.tree


async def test_the_fast_path_trusts_the_mark_and_a_change_is_recorded(
    tmp_path: Path, sink: FilesystemExportSink
) -> None:
    a, ws = machine(tmp_path, "a", sink)
    base = await started(a, ws)
    held = await a.enter(ws, base, "s", host=a.host, take_over=False, changes=True)
    assert held is not None and held.restored is None
    assert a.mark_of(a.trees.repo(ws)) is None  # cleared while a call that may change files runs
    (ws / "b.txt").write_text("b\n")
    after = await a.leave(held, "s", record=True)
    assert after is not None and after.tree != base and a.mark_of(a.trees.repo(ws)) == after.tree
    read = await a.enter(ws, after.tree, "s", host=a.host, take_over=False, changes=False)
    assert read is not None and read.restored is None
    await a.leave(read, "s", record=False)


async def test_another_machine_defers_to_the_host_and_restores_when_told_to_take_over(
    tmp_path: Path, sink: FilesystemExportSink
) -> None:
    a, ws_a = machine(tmp_path, "a", sink)
    b, ws_b = machine(tmp_path, "b", sink)
    base = await started(a, ws_a)
    (ws_a / "src").mkdir()
    (ws_a / "src" / "x.py").write_text("x = 1\n")
    after = await a.trees.record(ws_a, "s", strict=True)
    assert after is not None
    (ws_b / "stale.txt").write_text("only on b\n")
    assert await b.enter(ws_b, after.tree, "s", host=a.host, take_over=False, changes=False) is None
    held = await b.enter(ws_b, after.tree, "s", host=a.host, take_over=True, changes=False)
    assert held is not None and held.restored is not None
    restored = held.restored
    assert (restored.reason, restored.host, restored.from_host) == ("moved", b.host, a.host)
    assert restored.objects > 0 and restored.replaced is not None  # b's own files, kept in its shadow
    assert files(ws_b) == files(ws_a) == {"a.txt": "a\n", "src/x.py": "x = 1\n"}
    await b.leave(held, "s", record=False)
    assert base != after.tree


async def test_a_call_cut_short_is_undone_before_the_next_and_a_mark_of_another_boot_is_not_trusted(
    tmp_path: Path, sink: FilesystemExportSink, monkeypatch: pytest.MonkeyPatch
) -> None:
    a, ws = machine(tmp_path, "a", sink)
    base = await started(a, ws)
    held = await a.enter(ws, base, "s", host=a.host, take_over=False, changes=True)
    assert held is not None
    (ws / "a.txt").write_text("half written")  # the worker dies here: nothing recorded
    await a.leave(held, None, record=False)
    again = await a.enter(ws, base, "s", host=a.host, take_over=False, changes=True)
    assert again is not None and again.restored is not None and again.restored.reason == "diverged"
    assert files(ws) == {"a.txt": "a\n"}
    await a.leave(again, "s", record=True)
    assert a.mark_of(a.trees.repo(ws)) == base
    # the machine starts again: its copy is checked (here it holds the tree: nothing to tell)
    copies_module._boot_id.cache_clear()
    monkeypatch.setattr(copies_module, "_boot_id", lambda: "another boot")
    assert a.mark_of(a.trees.repo(ws)) is None
    checked = await a.enter(ws, base, "s", host=a.host, take_over=False, changes=False)
    assert checked is not None and checked.restored is None and a.mark_of(a.trees.repo(ws)) == base
    await a.leave(checked, "s", record=False)


async def test_calls_at_one_tree_share_the_copy_and_a_call_at_another_waits_for_them(
    tmp_path: Path, sink: FilesystemExportSink
) -> None:
    a, ws = machine(tmp_path, "a", sink)
    base = await started(a, ws)
    first = await a.enter(ws, base, "s", host=a.host, take_over=False, changes=False)
    second = await a.enter(ws, base, "s", host=a.host, take_over=False, changes=False)
    assert first is not None and second is not None
    (ws / "late.txt").write_text("a stale attempt's file\n")
    other = await a.trees.record(ws, "s", strict=True)
    assert other is not None
    waiting = asyncio.create_task(a.enter(ws, other.tree, "s", host=a.host, take_over=False, changes=False))
    await asyncio.sleep(0.2)
    assert not waiting.done()  # the copy is in use at another tree
    await a.leave(first, "s", record=False)
    await asyncio.sleep(0.1)
    assert not waiting.done()
    await a.leave(second, "s", record=False)
    held = await asyncio.wait_for(waiting, 10)
    assert held is not None and (ws / "late.txt").exists()
    await a.leave(held, "s", record=False)


async def test_a_run_s_own_folder_unused_for_keep_hours_is_removed_and_comes_back_from_the_sink(
    tmp_path: Path, sink: FilesystemExportSink
) -> None:
    trees = WorkspaceTrees(WorkspaceCheckpointsConfig(path=tmp_path / "shadow"), {"s": sink})
    a = WorkspaceCopies(trees, "host-a")
    root = tmp_path / "root"
    old, recent, busy = (root / "session" / name for name in ("old", "recent", "busy"))
    marks = {}
    for folder in (old, recent, busy):
        folder.mkdir(parents=True)
        marks[folder.name] = await started(a, folder)
    (root / ".git-cache" / "x.git").mkdir(parents=True)  # the mirrors are not runs' folders
    held = await a.enter(busy, marks["busy"], "s", host=a.host, take_over=False, changes=False)
    assert held is not None
    now = time.time()
    for folder in (old, busy):  # last used three hours ago
        for path in (folder, a.trees.repo(folder).git_dir):
            os.utime(path, (now - 3 * 3600, now - 3 * 3600))
    assert sweep(a, root, keep_hours=2, now=now) == [old]
    assert not old.exists() and not a.trees.repo(old).git_dir.exists()
    assert recent.exists() and busy.exists() and (root / ".git-cache" / "x.git").exists()
    await a.leave(held, "s", record=False)
    # the run acts again: its copy is made again from the sink
    old.mkdir(parents=True)
    back = await a.enter(old, marks["old"], "s", host=a.host, take_over=False, changes=False)
    assert back is not None and files(old) == {"a.txt": "a\n"}
    await a.leave(back, "s", record=False)


async def test_a_call_that_leaves_the_workspace_past_max_bytes_is_undone_and_nothing_is_recorded(
    tmp_path: Path, sink: FilesystemExportSink
) -> None:
    trees = WorkspaceTrees(WorkspaceCheckpointsConfig(path=tmp_path / "shadow"), {"s": sink})
    a = WorkspaceCopies(trees, "host-a", max_bytes=1000)
    ws = tmp_path / "ws"
    ws.mkdir()
    base = await started(a, ws)
    held = await a.enter(ws, base, "s", host=a.host, take_over=False, changes=True)
    assert held is not None
    (ws / "big.bin").write_bytes(b"x" * 5000)
    (ws / "a.txt").write_text("changed\n")
    before = {p.name for p in (tmp_path / "sink" / "~objects").rglob("*") if p.is_file()}
    with pytest.raises(WorkspaceTooLarge, match="max_bytes=1,000"):
        await a.leave(held, "s", record=True)
    assert files(ws) == {"a.txt": "a\n"}  # back at the tree the call started at
    assert a.mark_of(a.trees.repo(ws)) == base
    assert {p.name for p in (tmp_path / "sink" / "~objects").rglob("*") if p.is_file()} == before
    # the next call goes on from there, within the bound
    again = await a.enter(ws, base, "s", host=a.host, take_over=False, changes=True)
    assert again is not None and again.restored is None
    (ws / "small.txt").write_text("fits\n")
    after = await a.leave(again, "s", record=True)
    assert after is not None and after.tree != base
