"""``AgentRun``: the agent loop as a deterministic Temporal workflow.

The workflow only orchestrates. The step logic lives in ``durable_agent.loop``
and every side effect is an activity, named by the constants in
``durable_agent.run_io``. At each tool boundary it saves the logical
checkpoint, then waits for the export sink to acknowledge the export, and only
then asks the model again.
"""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any, NoReturn, TypeVar

from temporalio import workflow
from temporalio.common import RetryPolicy, SearchAttributeKey
from temporalio.exceptions import ActivityError, ApplicationError, CancelledError, FailureError

from workflows.approvals import ApprovalBook, summarize_arguments

with workflow.unsafe.imports_passed_through():
    from pydantic import ValidationError

    from durable_agent.checkpoint import CheckpointPayload, ResumedFrom, RunRecord, binding_differences
    from durable_agent.errors import validation_message
    from durable_agent.loop import LoopState
    from durable_agent.models import (
        CheckpointExportedEvent,
        CheckpointExportFailedEvent,
        ConfirmationReceivedEvent,
        ConfirmationRequiredEvent,
        ErrorEvent,
        EventRecord,
        ModelResponse,
        PermissionDeniedEvent,
        PersistenceFailedEvent,
        ToolStartEvent,
        ToolUseBlock,
        TurnEndEvent,
    )
    from durable_agent.run_io import (
        ACTIVITY_EXPORT,
        ACTIVITY_FINISH_RUN,
        ACTIVITY_LOAD_SESSION,
        ACTIVITY_MODEL,
        ACTIVITY_RESOLVE,
        ACTIVITY_SAVE_CHECKPOINT,
        ACTIVITY_TOOL,
        QUERY_EVENTS,
        QUERY_STATUS,
        SA_RUN_STATUS,
        SA_SESSION_ID,
        SIGNAL_CANCEL,
        UPDATE_APPROVE,
        AgentRunInput,
        AgentRunResult,
        ApprovalAnswer,
        ApprovalDecision,
        CarriedState,
        ExportFailure,
        ExportInput,
        ExportRef,
        FinalStatus,
        FinishRunInput,
        LoadSessionInput,
        ModelCallInput,
        PendingApproval,
        ResolveInput,
        RunPlan,
        RunStatusView,
        SaveCheckpointInput,
        SessionRuns,
        ToolCallInput,
        ToolOutput,
    )
    from durable_agent.tool_specs import ToolCallError, find_offer, permission_target

T = TypeVar("T")

SESSION_ID_KEY = SearchAttributeKey.for_keyword(SA_SESSION_ID)
RUN_STATUS_KEY = SearchAttributeKey.for_keyword(SA_RUN_STATUS)

_WAIT = workflow.ActivityCancellationType.WAIT_CANCELLATION_COMPLETED
TEMPORAL_CANCEL_REASON = "cancelled by a Temporal cancel request"
AWAITING_APPROVAL = "awaiting_approval"


class _Cancelled(Exception):
    pass


class _RunFailed(Exception):
    pass


def _now_ms() -> int:
    return int(workflow.now().timestamp() * 1000)


def _cause(exc: BaseException) -> str:
    """The innermost message of a Temporal failure chain: what actually went wrong."""
    while isinstance(exc, ActivityError) and exc.cause is not None:
        exc = exc.cause
    # ``str()`` of a Temporal failure prefixes its type; the message alone reads better.
    if isinstance(exc, FailureError) and exc.message:
        return exc.message
    return str(exc) or type(exc).__name__


def _call_summary(call: ToolUseBlock, target: str | None) -> str:
    return f"{call.name} {target}" if target else call.name


