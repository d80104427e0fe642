"""Worker versioning in tests and recordings: versioned workers of one deployment, its current
build set, and where a run's executions ran (``tests/test_versioned_runs.py``,
``scripts/record_release_history.py``)."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from temporalio.api.workflowservice.v1 import SetWorkerDeploymentCurrentVersionRequest
from temporalio.client import Client, WorkflowHandle, WorkflowHistory
from temporalio.service import RPCError

from durable_agent.activities import AgentActivities
from durable_agent.cli.upgrade import upgrade_waiting
from durable_agent.config import AgentConfig
from durable_agent.worker import build_worker
from tests.helpers import until


def deployment_name() -> str:
    return f"agent-{uuid.uuid4().hex[:8]}"


@asynccontextmanager
async def versioned_worker(client: Client, config: AgentConfig, queue: str) -> AsyncIterator[None]:
    """A worker of ``config`` (whose ``[worker]`` names a deployment and a build) on ``queue``."""
    assert config.worker.deployment and config.worker.build_id
    async with build_worker(client, AgentActivities(config), queue):
        yield


async def set_current(client: Client, deployment: str, build_id: str) -> None:
    """Make ``build_id`` the deployment's current build, once the server knows its pollers."""

    async def done() -> bool:
        try:
            await client.workflow_service.set_worker_deployment_current_version(
                SetWorkerDeploymentCurrentVersionRequest(
                    namespace=client.namespace, deployment_name=deployment, build_id=build_id, identity="test"
                )
            )
        except RPCError:  # no such deployment or build yet: its worker has not polled
            return False
        return True

    await until(f"{build_id} to become current", done, 30, interval=0.3)


async def pinned_build(client: Client, workflow_id: str) -> str:
    """The build the run's latest execution is pinned to ("" when it is on none yet)."""
    described = await client.get_workflow_handle(workflow_id).describe()
    info = described.raw_description.workflow_execution_info.versioning_info
    return info.deployment_version.build_id


async def moved(client: Client, handle: WorkflowHandle[Any, Any], run_id: str, build_id: str) -> str:
    """The run's new execution once it runs pinned to ``build_id`` (its run id)."""

    async def there() -> str | None:
        latest = await client.get_workflow_handle(handle.id).describe()
        if latest.run_id == run_id:
            return None
        return latest.run_id if await pinned_build(client, handle.id) == build_id else None

    found: str = await until(f"the run to move to {build_id}", there, 30, interval=0.2)
    return found


async def woken(client: Client, queue: str, workflow_id: str) -> bool:
    """Whether ``durable-agent upgrade`` found the run waiting for a prompt, and woke it."""
    report = await upgrade_waiting(client, queue)
    return workflow_id in report.woken


def task_builds(history: WorkflowHistory) -> set[str]:
    """The builds whose workers completed the history's workflow tasks."""
    return {
        e.workflow_task_completed_event_attributes.deployment_version.build_id
        for e in history.events
        if e.HasField("workflow_task_completed_event_attributes")
    }
