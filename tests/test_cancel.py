"""Cancel by signal: the run ends ``cancelled`` within seconds and no cancel is ever lost."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from temporalio.client import Client, WorkflowExecutionStatus, WorkflowHandle

from durable_agent.activities import AgentActivities
from durable_agent.activities.tools import Tool, builtin_tools
from durable_agent.client import run_result
from durable_agent.core.events import ToolEndEvent
from durable_agent.core.run_api import AgentRunResult, RunStatusView
from durable_agent.core.tool_specs import ToolArgs, ToolSpec
from tests.helpers import (
    BlockingSink,
    RecordingSink,
    activity_type_of,
    final,
    read_call,
    running_worker,
    scripted_config,
    start,
    status_when,
    tool_call,
    until,
    workspace_with,
)


class WaitArgs(ToolArgs):
    seconds: float


class WaitTools:
    """A ``wait`` tool: heartbeats (through the activity) and notes how it ended."""

    def __init__(self) -> None:
        self.started = asyncio.Event()
        self.starts = 0
        self.cancelled = asyncio.Event()
        self.completed = asyncio.Event()

    async def run(self, args: WaitArgs, workspace: Path) -> str:
        self.started.set()
        self.starts += 1
        try:
            await asyncio.sleep(args.seconds)
        except asyncio.CancelledError:
            self.cancelled.set()
            raise
        self.completed.set()
        return f"waited {args.seconds} s"

    def tools(self) -> dict[str, Tool]:
        spec = ToolSpec("wait", "Wait a while.", WaitArgs, None)
        return {**builtin_tools(), "wait": Tool(spec, self.run)}


def wait_config(tmp_path: Path, seconds: float) -> object:
    return scripted_config(
        tmp_path,
        [tool_call("wait-1", "wait", seconds=seconds), final("should never be reached")],
        permissions={"allow": ["read(*)", "wait"]},
    )


@asynccontextmanager
async def minute_long_tool(
    client: Client, tmp_path: Path, waiter: WaitTools
) -> AsyncIterator[WorkflowHandle[Any, AgentRunResult]]:
    """A run whose ``wait`` tool (60 s) is running, on an in-process worker."""
    acts = AgentActivities(wait_config(tmp_path, 60), tools=waiter.tools())  # type: ignore[arg-type]
    async with running_worker(client, acts) as queue:
        handle = await start(client, queue, workspace_with(tmp_path, {}), "wait a minute")
        await asyncio.wait_for(waiter.started.wait(), 10)
        yield handle


async def test_cancel_signal_while_a_tool_runs_ends_the_run_within_seconds(
    client: Client, tmp_path: Path
) -> None:
    waiter = WaitTools()
    async with minute_long_tool(client, tmp_path, waiter) as handle:
        await handle.signal("cancel", "the user changed their mind")
        # the tool would run 60 s: ending well before proves the cancel reached it
        result = await asyncio.wait_for(run_result(client, handle.id), 15)
        status = await handle.query("status", result_type=RunStatusView)
    assert result.status == "cancelled"
    assert result.error == "the user changed their mind"
    assert waiter.cancelled.is_set() and not waiter.completed.is_set()
    assert status.status == "cancelled" and status.cancel_requested
    assert result.text == ""  # the scripted final answer was never asked for


async def test_cancel_is_not_lost_when_the_tool_completes_anyway(client: Client, tmp_path: Path) -> None:
    """The pitfall: the activity finishes normally while its cancellation is pending."""

    class Stubborn(WaitTools):
        async def run(self, args: WaitArgs, workspace: Path) -> str:
            self.started.set()
            # shielded: the activity's cancellation does not stop it
            await asyncio.shield(asyncio.sleep(args.seconds))
            self.completed.set()
            return "done regardless"

    stubborn = Stubborn()
    acts = AgentActivities(wait_config(tmp_path, 3), tools=stubborn.tools())  # type: ignore[arg-type]
    async with running_worker(client, acts) as queue:
        handle = await start(client, queue, workspace_with(tmp_path, {}), "wait three seconds")
        await asyncio.wait_for(stubborn.started.wait(), 10)
        await handle.signal("cancel")
        result = await asyncio.wait_for(run_result(client, handle.id), 20)
    assert result.status == "cancelled"
    assert result.error == "cancelled by signal"
    assert result.text == ""


async def test_cancel_signal_during_a_model_call(client: Client, tmp_path: Path) -> None:
    config = scripted_config(tmp_path, [{"text": "slow answer", "delay_ms": 60_000}])
    async with running_worker(client, AgentActivities(config)) as queue:
        handle = await start(client, queue, workspace_with(tmp_path, {}), "think hard")
        await status_when(handle, lambda s: s.status == "executing", "the run to execute", 10)
        await asyncio.sleep(0.5)
        await handle.signal("cancel", "too slow")
        result = await asyncio.wait_for(run_result(client, handle.id), 15)
    assert result.status == "cancelled" and result.error == "too slow"


async def test_cancel_before_the_first_step_and_temporal_cancel_both_end_cancelled(
    client: Client, tmp_path: Path
) -> None:
    config = scripted_config(tmp_path, [{"text": "slow answer", "delay_ms": 60_000}])
    async with running_worker(client, AgentActivities(config)) as queue:
        # a Temporal cancel request (UI button, `temporal workflow cancel`) is honoured too
        handle = await start(client, queue, workspace_with(tmp_path, {}), "think hard")
        await status_when(handle, lambda s: s.status == "executing", "the run to execute", 10)
        await handle.cancel()
        result = await asyncio.wait_for(run_result(client, handle.id), 15)
        assert result.status == "cancelled"
        desc = await handle.describe()
        assert desc.status == WorkflowExecutionStatus.CANCELED


async def test_cancel_after_a_boundary_ends_the_run_with_that_boundary_exported(
    client: Client, tmp_path: Path
) -> None:
    waiter = WaitTools()
    config = scripted_config(
        tmp_path,
        [tool_call("wait-1", "wait", seconds=0.5), tool_call("wait-2", "wait", seconds=60), final()],
        permissions={"allow": ["wait"]},
    )
    sink = RecordingSink()
    acts = AgentActivities(config, tools=waiter.tools(), sinks={"local": sink})
    async with running_worker(client, acts) as queue:
        handle = await start(client, queue, workspace_with(tmp_path, {}), "wait twice")
        status = await status_when(handle, lambda s: s.exports_delivered >= 1, "the first export", 10)
        assert status.turn == 1
        await until("the second, long wait to run", lambda: waiter.starts == 2, 10)
        await handle.signal("cancel")
        result = await asyncio.wait_for(run_result(client, handle.id), 15)
    assert result.status == "cancelled"
    assert result.tool_calls_count == 1  # the second call never finished
    assert [e.turn for e in result.exports] == [1]
    assert [e.descriptor.turn for e in sink.exports] == [1]
    ends = [r.event for r in sink.exports[0].open().source_run().events if isinstance(r.event, ToolEndEvent)]
    assert [e.id for e in ends] == ["wait-1"]
    assert waiter.cancelled.is_set()


async def test_a_temporal_cancel_request_also_stops_the_tool_in_flight(
    client: Client, tmp_path: Path
) -> None:
    waiter = WaitTools()
    async with minute_long_tool(client, tmp_path, waiter) as handle:
        await handle.cancel()
        result = await asyncio.wait_for(run_result(client, handle.id), 15)
        history = await handle.fetch_history()
    assert result.status == "cancelled"
    assert result.error == "cancelled by a Temporal cancel request"
    # the run waited for the tool to stop rather than abandoning it
    assert any(e.HasField("activity_task_canceled_event_attributes") for e in history.events)
    assert waiter.cancelled.is_set() and not waiter.completed.is_set()


async def test_a_cancelled_run_ends_canceled_after_its_record_and_last_export(
    client: Client, tmp_path: Path
) -> None:
    """Temporal's Canceled state (the UI's list, ``ExecutionStatus`` filters), reached only
    once the run's end is in the store and its last boundary exported; its record still reads."""
    waiter = WaitTools()
    config = scripted_config(
        tmp_path,
        [tool_call("wait-1", "wait", seconds=0.2), tool_call("wait-2", "wait", seconds=60), final()],
        permissions={"allow": ["wait"]},
    )
    sink = RecordingSink()
    acts = AgentActivities(config, tools=waiter.tools(), sinks={"local": sink})
    async with running_worker(client, acts) as queue:
        handle = await start(client, queue, workspace_with(tmp_path, {}), "wait twice")
        await status_when(handle, lambda s: s.exports_delivered >= 1, "the first export", 10)
        await until("the second, long wait to run", lambda: waiter.starts == 2, 10)
        await handle.signal("cancel", "changed my mind")
        result = await asyncio.wait_for(run_result(client, handle.id), 20)
        status = await handle.query("status", result_type=RunStatusView)
        history = await handle.fetch_history()
        query = f'WorkflowId = "{handle.id}" AND ExecutionStatus = "Canceled"'

        async def listed() -> int:
            return (await client.count_workflows(query)).count

        await until("the run to be listed as Canceled", listed, 10)
    assert (await handle.describe()).status == WorkflowExecutionStatus.CANCELED
    assert (result.status, result.error, [e.turn for e in result.exports]) == (
        "cancelled",
        "changed my mind",
        [1],
    )
    assert (status.status, status.exports_delivered) == ("cancelled", 1)
    assert [e.descriptor.turn for e in sink.exports] == [1]
    types = [activity_type_of(e) for e in history.events]  # ordinary or local
    kinds = [e.WhichOneof("attributes") for e in history.events]
    finished = types.index("agent.finish_run")
    requested = kinds.index("workflow_execution_cancel_requested_event_attributes")
    assert finished < types.index("agent.request_cancel") < requested
    assert kinds[-1] == "workflow_execution_canceled_event_attributes"
    # the store kept the run's end: its record is in the session
    records = await acts.store.load_run_records(result.session_id)
    assert [(r.snapshot.id, r.snapshot.status) for r in records] == [(result.run_id, "cancelled")]


