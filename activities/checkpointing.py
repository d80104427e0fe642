"""The run's log in the session store, and its exports handed to sinks: ``agent.open_run``,
``agent.read_resume``, ``agent.checkpoint``, ``agent.save_checkpoint``,
``agent.export_checkpoint`` and ``agent.finish_run``.

The last three also take the inputs that workers before linear history queued
(``durable_agent.core.legacy_shapes``), each handed in its first lines to the legacy adapter beside
it; ``activities/legacy_sessions.py`` lists the legacy inputs and when they go.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from pydantic import ValidationError
from temporalio import activity
from temporalio.exceptions import ApplicationError

from durable_agent.activities.sinks import ExportSink, FetchingSink, PartedSink, SinkError, read_export_file
from durable_agent.activities.staging import filled_images, staged_text
from durable_agent.activities.store.run_log_cache import RunLogCache
from durable_agent.activities.store.session_store import SessionStore
from durable_agent.activities.support import heartbeating, state_missing, usage_error
from durable_agent.core.activity_api import (
    CHECKPOINT,
    EXPORT_CHECKPOINT,
    FINISH_RUN,
    OPEN_RUN,
    READ_RESUME,
    SAVE_CHECKPOINT,
    CheckpointInput,
    ExportInput,
    FinishRunInput,
    OpenRunInput,
    ResumeFileInput,
    ResumePoint,
    RunOpened,
    SaveCheckpointInput,
)
from durable_agent.core.context import ContextLedger
from durable_agent.core.events import TextDeltaEvent
from durable_agent.core.export import (
    ExportDescriptor,
    ExportError,
    ResumedFrom,
    RunRecord,
    SessionCheckpointExportV1,
    workspace_origin_of,
    workspace_tree_of,
)
from durable_agent.core.export_parts import PartedExport, hash_pieces
from durable_agent.core.failures import INVALID_LOG_ENTRY, SINK_ERROR, STATE_LOST
from durable_agent.core.legacy_shapes import (
    LegacyExportInput,
    LegacyFinishRunInput,
    LegacySaveCheckpointInput,
)
from durable_agent.core.run_log import (
    GENESIS,
    ExportSeed,
    LogDelta,
    LogEntry,
    LogRef,
    Staged,
    StateMissing,
    ends_in_results,
    export_payload,
    run_snapshot,
    unanswered_calls,
)
from durable_agent.core.todo_list import plan_at_checkpoint
from durable_agent.telemetry_spans import ActivityTelemetry


@dataclass(eq=False)
class RunLogs:
    """The session store's and the sinks' side of a run (see ``durable_agent.core.run_log``)."""

    store: SessionStore
    log_cache: RunLogCache
    sinks: Mapping[str, ExportSink]
    telemetry: ActivityTelemetry = field(default_factory=ActivityTelemetry)

    @activity.defn(name=OPEN_RUN.name)
    async def open_run(self, inp: OpenRunInput) -> RunOpened:
        """Start the run's log: its header, with the session's ended runs, and its first entry."""
        header = inp.header
        stored = await self.store.load_header(header.run_id)
        if stored is not None:  # a repeat: the first attempt already chose the prior runs
            prior = stored.prior_run_ids
        else:
            records = await heartbeating(self.store.load_run_records(header.session_id))
            prior = tuple(r.snapshot.id for r in records if r.snapshot.id != header.run_id)
        await self.log_cache.save_header(header.model_copy(update={"prior_run_ids": prior}))
        try:
            entries = [inp.seed]
            if inp.resumed is not None:
                entries.insert(0, await self._seed_from_export(header.run_id, inp.resumed))
            await heartbeating(self.log_cache.append(header.run_id, entries))
        except StateMissing as exc:
            raise state_missing(exc) from None
        return RunOpened(prior_run_ids=prior)

    @activity.defn(name=SAVE_CHECKPOINT.name)
    async def save_checkpoint(self, inp: SaveCheckpointInput | LegacySaveCheckpointInput) -> None:
        """``agent.save_checkpoint``: append entries to the run's logical checkpoint in the
        session store, durably. (A whole checkpoint, queued by a worker before linear history,
        writes nothing: the workflow, on this code now, finds its log missing when it next
        reads it and sends it again.)"""
        if isinstance(inp, LegacySaveCheckpointInput):  # legacy: goes in 0.3
            return
        try:
            entries = await self._entries(inp)
            await heartbeating(self.log_cache.append(inp.run_id, entries))
        except StateMissing as exc:
            raise state_missing(exc) from None

    async def _entries(self, inp: SaveCheckpointInput) -> list[LogEntry]:
        """The entries a save stores, whole and checked (the header saved first, when it is sent)."""
        if inp.header is not None:
            await self.log_cache.save_header(inp.header)
        # only the newest entry names what was staged; the others come whole
        entries = [await self._unstage(inp, e, e is inp.entries[-1]) for e in inp.entries]
        if inp.seed is not None:
            entries.insert(0, await self._seed_from_export(inp.run_id, inp.seed))
        return entries

    async def _unstage(self, inp: SaveCheckpointInput, entry: LogEntry, newest: bool) -> LogEntry:
        """The entry with what the tool and model activities staged put back, checked against its digest."""
        if inp.staged and newest:
            texts: dict[Staged, str] = {}
            for part in inp.staged:
                text = await staged_text(self.store, inp.run_id, part.digest)
                if text is None:
                    head = await self.store.log_head(inp.run_id)
                    raise StateMissing(f"the store does not hold the staged {part.kind} {part.key}", head)
                texts[part] = text
            entry = entry.model_copy(update={"delta": entry.delta.unstaged(texts)})
        if entry.delta.chained(entry.parent) != entry.digest:
            raise ApplicationError(
                f"log entry {entry.version} of run {inp.run_id!r} does not match its digest",
                type=INVALID_LOG_ENTRY,
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
        sink = self.sinks.get(seed.sink or "")
        return await sink.fetch(seed.descriptor) if isinstance(sink, FetchingSink) else None

    @activity.defn(name=READ_RESUME.name)
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
            # the same ledger and view the source run had, so the next request is the same
            context=ContextLedger.seeded(logical.messages, payload.source_run().events),
            workspace_tree=workspace_tree_of(payload.source_run().events),
            workspace_origin=workspace_origin_of(payload.source_run().events),
            todos=plan_at_checkpoint(payload),
        )

    @activity.defn(name=FINISH_RUN.name)
    async def finish_run(self, inp: FinishRunInput | LegacyFinishRunInput) -> None:
        """``agent.finish_run``: keep the ended run's record in its session, then drop its log.
        (The whole record, from a worker before linear history, goes to ``keep_record``.)"""
        if isinstance(inp, LegacyFinishRunInput):  # legacy: goes in 0.3
            await self.keep_record(inp.record)
            return
        try:
            header = await self.log_cache.header(inp.log.run_id)
            run_log = await self.log_cache.read(inp.log)
        except StateMissing as exc:
            if await self._finished_before(inp):
                return
            raise state_missing(exc) from None
        events = (*run_log.events, *inp.events)
        result_text = inp.result_text
        if inp.result_is_last_text:
            texts = [r.event.text for r in inp.events if isinstance(r.event, TextDeltaEvent)]
            result_text = texts[-1] if texts else None
        snapshot = run_snapshot(header, events, inp.status, inp.updated_at_ms, result_text, inp.error)
        await self.keep_record(RunRecord(snapshot=snapshot, events=events))

    async def _finished_before(self, inp: FinishRunInput) -> bool:
        """Whether an earlier attempt of this finish kept the run's record (and then dropped its
        log, timing out before it could say so)."""
        if inp.session_id is None:
            return False
        records = await self.store.load_run_records(inp.session_id)
        return any(r.snapshot.id == inp.log.run_id and r.snapshot.status == inp.status for r in records)

    async def keep_record(self, record: RunRecord) -> None:
        """Keep an ended run's record in its session, then drop its log."""
        await heartbeating(self.store.save_run_record(record))
        await heartbeating(self.log_cache.drop(record.snapshot.id))

    @activity.defn(name=CHECKPOINT.name)
    async def checkpoint(self, inp: CheckpointInput) -> ExportDescriptor:
        """A tool boundary: append what is new to the run's log, then hand the export of the
        log to the sink; return only once the sink holds it. Run as a local activity: the
        workflow goes on in the same workflow task.

        The export is built while the store writes (``RunLogCache.append_while``): the sink
        is handed it only once the store holds the boundary."""
        save = inp.save
        if save is None or inp.export.sink not in self.sinks:  # (no sink: saved, then refused)
            if save is not None:
                await self.save_checkpoint(save)
            return await self.export(inp.export)
        try:
            entries = await self._entries(save)
        except StateMissing as exc:
            raise state_missing(exc) from None

        async def saved_and_built() -> PartedExport:
            try:
                return await self.log_cache.append_while(
                    save.run_id, entries, lambda: self._build_export(inp.export)
                )
            except StateMissing as exc:  # the store's: the export's own is raised typed already
                raise state_missing(exc) from None

        return await self.deliver(inp.export.sink, lambda: heartbeating(saved_and_built()))

    @activity.defn(name=EXPORT_CHECKPOINT.name)
    async def export_checkpoint(self, inp: ExportInput | LegacyExportInput) -> ExportDescriptor | None:
        """``agent.export_checkpoint``, scheduled by workflows before one-task boundaries: the
        boundary's export, as ``export``. (``None`` is in the result type for results recorded
        before linear history; this worker never returns it. An export that a workflow before
        linear history built is checked, then handed to the sink as it is.)"""
        if isinstance(inp, LegacyExportInput):  # legacy: goes in 0.3
            built = inp.export

            async def checked() -> SessionCheckpointExportV1:
                built.open()
                return built

            return await self.deliver(inp.sink, checked)
        return await self.export(inp)

    async def export(self, inp: ExportInput) -> ExportDescriptor:
        """Build the boundary's export from the run's log and hand it to the sink; return only
        once the sink holds it."""
        return await self.deliver(inp.sink, lambda: self._build_export(inp))

    async def deliver(
        self, sink_name: str, export_of: Callable[[], Awaitable[SessionCheckpointExportV1 | PartedExport]]
    ) -> ExportDescriptor:
        """Hand the export ``export_of`` makes (validated) to the sink; return once the sink holds it.

        A sink that takes parts (``PartedSink``) gets them; any other gets the export whole.
        """
        sink = self.sinks.get(sink_name)
        if sink is None:
            raise ApplicationError(f"export sink {sink_name!r} is not configured", non_retryable=True)
        with self.telemetry.export(sink_name):
            return await self._deliver(sink, sink_name, export_of)

    async def _deliver(
        self,
        sink: ExportSink,
        sink_name: str,
        export_of: Callable[[], Awaitable[SessionCheckpointExportV1 | PartedExport]],
    ) -> ExportDescriptor:
        try:
            export = await export_of()
        except ExportError as exc:
            raise ApplicationError(  # typed by its class's name: one of ``EXPORT_FAILURE_TYPES``
                f"export failed its own validation: {exc}", type=type(exc).__name__, non_retryable=True
            ) from exc
        try:
            if isinstance(export, PartedExport) and isinstance(sink, PartedSink):
                await heartbeating(sink.deliver_parts(export))
            else:
                whole = await asyncio.to_thread(export.whole) if isinstance(export, PartedExport) else export
                await heartbeating(sink.deliver(whole))
        except SinkError as exc:
            raise ApplicationError(
                f"sink {sink_name!r}: {exc}",
                export.descriptor.content_digest,  # the failure names the export it could not deliver
                type=SINK_ERROR,
                non_retryable=not exc.retryable,
            ) from exc
        return export.descriptor

    async def _build_export(self, inp: ExportInput) -> PartedExport:
        """The export, encoding only what is new since the run's last one on this worker; its
        three digests taken on threads at once (each covers the whole content)."""
        try:
            header = await self.log_cache.header(inp.log.run_id)
            run_log = await self.log_cache.read(inp.log)
        except StateMissing as exc:
            raise state_missing(exc) from None
        # an export is portable: it holds the images whole, not the store's references to them
        messages = await filled_images(
            self.store, header.run_id, run_log.messages, self.log_cache.filled(header.run_id), whole_log=True
        )
        payload = export_payload(
            header, run_log, await self.log_cache.prior_runs(header), inp.facts, messages
        )
        draft = self.log_cache.encoder(inp.log.run_id).draft(payload)
        content, logical, snapshot = await asyncio.gather(
            *(asyncio.to_thread(hash_pieces, stream) for stream in draft.streams())
        )
        return draft.finish(content, logical[0], snapshot[0])
