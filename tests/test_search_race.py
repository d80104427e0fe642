"""A link that flips while ``glob`` or ``grep`` runs never hands over what the rules deny nor what
lies outside the workspace: the searches open their start folder and every file beneath the
workspace's descriptor without following links, and judge what they opened."""

from __future__ import annotations

import contextvars
import os
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from durable_agent.activities.tools import tree_walk
from durable_agent.activities.tools.path_guard import READ_DENIED, check_resolved, read_denier
from durable_agent.activities.tools.search import glob, grep
from durable_agent.activities.tools.tool import ToolFailure
from durable_agent.core.activity_api import ToolCallInput
from durable_agent.core.builtin_catalog import BUILTIN_TOOLS
from durable_agent.core.permissions import PermissionPolicy
from durable_agent.core.tool_specs import validate_args

SECRET = "SECRET-DOTENV-CONTENT 0451"
OUTSIDE = "OUTSIDE-CONTENT 7781"
POLICY = PermissionPolicy(
    allow=("read", "ls", "grep", "glob"),
    deny=("read(**/.env)", "glob(.git/**)"),
    ask=(),
    default="deny",
)
# Bounded: enough calls that the old check-then-open lost a good number of them.
ATTEMPTS = 600
MAX_FLIPS = 2_000_000
MIN_FLIPS = 20  # at least this many flips happened while the searches ran
SEARCHES: dict[str, Callable[[Any, Path, threading.Event], str]] = {"glob": glob, "grep": grep}


@pytest.fixture(autouse=True)
def fine_thread_switches() -> Iterator[None]:
    """Threads take turns more often than Python's default 5 ms, so the flips land between a
    search's steps more often (the safety of the searches does not depend on it)."""
    interval = sys.getswitchinterval()
    sys.setswitchinterval(0.0001)
    try:
        yield
    finally:
        sys.setswitchinterval(interval)


def workspace(tmp: Path) -> Path:
    ws = tmp / "ws"
    (ws / ".git" / "hooks").mkdir(parents=True)
    (ws / ".git" / "hooks" / "post-checkout").write_text("#!/bin/sh\n")
    (ws / "src").mkdir()
    (ws / "src" / "app.py").write_text("nothing to see here\n")
    (ws / ".env").write_text(SECRET + "\n")
    (ws / "harmless.txt").write_text("nothing to see\n")
    return ws


def outside_folder(tmp: Path) -> Path:
    """A folder beside the workspace, shaped like one inside it, with content no search may show."""
    out = tmp / "outside"
    (out / "inner").mkdir(parents=True)
    (out / "inner" / "escaped.txt").write_text(OUTSIDE + "\n")
    (out / "secret.txt").write_text(OUTSIDE + "\n")
    return out


@contextmanager
def flipper(step: Callable[[], None]) -> Iterator[list[int]]:
    """A thread running ``step`` again and again (a bounded number of times) until the block ends;
    yields the count of steps so far."""
    stop = threading.Event()
    flips = [0]

    def run() -> None:
        while not stop.is_set() and flips[0] < MAX_FLIPS:
            step()
            flips[0] += 1

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    try:
        yield flips
    finally:
        stop.set()
        thread.join(10)
        assert not thread.is_alive()


@contextmanager
def flipping_link(link: Path, targets: tuple[str, str]) -> Iterator[list[int]]:
    """``link`` pointed at one target, then the other, each change atomic."""
    tmp = link.with_name(link.name + ".flip")
    os.symlink(targets[0], link)

    def step() -> None:
        for target in targets:
            os.symlink(target, tmp)
            os.replace(tmp, link)

    with flipper(step) as flips:
        yield flips


@contextmanager
def flipping_file(path: Path, content: str, target: str) -> Iterator[list[int]]:
    """``path`` a regular file holding ``content``, then a link to ``target``, each change atomic."""
    tmp = path.with_name(path.name + ".flip")
    path.write_text(content)

    def step() -> None:
        os.symlink(target, tmp)
        os.replace(tmp, path)
        tmp.write_text(content)
        os.replace(tmp, path)

    with flipper(step) as flips:
        yield flips


@contextmanager
def flipping_folder(folder: Path, target: Path) -> Iterator[list[int]]:
    """``folder`` a real folder, then a link to ``target`` in its place (moved aside and back)."""
    away = folder.with_name(folder.name + ".away")

    def step() -> None:
        os.rename(folder, away)
        os.symlink(target, folder)
        os.unlink(folder)
        os.rename(away, folder)

    with flipper(step) as flips:
        yield flips


