"""Subagents (docs/subagents.md): a ``task`` call starts a child ``AgentRun`` whose answer is the
call's result. Real Temporal, real workers; a model that answers from the prompt it is given
(``TreeModel``), and the scripted model in the ``kill -9`` test."""

from __future__ import annotations

import asyncio
import io
import json
from pathlib import Path
from typing import Any

import pytest
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowExecutionStatus, WorkflowHandle

from durable_agent.activities import AgentActivities
from durable_agent.activities.providers.model_provider import TextSink, assistant_step
from durable_agent.activities.sinks import read_export_file
from durable_agent.cli.render import EventPrinter, print_status
from durable_agent.cli.run_commands import _print_tree
from durable_agent.client import run_result, start_run
from durable_agent.config import ConfigError, parse_config
from durable_agent.core.activity_api import ModelCallInput
from durable_agent.core.events import EventRecord, SubagentEndEvent, SubagentStartEvent
from durable_agent.core.export import SessionCheckpointExportV1
from durable_agent.core.models import ModelResponse, TextBlock, TokenUsage, ToolResultBlock, ToolUseBlock
from durable_agent.core.permissions import PermissionPolicy
from durable_agent.core.run_api import SA_RUN_STATUS, SA_SESSION_ID, AgentRunInput, RunStatusView
from durable_agent.core.subagents import (
    ChildRun,
    bounded_answer,
    child_policy,
    child_workflow_id,
    task_answer,
)
from tests.helpers import RecordingSink, run_status, running_worker, scripted_config, start, until
from tests.test_crash_recovery import export_files, until_alive, workers, write_setup
from tests.test_workspace_checkpoints import cli

PARTS = ("alpha", "beta", "gamma")


def repository(tmp: Path) -> Path:
    """A repository of three parts, each a file of fifty lines the parent must not read itself."""
    ws = tmp / "repo"
    for part in PARTS:
        (ws / part).mkdir(parents=True)
        lines = [f"{part} line {i}" for i in range(50)]
        (ws / part / "notes.txt").write_text(f"SUMMARY-{part.upper()}\n" + "\n".join(lines) + "\n")
    (ws / "secret.txt").write_text("top secret\n")
    return ws


def first_text(call: ModelCallInput) -> str:
    return "".join(b.text for b in call.messages[0].content if isinstance(b, TextBlock))


def results(call: ModelCallInput) -> list[ToolResultBlock]:
    return [b for m in call.messages for b in m.content if isinstance(b, ToolResultBlock)]


class TreeModel:
    """A model that answers from its prompt: ``fan out: A B C`` asks one ``task`` per word at once,
    then answers with what they said; ``read PATH`` reads the file and answers with its first line.
    ``hold``: children's first steps wait until this many are in flight (or the test's end)."""

    def __init__(self, hold: int = 0, child_tokens: int = 2, agent_type: str | None = None) -> None:
        self.calls: list[ModelCallInput] = []
        self.hold = hold
        self.in_flight = 0
        self.most_in_flight = 0
        self.child_tokens = child_tokens
        self.agent_type = agent_type
        self.release = asyncio.Event()

    async def complete(self, call: ModelCallInput, model: str, on_text: TextSink) -> ModelResponse:
        self.calls.append(call)
        prompt = first_text(call)
        step = sum(1 for m in call.messages if m.role == "assistant")
        usage = TokenUsage(prompt_tokens=1, completion_tokens=1, total_tokens=2)
        if prompt.startswith("fan out:"):
            if step == 0:
                words = prompt.removeprefix("fan out:").split()
                extra = {"agent_type": self.agent_type} if self.agent_type else {}
                uses = [
                    ToolUseBlock(
                        id=f"t-{w}",
                        name="task",
                        input={"description": f"read {w}", "prompt": f"read {w}/notes.txt", **extra},
                    )
                    for w in words
                ]
                return assistant_step(uses, usage, "tool_use")
            said = " | ".join(r.content for r in results(call))
            return assistant_step([TextBlock(text=f"the parts say: {said}")], usage, "end_turn")
        path = prompt.removeprefix("read ").strip()
        if step == 0:
            await self._held()
            return assistant_step(
                [ToolUseBlock(id="r1", name="read", input={"file_path": path})], usage, "tool_use"
            )
        [result] = results(call)
        first = (
            result.content.splitlines()[0].split("\t")[-1]
            if not result.is_error
            else f"error: {result.content}"
        )
        tokens = TokenUsage(
            prompt_tokens=self.child_tokens - 1, completion_tokens=1, total_tokens=self.child_tokens
        )
        return assistant_step([TextBlock(text=f"{path}: {first}")], tokens, "end_turn")

    async def _held(self) -> None:
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        try:
            if self.hold and self.in_flight >= self.hold:
                self.release.set()
            if self.hold:
                await asyncio.wait_for(self.release.wait(), 15)
        finally:
            self.in_flight -= 1


