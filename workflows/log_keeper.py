"""The run's log keeper: what ``AgentRun`` saves, exports and restores, and how the run ends
in the store.

At each tool boundary the workflow appends what is new to the run's log in the
session store, has the export built from it and acknowledged, and, where an
activity finds the store without the state it was sent to read, sends the
missing entries again from its own history (``durable_agent.core.run_log``).
A store that fails costs a recorded failure, not the run: a later save sends
what the store lacks.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import NoReturn, TypeVar

from temporalio import workflow
from temporalio.exceptions import ActivityError, ApplicationError

with workflow.unsafe.imports_passed_through():
    from durable_agent.core.activity_api import (
        CHECKPOINT,
        EXPORT_CHECKPOINT,
        FINISH_RUN,
        OPEN_RUN,
        SAVE_CHECKPOINT,
        CheckpointInput,
        ExportInput,
        OpenRunInput,
        SaveCheckpointInput,
    )
    from durable_agent.core.canonical import canonical_bytes
    from durable_agent.core.events import ErrorEvent
    from durable_agent.core.failures import EXPORT_FAILURE_TYPES, STATE_LOST, failure_message
    from durable_agent.core.loop import LoopState
    from durable_agent.core.run_log import LogEntry, LogRef

from durable_agent.workflows.calls import (
    CallRunner,
    RunCancelled,
    RunFailed,
    failure_detail,
    missing_state,
    now_ms,
    stamps_fixed,
)
from durable_agent.workflows.display import RunDisplay
from durable_agent.workflows.patches import CHECKPOINT_COMPLETES_PATCH, ONE_CHECKPOINT_PATCH, SAME_BYTES_PATCH

T = TypeVar("T")

# A restore sends a run's entries in batches of about this many bytes (a payload may hold 2 MB).
RESTORE_BATCH_BYTES = 1_000_000


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


def lost(state: LoopState, message: str) -> NoReturn:
    """The run's state is gone for good: the run cannot go on."""
    state.journal.emit(ErrorEvent(message=message), now_ms())
    raise RunFailed(message)


