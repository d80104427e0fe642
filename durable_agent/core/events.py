"""The run's events: what a run records for those who watch it, tagged by ``type``.

Each event is one ``EventRecord`` of the run's log; the parts they share with the
conversation (token usage, the context view, the workspace state, a tool call's id and
name) are in ``durable_agent.core.models``.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field

from durable_agent.core.models import (
    ContextView,
    Frozen,
    HookEventName,
    InstructionFile,
    Sparse,
    TokenUsage,
    ToolCallBase,
    WorkspaceRestore,
    WorkspaceState,
)
from durable_agent.core.run_workspace import WorkspaceOrigin


class RunStartEvent(Sparse):
    type: Literal["run_start"] = "run_start"
    prompt: str
    model: str
    # "session/run at turn N, sha256:…" when the run resumes an exported checkpoint
    resumed_from: str | None = None
    # The project instruction files in the run's system prompt. Left out of the JSON when there
    # are none, so that the events of a run without them keep the bytes they had before.
    instruction_files: tuple[InstructionFile, ...] = ()
    # The workspace's tree when the run started (its base), for a run whose workspace follows
    # it (docs/workspaces.md). Left out of the JSON when None, as for runs before it.
    workspace: WorkspaceState | None = None
    # Where a workspace made from a git source came from and where its change goes: a resumed or
    # rewound run takes it from here, so its change is still pushed. Left out of the JSON when None.
    origin: WorkspaceOrigin | None = None

    left_out_at_default = ("instruction_files", "workspace", "origin")


class TextDeltaEvent(Frozen):
    type: Literal["text_delta"] = "text_delta"
    text: str


class ThinkingEvent(Frozen):
    """A model step's readable thinking: shown to followers as thinking, never as the answer."""

    type: Literal["thinking"] = "thinking"
    text: str


# Events are for watching a run; the conversation (its messages) is for resuming
# it. So an event carries the start of a tool's input and output, not all of
# them, and a checkpoint does not hold every file written or read twice.
TOOL_OUTPUT_PREVIEW_CHARS = 2000


class ToolStartEvent(ToolCallBase):
    type: Literal["tool_start"] = "tool_start"
    input: dict[str, Any] = Field(default_factory=dict)  # long strings cut to a preview

    @classmethod
    def of(cls, id: str, name: str, arguments: dict[str, Any]) -> ToolStartEvent:
        def preview(value: Any) -> Any:
            if isinstance(value, str) and len(value) > TOOL_OUTPUT_PREVIEW_CHARS:
                more = len(value) - TOOL_OUTPUT_PREVIEW_CHARS
                return f"{value[:TOOL_OUTPUT_PREVIEW_CHARS]}…[{more} more characters]"
            return value

        return cls(id=id, name=name, input={k: preview(v) for k, v in arguments.items()})


class ToolEndEvent(ToolCallBase, Sparse):
    type: Literal["tool_end"] = "tool_end"
    output: str  # at most TOOL_OUTPUT_PREVIEW_CHARS characters of it
    output_chars: int = 0  # the whole output's length
    is_error: bool = False
    # The workspace after a call to a tool that may change files, when the worker recorded it.
    # Left out of the JSON when None, so that the events of other calls keep their bytes.
    workspace: WorkspaceState | None = None

    left_out_at_default = ("workspace",)

    @classmethod
    def of(
        cls, id: str, name: str, output: str, is_error: bool, workspace: WorkspaceState | None = None
    ) -> ToolEndEvent:
        return cls(
            id=id,
            name=name,
            output=output[:TOOL_OUTPUT_PREVIEW_CHARS],
            output_chars=len(output),
            is_error=is_error,
            workspace=workspace,
        )


class PermissionDeniedEvent(ToolCallBase):
    type: Literal["permission_denied"] = "permission_denied"
    reason: str


class ConfirmationRequiredEvent(ToolCallBase):
    """A call waits for a person's decision (a rule said ``ask``)."""

    type: Literal["confirmation_required"] = "confirmation_required"
    target: str | None = None
    arguments: str  # a summary of the call's input, for the person deciding
    timeout_seconds: float | None = None
    # What a decision is bound to: the model step, and the digest of the call's full input.
    step: int | None = None
    arguments_digest: str | None = None


