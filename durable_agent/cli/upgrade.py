"""``durable-agent upgrade --task-queue Q``: wake the runs of a task queue that wait, so that
each moves to its worker deployment's new build (docs/deploys.md).

A pinned run looks for a new build at each tool boundary and in each workflow task while it waits;
a run that waits for its next prompt has no workflow task until something comes, so this sends it
the ``upgrade`` signal. Which runs count as waiting: running ones whose ``AgentRunStatus`` says
``awaiting_prompt``, found by a visibility query (which lags the runs by a moment). A run that
waits for a person's decision on a call is counted, not woken: it moves at that call's boundary,
once decided. A run on the current build already ignores the signal (one workflow task).

A run learns of a new current build from the server, which tells each task queue of it a moment
after ``promote`` (about a second on the dev server): a run woken before would find no new build
and wait on. So the command first waits (``--wait``, 30 s at most) while the routing of the
queue's deployment is being propagated (``routing_config_update_state``).

The parser (``cli/commands.py``) imports this module only when the command runs.
"""

from __future__ import annotations

import argparse
import asyncio
import time

from pydantic import BaseModel, ConfigDict
from temporalio.api.enums.v1 import RoutingConfigUpdateState, TaskQueueType
from temporalio.api.taskqueue.v1 import TaskQueue
from temporalio.api.workflowservice.v1 import DescribeTaskQueueRequest, DescribeWorkerDeploymentRequest
from temporalio.client import Client
from temporalio.service import RPCError, RPCStatusCode

from durable_agent.cli.common import network
from durable_agent.client import connect
from durable_agent.core.run_api import AWAITING_APPROVAL, AWAITING_PROMPT, SA_RUN_STATUS, SIGNAL_UPGRADE


class UpgradeReport(BaseModel):
    """What ``upgrade`` did on one task queue.

    Attributes:
        woken: The workflow ids of the runs waiting for a prompt that were sent ``upgrade``.
        gone: Those that had ended before the signal reached them.
        deciding: The runs waiting for a person's decision: each moves at that call's boundary.
    """

    model_config = ConfigDict(frozen=True)

    woken: tuple[str, ...] = ()
    gone: tuple[str, ...] = ()
    deciding: tuple[str, ...] = ()


def waiting_query(task_queue: str, status: str) -> str:
    """The visibility query for a task queue's running runs whose status is ``status``.

    Args:
        task_queue: The task queue the runs were started on.
        status: An ``AgentRunStatus`` value (``awaiting_prompt``, ``awaiting_approval``).

    Returns:
        The query, its values quoted.
    """
    queue = task_queue.replace("\\", "\\\\").replace('"', '\\"')
    return f'TaskQueue = "{queue}" AND ExecutionStatus = "Running" AND {SA_RUN_STATUS} = "{status}"'


async def queue_deployments(client: Client, task_queue: str) -> list[str]:
    """The worker deployments that route ``task_queue``'s workflow tasks (its current build's, and
    its ramping build's when that is another deployment's).

    Args:
        client: A client of the namespace.
        task_queue: The task queue.

    Returns:
        Their names; none for a queue of unversioned workers.
    """
    described = await client.workflow_service.describe_task_queue(
        DescribeTaskQueueRequest(
            namespace=client.namespace,
            task_queue=TaskQueue(name=task_queue),
            task_queue_type=TaskQueueType.TASK_QUEUE_TYPE_WORKFLOW,
        )
    )
    info = described.versioning_info
    names = [info.current_deployment_version.deployment_name, info.ramping_deployment_version.deployment_name]
    return sorted({name for name in names if name})


async def propagating(client: Client, deployments: list[str]) -> list[str]:
    """Those of ``deployments`` whose routing (current and ramping builds) the server is still
    telling their task queues of.

    Args:
        client: A client of the namespace.
        deployments: Deployment names.

    Returns:
        Their names.
    """
    busy = []
    for name in deployments:
        described = await client.workflow_service.describe_worker_deployment(
            DescribeWorkerDeploymentRequest(namespace=client.namespace, deployment_name=name)
        )
        state = described.worker_deployment_info.routing_config_update_state
        if state == RoutingConfigUpdateState.ROUTING_CONFIG_UPDATE_STATE_IN_PROGRESS:
            busy.append(name)
    return busy


async def settled(client: Client, task_queue: str, wait: float) -> list[str]:
    """Wait, ``wait`` seconds at most, until the routing of ``task_queue``'s deployment has
    reached its task queues.

    Args:
        client: A client of the namespace.
        task_queue: The task queue whose deployments to wait for.
        wait: Seconds to wait at most.

    Returns:
        The deployments still propagating when the time ran out (empty: all settled).
    """
    deadline = time.monotonic() + wait
    deployments = await queue_deployments(client, task_queue)
    while True:
        busy = await propagating(client, deployments)
        if not busy or time.monotonic() >= deadline:
            return busy
        await asyncio.sleep(0.2)


async def upgrade_waiting(
    client: Client, task_queue: str, *, dry_run: bool = False, wait: float = 30.0
) -> UpgradeReport:
    """Send ``upgrade`` to every run of ``task_queue`` that waits for its next prompt, once the
    server has told the task queues of their deployments' current builds.

    Args:
        client: A client of the runs' namespace.
        task_queue: The task queue the runs were started on.
        dry_run: Count the runs, send nothing.
        wait: Seconds to wait at most for a deployment's routing to propagate.

    Returns:
        The runs woken, those that ended meanwhile, and those waiting for a decision.
    """
    if not dry_run and wait > 0:
        await settled(client, task_queue, wait)
    prompt = [w.id async for w in client.list_workflows(waiting_query(task_queue, AWAITING_PROMPT))]
    deciding = [w.id async for w in client.list_workflows(waiting_query(task_queue, AWAITING_APPROVAL))]
    woken: list[str] = []
    gone: list[str] = []
    for workflow_id in prompt:
        if dry_run:
            woken.append(workflow_id)
            continue
        try:
            # the run's latest execution: a run that moved already is woken for nothing
            await client.get_workflow_handle(workflow_id).signal(SIGNAL_UPGRADE)
            woken.append(workflow_id)
        except RPCError as exc:
            if exc.status != RPCStatusCode.NOT_FOUND:
                raise
            gone.append(workflow_id)  # it ended between the query and the signal
    return UpgradeReport(woken=tuple(woken), gone=tuple(gone), deciding=tuple(deciding))


async def upgrade(args: argparse.Namespace) -> int:
    """Wake the waiting runs of ``--task-queue`` and say what was done."""
    client = await connect()
    busy = [] if args.dry_run else await settled(client, args.task_queue, args.wait)
    for name in busy:
        print(f"deployment {name}: its new routing is still reaching its task queues; woken anyway")
    report = await upgrade_waiting(client, args.task_queue, dry_run=args.dry_run, wait=0)
    verb = "would wake" if args.dry_run else "woke"
    for workflow_id in report.woken:
        print(f"{verb} {workflow_id} (waiting for a prompt)")
    for workflow_id in report.gone:
        print(f"{workflow_id} ended before the signal reached it")
    for workflow_id in report.deciding:
        print(f"{workflow_id} waits for a decision on a call: it moves at that call's boundary")
    print(
        f"{verb} {len(report.woken)} run(s) waiting for a prompt on {args.task_queue}; "
        f"{len(report.deciding)} waiting for a decision move after it; running ones move at their "
        "next tool boundary"
    )
    return 0


cmd_upgrade = network(upgrade)
