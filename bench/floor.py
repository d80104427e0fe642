"""The server's floor for a step: a loop whose every step is one empty activity and the
workflow task that takes its result, nothing else.

Ours makes one activity and one workflow task a step (the model call; the quick tool and
the checkpoint run inside the task), the naive loop two of each. What that costs with no
work in it is what the server, the SDK and the machine charge for a step, whatever the
design: ``bench/step_cost.py`` runs this loop beside the two designs, on the same server,
with the worker options ours runs with (``build_worker``), so its figures say how much of a
step is ours to cut.
"""

from __future__ import annotations

from datetime import timedelta

from temporalio import activity, workflow
from temporalio.client import Client
from temporalio.worker import UnsandboxedWorkflowRunner, Worker

from durable_agent.plugin import HEARTBEAT_THROTTLE, NONSTICKY_POLL_RATIO, STICKY_TIMEOUT

FLOOR_WORKFLOW = "EmptyStepLoop"


@activity.defn(name="bench.empty_step")
async def empty_step() -> None:
    """A step with no work: what is left is the round trip."""


@workflow.defn(name=FLOOR_WORKFLOW)
class EmptyStepLoop:
    @workflow.run
    async def run(self, steps: int) -> int:
        for _ in range(steps):
            await workflow.execute_activity(empty_step, start_to_close_timeout=timedelta(seconds=60))
        return steps


def floor_worker(client: Client, queue: str, workflow_task_slots: int) -> Worker:
    """A worker for the loop with the options ``build_worker`` gives ours."""
    return Worker(
        client,
        task_queue=queue,
        workflows=[EmptyStepLoop],
        activities=[empty_step],
        max_heartbeat_throttle_interval=HEARTBEAT_THROTTLE,
        sticky_queue_schedule_to_start_timeout=STICKY_TIMEOUT,
        nonsticky_to_sticky_poll_ratio=NONSTICKY_POLL_RATIO,
        max_concurrent_workflow_tasks=workflow_task_slots,
        workflow_runner=UnsandboxedWorkflowRunner(),
    )
