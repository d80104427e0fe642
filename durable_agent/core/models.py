"""The conversation model shared by the workflow, activities and hosts.

Messages follow the content-block shape that both major wire formats can be
converted to without loss: a message is a role plus a list of blocks, and tool
calls and tool results are blocks tagged by ``type``. The run's events, which are
made of these, are in ``durable_agent.core.events``.
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


def _provider_slash_model(value: str, info: ValidationInfo) -> str:
    provider, _, name = value.partition("/")
    if not provider or not name:
        raise ValueError(f'{info.field_name or "the model"} must look like "provider/model", got {value!r}')
    return value


# A model as a run names it, "provider/model": a provider of the worker's config, then the
# model's name at that provider. A field of this type refuses another shape with
# '<field> must look like "provider/model"'.
QualifiedModel = Annotated[str, AfterValidator(_provider_slash_model)]


class TextBlock(Frozen):
    type: Literal["text"] = "text"
    text: str


class ToolCallBase(Frozen):
    """Base of what is about one tool call, its block (``ToolUseBlock``) and the run's events of
    it: the call's ``id`` and its tool's ``name``.

    ``type`` is declared here only so that it comes first in the JSON, as in every block and
    event (a field keeps the place where a base declared it); each subclass narrows it to its
    own tag.
    """

    type: str
    id: str
    name: str


class ToolUseBlock(ToolCallBase):
    type: Literal["tool_use"] = "tool_use"
    input: dict[str, Any] = Field(default_factory=dict)


class ThinkingBlock(Sparse):
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
    # A Responses API reasoning item's own text (its ``reasoning_text`` content, as gpt-oss on
    # vLLM gives it) rather than a summary of it: it goes back as that content, which such a
    # server reads the model's earlier reasoning from. Left out of the JSON when False.
    reasoning_text: bool = False

    left_out_at_default = ("reasoning_text",)


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


class TokenUsage(Sparse):
    """The tokens of one model call, or of many summed (``+``).

    ``prompt_tokens`` counts every prompt token, the cache's reads and writes among them;
    ``completion_tokens`` every output token, the reasoning's among them. ``reasoning_tokens``
    is that share, where the provider reports it (OpenAI's ``reasoning_tokens``; Anthropic
    reports none apart, its thinking is in ``output_tokens``). Left out of the JSON while 0,
    so that the usage of every call without reasoning keeps the bytes it had before.
    """

    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0
    cache_read_tokens: int = 0
    cache_write_tokens: int = 0
    reasoning_tokens: int = 0

    left_out_at_default = ("reasoning_tokens",)

    def __add__(self, other: TokenUsage) -> TokenUsage:
        return TokenUsage(
            prompt_tokens=self.prompt_tokens + other.prompt_tokens,
            completion_tokens=self.completion_tokens + other.completion_tokens,
            total_tokens=self.total_tokens + other.total_tokens,
            cache_read_tokens=self.cache_read_tokens + other.cache_read_tokens,
            cache_write_tokens=self.cache_write_tokens + other.cache_write_tokens,
            reasoning_tokens=self.reasoning_tokens + other.reasoning_tokens,
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
    # the run's tools whose MCP server was down at this step (offered still: a call is a tool error)
    unavailable: tuple[ToolsUnavailable, ...] = ()
    # When the model activity returned (epoch ms): the workflow stamps what it records in the
    # workflow task that takes the answer with it (``workflows/calls.py`` ``StepClock``), so that
    # a task run again after its worker died records the same times. None: an answer recorded
    # before the field existed, stamped with the workflow's clock as it was.
    completed_at_ms: int | None = None


class ToolDefinition(Frozen):
    """A tool as offered to the model: name, description and JSON schema of its input."""

    name: str
    description: str
    input_schema: dict[str, Any]


class LiveText(Sparse):
    """A model call's text so far, while it streams (its activity's heartbeat details).

    Not an event of the run: it lives only while the call runs, and a retried
    call starts again from nothing with a higher ``attempt``, so a follower
    replaces the text it shows rather than appending a second copy. The run's
    durable ``thinking`` and ``text_delta`` events follow when the call completes.

    ``thinking`` is the model's reasoning so far, apart from the answer's ``text``: a
    follower shows it as thinking, never as the answer. Left out of the JSON while empty,
    so that a call without reasoning heartbeats the bytes it did before.
    """

    type: Literal["live_text"] = "live_text"
    attempt: int
    text: str
    thinking: str = ""

    left_out_at_default = ("thinking",)


class InstructionFile(Frozen):
    """A project instruction file a run's system prompt took in (``AGENTS.md``, ``CLAUDE.md``):
    its path relative to the repository's root, the digest and size of what was taken."""

    path: str
    digest: str  # ``sha256:`` of the bytes taken in (the file's first bytes when it was cut)
    bytes: int = Field(ge=0)


