"""A Worker Deployment's builds as ``durable-agent deploy status`` shows them, read over
Temporal's API (docs/production.md, Deploys).

``deployment_state`` describes a deployment: its current and ramping build, and for each build
its status as the server keeps it (``draining``: runs are still pinned to it; ``drained``: none
are, its workers may stop), the open runs on it and how many of them are pinned (counted with
visibility's ``TemporalWorkerDeploymentVersion``), and the workers polling it now. What changes
the routing is ``deploy_routing.py``'s.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import UTC, datetime, timedelta
from typing import Literal

from google.protobuf.timestamp_pb2 import Timestamp
from pydantic import BaseModel, ConfigDict, Field
from temporalio.api.deployment.v1 import WorkerDeploymentInfo, WorkerDeploymentVersion
from temporalio.api.enums.v1 import RoutingConfigUpdateState, TaskQueueType, WorkerDeploymentVersionStatus
from temporalio.api.taskqueue.v1 import TaskQueue
from temporalio.api.workflowservice.v1 import (
    DescribeTaskQueueRequest,
    DescribeWorkerDeploymentRequest,
    DescribeWorkerDeploymentVersionRequest,
)
from temporalio.client import Client
from temporalio.service import RPCError, RPCStatusCode

from durable_agent.core.errors import DurableAgentError

__all__ = ["LIVE_POLL", "BuildState", "DeployRefused", "DeploymentState", "deployment_state", "refused"]

# A worker polls without pause, and a poll waits at most a minute on the server, which keeps a
# poller it has not heard from in its list for minutes: one seen this recently is still there.
LIVE_POLL = timedelta(seconds=90)
# The server is still telling the deployment's task queues of its last routing change.
IN_PROGRESS = RoutingConfigUpdateState.ROUTING_CONFIG_UPDATE_STATE_IN_PROGRESS

BuildStatus = Literal["current", "ramping", "draining", "drained", "inactive", "created", "unknown"]
_STATUS: dict[int, BuildStatus] = {
    WorkerDeploymentVersionStatus.WORKER_DEPLOYMENT_VERSION_STATUS_CURRENT: "current",
    WorkerDeploymentVersionStatus.WORKER_DEPLOYMENT_VERSION_STATUS_RAMPING: "ramping",
    WorkerDeploymentVersionStatus.WORKER_DEPLOYMENT_VERSION_STATUS_DRAINING: "draining",
    WorkerDeploymentVersionStatus.WORKER_DEPLOYMENT_VERSION_STATUS_DRAINED: "drained",
    WorkerDeploymentVersionStatus.WORKER_DEPLOYMENT_VERSION_STATUS_INACTIVE: "inactive",
    WorkerDeploymentVersionStatus.WORKER_DEPLOYMENT_VERSION_STATUS_CREATED: "created",
}


# A refusal, by the server or by the check before asking it, is a ``DurableAgentError`` whose
# message is one line that says what to do (a class of its own would need a place in
# tests/test_failures.py's list of exception types).
DeployRefused = DurableAgentError


class BuildState(BaseModel):
    """One build (version) of a deployment, as ``deployment_state`` found it.

    Attributes:
        build_id: The build.
        status: The server's: ``current``, ``ramping``, ``draining`` (no longer current, runs
            still pinned to it), ``drained`` (none: its workers may stop), ``inactive`` (never
            current), ``created``.
        running: Open runs on this build.
        pinned: Of those, the runs pinned to it.
        pollers: Workers of this build polling its workflow task queues now.
        task_queues: Its workflow task queues.
        created: When its first worker polled.
        last_current: When it last became current (None: never).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    build_id: str
    status: BuildStatus
    running: int
    pinned: int
    pollers: int
    task_queues: tuple[str, ...]
    created: datetime | None
    last_current: datetime | None


