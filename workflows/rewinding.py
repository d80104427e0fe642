"""The ``rewind`` update of an ``AgentRun`` that waits for its next prompt: back to one of its
exported turns, files and conversation.

The validator refuses, before anything enters the history, a run that is not waiting for a
prompt and a turn the run did not export. The update then restores the workspace to the tree
that turn's export recorded (``agent.restore_workspace``, its one side effect) and returns; the
run records a ``rewind`` event, ends (completed, its record kept in the session), and continues
as new as a new run of the same session, under the same workflow id, resumed from that export's
file as ``resume`` would (``resume_from_file``, with the rewind's prompt if any). An export that
recorded no tree rewinds the conversation only: the files are left as they are.
"""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import NoReturn

from temporalio import workflow
from temporalio.exceptions import ActivityError, ApplicationError

with workflow.unsafe.imports_passed_through():
    from durable_agent.core.activity_api import RESTORE_WORKSPACE, RestoreWorkspaceInput
    from durable_agent.core.events import RewindEvent
    from durable_agent.core.failures import failure_message
    from durable_agent.core.loop import LoopState
    from durable_agent.core.run_api import (
        AgentRunInput,
        ExportRef,
        RewindAccepted,
        RewindOrigin,
        RewindRequest,
    )

from durable_agent.workflows.admission import Admission
from durable_agent.workflows.calls import CallRunner, Cancellation, now_ms


def rewind_event(origin: RewindOrigin) -> RewindEvent:
    """The ``rewind`` event that says where a run went back to."""
    return RewindEvent(
        run_id=origin.run_id, turn=origin.turn, content_digest=origin.content_digest, tree=origin.tree
    )


class Rewinder:
    """A run's rewind: checked, the files restored, then the run going on from the export."""

    def __init__(self, calls: CallRunner, admission: Admission) -> None:
        self._calls = calls
        self._admission = admission
        self.restoring = False  # the restore activity runs: no prompt, no second rewind meanwhile
        self.due: RewindOrigin | None = None  # restored: the run goes on from this export
        self._export_path = ""
        self._prompt: str | None = None

    @property
    def busy(self) -> bool:
        """A rewind was accepted: the run takes no prompt until it has gone on."""
        return self.restoring or self.due is not None

    def check(self, state: LoopState | None, request: RewindRequest, waiting: bool) -> None:
        """Refuse (``ValueError``, or ``InputTooLarge``/``HistoryLimit`` for the prompt) a rewind
        the run cannot take now.

        Args:
            state: The run's state (None: not started).
            request: The update's input.
            waiting: Whether the run waits for its next prompt (and none was given, nor ``end``).
        """
        if state is None or not waiting or self.busy:
            raise ValueError(
                "the run is not waiting for a prompt: rewind a conversation run (follow_ups) while it "
                "waits for its next prompt, or an ended run with `durable-agent rewind`"
            )
        if not self._export_of(state, request.turn):
            turns = sorted({e.turn for e in state.journal.exports})
            raise ValueError(f"the run has no export at turn {request.turn} (turns: {turns})")
        if request.prompt is not None:
            size = self._admission.message(request.prompt, state.plan.limits, "prompt")
            self._admission.history_room(state.plan.limits, size)

    @staticmethod
    def _export_of(state: LoopState, turn: int) -> ExportRef | None:
        found = [e for e in state.journal.exports if e.turn == turn]
        return found[-1] if found else None

    async def restore(self, state: LoopState, request: RewindRequest) -> RewindAccepted:
        """Restore the workspace to the turn's tree; the run goes on from its export once the
        handler returns (``pending``).

        Raises:
            ApplicationError: The restore failed (the update fails with why; the run still waits
                for its prompt, its files possibly part restored).
        """
        plan = state.plan
        ref = self._export_of(state, request.turn)
        assert ref is not None  # the validator checked
        self.restoring = True
        try:
            restored = await self._calls.run(
                RESTORE_WORKSPACE,
                RestoreWorkspaceInput(
                    workspace=plan.workspace,
                    sink=plan.export_sink,
                    session_id=plan.session_id,
                    run_id=plan.run_id,
                    turn=ref.turn,
                    content_digest=ref.content_digest,
                ),
                summary=f"rewind: restore the workspace to turn {ref.turn}",
                timeouts=plan.timeouts,
                # half-restored files are worse than a cancel that waits for the restore
                cancellable=False,
            )
        except ActivityError as exc:
            raise ApplicationError(f"rewind to turn {ref.turn} failed: {failure_message(exc)}") from None
        finally:
            self.restoring = False
        self.due = RewindOrigin(
            run_id=plan.run_id, turn=ref.turn, content_digest=ref.content_digest, tree=restored.tree
        )
        self._export_path, self._prompt = restored.export_path, request.prompt
        return RewindAccepted(turn=ref.turn, content_digest=ref.content_digest, tree=restored.tree)

    async def settled(self, cancellation: Cancellation) -> None:
        """Until the restore under way, if any, has settled (a cancel meanwhile is noted): the
        idle timeout may end the wait for a prompt while the files are being written."""
        while self.restoring:
            try:
                await workflow.wait_condition(lambda: not self.restoring)
            except asyncio.CancelledError:
                cancellation.temporal_request()

    def record(self, state: LoopState) -> None:
        """The ``rewind`` event, the rewound run's last before its ``end``."""
        assert self.due is not None
        state.journal.emit(rewind_event(self.due), now_ms())

    async def go_on(self, state: LoopState, run_input: AgentRunInput) -> NoReturn:
        """Continue as new as a new run of the session resumed from the turn's export file, with
        the run's settings (workspace, model, permissions, sink, follow_ups, …) and the rewind's
        prompt. Call once the run's end is in the store."""
        assert self.due is not None
        await workflow.wait_condition(workflow.all_handlers_finished)
        next_input = run_input.model_copy(
            update={
                "session_id": state.plan.session_id,
                "resume_from": None,
                "resume_from_file": self._export_path,
                "force_resume": False,
                "prompt": self._prompt,
                "continued": None,
                "rewind": self.due,
            }
        )
        workflow.continue_as_new(
            next_input.model_dump(mode="json", exclude_none=True),
            task_timeout=timedelta(seconds=state.plan.timeouts.workflow_task_seconds),
        )
