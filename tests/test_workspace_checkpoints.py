"""The workspace recorded with the checkpoint: a git tree at each boundary of a tool that may
change files, its objects in the sink; rewind and resume rebuild the files from there."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

from temporalio.client import Client, WorkflowExecutionStatus, WorkflowFailureError

from durable_agent.activities import AgentActivities
from durable_agent.activities.sink_files import read_export_file
from durable_agent.activities.sinks import FilesystemExportSink, ObjectSink
from durable_agent.activities.workspace_tree import WorkspaceTrees
from durable_agent.activities.workspaces.fetching import restore_tree
from durable_agent.activities.workspaces.objects import object_id
from durable_agent.activities.workspaces.shadow import ShadowRepo
from durable_agent.client import resume_run
from durable_agent.config import WorkspaceCheckpointsConfig
from durable_agent.core.events import RunStartEvent, ToolEndEvent
from durable_agent.core.export import workspace_tree_of
from durable_agent.core.failures import failure_message
from durable_agent.core.models import WorkspaceState
from tests.helpers import final, running_worker, scripted_config, start, tool_call

Files = dict[str, tuple[bytes, int]]


def files_of(folder: Path) -> Files:
    """Every file under ``folder`` but its ``.git``: bytes and mode (a link: its target)."""
    out: Files = {}
    for path in sorted(folder.rglob("*")):
        rel = path.relative_to(folder).as_posix()
        if rel == ".git" or rel.startswith(".git/"):
            continue
        st = path.lstat()
        if path.is_symlink():
            out[rel] = (os.readlink(path).encode(), 0o120000)
        elif path.is_file():
            out[rel] = (path.read_bytes(), st.st_mode & 0o777)
    return out


def sink_objects(sink_root: Path) -> set[str]:
    folder = sink_root / "~objects"
    return {p.parent.name + p.name for p in folder.glob("*/*") if not p.name.startswith(".")}


def test_the_filesystem_sink_holds_objects() -> None:
    assert isinstance(FilesystemExportSink(Path("/nonexistent")), ObjectSink)


async def test_a_tree_leaves_out_ignored_and_large_files_and_rebuilds_byte_for_byte(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    (ws / "sub").mkdir(parents=True)
    (ws / "a.txt").write_text("a\n")
    (ws / ".gitignore").write_text("*.log\n")
    (ws / "x.log").write_text("ignored")
    (ws / "big.bin").write_bytes(b"x" * 2000)
    (ws / "sub" / "run.sh").write_text("#!/bin/sh\n")
    (ws / "sub" / "run.sh").chmod(0o755)
    (ws / "link").symlink_to("a.txt")
    subprocess.run(["git", "init", "-q", str(ws)], check=True)
    git_before = files_of_git(ws)
    sink = FilesystemExportSink(tmp_path / "sink")
    config = WorkspaceCheckpointsConfig(path=tmp_path / "shadow", max_file_bytes=1000)
    trees = WorkspaceTrees(config, {"s": sink}, exclude=[ws / "store"])
    (ws / "store").mkdir()
    (ws / "store" / "state.json").write_text("{}")

    first = await trees.record(ws, "s")
    assert first is not None and first.left_out == ("big.bin",)
    held = sink_objects(tmp_path / "sink")
    # the tree, a.txt, .gitignore, link, sub, run.sh: neither x.log, big.bin nor the store
    assert len(held) == 6
    for oid in held:
        assert object_id(sink.object_path(oid).read_bytes()) == oid

    (ws / "a.txt").write_text("a2\n")
    second = await trees.record(ws, "s")
    assert second is not None and second.tree != first.tree
    assert len(sink_objects(tmp_path / "sink")) == 8  # only the new a.txt and the new root tree
    assert await trees.differences(ws, first.tree, "s") == ["a.txt: changed"]
    assert await trees.differences(ws, second.tree, "s") == []

    # rebuilt elsewhere, from the sink alone (a fresh shadow)
    elsewhere = tmp_path / "elsewhere"
    await restore_tree(ShadowRepo(tmp_path / "other-shadow", elsewhere), first.tree, sink)
    expected = {k: v for k, v in files_of(ws).items() if k not in ("x.log", "big.bin", "store/state.json")}
    expected["a.txt"] = (b"a\n", 0o644)
    assert files_of(elsewhere) == expected

    # rewound in place: a file made since goes, the ignored and the left-out stay
    (ws / "new.txt").write_text("new")
    await restore_tree(trees.repo(ws), first.tree, sink)
    assert files_of(ws) == {**expected, "x.log": (b"ignored", 0o644), "big.bin": (b"x" * 2000, 0o644)} | {
        "store/state.json": (b"{}", 0o644)
    }
    assert files_of_git(ws) == git_before  # the workspace's own repository is untouched


def files_of_git(ws: Path) -> dict[str, bytes]:
    return {p.relative_to(ws).as_posix(): p.read_bytes() for p in (ws / ".git").rglob("*") if p.is_file()}


def test_a_workspace_state_without_left_out_files_keeps_its_json_small() -> None:
    end = ToolEndEvent.of("c", "edit", "ok", False)
    assert "workspace" not in end.model_dump(mode="json")
    state = WorkspaceState(tree="0" * 40)
    assert ToolEndEvent.of("c", "edit", "ok", False, state).model_dump(mode="json")["workspace"] == {
        "tree": "0" * 40
    }


SCRIPT = [
    tool_call("e1", "edit", file_path="a.txt", old_string="one", new_string="two"),
    tool_call(
        "b1", "bash", command="mkdir gen && echo x > gen/x.txt && echo y > y.txt && echo l > build.log"
    ),
    tool_call("e2", "edit", file_path="a.txt", old_string="two", new_string="three"),
    final("done"),
]


def run_config(tmp: Path) -> Any:
    return scripted_config(
        tmp,
        SCRIPT,
        permissions={"allow": ["read(*)", "edit(*)", "bash"], "default": "deny"},
        sandbox={"kind": "none"},
        workspace_checkpoints={"path": str(tmp / "worker-shadow")},
    )


def cli_config(tmp: Path) -> Path:
    """The CLI's config on "another machine": the same sink, a shadow of its own."""
    path = tmp / "cli.toml"
    path.write_text(
        f'[sinks.local]\nkind = "filesystem"\npath = "{tmp / "exports"}"\n'
        f'[workspace_checkpoints]\npath = "{tmp / "cli-shadow"}"\n'
    )
    return path


