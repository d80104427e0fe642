"""An approval belongs to one call: its id, its model step and its arguments' digest.

A hostile model that reuses an approved call id (in the same step or a later
one) is asked about again, and a decision made on what a person saw cannot
approve a call with other arguments.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from temporalio.client import Client, WorkflowHandle, WorkflowUpdateFailedError

from durable_agent.activities import AgentActivities
from durable_agent.core.canonical import digest_of
from durable_agent.core.events import ConfirmationReceivedEvent, ConfirmationRequiredEvent, ToolEndEvent
from durable_agent.core.run_api import (
    AgentRunResult,
    ApprovalAnswer,
    ApprovalDecision,
    PendingApproval,
)
from tests.helpers import (
    RecordingSink,
    final,
    run_status,
    running_worker,
    scripted_config,
    start,
    tool_call,
    until,
)

PERMISSIONS = {"ask": ["ls"], "default": "deny"}


def workspace(tmp_path: Path) -> Path:
    ws = tmp_path / "ws"
    (ws / "src").mkdir(parents=True)
    (ws / "a.txt").write_text("alpha\n")
    return ws


def two_calls(first: dict[str, Any], second: dict[str, Any]) -> dict[str, Any]:
    return {"tool_calls": [*first["tool_calls"], *second["tool_calls"]]}


async def waiting(
    handle: WorkflowHandle[Any, AgentRunResult], fits: Callable[[PendingApproval], bool], timeout: float = 20
) -> PendingApproval:
    """The call waiting for approval once one that ``fits`` waits."""

    async def fitting() -> PendingApproval | None:
        return next((p for p in (await run_status(handle)).pending_approvals if fits(p)), None)

    return await until("a call of that kind to await approval", fitting, timeout)


async def decide(handle: WorkflowHandle[Any, AgentRunResult], decision: ApprovalDecision) -> ApprovalAnswer:
    answer: ApprovalAnswer = await handle.execute_update("approve", decision, result_type=ApprovalAnswer)
    return answer


def events_of(sink: RecordingSink) -> list[Any]:
    return [r.event for r in sink.exports[-1].open().source_run().events]


async def test_a_reused_id_in_a_later_step_asks_again(client: Client, tmp_path: Path) -> None:
    script = [tool_call("l1", "ls", path="."), tool_call("l1", "ls", path="src"), final("done")]
    config = scripted_config(tmp_path, script, permissions=PERMISSIONS)
    sink = RecordingSink()
    async with running_worker(client, AgentActivities(config, sinks={"local": sink})) as queue:
        handle = await start(client, queue, workspace(tmp_path))
        first = await waiting(handle, lambda p: p.target == ".")
        assert (first.step, first.arguments_digest) == (1, digest_of({"path": "."}))
        await decide(handle, ApprovalDecision(call_id="l1", approved=True))
        # the same id, a later step: it waits again instead of riding on the first approval
        second = await waiting(handle, lambda p: p.target == "src")
        assert (second.call_id, second.step, second.arguments_digest) == ("l1", 2, digest_of({"path": "src"}))
        await decide(handle, ApprovalDecision(call_id="l1", approved=False, reason="not that one"))
        result = await handle.result()
    assert result.status == "completed"
    events = events_of(sink)
    required = [e for e in events if isinstance(e, ConfirmationRequiredEvent)]
    received = [e for e in events if isinstance(e, ConfirmationReceivedEvent)]
    assert [(e.id, e.step, e.arguments_digest) for e in required] == [
        ("l1", 1, digest_of({"path": "."})),
        ("l1", 2, digest_of({"path": "src"})),
    ]
    assert [e.approved for e in received] == [True, False]
    ends = [e for e in events if isinstance(e, ToolEndEvent)]
    assert [e.is_error for e in ends] == [False, True]
    assert "not approved: not that one" in ends[1].output


async def test_a_reused_id_in_the_same_step_asks_again(client: Client, tmp_path: Path) -> None:
    step = two_calls(tool_call("l1", "ls", path="."), tool_call("l1", "ls", path="src"))
    config = scripted_config(tmp_path, [step, final("done")], permissions=PERMISSIONS)
    sink = RecordingSink()
    async with running_worker(client, AgentActivities(config, sinks={"local": sink})) as queue:
        handle = await start(client, queue, workspace(tmp_path))
        first = await waiting(handle, lambda p: p.target == ".")
        await decide(
            handle, ApprovalDecision(call_id="l1", approved=True, arguments_digest=first.arguments_digest)
        )
        second = await waiting(handle, lambda p: p.target == "src")
        assert second.step == first.step == 1
        await decide(handle, ApprovalDecision(call_id="l1", approved=False))
        result = await handle.result()
    assert result.status == "completed" and result.tool_calls_count == 2
    received = [e for e in events_of(sink) if isinstance(e, ConfirmationReceivedEvent)]
    assert [e.approved for e in received] == [True, False]


async def test_the_same_call_repeated_identically_asks_again(client: Client, tmp_path: Path) -> None:
    step = two_calls(tool_call("l1", "ls", path="."), tool_call("l1", "ls", path="."))
    config = scripted_config(
        tmp_path, [step, final("done")], permissions=PERMISSIONS, approval_timeout_seconds=1
    )
    sink = RecordingSink()
    async with running_worker(client, AgentActivities(config, sinks={"local": sink})) as queue:
        handle = await start(client, queue, workspace(tmp_path))
        await waiting(handle, lambda p: True)
        await decide(handle, ApprovalDecision(call_id="l1", approved=True))
        result = await asyncio.wait_for(handle.result(), 30)
    received = [e for e in events_of(sink) if isinstance(e, ConfirmationReceivedEvent)]
    # nobody answered the second request: it timed out as a denial, it did not reuse the approval
    assert [(e.approved, e.timed_out) for e in received] == [(True, False), (False, True)]
    assert result.status == "completed"


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("arguments_digest", digest_of({"path": "src"}), "look at it again before deciding"),
        ("arguments_digest", "sha256:" + "0" * 64, "not sha256:0000"),
        ("step", 2, "the one of step 1, not of step 2"),
        ("step", 0, "the one of step 1, not of step 0"),
    ],
)
async def test_a_decision_on_other_arguments_or_another_step_is_rejected(
    client: Client, tmp_path: Path, field: str, value: Any, message: str
) -> None:
    config = scripted_config(tmp_path, [tool_call("l1", "ls", path="."), final()], permissions=PERMISSIONS)
    async with running_worker(client, AgentActivities(config)) as queue:
        handle = await start(client, queue, workspace(tmp_path))
        pending = await waiting(handle, lambda p: True)
        wrong = ApprovalDecision.model_validate({"call_id": "l1", "approved": True, field: value})
        with pytest.raises(WorkflowUpdateFailedError) as rejected:
            await decide(handle, wrong)
        assert message in str(rejected.value.cause)
        still = await run_status(handle)
        assert [p.call_id for p in still.pending_approvals] == ["l1"]
        right = ApprovalDecision(
            call_id="l1", approved=True, step=pending.step, arguments_digest=pending.arguments_digest
        )
        assert (await decide(handle, right)).approved
        result = await handle.result()
    assert result.status == "completed"