class WorkspaceState(Sparse):
    """The workspace's files after a tool call that may change them, as a git tree
    (``activities/workspace_tree.py``); the objects are in the run's export sink.

    ``left_out``: files the tree does not hold because they passed the size bounds
    (``[workspace_checkpoints]``). Left out of the JSON when there are none.
    """

    tree: str  # the git tree id (SHA-1, 40 hex digits)
    left_out: tuple[str, ...] = ()

    left_out_at_default = ("left_out",)


class WorkspaceRestore(Frozen):
    """A worker made its copy of a run's workspace equal to the tree the run expected, before a
    call (``activities/workspaces/copies.py``).

    Attributes:
        tree: The tree restored.
        host: The worker that restored it, the run's host from then on.
        from_host: The run's host before (None: none yet).
        objects: The objects fetched from the run's sink.
        bytes: Their size, as the sink holds them (compressed).
        duration_ms: How long the restore took.
        reason: ``moved`` (the run's host was another worker), ``diverged`` (this worker's copy
            was not at the tree: a call cut short, a change from outside).
        replaced: The tree of the files the restore replaced, kept in that machine's shadow
            repository (None: the files there were the tree's already).
    """

    tree: str
    host: str
    from_host: str | None = None
    objects: int = 0
    bytes: int = 0
    duration_ms: int = 0
    reason: Literal["moved", "diverged"]
    replaced: str | None = None


class WorkspaceChange(Sparse):
    """What a run did to its workspace: the tree it started from, the tree it ended at, and the
    unified diff between them (``durable-agent diff`` gives it whole, from the sink).

    Attributes:
        base: The workspace's tree when the run started (None: not recorded).
        final: Its tree when the run ended (None: not recorded).
        diff: The unified diff from ``base`` to ``final``, at most ``DIFF_SHOWN_BYTES`` of it.
        diff_bytes: The whole diff's size in bytes.
        truncated: Whether ``diff`` is cut short.
        files: The paths that differ (at most ``DIFF_SHOWN_FILES``).
        branch: A workspace made from a git source, with ``[workspaces] commit``: the branch its
            change was to go to; ``commit`` the commit pushed there (None: not pushed, ``pushed``
            says why).
        commit: The commit pushed to ``branch``.
        pushed: Why the change was not pushed (a rule denied ``git_push``, git refused it).
    """

    base: str | None = None
    final: str | None = None
    diff: str = ""
    diff_bytes: int = 0
    truncated: bool = False
    files: tuple[str, ...] = ()
    branch: str | None = None
    commit: str | None = None
    pushed: str | None = None

    left_out_at_default = ("truncated", "files", "branch", "commit", "pushed")


DIFF_SHOWN_BYTES = 64 * 1024  # the most of a run's diff its result holds
DIFF_SHOWN_FILES = 1000  # the most paths a ``WorkspaceChange`` names


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


# The moments a ``[hooks]`` command runs at (``durable_agent.core.hooks``).
HookEventName = Literal["pre_tool_use", "post_tool_use", "user_prompt_submit", "stop"]
