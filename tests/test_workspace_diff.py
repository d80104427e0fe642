"""What a run changed in its workspace: the diff between two of its recorded trees, read from the
sink alone (``activities/workspaces/diff.py``), and ``durable-agent diff`` on a real run."""

from __future__ import annotations

import io
import subprocess
from pathlib import Path
from typing import Any

import pytest
from temporalio.client import Client

from durable_agent.activities import AgentActivities
from durable_agent.activities.sink_files import read_export_file
from durable_agent.activities.sinks import FilesystemExportSink
from durable_agent.activities.workspace_tree import WorkspaceTrees
from durable_agent.activities.workspaces.diff import (
    EMPTY_TREE,
    FileStat,
    diff_stat,
    reading_repo,
    run_trees,
    workspace_change,
    write_diff,
)
from durable_agent.activities.workspaces.errors import WorkspaceTreeError
from durable_agent.config import AgentConfig, WorkspaceCheckpointsConfig
from durable_agent.core.events import EventRecord, RewindEvent, RunStartEvent, ToolEndEvent, TurnEndEvent
from durable_agent.core.models import TokenUsage, WorkspaceState
from tests.helpers import final, running_worker, start, tool_call
from tests.test_rewind_update import workspace, writing_config
from tests.test_workspace_checkpoints import cli

BINARY = bytes(range(256))


async def recorded(tmp: Path) -> tuple[FilesystemExportSink, str, str]:
    """A workspace recorded twice, its objects in a filesystem sink (as a worker sends them):
    the sink, and the two trees."""
    ws = tmp / "ws"
    (ws / "sub").mkdir(parents=True)
    (ws / "a.txt").write_text("one\ntwo\nthree\n")
    (ws / "gone.txt").write_text("bye\n")
    (ws / "sub" / "same.txt").write_text("same\n")
    sink = FilesystemExportSink(tmp / "sink")
    trees = WorkspaceTrees(WorkspaceCheckpointsConfig(path=tmp / "worker-shadow"), {"s": sink})
    first = await trees.record(ws, "s")
    (ws / "a.txt").write_text("one\n2\nthree\n")
    (ws / "gone.txt").unlink()
    (ws / "sub" / "new.txt").write_text("new\n")
    (ws / "blob.bin").write_bytes(BINARY)
    second = await trees.record(ws, "s")
    assert first is not None and second is not None
    return sink, first.tree, second.tree


async def test_the_change_between_two_trees_comes_from_the_sink_alone(tmp_path: Path) -> None:
    sink, first, second = await recorded(tmp_path)
    repo = reading_repo(tmp_path / "fresh-shadow")  # holds nothing: every object comes from the sink
    change = await workspace_change(repo, sink, first, second)
    assert (change.base, change.final, change.truncated) == (first, second, False)
    assert change.files == ("a.txt", "blob.bin", "gone.txt", "sub/new.txt")
    assert change.diff_bytes == len(change.diff.encode())
    assert "--- a/a.txt\n+++ b/a.txt\n@@ -1,3 +1,3 @@\n one\n-two\n+2\n three\n" in change.diff
    assert "diff --git a/gone.txt b/gone.txt\ndeleted file mode 100644\n" in change.diff
    assert "-bye\n" in change.diff
    assert "new file mode 100644" in change.diff and "+new\n" in change.diff
    assert "Binary files /dev/null and b/blob.bin differ\n" in change.diff
    assert "same.txt" not in change.diff

    # the whole diff, written out, is the same text; its stat counts lines, a binary file none
    out = io.BytesIO()
    assert await write_diff(repo, sink, first, second, out) == change.diff_bytes
    assert out.getvalue().decode() == change.diff
    assert await diff_stat(repo, sink, first, second) == [
        FileStat("a.txt", 1, 1),
        FileStat("blob.bin", None, None),
        FileStat("gone.txt", 0, 1),
        FileStat("sub/new.txt", 1, 0),
    ]

    # cut on a line's end, the whole size still said; the files named up to max_files
    cut = await workspace_change(repo, sink, first, second, max_bytes=100, max_files=2)
    assert cut.truncated and cut.diff_bytes == change.diff_bytes
    assert cut.diff and cut.diff.endswith("\n") and len(cut.diff.encode()) <= 100
    assert change.diff.startswith(cut.diff)
    assert cut.files == ("a.txt", "blob.bin")

    # the same tree, or no final tree: nothing to compare
    assert (await workspace_change(repo, sink, second, second)).diff == ""
    assert await write_diff(repo, sink, second, second, out) == 0
    none = await workspace_change(repo, sink, first, None)
    assert (none.base, none.final, none.diff, none.files) == (first, None, "", ())