class DeploymentState(BaseModel):
    """A deployment's routing and builds (``deployment_state``).

    Attributes:
        name: The deployment.
        current: The build new runs go to (None: unversioned workers take them).
        ramping: The build a share of new runs goes to instead (None: none).
        ramp_percentage: That share, in percent.
        propagating: The server is still telling the task queues of the last change.
        builds: Every build, the newest first.
        conflict_token: The routing's revision, which a change passes so that it fails
            rather than undo a change made meanwhile.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    current: str | None
    ramping: str | None
    ramp_percentage: float
    propagating: bool
    builds: tuple[BuildState, ...]
    conflict_token: bytes = Field(exclude=True, repr=False)

    def build(self, build_id: str) -> BuildState | None:
        """The build ``build_id``, or None when the deployment has no such build."""
        return next((b for b in self.builds if b.build_id == build_id), None)

    def previous(self) -> BuildState | None:
        """The build that was current before the current one (None: there was none)."""
        former = [b for b in self.builds if b.build_id != self.current and b.last_current is not None]
        return max(former, key=lambda b: b.last_current or datetime.min.replace(tzinfo=UTC), default=None)


def _time(stamp: Timestamp) -> datetime | None:
    return stamp.ToDatetime(tzinfo=UTC) if stamp.seconds or stamp.nanos else None


def refused(exc: RPCError, name: str, build_id: str | None = None) -> DeployRefused:
    """The server's refusal as a line for a person."""
    if exc.status == RPCStatusCode.UNIMPLEMENTED:
        return DeployRefused(
            "this Temporal server has no worker deployments (they need server 1.28 or later)"
        )
    if exc.status == RPCStatusCode.NOT_FOUND and build_id is not None and "build" in exc.message.lower():
        return DeployRefused(
            f"deployment {name!r} has no build {build_id!r}: no worker of that build has polled"
        )
    if exc.status == RPCStatusCode.NOT_FOUND:
        return DeployRefused(
            f"no worker deployment {name!r}: no worker of it has polled yet (workers name it with "
            "[worker] deployment or AGENT_DEPLOYMENT)"
        )
    if exc.status in (RPCStatusCode.FAILED_PRECONDITION, RPCStatusCode.ABORTED) and "conflict" in exc.message:
        return DeployRefused(
            f"deployment {name!r} changed meanwhile (another deploy?): look again with deploy status"
        )
    return DeployRefused(f"the server refused: {' '.join(exc.message.split())}")


async def _live_pollers(client: Client, queues: Iterable[str], name: str) -> dict[str, set[str]]:
    """The workers polling each build of deployment ``name`` now, by build: ``queues``'s pollers
    of the workflow task type, by identity, that polled within ``LIVE_POLL``."""
    since = datetime.now(UTC) - LIVE_POLL
    found: dict[str, set[str]] = {}
    for queue in sorted(set(queues)):
        described = await client.workflow_service.describe_task_queue(
            DescribeTaskQueueRequest(
                namespace=client.namespace,
                task_queue=TaskQueue(name=queue),
                task_queue_type=TaskQueueType.TASK_QUEUE_TYPE_WORKFLOW,
            )
        )
        for poller in described.pollers:
            options = poller.deployment_options
            seen = _time(poller.last_access_time)
            if options.deployment_name == name and seen is not None and seen >= since:
                found.setdefault(options.build_id, set()).add(poller.identity)
    return found


async def _count(client: Client, query: str) -> int:
    return (await client.count_workflows(query)).count


async def _build_queues(client: Client, version: WorkerDeploymentVersion) -> tuple[str, ...]:
    described = await client.workflow_service.describe_worker_deployment_version(
        DescribeWorkerDeploymentVersionRequest(namespace=client.namespace, deployment_version=version)
    )
    return tuple(
        sorted(
            {
                q.name
                for q in described.version_task_queues
                if q.type == TaskQueueType.TASK_QUEUE_TYPE_WORKFLOW
            }
        )
    )


async def deployment_state(client: Client, name: str) -> DeploymentState:
    """Describe deployment ``name``: its routing, and each build's status, runs and pollers.

    Args:
        client: A client of the deployment's namespace.
        name: The deployment.

    Returns:
        Its state now.

    Raises:
        DeployRefused: The server knows no such deployment, or has no worker deployments.
        RPCError: Another call failed (the server is not reachable, …).
    """
    try:
        described = await client.workflow_service.describe_worker_deployment(
            DescribeWorkerDeploymentRequest(namespace=client.namespace, deployment_name=name)
        )
    except RPCError as exc:
        raise refused(exc, name) from None
    info: WorkerDeploymentInfo = described.worker_deployment_info
    routing = info.routing_config
    queues = {}
    for summary in info.version_summaries:
        queues[summary.deployment_version.build_id] = await _build_queues(client, summary.deployment_version)
    pollers = await _live_pollers(client, (q for qs in queues.values() for q in qs), name)
    builds = []
    for summary in info.version_summaries:
        build = summary.deployment_version.build_id
        on_build = f'TemporalWorkerDeploymentVersion = "{name}:{build}" AND ExecutionStatus = "Running"'
        builds.append(
            BuildState(
                build_id=build,
                status=_STATUS.get(summary.status, "unknown"),
                running=await _count(client, on_build),
                pinned=await _count(client, f'{on_build} AND TemporalWorkflowVersioningBehavior = "Pinned"'),
                pollers=len(pollers.get(build, ())),
                task_queues=queues[build],
                created=_time(summary.create_time),
                last_current=_time(summary.last_current_time),
            )
        )
    builds.sort(key=lambda b: b.created or datetime.min.replace(tzinfo=UTC), reverse=True)
    return DeploymentState(
        name=name,
        current=routing.current_deployment_version.build_id or None,
        ramping=routing.ramping_deployment_version.build_id or None,
        ramp_percentage=routing.ramping_version_percentage,
        propagating=info.routing_config_update_state == IN_PROGRESS,
        builds=tuple(builds),
        conflict_token=described.conflict_token,
    )
