"""Bad input gets a clear error and loses nothing."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from temporalio.api.common.v1 import Payload
from temporalio.api.history.v1 import History, HistoryEvent
from temporalio.client import Client, WorkflowFailureError

from durable_agent.activities import AgentActivities
from durable_agent.core.canonical import canonical_bytes
from durable_agent.core.events import PermissionDeniedEvent, ToolEndEvent
from durable_agent.core.run_api import WORKFLOW_TYPE, AgentRunResult
from tests.helpers import (
    RecordingSink,
    final,
    read_call,
    read_cap_text,
    running_worker,
    scripted_config,
    start,
    tool_call,
)


async def test_bad_tool_calls_become_tool_errors_the_model_sees(client: Client, tmp_path: Path) -> None:
    outside = tmp_path / "outside.txt"
    outside.write_text("secret outside the workspace\n")
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "ok.txt").write_text("fine\n")
    os.symlink(outside, ws / "link.txt")
    calls = [
        tool_call("c1", "frobnicate", x=1),  # unknown tool
        tool_call("c2", "read", file_path=42),  # malformed arguments
        tool_call("c3", "read", path="ok.txt"),  # wrong argument name
        read_call("c4", "../outside.txt"),  # climbs out
        read_call("c5", str(outside)),  # absolute path outside
        read_call("c6", "link.txt"),  # symlink pointing outside
        read_call("c7", "missing.txt"),  # not there
        tool_call("c8", "ls", path="/"),  # ls outside
        read_call("c9", "ok.txt"),  # and the run goes on
    ]
    config = scripted_config(
        tmp_path,
        [*calls, final("handled")],
        permissions={"allow": ["read(**)", "ls(**)"]},
    )
    sink = RecordingSink()
    async with running_worker(client, AgentActivities(config, sinks={"local": sink})) as queue:
        result = await (await start(client, queue, ws, "misbehave")).result()
    assert result.status == "completed" and result.text == "handled"
    assert result.tool_calls_count == len(calls)
    events = sink.exports[-1].open().source_run().events
    ends = {e.event.id: e.event for e in events if isinstance(e.event, ToolEndEvent)}
    assert "unknown tool 'frobnicate'" in ends["c1"].output and "read" in ends["c1"].output
    assert "invalid arguments for 'read'" in ends["c2"].output
    assert "invalid arguments for 'read'" in ends["c3"].output
    for cid in ("c4", "c5", "c6", "c8"):
        assert "outside the workspace" in ends[cid].output, ends[cid].output
        assert "secret outside" not in ends[cid].output
    assert "does not exist" in ends["c7"].output
    assert all(ends[c].is_error for c in ("c1", "c2", "c3", "c4", "c5", "c6", "c7", "c8"))
    assert not ends["c9"].is_error and "fine" in ends["c9"].output
    # each tool error reaches the model as an error tool result
    messages = sink.exports[-1].open().logical_resume.messages
    results = [b for m in messages for b in m.content if b.type == "tool_result"]
    assert [r.is_error for r in results] == [True] * 8 + [False]


async def test_denied_calls_are_tool_errors_and_unoffered_tools_are_hidden(
    client: Client, tmp_path: Path
) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "a.txt").write_text("a\n")
    (ws / ".env").write_text("TOKEN=x\n")
    config = scripted_config(
        tmp_path,
        [read_call("r1", ".env"), tool_call("l1", "ls", path="."), read_call("r2", "a.txt"), final()],
        permissions={"allow": ["read(*)"], "deny": ["read(.env)"], "default": "deny"},
    )
    sink = RecordingSink()
    async with running_worker(client, AgentActivities(config, sinks={"local": sink})) as queue:
        result = await (await start(client, queue, ws)).result()
    assert result.status == "completed" and result.tool_calls_count == 3
    events = [e.event for e in sink.exports[-1].open().source_run().events]
    denied = [e for e in events if isinstance(e, PermissionDeniedEvent)]
    assert [d.id for d in denied] == ["r1"]
    ends = {e.id: e for e in events if isinstance(e, ToolEndEvent)}
    assert ends["r1"].is_error and "TOKEN" not in ends["r1"].output
    assert "unknown tool 'ls'" in ends["l1"].output  # ls is denied outright: never offered
    assert not ends["r2"].is_error


BAD_INPUTS: list[tuple[dict[str, Any], str]] = [
    ({"prompt": "hi", "workspace": ".", "colour": "blue"}, "colour"),
    ({"workspace": "."}, "prompt"),
    ({"prompt": "   "}, "prompt must not be blank"),
    ({"prompt": "hi", "max_tool_rounds": 0}, "max_tool_rounds"),
    ({"prompt": "hi", "model": "no-slash"}, "provider/model"),
    ({"prompt": "hi", "permissions": {"allow": ["read(("]}}, "permission"),
    ({"prompt": "hi", "permissions": {"default": "maybe"}}, "default"),
    ({"prompt": "hi", "model": "nope/x"}, "provider 'nope' is not configured"),
    ({"prompt": "hi", "export_sink": "s3"}, "export sink 's3' is not configured"),
    ({"prompt": "hi", "workspace": "/does/not/exist"}, "is not a folder"),
]


@pytest.mark.parametrize(("raw", "message"), BAD_INPUTS, ids=[m for _, m in BAD_INPUTS])
async def test_invalid_run_input_is_refused_before_any_model_call(
    client: Client, tmp_path: Path, raw: dict[str, Any], message: str
) -> None:
    raw = {"workspace": str(tmp_path), **raw} if raw.get("workspace") == "." else raw
    config = scripted_config(tmp_path, [final()])
    async with running_worker(client, AgentActivities(config)) as queue:
        handle = await client.start_workflow(
            WORKFLOW_TYPE, raw, id=f"bad-{os.urandom(4).hex()}", task_queue=queue, result_type=AgentRunResult
        )
        with pytest.raises(WorkflowFailureError) as info:
            await handle.result()
        history = await handle.fetch_history()
    cause = info.value.cause
    assert message in str(cause), str(cause)
    assert getattr(cause, "type", None) == "InvalidRunInput"
    scheduled = [
        e.activity_task_scheduled_event_attributes.activity_type.name
        for e in history.events
        if e.HasField("activity_task_scheduled_event_attributes")
    ]
    assert "agent.model_call" not in scheduled


async def test_model_failure_fails_the_run_with_the_reason(client: Client, tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "a.txt").write_text("a\n")
    # the script runs out after one tool call: a non-retryable provider error
    config = scripted_config(tmp_path, [read_call("r1", "a.txt")])
    async with running_worker(client, AgentActivities(config)) as queue:
        result = await (await start(client, queue, ws)).result()
    assert result.status == "failed"
    assert result.error is not None and "asked for response 2" in result.error
    assert [e.turn for e in result.exports] == [1]


async def test_max_tool_rounds_ends_the_run_failed(client: Client, tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "a.txt").write_text("a\n")
    config = scripted_config(tmp_path, [read_call(f"r{i}", "a.txt") for i in range(5)])
    async with running_worker(client, AgentActivities(config)) as queue:
        result = await (await start(client, queue, ws, max_tool_rounds=2)).result()
    assert result.status == "failed" and "max_tool_rounds=2" in (result.error or "")
    assert result.tool_calls_count == 2


async def test_a_conversation_larger_than_a_temporal_payload_goes_on_and_enters_history_once(
    client: Client, tmp_path: Path
) -> None:
    # 25 reads of 100 KB: a 2.5 MB conversation, past the 2 MB a payload may hold
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "big.txt").write_text(read_cap_text())
    reads = [read_call(f"r{i}", "big.txt") for i in range(25)]
    config = scripted_config(tmp_path, [*reads, final("read it all")])
    sink = RecordingSink()
    async with running_worker(client, AgentActivities(config, sinks={"local": sink})) as queue:
        handle = await start(client, queue, ws, max_tool_rounds=30)
        result = await handle.result()
    assert result.status == "completed" and result.text == "read it all", result
    assert [e.turn for e in result.exports] == list(range(1, 26))
    conversation = len(
        canonical_bytes([m.model_dump(mode="json") for m in sink.exports[-1].open().logical_resume.messages])
    )
    assert conversation > 2_500_000
    history = await handle.fetch_history()
    payloads = [len(p.data) for e in history.events for p in payloads_of(e)]
    assert max(payloads) < 150_000  # one tool output at most, never the conversation
    # each tool output enters the history once: its tool call's result (the save names it by digest)
    assert History(events=history.events).ByteSize() < 1.3 * conversation


def payloads_of(event: HistoryEvent) -> list[Payload]:
    """The payloads of an activity's input and result."""
    if event.HasField("activity_task_scheduled_event_attributes"):
        return list(event.activity_task_scheduled_event_attributes.input.payloads)
    if event.HasField("activity_task_completed_event_attributes"):
        return list(event.activity_task_completed_event_attributes.result.payloads)
    return []


