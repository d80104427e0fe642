"""The run's log and its tool boundaries: what ``AgentRun`` saves, exports and restores.

At each boundary the workflow appends what is new to the run's log in the
session store, has the export built from it and acknowledged, and, where an
activity finds the store without the state it was sent to read, sends the
missing entries again from its own history (``durable_agent.run_log``).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from datetime import timedelta
from typing import Any, Literal, NoReturn, TypeVar, cast

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError, ApplicationError

with workflow.unsafe.imports_passed_through():
    from durable_agent.canonical import canonical_bytes
    from durable_agent.checkpoint import ExportDescriptor
    from durable_agent.loop import LoopState
    from durable_agent.models import (
        CheckpointExportedEvent,
        CheckpointExportFailedEvent,
        ErrorEvent,
        PersistenceFailedEvent,
    )
    from durable_agent.run_io import (
        ACTIVITY_EXPORT,
        ACTIVITY_FINISH_RUN,
        ACTIVITY_OPEN_RUN,
        ACTIVITY_SAVE_CHECKPOINT,
        ExportFailure,
        ExportInput,
        ExportRef,
        ExportSeed,
        OpenRunInput,
        RunOpened,
        SaveCheckpointInput,
    )
    from durable_agent.run_log import STATE_LOST, STATE_MISSING, LogEntry, LogRef

from workflows.run_core import RunCancelled, RunCore, RunFailed, failure_message, now_ms

T = TypeVar("T")


# A restore sends a run's entries in batches of about this many bytes (a payload may hold 2 MB).
RESTORE_BATCH_BYTES = 1_000_000


def _detail(exc: ActivityError) -> str | None:
    """The first detail of the failure, where an activity put one (an export's digest)."""
    cause = exc.cause
    if isinstance(cause, ApplicationError) and cause.details and isinstance(cause.details[0], str):
        return cause.details[0]
    return None


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


class RunLogSteps(RunCore):
    """Opening, saving, exporting, restoring and finishing the run's log."""

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
