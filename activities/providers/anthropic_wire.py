"""The request of the ``anthropic`` kind: messages, tools, extended thinking and cache breakpoints.

Messages map block for block: text, ``tool_use`` (id, name, input), ``tool_result``
(with its ``is_error`` flag, and its images as ``image`` blocks after its text), and
the model's own ``thinking`` / ``redacted_thinking`` blocks, passed back exactly as
they came; the system prompt is the request's ``system`` field.

Extended thinking (``thinking_budget_tokens``, or ``reasoning`` alone with a budget
of ``DEFAULT_THINKING_BUDGET``) sends ``thinking: {"type": "enabled", ...}``; the
budget is part of ``max_tokens``, so ``max_tokens`` grows by it and the answer keeps
the room configured. ``temperature`` is not sent with thinking configured: the API
refuses any but the default there.

Prompt caching (``prompt_cache``, on by default) puts ``cache_control`` breakpoints
on the last tool, on the system prompt, and on the newest messages (the last block
of the last message, and that of the user message before it), four in all: the most
the API takes. Each request then reads the prefix the one before it wrote.
"""

from __future__ import annotations

from typing import Any

from durable_agent.activities.providers.model_provider import ProviderError
from durable_agent.config import ResolvedModelSettings
from durable_agent.core import models
from durable_agent.core.activity_api import ModelCallInput

DEFAULT_MAX_TOKENS = 4096
# The thinking budget of a model configured with ``reasoning`` and no budget of its own.
DEFAULT_THINKING_BUDGET = 4096
EPHEMERAL = {"type": "ephemeral"}
_REASONING_TYPES = ("thinking", "redacted_thinking")


def thinking_budget(settings: ResolvedModelSettings) -> int | None:
    """The thinking budget of a model.

    Args:
        settings: the model's resolved settings.

    Returns:
        ``thinking_budget_tokens``; else ``DEFAULT_THINKING_BUDGET`` for a model with
        ``reasoning``; else None: the model is not asked to think.
    """
    if settings.thinking_budget_tokens is not None:
        return settings.thinking_budget_tokens
    return DEFAULT_THINKING_BUDGET if settings.reasoning else None


def _sendable(block: models.ThinkingBlock) -> bool:
    # Only Anthropic's own signed thinking goes back: the API checks the signature
    # against the text, so thinking from another wire, or whose signature was
    # dropped (its text redacted), would be refused.
    return block.wire == "anthropic" and bool(block.signature)


def _wire_block(block: Any) -> dict[str, Any] | None:
    """One block as the API takes it; None for a block that is not sent."""
    if isinstance(block, models.TextBlock):
        # The API refuses empty text blocks.
        return {"type": "text", "text": block.text} if block.text else None
    if isinstance(block, models.ToolUseBlock):
        return {"type": "tool_use", "id": block.id, "name": block.name, "input": block.input}
    if isinstance(block, models.ThinkingBlock):
        if not _sendable(block):
            return None
        return {"type": "thinking", "thinking": block.thinking, "signature": block.signature}
    if isinstance(block, models.RedactedThinkingBlock):
        return {"type": "redacted_thinking", "data": block.data}
    if isinstance(block, models.ToolResultBlock):
        return _tool_result(block)
    raise TypeError(f"no Messages API form for a {type(block).__name__}")


def _tool_result(block: models.ToolResultBlock) -> dict[str, Any]:
    content: str | list[dict[str, Any]] = block.content
    if block.images:
        parts: list[dict[str, Any]] = [{"type": "text", "text": block.content}] if block.content else []
        for image in block.images:
            if image.is_reference:
                # The model activity fills every image in; one without data would be
                # sent as an empty image, which the API refuses.
                raise ProviderError(
                    f"the image {image.digest} of tool result {block.tool_use_id} reached the "
                    "provider without its data",
                    retryable=False,
                )
            source = {"type": "base64", "media_type": image.media_type, "data": image.data}
            parts.append({"type": "image", "source": source})
        content = parts
    result: dict[str, Any] = {"type": "tool_result", "tool_use_id": block.tool_use_id, "content": content}
    if block.is_error:
        result["is_error"] = True
    return result


def wire_messages(messages: tuple[models.Message, ...]) -> list[dict[str, Any]]:
    """The conversation as Messages API messages, block for block, in their order.

    Args:
        messages: the conversation; images of tool results with their data filled in.

    Returns:
        One message each. An assistant message's thinking stays where the model put
        it (first); thinking that cannot be passed back (another wire's, or unsigned)
        is left out.
    """
    out: list[dict[str, Any]] = []
    for message in messages:
        blocks = [b for b in (_wire_block(block) for block in message.content) if b is not None]
        out.append({"role": message.role, "content": blocks or [{"type": "text", "text": ""}]})
    return out