async def test_without_a_base_every_file_is_new(tmp_path: Path) -> None:
    sink, first, _ = await recorded(tmp_path)
    change = await workspace_change(reading_repo(tmp_path / "fresh-shadow"), sink, None, first)
    assert change.base is None and change.files == ("a.txt", "gone.txt", "sub/same.txt")
    assert change.diff.count("new file mode") == 3 and "deleted file" not in change.diff
    assert "+++ b/a.txt\n@@ -0,0 +1,3 @@\n+one\n+two\n+three\n" in change.diff
    held = reading_repo(tmp_path / "fresh-shadow").has([EMPTY_TREE])
    assert held == {EMPTY_TREE}  # written in the shadow, as git reads any tree


async def test_an_object_the_sink_lacks_is_named(tmp_path: Path) -> None:
    sink, first, second = await recorded(tmp_path)
    repo = WorkspaceTrees(WorkspaceCheckpointsConfig(path=tmp_path / "worker-shadow"), {}).repo(
        tmp_path / "ws"
    )
    [new_file] = [oid for oid in repo.objects_since(second, first) if repo.read([oid])[oid][1] == b"new\n"]
    sink.object_path(new_file).unlink()
    with pytest.raises(WorkspaceTreeError, match=f"does not hold object {new_file} .file 'sub/new.txt'"):
        await workspace_change(reading_repo(tmp_path / "fresh-shadow"), sink, first, second)
    sink.object_path(second).unlink()
    with pytest.raises(WorkspaceTreeError, match=f"does not hold tree {second}"):
        await workspace_change(reading_repo(tmp_path / "other-shadow"), sink, first, second)


def records(*events: object) -> list[EventRecord]:
    return [
        EventRecord.model_validate({"sequence": i, "timestamp_ms": 0, "event": e})
        for i, e in enumerate(events)
    ]


def test_a_runs_trees_by_turn() -> None:
    end = ToolEndEvent.of
    usage = TokenUsage()
    trees = run_trees(
        records(
            RunStartEvent(prompt="p", model="m", workspace=WorkspaceState(tree="b" * 40)),
            end("r1", "read", "ok", False),
            end("w1", "write", "ok", False, WorkspaceState(tree="1" * 40)),
            TurnEndEvent(turn=2, usage=usage),
            end("r2", "read", "ok", False),
            end("e1", "edit", "ok", False, WorkspaceState(tree="3" * 40)),
        )
    )
    assert trees.base == "b" * 40 and trees.turns == 4
    assert [trees.at(n) for n in range(5)] == ["b" * 40, "b" * 40, "1" * 40, "1" * 40, "3" * 40]
    assert trees.final == "3" * 40
    assert trees.first_recorded() == trees.boundaries[1] and trees.boundaries[1].call_id == "w1"
    with pytest.raises(ValueError, match="no turn 5"):
        trees.at(5)

    # no base recorded: none until the first call that records; a rewound run starts from its tree
    bare = run_trees(records(RunStartEvent(prompt="p", model="m"), end("w1", "write", "ok", False)))
    assert (bare.base, bare.final, bare.first_recorded()) == (None, None, None)
    rewound = run_trees(
        records(
            RunStartEvent(prompt="p", model="m"),
            RewindEvent(run_id="old", turn=1, content_digest="sha256:x", tree="r" * 40),
            end("r1", "read", "ok", False),
            RewindEvent(run_id="this", turn=1, content_digest="sha256:y", tree="z" * 40),
        )
    )
    assert (rewound.base, rewound.final) == ("r" * 40, "r" * 40)


# --- ``durable-agent diff`` on a real run -------------------------------------------------

