"""The tool calls of one model answer: which run together, and how their boundaries follow.

A call is safe to run with others when its tool's offer says ``parallel`` (a tool that only
reads, or one the worker's ``[tools] parallel`` names; ``ToolOffer.parallel``), or when it
runs nothing (an unknown tool, a call the rules or a person refused). Consecutive safe calls
form a batch, whose tool activities are scheduled at once, in one workflow task; any other
call runs alone, in its place (``batches``).

The order the run records is the answer's order, whatever order the activities finish in:
once a batch has finished, each of its calls in turn gets its ``tool_start`` and ``tool_end``
events, its tool result and its tool boundary, whose export the sink acknowledges before the
next call is recorded; so the run's log and its export series are those of the same calls run
one after another. Before any call of the answer runs, every call is judged by the rules, and
the calls that need a person's decision are asked about together (``ToolStep.ask_together``).

Runs recorded before this took their calls one at a time, each asked about in its turn: an
answer takes the new way only under the ``parallel-tool-calls`` patch, asked for only by an
answer that would run otherwise (``worth_batching``). Each call's own execution is
``ToolStep.execute`` (``tool_step.py``), alone or in a batch.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from durable_agent.core.activity_api import ToolOutput
    from durable_agent.core.events import ToolStartEvent, TurnEndEvent
    from durable_agent.core.loop import LoopState
    from durable_agent.core.models import ToolUseBlock
    from durable_agent.core.permissions import strictest
    from durable_agent.core.plan import RunPlan
    from durable_agent.core.tool_specs import ToolCallError, find_offer, permission_targets

from durable_agent.workflows.calls import Cancellation, now_ms, pin_clock
from durable_agent.workflows.display import RunDisplay
from durable_agent.workflows.log_keeper import LogKeeper
from durable_agent.workflows.patches import PARALLEL_CALLS_PATCH
from durable_agent.workflows.starting import Starter
from durable_agent.workflows.tool_step import ToolStep, Verdict


def _parallel(plan: RunPlan, call: ToolUseBlock) -> bool:
    """Whether the call's tool is offered as one whose calls may run together."""
    try:
        return find_offer(plan.tools, call.name).parallel
    except ToolCallError:
        return False


def _may_ask(plan: RunPlan, call: ToolUseBlock) -> bool:
    """Whether the rules may send the call to a person, by today's judge or the one before it
    (``shell_gate.py``): decided here without the judges' patch, so asking records nothing."""
    try:
        offer = find_offer(plan.tools, call.name)
        targets = permission_targets(offer, call.input, plan.workspace)
    except ToolCallError:
        return False
    if offer.in_workflow:
        return False
    both = [plan.permissions.decide_both(call.name, target) for target in targets]
    return "ask" in (strictest(d for d, _ in both), strictest(legacy for _, legacy in both))


def worth_batching(plan: RunPlan, calls: Sequence[ToolUseBlock]) -> bool:
    """Whether the answer's calls would run otherwise than one after another: two consecutive
    calls to tools offered as parallel, or two calls a rule may send to a person. An answer
    that reuses a call id takes its calls one at a time (a person decides on a call by its id).

    Args:
        plan: the run's plan: its tools and rules.
        calls: the answer's calls, in order.

    Returns:
        Whether to ask for the ``parallel-tool-calls`` patch.
    """
    if len({call.id for call in calls}) != len(calls):
        return False
    run = longest = 0
    for call in calls:
        run = run + 1 if _parallel(plan, call) else 0
        longest = max(longest, run)
    return longest >= 2 or sum(_may_ask(plan, call) for call in calls) >= 2


def batches(verdicts: Sequence[Verdict], refused: Sequence[bool]) -> list[list[int]]:
    """The answer's calls in groups that run together, in order: consecutive safe calls (see
    the module docstring) make one group, any other call a group of its own.

    Args:
        verdicts: what the rules say of each call.
        refused: for each call, whether it was refused (by the rules or by a person).

    Returns:
        The groups, as indexes into ``verdicts``; together they hold every index once, in order.
    """
    groups: list[list[int]] = []
    together = False  # whether the last group takes more safe calls
    for index, verdict in enumerate(verdicts):
        runs_nothing = verdict.error is not None or refused[index]
        safe = runs_nothing or (verdict.offer is not None and verdict.offer.parallel)
        if safe and together:
            groups[-1].append(index)
        else:
            groups.append([index])
        together = safe
    return groups


