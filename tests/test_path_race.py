"""A link that flips between the permission check and the open never hands over what the rules
deny: the file tools walk the path without following links and judge what they opened."""

from __future__ import annotations

import contextvars
import os
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from durable_agent.activities.tools.edits import edit
from durable_agent.activities.tools.fs import ls, read, write
from durable_agent.activities.tools.path_guard import check_resolved
from durable_agent.activities.tools.tool import ToolContent, ToolFailure
from durable_agent.core.activity_api import ToolCallInput
from durable_agent.core.builtin_catalog import BUILTIN_TOOLS
from durable_agent.core.permissions import PermissionPolicy
from durable_agent.core.tool_args import EditArgs, LsArgs, ReadArgs, WriteArgs
from durable_agent.core.tool_specs import validate_args

SECRET = "SECRET-DOTENV-CONTENT 0451"
POLICY = PermissionPolicy(
    allow=("read", "ls", "write", "edit"),
    deny=("read(**/.env)", "edit(**/.env)", "write(.git/**)", "ls(.git/**)"),
    ask=(),
    default="deny",
)
# Enough attempts that the old check-then-open lost about one in ten of them.
ATTEMPTS = 1500


def workspace(tmp: Path) -> Path:
    ws = tmp / "ws"
    (ws / ".git" / "hooks").mkdir(parents=True)
    (ws / "src").mkdir()
    (ws / ".env").write_text(SECRET + "\n")
    (ws / "harmless.txt").write_text("nothing to see\n")
    return ws


@contextmanager
def flipping(link: Path, targets: tuple[str, str]) -> Iterator[list[int]]:
    """A thread that points ``link`` at one target and then the other, atomically, until the
    block ends (at most a bounded number of flips); yields the count of flips so far."""
    stop = threading.Event()
    flips = [0]

    def flip() -> None:
        tmp = link.with_name(link.name + ".flip")
        while not stop.is_set() and flips[0] < 2_000_000:
            for target in targets:
                os.symlink(target, tmp)
                os.replace(tmp, link)
                flips[0] += 1

    os.symlink(targets[0], link)
    thread = threading.Thread(target=flip, daemon=True)
    thread.start()
    try:
        yield flips
    finally:
        stop.set()
        thread.join(10)


def tool_run(ws: Path, name: str, run: Callable[[Any, Path], Any], **arguments: Any) -> Any:
    """What the tool activity does with one call: judge the path (as given and as resolved),
    then run the tool, in a context of its own (as each activity has)."""

    def one() -> Any:
        inp = ToolCallInput(
            run_id="r", workspace=str(ws), call_id="c", name=name, arguments=arguments, permissions=POLICY
        )
        spec = BUILTIN_TOOLS[name]
        refused = check_resolved(inp, spec, arguments)
        if refused is not None:
            return refused.content
        try:
            result = run(validate_args(spec, arguments), ws)
        except ToolFailure as exc:
            return f"failed: {exc}"
        return result.text if isinstance(result, ToolContent) else result

    return contextvars.copy_context().run(one)


def test_a_read_through_a_flipping_link_never_returns_the_denied_file(tmp_path: Path) -> None:
    ws = workspace(tmp_path)
    outcomes = {"read": 0, "refused": 0}
    with flipping(ws / "notes.txt", ("harmless.txt", ".env")) as flips:
        for _ in range(ATTEMPTS):
            out = tool_run(ws, "read", read, file_path="notes.txt")
            assert SECRET not in out
            outcomes["read" if "nothing to see" in out else "refused"] += 1
    assert flips[0] > ATTEMPTS // 10  # the link really flipped while the reads ran
    assert outcomes["read"] and outcomes["refused"], outcomes  # both sides were seen


def test_a_read_through_a_flipping_folder_link_never_returns_the_denied_file(tmp_path: Path) -> None:
    ws = workspace(tmp_path)
    (ws / "config").mkdir()
    (ws / "config" / ".env").write_text(SECRET + "\n")
    (ws / "public").mkdir()
    (ws / "public" / "env.txt").write_text("public settings\n")
    os.symlink(".env", ws / "config" / "env.txt")
    with flipping(ws / "cfg", ("public", "config")):
        for _ in range(ATTEMPTS):
            assert SECRET not in tool_run(ws, "read", read, file_path="cfg/env.txt")


