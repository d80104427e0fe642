"""Reasoning streams of each wire, for the live-thinking and reasoning-token tests, and a local
server that answers like gpt-oss on vLLM's Responses endpoint.

Each ``*_stream`` writes one answer's events as that vendor does: thinking first (in the
pieces given), then the answer's text, then usage that counts the reasoning's tokens apart
where the vendor does; ``stall`` stops after the thinking, so the call stays open while a
follower watches it.

``VllmGptOss`` is a ``WireServer(respond=...)`` callback: gpt-oss served by vLLM's
``/v1/responses``, which gives the reasoning as ``reasoning_text`` content (streamed as
``response.reasoning_text.delta``), with no summary and nothing encrypted, and reads each
reasoning item of the input back from its one ``reasoning_text`` part (vLLM's
``parse_response_input`` asserts there is exactly one): an item without it is refused.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from tests.wire_responses import model_turns
from tests.wire_servers import Call, Received, Reply, sse


def anthropic_stream(thoughts: Sequence[Sequence[str]], text: Sequence[str], *, stall: bool = False) -> Reply:
    """Messages events: a signed ``thinking`` block for each of ``thoughts``, then a text block."""
    message = {"id": "msg_1", "type": "message", "role": "assistant", "content": []}
    events = [sse({"type": "message_start", "message": {**message, "usage": {"input_tokens": 10}}})]
    index = 0
    for pieces in thoughts:
        opened = {"type": "thinking", "thinking": ""}
        events.append(sse({"type": "content_block_start", "index": index, "content_block": opened}))
        for piece in pieces:
            delta = {"type": "thinking_delta", "thinking": piece}
            events.append(sse({"type": "content_block_delta", "index": index, "delta": delta}))
        signature = {"type": "signature_delta", "signature": f"sig-{index}"}
        events.append(sse({"type": "content_block_delta", "index": index, "delta": signature}))
        events.append(sse({"type": "content_block_stop", "index": index}))
        index += 1
    if not stall:
        block = {"type": "content_block_start", "index": index, "content_block": {"type": "text", "text": ""}}
        events.append(sse(block))
        for piece in text:
            delta = {"type": "text_delta", "text": piece}
            events.append(sse({"type": "content_block_delta", "index": index, "delta": delta}))
        events.append(sse({"type": "content_block_stop", "index": index}))
        end = {"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": {"output_tokens": 30}}
        events += [sse(end), sse({"type": "message_stop"})]
    return Reply.sse(events, stall=stall)


def chat_stream(
    thinking: Sequence[str], text: Sequence[str], *, field: str = "reasoning_content", stall: bool = False
) -> Reply:
    """Chat Completions chunks: reasoning deltas under ``field``, then content, then usage with
    ``completion_tokens_details.reasoning_tokens``."""

    def chunk(delta: dict[str, Any], finish: str | None = None, **more: Any) -> bytes:
        choices = [{"index": 0, "delta": delta, "finish_reason": finish}] if delta or finish else []
        return sse({"id": "chatcmpl-1", "object": "chat.completion.chunk", "choices": choices, **more})

    events = [chunk({"role": "assistant", "content": ""})]
    events += [chunk({field: piece}) for piece in thinking]
    if not stall:
        events += [chunk({"content": piece}) for piece in text]
        events.append(chunk({}, "stop"))
        usage: dict[str, Any] = {"prompt_tokens": 10, "completion_tokens": 30, "total_tokens": 40}
        usage["completion_tokens_details"] = {"reasoning_tokens": 21}
        events += [chunk({}, usage=usage), sse("[DONE]")]
    return Reply.sse(events, stall=stall)


@dataclass
class ResponsesStream:
    """Writes one Responses API answer's events, numbered, each named in its ``type``."""

    events: list[bytes] = field(default_factory=list)
    output: list[dict[str, Any]] = field(default_factory=list)

    def emit(self, kind: str, **fields: Any) -> None:
        self.events.append(sse({"type": kind, "sequence_number": len(self.events), **fields}, kind))

    def reasoning(self, item_id: str, pieces: Sequence[str], *, summary: bool) -> None:
        """A reasoning item: its summary (OpenAI) or its own text (gpt-oss on vLLM), in pieces."""
        index = len(self.output)
        self.emit("response.output_item.added", output_index=index, item={"id": item_id, "type": "reasoning"})
        where = {"item_id": item_id, "output_index": index}
        kind = "response.reasoning_summary_text.delta" if summary else "response.reasoning_text.delta"
        part = {"summary_index": 0} if summary else {"content_index": 0}
        for piece in pieces:
            self.emit(kind, **where, **part, delta=piece)
        whole = "".join(pieces)
        item: dict[str, Any] = {"id": item_id, "type": "reasoning", "status": "completed"}
        if summary:
            item |= {"summary": [{"type": "summary_text", "text": whole}], "encrypted_content": "enc"}
        else:
            item |= {"summary": [], "content": [{"type": "reasoning_text", "text": whole}]}
        self.output.append(item)
        self.emit("response.output_item.done", output_index=index, item=item)

    def message(self, msg_id: str, pieces: Sequence[str]) -> None:
        index = len(self.output)
        item: dict[str, Any] = {"id": msg_id, "type": "message", "role": "assistant", "content": []}
        self.emit("response.output_item.added", output_index=index, item=item)
        for piece in pieces:
            self.emit("response.output_text.delta", item_id=msg_id, output_index=index, delta=piece)
        item = item | {"content": [{"type": "output_text", "text": "".join(pieces), "annotations": []}]}
        self.output.append(item)
        self.emit("response.output_item.done", output_index=index, item=item)

    def call(self, fc_id: str, call: Call) -> None:
        index = len(self.output)
        item = {"id": fc_id, "type": "function_call", "call_id": call.id, "name": call.name, "arguments": ""}
        self.emit("response.output_item.added", output_index=index, item=item)
        arguments = "".join(call.pieces())
        self.output.append(item | {"arguments": arguments})
        self.emit("response.output_item.done", output_index=index, item=item | {"arguments": arguments})

    def completed(self, reasoning_tokens: int) -> None:
        usage: dict[str, Any] = {"input_tokens": 10, "output_tokens": 30, "total_tokens": 40}
        usage["output_tokens_details"] = {"reasoning_tokens": reasoning_tokens}
        response = {"id": "resp_1", "object": "response", "status": "completed", "output": self.output}
        self.emit("response.completed", response=response | {"usage": usage})