class ConfirmationReceivedEvent(ToolCallBase):
    type: Literal["confirmation_received"] = "confirmation_received"
    approved: bool
    reason: str | None = None
    timed_out: bool = False


class TurnEndEvent(Frozen):
    type: Literal["turn_end"] = "turn_end"
    turn: int
    usage: TokenUsage


class CheckpointExportedEvent(Frozen):
    type: Literal["checkpoint_exported"] = "checkpoint_exported"
    turn: int
    content_digest: str


class CheckpointExportFailedEvent(Frozen):
    type: Literal["checkpoint_export_failed"] = "checkpoint_export_failed"
    turn: int
    content_digest: str
    reason: str


class PersistenceFailedEvent(Frozen):
    type: Literal["persistence_failed"] = "persistence_failed"
    turn: int
    operation: Literal["save", "load", "finish"]
    reason: str


class ContextCompactedEvent(Frozen):
    """The run made the model's view of its conversation smaller before asking it."""

    type: Literal["context_compacted"] = "context_compacted"
    tier: Literal["elide", "summarize", "resumed"]
    reason: Literal["threshold", "overflow", "resumed"]
    view: ContextView  # the view from now on
    elided_now: tuple[str, ...] = ()  # the tool results this compaction took out of view
    tokens_before: int = 0  # the request's estimated size before and after
    tokens_after: int = 0
    window: int = 0  # the model's context window


class ModelUsageEvent(Frozen):
    """One model request: what the provider reported, and what the run had estimated."""

    type: Literal["model_usage"] = "model_usage"
    step: int
    usage: TokenUsage
    estimated_tokens: int = 0
    view_version: int = 0


# Who added a user message: a person (a follow-up, a steer, a resume's prompt), or the run itself
# telling a model that answered with text to call ``final_result`` (``output_retry``).
UserMessageKind = Literal["follow_up", "steer", "resume_prompt", "output_retry"]


class UserMessageEvent(Frozen):
    """A user message added to the conversation: a follow-up, a steer, a resume's prompt, or the
    run's request for a typed result (``output_retry``)."""

    type: Literal["user_message"] = "user_message"
    kind: UserMessageKind
    text: str


class FinalResultEvent(Frozen):
    """A run with an output schema got its answer: the ``final_result`` call ``id`` validated, and
    ``output`` (its arguments) is the run's output."""

    type: Literal["final_result"] = "final_result"
    id: str
    output: dict[str, Any]


class BudgetExhaustedEvent(Frozen):
    """The run reached a budget and stops at this boundary."""

    type: Literal["budget_exhausted"] = "budget_exhausted"
    budget: Literal["tokens", "cost"]
    used: float
    limit: float


class ToolsUnavailableEvent(Frozen):
    """A model step was asked while some of the run's tools could not answer: their MCP server
    was down (they stayed offered; a call of one is a tool error that says so). The run goes on.
    (Runs before kept them out of that step's request and told the model.)"""

    type: Literal["tools_unavailable"] = "tools_unavailable"
    server: str
    tools: tuple[str, ...]
    reason: str


class HookRunEvent(Frozen):
    """A ``[hooks]`` command ran (``durable_agent.core.hooks``): what it decided and why.

    ``decision``: "continue" (exit 0), "block" (exit 2: the call, prompt or stop is refused
    with ``reason``, the hook's stderr) or "error" (any other exit, a timeout, a sandbox
    that could not start: recorded, and the run goes on).
    """

    type: Literal["hook_run"] = "hook_run"
    event: HookEventName
    hook: int  # its position in the event's list in ``[hooks]`` (0-based)
    command: str  # at most TOOL_OUTPUT_PREVIEW_CHARS characters of it
    decision: Literal["continue", "block", "error"]
    exit_code: int | None = None  # None: it did not exit by itself (a timeout) or never started
    reason: str | None = None
    tool_use_id: str | None = None  # the call, for the tool events
    tool_name: str | None = None
    duration_ms: int = 0


