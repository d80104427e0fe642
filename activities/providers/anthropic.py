"""The ``anthropic`` kind: the Messages wire protocol, streamed, with ``tool_use`` blocks.

The request is built in ``anthropic_wire``; this module reads the answer's
events. Extended thinking arrives as ``thinking`` blocks (their text in
``thinking_delta`` events, their signature in a ``signature_delta``) and
``redacted_thinking`` blocks (opaque ``data``): they are kept in the answer, in
the order streamed (before its text and tool calls), as ``ThinkingBlock`` (wire
``anthropic``) and ``RedactedThinkingBlock``, to be passed back unmodified. Their
text goes to ``thinking_sink(on_text)`` as it streams, never to ``on_text``,
which is the answer's.

Usage: Anthropic counts cached prompt tokens apart from ``input_tokens``; the
project's ``prompt_tokens`` is every prompt token, as with OpenAI, and the
cache reads and writes are also reported on their own. Anthropic does not
report the thinking's tokens apart (they are among ``output_tokens``), so
``reasoning_tokens`` stays 0.
"""

from __future__ import annotations

from typing import Any

from durable_agent.activities.providers.anthropic_wire import request_body
from durable_agent.activities.providers.http import (
    HttpProvider,
    StreamReader,
    TypedEvent,
    Wire,
    checked_key,
    nested,
)
from durable_agent.activities.providers.http_errors import Failures
from durable_agent.activities.providers.model_provider import (
    TextSink,
    assistant_step,
    read_credential,
    thinking_sink,
)
from durable_agent.config import AnthropicProviderConfig
from durable_agent.core.activity_api import ModelCallInput
from durable_agent.core.models import (
    ContentBlock,
    ModelResponse,
    RedactedThinkingBlock,
    TextBlock,
    ThinkingBlock,
    TokenUsage,
    ToolUseBlock,
)

ANTHROPIC_VERSION = "2023-06-01"
# The error types of in-stream ``error`` events, as the HTTP status each stands for,
# so that ``errors.is_retryable_status`` decides about them like about any status.
_ERROR_TYPE_STATUS = {
    "invalid_request_error": 400,
    "authentication_error": 401,
    "billing_error": 402,
    "permission_error": 403,
    "not_found_error": 404,
    "request_too_large": 413,
    "rate_limit_error": 429,
    "api_error": 500,
    "timeout_error": 504,
    "overloaded_error": 529,
}


# --- the stream ----------------------------------------------------------------


class _Usage(Wire):
    input_tokens: int | None = None
    output_tokens: int | None = None
    cache_creation_input_tokens: int | None = None
    cache_read_input_tokens: int | None = None

    def token_usage(self) -> TokenUsage:
        """The project's counts: ``input_tokens`` with the cache's reads and writes added."""
        cache_read = self.cache_read_input_tokens or 0
        cache_write = self.cache_creation_input_tokens or 0
        prompt = (self.input_tokens or 0) + cache_read + cache_write
        completion = self.output_tokens or 0
        return TokenUsage(
            prompt_tokens=prompt,
            completion_tokens=completion,
            total_tokens=prompt + completion,
            cache_read_tokens=cache_read,
            cache_write_tokens=cache_write,
        )


class _Pieces(Wire):
    """A block's texts as a stream carries them: the first pieces in its start, one more in a delta."""

    text: str | None = None
    thinking: str | None = None
    signature: str | None = None


class _ContentBlock(_Pieces):
    type: str
    data: str | None = None  # a redacted_thinking block's
    # a tool_use block's
    id: str | None = None
    name: str | None = None
    input: dict[str, Any] | None = None


class _Delta(_Pieces):
    type: str | None = None
    partial_json: str | None = None
    stop_reason: str | None = None  # a message_delta's


class _Error(Wire):
    type: str = "api_error"
    message: str = ""


class _Event(TypedEvent):
    # content_block_start and content_block_delta: which block, and its start or its piece
    index: int | None = None
    content_block: _ContentBlock | None = None
    delta: _Delta | None = None
    # the usage so far: at the top in message_delta, under ``message`` in message_start
    usage: _Usage | None = None
    message_usage: _Usage | None = nested("message", "usage")
    error: _Error | None = None


class _Block:
    def __init__(self, start: _ContentBlock) -> None:
        self.type = start.type
        self.text: list[str] = [start.text] if start.text else []
        self.id = start.id or ""
        self.name = start.name or ""
        self.start_input = start.input or {}
        self.json: list[str] = []
        self.thinking: list[str] = [start.thinking] if start.thinking else []
        self.signature: list[str] = [start.signature] if start.signature else []
        self.data = start.data


# Which block type each delta type adds to: a delta for another is a malformed stream.
_DELTA_BLOCK = {
    "text_delta": "text",
    "input_json_delta": "tool_use",
    "thinking_delta": "thinking",
    "signature_delta": "thinking",
}


