"""The ``openai`` kind: the Chat Completions wire protocol, streamed, with function tools.

Speaks to OpenAI and to the servers that copy its protocol (vLLM, SGLang,
Ollama, LM Studio, OpenRouter, DeepSeek, Groq...). How the project's messages
map:

- the system prompt is a ``system`` message, first, and the tools come in the
  run's fixed order, so that every request of a run starts with the same
  prefix and the server's prompt cache can serve it;
- an assistant message's text is its ``content``, its tool uses are its
  ``tool_calls`` (arguments as a JSON string) and its thinking is its
  ``reasoning_content`` (see ``wire_messages``);
- each tool result is a ``tool`` message right after the assistant message.
  The protocol has no error flag, so a failed tool's output is sent with an
  ``Error:`` prefix, the way the model would read it from a person. A tool
  message cannot carry images, so a result's images follow the tool messages
  in one ``user`` message of ``image_url`` parts (base64 ``data:`` URLs).

The answer's stream is read in ``openai_stream``.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

from durable_agent.activities.providers.http import HttpProvider, StreamReader, checked_key
from durable_agent.activities.providers.http_errors import Failures
from durable_agent.activities.providers.model_provider import TextSink, read_credential
from durable_agent.activities.providers.openai_stream import StreamState
from durable_agent.config import OpenAIProviderConfig, ResolvedModelSettings
from durable_agent.core.activity_api import ModelCallInput
from durable_agent.core.models import (
    ImageBlock,
    Message,
    ModelResponse,
    TextBlock,
    ThinkingBlock,
    ToolDefinition,
    ToolResultBlock,
    ToolUseBlock,
)

TOOL_ERROR_PREFIX = "Error: "
# OpenAI refuses a longer ``prompt_cache_key`` (400 ``string_above_max_length``), and
# DeepSeek and others copy the limit.
PROMPT_CACHE_KEY_MAX_LENGTH = 64
WIRE = "openai-chat"


def reasoning_content(message: Message, *, foreign_thinking: bool = False) -> str:
    """The thinking of an assistant message as it goes back in ``reasoning_content``.

    Thinking this wire received is always passed back, unchanged: DeepSeek's
    thinking mode (on by default) refuses a tool-using conversation in which
    any of it is missing, and the servers that did not send any get none back.
    Thinking from another wire (a session that changed model) goes only to a
    model configured with ``reasoning = true``: a server that never sent
    reasoning may refuse the unknown field, as OpenAI's own does.

    Args:
        message: an assistant message.
        foreign_thinking: also pass back thinking that another wire produced.

    Returns:
        The text to send, or "" when there is none to send.
    """
    return "\n\n".join(
        b.thinking
        for b in message.content
        if isinstance(b, ThinkingBlock) and b.thinking and (b.wire == WIRE or foreign_thinking)
    )


def image_part(image: ImageBlock) -> dict[str, Any]:
    """An image as a Chat Completions content part: a base64 ``data:`` URL."""
    return {"type": "image_url", "image_url": {"url": f"data:{image.media_type};base64,{image.data}"}}


def wire_messages(
    system_prompt: str, messages: tuple[Message, ...], *, foreign_thinking: bool = False
) -> list[dict[str, Any]]:
    """The conversation as Chat Completions messages.

    Args:
        system_prompt: sent first, as a ``system`` message (when not empty).
        messages: the conversation.
        foreign_thinking: pass back the thinking of other wires too (``reasoning_content``).

    Returns:
        The ``messages`` of the request.
    """
    out: list[dict[str, Any]] = []
    if system_prompt:
        out.append({"role": "system", "content": system_prompt})
    for message in messages:
        texts = [b.text for b in message.content if isinstance(b, TextBlock)]
        if message.role == "assistant":
            out.append(_assistant(message, "".join(texts), foreign_thinking))
            continue
        # Tool messages must follow the assistant's tool calls directly, so any
        # text of the same user message comes after them.
        results = [b for b in message.content if isinstance(b, ToolResultBlock)]
        for block in results:
            content = TOOL_ERROR_PREFIX + block.content if block.is_error else block.content
            out.append({"role": "tool", "tool_call_id": block.tool_use_id, "content": content})
        images: list[dict[str, Any]] = []
        for block in results:
            if block.images:
                images.append({"type": "text", "text": f"Images returned by tool call {block.tool_use_id}:"})
                images += [image_part(image) for image in block.images]
        if images:
            out.append({"role": "user", "content": images + [{"type": "text", "text": t} for t in texts]})
        elif len(texts) == 1:
            out.append({"role": "user", "content": texts[0]})
        elif texts:
            out.append({"role": "user", "content": [{"type": "text", "text": t} for t in texts]})
    return out


def _assistant(message: Message, text: str, foreign_thinking: bool) -> dict[str, Any]:
    calls = [
        {
            "id": b.id,
            "type": "function",
            "function": {"name": b.name, "arguments": json.dumps(b.input, ensure_ascii=False)},
        }
        for b in message.content
        if isinstance(b, ToolUseBlock)
    ]
    entry: dict[str, Any] = {"role": "assistant", "content": text or None}
    reasoning = reasoning_content(message, foreign_thinking=foreign_thinking)
    if reasoning:
        entry["reasoning_content"] = reasoning
    if calls:
        entry["tool_calls"] = calls
    elif entry["content"] is None:
        entry["content"] = ""  # only a message with tool calls may go without content
    return entry


def wire_tools(tools: tuple[ToolDefinition, ...]) -> list[dict[str, Any]]:
    """Tool definitions as Chat Completions function tools, in the order given."""
    return [
        {
            "type": "function",
            "function": {"name": t.name, "description": t.description, "parameters": t.input_schema},
        }
        for t in tools
    ]


def prompt_cache_key(session_id: str) -> str:
    """The session's ``prompt_cache_key``: the id itself, or a digest of an id too long for one."""
    if len(session_id) <= PROMPT_CACHE_KEY_MAX_LENGTH:
        return session_id
    return "session-" + hashlib.sha256(session_id.encode()).hexdigest()[:48]