# What a ``todo_write`` item says of its task (``durable_agent.core.todo_list``).
TodoStatus = Literal["pending", "in_progress", "completed"]


class TodoItem(Frozen):
    """One task of the run's plan, as the model last wrote it."""

    content: str
    status: TodoStatus
    id: str | None = None  # the model's own name for the task, if it gave one


class TodoEvent(Sparse):
    """The model wrote its plan (``todo_write``): the whole list, which replaces the one before.
    ``carried``: not written in this run, but the plan of the export it resumed from, recorded at
    its start so that its own exports hold it (a resume of one of them, in any session, keeps it)."""

    type: Literal["todo"] = "todo"
    todos: tuple[TodoItem, ...]
    carried: bool = False  # left out of the JSON when False: the events before it keep their bytes

    left_out_at_default = ("carried",)


class SubagentStartEvent(Frozen):
    """A ``task`` call started a child run (``durable_agent.core.subagents``): its workflow id, and
    its run id once Temporal started it."""

    type: Literal["subagent_start"] = "subagent_start"
    id: str  # the ``task`` call
    workflow_id: str
    run_id: str
    description: str
    agent_type: str | None = None


class SubagentEndEvent(Frozen):
    """A child run ended: how, its last export's digest (its export series' newest, which links
    the parent's exports to the child's) and its usage, which counts against the parent's budgets."""

    type: Literal["subagent_end"] = "subagent_end"
    id: str  # the ``task`` call
    workflow_id: str
    run_id: str | None = None  # None: it never started
    status: str
    final_content_digest: str | None = None
    exports: int = 0
    usage: TokenUsage = TokenUsage()
    cost_usd: float | None = None
    error: str | None = None


class RewindEvent(Frozen):
    """The ``rewind`` update sent the run back to ``turn`` of run ``run_id`` (its export
    ``content_digest``), the workspace restored to ``tree`` (None: that export recorded none, the
    files were left as they were). The rewound run's last event before its ``end``; the first after
    ``run_start`` of the run it goes on as."""

    type: Literal["rewind"] = "rewind"
    run_id: str
    turn: int
    content_digest: str
    tree: str | None = None


class WorkspaceRestoredEvent(WorkspaceRestore):
    """A worker made its copy of the run's workspace equal to the tree the run expected before
    it ran call ``id`` (``WorkspaceRestore``'s fields: the run moved to that machine, or its copy
    there had diverged; docs/workspaces.md). Recorded just before the call's ``tool_end``."""

    type: Literal["workspace_restored"] = "workspace_restored"
    id: str  # the call whose activity restored it (a hook's: its call's id, or "<event>[<index>]")
    name: str  # that call's tool, or "hook:<event>"

    @classmethod
    def of(cls, id: str, name: str, restore: WorkspaceRestore) -> WorkspaceRestoredEvent:
        return cls(id=id, name=name, **restore.model_dump())


class ErrorEvent(Frozen):
    type: Literal["error"] = "error"
    message: str


class EndEvent(Frozen):
    type: Literal["end"] = "end"
    status: Literal["completed", "failed", "cancelled"]
    text: str
    usage: TokenUsage


AgentEvent = Annotated[
    RunStartEvent
    | TextDeltaEvent
    | ToolStartEvent
    | ToolEndEvent
    | PermissionDeniedEvent
    | ConfirmationRequiredEvent
    | ConfirmationReceivedEvent
    | TurnEndEvent
    | CheckpointExportedEvent
    | CheckpointExportFailedEvent
    | PersistenceFailedEvent
    | ErrorEvent
    | EndEvent
    | ContextCompactedEvent
    | ModelUsageEvent
    | UserMessageEvent
    | BudgetExhaustedEvent
    | ToolsUnavailableEvent
    | ThinkingEvent
    | HookRunEvent
    | TodoEvent
    | FinalResultEvent
    | SubagentStartEvent
    | SubagentEndEvent
    | RewindEvent
    | WorkspaceRestoredEvent,
    Field(discriminator="type"),
]


class EventRecord(Frozen):
    sequence: int
    timestamp_ms: int
    event: AgentEvent