@dataclass
class CallBatches:
    """Runs the tool calls of each model answer, each followed by its tool boundary.

    Args:
        step: the per-call judge, asker and runner.
        log: the run's log, whose ``boundary`` saves and exports each call's result.
        starter: decides when the run continues as new, and does it.
        cancellation: the run's cancel flag.
        display: the run's details in the UI.
    """

    _step: ToolStep
    _log: LogKeeper
    _starter: Starter
    _cancellation: Cancellation
    _display: RunDisplay

    async def run(self, state: LoopState, calls: list[ToolUseBlock]) -> None:
        """Run one model answer's calls (or those of it still due) and record each in order.

        Args:
            state: the run's state.
            calls: the calls, in the answer's order.

        Raises:
            RunCancelled: the run was cancelled (a batch's activities are cancelled with it).
        """
        if worth_batching(state.plan, calls) and workflow.patched(PARALLEL_CALLS_PATCH):
            await self._batched(state, calls)
        else:
            for call in calls:
                self._cancellation.check()
                state.journal.emit(ToolStartEvent.of(call.id, call.name, call.input), now_ms())
                output = await self._step.step(state, call)
                await self._record(state, call, output)
                if self._starter.should_continue_as_new(state):
                    await self._starter.continue_as_new(state)
        state.journal.emit(TurnEndEvent(turn=state.turn, usage=state.usage), now_ms())

    async def _record(self, state: LoopState, call: ToolUseBlock, output: ToolOutput) -> None:
        """The call's result, then its boundary, whose export is acknowledged before we go on.
        A ``task`` call's child's change is merged here, so the children of one answer are merged
        in the answer's order (``child_merge.py``)."""
        output = await self._step.merge_child(state, output)
        # the tool activity's own time, from the history, when it ran (see ToolOutput): what this
        # task stamps from here on is at that time too (``StepClock``)
        at_ms = output.completed_at_ms
        pin_clock(at_ms)
        state.add_tool_result(
            call,
            output.content,
            output.is_error,
            at_ms or now_ms(),
            output.staged,
            output.images,
            workspace=output.workspace,
            host=output.host,
            restored=output.restored,
        )
        await self._log.boundary(state, at_ms)

    async def _batched(self, state: LoopState, calls: list[ToolUseBlock]) -> None:
        """Judge every call, ask about those that need a person together, then run the calls
        batch by batch, recording each in the answer's order."""
        step = self._step
        verdicts = [step.judge(state, call) for call in calls]
        # a call that cannot run (``error``) is refused by its error, not by the rules
        judged = [v.error is None for v in verdicts]
        reasons = [
            v.denial() if ok and v.decision == "deny" else None
            for v, ok in zip(verdicts, judged, strict=True)
        ]
        asked = [i for i, v in enumerate(verdicts) if judged[i] and v.decision == "ask"]
        if asked:
            answers = await step.ask_together(state, [(verdicts[i].call, verdicts[i].target) for i in asked])
            for index, reason in zip(asked, answers, strict=True):
                reasons[index] = reason
        groups = batches(verdicts, [reason is not None for reason in reasons])
        for number, group in enumerate(groups):
            await self._group(state, [verdicts[i] for i in group], [reasons[i] for i in group])
            # Continue as new only between groups: the calls still due are carried
            # (``state.pending_calls()``) and run in the next execution, so no result is lost or
            # reordered, and none that ran is run again. Not while a later call of the answer
            # holds a person's decision, which the next execution would not know: it would ask again.
            later = [verdicts[i] for g in groups[number + 1 :] for i in g]
            if not any(v.decision == "ask" for v in later) and self._starter.should_continue_as_new(state):
                await self._starter.continue_as_new(state)

    async def _group(self, state: LoopState, verdicts: list[Verdict], reasons: list[str | None]) -> None:
        """Run one group's calls (several at once when it holds several that run), then record
        each in order."""
        self._cancellation.check()
        if len(verdicts) == 1:
            # alone, as one call has always run: its start recorded before it runs
            [verdict], [reason] = verdicts, reasons
            call = verdict.call
            state.journal.emit(ToolStartEvent.of(call.id, call.name, call.input), now_ms())
            output = await self._outcome(state, verdict, reason, None)
            await self._record(state, call, output)
            return
        # The starts are recorded with the results, each next to its call's end, so the log (and
        # every export) reads as if the calls had run one after another; stamped with the time
        # the batch started, which this workflow task fixes (it schedules the activities), so a
        # workflow task that runs again after its worker died builds the same exports.
        started = now_ms()
        running = [i for i, v in enumerate(verdicts) if self._runs(v, reasons[i])]
        if running:
            self._display.details(f"running {len(running)} calls together", state)
        done = await self._together(state, [verdicts[i] for i in running])
        outputs = dict(zip(running, done, strict=True))
        for index, verdict in enumerate(verdicts):
            self._cancellation.check()
            call = verdict.call
            state.journal.emit(ToolStartEvent.of(call.id, call.name, call.input), started)
            output = await self._outcome(state, verdict, reasons[index], outputs.get(index))
            await self._record(state, call, output)

    @staticmethod
    def _runs(verdict: Verdict, reason: str | None) -> bool:
        """Whether the call runs beside others: a tool activity, or a ``task`` call's child run
        (neither refused nor answered by the workflow at once)."""
        return verdict.error is None and reason is None and (not verdict.in_workflow or verdict.child)

    async def _outcome(
        self, state: LoopState, verdict: Verdict, reason: str | None, output: ToolOutput | None
    ) -> ToolOutput:
        """The call's output: ``output`` when it ran in a batch; else the refusal, the
        workflow's own answer, or the call run now."""
        if output is not None:
            return output
        call = verdict.call
        if verdict.error is not None:
            return ToolOutput(content=verdict.error, is_error=True)
        if reason is not None:
            return self._step.refuse(state, verdict, reason)
        if verdict.in_workflow:
            return await self._step.answer(state, verdict)
        return await self._step.execute(state, call, verdict.target)

    async def _together(self, state: LoopState, verdicts: list[Verdict]) -> list[ToolOutput]:
        """Run the calls at once: their activities are scheduled in this workflow task, in order
        (``asyncio.gather`` is deterministic in Temporal's event loop). Every call settles before
        this returns, so a cancel, which each call's activity sees, stops them all first."""
        children = sum(1 for v in verdicts if v.child)
        settled = await asyncio.gather(
            *(self._step.run_allowed(state, v, children) for v in verdicts), return_exceptions=True
        )
        outputs: list[ToolOutput] = []
        for result in settled:
            if isinstance(result, BaseException):
                raise result  # the first in the answer's order: a cancel is ``RunCancelled``
            outputs.append(result)
        return outputs
