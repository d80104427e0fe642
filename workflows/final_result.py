"""Typed results in the run: the model's answer to a run with an ``output_schema``.

Such a run is offered one more tool, ``final_result``, whose input schema is the output schema
(``durable_agent.core.output_schema``). ``AgentRun`` hands each model step's answer here:

- a ``final_result`` call whose arguments validate is the run's answer: its ``final_result``
  event and tool result are recorded, the boundary is exported like any call's, and the run
  ends (with ``follow_ups``, it waits for the next prompt, as after a text answer; the next
  answer must be a ``final_result`` call too). The step's other calls are not run: each is
  answered that it was not (Pydantic AI's "early" end);
- a call whose arguments do not validate is answered with the validation errors, the step's
  other calls run as usual, and the model is asked again;
- a text answer (no call) is answered with a user message (``output_retry``) telling the model
  to call ``final_result``.

The last two are failed answers: after ``max_output_retries`` of them since the run's last valid
answer the run fails, with the last problem in its error. The count is the run's
(``LoopState.output_failures``): a run that continues as new between a failed answer and the
next (at a boundary of the step's other calls) carries it over.

The check runs in the workflow, not an activity: validating a value against a schema is pure
and deterministic (``output_errors``), so a replay decides as the run did. Nothing here runs for
a run without an output schema, so runs recorded before typed results replay unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from durable_agent.core.events import ErrorEvent, ToolStartEvent, TurnEndEvent
    from durable_agent.core.loop import LoopState
    from durable_agent.core.models import ToolUseBlock
    from durable_agent.core.output_schema import (
        ACCEPTED_MESSAGE,
        FINAL_RESULT_TOOL,
        NOT_RUN_MESSAGE,
        SECOND_FINAL_MESSAGE,
        OutputSchemaUnusable,
        invalid_answer_message,
        output_errors,
        text_answer_message,
    )

from durable_agent.workflows.calls import RunFailed, now_ms
from durable_agent.workflows.log_keeper import LogKeeper


@dataclass(frozen=True)
class Answer:
    """What a model step's answer means for the run.

    Attributes:
        answered: A valid final result was recorded: the run's answer is in.
        calls: The step's other tool calls, still to run (none when ``answered``; none either
            when the model is simply asked again).
    """

    answered: bool
    calls: list[ToolUseBlock] = field(default_factory=list)


class FinalResults:
    """Reads each answer of a run with an output schema; counts the failed ones."""

    def __init__(self, log: LogKeeper) -> None:
        self._log = log

    async def take(self, state: LoopState, calls: list[ToolUseBlock]) -> Answer:
        """Decide on one model step of a run with an output schema (see the module docstring).

        Args:
            state: The run's state, the step's answer recorded.
            calls: The step's tool calls (none: a text answer).

        Returns:
            Whether the run's answer is in, and which of the step's calls are still to run.

        Raises:
            RunFailed: The model ran out of retries, or the schema cannot check an answer.
        """
        finals = [c for c in calls if c.name == FINAL_RESULT_TOOL]
        if not finals:
            if calls:
                return Answer(answered=False, calls=calls)  # tools to run before the answer
            left = self._failed(state, f"the model answered with text instead of calling {FINAL_RESULT_TOOL}")
            state.queue_user_text(text_answer_message(left), "output_retry")
            return Answer(answered=False)
        first = finals[0]
        schema = state.plan.output_schema
        assert schema is not None
        try:
            errors = output_errors(schema, first.input)
        except OutputSchemaUnusable as exc:
            raise self._fail(state, str(exc)) from None
        others = [c for c in calls if c.name != FINAL_RESULT_TOOL]
        if not errors:
            state.output_accepted()
            await self._answer(state, first, ACCEPTED_MESSAGE, False, output=True)
            for call in finals[1:]:
                await self._answer(state, call, SECOND_FINAL_MESSAGE)
            for call in others:
                await self._answer(state, call, NOT_RUN_MESSAGE)
            state.journal.emit(TurnEndEvent(turn=state.turn, usage=state.usage), now_ms())
            return Answer(answered=True)
        left = self._failed(
            state, f"its {FINAL_RESULT_TOOL} arguments do not match the output schema: {'; '.join(errors)}"
        )
        await self._answer(state, first, invalid_answer_message(errors, left))
        for call in finals[1:]:
            await self._answer(state, call, SECOND_FINAL_MESSAGE)
        if not others:
            state.journal.emit(TurnEndEvent(turn=state.turn, usage=state.usage), now_ms())
        return Answer(answered=False, calls=others)

    async def _answer(
        self, state: LoopState, call: ToolUseBlock, content: str, is_error: bool = True, output: bool = False
    ) -> None:
        """Record ``call``'s tool result (with the run's output, for a valid final result), then its
        boundary, as for any call."""
        state.journal.emit(ToolStartEvent.of(call.id, call.name, call.input), now_ms())
        if output:
            state.record_output(call.id, call.input, now_ms())
        state.add_tool_result(call, content, is_error, now_ms())
        await self._log.boundary(state)

    def _failed(self, state: LoopState, problem: str) -> int:
        """One more failed answer: how many tries the model has left, or the run fails."""
        failures = state.output_failed()
        allowed = state.plan.max_output_retries
        if failures > allowed:
            raise self._fail(
                state,
                f"no valid final result after {allowed} retries (max_output_retries={allowed}): {problem}",
            )
        return allowed - failures + 1

    @staticmethod
    def _fail(state: LoopState, message: str) -> RunFailed:
        """The run's error, recorded: the caller raises it."""
        state.journal.emit(ErrorEvent(message=message), now_ms())
        return RunFailed(message)
