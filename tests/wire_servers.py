"""A scriptable local HTTP server that speaks the model vendors' wire protocols.

``WireServer`` listens on 127.0.0.1 (a random port) with a hand-written
HTTP/1.1 handler: each request takes the next queued ``Reply`` (a status,
headers, and a body or SSE chunks, with optional pauses and a stall) and is
recorded (method, path, headers, JSON body, when it came, when its connection
closed). ``OpenAIWire`` and ``AnthropicWire`` build each protocol's streams,
config entries and error bodies, so one test can run against both.

A server given its ``wire`` counts each request's tokens by its own rule
(``count_tokens``: the UTF-8 bytes of the prompt's text / 4, rounded up, plus
the ``max_tokens`` asked for) and records the count. Given a
``context_window`` too, it refuses a request over it with the vendor's own
context-overflow status and body, as the real server would, and takes no
queued reply for it. A ``respond`` function answers when the queue is empty,
from the request itself: a model scripted by what it is asked.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Reply:
    """One scripted answer."""

    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes | None = None  # sent whole, with Content-Length
    chunks: list[bytes] = field(default_factory=list)  # sent chunked, one HTTP chunk each
    delay: float = 0.0  # seconds before each chunk
    stall: bool = False  # after the chunks, send nothing more until the client hangs up

    @classmethod
    def json(cls, status: int, data: Any, headers: dict[str, str] | None = None) -> Reply:
        return cls(
            status,
            {"content-type": "application/json", **(headers or {})},
            body=json.dumps(data).encode(),
        )

    @classmethod
    def sse(
        cls, events: Sequence[bytes], *, rechunk: int | None = None, delay: float = 0.0, stall: bool = False
    ) -> Reply:
        """An event stream; ``rechunk`` cuts its bytes into pieces that size, mid-line and mid-character."""
        chunks = list(events)
        if rechunk:
            data = b"".join(chunks)
            chunks = [data[i : i + rechunk] for i in range(0, len(data), rechunk)]
        return cls(200, {"content-type": "text/event-stream"}, chunks=chunks, delay=delay, stall=stall)


@dataclass
class Received:
    """One request as the server saw it."""

    method: str
    path: str
    headers: dict[str, str]  # names in lower case
    body: Any  # the JSON body, parsed
    at: float  # time.monotonic() when it arrived
    closed: asyncio.Event = field(default_factory=asyncio.Event)  # its connection ended
    closed_at: float | None = None
    complete: bool = False  # the whole reply was sent
    prompt_tokens: int = 0  # the prompt's tokens by ``count_tokens`` (a server given its wire)
    max_tokens: int = 0  # the output tokens the request asked room for
    overflowed: bool = False  # refused: over the server's context window

    @property
    def tokens(self) -> int:
        """What the request needs of the context window: its prompt and the output it asks for."""
        return self.prompt_tokens + self.max_tokens


def count_tokens(text: str) -> int:
    """The wire servers' token count of ``text``: its UTF-8 bytes / 4, rounded up."""
    return count_tokens_of((text,))