def search(ws: Path, name: str, policy: PermissionPolicy | None = POLICY, **arguments: Any) -> str:
    """What the tool activity does with one search: judge its target (as given and as resolved),
    arm grep's read rules, then run it, in a context of its own (as each activity has)."""

    def one() -> str:
        spec = BUILTIN_TOOLS[name]
        args = validate_args(spec, arguments)
        inp = ToolCallInput(
            run_id="r", workspace=str(ws), call_id="c", name=name, arguments=arguments, permissions=policy
        )
        refused = check_resolved(inp, spec, arguments)
        if refused is not None:
            return refused.content
        if policy is not None:
            READ_DENIED.set(read_denier(policy, ws.resolve()))
        try:
            return SEARCHES[name](args, ws, threading.Event())
        except ToolFailure as exc:
            return f"failed: {exc}"

    return contextvars.copy_context().run(one)


@pytest.mark.timeout(60)
def test_grep_through_a_flipping_link_never_prints_the_denied_file(tmp_path: Path) -> None:
    ws = workspace(tmp_path)
    seen = {"followed": 0, "left out": 0}
    with flipping_link(ws / "notes.txt", ("harmless.txt", ".env")) as flips:
        for i in range(ATTEMPTS):
            walked = i % 2 == 1  # the link found in a walk, or named as where grep starts
            out = search(ws, "grep", pattern="SECRET|nothing", path="." if walked else "notes.txt")
            assert SECRET not in out
            # a start is shown as where it leads, a file found in a walk as where it was found
            shown = "notes.txt:1: nothing to see" if walked else "harmless.txt:1: nothing to see"
            followed = shown in out if walked else out == shown
            seen["followed" if followed else "left out"] += 1
    assert flips[0] > MIN_FLIPS  # the link really flipped while the searches ran
    assert all(seen.values()), seen  # both sides were seen: a link inside is still followed


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    ("path", "attempts"),
    # the old code judged a start file again just before opening it: a narrow gap, so more calls
    [("notes.txt", 4 * ATTEMPTS), (".", ATTEMPTS)],
)
def test_grep_of_a_file_swapped_for_a_link_never_prints_the_denied_file(
    tmp_path: Path, path: str, attempts: int
) -> None:
    ws = workspace(tmp_path)
    with flipping_file(ws / "notes.txt", "plain notes\n", ".env") as flips:
        for _ in range(attempts):
            assert SECRET not in search(ws, "grep", pattern="SECRET|notes", path=path)
    assert flips[0] > MIN_FLIPS


@pytest.mark.timeout(60)
@pytest.mark.parametrize("path", ["notes.txt", "."])
def test_grep_of_a_file_swapped_for_a_link_out_never_prints_the_outside(tmp_path: Path, path: str) -> None:
    ws = workspace(tmp_path)
    out = outside_folder(tmp_path)
    seen = 0
    with flipping_file(ws / "notes.txt", "plain notes\n", str(out / "secret.txt")):
        for _ in range(ATTEMPTS):
            found = search(ws, "grep", policy=None, pattern="CONTENT|notes", path=path)
            assert OUTSIDE not in found
            seen += "notes.txt:1: plain notes" in found
    assert seen  # the file itself is still searched


@pytest.mark.timeout(60)
def test_searches_never_walk_into_a_folder_swapped_for_a_link_out(tmp_path: Path) -> None:
    ws = workspace(tmp_path)
    out = outside_folder(tmp_path)
    (ws / "sub" / "inner").mkdir(parents=True)
    (ws / "sub" / "inner" / "kept.txt").write_text("inside content\n")
    calls: list[tuple[str, dict[str, str]]] = [
        ("glob", {"pattern": "sub/inner/*"}),
        ("glob", {"pattern": "**"}),
        ("grep", {"pattern": "CONTENT|content", "path": "sub/inner"}),
        ("grep", {"pattern": "CONTENT|content", "path": "."}),
    ]
    seen = 0
    with flipping_folder(ws / "sub", out) as flips:
        for i in range(ATTEMPTS):
            name, arguments = calls[i % len(calls)]
            found = search(ws, name, policy=None, **arguments)
            assert "escaped" not in found and OUTSIDE not in found and "secret.txt" not in found
            seen += "kept.txt" in found
    assert flips[0] > MIN_FLIPS
    assert seen  # the real folder is still searched


