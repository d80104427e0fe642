"""Runs on versioned workers move to a new build at a safe point (docs/deploys.md), on the real
dev server: two builds of one Worker Deployment in one test, the same code under two build ids.

- a conversation that waits for its next prompt stays on build 1 after build 2 becomes current,
  moves when ``durable-agent upgrade`` wakes it, answers its next prompt on build 2, and moves
  back to build 1 at a rollback; its exports stay one unbroken series;
- a run under way moves at its next tool boundary, with no signal;
- a run waiting for a person's decision moves only at that call's boundary;
- build 2 with a workflow change that breaks the replay of build 1's histories (one command more
  at the start of an execution): a run of build 1 goes on there after build 2 is current, answers
  a prompt there, then moves, and its next execution runs build 2's workflow.
"""

from __future__ import annotations

import asyncio
import uuid
from contextlib import AbstractAsyncContextManager, AsyncExitStack
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from temporalio import workflow
from temporalio.client import Client, WorkflowHistory
from temporalio.common import RawValue
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.worker import Replayer, UnsandboxedWorkflowRunner

from durable_agent import worker as worker_module
from durable_agent.cli.commands import run_cli
from durable_agent.cli.upgrade import settled
from durable_agent.client import end_conversation, run_result, send_prompt
from durable_agent.core.activity_api import MODEL_CALL
from durable_agent.core.run_api import (
    AWAITING_PROMPT,
    SIGNAL_UPGRADE,
    UPDATE_APPROVE,
    AgentRunResult,
    ApprovalAnswer,
    ApprovalDecision,
)
from durable_agent.workflows import AgentRun
from tests.helpers import (
    activity_calls,
    awaiting_approval,
    final,
    read_call,
    scripted_config,
    start,
    status_when,
    tool_call,
    until,
    workspace_with,
)
from tests.versioning import (
    deployment_name,
    moved,
    pinned_build,
    set_current,
    task_builds,
    versioned_worker,
    woken,
)


def build(
    client: Client,
    tmp: Path,
    queue: str,
    deployment: str,
    build_id: str,
    responses: list[dict[str, Any]],
    **extra: Any,
) -> AbstractAsyncContextManager[None]:
    """A worker of ``deployment``'s build ``build_id`` on ``queue`` (the same store and sink as
    every build of the test: ``tmp``)."""
    worker = {"deployment": deployment, "build_id": build_id}
    config = scripted_config(tmp, responses, worker=worker, **extra)
    return versioned_worker(client, config, queue)


def idle_timers(history: WorkflowHistory) -> list[float]:
    """The seconds of the timers a history started (a run's idle timeout, while it waits)."""
    return [
        e.timer_started_event_attributes.start_to_fire_timeout.ToTimedelta().total_seconds()
        for e in history.events
        if e.HasField("timer_started_event_attributes")
    ]


def unbroken(result: AgentRunResult, turns: int) -> None:
    assert result.status == "completed", result.error
    assert [e.turn for e in result.exports] == list(range(1, turns + 1))
    assert not result.export_failures and not result.persistence_failures


async def test_a_waiting_conversation_moves_when_woken_and_back_at_a_rollback(
    client: Client, tmp_path: Path
) -> None:
    ws = workspace_with(tmp_path, {"a.txt": "alpha\n", "b.txt": "beta\n", "c.txt": "gamma\n"})
    responses = [
        read_call("r1", "a.txt"),
        final("alpha"),
        read_call("r2", "b.txt"),
        final("beta"),
        read_call("r3", "c.txt"),
        final("gamma"),
    ]
    queue, deployment = f"test-{uuid.uuid4().hex[:10]}", deployment_name()
    async with AsyncExitStack() as stack:
        await stack.enter_async_context(build(client, tmp_path, queue, deployment, "b1", responses))
        await set_current(client, deployment, "b1")
        handle = await start(client, queue, ws, "read a.txt", follow_ups=True, idle_timeout_seconds=600)
        waiting = await status_when(handle, lambda s: s.status == AWAITING_PROMPT, "the first answer")
        first = (await handle.describe()).run_id
        assert await pinned_build(client, handle.id) == "b1"

        await stack.enter_async_context(build(client, tmp_path, queue, deployment, "b2", responses))
        await set_current(client, deployment, "b2")
        await asyncio.sleep(1)  # nothing wakes it: it stays where it is, on build 1
        assert (await handle.describe()).run_id == first
        assert await pinned_build(client, handle.id) == "b1"

        # visibility lags the run's status a moment
        report = await until(
            "the waiting run to be found and woken",
            lambda: woken(client, queue, handle.id),
            20,
            interval=0.3,
        )
        assert report
        second = await moved(client, handle, first, "b2")
        view = await status_when(handle, lambda s: s.status == AWAITING_PROMPT, "the moved run to wait")
        assert (view.turn, view.exports_delivered) == (waiting.turn, waiting.exports_delivered)

        moved_from = await client.get_workflow_handle(handle.id, run_id=first).fetch_history()
        assert task_builds(moved_from) == {"b1"}
        # its idle timeout goes on from when it began to wait, not from the move
        [idle] = idle_timers(await handle.fetch_history())
        assert 590 < idle < 600, idle
        await send_prompt(handle, "now read b.txt")
        await status_when(handle, lambda s: s.status == AWAITING_PROMPT and s.turn == 2, "the second answer")
        assert await pinned_build(client, handle.id) == "b2"

        # a rollback: build 1 is current again, and the run moves back when woken
        await set_current(client, deployment, "b1")
        await until("the run to be woken", lambda: woken(client, queue, handle.id), 20, interval=0.3)
        await moved(client, handle, second, "b1")
        await status_when(handle, lambda s: s.status == AWAITING_PROMPT, "the run moved back to wait")
        await send_prompt(handle, "now read c.txt")
        await status_when(handle, lambda s: s.status == AWAITING_PROMPT and s.turn == 3, "the third answer")
        await end_conversation(handle)
        result = await run_result(client, handle.id)
    unbroken(result, 3)
    assert result.text == "gamma" and result.tool_calls_count == 3
    on_build_2 = await client.get_workflow_handle(handle.id, run_id=second).fetch_history()
    assert task_builds(on_build_2) == {"b2"}


