"""How an ``AgentRun`` starts and goes on: a new run, one resumed from an export (in the
input or in a file on the worker), one continued as new (from its ``CarriedState``);
refusing bad input (``InvalidRunInput``; ``PayloadRefused`` for input a worker with
``[codec]`` keys cannot take; ``InputTooLarge`` for a prompt past ``max_message_bytes``);
and when to continue as new, or stop, as the history grows.

The prompt comes from the input (or the export resumed from) and goes into the plan
here, once: the resolve activity never sees it, and the plan carries it across
continue-as-new.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any, NoReturn

from temporalio import workflow
from temporalio.common import RawValue
from temporalio.exceptions import ActivityError, ApplicationError

with workflow.unsafe.imports_passed_through():
    from pydantic import ValidationError

    from durable_agent.core.activity_api import (
        READ_RESUME,
        RESOLVE_RUN,
        ResolveInput,
        ResumeFileInput,
        ResumePoint,
    )
    from durable_agent.core.capability_binding import CapabilityBinding, binding_differences
    from durable_agent.core.context import ContextLedger
    from durable_agent.core.errors import validation_message
    from durable_agent.core.events import ErrorEvent, ToolsUnavailableEvent
    from durable_agent.core.export import (
        CheckpointPayload,
        ResumedFrom,
        workspace_origin_of,
        workspace_tree_of,
    )
    from durable_agent.core.failures import INPUT_TOO_LARGE, INVALID_RUN_INPUT, failure_message
    from durable_agent.core.loop import LoopState
    from durable_agent.core.plan import RunPlan, Timeouts
    from durable_agent.core.run_api import AgentRunInput, CarriedState, RunInputJson
    from durable_agent.core.todo_list import plan_at_checkpoint

from durable_agent.workflows import legacy_start
from durable_agent.workflows.admission import json_size
from durable_agent.workflows.calls import CallRunner, Cancellation, RunFailed, fix_stamps, now_ms
from durable_agent.workflows.display import RunDisplay
from durable_agent.workflows.log_keeper import LogKeeper
from durable_agent.workflows.patches import (
    BOUNDED_PROMPT_PATCH,
    CHECKPOINT_COMPLETES_PATCH,
    HOOKS_PATCH,
    LOCAL_BOOKENDS_PATCH,
    ONE_CHECKPOINT_PATCH,
    PARALLEL_CALLS_PATCH,
    PATCH_CANCELED_STATE,
    PATCH_HISTORY_STAMPS,
    PATCH_LINEAR_HISTORY,
    PATCH_SHELL_PROGRAMS,
    PATCH_SHELL_UNSEEN,
    SAME_BYTES_PATCH,
)
from durable_agent.workflows.upgrading import build_id, continue_reason, target_changed

# Before the plan exists the worker's timeouts are not known: the activities that make it
# (resolve, read an export file) have fixed options, whatever timeouts they are given.
BEFORE_PLAN = Timeouts()


def ask_patches_first(*, new_run: bool) -> bool:
    """Whether this execution runs its start and finish as local activities
    (``LOCAL_BOOKENDS_PATCH``); if so, every patch it may ask later is asked here, in its
    first workflow task, before any local activity.

    The SDK (temporalio 1.35) fails a replay that meets a patch's marker recorded after a local
    activity's in the same workflow task (a worker that keeps no run cached, a query answered
    by replay: "Non-deprecated patch marker encountered ... no corresponding change command").
    An answer is asked once an execution: later asks get it without a marker.

    Args:
        new_run: a run's first execution (not one continued as new), which also asks the
            patches of a run's start.
    """
    if not workflow.patched(LOCAL_BOOKENDS_PATCH):
        return False
    if new_run:
        workflow.patched(PATCH_LINEAR_HISTORY)
        workflow.patched(BOUNDED_PROMPT_PATCH)
    workflow.patched(PATCH_SHELL_UNSEEN)
    workflow.patched(HOOKS_PATCH)
    workflow.patched(PARALLEL_CALLS_PATCH)
    workflow.patched(ONE_CHECKPOINT_PATCH)
    workflow.patched(SAME_BYTES_PATCH)
    workflow.patched(CHECKPOINT_COMPLETES_PATCH)
    workflow.patched(PATCH_CANCELED_STATE)
    workflow.patched(PATCH_SHELL_PROGRAMS)
    fix_stamps(workflow.patched(PATCH_HISTORY_STAMPS))
    return True


class Starter:
    """Starts the run, continues it as new, and knows who it is before its state exists."""

    def __init__(
        self,
        calls: CallRunner,
        display: RunDisplay,
        log: LogKeeper,
        cancellation: Cancellation,
        attach: Callable[[LoopState], None],
        settle: Callable[[LoopState], None],
    ) -> None:
        self._calls = calls
        self._display = display
        self._attach = attach  # hands the run's state to ``AgentRun``, whose queries read it
        self._settle = settle  # records what handlers held (``signal_gate.py``) before it is carried
        self._log = log
        self._cancellation = cancellation
        self._input: AgentRunInput | None = None
        self.session_id = ""
        self.run_id = ""
        self.executions = 0  # times this run has continued as new before this execution
        # since when the run waits for its next prompt, when it moved to a new build while waiting
        self.idle_since_ms: int | None = None
        # what the status query says before the run's state exists
        self.pre_status = "created"
        self.pre_error: str | None = None

    @property
    def input(self) -> AgentRunInput:
        """The run's input, as ``accept`` read it."""
        assert self._input is not None
        return self._input

    def accept(self, raw: RawValue | dict[str, Any]) -> AgentRunInput:
        """The run's input, or the run refused: read here rather than by the SDK, so that input
        the worker cannot read (not JSON, not an object, or refused by its ``[codec]``) refuses
        the run with the reason instead of failing its first workflow task for ever."""
        data = self._read(raw) if isinstance(raw, RawValue) else raw
        try:
            self._input = AgentRunInput.model_validate(data)
        except ValidationError as exc:
            self.refuse(f"invalid AgentRun input: {validation_message(exc)}")
        return self._input

    def _read(self, raw: RawValue) -> dict[str, Any]:
        try:
            [data] = workflow.payload_converter().from_payloads([raw.payload], [RunInputJson])
        except ApplicationError as exc:  # ``PayloadRefused``: not encrypted, or not with our keys
            self.refuse(exc.message, exc.type or INVALID_RUN_INPUT)
        except Exception as exc:
            self.refuse(f"invalid AgentRun input: it does not read as a JSON object ({exc})")
        if not isinstance(data, dict):
            self.refuse(f"invalid AgentRun input: a JSON object is expected, not {type(data).__name__}")
        return data

    # --- a new run ------------------------------------------------------------

    async def start(self, run_input: AgentRunInput) -> LoopState:
        """A new run: resolve it against the worker's config, set up its state, open its log."""
        info = workflow.info()
        self.session_id = run_input.session_id or info.workflow_id
        # a rewound run goes on as a new run (``rewinding.py``): this execution's id, not the first's
        self.run_id = info.run_id if run_input.rewind is not None else info.first_execution_run_id
        # the plan resolved and the log opened by local activities, in this first task
        self._log.local_bookends = ask_patches_first(new_run=True)
        self._display.started(self.session_id, unless_set=self._log.local_bookends)
        self._display.details("resolving the run against the worker config", None)
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
        if run_input.prompt:
            size, limit = json_size(run_input.prompt), plan.limits.max_message_bytes
            # past Temporal's payload limit in the run's header; runs recorded before went on
            if size > limit and workflow.patched(BOUNDED_PROMPT_PATCH):
                self.refuse(
                    f"the prompt is {size} bytes as JSON, over [limits] max_message_bytes={limit}: "
                    "put the text in a file in the workspace and ask the model to read it",
                    INPUT_TOO_LARGE,
                )
        logical = resume.logical_resume if resume is not None else None
        # a run started before linear history (no marker in its history): ``legacy_start.py``
        if not workflow.patched(PATCH_LINEAR_HISTORY):
            state = await legacy_start.start_from_session(self._calls, plan, logical)
            self._attach(state)
            return state
        # a resumed run sees its source's newest view, and knows its last usage report
        context = ContextLedger.seeded((), resume.source_run().events) if resume is not None else None
        # the plan the model had written, shown from the start
        todos = plan_at_checkpoint(resume) if resume is not None else ()
        todos = point.todos if point is not None else todos
        state = LoopState(plan, now_ms(), resume=logical, point=point, context=context, todos=todos)
        for refused in plan.tools_refused:  # an MCP server whose tools the plan could not carry
            state.journal.emit(
                ToolsUnavailableEvent(server=refused.server, tools=refused.tools, reason=refused.reason),
                now_ms(),
            )
        self._attach(state)
        await self._log.open(state)
        return state

    async def _read_resume(self, path: str) -> ResumePoint:
        """Validate the export file on the worker; its conversation stays there until the run opens."""
        self._display.details(f"reading the export to resume from: `{path}`", None)
        try:
            return await self._calls.run(
                READ_RESUME,
                ResumeFileInput(path=path, run_id=self.run_id),
                summary=f"read export {path}",
                timeouts=BEFORE_PLAN,
                cancellable=False,
            )
        except ActivityError as exc:
            self.refuse(failure_message(exc))

    async def _resolve(
        self, run_input: AgentRunInput, resume: CheckpointPayload | None, point: ResumePoint | None
    ) -> RunPlan:
        """The plan: the run's settings resolved by the worker, and the prompt, set here."""
        facts: dict[str, Any] = {}
        prompt = run_input.prompt
        bound: CapabilityBinding | None = None
        if point is not None:
            bound = point.capability_binding
            facts = {
                "resumed_from": point.resumed_from,
                "resume_permissions": point.capability_binding.permissions,
                "workspace_tree": point.workspace_tree,
                "resume_origin": point.workspace_origin,
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
                "workspace_tree": workspace_tree_of(resume.source_run().events),
                "resume_origin": workspace_origin_of(resume.source_run().events),
            }
            bound = logical.capability_binding
            prompt = prompt or source.prompt
        if facts.get("resume_origin") is None:  # a run's input keeps the bytes it had before it
            facts.pop("resume_origin", None)
        if run_input.force_resume or facts.get("workspace_tree") is None:
            # the workspace is compared with the checkpoint's files only when it recorded them
            facts.pop("workspace_tree", None)
        elif run_input.rewind is not None:
            # a rewound run asked for those files: a worker whose copy follows it restores them
            facts["restore_workspace"] = True
        if bound is not None and bound.tools and not run_input.force_resume:
            # the checkpoint's tools, not those added since (a forced resume takes this worker's)
            facts["resume_tools"] = bound.tools
        try:
            plan = await self._calls.run(
                RESOLVE_RUN,
                ResolveInput(
                    settings=run_input.settings(), session_id=self.session_id, run_id=self.run_id, **facts
                ),
                summary="resolve run against worker config",
                timeouts=BEFORE_PLAN,
                cancellable=False,
                local=self._log.local_bookends,
            )
        except ActivityError as exc:
            self.refuse(failure_message(exc))
        return plan.model_copy(update={"prompt": prompt or ""})

    def _check_binding(self, binding: CapabilityBinding, plan: RunPlan) -> None:
        """Refuse to resume where this worker's tools or permissions are not the checkpoint's."""
        differences = binding_differences(binding, plan.capability_binding)
        if differences:
            self.refuse(
                "the checkpoint's capability binding differs from this worker's: "
                + "; ".join(differences)
                + " (resume with force_resume to go on anyway)"
            )

    def refuse(self, message: str, kind: str = INVALID_RUN_INPUT) -> NoReturn:
        """A usage error: the workflow fails at once, before any model call, with ``message``
        (an ``ApplicationError`` of type ``kind``)."""
        self.pre_status, self.pre_error = "failed", message
        self._display.status("failed")
        raise ApplicationError(message, type=kind, non_retryable=True)

    # --- continuing as new ----------------------------------------------------

    def continued(self, carried: CarriedState) -> LoopState:
        """The same run, in the execution it continued as new into."""
        # a schema this build cannot read fails the workflow task, not the run: it goes on once a
        # build that reads it is current (``CARRIED_STATE_SCHEMA``)
        carried.check_readable()
        self.session_id, self.run_id = carried.plan.session_id, carried.plan.run_id
        self.executions = carried.executions
        self.idle_since_ms = carried.idle_since_ms
        self._log.local_bookends = ask_patches_first(new_run=False)
        self._display.started(self.session_id, unless_set=self._log.local_bookends)
        state = LoopState.restore(carried)
        self._attach(state)
        build = build_id()
        self._display.details(
            f"continued as new (execution {carried.executions + 1}) at turn {carried.turn}"
            + (f" on build {build}" if build else ""),
            state,
        )
        return state

    def should_continue_as_new(self, state: LoopState) -> bool:
        """Whether the run, at a tool boundary, continues as new now: for a fresh history, or to
        move to its deployment's new build (``upgrading.py``)."""
        info, limits = workflow.info(), state.plan.limits
        # the next execution starts from a reference to the store's copy: it must hold everything
        reason = continue_reason(
            can_carry=state.journal.can_carry(),
            target_changed=target_changed(),
            history_suggested=info.is_continue_as_new_suggested(),
            history_over=info.get_current_history_length() > limits.continue_as_new_events
            or info.get_current_history_size() > limits.continue_as_new_bytes,
        )
        return reason is not None

    async def continue_as_new(self, state: LoopState) -> NoReturn:
        """Go on in a fresh history, seeded from the checkpoint just exported; on the
        deployment's new build when it has one for this run (``upgrading.py``)."""
        await workflow.wait_condition(workflow.all_handlers_finished)
        self._cancellation.check()  # a cancel that came meanwhile ends the run here instead
        self._go_on(state)

    async def move(self, state: LoopState, still: Callable[[], bool], idle_since_ms: int) -> None:
        """A run that waits moves to the deployment's new build: it continues as new, unless
        something came while the handlers in flight finished.

        Args:
            state: the run's state, whose log the store holds whole.
            still: whether the run still waits with nothing to do, asked once the handlers in
                flight have finished (a prompt that came meanwhile is answered first).
            idle_since_ms: since when it waits: its idle timeout goes on from there.

        Returns:
            Only when ``still`` says no; otherwise the execution ends here.
        """
        await workflow.wait_condition(workflow.all_handlers_finished)
        self._cancellation.check()
        if still():
            self._go_on(state, idle_since_ms)

    def _go_on(self, state: LoopState, idle_since_ms: int | None = None) -> NoReturn:
        self._settle(state)
        carried = state.carry(self.executions + 1).stamped()
        if idle_since_ms is not None:
            carried = carried.model_copy(update={"idle_since_ms": idle_since_ms})
        assert self._input is not None
        next_input = self._input.model_copy(
            update={
                "resume_from": None,
                "resume_from_file": None,
                "prompt": None,  # the plan carries it
                "continued": carried,
                "rewind": None,
            }
        )
        moving = target_changed()
        if moving:
            self._display.details("moving to the deployment's new build (continue as new)", state)
        # started with the CLI's default (10 s), a run gets ours from its next execution on;
        # a move starts the next execution on the deployment's target build, pinned there after
        workflow.continue_as_new(
            next_input.model_dump(mode="json", exclude_none=True),
            task_timeout=timedelta(seconds=state.plan.timeouts.workflow_task_seconds),
            initial_versioning_behavior=(
                workflow.ContinueAsNewVersioningBehavior.AUTO_UPGRADE if moving else None
            ),
        )

    def check_history(self, state: LoopState) -> None:
        """Stop cleanly before Temporal's history limits would terminate the run."""
        limits = state.plan.limits
        info = workflow.info()
        size, length = info.get_current_history_size(), info.get_current_history_length()
        if size > limits.max_history_bytes or length > limits.max_history_events:
            message = (
                f"the run's history holds {length} events, {size} bytes, past limits "
                f"(max_history_events={limits.max_history_events}, "
                f"max_history_bytes={limits.max_history_bytes}), so the run stops here"
            )
            state.journal.emit(ErrorEvent(message=message), now_ms())
            raise RunFailed(message)
