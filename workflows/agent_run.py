"""``AgentRun``: the agent loop as a deterministic Temporal workflow.

The workflow only orchestrates. The step logic lives in ``durable_agent.core.loop``
and every side effect is an activity, declared in ``durable_agent.core.activity_api``
and called through ``CallRunner`` (``calls.py``). At each tool boundary it saves
the logical checkpoint (what is new, appended to the run's log in the session
store), then waits for the export sink to acknowledge the export built from it,
and only then asks the model again.

This module holds the handlers and the loop: a model step, then the answer's tool
calls; the run's ``LoopState`` is held here too, and the queries read it. Its
collaborators: ``starting.py`` (start, resume, continue as new), ``call_batch.py``
(the calls of one answer: which run together, each boundary in the answer's order),
``tool_step.py`` (one call: its permission, asking a person, its hooks and its
activity), ``log_keeper.py`` (the run's log and its boundaries), ``display.py``
(details and search attributes), ``approval_book.py`` (the calls waiting for a
decision), ``calls.py`` (activities and the cancel), ``ending.py`` (how a run
closes, a cancelled one in the Canceled state), ``upgrading.py`` (a pinned run moving to its
deployment's new build at a safe point), ``conversation.py`` (the wait for a conversation's next
prompt), ``context_keeper.py`` (the model request, once the conversation fits its window).
"""

from __future__ import annotations

import asyncio

from temporalio import workflow
from temporalio.common import RawValue

from durable_agent.workflows.admission import Admission
from durable_agent.workflows.approval_book import ApprovalBook

with workflow.unsafe.imports_passed_through():
    from durable_agent.core.events import ErrorEvent, EventRecord, ToolsUnavailableEvent
    from durable_agent.core.loop import LoopState
    from durable_agent.core.models import ToolUseBlock
    from durable_agent.core.run_api import (
        QUERY_EVENTS,
        QUERY_RESULT,
        QUERY_STATUS,
        SIGNAL_CANCEL,
        SIGNAL_END,
        SIGNAL_UPGRADE,
        UPDATE_APPROVE,
        UPDATE_PROMPT,
        UPDATE_REWIND,
        UPDATE_STEER,
        AgentRunResult,
        ApprovalAnswer,
        ApprovalDecision,
        FinalStatus,
        FollowUpPrompt,
        PromptAccepted,
        RewindAccepted,
        RewindRequest,
        RunControl,
        RunStatusView,
        SteerAccepted,
        SteerMessage,
    )

from durable_agent.workflows.call_batch import CallBatches
from durable_agent.workflows.calls import (
    CallRunner,
    Cancellation,
    RunCancelled,
    RunFailed,
    StepClock,
    now_ms,
)
from durable_agent.workflows.context_keeper import (
    ContextKeeper,
)
from durable_agent.workflows.conversation import Conversation
from durable_agent.workflows.display import RunDisplay
from durable_agent.workflows.ending import Ending
from durable_agent.workflows.final_result import FinalResults
from durable_agent.workflows.hook_runner import HookRunner
from durable_agent.workflows.log_keeper import LogKeeper
from durable_agent.workflows.rewinding import Rewinder, rewind_event
from durable_agent.workflows.signal_gate import BARE, SignalGate
from durable_agent.workflows.starting import Starter
from durable_agent.workflows.tool_step import ToolStep
from durable_agent.workflows.upgrading import Upgrades


class BudgetStop(Exception):
    """The run reached a budget: it ends ``budget_exhausted`` with this message."""


# Pinned on a versioned worker, by its default behaviour (``deployments.deployment_config``): each
# execution stays on the build that started it, and moves only by continuing as new
# (``upgrading.py``). Not declared here: the server (1.32) refuses every workflow task that names
# a behaviour from an unversioned worker, and a worker without a deployment must run it as before.


