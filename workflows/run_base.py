"""The workings of ``AgentRun`` below its loop: starting, continuing as new,
activities that a cancel interrupts, tool boundaries, and the UI's details.

Split from ``workflows/agent_run.py`` to keep each module small; ``AgentRun``
is the only class that uses ``RunBase``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from datetime import timedelta
from typing import Any, Literal, NoReturn, TypeVar, cast

from temporalio import workflow
from temporalio.common import RetryPolicy, SearchAttributeKey
from temporalio.exceptions import ActivityError, ApplicationError, CancelledError, FailureError

from workflows.approvals import ApprovalBook

with workflow.unsafe.imports_passed_through():
    from durable_agent.canonical import canonical_bytes
    from durable_agent.checkpoint import (
        CapabilityBinding,
        CheckpointPayload,
        ExportDescriptor,
        ResumedFrom,
        RunRecord,
        binding_differences,
    )
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
        ACTIVITY_OPEN_RUN,
        ACTIVITY_READ_RESUME,
        ACTIVITY_RESOLVE,
        ACTIVITY_SAVE_CHECKPOINT,
        SA_RUN_STATUS,
        SA_SESSION_ID,
        AgentRunInput,
        CarriedState,
        ExportFailure,
        ExportInput,
        ExportRef,
        ExportSeed,
        LoadSessionInput,
        OpenRunInput,
        ResolveInput,
        ResumeFileInput,
        ResumePoint,
        RunOpened,
        RunPlan,
        SaveCheckpointInput,
        SessionRuns,
    )
    from durable_agent.run_log import STATE_LOST, STATE_MISSING, LogEntry, LogRef


T = TypeVar("T")

SESSION_ID_KEY = SearchAttributeKey.for_keyword(SA_SESSION_ID)
RUN_STATUS_KEY = SearchAttributeKey.for_keyword(SA_RUN_STATUS)

_WAIT = workflow.ActivityCancellationType.WAIT_CANCELLATION_COMPLETED
TEMPORAL_CANCEL_REASON = "cancelled by a Temporal cancel request"
AWAITING_APPROVAL = "awaiting_approval"
# Runs started before linear history loaded their session instead of opening a log; their
# histories replay through the branch this patch id guards.
PATCH_LINEAR_HISTORY = "linear-history"
# A restore sends a run's entries in batches of about this many bytes (a payload may hold 2 MB).
RESTORE_BATCH_BYTES = 1_000_000


class RunCancelled(Exception):
    """The run was asked to stop (the ``cancel`` signal or a Temporal cancel request)."""


class RunFailed(Exception):
    """A run error: the run ends ``failed`` with this message, recorded on the run."""


def _detail(exc: ActivityError) -> str | None:
    """The first detail of the failure, where an activity put one (an export's digest)."""
    cause = exc.cause
    if isinstance(cause, ApplicationError) and cause.details and isinstance(cause.details[0], str):
        return cause.details[0]
    return None


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


def missing_state(exc: ActivityError) -> tuple[bool, LogRef | None]:
    """Whether the activity did not find the run's log state, and what the store holds instead."""
    cause = exc.cause
    if not isinstance(cause, ApplicationError) or cause.type != STATE_MISSING:
        return False, None
    head = cause.details[0] if cause.details else None
    return True, LogRef.model_validate(head) if head is not None else None


def batches(entries: list[LogEntry], limit: int = RESTORE_BATCH_BYTES) -> list[list[LogEntry]]:
    """``entries`` in order, cut into runs of about ``limit`` bytes (at least one entry each)."""
    out: list[list[LogEntry]] = [[]]
    size = 0
    for entry in entries:
        n = len(canonical_bytes(entry))
        if out[-1] and size + n > limit:
            out.append([])
            size = 0
        out[-1].append(entry)
        size += n
    return out


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
        point = await self._read_resume(run_input.resume_from_file) if run_input.resume_from_file else None
        plan = await self._resolve(run_input, resume, point)
        binding = (
            resume.logical_resume.capability_binding
            if resume is not None
            else (point.capability_binding if point is not None else None)
        )
        if binding is not None and not run_input.force_resume:
            self._check_binding(binding, plan)
        logical = resume.logical_resume if resume is not None else None
        if not workflow.patched(PATCH_LINEAR_HISTORY):
            prior_runs, load_failure = await self._session_runs(plan)
            state = self._state = LoopState(plan, now_ms(), logical, tuple(r.snapshot.id for r in prior_runs))
            if load_failure:
                self._persistence_failed(state, "load", load_failure)
            return state
        state = self._state = LoopState(plan, now_ms(), logical, point=point)
        await self._open_run(state)
        return state

    async def _read_resume(self, path: str) -> ResumePoint:
        """Validate the export file on the worker; its conversation stays there until the run opens."""
        self._details(f"reading the export to resume from: `{path}`")
        try:
            point: ResumePoint = await workflow.execute_activity(
                ACTIVITY_READ_RESUME,
                ResumeFileInput(path=path, run_id=self._run_id),
                result_type=ResumePoint,
                start_to_close_timeout=timedelta(seconds=60),
                heartbeat_timeout=timedelta(seconds=20),
                retry_policy=RetryPolicy(maximum_attempts=3),
                summary=f"read export {path}",
            )
            return point
        except ActivityError as exc:
            self._refuse(failure_message(exc))

    async def _open_run(self, state: LoopState) -> None:
        """Write the run's header and first log entry; the store names the session's ended runs."""
        seed = state.take_entry()
        assert seed is not None
        try:
            opened = await self._activity(
                ACTIVITY_OPEN_RUN,
                OpenRunInput(
                    header=state.header(),
                    seed=seed,
                    # a run resumed from a file: the store gets its conversation from there
                    resumed=state.seed_export if state.stored.version < state.seed.version else None,
                ),
                RunOpened,
                summary=f"open run log in session {state.plan.session_id}",
                timeout=state.plan.timeouts.checkpoint_seconds,
                retry=RetryPolicy(maximum_attempts=5),
            )
        except ActivityError as exc:
            # the first save sends the log again, from its start
            self._persistence_failed(state, "save", f"open run: {failure_message(exc)}")
            return
        state.prior_run_ids = opened.prior_run_ids
        state.mark_stored()

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

    def _should_continue_as_new(self, state: LoopState) -> bool:
        info, plan = workflow.info(), state.plan
        # the next execution starts from a reference to the store's copy: it must hold everything
        return state.can_carry() and (
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
            update={
                "resume_from": None,
                "resume_from_file": None,
                "prompt": state.plan.prompt,
                "continued": carried,
            }
        )
        workflow.continue_as_new(next_input.model_dump(mode="json", exclude_none=True))

    def _refuse(self, message: str) -> NoReturn:
        """A usage error: the workflow fails at once, before any model call, with ``message``."""
        self._pre_status, self._pre_error = "failed", message
        workflow.upsert_search_attributes([RUN_STATUS_KEY.value_set("failed")])
        raise ApplicationError(message, type="InvalidRunInput", non_retryable=True)

    def _check_binding(self, binding: CapabilityBinding, plan: RunPlan) -> None:
        """Refuse to resume where this worker's tools or permissions are not the checkpoint's."""
        differences = binding_differences(binding, plan.capability_binding)
        if differences:
            self._refuse(
                "the checkpoint's capability binding differs from this worker's: "
                + "; ".join(differences)
                + " (resume with force_resume to go on anyway)"
            )

    async def _resolve(
        self, run_input: AgentRunInput, resume: CheckpointPayload | None, point: ResumePoint | None
    ) -> RunPlan:
        facts: dict[str, Any] = {}
        prompt = run_input.prompt
        if point is not None:
            facts = {
                "resumed_from": point.resumed_from,
                "resume_permissions": point.capability_binding.permissions,
            }
            prompt = prompt or point.prompt
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
        """Save what is new to the run's log, then wait for the sink to acknowledge the export."""
        plan, turn = state.plan, state.turn
        state.take_entry()
        await self._save(state)
        self._details(f"exporting turn {turn}")
        sent = state.head
        facts = state.export_facts(now_ms())
        try:
            descriptor: ExportDescriptor | None = await self._reading_log(
                state,
                lambda: self._activity(
                    ACTIVITY_EXPORT,
                    ExportInput(sink=plan.export_sink, log=sent, facts=facts),
                    # None: recorded before exports were built from the log
                    cast(Any, ExportDescriptor | None),
                    summary=f"export turn {turn}",
                    timeout=plan.timeouts.checkpoint_seconds,
                    retry=RetryPolicy(maximum_attempts=plan.timeouts.export_max_attempts),
                ),
            )
        except ActivityError as exc:
            reason = failure_message(exc)
            digest = _detail(exc) or ""
            state.export_failures.append(ExportFailure(turn=turn, content_digest=digest, reason=reason))
            state.emit(CheckpointExportFailedEvent(turn=turn, content_digest=digest, reason=reason), now_ms())
            return
        digest = descriptor.content_digest if descriptor is not None else ""
        if descriptor is not None:
            state.last_export = ExportSeed(sink=plan.export_sink, descriptor=descriptor, log=sent)
        state.exports.append(ExportRef(turn=turn, content_digest=digest))
        state.emit(CheckpointExportedEvent(turn=turn, content_digest=digest), now_ms())

    async def _save(self, state: LoopState) -> None:
        """Send the store the entries it lacks; what an activity staged goes by its digest."""
        entries = state.unstored()
        if not entries:
            return
        newest, staged = entries[-1].delta.staged(state.staged_ids, state.staged_messages)
        wire = (*entries[:-1], entries[-1].model_copy(update={"delta": newest}))
        try:
            await self._activity(
                ACTIVITY_SAVE_CHECKPOINT,
                SaveCheckpointInput(run_id=state.plan.run_id, entries=wire, staged=staged),
                None,
                summary=f"save checkpoint turn {state.turn}",
                timeout=state.plan.timeouts.checkpoint_seconds,
                retry=RetryPolicy(maximum_attempts=5),
            )
        except ActivityError as exc:
            missing, head = missing_state(exc)
            if not missing:
                self._persistence_failed(state, "save", failure_message(exc))
            else:
                await self._restore(state, head)
            return
        state.mark_stored()

    async def _restore(self, state: LoopState, head: LogRef | None) -> bool:
        """Bring a store that lacks part of the run's log up to date, from this execution's history.

        ``False`` when the store failed (recorded; a later step tries again);
        ``RunFailed`` when the state is gone for good: the run cannot go on.
        """
        entries = state.entries_after(head)
        seed = None
        if entries is None:  # it lacks even the state this execution started from
            seed = state.seed_export
            entries = list(state.journal)
            if seed is None:
                self._lost(
                    f"run {state.plan.run_id}: its state before log version {state.seed.version} is in "
                    "neither the session store nor an export it could be read from"
                )
        self._details(f"restoring the run's log in the store ({len(entries)} entries)")
        try:
            for index, batch in enumerate(batches(entries)):
                await self._activity(
                    ACTIVITY_SAVE_CHECKPOINT,
                    SaveCheckpointInput(
                        run_id=state.plan.run_id,
                        entries=tuple(batch),
                        header=state.header() if index == 0 else None,
                        seed=seed if index == 0 else None,
                    ),
                    None,
                    summary=f"restore run log up to version {state.head.version}",
                    timeout=state.plan.timeouts.checkpoint_seconds,
                    retry=RetryPolicy(maximum_attempts=5),
                )
        except ActivityError as exc:
            if isinstance(exc.cause, ApplicationError) and exc.cause.type == STATE_LOST:
                self._lost(failure_message(exc))
            self._persistence_failed(state, "save", f"restore: {failure_message(exc)}")
            return False
        state.mark_stored()
        return True

    def _lost(self, message: str) -> NoReturn:
        assert self._state is not None
        self._state.emit(ErrorEvent(message=message), now_ms())
        raise RunFailed(message)

    async def _reading_log(self, state: LoopState, call: Callable[[], Awaitable[T]]) -> T:
        """Run an activity that reads the run's log; restore the log once should the store lack it."""
        try:
            return await call()
        except ActivityError as exc:
            missing, head = missing_state(exc)
            if not missing or not await self._restore(state, head):
                raise
        return await call()

    def _persistence_failed(self, state: LoopState, operation: Literal["save", "load"], reason: str) -> None:
        state.persistence_failures.append(f"turn {state.turn}: {operation} failed: {reason}")
        state.emit(PersistenceFailedEvent(turn=state.turn, operation=operation, reason=reason), now_ms())

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
        """Keep the ended run in its session and drop its log from the store."""
        timeouts = state.plan.timeouts
        try:
            await self._reading_log(
                state,
                lambda: workflow.execute_activity(
                    ACTIVITY_FINISH_RUN,
                    state.finish_input(),
                    start_to_close_timeout=timedelta(seconds=timeouts.checkpoint_seconds),
                    heartbeat_timeout=timedelta(seconds=timeouts.heartbeat_seconds),
                    retry_policy=RetryPolicy(maximum_attempts=5),
                    summary=f"finish run ({state.status}): drop its log",
                ),
            )
        except (ActivityError, RunFailed, RunCancelled) as exc:
            # after ``end`` there is no event to add: the result and status carry it (a restore
            # of a lost store, which a cancel stops, is the one way a cancel gets here)
            reason = failure_message(exc) if isinstance(exc, ActivityError) else str(exc) or "cancelled"
            state.persistence_failures.append(f"finish failed: {reason}")

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
