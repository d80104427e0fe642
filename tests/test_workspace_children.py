"""Children of a run whose workspace follows it (docs/workspaces.md, Subagents): a child that may
change files works on a copy of its own, made from its parent's tree at the ``task`` call, and
its change is merged into the parent's tree in call order (``workflows/child_merge.py``,
``activities/workspaces/merges.py``); a conflict is a tool error naming the files and the child's
tree, and nothing is lost; a child that only reads shares its parent's copy. Real Temporal, real
workers, real git."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path
from typing import Any

from temporalio.client import Client

from durable_agent.activities import AgentActivities
from durable_agent.activities.providers.model_provider import TextSink, assistant_step
from durable_agent.activities.sinks import ObjectSink
from durable_agent.activities.workspaces.fetching import restore_tree
from durable_agent.activities.workspaces.merges import merge_trees
from durable_agent.activities.workspaces.shadow import ShadowRepo
from durable_agent.client import run_result
from durable_agent.core.activity_api import ModelCallInput
from durable_agent.core.events import EventRecord, RunStartEvent, ToolEndEvent
from durable_agent.core.models import ModelResponse, TextBlock, TokenUsage, ToolResultBlock, ToolUseBlock
from tests.helpers import run_status, running_worker, scripted_config, start

USAGE = TokenUsage(prompt_tokens=1, completion_tokens=1, total_tokens=2)


def first_text(call: ModelCallInput) -> str:
    return "".join(b.text for b in call.messages[0].content if isinstance(b, TextBlock))


def results(call: ModelCallInput) -> list[ToolResultBlock]:
    return [b for m in call.messages for b in m.content if isinstance(b, ToolResultBlock)]


class ForkModel:
    """``fan out`` asks one ``task`` a line of its prompt after the first (``TYPE: PROMPT``, the
    type optional), then runs ``cat *.txt`` and ends with what it read. A child's prompt is a
    shell command it runs (``read PATH``: a file it reads), then it ends with what it got."""

    def __init__(self) -> None:
        self.calls: list[ModelCallInput] = []

    async def complete(self, call: ModelCallInput, model: str, on_text: TextSink) -> ModelResponse:
        self.calls.append(call)
        prompt = first_text(call)
        step = sum(1 for m in call.messages if m.role == "assistant")
        if prompt.startswith("fan out"):
            if step == 0:
                uses = []
                for number, line in enumerate(prompt.splitlines()[1:]):
                    kind, _, text = line.rpartition(": ")
                    extra = {"agent_type": kind} if kind else {}
                    task = {"description": f"child {number}", "prompt": text, **extra}
                    uses.append(ToolUseBlock(id=f"t{number}", name="task", input=task))
                return assistant_step(uses, USAGE, "tool_use")
            if step == 1:
                cat = ToolUseBlock(id="cat", name="bash", input={"command": "cat *.txt"})
                return assistant_step([cat], USAGE, "tool_use")
            return assistant_step([TextBlock(text="done")], USAGE, "end_turn")
        if step == 0:
            if prompt.startswith("read "):
                use = ToolUseBlock(id="c1", name="read", input={"file_path": prompt.removeprefix("read ")})
            else:
                use = ToolUseBlock(id="c1", name="bash", input={"command": prompt})
            return assistant_step([use], USAGE, "tool_use")
        [result] = results(call)
        return assistant_step([TextBlock(text=f"did: {prompt}: {result.content}")], USAGE, "end_turn")


def config(tmp: Path) -> Any:
    return scripted_config(
        tmp,
        [{"text": "unused"}],
        agents={"enabled": True, "types": {"reader": {"tools": ["read", "ls"]}}},
        permissions={"allow": ["read(**)", "ls(**)", "write(**)", "bash"], "default": "deny"},
        workspaces={"root": str(tmp / "workspaces")},
    )


def workspace(tmp: Path) -> Path:
    ws = tmp / "repo"
    ws.mkdir()
    (ws / "f.txt").write_text("one\ntwo\nthree\nfour\nfive\n")
    return ws


async def events_of(client: Client, workflow_id: str) -> list[Any]:
    handle = client.get_workflow_handle(workflow_id)
    records: list[EventRecord] = await handle.query("events", 0, result_type=list[EventRecord])
    return [r.event for r in records]


async def fan_out(
    client: Client, tmp: Path, prompts: list[str]
) -> tuple[Any, Any, list[Any], list[list[Any]], ObjectSink]:
    """Run the parent over ``prompts`` (one child each); its result, status and events, each
    child's events, and its sink (a filesystem sink: it holds the trees)."""
    ws = workspace(tmp)
    acts = AgentActivities(config(tmp), providers={"scripted": ForkModel()})
    async with running_worker(client, acts) as queue:
        handle = await start(client, queue, ws, "fan out\n" + "\n".join(prompts))
        result = await run_result(client, handle.id)
        status = await run_status(handle)
        events = await events_of(client, handle.id)
        # the children's own events, read while a worker answers their queries
        children = [await events_of(client, c.workflow_id) for c in status.children]
    assert result.status == "completed", result.error
    sink = acts.sinks["local"]
    assert isinstance(sink, ObjectSink)
    return result, status, events, children, sink


def ends(events: list[Any]) -> dict[str, ToolEndEvent]:
    return {e.id: e for e in events if isinstance(e, ToolEndEvent)}