def agents_config(tmp: Path, **agents: Any) -> Any:
    extra: dict[str, Any] = {"enabled": True, **agents}
    return scripted_config(
        tmp,
        [{"text": "unused"}],
        agents=extra,
        permissions={"allow": ["read(**)"], "default": "deny"},
    )


async def child_events(handle: WorkflowHandle[Any, Any]) -> list[tuple[str, int]]:
    """The history's child workflow events, in order: ``("started"|"completed"|…, event id)``."""
    kinds = {
        EventType.EVENT_TYPE_START_CHILD_WORKFLOW_EXECUTION_INITIATED: "initiated",
        EventType.EVENT_TYPE_CHILD_WORKFLOW_EXECUTION_STARTED: "started",
        EventType.EVENT_TYPE_CHILD_WORKFLOW_EXECUTION_COMPLETED: "completed",
        EventType.EVENT_TYPE_CHILD_WORKFLOW_EXECUTION_CANCELED: "canceled",
        EventType.EVENT_TYPE_CHILD_WORKFLOW_EXECUTION_FAILED: "failed",
    }
    return [
        (kinds[e.event_type], e.event_id)
        async for e in handle.fetch_history_events()
        if e.event_type in kinds
    ]


def by_run(exports: list[SessionCheckpointExportV1]) -> dict[str, list[SessionCheckpointExportV1]]:
    out: dict[str, list[SessionCheckpointExportV1]] = {}
    for export in exports:
        out.setdefault(export.descriptor.run_id, []).append(export)
    return out


def ends_of(export: SessionCheckpointExportV1) -> list[SubagentEndEvent]:
    return [r.event for r in export.open().source_run().events if isinstance(r.event, SubagentEndEvent)]


# --- the fan-out ------------------------------------------------------------------------------