def wire_tools(tools: tuple[models.ToolDefinition, ...]) -> list[dict[str, Any]]:
    """Tool definitions as Messages API tools."""
    return [{"name": t.name, "description": t.description, "input_schema": t.input_schema} for t in tools]


def thinking_can_stay_on(messages: tuple[models.Message, ...]) -> bool:
    """Whether a request over ``messages`` may have thinking on.

    With thinking on, the API wants the last assistant message, when it used a
    tool (the tool-use turn the request continues), to start with that turn's
    thinking, signed and unmodified. A conversation resumed from an export made
    before thinking was kept, one whose thinking the worker's secret redaction
    changed (and so unsigned), or one begun on another provider cannot give it.
    Thinking off is allowed there (and the next turn thinks again), whereas thinking
    on would be refused with a 400, so such a request goes without thinking.

    Args:
        messages: the request's conversation.

    Returns:
        False when the last assistant message used a tool and its thinking cannot be
        sent back whole and first; True otherwise.
    """
    last = next((m for m in reversed(messages) if m.role == "assistant"), None)
    if last is None or not last.tool_uses():
        return True
    thinking = [b for b in last.content if isinstance(b, models.ThinkingBlock)]
    redacted = [b for b in last.content if isinstance(b, models.RedactedThinkingBlock)]
    # Redacted thinking always goes back as it came; thinking only when it can (``_sendable``).
    if not (thinking or redacted) or not all(_sendable(b) for b in thinking):
        return False
    [sent] = wire_messages((last,))
    return bool(sent["content"][0]["type"] in _REASONING_TYPES)


def _mark_last_block(message: dict[str, Any]) -> None:
    """Put a breakpoint on the message's last block that may carry one, if any may.

    The API refuses ``cache_control`` on thinking blocks and on empty text blocks.
    """
    for block in reversed(message["content"]):
        if block["type"] in _REASONING_TYPES or (block["type"] == "text" and not block["text"]):
            continue
        block["cache_control"] = EPHEMERAL
        return


def add_cache_breakpoints(body: dict[str, Any]) -> None:
    """Put the (at most four) ``cache_control`` breakpoints on ``body``, in place.

    The last tool caches the tools; the system prompt, sent as one text block,
    caches them and it. On the messages the breakpoints roll: the last message's
    caches the whole conversation for the next request, and the one on the user
    message before it is where the request before this one put its last, so this
    request reads everything up to there from the cache.

    Args:
        body: a request as ``request_body`` builds it, ``system`` still a string.
    """
    if body.get("tools"):
        body["tools"][-1]["cache_control"] = EPHEMERAL
    if isinstance(body.get("system"), str):
        body["system"] = [{"type": "text", "text": body["system"], "cache_control": EPHEMERAL}]
    messages: list[dict[str, Any]] = body["messages"]
    if messages:
        _mark_last_block(messages[-1])
    users = [m for m in messages[:-1] if m["role"] == "user"]
    if users:
        _mark_last_block(users[-1])


def request_body(call: ModelCallInput, model: str, settings: ResolvedModelSettings) -> dict[str, Any]:
    """The whole request, streamed.

    Args:
        call: the conversation, system prompt and tools of the step.
        model: the model's name at Anthropic.
        settings: the model's resolved settings (thinking, caching, limits).

    Returns:
        The JSON body for ``/v1/messages``; ``max_tokens`` is always set (the API
        requires it), and includes the thinking budget when thinking is on.
    """
    configured = thinking_budget(settings)
    budget = configured if configured is not None and thinking_can_stay_on(call.messages) else None
    body: dict[str, Any] = {
        "model": model,
        "max_tokens": (settings.max_tokens or DEFAULT_MAX_TOKENS) + (budget or 0),
        "messages": wire_messages(call.messages),
        "stream": True,
    }
    if budget is not None:
        body["thinking"] = {"type": "enabled", "budget_tokens": budget}
    if call.system_prompt:
        body["system"] = call.system_prompt
    if call.tools:
        body["tools"] = wire_tools(call.tools)
    # With thinking configured the API takes no temperature but its default; a request
    # sent without thinking (above) keeps that sampling too, as the rest of the run has.
    if settings.temperature is not None and configured is None:
        body["temperature"] = settings.temperature
    if settings.prompt_cache:
        add_cache_breakpoints(body)
    return body
