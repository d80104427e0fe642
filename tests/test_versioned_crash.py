"""kill -9 of a build-1 worker while its runs drain to build 2 (docs/deploys.md): another build-1
worker takes the run, which then moves to build 2 at its next tool boundary.

Real ``python worker.py`` processes (``tests/test_crash_recovery.py``), each a build of one
Worker Deployment by ``AGENT_DEPLOYMENT`` and ``AGENT_BUILD_ID``.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowHistory

from durable_agent.client import start_run
from durable_agent.core.run_api import AgentRunInput
from tests.test_crash_recovery import N_CALLS, export_files, read_responses, until_alive, workers, write_setup
from tests.versioning import deployment_name, set_current, task_builds

SLOW_STEP = 2  # the third model call: build 2 becomes current and build 1's worker dies during it


def task_identities(history: WorkflowHistory) -> set[str]:
    """The processes (pids) whose workers completed the history's workflow tasks."""
    return {
        e.workflow_task_completed_event_attributes.identity.split("@")[0]
        for e in history.events
        if e.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED
    }


async def test_kill_9_of_a_build_1_worker_during_the_drain(client: Client, tmp_path: Path) -> None:
    responses = read_responses(delay_ms=200, slow={SLOW_STEP: 10_000})
    config, workspace, sink_root = write_setup(tmp_path, responses)
    deployment = deployment_name()
    with workers(client, config, tmp_path) as procs:
        procs.env |= {"AGENT_DEPLOYMENT": deployment, "AGENT_BUILD_ID": "b1"}
        first = procs.start()
        await set_current(client, deployment, "b1")
        handle = await start_run(
            client, AgentRunInput(prompt="read the files", workspace=str(workspace)), queue=procs.queue
        )

        async def two_exports() -> bool:
            return len(export_files(sink_root)) >= 2

        await until_alive("two export files", two_exports, 45, procs)
        first_run = (await handle.describe()).run_id
        procs.env["AGENT_BUILD_ID"] = "b2"
        procs.start()
        await set_current(client, deployment, "b2")
        procs.kill(first)  # during the slow model call: the run is still on build 1
        assert (await handle.describe()).run_id == first_run, "the run moved before the kill: no drain tested"
        procs.env["AGENT_BUILD_ID"] = "b1"
        another = procs.start()
        result = await asyncio.wait_for(handle.result(), 120)
        drained = await client.get_workflow_handle(handle.id, run_id=first_run).fetch_history()
        moved = await handle.fetch_history()
    assert result.status == "completed", result.error
    assert result.tool_calls_count == N_CALLS
    assert [ref.turn for ref in result.exports] == list(range(1, N_CALLS + 1))
    assert not result.export_failures and not result.persistence_failures
    # build 1's two workers ran the first execution, the killed one and the one that took over;
    # it moved at the boundary after the slow call, and build 2 ran the rest
    assert task_builds(drained) == {"b1"}
    assert {str(first.pid), str(another.pid)} <= task_identities(drained)
    assert drained.events[-1].event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_CONTINUED_AS_NEW
    assert task_builds(moved) == {"b2"}