def responses_stream(
    thinking: Sequence[str], text: Sequence[str], *, summary: bool, stall: bool = False
) -> Reply:
    """A Responses API answer: a reasoning item (a summary, or the text itself), then text."""
    stream = ResponsesStream()
    stream.emit("response.created", response={"id": "resp_1", "status": "in_progress", "output": []})
    stream.reasoning("rs_1", thinking, summary=summary)
    if not stall:
        stream.message("msg_1", text)
        stream.completed(reasoning_tokens=17)
    return Reply.sse(stream.events, stall=stall)


@dataclass
class Turn:
    """One scripted answer of ``VllmGptOss``: its reasoning, then text or a call."""

    reasoning: Sequence[str]
    text: Sequence[str] = ()
    call: Call | None = None
    reasoning_tokens: int = 9


@dataclass
class VllmGptOss:
    """gpt-oss on vLLM's ``/v1/responses``, scripted by turn (the model answers its input holds)."""

    script: Sequence[Turn]
    refused: list[str] = field(default_factory=list)
    read_back: list[list[str]] = field(default_factory=list)  # each request's reasoning, as read

    def __call__(self, request: Received) -> Reply:
        items = request.body.get("input") or []
        reasoning: list[str] = []
        for item in items:
            if item.get("type") != "reasoning":
                continue
            content = item.get("content")
            # vllm/entrypoints/harmony_utils.py: ``assert len(content) == 1``, then ``content[0]["text"]``
            if not isinstance(content, list) or len(content) != 1 or "text" not in content[0]:
                self.refused.append(repr(item))
                return Reply.json(400, {"error": {"message": "reasoning item without its reasoning_text"}})
            reasoning.append(content[0]["text"])
        self.read_back.append(reasoning)
        turn = model_turns(items)
        step = self.script[turn]
        stream = ResponsesStream()
        stream.emit(
            "response.created", response={"id": f"resp_{turn}", "status": "in_progress", "output": []}
        )
        stream.reasoning(f"rs_{turn}", step.reasoning, summary=False)
        if step.text:
            stream.message(f"msg_{turn}", step.text)
        if step.call is not None:
            stream.call(f"fc_{turn}", step.call)
        stream.completed(step.reasoning_tokens)
        return Reply.sse(stream.events)
