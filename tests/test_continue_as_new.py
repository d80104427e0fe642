"""Runs of any length: the run continues as new at tool boundaries and stays one run."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from temporalio.client import Client

from durable_agent.activities import AgentActivities
from durable_agent.client import follow_events, run_result
from durable_agent.core.events import EndEvent, EventRecord, ToolEndEvent
from durable_agent.core.run_api import AgentRunResult, ApprovalAnswer, ApprovalDecision
from tests.helpers import (
    RecordingSink,
    awaiting_approval,
    final,
    read_call,
    running_worker,
    scripted_config,
    start,
    status_when,
    tool_call,
)

N_READS = 8


def responses() -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = [read_call(f"r{i}", "a.txt") for i in range(1, N_READS - 3)]
    # four calls in one step: a boundary is ~25 events, so with continue_as_new_events=50
    # the run continues as new between two of them, and the next execution makes the rest
    group = [
        call for i in range(N_READS - 3, N_READS + 1) for call in read_call(f"r{i}", "a.txt")["tool_calls"]
    ]
    return [*out, {"tool_calls": group}, final("all read")]


async def test_a_run_continues_as_new_and_stays_one_run(client: Client, tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "a.txt").write_text("alpha\n")
    config = scripted_config(tmp_path, responses(), limits={"continue_as_new_events": 50})
    sink = RecordingSink()
    async with running_worker(client, AgentActivities(config, sinks={"local": sink})) as queue:
        handle = await start(client, queue, ws, "read a.txt many times")
        followed = [record async for record in follow_events(handle)]
        result = await handle.result()
        history = await handle.fetch_history()  # the last execution's
    assert result.status == "completed" and result.text == "all read"
    assert result.tool_calls_count == N_READS
    # one unbroken export series, of one run
    turns = [e.descriptor.turn for e in sink.exports]
    assert turns == list(range(1, N_READS + 1))
    assert len({e.descriptor.content_digest for e in sink.exports}) == N_READS
    assert {e.descriptor.run_id for e in sink.exports} == {result.run_id}
    counts = [e.open().source_run().snapshot.event_count for e in sink.exports]
    assert counts == sorted(counts) and len(set(counts)) == len(counts)
    assert [e.turn for e in result.exports] == turns
    # it did continue as new, more than once, and the last execution is short
    started = history.events[0].workflow_execution_started_event_attributes
    assert started.continued_execution_run_id, "the last execution was not continued from another"
    assert len(history.events) < 50 + 30
    # a follower saw every event once, in order, across the executions
    assert [r.sequence for r in followed] == list(range(1, len(followed) + 1))
    assert isinstance(followed[-1].event, EndEvent)
    tool_ends = [r.event.id for r in followed if isinstance(r.event, ToolEndEvent)]
    assert tool_ends == [f"r{i}" for i in range(1, N_READS + 1)]


async def test_a_follower_that_starts_late_is_told_what_it_missed(
    client: Client, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "a.txt").write_text("alpha\n")
    # 40 steps of 4 events: 160, well past what the last execution holds (its own and 64 carried)
    reads = [read_call(f"r{i}", "a.txt") for i in range(1, 41)]
    config = scripted_config(tmp_path, [*reads, final("done")], limits={"continue_as_new_events": 50})
    async with running_worker(client, AgentActivities(config, sinks={"local": RecordingSink()})) as queue:
        handle = await start(client, queue, ws, "read a.txt forty times", max_tool_rounds=45)
        result = await handle.result()
        late = [record async for record in follow_events(handle)]
    assert result.status == "completed"
    # it gets what the last execution holds, in order through to the end, and is told the rest
    first = late[0].sequence
    assert first > 1 and [r.sequence for r in late] == list(range(first, first + len(late)))
    assert isinstance(late[-1].event, EndEvent)
    assert f"events 1 to {first - 1} of {handle.id} are no longer held by the run" in caplog.text


async def test_status_approvals_and_cancel_reach_a_continued_run(client: Client, tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "a.txt").write_text("alpha\n")
    script = [read_call(f"r{i}", "a.txt") for i in range(1, 6)]
    script += [tool_call("l1", "ls", path="."), {"text": "slow", "delay_ms": 60_000}]
    config = scripted_config(
        tmp_path,
        script,
        limits={"continue_as_new_events": 50},
        permissions={"allow": ["read(*)"], "ask": ["ls"]},
    )
    async with running_worker(client, AgentActivities(config)) as queue:
        handle = await start(client, queue, ws, "read, then ask to list")
        status = await awaiting_approval(handle, 30)
        assert status.turn == 5 and [p.call_id for p in status.pending_approvals] == ["l1"]
        answer = await handle.execute_update(
            "approve", ApprovalDecision(call_id="l1", approved=True), result_type=ApprovalAnswer
        )
        assert answer.approved
        # the 6th boundary's export acknowledged, then cancel
        await status_when(handle, lambda s: s.exports_delivered == 6, "the 6th export", 30)
        await handle.signal("cancel", "enough")
        result: AgentRunResult = await run_result(client, handle.id)
        events = [r.event for r in await handle.query("events", 0, result_type=list[EventRecord])]
        history = await handle.fetch_history()
    assert result.status == "cancelled" and result.error == "enough"
    assert [e.turn for e in result.exports] == [1, 2, 3, 4, 5, 6]
    started = history.events[0].workflow_execution_started_event_attributes
    assert started.continued_execution_run_id, "the run never continued as new"
    assert [e.type for e in events].count("run_start") == 1
