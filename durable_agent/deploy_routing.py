"""A Worker Deployment's builds and where its new runs go: what ``durable-agent deploy`` reads and
sets over Temporal's API (docs/production.md, Deploys).

``deployment_state`` describes a deployment: its current and ramping build, and for each build
its status as the server keeps it (``draining``: runs are still pinned to it; ``drained``: none
are, its workers may stop), the open runs on it and how many of them are pinned (counted with
visibility's ``TemporalWorkerDeploymentVersion``), and the workers polling it now. ``promote``,
``ramp`` and ``rollback`` change the routing; each refuses, with a ``DeployRefused`` (a
``DurableAgentError``) whose message is one line for a person, what the server would refuse (a
deployment or build it does not know) and a build no worker polls (new runs would wait for
one), before asking it.
"""

from __future__ import annotations

import socket
from collections.abc import Iterable
from datetime import UTC, datetime, timedelta
from typing import Literal

from google.protobuf.timestamp_pb2 import Timestamp
from pydantic import BaseModel, ConfigDict, Field
from temporalio.api.deployment.v1 import WorkerDeploymentInfo, WorkerDeploymentVersion
from temporalio.api.enums.v1 import TaskQueueType, WorkerDeploymentVersionStatus
from temporalio.api.taskqueue.v1 import TaskQueue
from temporalio.api.workflowservice.v1 import (
    DescribeTaskQueueRequest,
    DescribeWorkerDeploymentRequest,
    DescribeWorkerDeploymentVersionRequest,
    SetWorkerDeploymentCurrentVersionRequest,
    SetWorkerDeploymentRampingVersionRequest,
)
from temporalio.client import Client
from temporalio.service import RPCError, RPCStatusCode

from durable_agent.core.errors import DurableAgentError

__all__ = [
    "BuildState",
    "DeployRefused",
    "DeploymentState",
    "deployment_state",
    "promote",
    "ramp",
    "rollback",
]

# A worker polls without pause, and a poll waits at most a minute on the server, which keeps a
# poller it has not heard from in its list for minutes: one seen this recently is still there.
LIVE_POLL = timedelta(seconds=90)

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
        builds: Every build, the newest first.
        conflict_token: The routing's revision, which a change passes so that it fails
            rather than undo a change made meanwhile.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    current: str | None
    ramping: str | None
    ramp_percentage: float
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


def _refused(exc: RPCError, name: str, build_id: str | None = None) -> DeployRefused:
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
        raise _refused(exc, name) from None
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
        builds=tuple(builds),
        conflict_token=described.conflict_token,
    )


def _routable(state: DeploymentState, build_id: str, *, force: bool) -> None:
    """Refuse to send runs to ``build_id`` where the deployment has no such build, or (unless
    ``force``) no worker of it polls."""
    build = state.build(build_id)
    if build is None:
        known = ", ".join(b.build_id for b in state.builds) or "none"
        raise DeployRefused(
            f"deployment {state.name!r} has no build {build_id!r} (its builds: {known}): "
            "start a worker of it first"
        )
    if build.pollers == 0 and not force:
        raise DeployRefused(
            f"no worker of build {build_id!r} polls (none in the last {LIVE_POLL.seconds} s): "
            "start its workers first (--force routes runs to it anyway, to wait for them)"
        )


def _identity() -> str:
    return f"durable-agent deploy@{socket.gethostname()}"


async def promote(client: Client, name: str, build_id: str, *, force: bool = False) -> str | None:
    """Make ``build_id`` the deployment's current build: new runs go to it (a ramp to it ends).

    Args:
        client: A client of the deployment's namespace.
        name: The deployment.
        build_id: The build.
        force: Even when no worker of the build polls now.

    Returns:
        The build that was current (None: none, or unversioned); ``build_id`` itself when it
            already was (nothing changed).

    Raises:
        DeployRefused: No such deployment or build, no worker of it polls, or the server refused.
    """
    state = await deployment_state(client, name)
    if state.current == build_id:
        return build_id
    _routable(state, build_id, force=force)
    return await _set_current(client, state, build_id, force=force)


async def _set_current(client: Client, state: DeploymentState, build_id: str, *, force: bool) -> str | None:
    try:
        await client.workflow_service.set_worker_deployment_current_version(
            SetWorkerDeploymentCurrentVersionRequest(
                namespace=client.namespace,
                deployment_name=state.name,
                build_id=build_id,
                conflict_token=state.conflict_token,
                identity=_identity(),
                # a build's own task queues (each worker process's host queue) come and go with
                # its processes: the new build never polls the old one's, and need not
                ignore_missing_task_queues=True,
                allow_no_pollers=force,
            )
        )
    except RPCError as exc:
        raise _refused(exc, state.name, build_id) from None
    return state.current


async def ramp(client: Client, name: str, build_id: str, percentage: float, *, force: bool = False) -> None:
    """Send ``percentage`` percent of new runs to ``build_id`` instead of the current build.

    Args:
        client: A client of the deployment's namespace.
        name: The deployment.
        build_id: The build to ramp (not the current one).
        percentage: 0 to 100.
        force: Even when no worker of the build polls now.

    Raises:
        DeployRefused: No such deployment or build, it is the current build, no worker of it
            polls, or the server refused.
        ValueError: ``percentage`` is not within 0 to 100.
    """
    if not 0 <= percentage <= 100:
        raise ValueError(f"a ramp's percentage is 0 to 100, not {percentage}")
    state = await deployment_state(client, name)
    if state.current == build_id:
        raise DeployRefused(f"build {build_id!r} is the current build already: ramp another one")
    _routable(state, build_id, force=force)
    await _set_ramp(client, state, build_id, percentage, force=force)


async def _set_ramp(
    client: Client, state: DeploymentState, build_id: str, percentage: float, *, force: bool
) -> None:
    try:
        await client.workflow_service.set_worker_deployment_ramping_version(
            SetWorkerDeploymentRampingVersionRequest(
                namespace=client.namespace,
                deployment_name=state.name,
                build_id=build_id,  # "": no ramp
                percentage=percentage,
                conflict_token=state.conflict_token,
                identity=_identity(),
                ignore_missing_task_queues=True,
                allow_no_pollers=force,
            )
        )
    except RPCError as exc:
        raise _refused(exc, state.name, build_id or None) from None


async def rollback(client: Client, name: str, *, force: bool = False) -> tuple[str, str | None]:
    """Undo the last routing change: a ramp in progress ends (every new run to the current
    build); else the build current before this one is current again.

    Args:
        client: A client of the deployment's namespace.
        name: The deployment.
        force: Even when no worker of the build rolled back to polls now.

    Returns:
        What changed: ``("ramp", build)`` (the ramp of ``build`` ended) or ``("current",
            build)`` (``build`` is current again).

    Raises:
        DeployRefused: No such deployment, no build current before, no worker of it polls,
            or the server refused.
    """
    state = await deployment_state(client, name)
    if state.ramping is not None:
        await _set_ramp(client, state, "", 0, force=True)
        return "ramp", state.ramping
    previous = state.previous()
    if previous is None:
        raise DeployRefused(f"deployment {name!r} has had no other current build: nothing to roll back to")
    _routable(state, previous.build_id, force=force)
    await _set_current(client, state, previous.build_id, force=force)
    return "current", previous.build_id