@pytest.mark.timeout(60)
def test_glob_through_a_flipping_link_never_lists_the_denied_folder(tmp_path: Path) -> None:
    ws = workspace(tmp_path)
    seen = {"listed": 0, "refused": 0}
    with flipping_link(ws / "view", ("src", ".git/hooks")) as flips:
        for _ in range(ATTEMPTS):
            found = search(ws, "glob", pattern="view/*")
            assert "post-checkout" not in found
            seen["listed" if "src/app.py" in found else "refused"] += 1
    assert flips[0] > MIN_FLIPS
    assert all(seen.values()), seen


def test_links_inside_the_workspace_are_still_searched_as_before(tmp_path: Path) -> None:
    ws = workspace(tmp_path)
    os.symlink("harmless.txt", ws / "notes.txt")
    os.symlink("src", ws / "code")
    os.symlink(".env", ws / "notenv")
    os.symlink(str(outside_folder(tmp_path)), ws / "out")
    os.symlink("loop-b", ws / "loop-a")
    os.symlink("loop-a", ws / "loop-b")
    assert search(ws, "grep", pattern="nothing|SECRET").splitlines() == [
        "harmless.txt:1: nothing to see",
        "notes.txt:1: nothing to see",
        "src/app.py:1: nothing to see here",
    ]
    assert search(ws, "grep", pattern="nothing", path="code") == "src/app.py:1: nothing to see here"
    assert search(ws, "grep", pattern="SECRET", path="notenv").startswith("no matches")
    assert search(ws, "glob", pattern="*").splitlines() == [
        ".env",
        ".git/",
        "code/",
        "harmless.txt",
        "notenv",
        "notes.txt",
        "src/",
    ]
    assert search(ws, "glob", pattern="code/*") == "src/app.py"
    assert "outside the workspace" in search(ws, "grep", pattern="x", path="out/inner")
    assert "outside the workspace" in search(ws, "glob", pattern="out/*")


def open_descriptors() -> int:
    return len(os.listdir("/proc/self/fd"))


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="counts descriptors in /proc")
@pytest.mark.parametrize("open_folders", [1, 32])
def test_a_walk_never_comes_back_through_a_folder_swapped_for_a_link(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, open_folders: int
) -> None:
    """Deep below a folder, the walk may have closed it (``OPEN_FOLDERS``); when it comes back for
    the folder's other subfolders, it opens it again by name, never through the link now there."""
    monkeypatch.setattr(tree_walk, "OPEN_FOLDERS", open_folders, raising=False)
    ws = workspace(tmp_path)
    (ws / "t" / "deep" / "inner").mkdir(parents=True)
    (ws / "t" / "deep" / "inner" / "kept.txt").write_text("inside\n")
    (ws / "t" / "side").mkdir()
    (ws / "t" / "side" / "also.txt").write_text("inside\n")
    out = tmp_path / "outside-t"
    (out / "side").mkdir(parents=True)
    (out / "side" / "escaped.txt").write_text(OUTSIDE + "\n")
    before = open_descriptors()
    walk = tree_walk.Walk(ws.resolve(), threading.Event())
    listed = []
    for entry in walk.entries(ws.resolve()):
        listed.append(entry.relative)
        if entry.relative == "t/deep/inner/kept.txt":  # deep down: "t" is swapped for a link out
            os.rename(ws / "t", ws / "t.away")
            os.symlink(out, ws / "t")
    assert "t/deep/inner/kept.txt" in listed
    assert not any("escaped" in path for path in listed)
    assert open_descriptors() == before


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="counts descriptors in /proc")
def test_a_deep_walk_holding_few_folders_open_finds_what_one_holding_all_does(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ws = tmp_path / "ws"
    files = ("a/b/c/d/e/f.txt", "a/b/c/d/g.txt", "a/b/c/x/y.txt", "a/b/z.txt", "a/w/v/u.txt", "k/l/m.txt")
    for path in files:
        (ws / path).parent.mkdir(parents=True, exist_ok=True)
        (ws / path).write_text("hit\n")
    os.symlink("../../../k/l/m.txt", ws / "a" / "b" / "c" / "link.txt")
    expected = search(ws, "glob", policy=None, pattern="**")
    found = search(ws, "grep", policy=None, pattern="hit")
    assert "a/b/c/d/e/f.txt" in expected and "a/b/c/link.txt" in found
    for open_folders in (1, 2, 3):
        monkeypatch.setattr(tree_walk, "OPEN_FOLDERS", open_folders)
        before = open_descriptors()
        assert search(ws, "glob", policy=None, pattern="**") == expected
        assert search(ws, "grep", policy=None, pattern="hit") == found
        assert open_descriptors() == before