def add_sampling_and_cache_key(
    body: dict[str, Any], call: ModelCallInput, settings: ResolvedModelSettings
) -> None:
    """What both OpenAI wires send alike, in place: ``temperature`` when set, and the session as
    ``prompt_cache_key`` unless ``prompt_cache`` is off (requests with one key are routed to the
    same cache: the runs of a session share a prefix)."""
    if settings.temperature is not None:
        body["temperature"] = settings.temperature
    if settings.prompt_cache and call.session_id:
        body["prompt_cache_key"] = prompt_cache_key(call.session_id)


def request_body(call: ModelCallInput, model: str, settings: ResolvedModelSettings) -> dict[str, Any]:
    """The whole request: streamed, with usage in the last chunk.

    Only fields the settings ask for are added to the protocol's basics, since
    some compatible servers refuse fields they do not know: ``reasoning_effort``
    when set, and ``prompt_cache_key`` (the session) unless ``prompt_cache`` is off.

    Args:
        call: the conversation, tools and session of the step.
        model: the model's name on the server.
        settings: the model's resolved settings.

    Returns:
        The JSON body of ``POST /chat/completions``.
    """
    body: dict[str, Any] = {
        "model": model,
        "messages": wire_messages(call.system_prompt, call.messages, foreign_thinking=settings.reasoning),
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if call.tools:  # some compatible servers refuse an empty list
        body["tools"] = wire_tools(call.tools)
    if settings.max_tokens is not None:
        body["max_tokens"] = settings.max_tokens
    if settings.reasoning_effort is not None:
        body["reasoning_effort"] = settings.reasoning_effort
    add_sampling_and_cache_key(body, call, settings)
    return body


@dataclass(frozen=True)
class OpenAIWire:
    """One of OpenAI's protocols: where a step is asked, its request's body, the reader of its answer."""

    path: str
    request_body: Callable[[ModelCallInput, str, ResolvedModelSettings], dict[str, Any]]
    reader: Callable[[Failures, int | None], StreamReader]


CHAT_COMPLETIONS = OpenAIWire("/chat/completions", request_body, StreamState)


class OpenAIProvider(HttpProvider):
    """Chat Completions over HTTP; the key, if any, goes as ``Authorization: Bearer``."""

    config: OpenAIProviderConfig
    wire: ClassVar[OpenAIWire] = CHAT_COMPLETIONS

    def __init__(self, name: str, config: OpenAIProviderConfig, api_key: str | None) -> None:
        super().__init__(name, config, api_key)

    @classmethod
    def from_config(cls, name: str, config: OpenAIProviderConfig) -> OpenAIProvider:
        """Read the key now, so a worker without it refuses to start."""
        env = config.api_key_env
        return cls(name, config, checked_key(read_credential(env, name), env, name) if env else None)

    def auth_headers(self) -> dict[str, str]:
        return {"authorization": f"Bearer {self._api_key}"} if self._api_key else {}

    async def complete(self, call: ModelCallInput, model: str, on_text: TextSink) -> ModelResponse:
        """Stream one step from the wire's ``path``, handing text to ``on_text`` as it comes."""
        settings = self.config.settings_for(model)
        failures = self.failures(model)
        state = self.wire.reader(failures, settings.max_tokens)
        body = self.wire.request_body(call, model, settings)
        async with self.event_stream(failures, self.wire.path, body, settings.headers) as events:
            async for event in events:
                # Chat Completions' end; servers of the Responses API that copy it send it too.
                if event.data.strip() == "[DONE]":
                    break
                state.feed(event.data, on_text)
                if state.finished:
                    break
        return state.response()
