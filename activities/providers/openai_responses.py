"""The ``openai`` kind with ``api = "responses"``: OpenAI's Responses API, streamed.

The only OpenAI protocol in which a reasoning model (GPT-5, the o-series) keeps
its reasoning between tool calls. Nothing is stored on OpenAI's side
(``store: false``): each request carries the whole conversation as input items,
and the reasoning comes back as items whose ``encrypted_content`` (asked for
with ``include``) is passed back unchanged on every later request. How the
project's messages map:

- the system prompt is the ``instructions``, and the tools (function tools,
  ``strict`` off: the run's schemas are not written for strict mode) come in
  the run's fixed order, so that every request of a run starts with the same
  prefix for the prompt cache, keyed by the session (``prompt_cache_key``);
- an assistant message becomes its items in their order: each ``ThinkingBlock``
  this wire made (id and encrypted content) a ``reasoning`` item, its text an
  assistant ``message`` item, each tool use a ``function_call`` item (arguments
  as a JSON string). Thinking of other wires is not sent: its signatures mean
  nothing here. A block that holds a reasoning item's own text (``reasoning_text``:
  gpt-oss on vLLM, which encrypts nothing) goes back as that text, the item's
  ``content``, whatever the settings: such a server reads the model's earlier
  reasoning from it, as a Chat Completions server does from ``reasoning_content``;
- each tool result is a ``function_call_output`` item (a failed tool's output
  with the ``Error:`` prefix, as in Chat Completions); a result's images follow
  the outputs of its turn in one ``user`` message of ``input_image`` parts
  (base64 ``data:`` URLs), then the user's text.

The answer's stream is read in ``openai_responses_stream``.
"""

from __future__ import annotations

import json
from typing import Any

from durable_agent.activities.providers.openai import (
    TOOL_ERROR_PREFIX,
    OpenAIProvider,
    OpenAIWire,
    add_sampling_and_cache_key,
)
from durable_agent.activities.providers.openai_responses_stream import WIRE, StreamState
from durable_agent.config import ResolvedModelSettings
from durable_agent.core.activity_api import ModelCallInput
from durable_agent.core.models import (
    ImageBlock,
    Message,
    TextBlock,
    ThinkingBlock,
    ToolDefinition,
    ToolResultBlock,
    ToolUseBlock,
)

# What ``include`` asks for: the reasoning, encrypted, to pass back without storing it.
ENCRYPTED_REASONING = "reasoning.encrypted_content"


def keeps_reasoning(settings: ResolvedModelSettings) -> bool:
    """Whether the model is a reasoning one (``reasoning``, or a ``reasoning_effort`` set).

    Only then is the encrypted reasoning asked for and passed back: OpenAI refuses
    ``include: ["reasoning.encrypted_content"]`` for a model without reasoning
    (GPT-4o, GPT-4.1: 400 "Encrypted content is not supported with this model").
    """
    return settings.reasoning or settings.reasoning_effort is not None


def reasoning_item(block: ThinkingBlock) -> dict[str, Any] | None:
    """A thinking block as the reasoning item it came from; None when it cannot go back.

    Without ``store``, OpenAI knows a reasoning item only by its encrypted content,
    so one without it (or without its id, or made by another wire) is not sent. A
    block of the item's own text (``reasoning_text``) goes back as that text, in one
    ``reasoning_text`` part (vLLM reads exactly one), with its encrypted content if any.

    Args:
        block: a thinking block of an assistant message.

    Returns:
        The ``reasoning`` input item, or None.
    """
    if block.wire != WIRE or not block.id:
        return None
    if block.reasoning_text:
        content = [{"type": "reasoning_text", "text": block.thinking}]
        item: dict[str, Any] = {"type": "reasoning", "id": block.id, "summary": [], "content": content}
        return item | ({"encrypted_content": block.signature} if block.signature else {})
    if not block.signature:
        return None
    summary = [{"type": "summary_text", "text": block.thinking}] if block.thinking else []
    return {"type": "reasoning", "id": block.id, "summary": summary, "encrypted_content": block.signature}


