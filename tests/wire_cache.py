"""Prompt caches that account cached tokens the way the vendors do, for the wire servers
and ``bench/prompt_cache.py``.

A prompt is seen as a sequence of *pieces* (the request rendered in the order the
vendor's prompt is: tools, system, then each message's blocks), each with a token
count (``tests.wire_servers.count_tokens`` of its canonical JSON: UTF-8 bytes / 4).

- ``AnthropicCache``: a prefix is cached only where the request put a
  ``cache_control`` breakpoint on a piece; a later request reads the longest prefix
  that ends at one of its own breakpoints, or up to 20 pieces before one, and whose
  pieces are all identical; what lies between that read and the request's last
  breakpoint is written (billed as a cache write). Prefixes under 1,024 tokens are
  never cached (the minimum of Sonnet and Opus).
- ``OpenAICache``: automatic, per ``prompt_cache_key``: the longest common prefix in
  tokens with an earlier request, counted from 1,024 tokens in steps of 128 (less than
  1,024 in common: nothing read). OpenAI reports no writes.

Both keep what they have seen for the server's life (no time-to-live): the runs they
serve last minutes, within the vendors' five-minute lifetime refreshed on each hit.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

MIN_CACHEABLE_TOKENS = 1024
OPENAI_CACHE_STEP = 128
ANTHROPIC_LOOKBACK = 20


def piece_tokens(piece: Any) -> int:
    """A piece's tokens: the UTF-8 bytes of its canonical JSON / 4, rounded up."""
    text = json.dumps(piece, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return -(-len(text.encode("utf-8")) // 4)


@dataclass(frozen=True)
class Piece:
    """One piece of a prompt: what it is (for identity) and its tokens."""

    digest: str
    tokens: int
    breakpoint: bool = False

    @classmethod
    def of(cls, value: Any, *, breakpoint: bool = False) -> Piece:
        # The breakpoint marker itself is not part of the content compared.
        content = _without_cache_control(value)
        text = json.dumps(content, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
        return cls(hashlib.sha256(text.encode()).hexdigest(), piece_tokens(content), breakpoint)


def _without_cache_control(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _without_cache_control(v) for k, v in value.items() if k != "cache_control"}
    if isinstance(value, list):
        return [_without_cache_control(v) for v in value]
    return value


@dataclass(frozen=True)
class CacheUsage:
    """What a request's prompt cost: tokens read from the cache, written to it, and the rest."""

    read: int
    written: int
    uncached: int

    @property
    def total(self) -> int:
        return self.read + self.written + self.uncached


def _prefix_keys(pieces: list[Piece]) -> list[str]:
    """The identity of each prefix: a chain of the pieces' digests."""
    keys, chain = [], ""
    for piece in pieces:
        chain = hashlib.sha256(f"{chain}\n{piece.digest}".encode()).hexdigest()
        keys.append(chain)
    return keys


@dataclass
class AnthropicCache:
    """Anthropic's prompt cache: explicit breakpoints, a prefix read by identity."""

    prefixes: set[str] = field(default_factory=set)

    def account(self, pieces: list[Piece]) -> CacheUsage:
        keys = _prefix_keys(pieces)
        sums = _running_sums(pieces)
        breakpoints = [i for i, p in enumerate(pieces) if p.breakpoint]
        read_end = 0  # pieces[:read_end] read from the cache
        for b in breakpoints:
            for i in range(b, max(-1, b - ANTHROPIC_LOOKBACK), -1):
                if keys[i] in self.prefixes and i + 1 > read_end:
                    read_end = i + 1
                    break
        written_end = read_end
        for b in breakpoints:
            if sums[b + 1] >= MIN_CACHEABLE_TOKENS:
                if keys[b] not in self.prefixes:
                    self.prefixes.add(keys[b])
                written_end = max(written_end, b + 1)
        read = sums[read_end]
        written = sums[written_end] - read
        return CacheUsage(read=read, written=written, uncached=sums[-1] - read - written)


def _running_sums(pieces: list[Piece]) -> list[int]:
    sums = [0]
    for piece in pieces:
        sums.append(sums[-1] + piece.tokens)
    return sums


@dataclass
class OpenAICache:
    """OpenAI's automatic prompt cache: the longest common prefix, by ``prompt_cache_key``."""

    seen: dict[str, list[list[str]]] = field(default_factory=dict)

    def account(self, pieces: list[Piece], cache_key: str | None) -> CacheUsage:
        """Tokens of the longest common prefix with an earlier prompt (same key), in steps."""
        digests = [p.digest for p in pieces]
        sums = _running_sums(pieces)
        earlier = self.seen.setdefault(cache_key or "", [])
        common = 0
        for before in earlier:
            n = 0
            for a, b in zip(before, digests, strict=False):
                if a != b:
                    break
                n += 1
            common = max(common, sums[n])
        earlier.append(digests)
        if common < MIN_CACHEABLE_TOKENS:
            read = 0
        else:
            steps = (common - MIN_CACHEABLE_TOKENS) // OPENAI_CACHE_STEP
            read = MIN_CACHEABLE_TOKENS + steps * OPENAI_CACHE_STEP
        return CacheUsage(read=read, written=0, uncached=sums[-1] - read)


def anthropic_pieces(body: dict[str, Any]) -> list[Piece]:
    """A Messages API request as its prompt's pieces, in the cache's order: tools, system,
    then each message's blocks (a message's role is part of its first block)."""
    pieces = [Piece.of(t, breakpoint="cache_control" in t) for t in body.get("tools") or []]
    system = body.get("system")
    if isinstance(system, str):
        pieces.append(Piece.of({"system": system}))
    for block in system or [] if isinstance(system, list) else []:
        pieces.append(Piece.of(block, breakpoint="cache_control" in block))
    for message in body.get("messages") or []:
        content = message.get("content")
        blocks = [{"type": "text", "text": content}] if isinstance(content, str) else content or []
        for i, block in enumerate(blocks):
            value = {"role": message.get("role"), **block} if i == 0 else block
            pieces.append(Piece.of(value, breakpoint=isinstance(block, dict) and "cache_control" in block))
    return pieces


def openai_chat_pieces(body: dict[str, Any]) -> list[Piece]:
    """A Chat Completions request as its prompt's pieces: tools, then each message."""
    return [Piece.of(t) for t in body.get("tools") or []] + [Piece.of(m) for m in body.get("messages") or []]


def openai_responses_pieces(body: dict[str, Any]) -> list[Piece]:
    """A Responses API request as its prompt's pieces: tools, instructions, each input item."""
    pieces = [Piece.of(t) for t in body.get("tools") or []]
    if body.get("instructions"):
        pieces.append(Piece.of({"instructions": body["instructions"]}))
    items = body.get("input")
    if isinstance(items, str):
        items = [{"role": "user", "content": items}]
    return pieces + [Piece.of(item) for item in items or []]
