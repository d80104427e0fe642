"""Where a Worker Deployment's new runs go: ``durable-agent deploy promote``, ``ramp`` and
``rollback`` over Temporal's API (docs/production.md, Deploys).

Each change reads the deployment first (``deploy_state.deployment_state``) and refuses, with a
``DeployRefused`` (a ``DurableAgentError``) whose message is one line for a person, what the
server would refuse (a deployment or build it does not know, a change that crossed another)
and a build no worker polls (new runs would wait for one), before asking it; then it waits
until the server has told the deployment's task queues, so that a run started after it goes
where it says.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Awaitable
from datetime import timedelta
from typing import Literal

from pydantic import BaseModel, ConfigDict
from temporalio.api.workflowservice.v1 import (
    DescribeWorkerDeploymentRequest,
    SetWorkerDeploymentCurrentVersionRequest,
    SetWorkerDeploymentRampingVersionRequest,
)
from temporalio.client import Client
from temporalio.service import RPCError

from durable_agent import deploy_state
from durable_agent.deploy_state import DeploymentState, DeployRefused, deployment_state, refused

__all__ = ["RoutingChange", "promote", "ramp", "rollback"]

# How long a change waits for the server to tell the deployment's task queues of it (about a
# second on the dev server): until then, a run started may still go where runs went before.
PROPAGATION_WAIT = timedelta(seconds=30)


async def _propagated(client: Client, name: str) -> bool:
    """Wait until the server has told the deployment's task queues of its routing (at most
    ``PROPAGATION_WAIT``), so that a run started after a change goes where the change says.

    Returns:
        Whether it has.
    """
    deadline = asyncio.get_running_loop().time() + PROPAGATION_WAIT.total_seconds()
    request = DescribeWorkerDeploymentRequest(namespace=client.namespace, deployment_name=name)
    while True:
        described = await client.workflow_service.describe_worker_deployment(request)
        if described.worker_deployment_info.routing_config_update_state != deploy_state.IN_PROGRESS:
            return True
        if asyncio.get_running_loop().time() > deadline:
            return False
        await asyncio.sleep(0.1)


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
            f"no worker of build {build_id!r} polls (none in the last {deploy_state.LIVE_POLL.seconds} s): "
            "start its workers first (--force routes runs to it anyway, to wait for them)"
        )


def _identity() -> str:
    return f"durable-agent deploy@{socket.gethostname()}"


class RoutingChange(BaseModel):
    """What a ``promote``, ``ramp`` or ``rollback`` changed.

    Attributes:
        what: ``current`` (a build became current), ``ramp`` (a ramp started or changed),
            ``ramp_ended`` (a ramp ended), ``none`` (the build was current already).
        build_id: The build it is about.
        previous: The build current before (``current``), or ramping before (``ramp``).
        seconds: How long the server took to tell the task queues, from the change's answer.
        propagated: Whether it had, within ``PROPAGATION_WAIT``; until it has, a run started
            may still go where runs went before.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    what: Literal["current", "ramp", "ramp_ended", "none"]
    build_id: str
    previous: str | None = None
    seconds: float = 0.0
    propagated: bool = True


async def promote(client: Client, name: str, build_id: str, *, force: bool = False) -> RoutingChange:
    """Make ``build_id`` the deployment's current build: new runs go to it (a ramp to it ends).

    Args:
        client: A client of the deployment's namespace.
        name: The deployment.
        build_id: The build.
        force: Even when no worker of the build polls now.

    Returns:
        The change, once the server has told the task queues of it; ``none`` when the build
            was current already.

    Raises:
        DeployRefused: No such deployment or build, no worker of it polls, or the server refused.
    """
    state = await deployment_state(client, name)
    if state.current == build_id:
        return RoutingChange(what="none", build_id=build_id, previous=build_id)
    _routable(state, build_id, force=force)
    return await _set_current(client, state, build_id, force=force)


async def _set_current(
    client: Client, state: DeploymentState, build_id: str, *, force: bool
) -> RoutingChange:
    seconds, propagated = await _routed(
        client,
        state,
        build_id,
        client.workflow_service.set_worker_deployment_current_version(
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
        ),
    )
    return RoutingChange(
        what="current", build_id=build_id, previous=state.current, seconds=seconds, propagated=propagated
    )


async def ramp(
    client: Client, name: str, build_id: str, percentage: float, *, force: bool = False
) -> RoutingChange:
    """Send ``percentage`` percent of new runs to ``build_id`` instead of the current build.

    Args:
        client: A client of the deployment's namespace.
        name: The deployment.
        build_id: The build to ramp (not the current one).
        percentage: 0 to 100.
        force: Even when no worker of the build polls now.

    Returns:
        The change (``ramp``), once the server has told the task queues of it.

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
    return await _set_ramp(client, state, build_id, percentage, force=force)


async def _set_ramp(
    client: Client, state: DeploymentState, build_id: str, percentage: float, *, force: bool
) -> RoutingChange:
    seconds, propagated = await _routed(
        client,
        state,
        build_id,
        client.workflow_service.set_worker_deployment_ramping_version(
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
        ),
    )
    return RoutingChange(
        what="ramp" if build_id else "ramp_ended",
        build_id=build_id or state.ramping or "",
        previous=state.ramping,
        seconds=seconds,
        propagated=propagated,
    )


async def _routed(
    client: Client, state: DeploymentState, build_id: str, sent: Awaitable[object]
) -> tuple[float, bool]:
    """Send one change of the deployment's routing (``sent``, not awaited yet), then wait until the
    task queues know of it (``_propagated``).

    Returns:
        The seconds it took, and whether the queues knew of it within ``PROPAGATION_WAIT``.

    Raises:
        DeployRefused: The server refused the change (``refused``).
    """
    started = asyncio.get_running_loop().time()
    try:
        await sent
    except RPCError as exc:
        raise refused(exc, state.name, build_id or None) from None
    propagated = await _propagated(client, state.name)
    return asyncio.get_running_loop().time() - started, propagated


async def rollback(client: Client, name: str, *, force: bool = False) -> RoutingChange:
    """Undo the last routing change: a ramp in progress ends (every new run to the current
    build); else the build current before this one is current again.

    Args:
        client: A client of the deployment's namespace.
        name: The deployment.
        force: Even when no worker of the build rolled back to polls now.

    Returns:
        The change: ``ramp_ended`` (the ramp of ``build_id`` ended) or ``current`` (``build_id``
            is current again), once the server has told the task queues of it.

    Raises:
        DeployRefused: No such deployment, no build current before, no worker of it polls,
            or the server refused.
    """
    state = await deployment_state(client, name)
    if state.ramping is not None:
        return await _set_ramp(client, state, "", 0, force=True)
    previous = state.previous()
    if previous is None:
        raise DeployRefused(f"deployment {name!r} has had no other current build: nothing to roll back to")
    _routable(state, previous.build_id, force=force)
    return await _set_current(client, state, previous.build_id, force=force)