def test_a_link_flipped_to_outside_the_workspace_is_never_read(tmp_path: Path) -> None:
    ws = workspace(tmp_path)
    outside = tmp_path / "outside.txt"
    outside.write_text(SECRET + "\n")
    with flipping(ws / "notes.txt", ("harmless.txt", str(outside))):
        for _ in range(ATTEMPTS):
            out = contextvars.copy_context().run(_plain_read, ws)
            assert SECRET not in out


def _plain_read(ws: Path) -> str:
    """A read with no permission rules (an embedding without ``[permissions]``): confinement alone."""
    try:
        result = read(ReadArgs(file_path="notes.txt"), ws)
    except ToolFailure as exc:
        return str(exc)
    return result.text if isinstance(result, ToolContent) else result


def test_an_edit_through_a_flipping_link_never_changes_the_denied_file(tmp_path: Path) -> None:
    ws = workspace(tmp_path)
    (ws / "harmless.txt").write_text(f"{SECRET}\n")  # the same text, so an edit could apply to either
    with flipping(ws / "notes.txt", ("harmless.txt", ".env")):
        for i in range(ATTEMPTS // 3):
            out = tool_run(ws, "edit", edit, file_path="notes.txt", old_string="0451", new_string=f"{i}")
            assert SECRET not in out
            (ws / "harmless.txt").write_text(f"{SECRET}\n")
    assert (ws / ".env").read_text() == SECRET + "\n"


def test_a_write_through_a_flipping_folder_link_never_lands_in_the_denied_folder(tmp_path: Path) -> None:
    ws = workspace(tmp_path)
    with flipping(ws / "out", ("src", ".git/hooks")):
        for i in range(ATTEMPTS // 3):
            tool_run(
                ws, "write", write, file_path=f"out/pre-commit-{i % 7}", content="#!/bin/sh\necho pwned\n"
            )
    assert sorted(os.listdir(ws / ".git" / "hooks")) == []
    assert (ws / "src" / "pre-commit-0").read_text().endswith("pwned\n")


def test_ls_through_a_flipping_folder_link_never_lists_the_denied_folder(tmp_path: Path) -> None:
    ws = workspace(tmp_path)
    (ws / ".git" / "hooks" / "post-checkout").write_text("#!/bin/sh\n")
    with flipping(ws / "view", ("src", ".git/hooks")):
        for _ in range(ATTEMPTS // 3):
            assert "post-checkout" not in tool_run(ws, "ls", ls, path="view")


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        ("notes.txt", "nothing to see"),
        ("./src/../notes.txt", "nothing to see"),
        ("chain", "nothing to see"),
    ],
)
def test_links_inside_the_workspace_still_read_as_before(tmp_path: Path, path: str, expected: str) -> None:
    ws = workspace(tmp_path)
    os.symlink("harmless.txt", ws / "notes.txt")
    os.symlink("notes.txt", ws / "chain")
    assert expected in tool_run(ws, "read", read, file_path=path)


def test_a_link_loop_and_a_link_out_are_clear_failures(tmp_path: Path) -> None:
    ws = workspace(tmp_path)
    os.symlink("loop-b", ws / "loop-a")
    os.symlink("loop-a", ws / "loop-b")
    os.symlink("/etc/passwd", ws / "out")
    with pytest.raises(ToolFailure, match=r"cannot be resolved|too many links"):
        read(ReadArgs(file_path="loop-a"), ws)
    with pytest.raises(ToolFailure, match="outside the workspace"):
        read(ReadArgs(file_path="out"), ws)
    with pytest.raises(ToolFailure, match="outside the workspace"):
        ls(LsArgs(path="../"), ws)
    assert "created" in write(WriteArgs(file_path="new/deep/file.txt", content="x"), ws)
    assert "edited" in edit(EditArgs(file_path="new/deep/file.txt", old_string="x", new_string="y"), ws)
