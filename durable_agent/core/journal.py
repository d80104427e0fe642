"""A run's journal: its log as this execution writes it, and what the store and the sink took.

It numbers the run's events, gathers what is new since the log's last entry (messages,
tool results, events), and turns that into the next entry of the run's log
(``durable_agent.core.run_log``), under the log's header. It keeps the entries of the
current execution, so the workflow can send them again to a store that lost them, and the
answers of the store and the export sink: the exports delivered, the failures the run went
on after. It measures the log too, as the model's requests hold it: the context ledger
(``durable_agent.core.context``) follows each entry, and each view and usage report it
takes is an event of the log. The loop (``durable_agent.core.loop``) holds one and hands it
each change; tests drive it without a server.
"""

from __future__ import annotations

from typing import Literal, TypedDict

from durable_agent.core import legacy_shapes
from durable_agent.core.activity_api import FinishRunInput
from durable_agent.core.context import ContextLedger, fixed_tokens
from durable_agent.core.events import (
    AgentEvent,
    CheckpointExportedEvent,
    CheckpointExportFailedEvent,
    ContextCompactedEvent,
    EventRecord,
    ModelUsageEvent,
    PersistenceFailedEvent,
    TextDeltaEvent,
)
from durable_agent.core.export import ExportDescriptor, RunStatus
from durable_agent.core.models import Message, TextBlock, TokenUsage, ToolResultBlock
from durable_agent.core.plan import RunPlan
from durable_agent.core.run_api import CarriedState, ExportFailure, ExportRef
from durable_agent.core.run_log import ExportSeed, LogDelta, LogEntry, LogRef, RunHeader

# How many of its newest events a run carries into its next execution, for followers that lag.
CARRIED_EVENTS = 64


class CarriedJournal(TypedDict):
    """The journal's part of a ``CarriedState``: the log's start and reference, the newest
    events, the store's and the sink's answers, and the context ledger."""

    created_at_ms: int
    prior_run_ids: tuple[str, ...]
    log: LogRef
    seed: ExportSeed | None
    events: tuple[EventRecord, ...]
    event_count: int
    pending_events: tuple[EventRecord, ...]
    exports: tuple[ExportRef, ...]
    export_failures: tuple[ExportFailure, ...]
    persistence_failures: tuple[str, ...]
    context: ContextLedger | None


