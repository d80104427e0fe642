"""The model of ``bench/prompt_cache.py``: a caching Anthropic or OpenAI server that reads ``data.txt``.

``CachingReader`` is the ``respond`` of a ``tests.wire_servers.WireServer``. Model
``nN`` reads ``data.txt`` N times, then answers; which read comes next is taken
from the request itself (the id of its newest tool result), so it answers right
whatever of the conversation a compaction took out of view. A request without
tools asks for a summary and gets one.

Every request is accounted as the vendor's prompt cache does it
(``tests.wire_cache``): on the ``anthropic`` wire by its ``cache_control``
breakpoints (``AnthropicCache``), reported as ``input_tokens``,
``cache_read_input_tokens`` and ``cache_creation_input_tokens``; on the
``openai`` wire by the longest prefix shared with an earlier request of the same
``prompt_cache_key`` (``OpenAICache``), reported as ``prompt_tokens`` and
``prompt_tokens_details.cached_tokens``. Anthropic requests go through the test
server's own checks first (``AnthropicThinking.refusal``: at most four
breakpoints, none on a thinking or empty text block) and a refused one is
answered with the API's 400, as the real server would.

Besides the usage, each answered request keeps what the bench needs to tell
*why* a prefix was lost: the digest of its fixed part (tools and system prompt)
and the digests of its message pieces; ``server_figures`` and ``trace`` sum
and list them.
"""

from __future__ import annotations

import hashlib
import itertools
from dataclasses import dataclass, field
from typing import Any, Literal

from bench.tokens import ANSWER_TOKENS
from tests.wire_anthropic import AnthropicThinking, Step
from tests.wire_cache import AnthropicCache, CacheUsage, OpenAICache, anthropic_pieces, openai_chat_pieces
from tests.wire_openai_reasoning import reasoning_stream
from tests.wire_servers import Call, Received, Reply, last_tool_result_id, split

WireKind = Literal["anthropic", "openai"]
CALL_PREFIX = "read-"


@dataclass(frozen=True)
class Seen:
    """One answered request: its cache accounting and the identity of its parts."""

    usage: CacheUsage
    summary: bool  # a request without tools: the summary step's
    fixed: str  # digest of the tools and system prompt pieces
    messages: tuple[str, ...]  # digest of each message piece, in order
    breakpoints: int  # cache_control markers (anthropic)


def _fixed_count(kind: WireKind, body: dict[str, Any]) -> int:
    """How many of the request's leading pieces are its fixed part: tools, then system."""
    tools = len(body.get("tools") or [])
    if kind == "anthropic":
        system = body.get("system")
        return tools + (len(system) if isinstance(system, list) else 1 if system else 0)
    leading = 0
    for message in body.get("messages") or []:
        if message.get("role") not in ("system", "developer"):
            break
        leading += 1
    return tools + leading


def _breakpoints(body: dict[str, Any]) -> int:
    marked = [t for t in body.get("tools") or [] if "cache_control" in t]
    system = body.get("system")
    marked += [b for b in system if "cache_control" in b] if isinstance(system, list) else []
    for message in body.get("messages") or []:
        content = message.get("content")
        if isinstance(content, list):
            marked += [b for b in content if isinstance(b, dict) and "cache_control" in b]
    return len(marked)


