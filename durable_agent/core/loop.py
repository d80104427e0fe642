"""The agent loop's state and step logic, as pure functions of what happened.

The workflow feeds it model responses and tool outputs with workflow time; it
keeps the run's plan, counters, conversation shape, queued user messages,
budgets and ending, and hands each change to the run's journal
(``durable_agent.core.journal``), which numbers the events, turns what is new at
each save into the next entry of the run's log, and measures that log against
the model's context window. Tests drive it without a server.

The workflow changes a ``LoopState`` and its ``journal`` only through their
methods (``add_*``, ``record_*``, ``emit``, ...), each of which records the
event that goes with the change, so no change goes unrecorded;
``tests/test_loop_state_writes.py`` holds ``workflows/`` to that.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any, Literal

from durable_agent.core import legacy_shapes
from durable_agent.core.activity_api import ResumePoint
from durable_agent.core.canonical import digest_of
from durable_agent.core.context import ContextLedger
from durable_agent.core.events import (
    BudgetExhaustedEvent,
    ContextCompactedEvent,
    EndEvent,
    FinalResultEvent,
    RunStartEvent,
    TextDeltaEvent,
    ThinkingEvent,
    TodoEvent,
    TodoItem,
    ToolEndEvent,
    UserMessageEvent,
    UserMessageKind,
    WorkspaceRestoredEvent,
)
from durable_agent.core.export import LoopCheckpoint, RunStatus
from durable_agent.core.journal import RunJournal
from durable_agent.core.models import (
    ImageBlock,
    Message,
    ModelResponse,
    TextBlock,
    TokenUsage,
    ToolResultBlock,
    ToolUseBlock,
    WorkspaceChange,
    WorkspaceRestore,
    WorkspaceState,
    usage_cost_usd,
)
from durable_agent.core.plan import RunPlan
from durable_agent.core.run_api import (
    AWAITING_APPROVAL,
    AWAITING_PROMPT,
    AgentRunResult,
    Budget,
    CarriedState,
    FinalStatus,
    PendingApproval,
    RunStatusView,
)
from durable_agent.core.run_log import ExportFacts, LogEntry, LogRef, ends_in_results, unanswered_calls
from durable_agent.core.run_workspace import RunWorkspace
from durable_agent.core.subagents import ChildRun, SubagentOrigin, child_event, with_child


class LoopState:
    """One run's plan, counters and conversation, with the journal of what it recorded."""

    def __init__(
        self,
        plan: RunPlan,
        now_ms: int,
        *,
        resume: LoopCheckpoint | None = None,
        point: ResumePoint | None = None,
        context: ContextLedger | None = None,
        todos: tuple[TodoItem, ...] = (),
    ) -> None:
        """A new run of ``plan``; with ``resume``, one that goes on from that checkpoint's
        conversation; with ``point``, from the conversation of an export file on the worker.
        ``context``: the resumed run's view and last usage report (its messages are measured
        as they enter the log); a ``point`` brings its own. ``todos``: a resumed run's plan,
        the one its export was made with, recorded after its start as a ``carried`` ``todo``
        event, so that its own exports hold it."""
        self._counters(plan)
        self.todos: tuple[TodoItem, ...] = todos  # the plan the model wrote last (``todo_write``)
        self.output_failures = 0  # a typed run's failed answers since its last valid one
        self._due_calls: list[ToolUseBlock]
        self._last_role: Literal["user", "assistant"]
        if point is not None:
            self.journal = RunJournal.from_export(plan, now_ms, point.seed)
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
            self.journal = RunJournal(plan, now_ms, LogRef(run_id=plan.run_id, version=0), first)
            self.open_results = ends_in_results(first)
            self._due_calls = unanswered_calls(first)
            self._last_role = first[-1].role if first else "user"
        source = plan.resumed_from
        lineage = (
            f"{source.session_id}/{source.run_id} at turn {source.turn}, {source.content_digest}"
            if source
            else None
        )
        event = RunStartEvent(
            prompt=plan.prompt,
            model=plan.model,
            resumed_from=lineage,
            instruction_files=plan.instruction_files,
            workspace=plan.workspace_base,
            origin=plan.workspace_origin,
        )
        self.journal.emit(event, now_ms)
        if todos:
            self.journal.emit(TodoEvent(todos=todos, carried=True), now_ms)
        self.journal.start_context(point.context if point is not None else context, now_ms)
        self.workspace = RunWorkspace.started(plan.workspace_base, plan.workspace_host)

    def _counters(self, plan: RunPlan) -> None:
        self.plan = plan
        self.status: RunStatus = "executing"
        self.usage = TokenUsage()
        self.turn = 0  # completed tool calls, i.e. tool boundaries
        self.tool_rounds = 0  # model responses that asked for tools
        self.final_text = ""
        self.error: str | None = None
        self._due_calls = []
        self.step_message: str | None = None
        # conversations and budgets: the user messages waiting for the next model request, the
        # role of the conversation's last message, this run's own usage (a resumed run's
        # ``usage`` goes on from its export's), and how the run ended as its host sees it
        self._queued: list[UserMessageEvent] = []
        self._last_role = "user"
        self.run_usage = TokenUsage()
        self.final_status: FinalStatus | None = None
        self.todos = ()
        # a run with an output schema: the answer of its last valid ``final_result`` call
        self.output: dict[str, Any] | None = None
        # the subagents the run started (``task``), in the order they started; their usage
        # counts against this run's budgets once they end
        self.children: tuple[ChildRun, ...] = ()
        # the tree the run's workspace is at, and the worker that holds it (``core/run_workspace.py``)
        self.workspace = RunWorkspace()
        self._workspace_change: WorkspaceChange | None = None  # with its diff, at the run's end

    # --- a model's and a tool's answers --------------------------------------------

    def add_model_response(self, response: ModelResponse, now_ms: int) -> list[ToolUseBlock]:
        """Record the assistant's step; return the tool calls it asks for."""
        self.journal.record_model_usage(response.usage, now_ms)
        # the staged message's digest: the step's tool calls may read long arguments from it
        self.step_message = digest_of(response.message) if response.staged else None
        self.journal.add_message(response.message, staged=self.step_message)
        self.open_results = False
        self._due_calls = response.message.tool_uses()
        self.usage = self.usage + response.usage
        self.run_usage = self.run_usage + response.usage
        self._last_role = "assistant"
        thinking = response.message.thinking()
        if thinking:
            self.journal.emit(ThinkingEvent(text=thinking), now_ms)
        text = response.message.text()
        if text:
            self.journal.emit(TextDeltaEvent(text=text), now_ms)
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
        workspace: WorkspaceState | None = None,
        host: str | None = None,
        restored: WorkspaceRestore | None = None,
    ) -> None:
        """Record a finished tool call: its ``tool_end`` event and its tool-result block.

        The results of one assistant step share one user message, which grows
        as each call finishes, so every boundary's conversation is well formed.
        ``staged``: the tool activity kept the output in the store, so the next
        save can name it by digest. ``images``: what the tool returned besides its text, as
        references (their data is in the store). ``workspace``: the workspace's tree after the
        call, when the tool activity recorded it (it goes in the ``tool_end`` event). ``host``:
        the worker that held the run's workspace for the call; ``restored``: it restored its
        copy first (a ``workspace_restored`` event before the ``tool_end``).
        """
        self._due_calls = [c for c in self._due_calls if c.id != call.id]
        self.hold_workspace(call.id, call.name, workspace, host, restored, now_ms)
        self.journal.emit(ToolEndEvent.of(call.id, call.name, output, is_error, workspace), now_ms)
        images = tuple(i.reference() for i in images)
        block = ToolResultBlock(tool_use_id=call.id, content=output, is_error=is_error, images=images)
        self.journal.add_user_block(block, join=self.open_results, staged=staged)
        self.open_results = True
        self._last_role = "user"
        self.turn += 1

    def hold_workspace(
        self,
        id: str,
        name: str,
        workspace: WorkspaceState | None,
        host: str | None,
        restored: WorkspaceRestore | None,
        now_ms: int,
    ) -> None:
        """A call or a hook ran on the run's workspace (``core/run_workspace.py``): the restore its
        worker made first (a ``workspace_restored`` event), and the tree it left and its host."""
        if restored is not None:
            self.journal.emit(WorkspaceRestoredEvent.of(id, name, restored), now_ms)
        self.workspace = self.workspace.after(workspace, host)

    def record_todos(self, todos: tuple[TodoItem, ...], now_ms: int) -> None:
        """The model wrote its plan (``todo_write``): it replaces the one before, with its event."""
        self.todos = todos
        self.journal.emit(TodoEvent(todos=todos), now_ms)

    def output_failed(self) -> int:
        """One more failed answer of a typed run since its last valid one (carried across
        continue-as-new: ``workflows/final_result.py``); how many there are now."""
        self.output_failures += 1
        return self.output_failures

    def output_accepted(self) -> None:
        """A typed run's valid answer: its count of failed answers starts again."""
        self.output_failures = 0

    def record_output(self, call_id: str, output: dict[str, Any], now_ms: int) -> None:
        """The ``final_result`` call ``call_id`` validated: ``output`` is the run's answer."""
        self.output = output
        self.journal.emit(FinalResultEvent(id=call_id, output=output), now_ms)

    def record_subagent(self, child: ChildRun, now_ms: int) -> None:
        """A child run started (``status`` running) or ended: its ``subagent_*`` event, and the
        child as ``status`` shows it, in the place it started in."""
        self.children = with_child(self.children, child)
        self.journal.emit(child_event(child), now_ms)

    # --- conversations: what a person adds -------------------------------------

    def queue_user_text(self, text: str, kind: UserMessageKind) -> int:
        """Keep a user message for the model's next request (``take_queued`` adds it then);
        how many wait now."""
        self._queued.append(UserMessageEvent(kind=kind, text=text))
        return len(self._queued)

    def queued_count(self) -> int:
        return len(self._queued)

    def queued_messages(self) -> tuple[UserMessageEvent, ...]:
        """The user messages waiting for the model's next request, in order."""
        return tuple(self._queued)

    def take_queued(self, now_ms: int, refused: Collection[int] = ()) -> int:
        """Add the queued user messages to the conversation, before a model request.
        ``refused``: the positions of those a ``user_prompt_submit`` hook refused, dropped (the
        hook's ``hook_run`` event says why). Returns how many were added."""
        queued, self._queued = self._queued, []
        taken = [item for index, item in enumerate(queued) if index not in refused]
        for item in taken:
            self.add_user_text(item.text, item.kind, now_ms)
        return len(taken)

    def add_user_text(self, text: str, kind: UserMessageKind, now_ms: int) -> None:
        """A person's message, with its ``user_message`` event. Roles alternate: after a user
        message (the prompt, or a step's tool results) the text joins it as a text block."""
        self.journal.add_user_block(TextBlock(text=text), join=self._last_role == "user")
        self._last_role = "user"
        self.open_results = False
        self.journal.emit(UserMessageEvent(kind=kind, text=text), now_ms)

    def ends_with_answer(self) -> bool:
        """The conversation ends with the model's answer: it needs a user message before the
        model is asked again."""
        return self._last_role == "assistant" and not self._due_calls and not self._queued

    def pending_calls(self) -> list[ToolUseBlock]:
        """Tool calls of the last model step that have no result yet (a run resumed, or
        continued as new, between two calls of one step)."""
        return list(self._due_calls)

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
        """This run's usage against each of its budgets: its own and its ended children's."""
        plan, out = self.plan, []
        children = [c for c in self.children if c.status != "running"]
        if plan.max_total_tokens is not None:
            used = self.run_usage.total_tokens + sum(c.usage.total_tokens for c in children)
            out.append(Budget(budget="tokens", used=used, limit=plan.max_total_tokens))
        if plan.max_cost_usd is not None:
            cost = (self.run_cost_usd() or 0.0) + sum(c.cost_usd or 0.0 for c in children)
            out.append(Budget(budget="cost", used=cost, limit=plan.max_cost_usd))
        return tuple(out)

    def exhausted_budget(self) -> Budget | None:
        """The first budget this run has reached, if any."""
        return next((b for b in self.budgets() if b.used >= b.limit), None)

    def record_budget_exhausted(self, budget: Budget, now_ms: int) -> str:
        """The run stops here for ``budget``; the error its run record carries."""
        event = BudgetExhaustedEvent(budget=budget.budget, used=budget.used, limit=budget.limit)
        self.journal.emit(event, now_ms)
        if budget.budget == "tokens":
            return f"budget exhausted: {budget.used:g} tokens used of max_total_tokens={budget.limit:g}"
        return f"budget exhausted: ${budget.used:.4f} used of max_cost_usd={budget.limit:g}"

    def record_compaction(self, event: ContextCompactedEvent, usage: TokenUsage, now_ms: int) -> None:
        """The model's view changed (``event.view`` from now on); ``usage``: a summary's cost."""
        self.usage = self.usage + usage
        self.run_usage = self.run_usage + usage
        self.journal.record_view(event, now_ms)

    # --- continuing as new ----------------------------------------------------

    @classmethod
    def restore(cls, carried: CarriedState) -> LoopState:
        """The state a run carried into this execution when it continued as new."""
        entries: tuple[LogEntry, ...] = ()
        if carried.log is None:  # carried whole, by a run from before linear history
            carried, entries = legacy_shapes.carried_whole(carried)
        state = cls.__new__(cls)
        state._counters(carried.plan)
        state.journal = RunJournal.carried(carried, entries)
        state.usage = carried.usage
        state.run_usage = carried.run_usage if carried.run_usage is not None else carried.usage
        state.turn, state.tool_rounds = carried.turn, carried.tool_rounds
        state.open_results = carried.open_results
        state._due_calls = list(carried.due_calls)
        state.step_message = carried.step_message
        state._queued = list(carried.queued)
        state.todos = carried.todos
        state.output_failures = carried.output_failures
        state.children = carried.children
        if carried.workspace is not None:
            state.workspace = carried.workspace
        state._last_role = "user" if carried.open_results else "assistant"
        return state

    def carry(self, executions: int) -> CarriedState:
        """What the next execution needs to go on as this run: references, not the conversation."""
        assert self.journal.can_carry()
        return CarriedState(
            **self.journal.carry(),
            executions=executions,
            plan=self.plan,
            turn=self.turn,
            tool_rounds=self.tool_rounds,
            due_calls=tuple(self._due_calls),
            usage=self.usage,
            run_usage=self.run_usage,
            open_results=self.open_results,
            queued=tuple(self._queued),
            step_message=self.step_message,
            todos=self.todos,
            children=self.children,
            workspace=self.workspace,
            output_failures=self.output_failures,
        )

    def finish(self, status: FinalStatus, now_ms: int, error: str | None = None) -> None:
        # the export contract's run statuses are fixed: a budget's stop is ``failed`` there
        self.final_status = status
        ended = "failed" if status == "budget_exhausted" else status
        self.status = ended
        self.error = error
        self.journal.emit(EndEvent(status=ended, text=self.final_text, usage=self.usage), now_ms)

    def export_facts(self, now_ms: int) -> ExportFacts:
        """The facts of an export made now, at this turn."""
        updated_at_ms = self.journal.updated_at_ms
        return ExportFacts(
            turn=self.turn, checkpoint_ms=now_ms, updated_at_ms=updated_at_ms, usage=self.usage
        )

    # --- views ----------------------------------------------------------------

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
        journal = self.journal
        return RunStatusView(
            session_id=self.plan.session_id,
            run_id=self.plan.run_id,
            status=status,
            model=self.plan.model,
            turn=self.turn,
            tool_calls=self.turn,
            exports_delivered=len(journal.exports),
            export_failures=len(journal.export_failures),
            persistence_failures=len(journal.persistence_failures),
            last_content_digest=journal.exports[-1].content_digest if journal.exports else None,
            cancel_requested=cancel_requested,
            pending_approvals=pending_approvals,
            usage=self.usage,
            error=self.error,
            budgets=self.budgets(),
            cost_usd=self.run_cost_usd(),
            event_count=journal.event_count,
            todos=self.todos,
            output=self.output,
            children=self.children,
            parent_workflow_id=self._parent.parent_workflow_id if self._parent else None,
            **journal.context_status(),
        )

    def result(self) -> AgentRunResult:
        assert self.final_status is not None
        journal = self.journal
        return AgentRunResult(
            session_id=self.plan.session_id,
            run_id=self.plan.run_id,
            status=self.final_status,
            text=self.final_text,
            error=self.error,
            tool_calls_count=self.turn,
            usage=self.usage,
            exports=tuple(journal.exports),
            export_failures=tuple(journal.export_failures),
            persistence_failures=tuple(journal.persistence_failures),
            # the answer of a run that completed with one (a failed turn's earlier answer is not)
            output=self.output if self.final_status == "completed" else None,
            # a child's cost, which its parent counts against its budget (its children's with it)
            cost_usd=self._cost_with_children() if self._parent else None,
            workspace=self._workspace_change or self.workspace.change(),
        )

    def record_workspace_change(self, change: WorkspaceChange) -> None:
        """The run's change set, with its diff (``agent.workspace_change``), for its result."""
        self._workspace_change = change

    def record_push(self, branch: str, commit: str | None, reason: str | None) -> None:
        """The run's change pushed to ``branch`` as ``commit``, or not, for ``reason``."""
        change = self._workspace_change or self.workspace.change() or WorkspaceChange()
        self._workspace_change = change.model_copy(
            update={"branch": branch, "commit": commit, "pushed": reason}
        )

    @property
    def _parent(self) -> SubagentOrigin | None:
        """Who started this run, when a ``task`` call of another run did."""
        return self.plan.subagents.parent if self.plan.subagents is not None else None

    def _cost_with_children(self) -> float | None:
        own = self.run_cost_usd()
        children = [c.cost_usd for c in self.children if c.cost_usd is not None]
        return None if own is None and not children else (own or 0.0) + sum(children)