def _assistant_items(message: Message, with_reasoning: bool) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = []
    texts: list[str] = []

    def flush_text() -> None:
        text = "".join(texts)
        texts.clear()
        if text:
            content = [{"type": "output_text", "text": text}]
            items.append({"type": "message", "role": "assistant", "content": content})

    for block in message.content:
        if isinstance(block, TextBlock):
            texts.append(block.text)
            continue
        flush_text()
        if isinstance(block, ThinkingBlock) and (with_reasoning or block.reasoning_text):
            item = reasoning_item(block)
            if item is not None:
                items.append(item)
        elif isinstance(block, ToolUseBlock):
            arguments = json.dumps(block.input, ensure_ascii=False)
            call = {"type": "function_call", "call_id": block.id, "name": block.name}
            items.append({**call, "arguments": arguments})
    flush_text()
    # A reasoning item must be followed by the output it led to; an answer cut off while
    # the model was still reasoning has none, and OpenAI refuses its reasoning alone.
    while items and items[-1]["type"] == "reasoning":
        items.pop()
    return items


def image_part(image: ImageBlock) -> dict[str, Any]:
    """An image as a Responses input part: a base64 ``data:`` URL."""
    return {"type": "input_image", "image_url": f"data:{image.media_type};base64,{image.data}"}


def _user_items(message: Message) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = []
    images: list[dict[str, Any]] = []
    for block in message.content:
        if not isinstance(block, ToolResultBlock):
            continue
        output = TOOL_ERROR_PREFIX + block.content if block.is_error else block.content
        items.append({"type": "function_call_output", "call_id": block.tool_use_id, "output": output})
        if block.images:
            # A function call's output is text here, so its images come in a user message
            # after the outputs, each group named by the call that returned it.
            label = f"Images returned by tool call {block.tool_use_id}:"
            images.append({"type": "input_text", "text": label})
            images += [image_part(image) for image in block.images]
    if images:
        items.append({"type": "message", "role": "user", "content": images})
    texts = [{"type": "input_text", "text": b.text} for b in message.content if isinstance(b, TextBlock)]
    if texts:
        items.append({"type": "message", "role": "user", "content": texts})
    return items


def input_items(messages: tuple[Message, ...], *, with_reasoning: bool = True) -> list[dict[str, Any]]:
    """The conversation as Responses input items.

    Args:
        messages: the conversation, oldest first.
        with_reasoning: pass this wire's reasoning items back (a reasoning model).

    Returns:
        The items, in the conversation's order.
    """
    items: list[dict[str, Any]] = []
    for message in messages:
        if message.role == "assistant":
            items += _assistant_items(message, with_reasoning)
        else:
            items += _user_items(message)
    return items


def wire_tools(tools: tuple[ToolDefinition, ...]) -> list[dict[str, Any]]:
    """Tool definitions as Responses function tools, in the order given.

    ``strict`` defaults to on in this API, and strict mode refuses most schemas
    (every property required, no additional properties), so it is turned off.
    """
    return [
        {
            "type": "function",
            "name": t.name,
            "description": t.description,
            "parameters": t.input_schema,
            "strict": False,
        }
        for t in tools
    ]


def request_body(call: ModelCallInput, model: str, settings: ResolvedModelSettings) -> dict[str, Any]:
    """The whole request: streamed, stored nowhere, with the reasoning encrypted in the answer.

    Args:
        call: the conversation, tools and session of the step.
        model: the model's name on the server.
        settings: the model's resolved settings: ``reasoning`` (summaries of the reasoning,
            and the reasoning kept), ``reasoning_effort``, ``max_tokens``, ``temperature``,
            ``prompt_cache``.

    Returns:
        The JSON body of ``POST /responses``.
    """
    reasoning = keeps_reasoning(settings)
    body: dict[str, Any] = {
        "model": model,
        "input": input_items(call.messages, with_reasoning=reasoning),
        "stream": True,
        "store": False,
    }
    if call.system_prompt:
        body["instructions"] = call.system_prompt
    if call.tools:
        body["tools"] = wire_tools(call.tools)
    if reasoning:
        body["include"] = [ENCRYPTED_REASONING]
        options: dict[str, Any] = {}
        if settings.reasoning_effort is not None:
            options["effort"] = settings.reasoning_effort
        if settings.reasoning:
            options["summary"] = "auto"  # the readable thinking; without it only the encrypted part comes
        body["reasoning"] = options
    if settings.max_tokens is not None:
        body["max_output_tokens"] = settings.max_tokens
    add_sampling_and_cache_key(body, call, settings)
    return body


RESPONSES = OpenAIWire("/responses", request_body, StreamState)


class OpenAIResponsesProvider(OpenAIProvider):
    """The Responses API over HTTP; the key, as with Chat Completions, as ``Authorization: Bearer``."""

    wire = RESPONSES