SCRIPT = [
    tool_call("w1", "write", file_path="a.txt", content="alpha\n"),
    tool_call("r1", "read", file_path="a.txt"),
    tool_call("b1", "bash", command="echo beta > b.txt && echo changed > a.txt"),
    final("done"),
]


def ok(done: subprocess.CompletedProcess[str]) -> str:
    assert done.returncode == 0, done.stderr
    return done.stdout


def no_base() -> dict[str, Any]:
    """A config's keys for a run whose start records no base tree: a workspace that does not
    follow the run (before ``[workspaces]``, no run's start recorded one)."""
    return {"workspaces": {"follow": False}} if "workspaces" in AgentConfig.model_fields else {}


@pytest.mark.parametrize("without_base", [False, True], ids=["base", "no-base"])
async def test_the_cli_shows_a_runs_change_and_one_turns(
    client: Client, tmp_path: Path, without_base: bool
) -> None:
    ws = workspace(tmp_path)
    config = writing_config(tmp_path, SCRIPT, **(no_base() if without_base else {}))
    async with running_worker(client, AgentActivities(config)) as queue:
        handle = await start(client, queue, ws, "write, read, build")
        result = await handle.result()
    assert result.status == "completed", result.error
    last = sorted((tmp_path / "exports").rglob("turn-*.json"))[-1]
    base = run_trees(read_export_file(last).open().source_run().events).base

    # turn 3 (the bash command): both its tree and the one before were recorded
    third = ok(await cli(client, tmp_path, "diff", handle.id, "--turn", "3"))
    assert "--- a/a.txt\n+++ b/a.txt\n@@ -1 +1 @@\n-alpha\n+changed\n" in third
    assert "diff --git a/b.txt b/b.txt\nnew file mode 100644" in third and "+beta\n" in third
    assert "keep.txt" not in third
    # turn 2 (a read) changed nothing
    second = await cli(client, tmp_path, "diff", handle.id, "--turn", "2")
    assert second.returncode == 0 and second.stdout == "" and "no change" in second.stderr

    whole = await cli(client, tmp_path, "diff", handle.id)
    stat = ok(await cli(client, tmp_path, "diff", handle.id, "--stat"))
    if base is not None:  # the run's start recorded its workspace: the whole change, from it
        assert "base: not recorded" not in whole.stderr
        assert "+++ b/a.txt\n@@ -0,0 +1 @@\n+changed\n" in ok(whole)
        assert stat.splitlines() == [
            "+1 -0  a.txt",
            "+1 -0  b.txt",
            "2 files changed, 2 insertions(+), 0 deletions(-)",
        ]
        turn_1 = ok(await cli(client, tmp_path, "diff", handle.id, "--turn", "1"))
        assert "+++ b/a.txt\n@@ -0,0 +1 @@\n+alpha\n" in turn_1
    else:  # from the first tree recorded (after the write): the bash command's change
        assert "base: not recorded; from turn 1's tree" in whole.stderr
        assert ok(whole) == third
        assert stat.splitlines() == [
            "+1 -1  a.txt",
            "+1 -0  b.txt",
            "2 files changed, 2 insertions(+), 1 deletion(-)",
        ]
        refused = await cli(client, tmp_path, "diff", handle.id, "--turn", "1")
        assert refused.returncode == 1 and "no tree before it" in refused.stderr, refused.stderr

    # the same from the export file, and from the sink alone by session and run
    assert ok(await cli(client, tmp_path, "diff", str(last), "--turn", "3")) == third
    by_session = ["diff", result.run_id, "--session", result.session_id, "--turn", "3"]
    assert ok(await cli(client, tmp_path, *by_session)) == third

    # errors: a turn the run does not have, a run it does not know, a sink without objects
    beyond = await cli(client, tmp_path, "diff", handle.id, "--turn", "9")
    assert beyond.returncode == 2 and "has no turn 9 (its turns: 1 to 3)" in beyond.stderr
    unknown = await cli(client, tmp_path, "diff", "no-such-run")
    assert unknown.returncode == 1 and "no-such-run" in unknown.stderr
    nobody = await cli(client, tmp_path, "diff", result.run_id, "--session", "nobody")
    assert nobody.returncode == 1 and "holds no export of run" in nobody.stderr
