"""A worker's own task queue, where the runs it hosts send the calls that use their workspace.

Each worker process that keeps runs' workspaces (``[workspaces] follow``) also polls
``<task queue>/host/<its host id>`` (``core/run_workspace.py`` ``host_queue``) for
``agent.tool_call`` and ``agent.hook``: a call that reached a worker whose copy is not at the
run's tree comes back ``elsewhere``, and the workflow sends it there (``workflows/hosting.py``).
``build_worker`` adds it with ``WorkspaceHosting``; ``DurableAgentPlugin`` runs it beside each
worker it configures. The queue's worker is an ordinary ``Worker`` on the same client, with only
those activities, started before the worker polls and stopped after it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import timedelta

from temporalio.plugin import SimplePlugin
from temporalio.worker import Worker

from durable_agent.activities.agent import AgentActivities
from durable_agent.activities.workspaces.copies import sweep
from durable_agent.activities.workspaces.sources import default_root
from durable_agent.core.run_workspace import HOST_QUEUE_INFIX, host_queue

__all__ = ["WorkspaceHosting", "hosting", "is_host_queue"]

_SWEEP_SECONDS = 3600  # how often the runs' unused folders are looked for

log = logging.getLogger(__name__)


def is_host_queue(task_queue: str) -> bool:
    """Whether ``task_queue`` is a worker's own (``host_queue``), not a shared one."""
    return HOST_QUEUE_INFIX in task_queue


@contextlib.asynccontextmanager
async def hosting(worker: Worker, activities: AgentActivities) -> AsyncIterator[Worker | None]:
    """While the block runs, a worker on this process's own task queue takes the calls of the
    runs it hosts.

    Args:
        worker: The worker on the shared task queue.
        activities: Its activities (``copies`` says this process's host id; None: no run's
            workspace follows it here, and nothing more polls).

    Yields:
        The host queue's worker, or None.
    """
    copies = activities.copies
    if copies is None or copies.shared or is_host_queue(worker.task_queue):
        yield None
        return
    # the shared queue's worker's shutdown and heartbeat throttle: a host that dies is noticed a
    # heartbeat timeout after its last beat there as here. And its build (worker versioning): the
    # queue is then one of that build's, so a pinned run's calls sent here run on its own build
    # only; a run moved to another build that sends one to a host of the old build waits
    # host_wait_seconds, then a worker of its build takes the call over (workflows/hosting.py).
    # as the worker runs, which a plugin (``DurableAgentPlugin``) may have configured: its
    # throttle, its build
    config = worker.config(active_config=True)
    graceful = config.get("graceful_shutdown_timeout") or timedelta(0)
    throttle = config.get("max_heartbeat_throttle_interval") or timedelta(seconds=60)  # the SDK's default
    host = Worker(
        worker.client,
        task_queue=host_queue(worker.task_queue, copies.host),
        activities=activities.host_activities(),
        graceful_shutdown_timeout=graceful,
        max_heartbeat_throttle_interval=throttle,
        deployment_config=config.get("deployment_config"),
    )
    sweeping = asyncio.create_task(_sweeping(activities))
    try:
        async with host:
            yield host
    finally:
        sweeping.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await sweeping


async def _sweeping(activities: AgentActivities) -> None:
    """While the worker runs: every hour, the runs' own folders unused for ``[workspaces]
    keep_hours`` removed from this machine (``copies.sweep``)."""
    config = activities.config.workspaces
    copies = activities.copies
    if config.keep_hours is None or copies is None:
        return
    root = default_root(config)
    while True:
        try:
            await asyncio.to_thread(sweep, copies, root, config.keep_hours)
        except OSError as exc:  # a root not made yet, a folder not ours: tried again later
            log.warning("run workspaces under %s not swept: %s", root, exc)
        await asyncio.sleep(_SWEEP_SECONDS)


class WorkspaceHosting(SimplePlugin):
    """A worker plugin: the worker's own task queue polled while it runs (``hosting``).

    Args:
        activities: The worker's activities.
    """

    def __init__(self, activities: AgentActivities) -> None:
        super().__init__("durable_agent.WorkspaceHosting")
        self.agent_activities = activities

    async def run_worker(self, worker: Worker, next: Callable[[Worker], Awaitable[None]]) -> None:
        """Run ``worker`` with its host queue's worker beside it.

        Args:
            worker: The worker about to run.
            next: What runs it.
        """
        async with hosting(worker, self.agent_activities):
            await next(worker)