@workflow.defn(name="AgentRun")
class AgentRun:
    """Runs one prompt to its end; see the module docstring."""

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

    # --- handlers -----------------------------------------------------------

    @workflow.signal(name=SIGNAL_CANCEL)
    def cancel(self, reason: str | None = None) -> None:
        """Ask the run to stop; the tool or model call in flight is cancelled."""
        if not self._cancel_requested:
            self._cancel_requested = True
            self._cancel_reason = reason or "cancelled by signal"

    @workflow.update(name=UPDATE_APPROVE)
    def approve(self, decision: ApprovalDecision) -> ApprovalAnswer:
        """A person's decision on a call that waits for approval."""
        request = self._approvals.decide(decision)
        return ApprovalAnswer(call_id=decision.call_id, tool=request.tool, approved=decision.approved)

    @approve.validator
    def _validate_approve(self, decision: ApprovalDecision) -> None:
        # rejected here, an unknown or repeated decision never reaches the history
        self._approvals.check(decision)

    @workflow.query(name=QUERY_STATUS)
    def status(self) -> RunStatusView:
        if self._state is None:
            return RunStatusView(
                session_id=self._session_id,
                run_id=self._run_id,
                status=self._pre_status,
                cancel_requested=self._cancel_requested,
                error=self._pre_error,
            )
        return self._state.status_view(self._cancel_requested, self._approvals.view())

    @workflow.query(name=QUERY_EVENTS)
    def events(self, after_sequence: int = 0) -> list[EventRecord]:
        """The run's events with a sequence above ``after_sequence``, for followers."""
        if self._state is None:
            return []
        return self._state.events[after_sequence:]

    # --- the run ------------------------------------------------------------

    @workflow.run
    async def run(self, raw: dict[str, Any]) -> AgentRunResult:
        info = workflow.info()
        try:
            run_input = AgentRunInput.model_validate(raw)
        except ValidationError as exc:
            self._refuse(f"invalid AgentRun input: {validation_message(exc)}")
        self._input = run_input
        if run_input.continued is not None:
            state = self._continued(run_input.continued)
        else:
            state = await self._start(run_input, info)
        final: FinalStatus = "completed"
        error: str | None = None
        try:
            await self._loop(state)
        except _Cancelled:
            final, error = "cancelled", self._cancel_reason
        except asyncio.CancelledError:
            # a Temporal cancel request (UI, CLI): honoured like the signal
            self._cancel_requested = True
            final, error = "cancelled", TEMPORAL_CANCEL_REASON
        except _RunFailed as exc:
            final, error = "failed", str(exc)
        state.finish(final, _now_ms(), error)
        await self._finish_run(state)
        workflow.upsert_search_attributes([RUN_STATUS_KEY.value_set(final)])
        self._details(f"**{final}**" + (f": {error}" if error else ""))
        await workflow.wait_condition(workflow.all_handlers_finished)
        return state.result()

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
        state = self._state = LoopState(plan, _now_ms(), prior_runs, logical)
        if load_failure:
            state.persistence_failures.append(f"load session failed: {load_failure}")
            state.emit(PersistenceFailedEvent(turn=0, operation="load", reason=load_failure), _now_ms())
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
            self._refuse(_cause(exc))

    async def _loop(self, state: LoopState) -> None:
        plan = state.plan
        # a run resumed between two calls of one model step first makes the calls still due
        if pending := state.pending_calls():
            await self._run_calls(state, pending)
        while True:
            self._check_cancel()
            self._check_history(plan)
            response = await self._model_step(state)
            calls = state.add_model_response(response, _now_ms())
            if not calls:
                return
            if state.tool_rounds > plan.max_tool_rounds:
                raise _RunFailed(
                    f"the model asked for more than max_tool_rounds={plan.max_tool_rounds} tool rounds"
                )
            await self._run_calls(state, calls)

    async def _run_calls(self, state: LoopState, calls: list[ToolUseBlock]) -> None:
        """One model step's tool calls, each followed by its tool boundary."""
        for call in calls:
            self._check_cancel()
            state.emit(ToolStartEvent.of(call.id, call.name, call.input), _now_ms())
            output = await self._tool_step(state, call)
            state.add_tool_result(call, output.content, output.is_error, _now_ms())
            await self._boundary(state)
            if self._should_continue_as_new(state.plan):
                await self._continue_as_new(state)
        state.emit(TurnEndEvent(turn=state.turn, usage=state.usage), _now_ms())

    async def _model_step(self, state: LoopState) -> ModelResponse:
        plan = state.plan
        self._details(f"asking {plan.model}")
        try:
            return await self._activity(
                ACTIVITY_MODEL,
                ModelCallInput(
                    run_id=plan.run_id,
                    model=plan.model,
                    system_prompt=plan.system_prompt,
                    messages=tuple(state.messages),
                    tools=tuple(plan.definitions()),
                ),
                ModelResponse,
                summary=f"model {plan.model} (step {state.tool_rounds + 1})",
                timeout=plan.timeouts.model_seconds,
                retry=RetryPolicy(
                    initial_interval=timedelta(seconds=2),
                    maximum_interval=timedelta(seconds=60),
                    maximum_attempts=8,
                ),
            )
        except ActivityError as exc:
            message = f"model call failed: {_cause(exc)}"
            state.emit(ErrorEvent(message=message), _now_ms())
            raise _RunFailed(message) from None

    async def _tool_step(self, state: LoopState, call: ToolUseBlock) -> ToolOutput:
        """Run one call, or explain to the model why it did not run."""
        plan = state.plan
        try:
            offer = find_offer(plan.tools, call.name)
            target = permission_target(offer, call.input, plan.workspace)
        except ToolCallError as exc:
            return ToolOutput(content=str(exc), is_error=True)
        decision = plan.permissions.decide(call.name, target)
        reason: str | None = None
        if decision == "deny":
            reason = (
                f"permission denied: {_call_summary(call, target)} is not allowed by the run's permissions"
            )
        elif decision == "ask":
            reason = await self._ask(state, call, target)
        if reason is not None:
            state.emit(PermissionDeniedEvent(id=call.id, name=call.name, reason=reason), _now_ms())
            return ToolOutput(content=reason, is_error=True)
        self._details(f"running `{_call_summary(call, target)}`")
        try:
            return await self._activity(
                ACTIVITY_TOOL,
                ToolCallInput(
                    run_id=plan.run_id,
                    workspace=plan.workspace,
                    call_id=call.id,
                    name=call.name,
                    arguments=call.input,
                ),
                ToolOutput,
                summary=_call_summary(call, target),
                timeout=plan.timeouts.tool_seconds,
                retry=RetryPolicy(maximum_attempts=3),
            )
        except ActivityError as exc:
            return ToolOutput(content=f"tool {call.name!r} failed: {_cause(exc)}", is_error=True)

    async def _ask(self, state: LoopState, call: ToolUseBlock, target: str | None) -> str | None:
        """Wait, durably, for a person's decision; the denial's reason, or None when approved."""
        timeout = state.plan.approval_timeout_seconds
        request = PendingApproval(
            call_id=call.id,
            tool=call.name,
            target=target,
            arguments=summarize_arguments(call.input),
            since_ms=_now_ms(),
            timeout_seconds=timeout,
        )
        self._approvals.ask(request)
        state.emit(
            ConfirmationRequiredEvent(
                id=call.id,
                name=call.name,
                target=target,
                arguments=request.arguments,
                timeout_seconds=timeout,
            ),
            _now_ms(),
        )
        workflow.upsert_search_attributes([RUN_STATUS_KEY.value_set(AWAITING_APPROVAL)])
        wid = workflow.info().workflow_id
        self._details(
            f"waiting for approval of `{_call_summary(call, target)}` (call `{call.id}`)\n\n"
            f"decide with `durable-agent approve {wid} {call.id}` or `durable-agent deny {wid} {call.id}`"
        )
        timed_out = False
        try:
            await workflow.wait_condition(
                lambda: self._approvals.decided(call.id) or self._cancel_requested,
                timeout=timedelta(seconds=timeout) if timeout else None,
                timeout_summary=f"approval timeout for {call.id}",
            )
        except TimeoutError:
            timed_out = True
        except asyncio.CancelledError:
            self.cancel(TEMPORAL_CANCEL_REASON)
        finally:
            decision = self._approvals.close(call.id)
            workflow.upsert_search_attributes([RUN_STATUS_KEY.value_set("executing")])
        self._check_cancel()
        approved = decision is not None and decision.approved
        given = decision.reason if decision else f"no decision within {timeout:g} s"
        state.emit(
            ConfirmationReceivedEvent(
                id=call.id, name=call.name, approved=approved, reason=given, timed_out=timed_out
            ),
            _now_ms(),
        )
        if approved:
            return None
        return f"permission denied: {_call_summary(call, target)} was not approved" + (
            f": {given}" if given else ""
        )

    async def _boundary(self, state: LoopState) -> None:
        """Save the logical checkpoint, then wait for the sink to acknowledge the export."""
        plan, turn = state.plan, state.turn
        now = _now_ms()
        export = state.checkpoint_export(now)
        digest = export.descriptor.content_digest
        if export.descriptor.size_bytes > plan.limits.max_checkpoint_bytes:
            message = (
                f"the checkpoint at turn {turn} is {export.descriptor.size_bytes} bytes, over "
                f"limits.max_checkpoint_bytes={plan.limits.max_checkpoint_bytes}: it cannot pass "
                "through Temporal as one payload, so the run stops here"
            )
            state.emit(ErrorEvent(message=message), _now_ms())
            raise _RunFailed(message)
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
            reason = _cause(exc)
            state.persistence_failures.append(f"turn {turn}: save failed: {reason}")
            state.emit(PersistenceFailedEvent(turn=turn, operation="save", reason=reason), _now_ms())
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
            reason = _cause(exc)
            state.export_failures.append(ExportFailure(turn=turn, content_digest=digest, reason=reason))
            state.emit(
                CheckpointExportFailedEvent(turn=turn, content_digest=digest, reason=reason), _now_ms()
            )
            return
        state.exports.append(ExportRef(turn=turn, content_digest=digest))
        state.emit(CheckpointExportedEvent(turn=turn, content_digest=digest), _now_ms())

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
            return (), _cause(exc)

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
            state.persistence_failures.append(f"finish failed: {_cause(exc)}")

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
            self.cancel(TEMPORAL_CANCEL_REASON)
        if not handle.done():
            handle.cancel()
        try:
            result = await handle
        except (ActivityError, CancelledError, asyncio.CancelledError):
            if self._cancel_requested:
                raise _Cancelled() from None
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
            self._state.emit(ErrorEvent(message=message), _now_ms())
            raise _RunFailed(message)

    def _check_cancel(self) -> None:
        if self._cancel_requested:
            raise _Cancelled()

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