async def test_a_temporal_cancel_request_gives_its_reason_and_ends_canceled(
    client: Client, tmp_path: Path
) -> None:
    waiter = WaitTools()
    async with minute_long_tool(client, tmp_path, waiter) as handle:
        await handle.cancel(reason="stopped from the UI")
        result = await asyncio.wait_for(run_result(client, handle.id), 15)
        history = await handle.fetch_history()
    assert (await handle.describe()).status == WorkflowExecutionStatus.CANCELED
    assert (result.status, result.error) == ("cancelled", "stopped from the UI")
    names = [e.activity_task_scheduled_event_attributes.activity_type.name for e in history.events]
    assert "agent.request_cancel" not in names  # Temporal holds a request already


@pytest.mark.parametrize("how", ["signal", "request"])
async def test_a_cancel_during_a_checkpoint_lets_its_export_be_acknowledged(
    client: Client, tmp_path: Path, how: str
) -> None:
    """The run's last export is its last boundary's: a cancel never cuts a checkpoint short."""
    config = scripted_config(
        tmp_path, [read_call("r1", "a.txt"), final("never asked")], permissions={"allow": ["read(*)"]}
    )
    sink = BlockingSink()
    acts = AgentActivities(config, sinks={"local": sink})
    async with running_worker(client, acts) as queue:
        handle = await start(client, queue, workspace_with(tmp_path, {"a.txt": "alpha\n"}), "read a.txt")
        await asyncio.wait_for(sink.entered.acquire(), 15)  # the sink holds turn 1's export
        if how == "signal":
            await handle.signal("cancel", "stop now")
        else:
            await handle.cancel(reason="stop now")
        # past the workflow task timeout (3 s): the task is extended while the local activity
        # runs, and the cancel reaches the run meanwhile, while the sink still holds the export
        await asyncio.sleep(4)
        sink.release.release()
        result = await asyncio.wait_for(run_result(client, handle.id), 20)
    assert (result.status, result.error) == ("cancelled", "stop now")
    assert [e.turn for e in result.exports] == [1]  # acknowledged, not cut short
    assert not result.export_failures
    assert (await handle.describe()).status == WorkflowExecutionStatus.CANCELED
