"""The agent loop's state and step logic, as pure functions of what happened.

The workflow feeds it model responses and tool outputs with workflow time; it
keeps the counters and the newest events, and turns what is new at each save
into the next entry of the run's log (``durable_agent.core.run_log``). It keeps
the entries of the current execution too, so the workflow can send them again
to a store that lost them. Tests drive it without a server.

The workflow changes a ``LoopState`` only through its methods (``add_*``,
``record_*``, ``emit``, ...), each of which records the event that goes with
the change, so no change goes unrecorded; ``tests/test_loop_state_writes.py``
holds ``workflows/`` to that.
"""

from __future__ import annotations

from typing import Literal

from durable_agent.core import legacy_shapes
from durable_agent.core.activity_api import FinishRunInput, ResumePoint
from durable_agent.core.canonical import digest_of
from durable_agent.core.context import ContextLedger, fixed_tokens
from durable_agent.core.export import ExportDescriptor, LoopCheckpoint, RunStatus
from durable_agent.core.models import (
    AgentEvent,
    BudgetExhaustedEvent,
    CheckpointExportedEvent,
    CheckpointExportFailedEvent,
    ContextCompactedEvent,
    EndEvent,
    EventRecord,
    ImageBlock,
    Message,
    ModelResponse,
    ModelUsageEvent,
    PersistenceFailedEvent,
    RunStartEvent,
    TextBlock,
    TextDeltaEvent,
    ThinkingEvent,
    TokenUsage,
    ToolEndEvent,
    ToolResultBlock,
    ToolUseBlock,
    UserMessageEvent,
    usage_cost_usd,
)
from durable_agent.core.plan import RunPlan
from durable_agent.core.run_api import (
    AWAITING_APPROVAL,
    AWAITING_PROMPT,
    AgentRunResult,
    Budget,
    CarriedState,
    ExportFailure,
    ExportRef,
    FinalStatus,
    PendingApproval,
    RunStatusView,
)
from durable_agent.core.run_log import (
    ExportFacts,
    ExportSeed,
    LogDelta,
    LogEntry,
    LogRef,
    RunHeader,
    ends_in_results,
    unanswered_calls,
)

# How many of its newest events a run carries into its next execution, for followers that lag.
CARRIED_EVENTS = 64