@workflow.defn(name="AgentRun")
class AgentRun:
    """Runs one prompt to its end; see the module docstring."""

    def __init__(self) -> None:
        # what the run's records are stamped with (``now_ms``): see ``StepClock``
        self.clock = StepClock()
        self._cancellation = Cancellation()
        self._calls = CallRunner(self._cancellation)
        # the run's state, once it has one (``Starter`` hands it over): what the queries read
        self._state: LoopState | None = None
        self._display = RunDisplay(self._cancellation)
        self._log = LogKeeper(self._calls, self._display)
        self._context = ContextKeeper(self._calls, self._display, self._log)
        self._signals = SignalGate()  # ``cancel`` and ``end`` without a payload (``signal_gate.py``)
        self._starter = Starter(
            self._calls, self._display, self._log, self._cancellation, self._attach, self._signals.record
        )
        self._approvals = ApprovalBook()
        self._ending = Ending(self._calls, self._cancellation)
        self._final = FinalResults(self._log)  # a run with an output schema: its typed answer
        self._hooks = HookRunner(self._calls)  # the plan's [hooks] (``hook_runner.py``)
        # each tool call (``tool_step.py``), and the calls of an answer together (``call_batch.py``)
        step = ToolStep(self._calls, self._cancellation, self._display, self._approvals, self._hooks)
        self._step = step
        self._batches = CallBatches(step, self._log, self._starter, self._cancellation, self._display)
        self._admission = Admission()  # what updates may bring (``admission.py``)
        # the ``rewind`` update: back to an exported turn, files and conversation (``rewinding.py``)
        self._rewinder = Rewinder(self._calls, self._admission)
        # conversations: the wait for the next prompt, and what the handlers set (``conversation.py``)
        self._conversation = Conversation(
            self._cancellation, self._rewinder, self._starter, self._log, self._display, self._admission
        )
        self._ended = False  # the run has ended: updates are refused
        self._upgrades = Upgrades()  # the ``upgrade`` signal: a waiting run looks for a new build

    def _attach(self, state: LoopState) -> None:
        """From now on the queries and updates read ``state`` (set before the run's log opens);
        the bare ``cancel`` and ``end`` that came before it are judged now (``signal_gate.py``)."""
        self._state = state
        for name in self._signals.early():
            (self.cancel if name == SIGNAL_CANCEL else self.end)()

    def _records_at_once(self) -> bool:
        """Whether a handler records what it drops now: in a run that waits for its next prompt, or
        one recorded before ``stamps-fixed-by-history``; else at the next request (``signal_gate.py``)."""
        return self._conversation.awaiting or self._ended or not self.clock.fixed

    # --- handlers -----------------------------------------------------------

    @workflow.signal(name=SIGNAL_CANCEL)
    def cancel(self, control: RunControl = BARE) -> None:
        """Ask the run to stop; the tool or model call in flight is cancelled. With ``[codec]``
        keys, only with an encrypted ``RunControl``: a plain one is dropped before it gets here
        (``codec.py``), a bare one here (``signal_gate.py``)."""
        if not self._signals.dropped(SIGNAL_CANCEL, control, self._state, at_once=self._records_at_once()):
            self._cancellation.request(control.reason or "cancelled by signal")

    @workflow.update(name=UPDATE_APPROVE)
    def approve(self, decision: ApprovalDecision) -> ApprovalAnswer:
        """A person's decision on a call that waits for approval."""
        request = self._approvals.decide(decision)
        return ApprovalAnswer(call_id=decision.call_id, tool=request.tool, approved=decision.approved)

    @approve.validator
    def _validate_approve(self, decision: ApprovalDecision) -> None:
        # rejected here, an unknown or repeated decision never reaches the history
        self._approvals.check(decision)
        state = self._state
        if state is not None:
            self._admission.history_room(state.plan.limits, len(decision.reason or ""))

    @workflow.signal(name=SIGNAL_END)
    def end(self, control: RunControl = BARE) -> None:
        """Close a conversation that waits for its next prompt (at once) or will (at its answer);
        with ``[codec]`` keys, as ``cancel``."""
        if not self._signals.dropped(SIGNAL_END, control, self._state, at_once=self._records_at_once()):
            self._conversation.end_requested = True

    @workflow.signal(name=SIGNAL_UPGRADE)
    def upgrade(self) -> None:
        """Wake a waiting run: it moves to its deployment's new build, if there is one."""
        self._upgrades.ask()

    @workflow.update(name=UPDATE_PROMPT)
    def prompt(self, prompt: FollowUpPrompt) -> PromptAccepted:
        """The next prompt of a run that waits for one: its next turn starts."""
        self._conversation.prompt = prompt.text
        state = self._state
        return PromptAccepted(after_sequence=state.journal.event_count if state is not None else 0)

    @prompt.validator
    def _validate_prompt(self, prompt: FollowUpPrompt) -> None:
        # rejected here, a prompt the run cannot take never reaches the history
        if self._ended:
            raise ValueError("the run has ended")
        if self._rewinder.busy:
            raise ValueError("the run is rewinding: its next prompt goes to the run it goes on as")
        if not self._conversation.waiting():
            why = (
                "it was not started with follow_ups" if not self._conversation.follow_ups else "it is working"
            )
            raise ValueError(
                f"the run is not waiting for a prompt ({why}): use `steer` to add a message "
                "the model sees at its next request"
            )
        state = self._state
        if state is not None:
            size = self._admission.message(prompt.text, state.plan.limits, "prompt")
            self._admission.history_room(state.plan.limits, size)

    @workflow.update(name=UPDATE_REWIND)
    async def rewind(self, request: RewindRequest) -> RewindAccepted:
        """Back to one of the run's exported turns, while it waits for its next prompt: the
        workspace restored to that turn's files, then the run goes on from that turn's export."""
        state = self._state
        assert state is not None
        return await self._rewinder.restore(state, request)

    @rewind.validator
    def _validate_rewind(self, request: RewindRequest) -> None:
        # rejected here, a rewind the run cannot take never reaches the history
        if self._ended:
            raise ValueError("the run has ended: rewind it with `durable-agent rewind`")
        self._rewinder.check(self._state, request, self._conversation.waiting())

    @workflow.update(name=UPDATE_STEER)
    def steer(self, message: SteerMessage) -> SteerAccepted:
        """A user message the model sees at its next request; the call in flight goes on."""
        state = self._state
        assert state is not None
        self._admission.queued(message.text)
        return SteerAccepted(queued=state.queue_user_text(message.text, "steer"))

    @steer.validator
    def _validate_steer(self, message: SteerMessage) -> None:
        state, admission = self._state, self._admission
        if self._ended:
            raise ValueError("the run has ended")
        if state is None:
            raise ValueError("the run has not started yet: try again in a moment")
        if self._conversation.awaiting:
            raise ValueError("the run waits for its next prompt: send it with `prompt`")
        size = admission.message(message.text, state.plan.limits, "steer")
        admission.steer_room(state.queued_count(), size, state.plan.limits)
        admission.history_room(state.plan.limits, size)

    @workflow.query(name=QUERY_STATUS)
    def status(self) -> RunStatusView:
        state = self._state
        if state is None:
            starter = self._starter
            return RunStatusView(
                session_id=starter.session_id,
                run_id=starter.run_id,
                status=starter.pre_status,
                cancel_requested=self._cancellation.requested,
                error=starter.pre_error,
            )
        return state.status_view(
            self._cancellation.requested, self._approvals.view(), self._conversation.awaiting
        )

    @workflow.query(name=QUERY_EVENTS)
    def events(self, after_sequence: int = 0) -> list[EventRecord]:
        """The run's events with a sequence above ``after_sequence``, for followers."""
        state = self._state
        return state.journal.events_after(after_sequence) if state is not None else []

    @workflow.query(name=QUERY_RESULT)
    def final_result(self) -> AgentRunResult | None:
        """The ended run's result, whatever state it ended in (None until its end): a cancelled
        run ends Canceled, with no result of Temporal's to read."""
        state = self._state
        return state.result() if self._ended and state is not None else None

    # --- the run ------------------------------------------------------------

    @workflow.run
    async def run(self, raw: RawValue) -> AgentRunResult:
        # read by the run itself (``Starter.accept``): input it cannot take refuses the run
        run_input = self._starter.accept(raw)
        self._conversation.follow_ups = run_input.follow_ups
        if run_input.continued is not None:
            state = self._starter.continued(run_input.continued)
            for waiting in run_input.continued.queued:
                self._admission.queued(waiting.text)
        else:
            state = await self._starter.start(run_input)
            if run_input.rewind is not None:  # a run that a rewind went on as: where it came from
                state.journal.emit(rewind_event(run_input.rewind), now_ms())
            if run_input.prompt and (run_input.resume_from or run_input.resume_from_file):
                # a resumed run's prompt: a user message before its first request
                state.queue_user_text(run_input.prompt, "resume_prompt")
                self._admission.queued(run_input.prompt)
        final: FinalStatus = "completed"
        error: str | None = None
        # a new run's prompt is its conversation's first message; a resumed run's is queued
        resumed = run_input.resume_from or run_input.resume_from_file
        first_prompt = run_input.continued is None and not resumed
        try:
            if first_prompt and not state.plan.hooks.empty:
                await self._hooks.first_prompt(state)
            await self._loop(state)
        except RunCancelled:
            final, error = "cancelled", self._cancellation.reason
        except asyncio.CancelledError:
            # a Temporal cancel request (UI, CLI): honoured like the signal
            self._cancellation.temporal_request()
            final, error = "cancelled", self._cancellation.reason
        except RunFailed as exc:
            final, error = "failed", str(exc)
        except BudgetStop as exc:
            final, error = "budget_exhausted", str(exc)
        if not state.plan.hooks.empty:
            await self._hooks.stopped(state, final)
        # its change set, and from a git source its push, while a person may still approve that
        await self._ending.workspace_change(state)
        if final == "completed":
            await self._ending.push(state, self._step.ask)
        self._ended, self._conversation.awaiting = True, False
        self._signals.record(state)
        if undelivered := state.queued_count():
            # accepted, then the run ended before the model's next request: the record says so
            state.journal.emit(
                ErrorEvent(
                    message=f"{undelivered} message(s) sent with steer were accepted but never reached "
                    f"the model: the run ended ({final}) before its next request"
                ),
                now_ms(),
            )
        state.finish(final, now_ms(), error)
        await self._log.finish(state)
        self._display.status(final)
        self._display.details(f"**{final}**" + (f": {error}" if error else ""), state)
        if final == "completed" and self._rewinder.due is not None:
            # rewound: the same workflow goes on as a new run from the turn's export
            await self._rewinder.go_on(state, self._starter.input)
        # its record and last export kept: a cancelled run closes Canceled (``ending.py``)
        await self._ending.close(final == "cancelled", error, state.plan.timeouts)
        return state.result()

    async def _loop(self, state: LoopState) -> None:
        plan = state.plan
        # a run resumed between two calls of one model step first makes the calls still due
        if pending := state.pending_calls():
            await self._run_calls(state, pending)
        while True:
            self._cancellation.check()
            self._starter.check_history(state)
            if not await self._next_request(state):
                return
            response = await self._context.ask_model(state)
            self.clock.pin(response.completed_at_ms)
            for gap in response.unavailable:  # an MCP server was down: the model was told so
                state.journal.emit(
                    ToolsUnavailableEvent(server=gap.server, tools=gap.tools, reason=gap.reason), now_ms()
                )
            calls = state.add_model_response(response, now_ms())
            if plan.output_schema is not None:  # the answer must be a typed result (``final_result.py``)
                answer = await self._final.take(state, calls)
                if answer.answered:
                    if state.queued_count() or (
                        self._conversation.follow_ups and await self._conversation.next_prompt(state)
                    ):
                        continue  # a steer that came meanwhile is answered; so is a next prompt
                    return
                if not answer.calls:
                    continue  # the model was told what was wrong with its answer: ask it again
                calls = answer.calls
            if not calls:
                if state.queued_count() or self._conversation.follow_ups:
                    continue  # a steer that came meanwhile is answered; a follow-up is awaited
                return
            if state.tool_rounds > plan.max_tool_rounds:
                raise RunFailed(
                    f"the model asked for more than max_tool_rounds={plan.max_tool_rounds} tool rounds"
                )
            await self._run_calls(state, calls)

    async def _next_request(self, state: LoopState) -> bool:
        """Before a model request: stop for a budget, wait for the next prompt after an answer,
        and add the user messages that wait. ``False``: the conversation is closed."""
        self._signals.record(state)  # the signals dropped while it worked (``signal_gate.py``)
        budget = state.exhausted_budget()
        if budget is not None:
            # at a tool boundary whose export was acknowledged (or after an answer): never again
            raise BudgetStop(state.record_budget_exhausted(budget, now_ms()))
        if state.ends_with_answer():
            if not self._conversation.follow_ups:
                message = (
                    "the conversation ends with the model's answer and no prompt was given: "
                    "resume with a prompt (or start the run with follow_ups)"
                )
                state.journal.emit(ErrorEvent(message=message), now_ms())
                raise RunFailed(message)
            if not await self._conversation.next_prompt(state):
                return False
        while True:
            # the user messages waiting join the conversation, except those a hook refused
            refused = [] if state.plan.hooks.empty else await self._hooks.screen_queued(state)
            self._signals.record(state)
            state.take_queued(now_ms(), refused)
            self._admission.taken()
            if not refused or not state.ends_with_answer():
                return True
            # hooks refused what waited, and the model has nothing new to answer: wait again
            if not self._conversation.follow_ups or not await self._conversation.next_prompt(state):
                return False

    async def _run_calls(self, state: LoopState, calls: list[ToolUseBlock]) -> None:
        """One model step's tool calls, each followed by its tool boundary; those safe together
        run at once, recorded in the answer's order (``call_batch.py``, ``tool_step.py``)."""
        await self._batches.run(state, calls)
