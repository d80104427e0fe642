"""The answer of OpenAI's Responses API: its server-sent events, read into one step.

The stream names each event in its ``type``: output items are announced
(``response.output_item.added``), grow by deltas (answer text, function-call
arguments, reasoning summary text) and arrive whole when done
(``response.output_item.done``); the last event carries the whole response
with its usage and status (``response.completed``, ``response.incomplete``) or
its error (``response.failed``). An ``error`` event may come instead.

The step is built from the items, whole where the stream gave them whole and
from their deltas otherwise: reasoning items first, as ``ThinkingBlock`` (wire
``openai-responses``: summary text, ``encrypted_content`` as signature, item id)
so that they can be passed back in place, then the text, then the calls. A
stream that stops before its last event was cut off and is retried.

A reasoning item without a summary may carry the reasoning itself as
``reasoning_text`` content (gpt-oss on vLLM's Responses endpoint, streamed as
``response.reasoning_text.delta``): its block holds that text, marked
``reasoning_text`` so that it goes back as content. The reasoning's pieces, of
a summary or the text itself, go to ``thinking_sink(on_text)`` as they stream,
never to ``on_text``. Usage: ``output_tokens`` holds the reasoning's tokens,
also reported as ``output_tokens_details.reasoning_tokens``.
"""

from __future__ import annotations

import json
from typing import Any

from durable_agent.activities.providers.http import StreamReader, TypedEvent, Wire, nested
from durable_agent.activities.providers.http_errors import Failures
from durable_agent.activities.providers.model_provider import TextSink, assistant_step, thinking_sink
from durable_agent.core.models import (
    ContentBlock,
    ModelResponse,
    TextBlock,
    ThinkingBlock,
    TokenUsage,
    ToolUseBlock,
)

WIRE = "openai-responses"
# The readable parts of one reasoning item's summary, joined as one text.
SUMMARY_SEPARATOR = "\n\n"
# The error codes of ``response.failed`` and ``error`` events, as the HTTP status each
# stands for, so that ``http_errors`` decides about them as about any status. A code
# not named here and not an invalid request's is the server's failure mid-answer: retried.
_RETRYABLE_CODES = {"rate_limit_exceeded": 429, "server_error": 500, "vector_store_timeout": 504}
_INVALID_MARKS = ("invalid", "image", "unsupported", "exceeded", "not_found", "too_large", "too_small")
_REFUSAL = "a stream event is not a Responses API event"


class _Text(Wire):
    type: str = ""
    text: str | None = None
    refusal: str | None = None


class _Item(Wire):
    type: str
    id: str | None = None
    # a function_call's
    call_id: str | None = None
    name: str | None = None
    arguments: str | None = None
    # a reasoning item's
    summary: list[_Text] | None = None
    encrypted_content: str | None = None
    # a message's text, or a reasoning item's own text (``reasoning_text`` parts)
    content: list[_Text] | None = None


class _Usage(Wire):
    input_tokens: int | None = None
    output_tokens: int | None = None  # its reasoning tokens included
    total_tokens: int | None = None
    cached_tokens: int | None = nested("input_tokens_details", "cached_tokens")
    reasoning_tokens: int | None = nested("output_tokens_details", "reasoning_tokens")

    def token_usage(self) -> TokenUsage:
        """The project's counts, which are OpenAI's: the prompt's cached tokens are among its own."""
        prompt = self.input_tokens or 0
        completion = self.output_tokens or 0
        return TokenUsage(
            prompt_tokens=prompt,
            completion_tokens=completion,
            total_tokens=self.total_tokens or prompt + completion,
            cache_read_tokens=self.cached_tokens or 0,
            reasoning_tokens=self.reasoning_tokens or 0,
        )


class _Response(Wire):
    status: str | None = None
    usage: _Usage | None = None
    incomplete_reason: str | None = nested("incomplete_details", "reason")
    error: Any = None


class _Last(Wire):
    """The last event (``response.completed``, ``….incomplete``, ``….failed``): the response whole."""

    response: _Response | None = None


class _ErrorEvent(Wire):
    """An ``error`` event: its error at its top level or (as some servers send it) under ``error``."""

    code: Any = None
    message: Any = None
    param: Any = None
    error: Any = None

    def details(self) -> Any:
        """The error, as ``stream_error`` reads it."""
        if isinstance(self.error, dict):
            return self.error
        return {"code": self.code, "message": self.message, "param": self.param}


