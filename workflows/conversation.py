"""A conversation's wait for its next prompt (a run started with ``follow_ups``).

Such a run does not end at the model's answer: it waits, durably, for the ``prompt`` update,
and ends the wait at ``end``, a cancel, a rewind, its idle timeout, or a move to its
deployment's new build (``upgrading.py``). ``Conversation`` holds what the handlers set (the
prompt given, whether ``end`` came) and the wait itself; ``AgentRun`` asks it after an answer.
"""

from __future__ import annotations

import asyncio
from datetime import timedelta

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from durable_agent.core.loop import LoopState
    from durable_agent.core.run_api import AWAITING_PROMPT, EXECUTING

from durable_agent.workflows.admission import Admission
from durable_agent.workflows.calls import Cancellation
from durable_agent.workflows.display import RunDisplay
from durable_agent.workflows.log_keeper import LogKeeper
from durable_agent.workflows.rewinding import Rewinder
from durable_agent.workflows.starting import Starter
from durable_agent.workflows.upgrading import idle_left, moves_while_waiting, target_changed


class Conversation:
    """Whether the run goes on after an answer, waits for a prompt now, the prompt given, and
    whether ``end`` came; and the wait for the next prompt."""

    def __init__(
        self,
        cancellation: Cancellation,
        rewinder: Rewinder,
        starter: Starter,
        log: LogKeeper,
        display: RunDisplay,
        admission: Admission,
    ) -> None:
        self._cancellation = cancellation
        self._rewinder = rewinder
        self._starter = starter
        self._log = log
        self._display = display
        self._admission = admission
        self.follow_ups = False  # the run was started with ``follow_ups``
        self.awaiting = False  # it waits for its next prompt now
        self.prompt: str | None = None  # the prompt given, until the run takes it
        self.end_requested = False

    async def next_prompt(self, state: LoopState) -> bool:
        """Wait, durably, for the next prompt, and queue it for the model's next request.

        Args:
            state: The run's state.

        Returns:
            ``False`` when ``end``, a rewind or the idle timeout closes the conversation (the run
            completes with its last answer).

        Raises:
            RunCancelled: A cancel ends the conversation as any cancel does: cancelled.
        """
        # a run that moved to a new build while it waited goes on with the time it had left
        now = int(workflow.now().timestamp() * 1000)
        since, self._starter.idle_since_ms = self._starter.idle_since_ms or now, None
        timeout = idle_left(state.plan.idle_timeout_seconds, since, now)
        await self._log.keep(state)
        self.awaiting = True
        self._display.status(AWAITING_PROMPT)
        wid = workflow.info().workflow_id
        idle = f" (it closes after {timeout:g} s without one)" if timeout else ""
        self._display.details(
            f"waiting for the next prompt{idle}\n\n"
            f'continue with `durable-agent chat {wid}` or `durable-agent prompt {wid} "…"`; '
            f"close with `durable-agent end {wid}`",
            state,
        )
        while True:
            try:
                await workflow.wait_condition(
                    lambda: self._woken(state),
                    timeout=timedelta(seconds=timeout) if timeout else None,
                    timeout_summary="idle timeout: no next prompt",
                )
            except TimeoutError:
                break
            except asyncio.CancelledError:
                self._cancellation.temporal_request()
            if not self._moves(state):
                break
            # to the deployment's new build, unless a prompt came meanwhile (``upgrading.py``)
            await self._starter.move(state, lambda: self._moves(state), since)
        await self._rewinder.settled(self._cancellation)  # a timeout during a rewind's restore
        self.awaiting = False
        self._cancellation.check()  # a cancel ends the conversation as any cancel does: cancelled
        if self._rewinder.due is not None:  # the run ends here, and goes on from the turn's export
            self._rewinder.record(state)
            return False
        prompt, self.prompt = self.prompt, None
        if prompt is None:
            return False
        state.queue_user_text(prompt, "follow_up")
        self._admission.queued(prompt)
        self._display.status(EXECUTING)
        return True

    def waiting(self) -> bool:
        """Whether the run waits for a prompt and none has come, nor ``end``."""
        return self.awaiting and self.prompt is None and not self.end_requested

    def _woken(self, state: LoopState) -> bool:
        """What ends the wait for a prompt: a rewind, a prompt, ``end``, a cancel, or a move."""
        if self._rewinder.due is not None:
            return True
        given = self.prompt is not None or self.end_requested or self._cancellation.requested
        return (given and not self._rewinder.restoring) or self._moves(state)

    def _moves(self, state: LoopState) -> bool:
        """Whether the run, waiting for its next prompt, moves to a new build now."""
        return moves_while_waiting(
            target_changed=target_changed(),
            can_carry=state.journal.can_carry(),
            prompt_given=self.prompt is not None,
            end_requested=self.end_requested,
            cancel_requested=self._cancellation.requested,
            rewinding=self._rewinder.due is not None or self._rewinder.restoring,
        )
