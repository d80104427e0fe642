"""Context management's activity side: a run's ``ContextPolicy`` from the worker's config,
and ``agent.compact``, which has a model summarize the older part of a run's conversation.

The summary step reads the conversation from the run's log as the model step does, and
sees it as the model sees it now (``durable_agent.core.context.model_messages``): the
previous summary and the turns to summarize, each tool output cut short, the whole kept
within a budget so that the summarizing request fits the window too.
"""

from __future__ import annotations

from temporalio import activity
from temporalio.exceptions import ApplicationError

from durable_agent.activities.model_call import ModelCalls, provider_failure
from durable_agent.activities.providers.anthropic_wire import thinking_budget
from durable_agent.activities.providers.model_provider import ProviderError
from durable_agent.activities.support import heartbeating, usage_error
from durable_agent.config import (
    AgentConfig,
    AnthropicProviderConfig,
    HttpProviderConfig,
    ScriptedProviderConfig,
)
from durable_agent.core.activity_api import COMPACT, CompactInput, CompactOutput, ModelCallInput
from durable_agent.core.canonical import canonical_bytes
from durable_agent.core.context import (
    BYTES_PER_TOKEN,
    DEFAULT_RESERVE,
    FALLBACK_WINDOW,
    ContextPolicy,
    known_window,
    model_messages,
)
from durable_agent.core.failures import EMPTY_SUMMARY
from durable_agent.core.models import ContextView, Message, TextBlock, ToolResultBlock, ToolUseBlock

# Each tool output shows at most this many characters to the summarizer.
RESULT_PREVIEW_CHARS = 2_000
SUMMARIZE_SYSTEM = (
    "You summarize the earlier part of a coding agent's conversation so that the agent can go on "
    "without it. Keep what the agent will need: the task, decisions made, facts found (file paths, "
    "names, numbers, errors), what was changed, and what remains to do. Do not invent anything. "
    "Write plain text, at most {words} words."
)