async def test_a_run_under_way_moves_at_its_next_tool_boundary(client: Client, tmp_path: Path) -> None:
    ws = workspace_with(tmp_path, {"a.txt": "alpha\n", "b.txt": "beta\n"})
    responses = [
        read_call("r1", "a.txt"),
        # the model thinks while build 2 becomes current; the boundary after this call moves it
        {**read_call("r2", "b.txt"), "delay_ms": 4_000},
        read_call("r3", "a.txt"),
        final("read three times"),
    ]
    queue, deployment = f"test-{uuid.uuid4().hex[:10]}", deployment_name()
    async with AsyncExitStack() as stack:
        await stack.enter_async_context(build(client, tmp_path, queue, deployment, "b1", responses))
        await set_current(client, deployment, "b1")
        handle = await start(client, queue, ws, "read three times")
        await status_when(handle, lambda s: s.exports_delivered >= 1, "the first export")
        first = (await handle.describe()).run_id
        await stack.enter_async_context(build(client, tmp_path, queue, deployment, "b2", responses))
        await set_current(client, deployment, "b2")
        result = await run_result(client, handle.id)
        last = await handle.describe()
    unbroken(result, 3)
    assert last.run_id != first
    assert await pinned_build(client, handle.id) == "b2"
    # it moved at the boundary of r2, the first after build 2 became current: r3 ran on build 2
    first_history = await client.get_workflow_handle(handle.id, run_id=first).fetch_history()
    kinds = [e.WhichOneof("attributes") for e in first_history.events]
    assert kinds[-1] == "workflow_execution_continued_as_new_event_attributes"
    assert [name for _, name in activity_calls(first_history.events)].count("agent.tool_call") == 2
    assert task_builds(first_history) == {"b1"}
    last_history = await handle.fetch_history()
    assert [name for _, name in activity_calls(last_history.events)].count("agent.tool_call") == 1
    assert task_builds(last_history) == {"b2"}


