"""The conversation and event model shared by the workflow, activities and hosts.

Messages follow the content-block shape that both major wire formats can be
converted to without loss: a message is a role plus a list of blocks, and tool
calls and tool results are blocks tagged by ``type``.
"""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    ValidationInfo,
    model_serializer,
)


class Frozen(BaseModel):
    """Base for immutable, strictly-shaped contract models."""

    model_config = ConfigDict(frozen=True, extra="forbid")


class Sparse(Frozen):
    """A ``Frozen`` model whose JSON leaves out the fields named in ``left_out_at_default``
    while they hold their default (None, empty, False).

    A model names there the fields added after its first version, so that the documents
    (events, exports, plans) that do not use them keep the bytes, and the digests, they had
    before those fields existed.
    """

    left_out_at_default: ClassVar[tuple[str, ...]] = ()

    @classmethod
    def __pydantic_init_subclass__(cls, **kwargs: Any) -> None:
        super().__pydantic_init_subclass__(**kwargs)
        for name in cls.left_out_at_default:
            # the serializer pops a field by its name: one with an alias would stay in the JSON
            field = cls.model_fields.get(name)
            if field is None or field.alias is not None or field.serialization_alias is not None:
                raise TypeError(
                    f"{cls.__name__}.left_out_at_default: {name!r} is not a field without an alias"
                )

    @model_serializer(mode="wrap")
    def _without_defaults(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        data: dict[str, Any] = handler(self)
        fields = type(self).model_fields
        for name in self.left_out_at_default:
            if getattr(self, name) == fields[name].get_default(call_default_factory=True):
                data.pop(name, None)
        return data


def _not_blank(value: str, info: ValidationInfo) -> str:
    if not value.strip():
        raise ValueError(f"{info.field_name or 'the text'} must not be blank")
    return value


# Text with something in it besides white space; a field of this type refuses a blank value
# with "<field> must not be blank".
NonBlank = Annotated[str, AfterValidator(_not_blank)]


class TextBlock(Frozen):
    type: Literal["text"] = "text"
    text: str


class ToolUseBlock(Frozen):
    type: Literal["tool_use"] = "tool_use"
    id: str
    name: str
    input: dict[str, Any] = Field(default_factory=dict)


class ThinkingBlock(Frozen):
    """A reasoning model's thinking, kept so that it can be passed back on later requests.

    Reasoning APIs refuse a conversation that drops it: Anthropic wants the
    signed ``thinking`` blocks of the last assistant turn back unmodified,
    DeepSeek (and vLLM/SGLang reasoning servers) the ``reasoning_content`` of
    every assistant message, and OpenAI's Responses API its reasoning items
    (``encrypted_content`` under ``store: false``).

    ``wire`` names the protocol that produced the block: a provider sends its
    own opaque parts (``signature``, ``id``) back only to the wire that made
    them, and the text alone (or nothing) elsewhere.
    """

    type: Literal["thinking"] = "thinking"
    thinking: str
    # Anthropic's signature, or the Responses API reasoning item's ``encrypted_content``
    signature: str | None = None
    # the Responses API reasoning item's id (``rs_…``)
    id: str | None = None
    wire: Literal["anthropic", "openai-chat", "openai-responses"] | None = None


class RedactedThinkingBlock(Frozen):
    """Thinking that Anthropic's safety systems encrypted: passed back as it came, never shown."""

    type: Literal["redacted_thinking"] = "redacted_thinking"
    data: str


class ImageBlock(Frozen):
    """An image a tool gave the model (``read`` of a PNG, an MCP server's image content).

    ``data`` is the image as base64. In the run's workflow history and its log
    entries the data is left out (``data`` empty): the activity that made the
    image keeps it in the session store under ``digest`` (sha256 of the base64
    text), as a long tool output is staged, and the model call and the export
    fill it back in. An export always holds it whole.
    """

    type: Literal["image"] = "image"
    media_type: Literal["image/png", "image/jpeg", "image/gif", "image/webp"]
    data: str = ""
    digest: str
    size: int = Field(ge=0)  # the image's bytes (decoded)

    @property
    def is_reference(self) -> bool:
        """The data is left out: it is in the session store under ``digest``."""
        return not self.data

    def reference(self) -> ImageBlock:
        """This image without its data (what history and the log hold)."""
        return self if not self.data else self.model_copy(update={"data": ""})


class ToolResultBlock(Sparse):
    type: Literal["tool_result"] = "tool_result"
    tool_use_id: str
    content: str
    is_error: bool = False
    # Images the tool returned besides its text. Left out of the JSON when there are none,
    # so that a conversation without images keeps the bytes (and digests) it had before.
    images: tuple[ImageBlock, ...] = ()

    left_out_at_default = ("images",)


ContentBlock = Annotated[
    TextBlock | ToolUseBlock | ToolResultBlock | ThinkingBlock | RedactedThinkingBlock,
    Field(discriminator="type"),
]
# What a model's reasoning leaves in an assistant message.
ReasoningBlock = ThinkingBlock | RedactedThinkingBlock


class Message(Frozen):
    role: Literal["user", "assistant"]
    content: tuple[ContentBlock, ...]

    def text(self) -> str:
        return "".join(b.text for b in self.content if isinstance(b, TextBlock))

    def tool_uses(self) -> list[ToolUseBlock]:
        return [b for b in self.content if isinstance(b, ToolUseBlock)]

    def thinking(self) -> str:
        """The readable thinking of the message (redacted thinking has none)."""
        return "\n\n".join(b.thinking for b in self.content if isinstance(b, ThinkingBlock) and b.thinking)

    def images(self) -> list[ImageBlock]:
        return [i for b in self.content if isinstance(b, ToolResultBlock) for i in b.images]


class TokenUsage(Frozen):
    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0
    cache_read_tokens: int = 0
    cache_write_tokens: int = 0

    def __add__(self, other: TokenUsage) -> TokenUsage:
        return TokenUsage(
            prompt_tokens=self.prompt_tokens + other.prompt_tokens,
            completion_tokens=self.completion_tokens + other.completion_tokens,
            total_tokens=self.total_tokens + other.total_tokens,
            cache_read_tokens=self.cache_read_tokens + other.cache_read_tokens,
            cache_write_tokens=self.cache_write_tokens + other.cache_write_tokens,
        )


def usage_cost_usd(
    usage: TokenUsage,
    input_price: float | None,
    output_price: float | None,
    cache_read_price: float | None = None,
    cache_write_price: float | None = None,
) -> float | None:
    """What ``usage`` cost at these prices (USD per million tokens), or None without the
    input and output prices.

    ``prompt_tokens`` counts every prompt token, cached or not: the cache reads and writes
    among them are priced at their own prices where set, else as input.
    """
    if input_price is None or output_price is None:
        return None
    read = usage.cache_read_tokens if cache_read_price is not None else 0
    write = usage.cache_write_tokens if cache_write_price is not None else 0
    plain = max(usage.prompt_tokens - read - write, 0)
    micro = (
        plain * input_price
        + read * (cache_read_price or 0.0)
        + write * (cache_write_price or 0.0)
        + usage.completion_tokens * output_price
    )
    return micro / 1_000_000


class ToolsUnavailable(Frozen):
    """Tools of the run that the model was not offered at one step: their MCP server was down."""

    server: str
    tools: tuple[str, ...]
    reason: str


class ModelResponse(Frozen):
    """One model step: the assistant message, its usage and why it stopped."""

    message: Message
    usage: TokenUsage = TokenUsage()
    stop_reason: str | None = None
    # the model activity kept ``message`` in the session store too, under its digest
    staged: bool = False
    # the run's tools left out of this step's request (their MCP server was down)
    unavailable: tuple[ToolsUnavailable, ...] = ()


class ToolDefinition(Frozen):
    """A tool as offered to the model: name, description and JSON schema of its input."""

    name: str
    description: str
    input_schema: dict[str, Any]


class LiveText(Frozen):
    """A model call's text so far, while it streams (its activity's heartbeat details).

    Not an event of the run: it lives only while the call runs, and a retried
    call starts again from nothing with a higher ``attempt``, so a follower
    replaces the text it shows rather than appending a second copy. The run's
    durable ``text_delta`` event follows when the call completes.
    """

    type: Literal["live_text"] = "live_text"
    attempt: int
    text: str


# --- events -----------------------------------------------------------------


class InstructionFile(Frozen):
    """A project instruction file a run's system prompt took in (``AGENTS.md``, ``CLAUDE.md``):
    its path relative to the repository's root, the digest and size of what was taken."""

    path: str
    digest: str  # ``sha256:`` of the bytes taken in (the file's first bytes when it was cut)
    bytes: int = Field(ge=0)


class RunStartEvent(Sparse):
    type: Literal["run_start"] = "run_start"
    prompt: str
    model: str
    # "session/run at turn N, sha256:…" when the run resumes an exported checkpoint
    resumed_from: str | None = None
    # The project instruction files in the run's system prompt. Left out of the JSON when there
    # are none, so that the events of a run without them keep the bytes they had before.
    instruction_files: tuple[InstructionFile, ...] = ()

    left_out_at_default = ("instruction_files",)


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


class ToolStartEvent(Frozen):
    type: Literal["tool_start"] = "tool_start"
    id: str
    name: str
    input: dict[str, Any] = Field(default_factory=dict)  # long strings cut to a preview

    @classmethod
    def of(cls, id: str, name: str, arguments: dict[str, Any]) -> ToolStartEvent:
        def preview(value: Any) -> Any:
            if isinstance(value, str) and len(value) > TOOL_OUTPUT_PREVIEW_CHARS:
                more = len(value) - TOOL_OUTPUT_PREVIEW_CHARS
                return f"{value[:TOOL_OUTPUT_PREVIEW_CHARS]}…[{more} more characters]"
            return value

        return cls(id=id, name=name, input={k: preview(v) for k, v in arguments.items()})


class WorkspaceState(Sparse):
    """The workspace's files after a tool call that may change them, as a git tree
    (``activities/workspace_tree.py``); the objects are in the run's export sink.

    ``left_out``: files the tree does not hold because they passed the size bounds
    (``[workspace_checkpoints]``). Left out of the JSON when there are none.
    """

    tree: str  # the git tree id (SHA-1, 40 hex digits)
    left_out: tuple[str, ...] = ()

    left_out_at_default = ("left_out",)


class ToolEndEvent(Sparse):
    type: Literal["tool_end"] = "tool_end"
    id: str
    name: str
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


class PermissionDeniedEvent(Frozen):
    type: Literal["permission_denied"] = "permission_denied"
    id: str
    name: str
    reason: str


class ConfirmationRequiredEvent(Frozen):
    """A call waits for a person's decision (a rule said ``ask``)."""

    type: Literal["confirmation_required"] = "confirmation_required"
    id: str
    name: str
    target: str | None = None
    arguments: str  # a summary of the call's input, for the person deciding
    timeout_seconds: float | None = None
    # What a decision is bound to: the model step, and the digest of the call's full input.
    step: int | None = None
    arguments_digest: str | None = None


class ConfirmationReceivedEvent(Frozen):
    type: Literal["confirmation_received"] = "confirmation_received"
    id: str
    name: str
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


class ContextView(Frozen):
    """What of the conversation the model sees; the full transcript stays in the log.

    ``durable_agent.core.context`` turns the transcript and a view into the
    messages of a model request. A view is cumulative: the newest one (the last
    ``context_compacted`` event) is the whole truth.
    """

    version: int = 0  # how many compactions made it
    elided: tuple[str, ...] = ()  # tool-use ids whose results the model sees as a short stub
    summary: str | None = None  # stands for messages[1 : 1 + summarized] (the prompt stays)
    summarized: int = 0


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
    """A model step was asked without some of the run's tools: their MCP server was down
    (the model was told so). The run goes on; the next step offers them again if it is up."""

    type: Literal["tools_unavailable"] = "tools_unavailable"
    server: str
    tools: tuple[str, ...]
    reason: str


# The moments a ``[hooks]`` command runs at (``durable_agent.core.hooks``).
HookEventName = Literal["pre_tool_use", "post_tool_use", "user_prompt_submit", "stop"]


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


class TodoEvent(Frozen):
    """The model wrote its plan (``todo_write``): the whole list, which replaces the one before."""

    type: Literal["todo"] = "todo"
    todos: tuple[TodoItem, ...]


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
    | RewindEvent,
    Field(discriminator="type"),
]


class EventRecord(Frozen):
    sequence: int
    timestamp_ms: int
    event: AgentEvent
