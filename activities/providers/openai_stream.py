"""Reading a streamed Chat Completions answer: text, reasoning, tool calls and usage.

Reasoning servers add the model's thinking to each delta beside ``content``,
each under its own name: ``reasoning_content`` (DeepSeek, and vLLM / SGLang
serving Qwen3, GLM or Kimi), ``reasoning`` (OpenRouter, newer vLLM) and
OpenRouter's structured ``reasoning_details``. Some send the same text under
two of these names at once, so a delta's reasoning is taken from the first of
them that it carries. The joined text becomes one ``ThinkingBlock`` (wire
``openai-chat``) at the start of the assistant message, to be passed back
unchanged as ``reasoning_content`` on every later request. Each piece goes to
``thinking_sink(on_text)`` as it streams, never to ``on_text``, which is for
the answer.

Usage: OpenAI (and the servers that copy it) count the reasoning's tokens among
``completion_tokens`` and report them as
``completion_tokens_details.reasoning_tokens``, kept as ``reasoning_tokens``.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

from durable_agent.activities.providers.http import StreamReader, Wire, nested
from durable_agent.activities.providers.http_errors import Failures
from durable_agent.activities.providers.model_provider import TextSink, assistant_step, thinking_sink
from durable_agent.core.models import (
    ModelResponse,
    TextBlock,
    ThinkingBlock,
    TokenUsage,
    ToolUseBlock,
)

# Chat Completions' finish reasons in the project's (Messages) vocabulary.
_STOP_REASONS = {
    "stop": "end_turn",
    "tool_calls": "tool_use",
    "function_call": "tool_use",
    "length": "max_tokens",
}


class _ToolCallDelta(Wire):
    index: int | None = None
    id: str | None = None
    # the call's ``function``: its name, and a piece of its arguments
    name: str | None = nested("function", "name")
    arguments: str | None = nested("function", "arguments")


class _ReasoningDetail(Wire):
    # OpenRouter: "reasoning.text" carries ``text``, "reasoning.summary" its ``summary``;
    # "reasoning.encrypted" carries neither and has nothing readable.
    type: str | None = None
    text: str | None = None
    summary: str | None = None


class _Delta(Wire):
    content: str | None = None
    refusal: str | None = None  # OpenAI's safety refusal, in place of content
    reasoning_content: str | None = None
    reasoning: str | None = None
    reasoning_details: list[_ReasoningDetail] | None = None
    tool_calls: list[_ToolCallDelta] | None = None

    def thinking(self) -> str:
        """This delta's reasoning text: from the first field that carries any."""
        if self.reasoning_content:
            return self.reasoning_content
        if self.reasoning:
            return self.reasoning
        return "".join(d.text or d.summary or "" for d in self.reasoning_details or [])


class _Choice(Wire):
    index: int = 0
    delta: _Delta | None = None
    finish_reason: str | None = None


class _Usage(Wire):
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    total_tokens: int | None = None
    cached_tokens: int | None = nested("prompt_tokens_details", "cached_tokens")
    # DeepSeek's own name for the prompt tokens read from its cache.
    prompt_cache_hit_tokens: int | None = None
    # among ``completion_tokens``
    reasoning_tokens: int | None = nested("completion_tokens_details", "reasoning_tokens")

    def token_usage(self) -> TokenUsage:
        """The project's counts, which are OpenAI's: the prompt's cached tokens are among its own."""
        prompt = self.prompt_tokens or 0
        completion = self.completion_tokens or 0
        cached = self.cached_tokens if self.cached_tokens is not None else self.prompt_cache_hit_tokens
        return TokenUsage(
            prompt_tokens=prompt,
            completion_tokens=completion,
            total_tokens=self.total_tokens or prompt + completion,
            cache_read_tokens=cached or 0,
            reasoning_tokens=self.reasoning_tokens or 0,
        )


class _Chunk(Wire):
    choices: list[_Choice] | None = None
    usage: _Usage | None = None
    error: Any = None


class _Call:
    def __init__(self) -> None:
        self.id = ""
        self.name = ""
        self.arguments: list[str] = []


class StreamState(StreamReader):
    """Builds the step from the chunks: reasoning, text, tool calls by index, finish reason, usage."""

    def __init__(self, failures: Failures, max_tokens: int | None) -> None:
        super().__init__(failures, max_tokens)
        self.thinking: list[str] = []
        self.text: list[str] = []
        self.calls: dict[int, _Call] = {}
        self.finish_reason: str | None = None
        self.usage = TokenUsage()

    def feed(self, data: str, on_text: TextSink) -> None:
        """Take one event's data (a chunk as JSON); answer text goes on to ``on_text``.

        Args:
            data: the ``data`` of one server-sent event, other than ``[DONE]``.
            on_text: receives each piece of answer text (never reasoning, which goes to
                ``thinking_sink(on_text)``).
        """
        chunk = self.parse(_Chunk, data, "a stream chunk is not a chat completion chunk")
        if chunk.error is not None:
            raise _stream_error(self.failures, chunk.error)
        if chunk.usage is not None:
            self.usage = chunk.usage.token_usage()
        for choice in chunk.choices or []:
            if choice.index != 0:  # one answer is asked for (n = 1)
                continue
            if choice.finish_reason:
                self.finish_reason = choice.finish_reason
            delta = choice.delta
            if delta is None:
                continue
            thinking = delta.thinking()
            if thinking:
                self.thinking.append(thinking)
                thinking_sink(on_text)(thinking)
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
        if part.name and not call.name:
            call.name = part.name
        if part.arguments:
            call.arguments.append(part.arguments)

    def response(self) -> ModelResponse:
        """The finished step; a stream without a finish reason was cut off.

        Returns:
            The assistant message (its thinking first, then text, then tool
            uses in index order), the usage and the stop reason.
        """
        if self.finish_reason is None:
            raise self.failures.ended_early()
        blocks: list[ThinkingBlock | TextBlock | ToolUseBlock] = []
        thinking = "".join(self.thinking)
        if thinking:
            blocks.append(ThinkingBlock(thinking=thinking, wire="openai-chat"))
        text = "".join(self.text)
        if text:
            blocks.append(TextBlock(text=text))
        for index in sorted(self.calls):
            blocks.append(self._tool_use(self.calls[index]))
        if not any(isinstance(b, TextBlock | ToolUseBlock) for b in blocks):
            blocks.append(TextBlock(text=""))
        stop = "tool_use" if self.calls else _STOP_REASONS.get(self.finish_reason, self.finish_reason)
        return assistant_step(blocks, self.usage, stop)

    def _tool_use(self, call: _Call) -> ToolUseBlock:
        if not call.name:
            raise self.failures.unparsable("a tool call has no function name")
        arguments = self.tool_arguments(
            call.name, "".join(call.arguments), given={}, cut_off=self.finish_reason == "length"
        )
        # Ids pair each result with its call; a server that sends none gets one made up.
        call_id = call.id or f"call_{uuid.uuid4().hex[:24]}"
        return ToolUseBlock(id=call_id, name=call.name, input=arguments)


def _stream_error(failures: Failures, error: Any) -> Exception:
    """An ``{"error": ...}`` chunk (vLLM, OpenRouter): its numeric code, if any, is the status."""
    if isinstance(error, dict):
        code = error.get("code")
        status = code if isinstance(code, int) else None
        said = error.get("message")
        return failures.in_stream(said if isinstance(said, str) else json.dumps(error), status, error=error)
    return failures.in_stream(str(error), None)
