"""A local server that answers as Anthropic's Messages API does with extended thinking
and prompt caching, for ``WireServer(respond=...)``.

``AnthropicThinking`` answers each request with the next ``Step`` of its script. With
``thinking`` on in the request, an answer starts with a ``thinking`` block streamed as
the real API streams it (``thinking_delta`` pieces, then one ``signature_delta``),
optionally followed by a ``redacted_thinking`` block. Its signatures are the base64 of
an HMAC of the thinking text under a secret of this server, and its redacted data the
same over random bytes, so that it can tell the blocks it issued from modified or
forged ones.

It refuses what the real API refuses, with Anthropic's own 400 bodies and messages:

- with thinking on, a last assistant message that used a tool and does not start with
  a thinking block (the tool-use turn the request continues lost its thinking);
- a ``thinking`` block whose signature is not the one issued for its text, and a
  ``redacted_thinking`` block whose data this server did not issue;
- ``temperature`` with thinking on, a thinking budget under 1,024 or not under
  ``max_tokens``;
- more than four ``cache_control`` breakpoints, and one on a thinking block or an
  empty text block.

A refused request takes no step of the script. Usage is accounted as Anthropic's
cache does (``tests.wire_cache.AnthropicCache``): ``input_tokens`` is the uncached
part, besides ``cache_read_input_tokens`` and ``cache_creation_input_tokens``.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from tests.wire_cache import AnthropicCache, CacheUsage, anthropic_pieces
from tests.wire_servers import Call, Received, Reply, split, sse

MISSING_THINKING = (
    "messages.{index}.content.0.type: Expected `thinking` or `redacted_thinking`, but found `{found}`. "
    "When `thinking` is enabled, a final `assistant` message must start with a thinking block "
    "(preceeding the lastmost set of `tool_use` and `tool_result` blocks). We recommend you include "
    "thinking blocks from previous turns. To avoid this requirement, disable `thinking`. Please consult "
    "our documentation at https://docs.claude.com/en/docs/build-with-claude/extended-thinking"
)
BAD_SIGNATURE = "messages.{index}.content.{block}: Invalid `signature` in `thinking` block"
BAD_REDACTED = "messages.{index}.content.{block}: Invalid `data` in `redacted_thinking` block"
TOO_MANY_BREAKPOINTS = "A maximum of 4 blocks with cache_control may be provided. Found {count}."
MIN_BUDGET = 1024


@dataclass
class Step:
    """One scripted answer: its thinking (when the request has thinking on), text and calls."""

    thinking: str = "Let me think this through."
    redacted: bool = False  # a redacted_thinking block after the thinking
    text: str = ""
    calls: Sequence[Call] = ()
    output_tokens: int = 20


@dataclass
class Accepted:
    """A request the server answered: whether it had thinking on, and its cache accounting."""

    thinking: bool
    usage: CacheUsage
    output_tokens: int


@dataclass
class AnthropicThinking:
    """The ``respond`` of a ``WireServer``: a thinking, caching Anthropic model, scripted."""

    steps: Sequence[Step]
    piece: int = 7  # characters of thinking per thinking_delta
    secret: bytes = field(default_factory=lambda: secrets.token_bytes(32))
    cache: AnthropicCache = field(default_factory=AnthropicCache)
    accepted: list[Accepted] = field(default_factory=list)
    refusals: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._script = deque(self.steps)

    def sign(self, thinking: str) -> str:
        """The signature this server issues for ``thinking``."""
        return self._mac(b"thinking\0" + thinking.encode())

    def redacted_data(self) -> str:
        """Opaque data for a redacted_thinking block, recognisably this server's."""
        nonce = secrets.token_hex(16)
        return f"{nonce}.{self._redacted_mac(nonce)}"

    def _mac(self, data: bytes) -> str:
        return base64.b64encode(hmac.new(self.secret, data, hashlib.sha256).digest()).decode()

    def _redacted_mac(self, nonce: str) -> str:
        return self._mac(b"redacted\0" + nonce.encode())

    def _issued(self, data: str) -> bool:
        nonce, _, mac = data.partition(".")
        return hmac.compare_digest(mac, self._redacted_mac(nonce))

    def __call__(self, request: Received) -> Reply:
        body = request.body
        refusal = self.refusal(body)
        if refusal is not None:
            self.refusals.append(refusal)
            error = {"type": "error", "error": {"type": "invalid_request_error", "message": refusal}}
            return Reply.json(400, error, {"request-id": "req_wire_refused"})
        step = self._script.popleft() if self._script else Step(text="Done.")
        usage = self.cache.account(anthropic_pieces(body))
        thinking = "thinking" in body
        self.accepted.append(Accepted(thinking, usage, step.output_tokens))
        return self.stream(step, usage, thinking=thinking)

    # --- what the API refuses ---------------------------------------------------------

    def refusal(self, body: dict[str, Any]) -> str | None:
        """The API's message refusing ``body``, or None when it would take it."""
        thinking = body.get("thinking")
        messages: list[dict[str, Any]] = body.get("messages") or []
        if thinking is not None:
            budget = thinking.get("budget_tokens", 0)
            if thinking.get("type") != "enabled" or budget < MIN_BUDGET:
                return (
                    f"thinking.enabled.budget_tokens: Input should be greater than or equal to {MIN_BUDGET}"
                )
            if budget >= body.get("max_tokens", 0):
                return "`max_tokens` must be greater than `thinking.budget_tokens`."
            if "temperature" in body and body["temperature"] != 1:
                return "`temperature` may only be set to 1 when thinking is enabled."
        return (
            self._breakpoint_refusal(body)
            or self._signature_refusal(messages)
            or (self._turn_refusal(messages) if thinking is not None else None)
        )

    def _signature_refusal(self, messages: list[dict[str, Any]]) -> str | None:
        for index, message in enumerate(messages):
            for block_index, block in enumerate(_blocks(message)):
                where = {"index": index, "block": block_index}
                if block.get("type") == "thinking":
                    signature = block.get("signature") or ""
                    if not hmac.compare_digest(signature, self.sign(block.get("thinking", ""))):
                        return BAD_SIGNATURE.format(**where)
                elif block.get("type") == "redacted_thinking" and not self._issued(block.get("data", "")):
                    return BAD_REDACTED.format(**where)
        return None

    def _turn_refusal(self, messages: list[dict[str, Any]]) -> str | None:
        # Only the turn the request continues must come with its thinking: the last
        # assistant message, when it used a tool (its results follow it).
        for index in range(len(messages) - 1, -1, -1):
            if messages[index].get("role") != "assistant":
                continue
            blocks = _blocks(messages[index])
            if not any(b.get("type") == "tool_use" for b in blocks):
                return None
            first = blocks[0].get("type") if blocks else "nothing"
            if first not in ("thinking", "redacted_thinking"):
                return MISSING_THINKING.format(index=index, found=first)
            return None
        return None

    def _breakpoint_refusal(self, body: dict[str, Any]) -> str | None:
        marked: list[dict[str, Any]] = [t for t in body.get("tools") or [] if "cache_control" in t]
        system = body.get("system")
        if isinstance(system, list):
            marked += [b for b in system if "cache_control" in b]
        for index, message in enumerate(body.get("messages") or []):
            for block_index, block in enumerate(_blocks(message)):
                if "cache_control" not in block:
                    continue
                if block.get("type") in ("thinking", "redacted_thinking"):
                    where = f"messages.{index}.content.{block_index}.{block['type']}"
                    return f"{where}.cache_control: Extra inputs are not permitted"
                if block.get("type") == "text" and not block.get("text"):
                    return "cache_control cannot be set for empty text blocks"
                marked.append(block)
        if len(marked) > 4:
            return TOO_MANY_BREAKPOINTS.format(count=len(marked))
        return None

    # --- the answer -------------------------------------------------------------------

    def stream(self, step: Step, usage: CacheUsage, *, thinking: bool) -> Reply:
        """The step as the API streams it, with the request's cache accounting as its usage."""
        start_usage = {
            "input_tokens": usage.uncached,
            "cache_creation_input_tokens": usage.written,
            "cache_read_input_tokens": usage.read,
            "output_tokens": 1,
        }
        message = {
            "id": "msg_wire",
            "type": "message",
            "role": "assistant",
            "content": [],
            "usage": start_usage,
        }
        events = [sse({"type": "message_start", "message": message}, "message_start")]
        blocks: list[tuple[dict[str, Any], list[dict[str, Any]]]] = []
        if thinking:
            deltas = [{"type": "thinking_delta", "thinking": p} for p in split(step.thinking, self.piece)]
            deltas.append({"type": "signature_delta", "signature": self.sign(step.thinking)})
            blocks.append(({"type": "thinking", "thinking": "", "signature": ""}, deltas))
            if step.redacted:
                blocks.append(({"type": "redacted_thinking", "data": self.redacted_data()}, []))
        if step.text:
            blocks.append(
                (
                    {"type": "text", "text": ""},
                    [{"type": "text_delta", "text": p} for p in split(step.text, 5)],
                )
            )
        for call in step.calls:
            use = {"type": "tool_use", "id": call.id, "name": call.name, "input": {}}
            blocks.append((use, [{"type": "input_json_delta", "partial_json": p} for p in call.pieces()]))
        for index, (start, deltas) in enumerate(blocks):
            events.append(
                sse(
                    {"type": "content_block_start", "index": index, "content_block": start},
                    "content_block_start",
                )
            )
            for delta in deltas:
                events.append(
                    sse(
                        {"type": "content_block_delta", "index": index, "delta": delta}, "content_block_delta"
                    )
                )
            events.append(sse({"type": "content_block_stop", "index": index}, "content_block_stop"))
        stop = "tool_use" if step.calls else "end_turn"
        end = {
            "type": "message_delta",
            "delta": {"stop_reason": stop},
            "usage": {"output_tokens": step.output_tokens},
        }
        events.append(sse(end, "message_delta"))
        events.append(sse({"type": "message_stop"}, "message_stop"))
        return Reply.sse(events)


def _blocks(message: dict[str, Any]) -> list[dict[str, Any]]:
    content = message.get("content")
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    return [b for b in content or [] if isinstance(b, dict)]


def sent_thinking(request: Received) -> list[list[dict[str, Any]]]:
    """The thinking and redacted_thinking blocks of each assistant message of a request."""
    return [
        [b for b in _blocks(m) if b.get("type") in ("thinking", "redacted_thinking")]
        for m in request.body.get("messages") or []
        if m.get("role") == "assistant"
    ]