class LoopState:
    """One run's counters, newest events, and the log entries of this execution."""

    def __init__(
        self,
        plan: RunPlan,
        now_ms: int,
        *,
        resume: LoopCheckpoint | None = None,
        point: ResumePoint | None = None,
        context: ContextLedger | None = None,
    ) -> None:
        """A new run of ``plan``; with ``resume``, one that goes on from that checkpoint's
        conversation; with ``point``, from the conversation of an export file on the worker.
        ``context``: the resumed run's view and last usage report (its messages are measured
        as they enter the log); a ``point`` brings its own."""
        self._counters(plan, now_ms, ())
        self._due_calls: list[ToolUseBlock]
        self._last_role: Literal["user", "assistant"]
        self.seed_export: ExportSeed | None  # the export that holds this execution's seed
        if point is not None:
            # the file's conversation goes to the store as log version 1, not through the history
            self._start_log(point.seed.log, [])
            self.stored = LogRef(run_id=plan.run_id, version=0)
            self.seed_export = point.seed
            self.usage, self.open_results = point.usage, point.open_results
            self._due_calls = list(point.due_calls)
            # an export is made at a tool boundary: its conversation ends in tool results
            self._last_role = "user" if point.open_results else "assistant"
        else:
            if resume is None:
                first = [Message(role="user", content=(TextBlock(text=plan.prompt),))]
            else:
                first = list(resume.messages)
            # a resumed conversation's running total goes on: it is what the conversation cost
            self.usage = resume.total_usage if resume is not None else TokenUsage()
            self._start_log(LogRef(run_id=plan.run_id, version=0), first)
            self.open_results = ends_in_results(first)
            self._due_calls = unanswered_calls(first)
            self._last_role = first[-1].role if first else "user"
        source = plan.resumed_from
        lineage = (
            f"{source.session_id}/{source.run_id} at turn {source.turn}, {source.content_digest}"
            if source
            else None
        )
        self.emit(RunStartEvent(prompt=plan.prompt, model=plan.model, resumed_from=lineage), now_ms)
        self._start_context(point.context if point is not None else context, now_ms)

    def _counters(self, plan: RunPlan, now_ms: int, prior_run_ids: tuple[str, ...]) -> None:
        self.plan = plan
        self.prior_run_ids = prior_run_ids  # the session's ended runs, for the exports' snapshot
        self.created_at_ms = now_ms
        self.updated_at_ms = now_ms
        self.status: RunStatus = "executing"
        self.usage = TokenUsage()
        self.turn = 0  # completed tool calls, i.e. tool boundaries
        self.tool_rounds = 0  # model responses that asked for tools
        self.final_text = ""
        self.error: str | None = None
        self.exports: list[ExportRef] = []
        self.export_failures: list[ExportFailure] = []
        self.persistence_failures: list[str] = []
        self.events: list[EventRecord] = []  # the newest events: this execution's and those carried
        self.event_count = 0
        self._due_calls = []
        self.step_message: str | None = None
        self.last_export: ExportSeed | None = None  # the newest export this run delivered
        self.seed_export = None
        # conversations and budgets: the user messages waiting for the next model request, the
        # role of the conversation's last message, this run's own usage (a resumed run's
        # ``usage`` goes on from its export's), and how the run ended as its host sees it
        self._queued: list[UserMessageEvent] = []
        self._last_role = "user"
        self.run_usage = TokenUsage()
        self.final_status: FinalStatus | None = None
        # context management (``durable_agent.core.context``): the ledger at the log's head
        self.context: ContextLedger | None = None

    def _start_log(self, seed: LogRef, messages: list[Message]) -> None:
        # the log as this execution found it; the store holds it (or the run's last export does)
        self.seed = seed
        self.head = seed  # the newest entry
        self.stored = seed  # the newest entry the store acknowledged
        self.journal: list[LogEntry] = []  # this execution's entries, oldest first
        self._new_messages: list[Message] = messages
        # for the last message already in the log: tool results, then a user's text
        self._new_results: list[ToolResultBlock | TextBlock] = []
        self._new_events: list[EventRecord] = []
        # what the tool and model activities kept in the store since the last save
        self.staged_ids: set[str] = set()
        self.staged_messages: set[str] = set()

    # --- recording ----------------------------------------------------------

    def emit(self, event: AgentEvent, now_ms: int) -> EventRecord:
        self.event_count += 1
        record = EventRecord(sequence=self.event_count, timestamp_ms=now_ms, event=event)
        self.events.append(record)
        self._new_events.append(record)
        self.updated_at_ms = now_ms
        return record

    def add_model_response(self, response: ModelResponse, now_ms: int) -> list[ToolUseBlock]:
        """Record the assistant's step; return the tool calls it asks for."""
        self._record_model_usage(response, now_ms)
        self._new_messages.append(response.message)
        # the staged message's digest: the step's tool calls may read long arguments from it
        self.step_message = digest_of(response.message) if response.staged else None
        if self.step_message is not None:
            self.staged_messages.add(self.step_message)
        self.open_results = False
        self._due_calls = response.message.tool_uses()
        self.usage = self.usage + response.usage
        self.run_usage = self.run_usage + response.usage
        self._last_role = "assistant"
        thinking = response.message.thinking()
        if thinking:
            self.emit(ThinkingEvent(text=thinking), now_ms)
        text = response.message.text()
        if text:
            self.emit(TextDeltaEvent(text=text), now_ms)
        calls = response.message.tool_uses()
        if calls:
            self.tool_rounds += 1
        else:
            self.final_text = text
        return calls

    def add_tool_result(
        self,
        call: ToolUseBlock,
        output: str,
        is_error: bool,
        now_ms: int,
        staged: bool = False,
        images: tuple[ImageBlock, ...] = (),
    ) -> None:
        """Record a finished tool call: its ``tool_end`` event and its tool-result block.

        The results of one assistant step share one user message, which grows
        as each call finishes, so every boundary's conversation is well formed.
        ``staged``: the tool activity kept the output in the store, so the next
        save can name it by digest. ``images``: what the tool returned besides its text, as
        references (their data is in the store).
        """
        if staged:
            self.staged_ids.add(call.id)
        self._due_calls = [c for c in self._due_calls if c.id != call.id]
        self.emit(ToolEndEvent.of(call.id, call.name, output, is_error), now_ms)
        images = tuple(i.reference() for i in images)
        block = ToolResultBlock(tool_use_id=call.id, content=output, is_error=is_error, images=images)
        self._add_user_block(block, join=self.open_results)
        self.open_results = True
        self._last_role = "user"
        self.turn += 1

    def _add_user_block(self, block: ToolResultBlock | TextBlock, *, join: bool) -> None:
        """``block`` in a user message: a new one, or (``join``) the last one, whether it is
        new since the last save or already in the log."""
        if not join:
            self._new_messages.append(Message(role="user", content=(block,)))
        elif self._new_messages:
            last = self._new_messages[-1]
            self._new_messages[-1] = Message(role="user", content=(*last.content, block))
        else:
            self._new_results.append(block)

    # --- conversations: what a person adds -------------------------------------

    def queue_user_text(self, text: str, kind: Literal["follow_up", "steer", "resume_prompt"]) -> int:
        """Keep a user message for the model's next request (``take_queued`` adds it then);
        how many wait now."""
        self._queued.append(UserMessageEvent(kind=kind, text=text))
        return len(self._queued)

    def queued_count(self) -> int:
        return len(self._queued)

    def take_queued(self, now_ms: int) -> int:
        """Add the queued user messages to the conversation, before a model request."""
        queued, self._queued = self._queued, []
        for item in queued:
            self.add_user_text(item.text, item.kind, now_ms)
        return len(queued)

    def add_user_text(
        self, text: str, kind: Literal["follow_up", "steer", "resume_prompt"], now_ms: int
    ) -> None:
        """A person's message, with its ``user_message`` event. Roles alternate: after a user
        message (the prompt, or a step's tool results) the text joins it as a text block."""
        self._add_user_block(TextBlock(text=text), join=self._last_role == "user")
        self._last_role = "user"
        self.open_results = False
        self.emit(UserMessageEvent(kind=kind, text=text), now_ms)

    def ends_with_answer(self) -> bool:
        """The conversation ends with the model's answer: it needs a user message before the
        model is asked again."""
        return self._last_role == "assistant" and not self._due_calls and not self._queued

    # --- budgets ----------------------------------------------------------------

    def run_cost_usd(self) -> float | None:
        """This run's cost from the model's prices, or None when they are not known."""
        plan = self.plan
        return usage_cost_usd(
            self.run_usage,
            plan.input_usd_per_mtok,
            plan.output_usd_per_mtok,
            plan.cache_read_usd_per_mtok,
            plan.cache_write_usd_per_mtok,
        )

    def budgets(self) -> tuple[Budget, ...]:
        """This run's usage against each of its budgets."""
        plan, out = self.plan, []
        if plan.max_total_tokens is not None:
            out.append(Budget(budget="tokens", used=self.run_usage.total_tokens, limit=plan.max_total_tokens))
        if plan.max_cost_usd is not None:
            out.append(Budget(budget="cost", used=self.run_cost_usd() or 0.0, limit=plan.max_cost_usd))
        return tuple(out)

    def exhausted_budget(self) -> Budget | None:
        """The first budget this run has reached, if any."""
        return next((b for b in self.budgets() if b.used >= b.limit), None)

    def record_budget_exhausted(self, budget: Budget, now_ms: int) -> str:
        """The run stops here for ``budget``; the error its run record carries."""
        self.emit(BudgetExhaustedEvent(budget=budget.budget, used=budget.used, limit=budget.limit), now_ms)
        if budget.budget == "tokens":
            return f"budget exhausted: {budget.used:g} tokens used of max_total_tokens={budget.limit:g}"
        return f"budget exhausted: ${budget.used:.4f} used of max_cost_usd={budget.limit:g}"

    # --- context management ----------------------------------------------------------

    def _start_context(self, seed: ContextLedger | None, now_ms: int) -> None:
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

    def record_compaction(self, event: ContextCompactedEvent, usage: TokenUsage, now_ms: int) -> None:
        """The model's view changed (``event.view`` from now on); ``usage``: a summary's cost."""
        if self.context is not None:
            self.context = self.context.compacted(event.view)
        self.usage = self.usage + usage
        self.run_usage = self.run_usage + usage
        self.emit(event, now_ms)

    def _record_model_usage(self, response: ModelResponse, now_ms: int) -> None:
        """A managed run's ``model_usage`` event: the provider's count against the estimate."""
        ledger = self.context_now()
        if ledger is None or self.context is None:
            return
        estimate = ledger.estimate(self.context_fixed())
        self.context = self.context.answered(response.usage.prompt_tokens, estimate)
        event = ModelUsageEvent(
            step=self.context.steps,
            usage=response.usage,
            estimated_tokens=estimate,
            view_version=self.context.view.version,
        )
        self.emit(event, now_ms)

    def _context_status(self) -> dict[str, int]:
        ledger, policy = self.context_now(), self.plan.context
        if ledger is None or policy is None:
            return {}
        return {
            "compactions": ledger.compactions,
            "context_tokens": ledger.size(self.context_fixed()),
            "context_window": policy.window,
        }

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
        self.journal.append(entry)
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
        return [e for e in self.journal if e.version > self.stored.version]

    def entries_after(self, head: LogRef | None) -> list[LogEntry] | None:
        """What a store whose log ends at ``head`` lacks, or ``None`` when this execution's
        entries cannot bring it up to date (it lacks the state the execution started from)."""
        if head is not None and head.version <= self.head.version:
            if head == self.seed:
                return list(self.journal)
            for index, entry in enumerate(self.journal):
                if entry.version == head.version and entry.digest == head.digest:
                    return self.journal[index + 1 :]
        if self.seed.version == 0 or (self.journal and self.journal[0].delta.replace):
            return list(self.journal)
        return None

    # --- what the workflow's activities answered ---------------------------------

    def record_opened(self, prior_run_ids: tuple[str, ...]) -> None:
        """The store holds the run's log so far and named the session's ended runs
        (for the exports' snapshot)."""
        self.prior_run_ids = prior_run_ids
        self.mark_stored()

    def record_export(self, descriptor: ExportDescriptor | None, sink: str, log: LogRef, now_ms: int) -> None:
        """The sink acknowledged the export of the log at ``log``: the newest export, which a
        later execution may start from. ``None``: see ``durable_agent.core.legacy_shapes``."""
        if descriptor is None:
            ref = legacy_shapes.unbuilt_export(self.turn)
        else:
            self.last_export = ExportSeed(sink=sink, descriptor=descriptor, log=log)
            ref = ExportRef(turn=self.turn, content_digest=descriptor.content_digest)
        self.exports.append(ref)
        self.emit(CheckpointExportedEvent(turn=ref.turn, content_digest=ref.content_digest), now_ms)

    def record_export_failure(self, turn: int, digest: str, reason: str, now_ms: int) -> None:
        """The export of ``turn`` failed for good; the run goes on (the next boundary exports again)."""
        self.export_failures.append(ExportFailure(turn=turn, content_digest=digest, reason=reason))
        self.emit(CheckpointExportFailedEvent(turn=turn, content_digest=digest, reason=reason), now_ms)

    def record_persistence_failure(
        self, operation: Literal["save", "load"], reason: str, now_ms: int
    ) -> None:
        """The session store failed; the run goes on (a later save sends what it lacks)."""
        self.persistence_failures.append(f"turn {self.turn}: {operation} failed: {reason}")
        self.emit(PersistenceFailedEvent(turn=self.turn, operation=operation, reason=reason), now_ms)

    def record_finish_failure(self, reason: str) -> None:
        """The store did not take the run's end. After ``finish`` there is no event to add:
        the result and the status carry it."""
        self.persistence_failures.append(f"finish failed: {reason}")

    # --- continuing as new ----------------------------------------------------

    @classmethod
    def restore(cls, carried: CarriedState) -> LoopState:
        """The state a run carried into this execution when it continued as new."""
        journal: tuple[LogEntry, ...] = ()
        if carried.log is None:  # carried whole, by a run from before linear history
            carried, journal = legacy_shapes.carried_whole(carried)
        assert carried.log is not None and carried.event_count is not None
        state = cls.__new__(cls)
        state._counters(carried.plan, carried.created_at_ms, carried.prior_run_ids)
        state.updated_at_ms = carried.events[-1].timestamp_ms if carried.events else carried.created_at_ms
        state.usage = carried.usage
        state.turn = carried.turn
        state.tool_rounds = carried.tool_rounds
        state.exports = list(carried.exports)
        state.export_failures = list(carried.export_failures)
        state.persistence_failures = list(carried.persistence_failures)
        state.events = list(carried.events)
        state.event_count = carried.event_count
        state.last_export = state.seed_export = carried.seed
        state.open_results = carried.open_results
        state._due_calls = list(carried.due_calls)
        state.step_message = carried.step_message
        state._queued = list(carried.queued)
        state.run_usage = carried.run_usage if carried.run_usage is not None else carried.usage
        state.context = carried.context if carried.plan.context is not None else None
        state._last_role = "user" if carried.open_results else "assistant"
        state._start_log(carried.log, [])
        state._new_events = list(carried.pending_events)
        for entry in journal:
            state.journal.append(entry)
            state.head = entry.ref(carried.plan.run_id)
        return state

    def carry(self, executions: int) -> CarriedState:
        """What the next execution needs to go on as this run: references, not the conversation."""
        assert self.can_carry()
        return CarriedState(
            plan=self.plan,
            created_at_ms=self.created_at_ms,
            turn=self.turn,
            tool_rounds=self.tool_rounds,
            usage=self.usage,
            events=tuple(self.events[-CARRIED_EVENTS:]),
            exports=tuple(self.exports),
            export_failures=tuple(self.export_failures),
            persistence_failures=tuple(self.persistence_failures),
            executions=executions,
            log=self.head,
            seed=self.last_export if self.last_export and self.last_export.log == self.head else None,
            event_count=self.event_count,
            pending_events=tuple(self._new_events),
            open_results=self.open_results,
            due_calls=tuple(self._due_calls),
            step_message=self.step_message,
            prior_run_ids=self.prior_run_ids,
            queued=tuple(self._queued),
            run_usage=self.run_usage,
            context=self.context,
        )

    def can_carry(self) -> bool:
        """Whether the store holds every entry, so the next execution can start from a reference."""
        return self.stored == self.head and not self._new_messages and not self._new_results

    def pending_calls(self) -> list[ToolUseBlock]:
        """Tool calls of the last model step that have no result yet (a run resumed, or
        continued as new, between two calls of one step)."""
        return list(self._due_calls)

    def finish(self, status: FinalStatus, now_ms: int, error: str | None = None) -> None:
        # the export contract's run statuses are fixed: a budget's stop is ``failed`` there
        self.final_status = status
        ended = "failed" if status == "budget_exhausted" else status
        self.status = ended
        self.error = error
        self.emit(EndEvent(status=ended, text=self.final_text, usage=self.usage), now_ms)

    # --- what activities are given ----------------------------------------------

    def header(self) -> RunHeader:
        plan = self.plan
        return RunHeader(
            session_id=plan.session_id,
            run_id=plan.run_id,
            prompt=plan.prompt,
            created_at_ms=self.created_at_ms,
            capability_binding=plan.capability_binding,
            system_prompt=plan.system_prompt,
            tools=tuple(plan.definitions()),
            resumed_from=plan.resumed_from,
            prior_run_ids=self.prior_run_ids,
        )

    def export_facts(self, now_ms: int) -> ExportFacts:
        return ExportFacts(
            turn=self.turn, checkpoint_ms=now_ms, updated_at_ms=self.updated_at_ms, usage=self.usage
        )

    def finish_input(self) -> FinishRunInput:
        """The end of the run, on top of what the store holds: the events it lacks."""
        unstored = [r for e in self.unstored() for r in e.delta.events]
        events = (*unstored, *self._new_events)
        texts = [r.event for r in events if isinstance(r.event, TextDeltaEvent)]
        in_events = bool(self.final_text) and bool(texts) and texts[-1].text == self.final_text
        return FinishRunInput(
            log=self.stored,
            events=events,
            status=self.status,
            updated_at_ms=self.updated_at_ms,
            result_text=None if in_events else self.final_text or None,
            error=self.error,
            result_is_last_text=in_events,
        )

    # --- views ----------------------------------------------------------------

    def events_after(self, sequence: int) -> list[EventRecord]:
        """The events with a sequence above ``sequence`` that this execution holds."""
        if not self.events:
            return []
        start = max(0, sequence - self.events[0].sequence + 1)
        return self.events[start:]

    def status_view(
        self,
        cancel_requested: bool,
        pending_approvals: tuple[PendingApproval, ...] = (),
        awaiting_prompt: bool = False,
    ) -> RunStatusView:
        status: str = self.final_status or self.status
        if pending_approvals:
            status = AWAITING_APPROVAL
        elif awaiting_prompt:
            status = AWAITING_PROMPT
        return RunStatusView(
            session_id=self.plan.session_id,
            run_id=self.plan.run_id,
            status=status,
            model=self.plan.model,
            turn=self.turn,
            tool_calls=self.turn,
            exports_delivered=len(self.exports),
            export_failures=len(self.export_failures),
            persistence_failures=len(self.persistence_failures),
            last_content_digest=self.exports[-1].content_digest if self.exports else None,
            cancel_requested=cancel_requested,
            pending_approvals=pending_approvals,
            usage=self.usage,
            error=self.error,
            budgets=self.budgets(),
            cost_usd=self.run_cost_usd(),
            event_count=self.event_count,
            **self._context_status(),
        )

    def result(self) -> AgentRunResult:
        assert self.final_status is not None
        return AgentRunResult(
            session_id=self.plan.session_id,
            run_id=self.plan.run_id,
            status=self.final_status,
            text=self.final_text,
            error=self.error,
            tool_calls_count=self.turn,
            usage=self.usage,
            exports=tuple(self.exports),
            export_failures=tuple(self.export_failures),
            persistence_failures=tuple(self.persistence_failures),
        )
