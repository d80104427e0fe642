"""The run's context keeper: before each model request, make the model's view of the
conversation small enough for its context window (``durable_agent.core.context``).

With the plan's ``context`` unset (runs recorded before context management, a scripted
model without a window) it does nothing and schedules nothing. Otherwise, before a
request whose size passes ``compact_at`` of the usable window, it elides old tool
results and, when that is not enough, has ``agent.compact`` summarize older turns; each
compaction is a ``context_compacted`` event, which the model step reads its view from.
After the provider answered that a request overflowed, it compacts harder and the
request is made again; the run fails only when nothing more can leave the view.
"""

from __future__ import annotations

from typing import NoReturn

from temporalio import workflow
from temporalio.exceptions import ActivityError, ApplicationError

with workflow.unsafe.imports_passed_through():
    from durable_agent.core.activity_api import (
        COMPACT,
        MODEL_CALL,
        CompactInput,
        CompactOutput,
        ModelStepInput,
    )
    from durable_agent.core.context import (
        OVERFLOW_TARGETS,
        ContextLedger,
        ContextPolicy,
        cannot_fit,
        next_view,
        plan_compaction,
    )
    from durable_agent.core.events import ContextCompactedEvent, ErrorEvent
    from durable_agent.core.failures import CONTEXT_OVERFLOW, failure_message
    from durable_agent.core.loop import LoopState
    from durable_agent.core.models import ModelResponse, TokenUsage
    from durable_agent.core.run_log import LogDelta

from durable_agent.workflows.calls import CallRunner, RunFailed, now_ms
from durable_agent.workflows.display import RunDisplay
from durable_agent.workflows.log_keeper import LogKeeper

# How many times a request the provider found too large is compacted harder and made again.
MAX_OVERFLOW_RETRIES = len(OVERFLOW_TARGETS)


def is_overflow(exc: ActivityError) -> bool:
    cause = exc.cause
    return isinstance(cause, ApplicationError) and cause.type == CONTEXT_OVERFLOW


def model_pending(state: LoopState) -> LogDelta:
    """What the model step reads besides the log: the new messages, and of the new events only
    the view's (the model reads no other events; without compaction there are none)."""
    pending = state.journal.pending()
    views = tuple(r for r in pending.events if isinstance(r.event, ContextCompactedEvent))
    return pending.model_copy(update={"events": views})


class ContextKeeper:
    """Compacts the model's view of the conversation before a request that would not fit."""

    def __init__(self, calls: CallRunner, display: RunDisplay, log: LogKeeper) -> None:
        self._calls = calls
        self._display = display
        self._log = log

    async def ask_model(self, state: LoopState, overflow: int = 0) -> ModelResponse:
        """Ask the model, once the conversation fits its window.

        Args:
            state: The run's state.
            overflow: How many times the provider refused this request as too large.

        Returns:
            The model's answer.

        Raises:
            RunFailed: The model call failed for good (recorded on the run), or the request
                cannot be made small enough.
        """
        plan = state.plan
        await self.prepare(state, overflow)
        self._display.details(f"asking {plan.model}", state)
        pending = model_pending(state)  # the model reads no events but the view's
        try:
            return await self._log.reading_log(
                state,
                lambda: self._calls.run(
                    MODEL_CALL,
                    ModelStepInput(
                        run_id=plan.run_id, model=plan.model, log=state.journal.head, pending=pending
                    ),
                    summary=f"model {plan.model} (step {state.tool_rounds + 1})",
                    timeouts=plan.timeouts,
                ),
            )
        except ActivityError as exc:
            if plan.context is not None and is_overflow(exc):
                if overflow < MAX_OVERFLOW_RETRIES:
                    return await self.ask_model(state, overflow + 1)
                self.fail_overflow(state, failure_message(exc))
            message = f"model call failed: {failure_message(exc)}"
            state.journal.emit(ErrorEvent(message=message), now_ms())
            raise RunFailed(message) from None

    async def prepare(self, state: LoopState, overflow: int = 0) -> None:
        """Before a model request; ``overflow``: how many times the provider refused it as too large."""
        policy = state.plan.context
        ledger = state.journal.context_now()
        if policy is None or ledger is None:
            return
        fixed = state.journal.context_fixed()
        size = ledger.size(fixed)
        if overflow == 0 and size <= policy.threshold:
            return
        target = policy.target(overflow)
        plan = plan_compaction(ledger, policy, fixed, target, force_summary=overflow > 0)
        estimate = ledger.estimate(fixed)
        if plan is None:
            if overflow > 0 or estimate > policy.usable:
                self._fail(state, ledger, policy, fixed, estimate)
            return
        self._display.details(f"compacting the conversation ({size} of {policy.window} tokens)", state)
        summary: CompactOutput | None = None
        failed: str | None = None
        if plan.summarize_upto is not None:
            summary, failed = await self._summarize(state, policy, plan.summarize_upto)
        if not plan.elide and summary is None:
            if overflow > 0 or estimate > policy.usable:
                self._fail(state, ledger, policy, fixed, estimate, failed)
            return
        view, gone = next_view(ledger, plan, summary.summary if summary else None)
        after = ledger.compacted(view).estimate(fixed)
        event = ContextCompactedEvent(
            tier="summarize" if summary is not None else "elide",
            reason="overflow" if overflow > 0 else "threshold",
            view=view,
            elided_now=gone,
            tokens_before=size,
            tokens_after=after,
            window=policy.window,
        )
        state.record_compaction(event, summary.usage if summary else TokenUsage(), now_ms())
        if after > policy.usable:
            self._fail(state, ledger.compacted(view), policy, fixed, after, failed)

    async def _summarize(
        self, state: LoopState, policy: ContextPolicy, upto: int
    ) -> tuple[CompactOutput | None, str | None]:
        """A summary of ``messages[1:upto]`` by ``agent.compact``; its failure costs the summary only."""
        plan = state.plan
        model = policy.compaction_model or plan.model
        inp = CompactInput(
            run_id=plan.run_id,
            model=model,
            log=state.journal.head,
            pending=model_pending(state),
            upto=upto,
            max_summary_tokens=policy.summary_tokens(),
            budget_tokens=max(1024, int(policy.usable * 0.7)),
        )
        try:
            output = await self._log.reading_log(
                state,
                lambda: self._calls.run(
                    COMPACT,
                    inp,
                    summary=f"summarize {upto - 1} messages with {model}",
                    timeouts=plan.timeouts,
                ),
            )
        except ActivityError as exc:
            return None, f"the summary failed: {failure_message(exc)}"
        return output, None

    def _fail(
        self,
        state: LoopState,
        ledger: ContextLedger,
        policy: ContextPolicy,
        fixed: int,
        estimate: int,
        why: str | None = None,
    ) -> NoReturn:
        message = cannot_fit(ledger, policy, fixed, state.plan.model, estimate)
        if why:
            message += f" ({why})"
        state.journal.emit(ErrorEvent(message=message), now_ms())
        raise RunFailed(message)

    def fail_overflow(self, state: LoopState, provider_message: str) -> NoReturn:
        """The provider still refused the request after the harder compactions."""
        policy, ledger = state.plan.context, state.journal.context_now()
        assert policy is not None and ledger is not None
        fixed = state.journal.context_fixed()
        self._fail(state, ledger, policy, fixed, ledger.estimate(fixed), f"the provider: {provider_message}")