@dataclass
class CachingReader:
    """A caching model on one wire, scripted by what it is asked (see the module's docstring)."""

    kind: WireKind
    reads: int
    seen: list[Seen] = field(default_factory=list)
    refusals: list[str] = field(default_factory=list)
    anthropic: AnthropicThinking = field(default_factory=lambda: AnthropicThinking(steps=()))
    openai: OpenAICache = field(default_factory=OpenAICache)
    summaries: int = 0

    @property
    def anthropic_cache(self) -> AnthropicCache:
        return self.anthropic.cache

    def __call__(self, request: Received) -> Reply:
        body: dict[str, Any] = request.body
        if self.kind == "anthropic":
            refusal = self.anthropic.refusal(body)
            if refusal is not None:
                self.refusals.append(refusal)
                error = {"type": "error", "error": {"type": "invalid_request_error", "message": refusal}}
                return Reply.json(400, error, {"request-id": "req_bench_refused"})
            pieces = anthropic_pieces(body)
            usage = self.anthropic.cache.account(pieces)
        else:
            pieces = openai_chat_pieces(body)
            usage = self.openai.account(pieces, body.get("prompt_cache_key"))
        fixed = _fixed_count(self.kind, body)
        summary = not body.get("tools")
        self.seen.append(
            Seen(
                usage=usage,
                summary=summary,
                fixed=hashlib.sha256("".join(p.digest for p in pieces[:fixed]).encode()).hexdigest(),
                messages=tuple(p.digest for p in pieces[fixed:]),
                breakpoints=_breakpoints(body),
            )
        )
        text, calls = self._answer(request, summary)
        return self._stream(text, calls, usage)

    def _answer(self, request: Received, summary: bool) -> tuple[str, list[Call]]:
        if summary:
            self.summaries += 1
            return f"Summary {self.summaries}: data.txt was read again and again; nothing else happened.", []
        last = last_tool_result_id(request)
        done = int(last.removeprefix(CALL_PREFIX)) + 1 if last and last.startswith(CALL_PREFIX) else 0
        if done < self.reads:
            return "", [Call(f"{CALL_PREFIX}{done:04d}", "read", {"file_path": "data.txt"}, piece=64)]
        return f"read data.txt {self.reads} times", []

    def _stream(self, text: str, calls: list[Call], usage: CacheUsage) -> Reply:
        if self.kind == "anthropic":
            step = Step(text=text, calls=calls, output_tokens=ANSWER_TOKENS)
            return self.anthropic.stream(step, usage, thinking=False)
        tokens = {
            "prompt_tokens": usage.total,
            "completion_tokens": ANSWER_TOKENS,
            "total_tokens": usage.total + ANSWER_TOKENS,
            "prompt_tokens_details": {"cached_tokens": usage.read},
        }
        return reasoning_stream((), split(text, 16) if text else (), calls, usage=tokens)


# --- what the server saw -------------------------------------------------------------


def prefix_breaks(seen: list[Seen]) -> int:
    """Tool-step requests whose messages do not start with all of the previous one's."""
    steps = [s for s in seen if not s.summary]
    return sum(
        1
        for before, after in itertools.pairwise(steps)
        if after.messages[: len(before.messages)] != before.messages
    )


def fixed_changes(seen: list[Seen]) -> int:
    """Tool-step requests whose tools and system prompt differ from the previous one's."""
    steps = [s for s in seen if not s.summary]
    return sum(1 for before, after in itertools.pairwise(steps) if after.fixed != before.fixed)


def trace(seen: list[Seen]) -> list[str]:
    """One line per request: its cache accounting, and where it parted from the request before."""
    lines, before = [], None
    for i, s in enumerate(seen):
        u = s.usage
        kept = "-"
        if not s.summary and before is not None:
            same = next((k for k, (a, b) in enumerate(zip(before, s.messages, strict=False)) if a != b), None)
            kept = "all" if same is None and len(s.messages) >= len(before) else str(same)
        if not s.summary:
            before = s.messages
        kind = "summary" if s.summary else "step"
        lines.append(f"{i:4d} {kind:<7} pieces {len(s.messages):4d} read {u.read:7,} written {u.written:7,} "
                     f"uncached {u.uncached:7,} same-as-before {kept}")  # fmt: skip
    return lines


def server_figures(reader: CachingReader) -> dict[str, Any]:
    seen = reader.seen
    read = sum(s.usage.read for s in seen)
    written = sum(s.usage.written for s in seen)
    uncached = sum(s.usage.uncached for s in seen)
    total = read + written + uncached
    return {
        "requests": len(seen),
        "summary_requests": sum(s.summary for s in seen),
        "prompt_tokens": total,
        "read": read,
        "written": written,
        "uncached": uncached,
        "share": read / total if total else 0.0,
        "largest_request": max((s.usage.total for s in seen), default=0),
        "prefix_breaks": prefix_breaks(seen),
        "fixed_changes": fixed_changes(seen),
        "max_breakpoints": max((s.breakpoints for s in seen), default=0),
        "refusals": reader.refusals[:3],
    }
