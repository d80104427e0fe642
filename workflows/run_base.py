"""``RunBase``: how an ``AgentRun`` starts (new, resumed from an export, or continued
as new), refuses bad input, and continues as new at a tool boundary.

Split from ``workflows/agent_run.py`` to keep each module small; ``AgentRun``
is the only class that uses ``RunBase``.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any, NoReturn

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError, ApplicationError

with workflow.unsafe.imports_passed_through():
    from durable_agent.checkpoint import (
        CapabilityBinding,
        CheckpointPayload,
        ResumedFrom,
        RunRecord,
        binding_differences,
    )
    from durable_agent.loop import LoopState
    from durable_agent.run_io import (
        ACTIVITY_LOAD_SESSION,
        ACTIVITY_READ_RESUME,
        ACTIVITY_RESOLVE,
        AgentRunInput,
        CarriedState,
        LoadSessionInput,
        ResolveInput,
        ResumeFileInput,
        ResumePoint,
        RunPlan,
        SessionRuns,
    )

from workflows.run_core import RUN_STATUS_KEY, SESSION_ID_KEY, failure_message, now_ms
from workflows.run_log_steps import RunLogSteps

# Runs started before linear history loaded their session instead of opening a log; their
# histories replay through the branch this patch id guards.
PATCH_LINEAR_HISTORY = "linear-history"


class RunBase(RunLogSteps):
    """Starting and continuing a run (no Temporal handlers here)."""

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
