"""Human approval: a call that a rule says to ``ask`` about waits, durably, for a person."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from temporalio.client import Client, WorkflowHandle, WorkflowUpdateFailedError

from durable_agent.activities import AgentActivities
from durable_agent.client import run_result
from durable_agent.core.events import (
    ConfirmationReceivedEvent,
    ConfirmationRequiredEvent,
    PermissionDeniedEvent,
    ToolEndEvent,
)
from durable_agent.core.run_api import AgentRunResult, ApprovalAnswer, ApprovalDecision, RunStatusView
from durable_agent.worker import build_worker
from tests.helpers import (
    RecordingSink,
    awaiting_approval,
    final,
    read_call,
    running_worker,
    scripted_config,
    start,
    tool_call,
    until,
)

PERMISSIONS = {"allow": ["read(a.txt)"], "deny": ["read(.env)"], "ask": ["ls"], "default": "deny"}


def workspace(tmp_path: Path) -> Path:
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "a.txt").write_text("alpha\n")
    (ws / ".env").write_text("TOKEN=x\n")
    return ws


async def decide(
    handle: WorkflowHandle[Any, AgentRunResult], call_id: str, approved: bool, reason: str | None = None
) -> ApprovalAnswer:
    answer: ApprovalAnswer = await handle.execute_update(
        "approve",
        ApprovalDecision(call_id=call_id, approved=approved, reason=reason),
        result_type=ApprovalAnswer,
    )
    return answer


async def test_allowed_denied_and_approved_calls_in_one_run(client: Client, tmp_path: Path) -> None:
    config = scripted_config(
        tmp_path,
        [read_call("r1", "a.txt"), read_call("r2", ".env"), tool_call("l1", "ls", path="."), final("done")],
        permissions=PERMISSIONS,
    )
    sink = RecordingSink()
    async with running_worker(client, AgentActivities(config, sinks={"local": sink})) as queue:
        handle = await start(client, queue, workspace(tmp_path), session_id="approval-session")
        status = await awaiting_approval(handle)
        assert status.status == "awaiting_approval"
        [waiting] = status.pending_approvals
        assert (waiting.call_id, waiting.tool, waiting.target) == ("l1", "ls", ".")
        assert waiting.arguments == '{"path": "."}' and waiting.since_ms > 0
        # the run is findable as waiting for a person
        query = 'AgentSessionId = "approval-session" AND AgentRunStatus = "awaiting_approval"'

        async def listed() -> list[str]:
            return [w.id async for w in client.list_workflows(query)]

        found = await until("the visibility listing of the waiting run", listed, 30, interval=0.2)
        assert found == [handle.id]
        answer = await decide(handle, "l1", True, "looks harmless")
        assert answer == ApprovalAnswer(call_id="l1", tool="ls", approved=True)
        result = await handle.result()
    assert result.status == "completed" and result.tool_calls_count == 3
    events = [r.event for r in sink.exports[-1].open().source_run().events]
    [required] = [e for e in events if isinstance(e, ConfirmationRequiredEvent)]
    [received] = [e for e in events if isinstance(e, ConfirmationReceivedEvent)]
    assert (required.id, received.id, received.approved, received.reason) == (
        "l1",
        "l1",
        True,
        "looks harmless",
    )
    assert [e.id for e in events if isinstance(e, PermissionDeniedEvent)] == ["r2"]
    ends = {e.id: e for e in events if isinstance(e, ToolEndEvent)}
    assert not ends["r1"].is_error and ends["r2"].is_error and not ends["l1"].is_error
    assert "a.txt" in ends["l1"].output
    # every boundary was exported, the waiting one included
    assert [e.turn for e in result.exports] == [1, 2, 3]


async def test_a_denial_reaches_the_model_with_its_reason(client: Client, tmp_path: Path) -> None:
    config = scripted_config(tmp_path, [tool_call("l1", "ls", path="."), final()], permissions=PERMISSIONS)
    sink = RecordingSink()
    async with running_worker(client, AgentActivities(config, sinks={"local": sink})) as queue:
        handle = await start(client, queue, workspace(tmp_path))
        await awaiting_approval(handle)
        answer = await decide(handle, "l1", False, "not in this repo")
        assert not answer.approved
        result = await handle.result()
    assert result.status == "completed"
    messages = sink.exports[-1].open().logical_resume.messages
    [tool_result] = [b for m in messages for b in m.content if b.type == "tool_result"]
    assert tool_result.is_error and "not approved: not in this repo" in tool_result.content


async def test_unknown_or_repeated_decisions_are_rejected_before_history(
    client: Client, tmp_path: Path
) -> None:
    # the answer after the call takes a while: the run is still there for the repeated decision
    slow_final = {**final(), "delay_ms": 3000}
    config = scripted_config(tmp_path, [tool_call("l1", "ls", path="."), slow_final], permissions=PERMISSIONS)
    async with running_worker(client, AgentActivities(config)) as queue:
        handle = await start(client, queue, workspace(tmp_path))
        await awaiting_approval(handle)
        with pytest.raises(WorkflowUpdateFailedError) as unknown:
            await decide(handle, "nope", True)
        assert "'nope' is not waiting for approval (waiting: l1)" in str(unknown.value.cause)
        await decide(handle, "l1", True)
        with pytest.raises(WorkflowUpdateFailedError) as repeated:
            await decide(handle, "l1", False)
        assert "already been decided" in str(repeated.value.cause)
        await handle.result()
        history = await handle.fetch_history()
    accepted = [
        e for e in history.events if e.HasField("workflow_execution_update_accepted_event_attributes")
    ]
    assert len(accepted) == 1  # the rejected ones left no trace


async def test_no_decision_within_the_timeout_is_a_denial(client: Client, tmp_path: Path) -> None:
    config = scripted_config(tmp_path, [tool_call("l1", "ls", path="."), final()], permissions=PERMISSIONS)
    sink = RecordingSink()
    async with running_worker(client, AgentActivities(config, sinks={"local": sink})) as queue:
        handle = await start(client, queue, workspace(tmp_path), approval_timeout_seconds=1)
        result = await asyncio.wait_for(handle.result(), 20)
    assert result.status == "completed"
    events = [r.event for r in sink.exports[-1].open().source_run().events]
    [received] = [e for e in events if isinstance(e, ConfirmationReceivedEvent)]
    assert (
        received.timed_out and not received.approved and "no decision within 1 s" in (received.reason or "")
    )


async def test_the_wait_survives_a_worker_restart(client: Client, tmp_path: Path) -> None:
    config = scripted_config(
        tmp_path, [tool_call("l1", "ls", path="."), final("after restart")], permissions=PERMISSIONS
    )
    ws = workspace(tmp_path)
    async with running_worker(client, AgentActivities(config)) as queue:
        handle = await start(client, queue, ws)
        await awaiting_approval(handle)
    # no worker at all now; the run waits in the server, costing nothing
    await asyncio.sleep(1)
    async with build_worker(client, AgentActivities(config), queue):
        status = await awaiting_approval(handle)
        assert [p.call_id for p in status.pending_approvals] == ["l1"]
        await decide(handle, "l1", True)
        result = await handle.result()
    assert result.status == "completed" and result.text == "after restart"


async def test_cancel_while_waiting_for_approval(client: Client, tmp_path: Path) -> None:
    config = scripted_config(tmp_path, [tool_call("l1", "ls", path="."), final()], permissions=PERMISSIONS)
    async with running_worker(client, AgentActivities(config)) as queue:
        handle = await start(client, queue, workspace(tmp_path))
        await awaiting_approval(handle)
        await handle.signal("cancel", "nobody is around")
        result = await asyncio.wait_for(run_result(client, handle.id), 10)
        status = await handle.query("status", result_type=RunStatusView)
    assert result.status == "cancelled" and result.error == "nobody is around"
    assert status.pending_approvals == ()