async def test_a_run_waiting_for_a_decision_moves_only_at_that_call_s_boundary(
    client: Client, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The request and the decision belong to the build that asked (docs/deploys.md): woken while
    a call waits, the run stays; decided, the call runs there and the run moves at its boundary."""
    ws = workspace_with(tmp_path, {"a.txt": "alpha\n"})
    responses = [tool_call("l1", "ls", path="."), read_call("r1", "a.txt"), final("listed, then read")]
    rules = {"permissions": {"allow": ["read(*)"], "ask": ["ls"], "default": "deny"}}
    queue, deployment = f"test-{uuid.uuid4().hex[:10]}", deployment_name()
    async with AsyncExitStack() as stack:
        await stack.enter_async_context(build(client, tmp_path, queue, deployment, "b1", responses, **rules))
        await set_current(client, deployment, "b1")
        handle = await start(client, queue, ws, "list, then read")
        waiting = await awaiting_approval(handle)
        first = (await handle.describe()).run_id
        await stack.enter_async_context(build(client, tmp_path, queue, deployment, "b2", responses, **rules))
        await set_current(client, deployment, "b2")
        assert not await settled(client, queue, 30)
        # the command counts it among the runs deciding (once visibility has its status), wakes none
        monkeypatch.setenv("TEMPORAL_ADDRESS", client.service_client.config.target_host)
        monkeypatch.setenv("TEMPORAL_NAMESPACE", client.namespace)

        async def listed() -> str | None:
            capsys.readouterr()
            code = await asyncio.to_thread(run_cli, ["upgrade", "--task-queue", queue, "--wait", "5"])
            out = capsys.readouterr().out
            assert code == 0, out
            return out if f"{handle.id} waits for a decision" in out else None

        out = await until("the command to list the run as deciding", listed, 20, interval=0.3)
        assert "woke 0 run(s) waiting for a prompt" in out, out
        await handle.signal(SIGNAL_UPGRADE)  # woken anyway: it stays
        await asyncio.sleep(1)
        assert (await handle.describe()).run_id == first
        assert [p.call_id for p in (await awaiting_approval(handle)).pending_approvals] == ["l1"]
        [request] = waiting.pending_approvals
        decision = ApprovalDecision(
            call_id="l1", approved=True, step=request.step, arguments_digest=request.arguments_digest
        )
        await handle.execute_update(UPDATE_APPROVE, decision, result_type=ApprovalAnswer)
        result = await run_result(client, handle.id)
    unbroken(result, 2)
    first_history = await client.get_workflow_handle(handle.id, run_id=first).fetch_history()
    assert first_history.events[-1].HasField("workflow_execution_continued_as_new_event_attributes")
    assert task_builds(first_history) == {"b1"}
    # the decided call ran on build 1, the read after it on build 2
    assert [name for _, name in activity_calls(first_history.events)].count("agent.tool_call") == 1
    assert task_builds(await handle.fetch_history()) == {"b2"}


@workflow.defn(name="AgentRun")
class ChangedAgentRun(AgentRun):
    """Build 2's workflow: a timer first in every execution, a command build 1's histories lack."""

    @workflow.run
    async def run(self, raw: RawValue) -> AgentRunResult:
        await workflow.sleep(timedelta(milliseconds=10))
        return await super().run(raw)


async def test_a_build_whose_workflow_breaks_replay_takes_only_the_runs_that_moved(
    client: Client, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ws = workspace_with(tmp_path, {"a.txt": "alpha\n", "b.txt": "beta\n"})
    responses = [
        read_call("r1", "a.txt"),
        final("alpha"),
        final("still alpha"),
        read_call("r2", "b.txt"),
        final("beta"),
    ]
    queue, deployment = f"test-{uuid.uuid4().hex[:10]}", deployment_name()
    async with AsyncExitStack() as stack:
        await stack.enter_async_context(build(client, tmp_path, queue, deployment, "b1", responses))
        await set_current(client, deployment, "b1")
        handle = await start(client, queue, ws, "read a.txt", follow_ups=True)
        await status_when(handle, lambda s: s.status == AWAITING_PROMPT, "the first answer")
        first = (await handle.describe()).run_id
        with monkeypatch.context() as patched:  # build 2's worker runs the changed workflow
            patched.setattr(worker_module, "AgentRun", ChangedAgentRun)
            await stack.enter_async_context(build(client, tmp_path, queue, deployment, "b2", responses))
        await set_current(client, deployment, "b2")
        assert not await settled(client, queue, 30)
        # pinned: its next turn is build 1's, with no nondeterminism error
        # pinned: its next turn is build 1's, with no nondeterminism error; at its next wait it
        # moves, woken by nothing but the prompt's workflow task
        await send_prompt(handle, "and now?")
        second = await moved(client, handle, first, "b2")
        await status_when(handle, lambda s: s.status == AWAITING_PROMPT, "the moved run to wait")
        await send_prompt(handle, "now read b.txt")
        await status_when(
            handle, lambda s: s.status == AWAITING_PROMPT and s.turn == 2, "an answer on build 2"
        )
        await end_conversation(handle)
        result = await run_result(client, handle.id)
    assert result.status == "completed" and result.text == "beta", result
    on_build_1 = await client.get_workflow_handle(handle.id, run_id=first).fetch_history()
    on_build_2 = await client.get_workflow_handle(handle.id, run_id=second).fetch_history()
    assert task_builds(on_build_1) == {"b1"} and task_builds(on_build_2) == {"b2"}
    assert not any(e.HasField("workflow_task_failed_event_attributes") for e in on_build_1.events)
    assert idle_timers(on_build_2)[0] == 0.01  # build 2's own command, first in its execution
    models = [name for _, name in activity_calls(on_build_1.events) if name == MODEL_CALL.name]
    assert len(models) == 3  # the answer to the prompt sent after build 2 became current
    # what pinning spared: build 1's history does not replay on build 2's workflow
    replayer = Replayer(
        workflows=[ChangedAgentRun],
        data_converter=pydantic_data_converter,
        workflow_runner=UnsandboxedWorkflowRunner(),  # as the workers run it
    )
    replay = await replayer.replay_workflow(on_build_1, raise_on_replay_failure=False)
    assert replay.replay_failure is not None
