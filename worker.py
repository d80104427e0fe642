"""``python worker.py`` (or ``python -m durable_agent.worker``): run an agent worker.

Reads ``TEMPORAL_ADDRESS`` / ``TEMPORAL_NAMESPACE`` (and Temporal's config
profiles) like Temporal's own tools, the task queue from ``AGENT_TASK_QUEUE``
(default ``agent``) and the agent config from the TOML file named by
``AGENT_CONFIG`` (a built-in default when unset). With a deployment name
(``[worker] deployment``, or ``AGENT_DEPLOYMENT``) it polls as one build of that
Worker Deployment (``[worker] build_id``, ``AGENT_BUILD_ID``; default: the
package's version and source digest) and the runs it starts stay on that build
(``durable_agent/deployments.py``). A worker whose ``[sandbox]`` cannot start here
(no bubblewrap, no namespaces) refuses to start (exit 2) and says what to install.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys
from datetime import timedelta

import asyncpg
from temporalio.client import Client
from temporalio.service import RPCError
from temporalio.worker import UnsandboxedWorkflowRunner, Worker

from durable_agent.activities import AgentActivities
from durable_agent.activities.tools.sandbox import sandbox_problem
from durable_agent.activities.workspaces.hosting import WorkspaceHosting
from durable_agent.client import connect, ensure_search_attributes, exit_process, task_queue
from durable_agent.config import AgentConfig, ConfigError, load_config
from durable_agent.core.errors import DurableAgentError
from durable_agent.deployments import deployment_config, worker_deployment
from durable_agent.plugin import HEARTBEAT_THROTTLE, NONSTICKY_POLL_RATIO, STICKY_TIMEOUT, slot_options
from durable_agent.telemetry import approvals_waiting_reporter, metrics_runtime, shutdown_tracing
from durable_agent.workflows import AgentRun

log = logging.getLogger("durable_agent.worker")


def build_worker(
    client: Client,
    activities: AgentActivities,
    queue: str | None = None,
    *,
    graceful_shutdown: timedelta = timedelta(0),
    workflow_task_slots: int | None = None,
) -> Worker:
    """A worker for ``AgentRun`` and its activities on ``queue``.

    With a deployment in the config (``[worker] deployment``) or ``AGENT_DEPLOYMENT``, it polls
    as that deployment's build (``deployments.deployment_config``), runs pinned to it; without,
    unversioned. It does not open the store's or the sinks' connections: ``await activities.connect()``
    before running it to fail at the start rather than at a run's first step.

    Args:
        client: A client from ``connect`` (the agent's data converter).
        activities: The worker's ``AgentActivities``.
        queue: The task queue; default ``AGENT_TASK_QUEUE``, else ``agent``.
        graceful_shutdown: How long a stopping worker lets the activities in flight finish
            before it cancels them (Temporal then retries them elsewhere); default: none.
        workflow_task_slots: Workflow tasks it works on at once; default: the config's
            ``[worker] workflow_task_slots`` (4).

    Returns:
        A ``Worker`` for ``AgentRun`` and its activities, with the heartbeat throttle
            (1 s), sticky-queue timeout (2 s), polls shared with the shared queue and workflow
            task slots a quick takeover relies on, running workflow code outside Temporal's
            sandbox, versioned as the config says.

    Raises:
        ConfigError: ``AGENT_DEPLOYMENT`` or ``AGENT_BUILD_ID`` holds a name Temporal would refuse.
    """
    return Worker(
        client,
        task_queue=queue or task_queue(),
        workflows=[AgentRun],
        activities=activities.all(),
        graceful_shutdown_timeout=graceful_shutdown,
        # at most one heartbeat a second; a run whose worker died moves on after 2 s (plugin.py)
        max_heartbeat_throttle_interval=HEARTBEAT_THROTTLE,
        sticky_queue_schedule_to_start_timeout=STICKY_TIMEOUT,
        # the shared queue's share of the polls: runs taken over from a worker that died (plugin.py)
        nonsticky_to_sticky_poll_ratio=NONSTICKY_POLL_RATIO,
        **slot_options(activities.config.worker, workflow_task_slots),
        # The sandbox runs code of its own for every payload of every workflow task (temporalio
        # 1.35), which doubles a task's CPU and a replay's time: a worker that takes over runs
        # replays them within the 3 s task timeout. Determinism is kept by the import rules of
        # tests/test_layers.py (no clock, randomness or I/O in workflow or core code) and the
        # suite replays every recorded history under the sandbox.
        workflow_runner=UnsandboxedWorkflowRunner(),
        # and the worker's own task queue, for the runs whose workspace it holds (docs/workspaces.md)
        plugins=[WorkspaceHosting(activities)],
        # None (no deployment named): unversioned, as a worker was before versioning
        deployment_config=deployment_config(activities.config),
    )


def worker_for_config(client: Client, config: AgentConfig, queue: str | None = None) -> Worker:
    return build_worker(client, AgentActivities(config), queue)


class StorageUnusable(DurableAgentError):
    """The store or a sink cannot be used: refused for good, or not reachable in time."""


async def connect_storage(activities: AgentActivities, wait_seconds: float = 60.0) -> None:
    """Open the store's and sinks' connections (PostgreSQL's) before polling. Refused
    credentials, permissions or schema fail at once; a database not up yet (a stack that
    starts together) is waited for, ``wait_seconds`` at most."""
    from durable_agent.activities.store.pg_schema import SchemaTooNew
    from durable_agent.activities.store.postgres import PostgresConnectError

    deadline = asyncio.get_running_loop().time() + wait_seconds
    while True:
        try:
            await activities.connect()
            return
        except (PostgresConnectError, SchemaTooNew) as exc:
            raise StorageUnusable(str(exc)) from exc
        except (OSError, TimeoutError, asyncpg.CannotConnectNowError, asyncpg.TooManyConnectionsError) as exc:
            if asyncio.get_running_loop().time() > deadline:
                raise StorageUnusable(f"the database is not reachable: {exc}") from exc
            log.warning("the database is not reachable yet (%s); trying again", exc)
            await asyncio.sleep(2)
        except asyncpg.PostgresError as exc:
            # anything else the server refuses at the start is not mended by waiting
            raise StorageUnusable(f"PostgreSQL refused the start: {type(exc).__name__}: {exc}") from exc


async def main() -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        config = load_config()
        deployment = worker_deployment(config)
        activities = AgentActivities(config)
    except ConfigError as exc:
        print(f"worker: {exc}", file=sys.stderr)
        return 2
    problem = await asyncio.to_thread(sandbox_problem, config.sandbox)
    if problem:
        print(
            f"worker: the bash sandbox cannot start: {problem} (install bubblewrap, or set [sandbox]"
            ' kind = "none" in the config to run bash unsandboxed)',
            file=sys.stderr,
        )
        return 2
    try:
        await connect_storage(activities)
    except StorageUnusable as exc:
        print(f"worker: {exc}", file=sys.stderr)
        await activities.aclose()
        return 2
    try:
        # the Prometheus endpoint ([metrics] bind) is the runtime's, so the client is made on it
        runtime = {"runtime": metrics_runtime(config.metrics.bind)} if config.metrics.bind else {}
        client = await connect(config, **runtime)
        await ensure_search_attributes(client)
    except ConfigError as exc:
        print(f"worker: {exc}", file=sys.stderr)
        await activities.aclose()
        return 2
    except (RuntimeError, RPCError) as exc:
        # the SDK's "Failed client connect: …" (no server there, TLS refused) or a refused call
        print(f"worker: cannot use the Temporal service: {exc}", file=sys.stderr)
        await activities.aclose()
        return 2
    # A deploy's SIGTERM lets a tool or model call in flight finish (compose allows 30 s).
    worker = build_worker(client, activities, graceful_shutdown=timedelta(seconds=20))
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        async with worker, approvals_waiting_reporter(client, task_queue=worker.task_queue):
            log.info("worker polling task queue %r in namespace %r", worker.task_queue, client.namespace)
            if deployment is not None:
                log.info("as build %r of worker deployment %r", deployment.build_id, deployment.name)
            if config.metrics.bind:
                log.info("Prometheus metrics at http://%s/metrics", config.metrics.bind)
            await stop.wait()
            log.info("shutting down: finishing the activities in flight")
    finally:
        await activities.aclose()
        shutdown_tracing()
    return 0


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line: no options of its own (the environment configures the worker), only ``--help``."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    return parser.parse_args(argv)


if __name__ == "__main__":
    parse_args()
    exit_process(asyncio.run(main()))
