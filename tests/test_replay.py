"""Determinism: recorded histories replay on today's workflow code.

``tests/histories/*.json`` are committed; a change that breaks their replay
fails here. Re-record only for an intended, versioned change
(``scripts/record_history.py``).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from temporalio.client import Client, WorkflowHistory
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.worker import Replayer
from temporalio.worker.workflow_sandbox import SandboxedWorkflowRunner

from durable_agent.activities import AgentActivities
from durable_agent.client import run_result
from durable_agent.workflows import AgentRun
from tests.helpers import RecordingSink, read_call, running_worker, scripted_config, start, tool_call, until

HISTORIES = sorted((Path(__file__).parent / "histories").glob("*.json"))


def replayer() -> Replayer:
    """Under Temporal's sandbox, which workers leave off for speed (``worker.py``): a workflow
    change that reads a clock or does I/O fails here."""
    return Replayer(
        workflows=[AgentRun],
        data_converter=pydantic_data_converter,
        workflow_runner=SandboxedWorkflowRunner(),
    )


def test_there_are_committed_histories() -> None:
    assert HISTORIES, "tests/histories/ must hold at least one recorded AgentRun history"


@pytest.mark.parametrize("path", HISTORIES, ids=[p.name for p in HISTORIES])
async def test_committed_history_replays(path: Path) -> None:
    history = WorkflowHistory.from_json("recorded", path.read_text())
    result = await replayer().replay_workflow(history, raise_on_replay_failure=False)
    assert result.replay_failure is None, f"{path.name} no longer replays: {result.replay_failure}"


async def test_a_fresh_run_with_cancel_replays(client: Client, tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "a.txt").write_text("a\n")
    config = scripted_config(
        tmp_path, [read_call("r1", "a.txt"), tool_call("x", "nope"), {"text": "slow", "delay_ms": 30_000}]
    )
    sink = RecordingSink()
    async with running_worker(client, AgentActivities(config, sinks={"local": sink})) as queue:
        handle = await start(client, queue, ws)
        await until("two exports", lambda: len(sink.exports) >= 2)
        await handle.signal("cancel", "replay me")
        result = await run_result(client, handle.id)
        assert result.status == "cancelled"
        history = await handle.fetch_history()
    replay = await replayer().replay_workflow(history, raise_on_replay_failure=False)
    assert replay.replay_failure is None, replay.replay_failure


@pytest.mark.parametrize(
    "path", [p for p in HISTORIES if "_v4" in p.name or "_v5" in p.name], ids=lambda p: p.name
)
def test_a_v4_or_v5_history_checkpoints_each_boundary_in_one_activity(path: Path) -> None:
    """Since ``boundary-one-local-checkpoint``: one ``agent.checkpoint`` a boundary, no save then
    export; local after a tool activity. Since ``boundary-checkpoint-same-bytes`` (v5), an
    ordinary activity for a call that never ran (its input recorded)."""
    history = WorkflowHistory.from_json("recorded", path.read_text())
    scheduled = [
        e.activity_task_scheduled_event_attributes.activity_type.name
        for e in history.events
        if e.HasField("activity_task_scheduled_event_attributes")
    ]
    markers = [e for e in history.events if e.HasField("marker_recorded_event_attributes")]
    patches = [m.marker_recorded_event_attributes.details["patch-data"] for m in markers]
    patch_ids = b"".join(p.payloads[0].data for p in patches if p.payloads)
    assert b"boundary-one-local-checkpoint" in patch_ids
    assert "agent.export_checkpoint" not in scheduled
    local = [m for m in markers if m.marker_recorded_event_attributes.marker_name == "core_local_activity"]
    if "_v5" in path.name and "agent.checkpoint" in scheduled:
        assert b"boundary-checkpoint-same-bytes" in patch_ids
    if "_v4" in path.name:
        assert "agent.checkpoint" not in scheduled
    if scheduled.count("agent.tool_call"):
        assert local, "a tool activity's boundary is a local activity"


def test_the_v6_cancelled_history_ends_canceled_after_its_own_request() -> None:
    """``cancel-ends-canceled``: the run's end reaches the store, then it asks for its cancel."""
    history = WorkflowHistory.from_json(
        "recorded", (HISTORIES[0].parent / "agent_run_cancelled_v6.json").read_text()
    )
    kinds = [e.WhichOneof("attributes") for e in history.events]
    names = [e.activity_task_scheduled_event_attributes.activity_type.name for e in history.events]
    finish, request = names.index("agent.finish_run"), names.index("agent.request_cancel")
    assert finish < request < kinds.index("workflow_execution_cancel_requested_event_attributes")
    assert kinds[-1] == "workflow_execution_canceled_event_attributes"