def context_policy(config: AgentConfig, model: str) -> ContextPolicy | None:
    """The context management of a run of ``model``, or ``None`` when its window is unknown
    (a scripted model without ``context_window``)."""
    provider_name, _, name = model.partition("/")
    provider = config.providers.get(provider_name)
    if provider is None:
        return None
    window: int | None
    reserve = DEFAULT_RESERVE
    if isinstance(provider, ScriptedProviderConfig):
        window = provider.context_window
    else:
        assert isinstance(provider, HttpProviderConfig)
        own = provider.models.get(name)
        window = (
            (own.context_window if own is not None else None)
            or provider.context_window
            or known_window(name)
            or FALLBACK_WINDOW
        )
        settings = provider.settings_for(name)
        reserve = settings.max_tokens or DEFAULT_RESERVE
        if isinstance(provider, AnthropicProviderConfig):
            # with extended thinking a request asks for max_tokens plus the thinking budget
            reserve += thinking_budget(settings) or 0
    if window is None:
        return None
    ctx = config.context
    if ctx.compaction_model is not None and ctx.compaction_model.partition("/")[0] not in config.providers:
        raise usage_error(
            f"[context] compaction_model {ctx.compaction_model!r} names a provider that is not configured"
        )
    return ContextPolicy(
        window=window,
        reserve=min(reserve, window // 2),
        compact_at=ctx.compact_at,
        compact_to=ctx.compact_to,
        keep_recent=ctx.keep_recent,
        compaction_model=ctx.compaction_model,
    )


def render(messages: list[Message], calls: dict[str, ToolUseBlock]) -> list[str]:
    """The messages as plain text lines for the summarizer; tool outputs cut short."""
    lines: list[str] = []
    for message in messages:
        for block in message.content:
            if isinstance(block, TextBlock):
                who = "USER" if message.role == "user" else "ASSISTANT"
                lines.append(f"{who}: {block.text}")
            elif isinstance(block, ToolUseBlock):
                args = canonical_bytes(block.input).decode()
                if len(args) > RESULT_PREVIEW_CHARS:
                    args = args[:RESULT_PREVIEW_CHARS] + f"… [{len(args) - RESULT_PREVIEW_CHARS} more]"
                lines.append(f"ASSISTANT called {block.name} {args}")
            elif isinstance(block, ToolResultBlock):
                call = calls.get(block.tool_use_id)
                text = block.content
                if len(text) > RESULT_PREVIEW_CHARS:
                    text = (
                        text[:RESULT_PREVIEW_CHARS] + f"… [{len(block.content) - RESULT_PREVIEW_CHARS} more]"
                    )
                kind = "error" if block.is_error else "output"
                lines.append(f"TOOL {call.name if call else ''} {kind}: {text}")
    return lines


def within(lines: list[str], budget_bytes: int) -> str:
    """The lines joined, at most ``budget_bytes``: the start and the end kept, the middle cut."""
    text = "\n".join(lines)
    data = text.encode()
    if len(data) <= budget_bytes:
        return text
    head = data[: budget_bytes // 3].decode(errors="ignore")
    tail = data[len(data) - (budget_bytes - budget_bytes // 3) :].decode(errors="ignore")
    return f"{head}\n[… part of the conversation left out …]\n{tail}"


def summary_request(
    messages: tuple[Message, ...], view: ContextView | None, upto: int, max_tokens: int, budget: int
) -> str:
    """The summarizer's one user message: the previous summary and ``messages[1:upto]`` as the
    model sees them now."""
    start = 1 + view.summarized if view is not None and view.summary is not None else 1
    calls = {c.id: c for m in messages if m.role == "assistant" for c in m.tool_uses()}
    shown = model_messages(messages, view.model_copy(update={"summary": None}) if view else None)
    region = shown[start:upto]
    parts = []
    if view is not None and view.summary:
        parts.append(f"SUMMARY SO FAR: {view.summary}")
    parts.extend(render(region, calls))
    words = max(20, max_tokens * BYTES_PER_TOKEN // 8)
    instruction = (
        f"Summarize this part of the conversation in at most {words} words "
        "(the task's prompt is kept separately):\n\n"
    )
    return instruction + within(parts, max(1024, budget * BYTES_PER_TOKEN - len(instruction)))


def cut_to(text: str, max_tokens: int) -> str:
    data = text.encode()
    limit = max_tokens * BYTES_PER_TOKEN
    return text if len(data) <= limit else data[:limit].decode(errors="ignore")


class Compactions:
    """``agent.compact``: a summary of the older part of a run's conversation."""

    def __init__(self, models: ModelCalls) -> None:
        self.models = models

    @activity.defn(name=COMPACT.name)
    async def compact(self, inp: CompactInput) -> CompactOutput:
        provider, model = self.models.provider(inp.model)
        call, view = await self.models.transcript(inp.run_id, inp.model, inp.log, inp.pending)
        request = summary_request(call.messages, view, inp.upto, inp.max_summary_tokens, inp.budget_tokens)
        words = max(20, inp.max_summary_tokens * BYTES_PER_TOKEN // 8)
        ask = ModelCallInput(
            run_id=inp.run_id,
            model=inp.model,
            system_prompt=SUMMARIZE_SYSTEM.format(words=words),
            messages=(Message(role="user", content=(TextBlock(text=request),)),),
            tools=(),
            purpose="summary",
        )
        telemetry = self.models.telemetry
        with (
            telemetry.compaction(inp.model),
            telemetry.model_call(inp.model.partition("/")[0], model, ask) as observed,
        ):
            try:
                response = await heartbeating(provider.complete(ask, model, lambda _: None))
            except ProviderError as exc:
                raise provider_failure(exc, self.models.redact) from None
            text = self.models.redact(response.message.text()).strip()
            observed.answered(
                response.model_copy(
                    update={"message": Message(role="assistant", content=(TextBlock(text=text),))}
                )
            )
            if not text:
                raise ApplicationError(
                    f"model {inp.model} wrote an empty summary", type=EMPTY_SUMMARY, non_retryable=True
                )
        return CompactOutput(summary=cut_to(text, inp.max_summary_tokens), usage=response.usage)