async def test_a_history_near_temporal_limits_ends_the_run_cleanly(client: Client, tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "a.txt").write_text("a\n")
    config = scripted_config(
        tmp_path, [read_call(f"r{i}", "a.txt") for i in range(20)], limits={"max_history_events": 100}
    )
    async with running_worker(client, AgentActivities(config)) as queue:
        result = await (await start(client, queue, ws)).result()
    assert result.status == "failed" and "max_history_events=100" in (result.error or "")
    assert 1 < result.tool_calls_count < 20


async def test_a_tool_unsafe_to_repeat_is_not_retried_after_our_own_error(
    client: Client, tmp_path: Path
) -> None:
    from durable_agent.activities.tools import Tool, builtin_tools
    from durable_agent.core.tool_specs import ToolArgs, ToolSpec

    calls: list[str] = []

    class Args(ToolArgs):
        what: str

    async def explode(args: Args, workspace: Path) -> str:
        calls.append(args.what)
        raise RuntimeError("a bug in the tool")

    tools = {
        **builtin_tools(),
        "once": Tool(ToolSpec("once", "Not safe to repeat.", Args, None, repeatable=False), explode),
        "again": Tool(ToolSpec("again", "Safe to repeat.", Args, None), explode),
    }
    ws = tmp_path / "ws"
    ws.mkdir()
    config = scripted_config(
        tmp_path,
        [tool_call("o1", "once", what="once"), tool_call("a1", "again", what="again"), final("handled")],
        permissions={"allow": ["once", "again"]},
    )
    sink = RecordingSink()
    async with running_worker(client, AgentActivities(config, tools=tools, sinks={"local": sink})) as queue:
        result = await (await start(client, queue, ws)).result()
    assert result.status == "completed" and result.text == "handled"
    assert calls == ["once", "again", "again", "again"]  # the repeatable tool had Temporal's 3 attempts
    events = [e.event for e in sink.exports[-1].open().source_run().events]
    ends = {e.id: e for e in events if isinstance(e, ToolEndEvent)}
    assert ends["o1"].is_error and "a bug in the tool" in ends["o1"].output
