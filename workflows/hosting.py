"""A call whose worker does not hold the run's workspace, sent where it is (docs/workspaces.md).

A tool call or a hook of a run whose workspace follows it comes back ``elsewhere`` from a worker
whose copy is not at the run's tree while another worker is the run's host. It goes to the host's
own task queue, once; when the host does not take it within ``host_wait_seconds`` or does not
finish it (gone, or stopped: its last polls still take tasks it never runs, which only the
heartbeat timeout notices), to any worker with ``take_over``, which restores its copy and is the
run's host from then on. A failure the call itself declared final stays final.
"""

from __future__ import annotations

from typing import TypeVar

from temporalio import workflow
from temporalio.exceptions import ActivityError, ApplicationError
from temporalio.exceptions import TimeoutError as ActivityTimeout

with workflow.unsafe.imports_passed_through():
    from durable_agent.core.activity_api import ActivityDecl, ToolCallInput
    from durable_agent.core.hooks import HookInput
    from durable_agent.core.plan import RunPlan, Timeouts
    from durable_agent.core.run_workspace import host_queue

from durable_agent.workflows.calls import CallRunner

# the inputs that name the run's host
R = TypeVar("R", ToolCallInput, HookInput)
OutT = TypeVar("OutT")


def host_unavailable(exc: ActivityError) -> bool:
    """Whether a call sent to a run's host failed for the host, not for the call: a timeout, or
    a failure Temporal would have tried again."""
    cause = exc.cause
    if isinstance(cause, ActivityTimeout):
        return True
    return isinstance(cause, ApplicationError) and not cause.non_retryable


async def on_host(
    calls: CallRunner,
    decl: ActivityDecl[R, OutT],
    inp: R,
    *,
    plan: RunPlan,
    summary: str,
    timeouts: Timeouts | None = None,
) -> OutT:
    """Run ``decl`` with ``inp`` on the run's host, else on any worker that takes the run over.

    Args:
        calls: The run's ``CallRunner``.
        decl: The activity (``agent.tool_call``, ``agent.hook``).
        inp: Its input, naming the host.
        plan: The run's plan (its timeouts, ``host_wait_seconds``).
        summary: The activity's summary in the UI.
        timeouts: The activity's timeouts, where not the plan's (a hook's own time limit).

    Returns:
        The activity's result.

    Raises:
        ActivityError: The call failed where it ran, not for want of the host.
    """
    assert inp.host is not None
    timeouts = timeouts or plan.timeouts
    try:
        return await calls.run(
            decl,
            inp,
            summary=summary,
            timeouts=timeouts,
            task_queue=host_queue(workflow.info().task_queue, inp.host),
            schedule_to_start_seconds=plan.host_wait_seconds,
            max_attempts=1,  # its retries are the other workers' to make
        )
    except ActivityError as exc:
        if not host_unavailable(exc):
            raise
    return await calls.run(
        decl, inp.model_copy(update={"take_over": True}), summary=summary, timeouts=timeouts
    )