class RunJournal:
    """One run's log header, numbered events and log entries of this execution, the context
    ledger that follows them, and what the store and the export sink answered."""

    def __init__(self, plan: RunPlan, created_at_ms: int, seed: LogRef, messages: list[Message]) -> None:
        """The journal of ``plan``'s run, started at ``created_at_ms``, in an execution that
        starts from the log at ``seed`` (which the store, or the run's last export, holds) with
        ``messages`` not in it yet."""
        self.plan = plan
        self.created_at_ms = created_at_ms
        self.prior_run_ids: tuple[str, ...] = ()  # the session's ended runs, for the exports' snapshot
        self.updated_at_ms = created_at_ms  # when the newest event happened
        self.events: list[EventRecord] = []  # the newest events: this execution's and those carried
        self.event_count = 0
        self.seed = seed
        self.head = seed  # the newest entry
        self.stored = seed  # the newest entry the store acknowledged
        self.entries: list[LogEntry] = []  # this execution's entries, oldest first
        self._new_messages: list[Message] = messages
        # for the last message already in the log: tool results, then a user's text
        self._new_results: list[ToolResultBlock | TextBlock] = []
        self._new_events: list[EventRecord] = []
        # what the tool and model activities kept in the store since the last save
        self.staged_ids: set[str] = set()
        self.staged_messages: set[str] = set()
        self.exports: list[ExportRef] = []
        self.export_failures: list[ExportFailure] = []
        self.persistence_failures: list[str] = []
        self.last_export: ExportSeed | None = None  # the newest export this run delivered
        self.seed_export: ExportSeed | None = None  # the export that holds this execution's seed
        self.context: ContextLedger | None = None  # the ledger at the log's head, for a managed run

    @classmethod
    def from_export(cls, plan: RunPlan, created_at_ms: int, seed: ExportSeed) -> RunJournal:
        """The journal of a run that starts from the conversation of the export ``seed``: it
        goes to the store as the log's first version, not through the workflow's history."""
        journal = cls(plan, created_at_ms, seed.log, [])
        journal.stored = LogRef(run_id=plan.run_id, version=0)
        journal.seed_export = seed
        return journal

    @classmethod
    def carried(cls, carried: CarriedState, entries: tuple[LogEntry, ...] = ()) -> RunJournal:
        """The journal a run carried into this execution; ``entries``: the execution's first
        entries, when the run carried its state whole (``legacy_shapes.carried_whole``)."""
        assert carried.log is not None and carried.event_count is not None
        journal = cls(carried.plan, carried.created_at_ms, carried.log, [])
        journal.prior_run_ids = carried.prior_run_ids
        if carried.events:
            journal.updated_at_ms = carried.events[-1].timestamp_ms
        journal.events = list(carried.events)
        journal.event_count = carried.event_count
        journal._new_events = list(carried.pending_events)
        journal.exports = list(carried.exports)
        journal.export_failures = list(carried.export_failures)
        journal.persistence_failures = list(carried.persistence_failures)
        journal.last_export = journal.seed_export = carried.seed
        journal.context = carried.context if carried.plan.context is not None else None
        for entry in entries:
            journal.entries.append(entry)
            journal.head = entry.ref(journal.plan.run_id)
        return journal

    def carry(self) -> CarriedJournal:
        """What the next execution needs of this journal (``can_carry`` must hold)."""
        newest = self.last_export
        return CarriedJournal(
            log=self.head,
            seed=newest if newest and newest.log == self.head else None,
            created_at_ms=self.created_at_ms,
            prior_run_ids=self.prior_run_ids,
            events=tuple(self.events[-CARRIED_EVENTS:]),
            event_count=self.event_count,
            pending_events=tuple(self._new_events),
            exports=tuple(self.exports),
            export_failures=tuple(self.export_failures),
            persistence_failures=tuple(self.persistence_failures),
            context=self.context,
        )

    def can_carry(self) -> bool:
        """Whether the store holds every entry, so the next execution can start from a reference."""
        return self.stored == self.head and not self._new_messages and not self._new_results

    def header(self) -> RunHeader:
        """What does not change while the run runs, kept next to its log."""
        plan = self.plan
        return RunHeader(
            session_id=plan.session_id,
            run_id=plan.run_id,
            prompt=plan.prompt,
            tools=tuple(plan.definitions()),
            capability_binding=plan.capability_binding,
            system_prompt=plan.system_prompt,
            resumed_from=plan.resumed_from,
            created_at_ms=self.created_at_ms,
            prior_run_ids=self.prior_run_ids,
        )

    # --- recording ----------------------------------------------------------

    def emit(self, event: AgentEvent, now_ms: int) -> EventRecord:
        """Record ``event`` as the run's next, at ``now_ms``; the record with its sequence."""
        self.event_count += 1
        record = EventRecord(sequence=self.event_count, timestamp_ms=now_ms, event=event)
        self.events.append(record)
        self._new_events.append(record)
        self.updated_at_ms = now_ms
        return record

    def add_message(self, message: Message, staged: str | None = None) -> None:
        """A new message of the conversation; ``staged``: its digest, when the model activity
        kept it in the store."""
        self._new_messages.append(message)
        if staged is not None:
            self.staged_messages.add(staged)

    def add_user_block(self, block: ToolResultBlock | TextBlock, *, join: bool, staged: bool = False) -> None:
        """``block`` in a user message: a new one, or (``join``) the last one, whether it is
        new since the last save or already in the log. ``staged``: the tool activity kept the
        result's output in the store, so the next save can name it by digest."""
        if staged and isinstance(block, ToolResultBlock):
            self.staged_ids.add(block.tool_use_id)
        if not join:
            self._new_messages.append(Message(role="user", content=(block,)))
        elif self._new_messages:
            last = self._new_messages[-1]
            self._new_messages[-1] = Message(role="user", content=(*last.content, block))
        else:
            self._new_results.append(block)

    # --- the log's entries --------------------------------------------------

    def pending(self) -> LogDelta:
        """What is new since the last entry."""
        return LogDelta(
            extend_last=tuple(self._new_results),
            messages=tuple(self._new_messages),
            events=tuple(self._new_events),
        )

    def take_entry(self) -> LogEntry | None:
        """Turn what is new into the log's next entry (``None`` when nothing is)."""
        delta = self.pending()
        if delta.is_empty():
            return None
        entry = LogEntry.after(self.head, delta)
        self.entries.append(entry)
        self.head = entry.ref(self.plan.run_id)
        if self.context is not None:
            self.context = self.context.applied(delta.extend_last, delta.messages)
        self._new_messages, self._new_results, self._new_events = [], [], []
        return entry

    def mark_stored(self) -> None:
        """The store acknowledged every entry."""
        self.stored = self.head
        self.staged_ids.clear()
        self.staged_messages.clear()

    def unstored(self) -> list[LogEntry]:
        """Entries the store has not acknowledged (normally just the newest)."""
        return [e for e in self.entries if e.version > self.stored.version]

    def entries_after(self, head: LogRef | None) -> list[LogEntry] | None:
        """What a store whose log ends at ``head`` lacks, or ``None`` when this execution's
        entries cannot bring it up to date (it lacks the state the execution started from)."""
        if head is not None and head.version <= self.head.version:
            if head == self.seed:
                return list(self.entries)
            for index, entry in enumerate(self.entries):
                if entry.version == head.version and entry.digest == head.digest:
                    return self.entries[index + 1 :]
        if self.seed.version == 0 or (self.entries and self.entries[0].delta.replace):
            return list(self.entries)
        return None

    def events_after(self, sequence: int) -> list[EventRecord]:
        """The events with a sequence above ``sequence`` that this execution holds."""
        if not self.events:
            return []
        start = max(0, sequence - self.events[0].sequence + 1)
        return self.events[start:]

    def finish_input(self, status: RunStatus, result_text: str, error: str | None) -> FinishRunInput:
        """The end of the run (``status``, its answer ``result_text``, its ``error``), on top of
        what the store holds: the events it lacks."""
        unstored = [r for e in self.unstored() for r in e.delta.events]
        events = (*unstored, *self._new_events)
        texts = [r.event for r in events if isinstance(r.event, TextDeltaEvent)]
        in_events = bool(result_text) and bool(texts) and texts[-1].text == result_text
        return FinishRunInput(
            log=self.stored,
            events=events,
            status=status,
            updated_at_ms=self.updated_at_ms,
            result_text=None if in_events else result_text or None,
            error=error,
            result_is_last_text=in_events,
            session_id=self.plan.session_id,
        )

    # --- what the model's requests hold of the log ---------------------------------

    def start_context(self, seed: ContextLedger | None, now_ms: int) -> None:
        """The ledger of a new run (with a resumed run's view and usage report); a resumed
        run's view goes on, re-emitted as its own ``context_compacted`` event."""
        policy = self.plan.context
        if policy is not None:
            self.context = seed if seed is not None else ContextLedger()
        if seed is not None and seed.view.version > 0:
            now = self.context_now()
            size = now.estimate(self.context_fixed()) if now is not None else 0
            event = ContextCompactedEvent(
                tier="resumed",
                reason="resumed",
                view=seed.view,
                tokens_before=size,
                tokens_after=size,
                window=policy.window if policy is not None else 0,
            )
            self.emit(event, now_ms)

    def context_now(self) -> ContextLedger | None:
        """The ledger with what is not saved yet: what the next model request holds."""
        if self.context is None:
            return None
        delta = self.pending()
        return self.context.applied(delta.extend_last, delta.messages)

    def context_fixed(self) -> int:
        """The estimate of what every request holds besides messages: system prompt, tools."""
        return fixed_tokens(self.plan.system_prompt, self.plan.definitions())

    def record_view(self, event: ContextCompactedEvent, now_ms: int) -> None:
        """The model's view changed: ``event.view`` from now on."""
        if self.context is not None:
            self.context = self.context.compacted(event.view)
        self.emit(event, now_ms)

    def record_model_usage(self, usage: TokenUsage, now_ms: int) -> None:
        """A managed run's ``model_usage`` event, before the model's message joins the log: the
        provider's count (``usage``) against the estimate."""
        ledger = self.context_now()
        if ledger is None or self.context is None:
            return
        estimate = ledger.estimate(self.context_fixed())
        self.context = self.context.answered(usage.prompt_tokens, estimate)
        event = ModelUsageEvent(
            step=self.context.steps,
            usage=usage,
            estimated_tokens=estimate,
            view_version=self.context.view.version,
        )
        self.emit(event, now_ms)

    def context_status(self) -> dict[str, int]:
        """A managed run's context figures for its status: compactions, tokens, window."""
        ledger, policy = self.context_now(), self.plan.context
        if ledger is None or policy is None:
            return {}
        return {
            "compactions": ledger.compactions,
            "context_tokens": ledger.size(self.context_fixed()),
            "context_window": policy.window,
        }

    # --- what the store and the sink answered --------------------------------------

    def record_opened(self, prior_run_ids: tuple[str, ...]) -> None:
        """The store holds the run's log so far and named the session's ended runs
        (for the exports' snapshot)."""
        self.prior_run_ids = prior_run_ids
        self.mark_stored()

    def record_export(
        self, descriptor: ExportDescriptor | None, sink: str, log: LogRef, turn: int, now_ms: int
    ) -> None:
        """The sink acknowledged the export of the log at ``log``, made at ``turn``: the newest
        export, which a later execution may start from. ``None``: see
        ``durable_agent.core.legacy_shapes``."""
        if descriptor is None:
            ref = legacy_shapes.unbuilt_export(turn)
        else:
            self.last_export = ExportSeed(sink=sink, descriptor=descriptor, log=log)
            ref = ExportRef(turn=turn, content_digest=descriptor.content_digest)
        self.exports.append(ref)
        self.emit(CheckpointExportedEvent(turn=ref.turn, content_digest=ref.content_digest), now_ms)

    def record_export_failure(self, turn: int, digest: str, reason: str, now_ms: int) -> None:
        """The export of ``turn`` failed for good; the run goes on (the next boundary exports again)."""
        self.export_failures.append(ExportFailure(turn=turn, content_digest=digest, reason=reason))
        self.emit(CheckpointExportFailedEvent(turn=turn, content_digest=digest, reason=reason), now_ms)

    def record_persistence_failure(
        self, operation: Literal["save", "load"], reason: str, turn: int, now_ms: int
    ) -> None:
        """The session store failed at ``turn``; the run goes on (a later save sends what it lacks)."""
        self.persistence_failures.append(f"turn {turn}: {operation} failed: {reason}")
        self.emit(PersistenceFailedEvent(turn=turn, operation=operation, reason=reason), now_ms)

    def record_finish_failure(self, reason: str) -> None:
        """The store did not take the run's end. After ``finish`` there is no event to add:
        the result and the status carry it."""
        self.persistence_failures.append(f"finish failed: {reason}")