async def cli(client: Client, tmp: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "AGENT_CONFIG": str(cli_config(tmp))}
    env["TEMPORAL_ADDRESS"] = client.service_client.config.target_host
    env["TEMPORAL_NAMESPACE"] = client.namespace
    env["AGENT_TASK_QUEUE"] = f"nobody-{uuid.uuid4().hex[:8]}"  # the new run waits: files stay as rebuilt
    command = [sys.executable, "-m", "durable_agent.cli", *args]
    return await asyncio.to_thread(subprocess.run, command, env=env, cwd=tmp, capture_output=True, text=True)


async def test_rewind_before_a_bash_command_and_resume_elsewhere(client: Client, tmp_path: Path) -> None:
    ws = tmp_path / "workspace"
    ws.mkdir()
    (ws / "a.txt").write_text("one\n")
    (ws / "keep.txt").write_text("kept\n")
    (ws / ".gitignore").write_text("*.log\n")
    start_files = files_of(ws)
    config = run_config(tmp_path)
    async with running_worker(client, AgentActivities(config)) as queue:
        handle = await start(client, queue, ws, prompt="edit, build, edit")
        result = await handle.result()
    assert result.status == "completed", result.error
    end_files = files_of(ws)

    # every boundary of the three calls carries its tree, and the export carries them
    exports = sorted((tmp_path / "exports").rglob("turn-*.json"))
    last = read_export_file(exports[-1]).open()
    ends = [r.event for r in last.source_run().events if isinstance(r.event, ToolEndEvent)]
    trees = [e.workspace.tree for e in ends if e.workspace is not None]
    assert [e.id for e in ends] == ["e1", "b1", "e2"] and len(set(trees)) == 3, [
        (e.id, e.output[:200], e.workspace) for e in ends
    ]

    # the sink grew by the base's objects (its workspace follows the run) and those each
    # boundary changed, no more
    [start_event] = [r.event for r in last.source_run().events if isinstance(r.event, RunStartEvent)]
    assert start_event.workspace is not None
    base = start_event.workspace.tree
    shadow = WorkspaceTrees(config.workspace_checkpoints, {}).repo(ws)
    wanted = set(shadow.objects_since(base, None)) | set(shadow.objects_since(trees[0], base))
    wanted |= set(shadow.objects_since(trees[1], trees[0])) | set(shadow.objects_since(trees[2], trees[1]))
    assert sink_objects(tmp_path / "exports") == wanted
    assert len(set(shadow.objects_since(trees[2], trees[1]))) == 2  # a.txt and the root tree

    # rewind to turn 1 (before the bash command): its files, byte for byte; the ignored log stays
    done = await cli(client, tmp_path, "rewind", handle.id, "--turn", "1", "--no-follow")
    assert done.returncode == 0, done.stderr
    at_turn_1 = {**start_files, "a.txt": (b"two\n", 0o644)}
    assert files_of(ws) == {**at_turn_1, "build.log": (b"l\n", 0o644)}
    new_id = done.stdout.strip().splitlines()[-1]
    new_run = client.get_workflow_handle(new_id)
    assert (await new_run.describe()).status == WorkflowExecutionStatus.RUNNING
    await new_run.terminate("test over")

    # a resume from the last export here is refused, naming what differs; forced, it runs
    last_export = read_export_file(exports[-1])
    async with running_worker(client, AgentActivities(config)) as queue:
        refused = await resume_run(client, last_export, queue=queue, workspace=str(ws))
        try:
            await refused.result()
            raise AssertionError("the resume was not refused")
        except WorkflowFailureError as exc:
            message = failure_message(exc)
        assert "a.txt: changed; gen/x.txt: missing; y.txt: missing" in message, message
        forced = await resume_run(client, last_export, queue=queue, workspace=str(ws), force_resume=True)
        assert (await forced.result()).status == "completed"

    # resume on an empty folder with --restore-workspace: the files at the export's turn
    empty = tmp_path / "empty"
    done = await cli(
        client, tmp_path, "resume", str(exports[-1]), "--restore-workspace", str(empty), "--no-follow"
    )
    assert done.returncode == 0, done.stderr
    assert files_of(empty) == {k: v for k, v in end_files.items() if k != "build.log"}
    assert workspace_tree_of(last.source_run().events) == trees[2]
    resumed = client.get_workflow_handle(done.stdout.strip().splitlines()[-1])
    await resumed.terminate("test over")
