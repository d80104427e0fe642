"""The activities that keep a run's log in the session store and hand its exports to sinks.

Split from ``activities/agent.py`` to keep each module small; ``AgentActivities``
is built on ``RunLogActivities``.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from pydantic import ValidationError
from temporalio import activity
from temporalio.exceptions import ApplicationError

from activities.run_state import RunStates
from activities.sinks import ExportSink, SinkError, read_export_file
from activities.store import SessionStore
from activities.support import heartbeating, state_missing, usage_error
from durable_agent.checkpoint import (
    ExportDescriptor,
    ExportError,
    ResumedFrom,
    RunRecord,
    SessionCheckpointExportV1,
)
from durable_agent.models import TextDeltaEvent
from durable_agent.run_io import (
    ACTIVITY_EXPORT,
    ACTIVITY_FINISH_RUN,
    ACTIVITY_LOAD_SESSION,
    ACTIVITY_OPEN_RUN,
    ACTIVITY_READ_RESUME,
    ACTIVITY_SAVE_CHECKPOINT,
    ExportInput,
    ExportSeed,
    FinishRunInput,
    LegacyExportInput,
    LegacyFinishRunInput,
    LegacySaveCheckpointInput,
    LoadSessionInput,
    OpenRunInput,
    ResumeFileInput,
    ResumePoint,
    RunOpened,
    SaveCheckpointInput,
    SessionRuns,
)
from durable_agent.run_log import (
    GENESIS,
    STATE_LOST,
    LogDelta,
    LogEntry,
    LogRef,
    Staged,
    StateMissing,
    build_export,
    ends_in_results,
    run_snapshot,
    text_digest,
    unanswered_calls,
)


class RunLogActivities:
    """The session store's and the sinks' side of a run (see ``durable_agent.run_log``)."""

    store: SessionStore
    states: RunStates
    sinks: dict[str, ExportSink]

    @activity.defn(name=ACTIVITY_OPEN_RUN)
    async def open_run(self, inp: OpenRunInput) -> RunOpened:
        """Start the run's log: its header, with the session's ended runs, and its first entry."""
        header = inp.header
        stored = await self.store.load_header(header.run_id)
        if stored is not None:  # a repeat: the first attempt already chose the prior runs
            prior = stored.prior_run_ids
        else:
            records = await heartbeating(self.store.load_run_records(header.session_id))
            prior = tuple(r.snapshot.id for r in records if r.snapshot.id != header.run_id)
        await self.states.save_header(header.model_copy(update={"prior_run_ids": prior}))
        try:
            entries = [inp.seed]
            if inp.resumed is not None:
                entries.insert(0, await self._seed_from_export(header.run_id, inp.resumed))
            await heartbeating(self.states.append(header.run_id, entries))
        except StateMissing as exc:
            raise state_missing(exc) from None
        return RunOpened(prior_run_ids=prior)

    @activity.defn(name=ACTIVITY_SAVE_CHECKPOINT)
    async def save_checkpoint(self, inp: SaveCheckpointInput | LegacySaveCheckpointInput) -> None:
        """Append entries to the run's logical checkpoint in the session store, durably."""
        if isinstance(inp, LegacySaveCheckpointInput):
            # a whole checkpoint, from a worker before linear history: the workflow, on this
            # code now, finds its log missing when it next reads it and sends it again
            return
        try:
            if inp.header is not None:
                await self.states.save_header(inp.header)
            # only the newest entry names what was staged; the others come whole
            entries = [await self._unstage(inp, e, e is inp.entries[-1]) for e in inp.entries]
            if inp.seed is not None:
                entries.insert(0, await self._seed_from_export(inp.run_id, inp.seed))
            await heartbeating(self.states.append(inp.run_id, entries))
        except StateMissing as exc:
            raise state_missing(exc) from None

    async def _unstage(self, inp: SaveCheckpointInput, entry: LogEntry, newest: bool) -> LogEntry:
        """The entry with what the tool and model activities staged put back, checked against its digest."""
        if inp.staged and newest:
            texts: dict[Staged, str] = {}
            for part in inp.staged:
                text = await self.store.staged_text(inp.run_id, part.digest)
                if text is None or text_digest(text) != part.digest:
                    head = await self.store.log_head(inp.run_id)
                    raise StateMissing(f"the store does not hold the staged {part.kind} {part.key}", head)
                texts[part] = text
            entry = entry.model_copy(update={"delta": entry.delta.unstaged(texts)})
        if entry.delta.chained(entry.parent) != entry.digest:
            raise ApplicationError(
                f"log entry {entry.version} of run {inp.run_id!r} does not match its digest",
                type="InvalidLogEntry",
                non_retryable=True,
            )
        return entry

    async def _seed_from_export(self, run_id: str, seed: ExportSeed) -> LogEntry:
        """The state a run started from, read back from the export that holds it."""
        export = await self._read_seed(seed)
        if export is None:
            where = f"sink {seed.sink!r}" if seed.sink else f"file {seed.path!r} on this worker"
            raise ApplicationError(
                f"run {run_id!r}: its state at turn {seed.descriptor.turn} is in neither the session "
                f"store nor {where} (export {seed.descriptor.content_digest}); "
                "resume from that export with `durable-agent resume`",
                type=STATE_LOST,
                non_retryable=True,
            )
        if export.descriptor.content_digest != seed.descriptor.content_digest:
            raise StateMissing(f"the export found is not {seed.descriptor.content_digest}")
        payload = export.open()
        events = () if seed.resumed else payload.source_run().events  # a resumed run has its own
        whole = LogDelta(replace=True, messages=payload.logical_resume.messages, events=events)
        return LogEntry(version=seed.log.version, parent="", digest=seed.log.digest, delta=whole)

    async def _read_seed(self, seed: ExportSeed) -> SessionCheckpointExportV1 | None:
        if seed.path is not None:
            try:
                return await asyncio.to_thread(read_export_file, Path(seed.path))
            except FileNotFoundError:
                return None
        fetch = getattr(self.sinks.get(seed.sink or ""), "fetch", None)
        return await fetch(seed.descriptor) if fetch is not None else None

    @activity.defn(name=ACTIVITY_READ_RESUME)
    async def read_resume(self, inp: ResumeFileInput) -> ResumePoint:
        """Validate an export file on this worker and say what a run resumed from it needs;
        its conversation stays here, for ``agent.open_run`` to put in the store."""
        try:
            export = await asyncio.to_thread(read_export_file, Path(inp.path))
            payload = await heartbeating(asyncio.to_thread(export.open))
        except (OSError, ValidationError, ExportError) as exc:
            kind = type(exc).__name__
            raise usage_error(f"resume_from_file {inp.path!r} is refused: {kind}: {exc}") from None
        logical, d = payload.logical_resume, export.descriptor
        conversation = LogDelta(replace=True, messages=logical.messages)
        return ResumePoint(
            seed=ExportSeed(
                path=inp.path,
                descriptor=d,
                log=LogRef(run_id=inp.run_id, version=1, digest=conversation.chained(GENESIS)),
                resumed=True,
            ),
            resumed_from=ResumedFrom(
                session_id=logical.session_id,
                run_id=logical.run_id,
                turn=logical.turn,
                content_digest=d.content_digest,
            ),
            capability_binding=logical.capability_binding,
            prompt=payload.source_run().snapshot.prompt,
            usage=logical.total_usage,
            due_calls=tuple(unanswered_calls(list(logical.messages))),
            open_results=ends_in_results(list(logical.messages)),
        )

    @activity.defn(name=ACTIVITY_LOAD_SESSION)
    async def load_session(self, inp: LoadSessionInput) -> SessionRuns:
        """The session's ended runs (other than this one), oldest first.

        Called by runs recorded before ``agent.open_run`` existed; kept for them.
        """
        records = await heartbeating(self.store.load_run_records(inp.session_id))
        return SessionRuns(records=tuple(r for r in records if r.snapshot.id != inp.run_id))

    @activity.defn(name=ACTIVITY_FINISH_RUN)
    async def finish_run(self, inp: FinishRunInput | LegacyFinishRunInput) -> None:
        """Keep the ended run's record in its session, then drop its log."""
        if isinstance(inp, LegacyFinishRunInput):  # the whole record, from an older worker
            await heartbeating(self.store.save_run_record(inp.record))
            await heartbeating(self.states.drop(inp.record.snapshot.id))
            return
        try:
            header = await self.states.header(inp.log.run_id)
            run_log = await self.states.read(inp.log)
        except StateMissing as exc:
            raise state_missing(exc) from None
        events = (*run_log.events, *inp.events)
        result_text = inp.result_text
        if inp.result_is_last_text:
            texts = [r.event.text for r in inp.events if isinstance(r.event, TextDeltaEvent)]
            result_text = texts[-1] if texts else None
        snapshot = run_snapshot(header, events, inp.status, inp.updated_at_ms, result_text, inp.error)
        await heartbeating(self.store.save_run_record(RunRecord(snapshot=snapshot, events=events)))
        await heartbeating(self.states.drop(inp.log.run_id))

    @activity.defn(name=ACTIVITY_EXPORT)
    async def export_checkpoint(self, inp: ExportInput | LegacyExportInput) -> ExportDescriptor:
        """Build the boundary's export from the run's log and hand it to the sink; return only
        once the sink holds it."""
        sink = self.sinks.get(inp.sink)
        if sink is None:
            raise ApplicationError(f"export sink {inp.sink!r} is not configured", non_retryable=True)
        try:
            if isinstance(inp, LegacyExportInput):  # built by a workflow before linear history
                export = inp.export
                export.open()
            else:
                export = await self._build_export(inp)
        except ExportError as exc:
            raise ApplicationError(
                f"export failed its own validation: {exc}", type=type(exc).__name__, non_retryable=True
            ) from exc
        try:
            await heartbeating(sink.deliver(export))
        except SinkError as exc:
            raise ApplicationError(
                f"sink {inp.sink!r}: {exc}",
                export.descriptor.content_digest,  # the failure names the export it could not deliver
                type="SinkError",
                non_retryable=not exc.retryable,
            ) from exc
        return export.descriptor

    async def _build_export(self, inp: ExportInput) -> SessionCheckpointExportV1:
        try:
            header = await self.states.header(inp.log.run_id)
            run_log = await self.states.read(inp.log)
        except StateMissing as exc:
            raise state_missing(exc) from None
        return build_export(header, run_log, await self.states.prior_runs(header), inp.facts)
