"""Queries answered by replay, at every point of a run: a worker that keeps no run cached
answers each ``status`` query by replaying the run's history from its start (a "legacy
query" in the SDK's terms), whatever workflow task the run is in.

A patch asked after a local activity in the same workflow task failed such a replay ("Non-deprecated
patch marker encountered ... no corresponding change command"): at a run's first tool boundary,
and in its first task once its start ran as local activities. Each execution now asks its
patches in its first task, before any local activity (``starting.ask_patches_first``).
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowHandle
from temporalio.worker import UnsandboxedWorkflowRunner, Worker

from durable_agent.activities import AgentActivities
from durable_agent.client import start_run
from durable_agent.core.run_api import AgentRunInput
from durable_agent.workflows.agent_run import AgentRun
from tests.helpers import final, read_call, running_worker, scripted_config, start, workspace_with


def steps(n: int) -> list[dict[str, Any]]:
    return [read_call(f"r{i}", "a.txt") for i in range(n)] + [final()]


async def hammer(handle: WorkflowHandle[Any, Any]) -> tuple[int, list[str]]:
    """Query ``status`` as fast as it answers until the run ends: answers, and failures."""
    answered, failures = 0, []
    while True:
        try:
            await handle.query("status")
            answered += 1
        except Exception as exc:  # every failure is collected; the test says which are allowed
            failures.append(f"{type(exc).__name__}: {exc}")
        description = await handle.describe()
        if description.status is not None and description.status.name != "RUNNING":
            return answered, failures
        await asyncio.sleep(0.01)


async def run_queried(client: Client, queue: str, run: AgentRunInput) -> tuple[Any, int, list[str]]:
    handle = await start_run(client, run, queue=queue)
    answered, failures = await hammer(handle)
    result = await handle.result()
    failed_tasks = [
        e.workflow_task_failed_event_attributes.failure.message
        async for e in handle.fetch_history_events()
        if e.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_FAILED
    ]
    return result, answered, failures + failed_tasks


# The SDK warns when a worker that keeps no run evicts one whose local activity has just ended.
@pytest.mark.filterwarnings("ignore:Cannot find activity to cancel")
async def test_a_worker_without_a_cache_answers_queries_at_every_step(client: Client, tmp_path: Path) -> None:
    config = scripted_config(tmp_path, steps(3))
    ws = workspace_with(tmp_path, {"a.txt": "alpha\n"})
    # an export to resume from: a run resumed from a file reads it in an activity of its own
    async with running_worker(client, AgentActivities(config)) as queue:
        first = await (await start(client, queue, ws)).result()
    assert first.status == "completed", first.error
    manifest = sorted((tmp_path / "exports").rglob("turn-*.json"))[0]

    queue = "uncached-" + tmp_path.name[-12:]
    worker = Worker(
        client,
        task_queue=queue,
        workflows=[AgentRun],
        activities=AgentActivities(config).all(),
        max_cached_workflows=0,  # every query and every task replays the run from its start
        workflow_runner=UnsandboxedWorkflowRunner(),
    )
    async with worker:
        runs = [
            AgentRunInput(prompt="read a.txt three times", workspace=str(ws)),
            AgentRunInput(resume_from_file=str(manifest), workspace=str(ws)),
        ]
        # a task that fails on replay is tried again and again: the run would never end
        outcomes = await asyncio.wait_for(asyncio.gather(*(run_queried(client, queue, r) for r in runs)), 60)
    for result, answered, failures in outcomes:
        assert result.status == "completed", result.error
        assert answered >= 3, (answered, failures)
        assert not [f for f in failures if "ondeterminism" in f], failures
