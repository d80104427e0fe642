"""A scriptable local HTTP server that speaks the model vendors' wire protocols.

``WireServer`` listens on 127.0.0.1 (a random port) with a hand-written
HTTP/1.1 handler: each request takes the next queued ``Reply`` (a status,
headers, and a body or SSE chunks, with optional pauses and a stall) and is
recorded (method, path, headers, JSON body, when it came, when its connection
closed). ``OpenAIWire`` and ``AnthropicWire`` build each protocol's streams,
config entries and error bodies, so one test can run against both.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections import deque
from collections.abc import Sequence
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


class WireServer:
    """``async with WireServer() as server``: queue replies, point a provider at ``base_url``."""

    def __init__(self) -> None:
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
                async with self._arrived:
                    self.requests.append(request)
                    self._arrived.notify_all()
                reply = self.replies.popleft() if self.replies else _nothing_queued()
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

    def messages(self, request: Received) -> list[dict[str, Any]]:
        return list(request.body["messages"])

    def tool_names(self, request: Received) -> list[str]:
        return [t["name"] for t in request.body.get("tools", [])]


Wire = OpenAIWire | AnthropicWire
