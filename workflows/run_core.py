"""The core of ``AgentRun`` below its loop: its state, activities that a cancel
interrupts, the UI's details, and the helpers its parts share.

``AgentRun`` (``workflows/agent_run.py``) is built on ``RunBase``
(``run_base.py``: starting, resuming, continuing as new), which is built on
``RunLogSteps`` (``run_log_steps.py``: the run's log and its tool
boundaries), which is built on ``RunCore``.
"""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any, TypeVar

from temporalio import workflow
from temporalio.common import RetryPolicy, SearchAttributeKey
from temporalio.exceptions import ActivityError, CancelledError, FailureError

from workflows.approvals import ApprovalBook

with workflow.unsafe.imports_passed_through():
    from durable_agent.loop import LoopState
    from durable_agent.models import (
        ErrorEvent,
        ToolUseBlock,
    )
    from durable_agent.run_io import (
        SA_RUN_STATUS,
        SA_SESSION_ID,
        AgentRunInput,
        RunPlan,
    )


T = TypeVar("T")


SESSION_ID_KEY = SearchAttributeKey.for_keyword(SA_SESSION_ID)
RUN_STATUS_KEY = SearchAttributeKey.for_keyword(SA_RUN_STATUS)

_WAIT = workflow.ActivityCancellationType.WAIT_CANCELLATION_COMPLETED
TEMPORAL_CANCEL_REASON = "cancelled by a Temporal cancel request"
AWAITING_APPROVAL = "awaiting_approval"


class RunCancelled(Exception):
    """The run was asked to stop (the ``cancel`` signal or a Temporal cancel request)."""


class RunFailed(Exception):
    """A run error: the run ends ``failed`` with this message, recorded on the run."""


def now_ms() -> int:
    return int(workflow.now().timestamp() * 1000)


def failure_message(exc: BaseException) -> str:
    """The innermost message of a Temporal failure chain: what actually went wrong."""
    while isinstance(exc, ActivityError) and exc.cause is not None:
        exc = exc.cause
    # ``str()`` of a Temporal failure prefixes its type; the message alone reads better.
    if isinstance(exc, FailureError) and exc.message:
        return exc.message
    return str(exc) or type(exc).__name__


def call_summary(call: ToolUseBlock, target: str | None) -> str:
    return f"{call.name} {target}" if target else call.name


class RunCore:
    """The run's state and the means to run its activities (no Temporal handlers here)."""

    def __init__(self) -> None:
        self._state: LoopState | None = None
        self._cancel_reason: str | None = None
        self._cancel_requested = False
        self._session_id = ""
        self._run_id = ""
        self._pre_status = "created"
        self._pre_error: str | None = None
        self._approvals = ApprovalBook()
        self._executions = 0  # times this run has continued as new before this execution
        self._input: AgentRunInput | None = None

    def _request_cancel(self, reason: str) -> None:
        if not self._cancel_requested:
            self._cancel_requested = True
            self._cancel_reason = reason

    async def _activity(
        self,
        name: str,
        arg: Any,
        result_type: type[T] | None,
        *,
        summary: str,
        timeout: float,
        retry: RetryPolicy,
    ) -> T:
        """Run an activity that a ``cancel`` signal interrupts.

        The cancel flag is checked after the activity settles, whatever way it
        settles: an activity that completes normally while its cancellation is
        pending must not swallow the cancel.
        """
        state = self._state
        handle = workflow.start_activity(
            name,
            arg,
            result_type=result_type,
            start_to_close_timeout=timedelta(seconds=timeout),
            heartbeat_timeout=timedelta(seconds=state.plan.timeouts.heartbeat_seconds) if state else None,
            retry_policy=retry,
            cancellation_type=_WAIT,
            summary=summary,
        )
        try:
            await workflow.wait_condition(lambda: handle.done() or self._cancel_requested)
        except asyncio.CancelledError:
            # A Temporal cancel request (UI, CLI) does not reach this activity by
            # itself: treat it as the cancel signal, so the activity stops too.
            self._request_cancel(TEMPORAL_CANCEL_REASON)
        if not handle.done():
            handle.cancel()
        try:
            result = await handle
        except (ActivityError, CancelledError, asyncio.CancelledError):
            if self._cancel_requested:
                raise RunCancelled() from None
            raise
        self._check_cancel()
        return result  # type: ignore[no-any-return]

    def _check_history(self, plan: RunPlan) -> None:
        """Stop cleanly before Temporal's history limits would terminate the run."""
        info = workflow.info()
        size, length = info.get_current_history_size(), info.get_current_history_length()
        if size > plan.limits.max_history_bytes or length > plan.limits.max_history_events:
            message = (
                f"the run's history holds {length} events, {size} bytes, past limits "
                f"(max_history_events={plan.limits.max_history_events}, "
                f"max_history_bytes={plan.limits.max_history_bytes}), so the run stops here"
            )
            assert self._state is not None
            self._state.emit(ErrorEvent(message=message), now_ms())
            raise RunFailed(message)

    def _plan(self) -> RunPlan:
        assert self._state is not None
        return self._state.plan

    def _check_cancel(self) -> None:
        if self._cancel_requested:
            raise RunCancelled()

    def _details(self, line: str) -> None:
        """The UI's current details: what the run is doing now, and its counters."""
        state = self._state
        prompt = (state.plan.prompt if state else "")[:200]
        head, _, rest = line.partition("\n\n")
        parts = [head if head.startswith("**") else f"**{head}**", *([rest] if rest else [])]
        if state is not None:
            view = state.status_view(self._cancel_requested)
            parts.append(
                f"status: {view.status} · turn {view.turn} · tool calls {view.tool_calls} · "
                f"exports {view.exports_delivered} (failed {view.export_failures})"
            )
            if view.last_content_digest:
                parts.append(f"last export: `{view.last_content_digest}`")
            parts.append(f"prompt: {prompt}")
        workflow.set_current_details("\n\n".join(parts))