def count_tokens_of(parts: Iterable[str]) -> int:
    """``count_tokens`` of the parts joined, without joining or encoding them: the bench's
    model counts every request in the worker's own process, and a copy of a whole 20 MB
    conversation a step was most of what a long run's model call cost there."""
    size = sum(len(p) if p.isascii() else len(p.encode("utf-8")) for p in parts)
    return -(-size // 4)


class WireServer:
    """``async with WireServer() as server``: queue replies, point a provider at ``base_url``.

    ``wire``: the protocol, to count each request's tokens; ``context_window``:
    refuse a request whose tokens are over it, the way that vendor does;
    ``respond``: the answer to a request when no reply is queued.
    """

    def __init__(
        self,
        wire: Wire | None = None,
        *,
        context_window: int | None = None,
        respond: Callable[[Received], Reply] | None = None,
    ) -> None:
        if context_window is not None and wire is None:
            raise ValueError("a context window needs the wire protocol, to count a request's tokens")
        self.wire = wire
        self.context_window = context_window
        self.respond = respond
        self.replies: deque[Reply] = deque()
        self.requests: list[Received] = []
        self._arrived = asyncio.Condition()
        self._server: asyncio.Server | None = None
        self._connections: set[asyncio.Task[None]] = set()
        self.port = 0

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def queue(self, *replies: Reply) -> None:
        self.replies.extend(replies)

    async def __aenter__(self) -> WireServer:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()
        for task in list(self._connections):
            task.cancel()
        for task in list(self._connections):
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await self._server.wait_closed()

    @property
    def largest_request(self) -> int:
        """The most tokens any request asked for, refused ones included."""
        return max((r.tokens for r in self.requests), default=0)

    @property
    def accepted(self) -> list[Received]:
        """The requests answered, not refused as over the context window."""
        return [r for r in self.requests if not r.overflowed]

    def _reply_to(self, request: Received) -> Reply:
        if self.wire is not None:
            request.prompt_tokens, request.max_tokens = self.wire.count_tokens(request.body)
            if self.context_window is not None and request.tokens > self.context_window:
                request.overflowed = True
                return self.wire.overflow(request.prompt_tokens, request.max_tokens, self.context_window)
        if self.replies:
            return self.replies.popleft()
        if self.respond is not None:
            return self.respond(request)
        return _nothing_queued()

    async def wait_for_requests(self, count: int, timeout: float = 10) -> list[Received]:
        async with self._arrived:
            await asyncio.wait_for(self._arrived.wait_for(lambda: len(self.requests) >= count), timeout)
        return self.requests

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._connections.add(task)
        served: list[Received] = []
        try:
            while (request := await self._read_request(reader)) is not None:
                served.append(request)
                reply = self._reply_to(request)
                async with self._arrived:
                    self.requests.append(request)
                    self._arrived.notify_all()
                if not await self._send(reply, reader, writer):
                    break
                request.complete = True
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            self._connections.discard(task)
            writer.close()
            now = time.monotonic()
            for request in served:
                request.closed_at = request.closed_at or now
                request.closed.set()

    async def _read_request(self, reader: asyncio.StreamReader) -> Received | None:
        line = await reader.readline()
        if not line:
            return None
        method, path, _ = line.decode("latin-1").split(" ", 2)
        headers: dict[str, str] = {}
        while (header := await reader.readline()) not in (b"\r\n", b"\n", b""):
            name, _, value = header.decode("latin-1").partition(":")
            headers[name.strip().lower()] = value.strip()
        raw = await reader.readexactly(int(headers.get("content-length", "0")))
        body = json.loads(raw) if raw else None
        return Received(method, path, headers, body, time.monotonic())

    async def _send(self, reply: Reply, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        """Send one reply; False when the connection is done with."""
        head = [f"HTTP/1.1 {reply.status} Scripted"]
        head += [f"{k}: {v}" for k, v in reply.headers.items()]
        if reply.body is not None:
            head.append(f"content-length: {len(reply.body)}")
        else:
            head.append("transfer-encoding: chunked")
        writer.write(("\r\n".join(head) + "\r\n\r\n").encode("latin-1"))
        if reply.body is not None:
            writer.write(reply.body)
            await writer.drain()
            return True
        for chunk in reply.chunks:
            if reply.delay:
                await asyncio.sleep(reply.delay)
            writer.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
            await writer.drain()
        if reply.stall:
            # Keep the response open, sending nothing, until the client hangs up.
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(reader.read(), 60)
            return False
        writer.write(b"0\r\n\r\n")
        await writer.drain()
        return True


def _nothing_queued() -> Reply:
    return Reply.json(500, {"error": {"message": "wire server: no reply queued for this request"}})


def sse(data: Any, event: str | None = None) -> bytes:
    """One SSE event; ``data`` as JSON unless it is a string already."""
    text = data if isinstance(data, str) else json.dumps(data, ensure_ascii=False)
    head = f"event: {event}\n" if event else ""
    return (head + "".join(f"data: {line}\n" for line in text.split("\n")) + "\n").encode()


def split(text: str, size: int = 3) -> list[str]:
    """``text`` in pieces of ``size`` characters, as a model streams arguments."""
    return [text[i : i + size] for i in range(0, len(text), size)] or [""]


@dataclass
class Call:
    """A tool call to stream: its arguments as the pieces the model sends."""

    id: str
    name: str
    arguments: dict[str, Any]
    piece: int = 3
    raw: str | None = None  # arguments as sent, when they are not the JSON of ``arguments``

    def pieces(self) -> list[str]:
        return split(
            self.raw if self.raw is not None else json.dumps(self.arguments, ensure_ascii=False), self.piece
        )


class OpenAIWire:
    """The Chat Completions protocol, as the server writes it."""

    kind = "openai"
    path = "/chat/completions"

    def provider(self, base_url: str, api_key_env: str | None, **extra: Any) -> dict[str, Any]:
        entry: dict[str, Any] = {"kind": "openai", "base_url": base_url, **extra}
        if api_key_env:
            entry["api_key_env"] = api_key_env
        return entry

    def key_sent(self, request: Received) -> str | None:
        auth = request.headers.get("authorization")
        return auth.removeprefix("Bearer ") if auth else None

    def stream(
        self,
        text: Sequence[str] = (),
        calls: Sequence[Call] = (),
        usage: tuple[int, int] = (10, 5),
        finish: str | None = None,
        rechunk: int | None = None,
        stall: bool = False,
        delay: float = 0.0,
    ) -> Reply:
        def chunk(delta: dict[str, Any], finish_reason: str | None = None) -> bytes:
            choice = {"index": 0, "delta": delta, "finish_reason": finish_reason}
            return sse({"id": "chatcmpl-1", "object": "chat.completion.chunk", "choices": [choice]})

        events = [chunk({"role": "assistant", "content": ""})]
        events += [chunk({"content": piece}) for piece in text]
        for i, call in enumerate(calls):
            start = {"index": i, "id": call.id, "type": "function", "function": {"name": call.name}}
            events.append(
                chunk({"tool_calls": [{**start, "function": {"name": call.name, "arguments": ""}}]})
            )
            events += [
                chunk({"tool_calls": [{"index": i, "function": {"arguments": p}}]}) for p in call.pieces()
            ]
        if not stall:
            events.append(chunk({}, finish or ("tool_calls" if calls else "stop")))
            prompt, completion = usage
            tokens: dict[str, Any] = {"prompt_tokens": prompt, "completion_tokens": completion}
            tokens |= {"total_tokens": prompt + completion, "prompt_tokens_details": {"cached_tokens": 2}}
            events.append(sse({"id": "chatcmpl-1", "choices": [], "usage": tokens}))
            events.append(sse("[DONE]"))
        return Reply.sse(events, rechunk=rechunk, stall=stall, delay=delay)

    def error(self, status: int, message: str, headers: dict[str, str] | None = None) -> Reply:
        body = {"error": {"message": message, "type": "invalid_request_error", "code": None}}
        return Reply.json(status, body, headers)

    def count_tokens(self, body: Any) -> tuple[int, int]:
        """(prompt tokens, max_tokens): the messages' text, tool calls and results, and the tools."""
        parts: list[str] = []
        for m in body.get("messages", []):
            content = m.get("content")
            if isinstance(content, str):
                parts.append(content)
            elif isinstance(content, list):
                parts += [p.get("text", "") for p in content if isinstance(p, dict)]
            for call in m.get("tool_calls") or []:
                parts += [call["function"]["name"], call["function"]["arguments"]]
        parts += [json.dumps(t, ensure_ascii=False) for t in body.get("tools", [])]
        return count_tokens_of(parts), int(body.get("max_tokens") or body.get("max_completion_tokens") or 0)

    def overflow(self, prompt: int, max_tokens: int, window: int) -> Reply:
        """OpenAI's answer to a request over the context window: 400 ``context_length_exceeded``."""
        if max_tokens:
            message = (
                f"This model's maximum context length is {window} tokens. However, you requested "
                f"{prompt + max_tokens} tokens ({prompt} in the messages, {max_tokens} in the completion). "
                "Please reduce the length of the messages or completion."
            )
        else:
            message = (
                f"This model's maximum context length is {window} tokens. However, your messages "
                f"resulted in {prompt} tokens. Please reduce the length of the messages."
            )
        error = {
            "message": message,
            "type": "invalid_request_error",
            "param": "messages",
            "code": "context_length_exceeded",
        }
        return Reply.json(400, {"error": error})

    def messages(self, request: Received) -> list[dict[str, Any]]:
        return list(request.body["messages"])

    def tool_names(self, request: Received) -> list[str]:
        return [t["function"]["name"] for t in request.body.get("tools", [])]


class AnthropicWire:
    """The Messages protocol, as the server writes it."""

    kind = "anthropic"
    path = "/v1/messages"

    def provider(self, base_url: str, api_key_env: str | None, **extra: Any) -> dict[str, Any]:
        return {"kind": "anthropic", "base_url": base_url, "api_key_env": api_key_env, **extra}

    def key_sent(self, request: Received) -> str | None:
        return request.headers.get("x-api-key")

    def stream(
        self,
        text: Sequence[str] = (),
        calls: Sequence[Call] = (),
        usage: tuple[int, int] = (10, 5),
        finish: str | None = None,
        rechunk: int | None = None,
        stall: bool = False,
        delay: float = 0.0,
    ) -> Reply:
        prompt, completion = usage
        start_usage = {"input_tokens": prompt - 2, "output_tokens": 1, "cache_read_input_tokens": 2}
        message = {"id": "msg_1", "type": "message", "role": "assistant", "content": [], "usage": start_usage}
        events = [sse({"type": "message_start", "message": message}, "message_start")]
        events.append(sse({"type": "ping"}, "ping"))
        index = 0
        if text:
            block = {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}
            events.append(sse(block, "content_block_start"))
            for piece in text:
                delta = {
                    "type": "content_block_delta",
                    "index": 0,
                    "delta": {"type": "text_delta", "text": piece},
                }
                events.append(sse(delta, "content_block_delta"))
            events.append(sse({"type": "content_block_stop", "index": 0}, "content_block_stop"))
            index = 1
        for i, call in enumerate(calls, start=index):
            use = {"type": "tool_use", "id": call.id, "name": call.name, "input": {}}
            events.append(
                sse({"type": "content_block_start", "index": i, "content_block": use}, "content_block_start")
            )
            for p in call.pieces():
                delta = {"type": "input_json_delta", "partial_json": p}
                events.append(
                    sse({"type": "content_block_delta", "index": i, "delta": delta}, "content_block_delta")
                )
            events.append(sse({"type": "content_block_stop", "index": i}, "content_block_stop"))
        if not stall:
            stop = finish or ("tool_use" if calls else "end_turn")
            end = {
                "type": "message_delta",
                "delta": {"stop_reason": stop},
                "usage": {"output_tokens": completion},
            }
            events.append(sse(end, "message_delta"))
            events.append(sse({"type": "message_stop"}, "message_stop"))
        return Reply.sse(events, rechunk=rechunk, stall=stall, delay=delay)

    def error(self, status: int, message: str, headers: dict[str, str] | None = None) -> Reply:
        body = {"type": "error", "error": {"type": "invalid_request_error", "message": message}}
        return Reply.json(status, body, headers)

    def count_tokens(self, body: Any) -> tuple[int, int]:
        """(prompt tokens, max_tokens): system, the blocks' text, tool uses and results, and the tools."""
        parts: list[str] = []
        system = body.get("system", "")
        parts += [system] if isinstance(system, str) else [b.get("text", "") for b in system]
        for m in body.get("messages", []):
            content = m.get("content")
            blocks = [{"type": "text", "text": content}] if isinstance(content, str) else content
            for b in blocks:
                if b["type"] == "text":
                    parts.append(b["text"])
                elif b["type"] == "tool_use":
                    parts += [b["name"], json.dumps(b["input"], ensure_ascii=False)]
                elif b["type"] == "tool_result":
                    result = b.get("content", "")
                    parts += [result] if isinstance(result, str) else [r.get("text", "") for r in result]
        parts += [json.dumps(t, ensure_ascii=False) for t in body.get("tools", [])]
        return count_tokens_of(parts), int(body.get("max_tokens") or 0)

    def overflow(self, prompt: int, max_tokens: int, window: int) -> Reply:
        """Anthropic's answer to a request over the context window: 400 ``invalid_request_error``."""
        if prompt > window:
            message = f"prompt is too long: {prompt} tokens > {window} maximum"
        else:
            message = (
                f"input length and `max_tokens` exceed context limit: {prompt} + {max_tokens} > {window}, "
                "decrease input length or `max_tokens` and try again"
            )
        body = {"type": "error", "error": {"type": "invalid_request_error", "message": message}}
        return Reply.json(400, body, {"request-id": "req_wire_overflow"})

    def messages(self, request: Received) -> list[dict[str, Any]]:
        return list(request.body["messages"])

    def tool_names(self, request: Received) -> list[str]:
        return [t["name"] for t in request.body.get("tools", [])]


Wire = OpenAIWire | AnthropicWire


def last_tool_result_id(request: Received) -> str | None:
    """The id of the newest tool result in a request, in either protocol; None if it has none."""
    for m in reversed(request.body.get("messages", [])):
        if m.get("role") == "tool":
            return str(m.get("tool_call_id"))
        content = m.get("content")
        if isinstance(content, list):
            ids = [b.get("tool_use_id") for b in content if b.get("type") == "tool_result"]
            if ids:
                return str(ids[-1])
    return None


@dataclass
class Reader:
    """A model, scripted by what it is asked: ``read`` each of ``files`` in turn, then answer.

    Which file comes next is read from the request itself (the id of its newest
    tool result, ``read-<index>``), so it answers right whatever of the
    conversation was compacted away, and a retried request gets the same answer.
    A request without tools is a request for a summary: answered with one.
    Usage reports the server's count of the prompt.
    """

    wire: Wire
    files: Sequence[str]
    answer: str = "I have read every file."
    summaries: int = 0

    def __call__(self, request: Received) -> Reply:
        usage = (request.prompt_tokens, 20)
        if not self.wire.tool_names(request):
            self.summaries += 1
            summary = f"Summary {self.summaries}: the files were read one by one; nothing else happened."
            return self.wire.stream(text=[summary], usage=usage)
        last = last_tool_result_id(request)
        done = int(last.removeprefix("read-")) + 1 if last and last.startswith("read-") else 0
        if done < len(self.files):
            call = Call(f"read-{done:03d}", "read", {"file_path": self.files[done]}, piece=64)
            return self.wire.stream(calls=[call], usage=usage)
        return self.wire.stream(text=[self.answer], usage=usage)
