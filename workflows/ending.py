"""How an ``AgentRun`` closes: its change set made before its end is recorded; once it is, the
updates in flight answered, and a cancelled run in Temporal's Canceled state.

Temporal closes a workflow Canceled only after a cancel request, and refuses one a workflow
aims at itself; a run that the ``cancel`` signal stopped asks for one through an activity
(``agent.request_cancel``). Histories recorded before the ``cancel-ends-canceled`` patch
closed Completed, with status ``cancelled``, and replay so.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from datetime import timedelta

from temporalio import workflow
from temporalio.exceptions import ActivityError, CancelledError

with workflow.unsafe.imports_passed_through():
    from durable_agent.core.activity_api import (
        REQUEST_CANCEL,
        WORKSPACE_CHANGE,
        WORKSPACE_COMMIT,
        RequestCancelInput,
        WorkspaceChangeInput,
        WorkspaceCommitInput,
    )
    from durable_agent.core.failures import failure_message
    from durable_agent.core.loop import LoopState
    from durable_agent.core.models import ToolUseBlock
    from durable_agent.core.plan import Timeouts

from durable_agent.workflows.calls import CallRunner, Cancellation, RunCancelled, now_ms
from durable_agent.workflows.patches import PATCH_CANCELED_STATE

# The rule a run's change from a git source needs before it is pushed: ``git_push(<branch>)``.
GIT_PUSH = "git_push"
# ``ToolStep.ask``: a person's decision on one call; the denial's reason, or None.
Asker = Callable[[LoopState, ToolUseBlock, str | None], Awaitable[str | None]]

# How long a run waits for its own cancel request to arrive before it completes instead.
CANCEL_REQUEST_WAIT_SECONDS = 60


class Ending:
    """The last steps of a run whose end is in the store."""

    def __init__(self, calls: CallRunner, cancellation: Cancellation) -> None:
        self._calls = calls
        self._cancellation = cancellation

    async def close(self, cancelled: bool, error: str | None, timeouts: Timeouts) -> None:
        """Let the updates in flight answer; then a cancelled run raises ``CancelledError``,
        which Temporal records as the Canceled state (the UI's list, ``ExecutionStatus``
        filters). Its record stays readable through the ``result`` query."""
        await self._handlers_finished()
        if cancelled and workflow.patched(PATCH_CANCELED_STATE) and await self._cancel_requested(timeouts):
            raise CancelledError(error or "cancelled")

    async def workspace_change(self, state: LoopState) -> None:
        """A run whose workspace follows it: its change set for its result (its base and final
        trees and their diff, bounded), made by a local activity before its end is recorded. A
        run that does not follow gives its trees alone (``RunWorkspace.change``)."""
        ws = state.workspace
        if not ws.follows or ws.tree is None:
            return
        try:
            change = await self._calls.run(
                WORKSPACE_CHANGE,
                WorkspaceChangeInput(
                    workspace=state.plan.workspace, sink=state.plan.export_sink, base=ws.base, final=ws.tree
                ),
                summary="the run's change set",
                timeouts=state.plan.timeouts,
                cancellable=False,
                local=True,
            )
        except ActivityError as exc:  # the result goes out with the trees alone
            workflow.logger.warning("the run's diff was not made: %s", exc)
            return
        state.record_workspace_change(change)

    async def push(self, state: LoopState, ask: Asker) -> None:
        """A completed run whose workspace came from a git source, with ``[workspaces] commit``:
        its change committed on the commit it started from and pushed to its branch, when its
        rules allow ``git_push(<branch>)`` (or a person does, for ``ask``); the result says what
        happened (``WorkspaceChange.commit``, or ``pushed``: why not)."""
        origin, ws = state.plan.workspace_origin, state.workspace
        # unchanged since the commit it began at (a rewound run's base is its turn's tree, not that)
        if origin is None or origin.branch is None or ws.tree is None or ws.tree == (origin.tree or ws.base):
            return
        branch = origin.branch
        decision = state.plan.permissions.decide(GIT_PUSH, branch)
        reason = f"permission denied: {GIT_PUSH}({branch}) is not allowed by the run's rules"
        if decision == "ask":
            call = ToolUseBlock(
                id=GIT_PUSH, name=GIT_PUSH, input={"branch": branch, "repository": origin.git}
            )
            try:
                reason = await ask(state, call, branch) or ""
            except RunCancelled:
                reason = "the run was cancelled while the push waited for a person"
            decision = "deny" if reason else "allow"
        if decision != "allow":
            state.record_push(branch, None, reason)
            return
        first = state.plan.prompt.strip().splitlines()[0][:72] if state.plan.prompt.strip() else "agent run"
        message = f"{first}\n\nsession {state.plan.session_id}, run {state.plan.run_id} (durable-agent)\n"
        try:
            pushed = await self._calls.run(
                WORKSPACE_COMMIT,
                WorkspaceCommitInput(
                    workspace=state.plan.workspace,
                    sink=state.plan.export_sink,
                    origin=origin,
                    tree=ws.tree,
                    message=message,
                    at_ms=now_ms(),
                ),
                summary=f"commit the run's change and push it to {branch}",
                timeouts=state.plan.timeouts,
                cancellable=False,
            )
        except ActivityError as exc:
            state.record_push(branch, None, failure_message(exc))
            return
        state.record_push(branch, pushed.commit, None)

    async def _handlers_finished(self) -> None:
        """A cancel request that comes meanwhile is noted, not lost."""
        while True:
            try:
                await workflow.wait_condition(workflow.all_handlers_finished)
                return
            except asyncio.CancelledError:
                self._cancellation.temporal_request()

    async def _cancel_requested(self, timeouts: Timeouts) -> bool:
        """Whether Temporal holds a cancel request for this run, asking for one when only the
        signal cancelled it. ``False`` when the request cannot be made: the run then completes,
        cancelled, as before the patch."""
        if self._cancellation.by_temporal:
            return True
        info = workflow.info()
        try:
            await self._calls.run(
                REQUEST_CANCEL,
                RequestCancelInput(
                    workflow_id=info.workflow_id, run_id=info.run_id, reason=self._cancellation.reason
                ),
                summary="end Canceled: request this run's cancel",
                timeouts=timeouts,
                cancellable=False,
            )
            await workflow.wait_condition(
                lambda: self._cancellation.by_temporal,
                timeout=timedelta(seconds=CANCEL_REQUEST_WAIT_SECONDS),
                timeout_summary="the run's cancel request",
            )
        except asyncio.CancelledError:
            self._cancellation.temporal_request()
        except (ActivityError, TimeoutError) as exc:
            workflow.logger.warning("the run ends completed, not Canceled: %s", exc)
        return self._cancellation.by_temporal