async def test_three_subagents_read_three_parts_at_once(client: Client, tmp_path: Path) -> None:
    ws = repository(tmp_path)
    model = TreeModel(hold=3)
    sink = RecordingSink()
    acts = AgentActivities(agents_config(tmp_path), providers={"scripted": model}, sinks={"local": sink})
    async with running_worker(client, acts) as queue:
        handle = await start(client, queue, ws, "fan out: " + " ".join(PARTS), session_id="s-fan")
        result = await run_result(client, handle.id)
        status = await run_status(handle)
        history = await child_events(handle)
        child_status = [await run_status(client.get_workflow_handle(c.workflow_id)) for c in status.children]
    assert result.status == "completed", result.error
    # three children in the parent's history, all started before any ended: they ran at once
    kinds = [kind for kind, _ in history]
    assert kinds.count("started") == 3 and kinds.count("completed") == 3
    assert max(i for i, k in enumerate(kinds) if k == "started") < kinds.index("completed")
    assert model.most_in_flight == 3
    # the parent's context holds the three answers, not the files
    parent_calls = [c for c in model.calls if first_text(c).startswith("fan out:")]
    last = parent_calls[-1]
    answers = [r.content for r in results(last)]
    assert answers == [f"{p}/notes.txt: SUMMARY-{p.upper()}" for p in PARTS]
    assert not any(f"{p} line 10" in json.dumps([m.model_dump() for m in last.messages]) for p in PARTS)
    assert "task" in {t.name for t in last.tools}
    # a child is not offered `task` (max_depth 1), and sees nothing of the parent's conversation
    child_calls = [c for c in model.calls if first_text(c).startswith("read ")]
    assert child_calls and all("task" not in {t.name for t in c.tools} for c in child_calls)
    # the parent's status lists its children; each child names its parent
    assert sorted(c.call_id for c in status.children) == [f"t-{p}" for p in PARTS]  # as they started
    assert all(c.status == "completed" and c.run_id for c in status.children)
    assert all(s.parent_workflow_id == handle.id and s.session_id == "s-fan" for s in child_status)
    for c in status.children:  # listed by `durable-agent runs` from its start, without an upsert of its own
        child = client.get_workflow_handle(c.workflow_id)
        upserts = [
            set(e.upsert_workflow_search_attributes_event_attributes.search_attributes.indexed_fields)
            async for e in child.fetch_history_events()
            if e.HasField("upsert_workflow_search_attributes_event_attributes")
        ]
        assert [u for u in upserts if u != {"TemporalChangeVersion"}] == [{SA_RUN_STATUS}]  # its end
        started = (await child.fetch_history()).events[0].workflow_execution_started_event_attributes
        assert set(started.search_attributes.indexed_fields) == {SA_SESSION_ID, SA_RUN_STATUS}
        attributes = (await child.describe()).search_attributes
        assert (attributes.get(SA_SESSION_ID), attributes.get(SA_RUN_STATUS)) == (["s-fan"], ["completed"])
    # both series of exports verify, and the parent's links each child's last export
    series = by_run(sink.exports)
    assert set(series) == {result.run_id, *(c.run_id for c in status.children)}
    for exports in series.values():
        for export in exports:
            export.open()
    ends = ends_of(series[result.run_id][-1])
    assert len(ends) == 3
    for end in ends:
        assert end.status == "completed" and end.run_id is not None
        assert end.final_content_digest == series[end.run_id][-1].descriptor.content_digest
        assert end.usage.total_tokens == 4
    # the children's tokens count in the parent's budgets, not in its own usage
    assert result.usage.total_tokens == 4