class _Event(TypedEvent):
    """Any event: its kind, and what the events of an output item carry (which item, by index
    or by id; which part of a reasoning summary; the piece a delta adds, or the item whole)."""

    output_index: int | None = None
    item_id: str | None = None
    summary_index: int | None = None
    content_index: int | None = None
    delta: str | None = None
    item: _Item | None = None


class _Output:
    """One output item as it streams: what its deltas added, then the item whole when done."""

    def __init__(self, item: _Item) -> None:
        self.item = item
        self.text: list[str] = []
        self.arguments: list[str] = []
        self.summary: dict[int, list[str]] = {}
        self.reasoning: dict[int, list[str]] = {}  # its reasoning_text parts, by content index
        self.done = False


class StreamState(StreamReader):
    """Builds the step from the events: output items by index, status, usage."""

    def __init__(self, failures: Failures, max_tokens: int | None) -> None:
        super().__init__(failures, max_tokens)
        self.outputs: dict[int, _Output] = {}
        self.final: _Response | None = None
        # the part of the reasoning streamed last (its item, and which summary or text part):
        # another one starts a paragraph of its own, as the block's text joins them
        self.thinking_part: tuple[int, str, int] | None = None

    @property
    def finished(self) -> bool:
        """The last event came: the response is complete (or incomplete, but over)."""
        return self.final is not None

    def feed(self, data: str, on_text: TextSink) -> None:
        """Read one event's data; answer text goes to ``on_text`` as it comes."""
        event = self.parse(_Event, data, _REFUSAL)
        kind = event.type
        # The events that end the answer are read again, as what their kind carries.
        if kind == "error":
            raise stream_error(self.failures, self.parse(_ErrorEvent, data, _REFUSAL).details())
        if kind == "response.failed":
            last = self.parse(_Last, data, _REFUSAL).response
            failed = last.error if last else None
            raise stream_error(self.failures, {"message": "response failed"} if failed is None else failed)
        if kind in ("response.completed", "response.incomplete"):
            self.final = self.carried(self.parse(_Last, data, _REFUSAL).response, event, "response", data)
        elif kind in ("response.output_item.added", "response.output_item.done"):
            if event.item is not None:
                index = self.carried(event.output_index, event, "output_index", data)
                if kind == "response.output_item.added":
                    self.outputs[index] = _Output(event.item)
                else:
                    self._done(index, event.item, on_text)
        elif kind in ("response.output_text.delta", "response.refusal.delta"):
            if event.delta:
                self._output(event, data).text.append(event.delta)
                on_text(event.delta)
        elif kind == "response.function_call_arguments.delta":
            if event.delta:
                self._output(event, data).arguments.append(event.delta)
        elif kind == "response.reasoning_summary_text.delta" and event.delta:
            self._reasoning(event, data, "summary", event.summary_index, on_text)
        elif kind == "response.reasoning_text.delta" and event.delta:
            self._reasoning(event, data, "text", event.content_index, on_text)
        # ``response.created``, ``…in_progress``, the ``….done`` of parts and texts, and event
        # types added later carry nothing that the items and the last event do not.

    def _output(self, event: _Event, data: str) -> _Output:
        """The item a delta is for: by its output index, else by its item id."""
        if event.output_index is not None and event.output_index in self.outputs:
            return self.outputs[event.output_index]
        for output in self.outputs.values():
            if event.item_id is not None and output.item.id == event.item_id:
                return output
        raise self.failures.unparsable(f"a {event.type} event came before its output item", data)

    def _reasoning(self, event: _Event, data: str, kind: str, part: int | None, on_text: TextSink) -> None:
        """A piece of a reasoning item's summary (``kind`` "summary") or own text ("text")."""
        output = self._output(event, data)
        delta = event.delta or ""
        (output.summary if kind == "summary" else output.reasoning).setdefault(part or 0, []).append(delta)
        self._think(delta, on_text, (id(output), kind, part or 0))

    def _think(self, text: str, on_text: TextSink, part: tuple[int, str, int]) -> None:
        """Hand a piece of reasoning on, live: a new part after another, as a new paragraph."""
        sink = thinking_sink(on_text)
        if self.thinking_part is not None and self.thinking_part != part:
            sink(SUMMARY_SEPARATOR)
        self.thinking_part = part
        sink(text)

    def _done(self, index: int, item: _Item, on_text: TextSink) -> None:
        output = self.outputs.setdefault(index, _Output(item))
        if item.type == "message" and not output.text:
            # A server that sends the message whole, without deltas: its text is still the answer's.
            text = _message_text(item)
            if text:
                on_text(text)
        elif item.type == "reasoning" and not output.summary and not output.reasoning:
            # the same for reasoning sent whole: still the model's thinking, shown as such
            text = _reasoning_text(item, summary=True) or _reasoning_text(item, summary=False)
            if text:
                self._think(text, on_text, (id(output), "whole", 0))
        output.item, output.done = item, True

    def response(self) -> ModelResponse:
        """The finished step; a stream without its last event was cut off."""
        final = self.final
        if final is None:
            raise self.failures.ended_early()
        reason = final.incomplete_reason
        cut_off = final.status == "incomplete" and reason == "max_output_tokens"
        thinking: list[ContentBlock] = []
        text: list[str] = []
        calls: list[ContentBlock] = []
        for index in sorted(self.outputs):
            output = self.outputs[index]
            kind = output.item.type
            if kind == "reasoning":
                block = self._thinking(output)
                if block is not None:
                    thinking.append(block)
            elif kind == "message":
                text.append((output.done and _message_text(output.item)) or "".join(output.text))
            elif kind == "function_call":
                calls.append(self._tool_use(output, cut_off))
            # Other item types (the server's own tools) are not asked for, so not expected.
        answer = "".join(text)
        blocks = [*thinking, *([TextBlock(text=answer)] if answer or not calls else []), *calls]
        if calls:
            stop = "tool_use"
        elif final.status == "incomplete":
            stop = "max_tokens" if cut_off else (reason or "incomplete")
        else:
            stop = "end_turn"
        return assistant_step(blocks, final.usage.token_usage() if final.usage else TokenUsage(), stop)

    def _thinking(self, output: _Output) -> ThinkingBlock | None:
        item = output.item
        summary = _joined(output.summary, item.summary, output.done)
        # Without a summary, the item's own text: gpt-oss on vLLM gives nothing else, and
        # reads it back as the model's earlier reasoning.
        text = "" if summary else _joined(output.reasoning, item.content, output.done)
        if not summary and not text and not item.encrypted_content:
            return None  # nothing to show and nothing to pass back
        return ThinkingBlock(
            thinking=summary or text,
            signature=item.encrypted_content,
            id=item.id,
            wire=WIRE,
            reasoning_text=bool(text),
        )

    def _tool_use(self, output: _Output, cut_off: bool) -> ToolUseBlock:
        item = output.item
        if not item.call_id or not item.name:
            raise self.failures.unparsable("a function_call item has no call_id or no name")
        raw = (output.done and item.arguments) or "".join(output.arguments)
        arguments = self.tool_arguments(item.name, raw, given={}, cut_off=cut_off)
        return ToolUseBlock(id=item.call_id, name=item.name, input=arguments)