class LogKeeper:
    """Opening, saving, exporting, restoring and finishing the run's log."""

    def __init__(self, calls: CallRunner, display: RunDisplay) -> None:
        self._calls = calls
        self._display = display
        # the log's opening and the run's end as local activities (``local-start-and-finish``):
        # what this execution's first task asked (``starting.ask_patches_first``)
        self.local_bookends = False

    async def open(self, state: LoopState) -> None:
        """Write the run's header and first log entry; the store names the session's ended runs."""
        seed = state.journal.take_entry()
        assert seed is not None
        journal = state.journal
        # a run resumed from a file: the store gets its conversation from there
        resumed = journal.seed_export if journal.stored.version < journal.seed.version else None
        try:
            opened = await self._calls.run(
                OPEN_RUN,
                OpenRunInput(header=journal.header(), seed=seed, resumed=resumed),
                summary=f"open run log in session {state.plan.session_id}",
                timeouts=state.plan.timeouts,
                local=self.local_bookends,
            )
        except ActivityError as exc:
            # the first save sends the log again, from its start
            state.journal.record_persistence_failure(
                "save", f"open run: {failure_message(exc)}", state.turn, now_ms()
            )
            return
        state.journal.record_opened(opened.prior_run_ids)

    async def boundary(self, state: LoopState, at_ms: int | None = None) -> None:
        """Save what is new to the run's log, then wait for the sink to acknowledge the export.
        ``at_ms``: the boundary's time, when the history fixes it (the tool activity's)."""
        plan, turn = state.plan, state.turn
        state.journal.take_entry()
        # histories recorded before the patch save, then export, in two activities
        if workflow.patched(ONE_CHECKPOINT_PATCH):
            await self._checkpoint(state, at_ms)
            return
        await self.save(state)
        self._display.details(f"exporting turn {turn}", state)
        sent = state.journal.head
        export = ExportInput(sink=plan.export_sink, log=sent, facts=state.export_facts(now_ms()))
        try:
            descriptor = await self.reading_log(
                state,
                lambda: self._calls.run(
                    EXPORT_CHECKPOINT, export, summary=f"export turn {turn}", timeouts=plan.timeouts
                ),
            )
        except ActivityError as exc:
            state.journal.record_export_failure(
                turn, failure_detail(exc) or "", failure_message(exc), now_ms()
            )
            return
        state.journal.record_export(descriptor, plan.export_sink, sent, state.turn, now_ms())

    async def _checkpoint(self, state: LoopState, at_ms: int | None) -> None:
        """The boundary as one local activity: the save (when there is something to save),
        then the export. A store without the state gets it again from this history, once."""
        plan, turn = state.plan, state.turn
        self._display.details(f"checkpoint turn {turn}", state)
        # a boundary whose time the history does not fix (a call that never ran) is an ordinary
        # activity, its input recorded: a worker that dies in it leaves a retry that builds the
        # same bytes. After a tool activity it stays local, stamped with the activity's own time.
        local = at_ms is not None or not workflow.patched(SAME_BYTES_PATCH)
        for attempt in (1, 2):
            sent = state.journal.head
            save = self._save_input(state)
            # its input is not recorded: a workflow task run again must build the same bytes
            facts = state.export_facts(at_ms or now_ms())
            checkpoint = CheckpointInput(
                save=save, export=ExportInput(sink=plan.export_sink, log=sent, facts=facts)
            )
            try:
                descriptor = await self._calls.run(
                    CHECKPOINT,
                    checkpoint,
                    summary=f"checkpoint turn {turn}",
                    timeouts=plan.timeouts,
                    local=local,
                    # a cancel waits for the boundary's export: the run's last export is its
                    # last boundary's, acknowledged
                    cancellable=not workflow.patched(CHECKPOINT_COMPLETES_PATCH),
                )
            except ActivityError as exc:
                missing, head = missing_state(exc)
                if missing and attempt == 1 and await self.restore(state, head):
                    continue
                cause = exc.cause
                kind = cause.type if isinstance(cause, ApplicationError) else None
                if save is not None and kind not in EXPORT_FAILURE_TYPES and not missing:
                    state.journal.record_persistence_failure(
                        "save", failure_message(exc), state.turn, now_ms()
                    )
                state.journal.record_export_failure(
                    turn, failure_detail(exc) or "", failure_message(exc), now_ms()
                )
                return
            if save is not None:
                state.journal.mark_stored()
            state.journal.record_export(descriptor, plan.export_sink, sent, state.turn, now_ms())
            return

    def _save_input(self, state: LoopState) -> SaveCheckpointInput | None:
        """The entries the store lacks, what an activity staged named by its digest."""
        entries = state.journal.unstored()
        if not entries:
            return None
        newest, staged = entries[-1].delta.staged(state.journal.staged_ids, state.journal.staged_messages)
        wire = (*entries[:-1], entries[-1].model_copy(update={"delta": newest}))
        return SaveCheckpointInput(run_id=state.plan.run_id, entries=wire, staged=staged)

    async def keep(self, state: LoopState) -> None:
        """Save what is new without an export (exports are made at tool boundaries): before a
        run waits for a person's next prompt, so that a conversation's turns without tool
        calls reach the store, and no model request carries them again as unsaved."""
        if state.journal.take_entry() is not None:
            await self.save(state)

    async def save(self, state: LoopState) -> None:
        """Send the store the entries it lacks; what an activity staged goes by its digest."""
        save = self._save_input(state)
        if save is None:
            return
        try:
            await self._calls.run(
                SAVE_CHECKPOINT,
                save,
                summary=f"save checkpoint turn {state.turn}",
                timeouts=state.plan.timeouts,
            )
        except ActivityError as exc:
            missing, head = missing_state(exc)
            if not missing:
                state.journal.record_persistence_failure("save", failure_message(exc), state.turn, now_ms())
            else:
                await self.restore(state, head)
            return
        state.journal.mark_stored()

    async def restore(self, state: LoopState, head: LogRef | None) -> bool:
        """Bring a store that lacks part of the run's log up to date, from this execution's history.

        ``False`` when the store failed (recorded; a later step tries again);
        ``RunFailed`` when the state is gone for good: the run cannot go on.
        """
        entries = state.journal.entries_after(head)
        seed = None
        if entries is None:  # it lacks even the state this execution started from
            seed = state.journal.seed_export
            entries = list(state.journal.entries)
            if seed is None:
                lost(
                    state,
                    f"run {state.plan.run_id}: its state before log version {state.journal.seed.version} "
                    "is in neither the session store nor an export it could be read from",
                )
        self._display.details(f"restoring the run's log in the store ({len(entries)} entries)", state)
        try:
            for index, batch in enumerate(batches(entries)):
                await self._calls.run(
                    SAVE_CHECKPOINT,
                    SaveCheckpointInput(
                        run_id=state.plan.run_id,
                        entries=tuple(batch),
                        header=state.journal.header() if index == 0 else None,
                        seed=seed if index == 0 else None,
                    ),
                    summary=f"restore run log up to version {state.journal.head.version}",
                    timeouts=state.plan.timeouts,
                )
        except ActivityError as exc:
            if isinstance(exc.cause, ApplicationError) and exc.cause.type == STATE_LOST:
                newest = state.journal.last_export
                if newest is not None and newest.descriptor != (seed.descriptor if seed else None):
                    d = newest.descriptor  # more of the run than the export it started from
                    lost(
                        state,
                        f"{failure_message(exc)} (or from its newest, turn {d.turn}: {d.content_digest})",
                    )
                lost(state, failure_message(exc))
            state.journal.record_persistence_failure(
                "save", f"restore: {failure_message(exc)}", state.turn, now_ms()
            )
            return False
        state.journal.mark_stored()
        return True

    async def reading_log(self, state: LoopState, call: Callable[[], Awaitable[T]]) -> T:
        """Run an activity that reads the run's log; restore the log once should the store lack it."""
        try:
            return await call()
        except ActivityError as exc:
            missing, head = missing_state(exc)
            if not missing or not await self.restore(state, head):
                raise
        return await call()

    async def finish(self, state: LoopState) -> None:
        """Keep the ended run in its session and drop its log from the store."""
        try:
            await self.reading_log(
                state,
                lambda: self._calls.run(
                    FINISH_RUN,
                    state.journal.finish_input(state.status, state.final_text, state.error),
                    summary=f"finish run ({state.status}): drop its log",
                    timeouts=state.plan.timeouts,
                    # the run's end reaches the store even when a cancel ended the run
                    cancellable=False,
                    # local only where its record's time is fixed by the history (``StepClock``)
                    local=self.local_bookends and stamps_fixed(),
                ),
            )
        except (ActivityError, RunFailed, RunCancelled) as exc:
            # a restore of a lost store, which a cancel stops, is the one way a cancel gets here
            reason = failure_message(exc) if isinstance(exc, ActivityError) else str(exc) or "cancelled"
            state.journal.record_finish_failure(reason)
