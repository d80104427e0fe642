"""The workings of ``AgentRun`` below its loop: starting, continuing as new,
activities that a cancel interrupts, tool boundaries, and the UI's details.

Split from ``workflows/agent_run.py`` to keep each module small; ``AgentRun``
is the only class that uses ``RunBase``.
"""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any, NoReturn, TypeVar

from temporalio import workflow
from temporalio.common import RetryPolicy, SearchAttributeKey
from temporalio.exceptions import ActivityError, ApplicationError, CancelledError, FailureError

from workflows.approvals import ApprovalBook

with workflow.unsafe.imports_passed_through():
    from durable_agent.checkpoint import CheckpointPayload, ResumedFrom, RunRecord, binding_differences
    from durable_agent.loop import LoopState
    from durable_agent.models import (
        CheckpointExportedEvent,
        CheckpointExportFailedEvent,
        ErrorEvent,
        PersistenceFailedEvent,
        ToolUseBlock,
    )
    from durable_agent.run_io import (
        ACTIVITY_EXPORT,
        ACTIVITY_FINISH_RUN,
        ACTIVITY_LOAD_SESSION,
        ACTIVITY_RESOLVE,
        ACTIVITY_SAVE_CHECKPOINT,
        SA_RUN_STATUS,
        SA_SESSION_ID,
        AgentRunInput,
        CarriedState,
        ExportFailure,
        ExportInput,
        ExportRef,
        FinishRunInput,
        LoadSessionInput,
        ResolveInput,
        RunPlan,
        SaveCheckpointInput,
        SessionRuns,
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


class RunBase:
    """State and steps that ``AgentRun`` is built on (no Temporal handlers here)."""

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

    async def _start(self, run_input: AgentRunInput, info: workflow.Info) -> LoopState:
        """A new run: resolve it against the worker's config and set up its state."""
        self._session_id = run_input.session_id or info.workflow_id
        self._run_id = info.first_execution_run_id
        workflow.upsert_search_attributes(
            [SESSION_ID_KEY.value_set(self._session_id), RUN_STATUS_KEY.value_set("executing")]
        )
        self._details("resolving the run against the worker config")
        resume = run_input.resume_payload()
        plan = await self._resolve(run_input, resume)
        if resume is not None and not run_input.force_resume:
            self._check_binding(resume, plan)
        prior_runs, load_failure = await self._session_runs(plan)
        logical = resume.logical_resume if resume is not None else None
        state = self._state = LoopState(plan, now_ms(), prior_runs, logical)
        if load_failure:
            state.persistence_failures.append(f"load session failed: {load_failure}")
            state.emit(PersistenceFailedEvent(turn=0, operation="load", reason=load_failure), now_ms())
        return state

    def _continued(self, carried: CarriedState) -> LoopState:
        """The same run, in the execution it continued as new into."""
        self._session_id, self._run_id = carried.plan.session_id, carried.plan.run_id
        self._executions = carried.executions
        workflow.upsert_search_attributes(
            [SESSION_ID_KEY.value_set(self._session_id), RUN_STATUS_KEY.value_set("executing")]
        )
        state = self._state = LoopState.restore(carried)
        self._details(f"continued as new (execution {carried.executions + 1}) at turn {carried.turn}")
        return state

    def _should_continue_as_new(self, plan: RunPlan) -> bool:
        info = workflow.info()
        return (
            info.is_continue_as_new_suggested()
            or info.get_current_history_length() > plan.limits.continue_as_new_events
            or info.get_current_history_size() > plan.limits.continue_as_new_bytes
        )

    async def _continue_as_new(self, state: LoopState) -> NoReturn:
        """Go on in a fresh history, seeded from the checkpoint just exported."""
        await workflow.wait_condition(workflow.all_handlers_finished)
        self._check_cancel()  # a cancel that came meanwhile ends the run here instead
        carried = state.carry(self._executions + 1)
        assert self._input is not None
        next_input = self._input.model_copy(
            update={"resume_from": None, "prompt": state.plan.prompt, "continued": carried}
        )
        workflow.continue_as_new(next_input.model_dump(mode="json", exclude_none=True))

    def _refuse(self, message: str) -> NoReturn:
        """A usage error: the workflow fails at once, before any model call, with ``message``."""
        self._pre_status, self._pre_error = "failed", message
        workflow.upsert_search_attributes([RUN_STATUS_KEY.value_set("failed")])
        raise ApplicationError(message, type="InvalidRunInput", non_retryable=True)

    def _check_binding(self, resume: CheckpointPayload, plan: RunPlan) -> None:
        """Refuse to resume where this worker's tools or permissions are not the checkpoint's."""
        differences = binding_differences(resume.logical_resume.capability_binding, plan.capability_binding)
        if differences:
            self._refuse(
                "the checkpoint's capability binding differs from this worker's: "
                + "; ".join(differences)
                + " (resume with force_resume to go on anyway)"
            )

    async def _resolve(self, run_input: AgentRunInput, resume: CheckpointPayload | None) -> RunPlan:
        facts: dict[str, Any] = {}
        prompt = run_input.prompt
        if resume is not None:
            logical, source = resume.logical_resume, resume.source_run().snapshot
            facts = {
                "resumed_from": ResumedFrom(
                    session_id=logical.session_id,
                    run_id=logical.run_id,
                    turn=logical.turn,
                    content_digest=run_input.resume_from.descriptor.content_digest,  # type: ignore[union-attr]
                ),
                "resume_permissions": logical.capability_binding.permissions,
            }
            prompt = prompt or source.prompt
        # the export is in the history once already, as the run's input
        bare = AgentRunInput.model_validate(
            {**run_input.model_dump(exclude={"resume_from"}, exclude_none=True), "prompt": prompt}
        )
        try:
            plan: RunPlan = await workflow.execute_activity(
                ACTIVITY_RESOLVE,
                ResolveInput(run=bare, session_id=self._session_id, run_id=self._run_id, **facts),
                result_type=RunPlan,
                # reads config and stats a folder: a short timeout retries a crashed worker's attempt fast
                start_to_close_timeout=timedelta(seconds=10),
                retry_policy=RetryPolicy(maximum_attempts=3),
                summary="resolve run against worker config",
            )
            return plan
        except ActivityError as exc:
            self._refuse(failure_message(exc))

    async def _boundary(self, state: LoopState) -> None:
        """Save the logical checkpoint, then wait for the sink to acknowledge the export."""
        plan, turn = state.plan, state.turn
        now = now_ms()
        export = state.checkpoint_export(now)
        digest = export.descriptor.content_digest
        if export.descriptor.size_bytes > plan.limits.max_checkpoint_bytes:
            message = (
                f"the checkpoint at turn {turn} is {export.descriptor.size_bytes} bytes, over "
                f"limits.max_checkpoint_bytes={plan.limits.max_checkpoint_bytes}: it cannot pass "
                "through Temporal as one payload, so the run stops here"
            )
            state.emit(ErrorEvent(message=message), now_ms())
            raise RunFailed(message)
        try:
            await self._activity(
                ACTIVITY_SAVE_CHECKPOINT,
                SaveCheckpointInput(checkpoint=state.loop_checkpoint(now)),
                None,
                summary=f"save checkpoint turn {turn}",
                timeout=plan.timeouts.checkpoint_seconds,
                retry=RetryPolicy(maximum_attempts=5),
            )
        except ActivityError as exc:
            reason = failure_message(exc)
            state.persistence_failures.append(f"turn {turn}: save failed: {reason}")
            state.emit(PersistenceFailedEvent(turn=turn, operation="save", reason=reason), now_ms())
        self._details(f"exporting turn {turn} `{digest[:19]}…`")
        try:
            await self._activity(
                ACTIVITY_EXPORT,
                ExportInput(sink=plan.export_sink, export=export),
                None,
                summary=f"export turn {turn} {digest[:19]}…",
                timeout=plan.timeouts.checkpoint_seconds,
                retry=RetryPolicy(maximum_attempts=plan.timeouts.export_max_attempts),
            )
        except ActivityError as exc:
            reason = failure_message(exc)
            state.export_failures.append(ExportFailure(turn=turn, content_digest=digest, reason=reason))
            state.emit(CheckpointExportFailedEvent(turn=turn, content_digest=digest, reason=reason), now_ms())
            return
        state.exports.append(ExportRef(turn=turn, content_digest=digest))
        state.emit(CheckpointExportedEvent(turn=turn, content_digest=digest), now_ms())

    async def _session_runs(self, plan: RunPlan) -> tuple[tuple[RunRecord, ...], str | None]:
        """The session's ended runs; a store that cannot be read costs the snapshot, not the run."""
        try:
            runs: SessionRuns = await workflow.execute_activity(
                ACTIVITY_LOAD_SESSION,
                LoadSessionInput(session_id=plan.session_id, run_id=plan.run_id),
                result_type=SessionRuns,
                start_to_close_timeout=timedelta(seconds=plan.timeouts.checkpoint_seconds),
                heartbeat_timeout=timedelta(seconds=plan.timeouts.heartbeat_seconds),
                retry_policy=RetryPolicy(maximum_attempts=3),
                summary=f"load session {plan.session_id}",
            )
            return runs.records, None
        except ActivityError as exc:
            return (), failure_message(exc)

    async def _finish_run(self, state: LoopState) -> None:
        """Keep the ended run in its session and drop its checkpoint from the store."""
        try:
            await workflow.execute_activity(
                ACTIVITY_FINISH_RUN,
                FinishRunInput(record=state.run_record()),
                start_to_close_timeout=timedelta(seconds=state.plan.timeouts.checkpoint_seconds),
                heartbeat_timeout=timedelta(seconds=state.plan.timeouts.heartbeat_seconds),
                retry_policy=RetryPolicy(maximum_attempts=5),
                summary=f"finish run ({state.status}): drop checkpoint",
            )
        except ActivityError as exc:
            # after ``end`` there is no event to add: the result and status carry it
            state.persistence_failures.append(f"finish failed: {failure_message(exc)}")

    # --- helpers --------------------------------------------------------------

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
