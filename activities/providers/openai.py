"""The ``openai`` kind: the Chat Completions wire protocol, streamed, with function tools.

Speaks to OpenAI and to the servers that copy its protocol (vLLM, Ollama,
LM Studio, OpenRouter, DeepSeek, Groq...). How the project's messages map:

- the system prompt is a ``system`` message;
- an assistant message's text is its ``content`` and its tool uses are its
  ``tool_calls`` (arguments as a JSON string);
- each tool result is a ``tool`` message right after the assistant message.
  The protocol has no error flag, so a failed tool's output is sent with an
  ``Error:`` prefix, the way the model would read it from a person.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError

from durable_agent.activities.providers.base import TextSink, read_credential
from durable_agent.activities.providers.http import HttpProvider, checked_key, tool_arguments
from durable_agent.activities.providers.http_errors import Failures
from durable_agent.config import OpenAIProviderConfig, ResolvedModelSettings
from durable_agent.core.activity_api import ModelCallInput
from durable_agent.core.errors import validation_message
from durable_agent.core.models import (
    Message,
    ModelResponse,
    TextBlock,
    TokenUsage,
    ToolDefinition,
    ToolResultBlock,
    ToolUseBlock,
)

TOOL_ERROR_PREFIX = "Error: "
# Chat Completions' finish reasons in the project's (Messages) vocabulary.
_STOP_REASONS = {
    "stop": "end_turn",
    "tool_calls": "tool_use",
    "function_call": "tool_use",
    "length": "max_tokens",
}


def wire_messages(system_prompt: str, messages: tuple[Message, ...]) -> list[dict[str, Any]]:
    """The conversation as Chat Completions messages."""
    out: list[dict[str, Any]] = []
    if system_prompt:
        out.append({"role": "system", "content": system_prompt})
    for message in messages:
        texts = [b.text for b in message.content if isinstance(b, TextBlock)]
        if message.role == "assistant":
            calls = [
                {
                    "id": b.id,
                    "type": "function",
                    "function": {"name": b.name, "arguments": json.dumps(b.input, ensure_ascii=False)},
                }
                for b in message.content
                if isinstance(b, ToolUseBlock)
            ]
            entry: dict[str, Any] = {"role": "assistant", "content": "".join(texts) or None}
            if calls:
                entry["tool_calls"] = calls
            elif entry["content"] is None:
                entry["content"] = ""  # only a message with tool calls may go without content
            out.append(entry)
            continue
        # Tool messages must follow the assistant's tool calls directly, so any
        # text of the same user message comes after them.
        for block in message.content:
            if isinstance(block, ToolResultBlock):
                content = TOOL_ERROR_PREFIX + block.content if block.is_error else block.content
                out.append({"role": "tool", "tool_call_id": block.tool_use_id, "content": content})
        if len(texts) == 1:
            out.append({"role": "user", "content": texts[0]})
        elif texts:
            out.append({"role": "user", "content": [{"type": "text", "text": t} for t in texts]})
    return out


def wire_tools(tools: tuple[ToolDefinition, ...]) -> list[dict[str, Any]]:
    """Tool definitions as Chat Completions function tools."""
    return [
        {
            "type": "function",
            "function": {"name": t.name, "description": t.description, "parameters": t.input_schema},
        }
        for t in tools
    ]


def request_body(call: ModelCallInput, model: str, settings: ResolvedModelSettings) -> dict[str, Any]:
    """The whole request: streamed, with usage in the last chunk."""
    body: dict[str, Any] = {
        "model": model,
        "messages": wire_messages(call.system_prompt, call.messages),
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if call.tools:  # some compatible servers refuse an empty list
        body["tools"] = wire_tools(call.tools)
    if settings.max_tokens is not None:
        body["max_tokens"] = settings.max_tokens
    if settings.temperature is not None:
        body["temperature"] = settings.temperature
    return body


# --- the stream ----------------------------------------------------------------


class _Wire(BaseModel):
    # Servers add fields freely; only what is read here must have its type.
    model_config = ConfigDict(extra="ignore")


class _FunctionDelta(_Wire):
    name: str | None = None
    arguments: str | None = None


class _ToolCallDelta(_Wire):
    index: int | None = None
    id: str | None = None
    function: _FunctionDelta | None = None


class _Delta(_Wire):
    content: str | None = None
    refusal: str | None = None  # OpenAI's safety refusal, in place of content
    tool_calls: list[_ToolCallDelta] | None = None


class _Choice(_Wire):
    index: int = 0
    delta: _Delta | None = None
    finish_reason: str | None = None


class _PromptDetails(_Wire):
    cached_tokens: int | None = None


class _Usage(_Wire):
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    total_tokens: int | None = None
    prompt_tokens_details: _PromptDetails | None = None


class _Chunk(_Wire):
    choices: list[_Choice] | None = None
    usage: _Usage | None = None
    error: Any = None


class _Call:
    def __init__(self) -> None:
        self.id = ""
        self.name = ""
        self.arguments: list[str] = []


class StreamState:
    """Builds the step from the chunks: text, tool calls by index, finish reason, usage."""

    def __init__(self, failures: Failures, max_tokens: int | None) -> None:
        self.failures = failures
        self.max_tokens = max_tokens
        self.text: list[str] = []
        self.calls: dict[int, _Call] = {}
        self.finish_reason: str | None = None
        self.usage = TokenUsage()

    def feed(self, data: str, on_text: TextSink) -> None:
        try:
            chunk = _Chunk.model_validate_json(data)
        except ValidationError as exc:
            raise self.failures.unparsable(
                f"a stream chunk is not a chat completion chunk: {validation_message(exc)}", data
            ) from None
        if chunk.error is not None:
            raise _stream_error(self.failures, chunk.error)
        if chunk.usage is not None:
            self.usage = _usage(chunk.usage)
        for choice in chunk.choices or []:
            if choice.index != 0:  # one answer is asked for (n = 1)
                continue
            if choice.finish_reason:
                self.finish_reason = choice.finish_reason
            delta = choice.delta
            if delta is None:
                continue
            for text in (delta.content, delta.refusal):
                if text:
                    self.text.append(text)
                    on_text(text)
            for part in delta.tool_calls or []:
                self._add_call_part(part)

    def _add_call_part(self, part: _ToolCallDelta) -> None:
        index = part.index
        if index is None:
            # Servers that omit the index send each call whole: a new id is a new call.
            known = {c.id for c in self.calls.values()}
            fresh = part.id is not None and part.id not in known
            index = len(self.calls) if fresh or not self.calls else max(self.calls)
        call = self.calls.setdefault(index, _Call())
        if part.id and not call.id:
            call.id = part.id
        if part.function is not None:
            if part.function.name and not call.name:
                call.name = part.function.name
            if part.function.arguments:
                call.arguments.append(part.function.arguments)

    def response(self) -> ModelResponse:
        """The finished step; a stream without a finish reason was cut off."""
        if self.finish_reason is None:
            raise self.failures.ended_early()
        blocks: list[TextBlock | ToolUseBlock] = []
        text = "".join(self.text)
        if text:
            blocks.append(TextBlock(text=text))
        for index in sorted(self.calls):
            blocks.append(self._tool_use(self.calls[index]))
        if not blocks:
            blocks.append(TextBlock(text=""))
        stop = "tool_use" if self.calls else _STOP_REASONS.get(self.finish_reason, self.finish_reason)
        return ModelResponse(
            message=Message(role="assistant", content=tuple(blocks)), usage=self.usage, stop_reason=stop
        )

    def _tool_use(self, call: _Call) -> ToolUseBlock:
        if not call.name:
            raise self.failures.unparsable("a tool call has no function name")
        arguments = tool_arguments(
            self.failures,
            call.name,
            "".join(call.arguments),
            given={},
            cut_off=self.finish_reason == "length",
            max_tokens=self.max_tokens,
        )
        # Ids pair each result with its call; a server that sends none gets one made up.
        call_id = call.id or f"call_{uuid.uuid4().hex[:24]}"
        return ToolUseBlock(id=call_id, name=call.name, input=arguments)


def _usage(usage: _Usage) -> TokenUsage:
    prompt = usage.prompt_tokens or 0
    completion = usage.completion_tokens or 0
    details = usage.prompt_tokens_details
    return TokenUsage(
        prompt_tokens=prompt,
        completion_tokens=completion,
        total_tokens=usage.total_tokens or prompt + completion,
        cache_read_tokens=(details.cached_tokens or 0) if details else 0,
    )


def _stream_error(failures: Failures, error: Any) -> Exception:
    """An ``{"error": ...}`` chunk (vLLM, OpenRouter): its numeric code, if any, is the status."""
    if isinstance(error, dict):
        code = error.get("code")
        status = code if isinstance(code, int) else None
        said = error.get("message")
        return failures.in_stream(said if isinstance(said, str) else json.dumps(error), status, error=error)
    return failures.in_stream(str(error), None)


class OpenAIProvider(HttpProvider):
    """Chat Completions over HTTP; the key, if any, goes as ``Authorization: Bearer``."""

    config: OpenAIProviderConfig

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
        """Stream one step from ``/chat/completions``, handing text to ``on_text`` as it comes."""
        settings = self.config.settings_for(model)
        failures = self.failures(model)
        state = StreamState(failures, settings.max_tokens)
        body = request_body(call, model, settings)
        async with self.event_stream(failures, "/chat/completions", body, settings.headers) as events:
            async for event in events:
                if event.data.strip() == "[DONE]":
                    break
                state.feed(event.data, on_text)
        return state.response()