async def test_status_and_events_show_the_tree(
    client: Client, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ws = repository(tmp_path)
    acts = AgentActivities(agents_config(tmp_path), providers={"scripted": TreeModel()})
    async with running_worker(client, acts) as queue:
        handle = await start(client, queue, ws, "fan out: alpha beta")
        await run_result(client, handle.id)
        view = await run_status(handle)
        records = await handle.query("events", 0, result_type=list[EventRecord])
        capsys.readouterr()
        await _print_tree(client, handle.id, "  ")  # `durable-agent events ID --tree`
        tree = capsys.readouterr().out.splitlines()
    out = io.StringIO()
    print_status(view, out)
    rows = [line for line in out.getvalue().splitlines() if line.startswith("subagent:")]
    assert len(rows) == 2 and all("completed" in r and "workflow " in r for r in rows)
    printer_out = io.StringIO()
    printer = EventPrinter(printer_out)
    for record in records:
        printer.show(record)
    text = printer_out.getvalue()
    assert text.count("⑂ subagent started") == 2 and text.count("⑂ subagent completed") == 2
    starts = [r.event for r in records if isinstance(r.event, SubagentStartEvent)]
    assert sorted(s.workflow_id for s in starts) == [
        child_workflow_id(handle.id, 1, f"t-{p}") for p in ("alpha", "beta")
    ]
    assert "children" in view.model_dump_json()
    # the tree: each child's events indented under its start line, the parent's after
    started = [i for i, line in enumerate(tree) if "⑂ subagent started" in line]
    assert len(started) == 2
    for i in started:
        assert tree[i + 1].startswith("      ▶ run started") and "■ run ended: completed" in "\n".join(tree)
    assert tree[-1] == "  ■ run ended: completed"
    # a run without subagents has the status JSON it had before
    assert "children" not in RunStatusView(session_id="s", run_id="r", status="x").model_dump_json()


async def test_a_call_waiting_in_a_child_is_listed_and_approved_from_the_parent(
    client: Client, tmp_path: Path
) -> None:
    ws = repository(tmp_path)
    config = scripted_config(
        tmp_path,
        [{"text": "unused"}],
        agents={"enabled": True},
        permissions={"ask": ["read(**)"], "default": "deny"},
    )
    acts = AgentActivities(config, providers={"scripted": TreeModel()})
    async with running_worker(client, acts) as queue:
        handle = await start(client, queue, ws, "fan out: alpha")

        async def listed() -> str | None:
            done = await cli(client, tmp_path, "approvals", handle.id)
            return done.stdout if " r1 " in done.stdout else None

        listing = await until(lambda: "the child's call listed from its parent", listed, 30)
        [child] = (await run_status(handle)).children
        assert listing.startswith(f"{child.workflow_id}  r1  read alpha/notes.txt"), listing
        status = await cli(client, tmp_path, "status", handle.id)
        assert (
            "r1: read alpha/notes.txt" in status.stdout
            and f"in subagent {child.workflow_id}" in status.stdout
        )
        approved = await cli(client, tmp_path, "approve", handle.id, "r1")
        assert approved.stdout.startswith("approved: read call r1") and child.workflow_id in approved.stdout
        result = await run_result(client, handle.id)
    assert result.status == "completed", result.error
    assert "SUMMARY-ALPHA" in result.text


# --- what a child may do ------------------------------------------------------------------------


def test_a_child_never_does_what_its_parent_may_not() -> None:
    parent = PermissionPolicy(allow=("read(src/*)", "bash(ls:*)"), ask=("edit(src/*)",), deny=("read(.env)",))
    wide = PermissionPolicy(allow=("read(**)", "bash", "edit(**)", "write"), default="allow")
    child = child_policy(parent, wide)
    calls = [
        ("read", "src/a.py"),
        ("read", "secret.txt"),
        ("read", ".env"),
        ("bash", "ls -la"),
        ("bash", "rm -rf /"),
        ("edit", "src/a.py"),
        ("edit", "docs/x.md"),
        ("write", "x"),
        ("web_fetch", "domain:example.com"),
    ]
    order = ["allow", "ask", "deny"]
    for tool, target in calls:
        was, now = parent.decide(tool, target), child.decide(tool, target)
        assert order.index(now) >= order.index(was), (tool, target, was, now)
    assert child.decide("read", "secret.txt") == "deny" and child.decide("edit", "src/a.py") == "ask"
    assert child.denies_outright("write") and not child.denies_outright("read")
    # a type that narrows: its own rules stand within the parent's
    narrow = child_policy(parent, PermissionPolicy(deny=("bash",), default="allow"))
    assert narrow.decide("bash", "ls") == "deny" and narrow.decide("read", "src/a.py") == "allow"
    # without a type's rules the child has the parent's, byte for byte
    assert child_policy(parent, None) == parent
    assert "within" not in parent.model_dump_json()


async def test_a_child_of_a_wider_type_cannot_read_what_the_parent_may_not(
    client: Client, tmp_path: Path
) -> None:
    ws = repository(tmp_path)
    wide = {
        "description": "reads anything",
        "system_prompt": "You are the wide reader.",
        "permissions": {"allow": ["read(**)"], "default": "allow"},
    }
    config = scripted_config(
        tmp_path,
        [{"text": "unused"}],
        agents={"enabled": True, "wide": wide},
        permissions={"allow": ["read(alpha/**)"], "default": "deny"},
    )
    model = TreeModel(agent_type="wide")
    async with running_worker(client, AgentActivities(config, providers={"scripted": model})) as queue:
        handle = await start(client, queue, ws, "fan out: alpha beta")
        result = await run_result(client, handle.id)
    assert result.status == "completed", result.error
    assert "alpha/notes.txt: SUMMARY-ALPHA" in result.text
    assert "beta/notes.txt: error: permission denied" in result.text
    # the type's system prompt, which the worker takes from its own config
    children = [c for c in model.calls if first_text(c).startswith("read ")]
    assert children and all(c.system_prompt.startswith("You are the wide reader.") for c in children)


def test_the_agents_config() -> None:
    config = parse_config(
        {
            "agents": {
                "enabled": True,
                "max_depth": 2,
                "explore": {"description": "reads", "tools": ["read", "grep"], "model": "scripted/x"},
            }
        },
        Path("/tmp"),
    )
    assert config.agents.max_depth == 2 and config.agents.types["explore"].tools == ("read", "grep")
    with pytest.raises(ConfigError, match="agents"):
        parse_config({"agents": {"explore": {"tool": ["read"]}}}, Path("/tmp"))
    assert not parse_config({}, Path("/tmp")).agents.enabled


def test_what_the_parent_is_told() -> None:
    child = ChildRun(call_id="c", workflow_id="w", description="d")
    done = child.model_copy(update={"status": "completed"})
    assert task_answer(done, "found it", 100) == ("found it", False)
    assert task_answer(done, "", 100)[0] == "(the subagent gave no answer)"
    failed = child.model_copy(update={"status": "failed", "error": "model down"})
    assert task_answer(failed, "", 100) == ("subagent failed: model down", True)
    assert bounded_answer("x" * 300, 100).startswith("x" * 100 + "\n[the subagent's answer is cut")
    assert child_workflow_id("wf", 3, "call/1 2") == "wf/task-3-call_1_2"


# --- failures, bounds, budgets, cancel ------------------------------------------------------------


async def test_a_child_that_fails_is_a_tool_error_and_the_count_is_bounded(
    client: Client, tmp_path: Path
) -> None:
    ws = repository(tmp_path)
    config = scripted_config(
        tmp_path,
        [{"text": "unused"}],
        agents={"enabled": True, "max_children": 2, "broken": {"model": "nowhere/model"}},
        permissions={"allow": ["read(**)"], "default": "deny"},
    )
    model = TreeModel(agent_type="broken")
    async with running_worker(client, AgentActivities(config, providers={"scripted": model})) as queue:
        handle = await start(client, queue, ws, "fan out: alpha beta gamma")
        result = await run_result(client, handle.id)
        view = await run_status(handle)
    assert result.status == "completed", result.error
    said = result.text
    assert said.count("subagent failed") == 2 and "provider 'nowhere' is not configured" in said
    assert "max_children=2" in said
    assert [c.status for c in view.children] == ["failed", "failed"]


async def test_the_childrens_tokens_count_against_the_parents_budget(client: Client, tmp_path: Path) -> None:
    ws = repository(tmp_path)
    model = TreeModel(child_tokens=30)
    acts = AgentActivities(agents_config(tmp_path), providers={"scripted": model})
    async with running_worker(client, acts) as queue:
        handle = await start(client, queue, ws, "fan out: alpha beta", max_total_tokens=50)
        result = await run_result(client, handle.id)
        view = await run_status(handle)
        children = [await run_status(client.get_workflow_handle(c.workflow_id)) for c in view.children]
    # started together, the children shared what the parent had left (50 - 2): each given half.
    # Each overspent it by its last step (a budget is checked between steps), and so the parent
    assert [[b.limit for b in child.budgets] for child in children] == [[24], [24]]
    assert result.status == "budget_exhausted", result
    assert result.usage.total_tokens == 2  # the parent's own
    # 2 of its own, and each child's 2 + 30
    assert "66 tokens used of max_total_tokens=50" in (result.error or "")


async def test_cancel_of_the_parent_cancels_its_children(client: Client, tmp_path: Path) -> None:
    ws = repository(tmp_path)
    model = TreeModel(hold=99)  # the children's first steps wait
    acts = AgentActivities(agents_config(tmp_path), providers={"scripted": model})
    async with running_worker(client, acts) as queue:
        handle = await start(client, queue, ws, "fan out: alpha beta gamma")
        await until("three children waiting", lambda: model.in_flight == 3)
        view = await run_status(handle)
        await handle.signal("cancel", "enough")
        result = await asyncio.wait_for(run_result(client, handle.id), 60)
        described = [await client.get_workflow_handle(c.workflow_id).describe() for c in view.children]
    assert result.status == "cancelled" and result.error == "enough"
    assert len(described) == 3
    assert all(d.status == WorkflowExecutionStatus.CANCELED for d in described)


# --- kill -9 ---------------------------------------------------------------------------------------


def _toml(value: Path | str) -> str:
    return json.dumps(str(value))


async def test_kill_9_during_the_fan_out_loses_nothing(client: Client, tmp_path: Path) -> None:
    parent: list[dict[str, Any]] = [
        {
            "tool_calls": [
                {
                    "id": f"t{i}",
                    "name": "task",
                    "input": {"description": f"part {i}", "prompt": "read", "agent_type": t},
                }
                for i, t in enumerate(("a", "b", "c"), 1)
            ]
        },
        {"text": "all three answered"},
    ]
    extra = "\n[agents]\nenabled = true\n"
    for i, name in enumerate(("a", "b", "c"), 1):
        script = tmp_path / f"child-{name}.json"
        steps = [
            {
                "tool_calls": [{"id": "r", "name": "read", "input": {"file_path": f"file{i}.txt"}}],
                "delay_ms": 4000,
            },
            {"text": f"child {name} read file{i}"},
        ]
        script.write_text(json.dumps({"responses": steps}))
        extra += f'\n[providers.{name}]\nkind = "scripted"\nscript = {_toml(script)}\n'
        extra += f'\n[agents.{name}]\nmodel = "{name}/static"\n'
    config, workspace, sink_root = write_setup(tmp_path, parent, extra)
    with workers(client, config, tmp_path) as procs:
        first = procs.start()
        handle = await start_run(
            client, AgentRunInput(prompt="fan out", workspace=str(workspace)), queue=procs.queue
        )

        async def fanned_out() -> bool:
            return len((await handle.describe()).raw_description.pending_children) == 3

        await until_alive("the three children to start", fanned_out, 45, procs)
        procs.kill(first)
        second = procs.start()
        result = await asyncio.wait_for(handle.result(), 120)
        history = await child_events(handle)
        view = await run_status(handle)
    assert result.status == "completed", result.error
    assert [k for k, _ in history].count("started") == 3  # no child started twice
    assert [c.status for c in view.children] == ["completed"] * 3
    files = [read_export_file(p) for p in export_files(sink_root)]
    for export in files:
        export.open()
    runs = {e.descriptor.run_id for e in files}
    assert runs == {result.run_id, *(c.run_id for c in view.children)}
    last = max((e for e in files if e.descriptor.run_id == result.run_id), key=lambda e: e.descriptor.turn)
    ends = ends_of(last)
    for end in ends:
        child_last = max(
            (e for e in files if e.descriptor.run_id == end.run_id), key=lambda e: e.descriptor.turn
        )
        assert end.final_content_digest == child_last.descriptor.content_digest
    assert second.pid != first.pid