def _message_text(item: _Item) -> str:
    return "".join(part.text or part.refusal or "" for part in item.content or [])


def _joined(deltas: dict[int, list[str]], whole: list[_Text] | None, done: bool) -> str:
    """A reasoning item's summary or text: from the item whole when it came, else its deltas."""
    if done and whole is not None:
        joined = SUMMARY_SEPARATOR.join(p.text for p in whole if p.text)
        if joined or not deltas:
            return joined
    return SUMMARY_SEPARATOR.join(p for p in ("".join(deltas[i]) for i in sorted(deltas)) if p)


def _reasoning_text(item: _Item, *, summary: bool) -> str:
    """A reasoning item's summary (``summary``) or own text, from the item whole."""
    return _joined({}, item.summary if summary else item.content, True)


def error_status(error: dict[str, Any]) -> int | None:
    """The HTTP status an in-stream error's ``code`` (or ``type``) stands for; None: the server's own."""
    for key in ("code", "type"):
        value = error.get(key)
        if isinstance(value, int):
            return value
        if not isinstance(value, str):
            continue
        if value in _RETRYABLE_CODES:
            return _RETRYABLE_CODES[value]
        if value == "invalid_request_error" or any(mark in value for mark in _INVALID_MARKS):
            return 400
    return None


def stream_error(failures: Failures, error: Any) -> Exception:
    """A ``response.failed`` or ``error`` event's error, classified: rate limits and the
    server's failures retried, invalid requests (a context overflow among them) not."""
    if not isinstance(error, dict):
        return failures.in_stream(str(error), None)
    said = error.get("message")
    text = said if isinstance(said, str) and said else json.dumps(error)
    code = error.get("code")
    if isinstance(code, str) and code not in text:
        text = f"{code}: {text}"
    return failures.in_stream(text, error_status(error), error=error)
