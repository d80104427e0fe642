"""A DeepSeek-style reasoning server on the Chat Completions wire, for ``WireServer(respond=...)``.

DeepSeek's thinking mode (and vLLM / SGLang serving Qwen3, GLM or Kimi) streams
the model's reasoning in ``reasoning_content`` deltas before the answer's
content and tool calls, and DeepSeek refuses, with a 400, a conversation in
which an assistant message it answered with reasoning comes back without it.
``DeepSeekReader`` does the same, and checks more strictly than DeepSeek: the
reasoning must come back unmodified, on every such message. It accounts the
prompt cache as OpenAI does (``OpenAICache``, by ``prompt_cache_key``) and
reports the tokens read as ``usage.prompt_tokens_details.cached_tokens``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from tests.wire_cache import CacheUsage, OpenAICache, openai_chat_pieces
from tests.wire_servers import Call, Received, Reply, last_tool_result_id, split, sse

# DeepSeek's answer, verbatim, to a request that dropped reasoning it must have back.
REASONING_MISSING = {
    "error": {
        "message": "The reasoning_content in the thinking mode must be passed back to the API.",
        "type": "invalid_request_error",
        "param": None,
        "code": "invalid_request_error",
    }
}


def reasoning_stream(
    reasoning: Sequence[str],
    text: Sequence[str] = (),
    calls: Sequence[Call] = (),
    *,
    usage: dict[str, Any] | None = None,
    name: str = "reasoning_content",
    finish: str | None = None,
) -> Reply:
    """A streamed answer whose reasoning comes first, in deltas of field ``name``.

    Args:
        reasoning: the pieces of reasoning, one delta each.
        text: the pieces of the answer's content.
        calls: tool calls, after the content.
        usage: the last chunk's ``usage``; unset, a small one.
        name: the delta field of the reasoning ("reasoning_content": DeepSeek, vLLM;
            "reasoning": OpenRouter).
        finish: the finish reason; unset, "tool_calls" or "stop".

    Returns:
        The reply, as DeepSeek writes it: explicit nulls for the field not in use.
    """

    def chunk(delta: dict[str, Any], finish_reason: str | None = None) -> bytes:
        choice = {"index": 0, "delta": delta, "finish_reason": finish_reason}
        return sse({"id": "ds-1", "object": "chat.completion.chunk", "choices": [choice]})

    events = [chunk({"role": "assistant", "content": None, name: ""})]
    events += [chunk({"content": None, name: piece}) for piece in reasoning]
    events += [chunk({"content": piece, name: None}) for piece in text]
    for i, call in enumerate(calls):
        start = {
            "index": i,
            "id": call.id,
            "type": "function",
            "function": {"name": call.name, "arguments": ""},
        }
        events.append(chunk({"tool_calls": [start]}))
        events += [chunk({"tool_calls": [{"index": i, "function": {"arguments": p}}]}) for p in call.pieces()]
    events.append(chunk({}, finish or ("tool_calls" if calls else "stop")))
    tokens = usage or {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}
    events.append(sse({"id": "ds-1", "object": "chat.completion.chunk", "choices": [], "usage": tokens}))
    events.append(sse("[DONE]"))
    return Reply.sse(events)


def answer_key(message: dict[str, Any]) -> str:
    """What identifies an assistant message the server wrote: its first call's id, else its text."""
    calls = message.get("tool_calls") or []
    if calls:
        return f"call:{calls[0].get('id')}"
    return f"text:{message.get('content') or ''}"


@dataclass
class DeepSeekReader:
    """A thinking model, scripted by what it is asked: ``read`` each of ``files`` in turn, then answer.

    Which file comes next is read from the request (the id of its newest tool
    result, ``read-<index>``), so a retried request gets the same answer. Every
    answer starts with reasoning; a later request that brings one of its
    answers back without that reasoning, or with it changed, is refused with
    DeepSeek's 400 and recorded in ``refused``.
    """

    files: Sequence[str]
    answer: str = "I have read every file."
    cache: OpenAICache = field(default_factory=OpenAICache)
    reasoning_given: dict[str, str] = field(default_factory=dict)  # by ``answer_key``
    refused: list[Received] = field(default_factory=list)
    cache_usage: list[CacheUsage] = field(default_factory=list)  # of each request answered

    def reasoning_missing(self, messages: list[dict[str, Any]]) -> bool:
        """An assistant message this server answered with reasoning lacks it, or has it changed."""
        for message in messages:
            if message.get("role") != "assistant":
                continue
            given = self.reasoning_given.get(answer_key(message))
            if given is not None and message.get("reasoning_content") != given:
                return True
        return False

    def __call__(self, request: Received) -> Reply:
        body = request.body
        if self.reasoning_missing(body["messages"]):
            self.refused.append(request)
            return Reply.json(400, REASONING_MISSING)
        cached = self.cache.account(openai_chat_pieces(body), body.get("prompt_cache_key"))
        self.cache_usage.append(cached)
        last = last_tool_result_id(request)
        done = int(last.removeprefix("read-")) + 1 if last and last.startswith("read-") else 0
        reasoning = f"Step {done}. The user wants {len(self.files)} files read; {done} are read so far, " + (
            "so the next one comes now." if done < len(self.files) else "so I can answer."
        )
        pieces = split(reasoning, 7)
        usage = {
            "prompt_tokens": cached.total,
            "completion_tokens": 30,
            "total_tokens": cached.total + 30,
            "prompt_tokens_details": {"cached_tokens": cached.read},
            "prompt_cache_hit_tokens": cached.read,
            "prompt_cache_miss_tokens": cached.total - cached.read,
            "completion_tokens_details": {"reasoning_tokens": 20},
        }
        if done < len(self.files):
            call = Call(f"read-{done:03d}", "read", {"file_path": self.files[done]}, piece=16)
            message = {"role": "assistant", "tool_calls": [{"id": call.id}]}
            self.reasoning_given[answer_key(message)] = reasoning
            return reasoning_stream(pieces, calls=[call], usage=usage)
        self.reasoning_given[answer_key({"content": self.answer})] = reasoning
        return reasoning_stream(pieces, split(self.answer, 5), usage=usage)


def sent_reasoning(request: Received) -> list[str | None]:
    """The ``reasoning_content`` of each assistant message of a request (None: not sent)."""
    return [m.get("reasoning_content") for m in request.body["messages"] if m.get("role") == "assistant"]