class StreamState(StreamReader):
    """Builds the step from the events: blocks by index, stop reason, usage."""

    def __init__(self, failures: Failures, max_tokens: int | None) -> None:
        super().__init__(failures, max_tokens)
        self.blocks: dict[int, _Block] = {}
        self.usage = _Usage()
        self.stop_reason: str | None = None
        self.stopped = False
        self.thought = False  # some thinking was streamed: the next block's is a new paragraph
        self._paragraph = False  # the next thinking delta is its block's first

    def feed(self, data: str, on_text: TextSink) -> None:
        event = self.parse(_Event, data, "a stream event is not a Messages API event")
        if event.type == "error":
            error = event.error or _Error()
            status = _ERROR_TYPE_STATUS.get(error.type)
            raise self.failures.in_stream(f"{error.type}: {error.message}", status, error=error.model_dump())
        if event.type == "message_start" and event.message_usage:
            self.usage = event.message_usage
        elif event.type == "content_block_start" and event.content_block is not None:
            block = self.blocks[self.carried(event.index, event, "index")] = _Block(event.content_block)
            if block.type == "text" and block.text:
                on_text(block.text[0])
            elif block.type == "thinking" and block.thinking:
                self._think(block.thinking[0], on_text, new_block=True)
            elif block.type == "thinking":
                self._paragraph = True  # its first delta starts a new paragraph
        elif event.type == "content_block_delta" and event.delta is not None:
            current = self.blocks.get(self.carried(event.index, event, "index"))
            if current is None:
                raise self.failures.unparsable("a content block delta came before its block started", data)
            self._add(current, event.delta, on_text, data)
        elif event.type == "message_delta":
            if event.delta is not None and event.delta.stop_reason:
                self.stop_reason = event.delta.stop_reason
            if event.usage is not None:
                # Counts here are running totals: each replaces the one before.
                updates = event.usage.model_dump(exclude_none=True)
                self.usage = self.usage.model_copy(update=updates)
        elif event.type == "message_stop":
            self.stopped = True
        # ``ping``, ``content_block_stop`` and event types added later carry nothing needed here.

    def _add(self, block: _Block, delta: _Delta, on_text: TextSink, data: str) -> None:
        """One delta's piece, added to its block; only answer text goes to ``on_text``."""
        expected = _DELTA_BLOCK.get(delta.type or "")
        if expected is None:
            return  # a delta type added later (citations, …): nothing needed here
        if expected != block.type:
            raise self.failures.unparsable(f"a {delta.type} came for a {block.type} block", data)
        if delta.type == "text_delta" and delta.text:
            block.text.append(delta.text)
            on_text(delta.text)
        elif delta.type == "input_json_delta" and delta.partial_json:
            block.json.append(delta.partial_json)
        elif delta.type == "thinking_delta" and delta.thinking:
            block.thinking.append(delta.thinking)
            self._think(delta.thinking, on_text, new_block=self._paragraph)
        elif delta.type == "signature_delta" and delta.signature:
            block.signature.append(delta.signature)

    def _think(self, text: str, on_text: TextSink, *, new_block: bool) -> None:
        """A piece of thinking, live; the text of each block after the first a paragraph of its
        own, as ``Message.thinking`` joins them."""
        sink = thinking_sink(on_text)
        if new_block and self.thought:
            sink("\n\n")
        sink(text)
        self.thought, self._paragraph = True, False

    def response(self) -> ModelResponse:
        """The finished step; a stream without ``message_stop`` was cut off."""
        if not self.stopped:
            raise self.failures.ended_early()
        blocks: list[ContentBlock] = []
        for index in sorted(self.blocks):
            block = self.blocks[index]
            if block.type == "text" and block.text:
                blocks.append(TextBlock(text="".join(block.text)))
            elif block.type == "tool_use":
                blocks.append(self._tool_use(block))
            elif block.type == "thinking" and (block.thinking or block.signature):
                blocks.append(self._thinking(block))
            elif block.type == "redacted_thinking":
                if not block.data:
                    raise self.failures.unparsable("a redacted_thinking block has no data")
                blocks.append(RedactedThinkingBlock(data=block.data))
            # Other block types (server tools) are not asked for, so not expected.
        if not blocks:
            blocks.append(TextBlock(text=""))
        return assistant_step(blocks, self.usage.token_usage(), self.stop_reason)

    def _thinking(self, block: _Block) -> ThinkingBlock:
        # Kept even without a signature (a compatible server may sign none): such a
        # block is shown but never passed back (see ``anthropic_wire``).
        signature = "".join(block.signature) or None
        return ThinkingBlock(thinking="".join(block.thinking), signature=signature, wire="anthropic")

    def _tool_use(self, block: _Block) -> ToolUseBlock:
        if not block.id or not block.name:
            raise self.failures.unparsable("a tool_use block has no id or no name")
        arguments = self.tool_arguments(
            block.name, "".join(block.json), given=block.start_input, cut_off=self.stop_reason == "max_tokens"
        )
        return ToolUseBlock(id=block.id, name=block.name, input=arguments)


class AnthropicProvider(HttpProvider):
    """The Messages API over HTTP; the key goes as ``x-api-key``."""

    config: AnthropicProviderConfig

    def __init__(self, name: str, config: AnthropicProviderConfig, api_key: str) -> None:
        super().__init__(name, config, api_key)

    @classmethod
    def from_config(cls, name: str, config: AnthropicProviderConfig) -> AnthropicProvider:
        """Read the key now, so a worker without it refuses to start."""
        env = config.api_key_env
        return cls(name, config, checked_key(read_credential(env, name), env, name))

    def auth_headers(self) -> dict[str, str]:
        return {"x-api-key": self._api_key or ""}

    async def complete(self, call: ModelCallInput, model: str, on_text: TextSink) -> ModelResponse:
        """Stream one step from ``/v1/messages``, handing text to ``on_text`` as it comes."""
        settings = self.config.settings_for(model)
        failures = self.failures(model)
        body = request_body(call, model, settings)
        # The limit sent (thinking adds its budget), for the message of a cut-off tool call.
        state = StreamState(failures, body["max_tokens"])
        # The version header is the protocol's; a config may pin another one.
        headers = {"anthropic-version": ANTHROPIC_VERSION, **settings.headers}
        async with self.event_stream(failures, "/v1/messages", body, headers) as events:
            async for event in events:
                state.feed(event.data, on_text)
                if state.stopped:
                    break
        return state.response()