async def test_children_that_edit_different_files_both_reach_the_parent(
    client: Client, tmp_path: Path
) -> None:
    result, status, events, _, _ = await fan_out(
        client,
        tmp_path,
        [
            "echo alpha > a.txt",
            "echo beta > b.txt && sed -i s/five/FIVE/ f.txt",
            "sed -i s/one/ONE/ f.txt",
        ],
    )
    by_id = ends(events)
    assert not any(by_id[f"t{i}"].is_error for i in range(3)), [by_id[f"t{i}"].output for i in range(3)]
    # the parent's next call ran on the merged tree: every child's change is there
    cat = by_id["cat"].output
    assert "alpha" in cat and "beta" in cat and "ONE" in cat and "FIVE" in cat, cat
    change = result.workspace
    assert change is not None and set(change.files) == {"a.txt", "b.txt", "f.txt"}, change
    # each child that wrote worked in a folder of its own, under the root
    root = tmp_path / "workspaces"
    for child in status.children:
        assert child.run_id is not None and list(root.glob(f"*/{child.run_id}")), child


async def test_children_that_edit_the_same_lines_conflict_and_nothing_is_lost(
    client: Client, tmp_path: Path
) -> None:
    result, _, events, _, sink = await fan_out(
        client, tmp_path, ["sed -i s/one/ONE/ f.txt", "sed -i s/one/uno/ f.txt && echo kept > c.txt"]
    )
    by_id = ends(events)
    assert not by_id["t0"].is_error
    conflict = by_id["t1"]
    assert conflict.is_error and "conflict" in conflict.output and "f.txt" in conflict.output, conflict.output
    assert "did: sed -i s/one/uno/" in conflict.output  # the child's answer stays
    # the parent's workspace holds the first child's change, not the second's
    assert (
        "ONE" in by_id["cat"].output
        and "uno" not in by_id["cat"].output
        and "kept" not in by_id["cat"].output
    )
    # the second child's files are in the tree the error names, which the sink holds
    [tree] = re.findall(r"\b[0-9a-f]{40}\b", conflict.output)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    await restore_tree(ShadowRepo(tmp_path / "shadows", elsewhere), tree, sink)
    assert (elsewhere / "f.txt").read_text().startswith("uno\n") and (
        elsewhere / "c.txt"
    ).read_text() == "kept\n"
    assert result.workspace is not None and set(result.workspace.files) == {"f.txt"}


async def test_a_child_that_only_reads_shares_the_parents_copy(client: Client, tmp_path: Path) -> None:
    _, status, events, [child_events], _ = await fan_out(client, tmp_path, ["reader: read f.txt"])
    [child] = status.children
    assert child.run_id is not None
    # no folder of its own: it worked in its parent's, on its parent's tree
    assert not list((tmp_path / "workspaces").glob(f"*/{child.run_id}"))
    [start_event] = [e for e in events if isinstance(e, RunStartEvent)]
    [child_start] = [e for e in child_events if isinstance(e, RunStartEvent)]
    assert child_start.workspace is not None and start_event.workspace is not None
    assert child_start.workspace.tree == start_event.workspace.tree
    answer = ends(events)["t0"]
    assert not answer.is_error and "three" in answer.output, answer.output


def _git(cwd: Path, *args: str) -> str:
    env = {**os.environ, "GIT_CONFIG_GLOBAL": os.devnull, "GIT_CONFIG_NOSYSTEM": "1"}
    return subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, env=env, check=True).stdout


def test_merge_trees_clean_conflicting_and_deleted(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    repo = ShadowRepo(tmp_path / "shadows", ws)

    def tree(files: dict[str, str]) -> str:
        for old in ws.iterdir():
            old.unlink()
        for name, text in files.items():
            (ws / name).write_text(text)
        return repo.record().tree

    base = tree({"f.txt": "1\n2\n3\n4\n5\n", "g.txt": "g\n"})
    ours = tree({"f.txt": "ONE\n2\n3\n4\n5\n", "g.txt": "g\n"})
    theirs = tree({"f.txt": "1\n2\n3\n4\nFIVE\n", "g.txt": "g\n", "new.txt": "n\n"})
    done = merge_trees(repo, base, ours, theirs)
    assert done.tree is not None and not done.conflicts
    listed = repo.git("ls-tree", "-r", "--name-only", done.tree).decode().split()
    assert listed == ["f.txt", "g.txt", "new.txt"]
    merged = repo.git("cat-file", "blob", f"{done.tree}:f.txt").decode()
    assert merged == "ONE\n2\n3\n4\nFIVE\n"
    # the same three trees merge to the same tree at an attempt again
    assert merge_trees(repo, base, ours, theirs) == done
    # one side changed a file the other removed: a conflict naming it
    removed = tree({"f.txt": "1\n2\n3\n4\n5\n"})
    changed = tree({"f.txt": "1\n2\n3\n4\n5\n", "g.txt": "G\n"})
    clash = merge_trees(repo, base, removed, changed)
    assert clash.tree is None and clash.conflicts == ("g.txt",)
    # both changed the same line
    both = merge_trees(repo, base, ours, tree({"f.txt": "uno\n2\n3\n4\n5\n", "g.txt": "g\n"}))
    assert both.tree is None and both.conflicts == ("f.txt",)
