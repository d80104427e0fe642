"""The HTTP providers against a local server that speaks each wire protocol.

Unit-level tests call a provider directly; the retry, failure, cancel and
full-run tests go through ``AgentRun`` on the real Temporal dev server, so the
retries exercised are Temporal's. No test reaches past 127.0.0.1: the
``loopback_only`` guard refuses it and fails the test that tried.
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
import socket
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from temporalio.client import Client

from durable_agent.activities import AgentActivities
from durable_agent.activities.providers import ModelProvider, ProviderError, build_providers
from durable_agent.activities.providers.http_errors import MAX_RETRY_AFTER, Failures, parse_retry_after
from durable_agent.client import follow_run, run_result
from durable_agent.config import ConfigError, load_config, parse_config
from durable_agent.core.activity_api import ModelCallInput
from durable_agent.core.models import (
    LiveText,
    Message,
    TextBlock,
    ToolDefinition,
    ToolResultBlock,
    ToolUseBlock,
)
from tests.helpers import final, running_worker, scripted_config, start, until, workspace_with
from tests.wire_servers import AnthropicWire, Call, OpenAIWire, Reply, Wire, WireServer, sse

SECRET = "sk-wire-test-5e1d0c-never-in-history-9f2a"
KEY_ENV = "AGENT_HTTP_TEST_KEY"
MODEL = "test-model"

WIRES = [pytest.param(OpenAIWire(), id="openai"), pytest.param(AnthropicWire(), id="anthropic")]


# --- the network guard ------------------------------------------------------------


class NetworkGuardError(OSError):
    """A test tried to reach a host other than this machine."""


def _loopback(host: object) -> bool:
    if isinstance(host, bytes):
        host = host.decode()
    if not isinstance(host, str):
        return False
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.split("%")[0]).is_loopback
    except ValueError:
        return False


@pytest.fixture(autouse=True)
def loopback_only(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """Refuse every connection and name lookup past loopback; a test that tried fails.

    The Temporal client and worker are Rust and use no Python sockets, so they
    are unaffected; httpx and anything else in Python go through these.
    """
    refused: list[str] = []
    real_connect, real_connect_ex = socket.socket.connect, socket.socket.connect_ex
    real_getaddrinfo = socket.getaddrinfo

    def check(address: object) -> None:
        if isinstance(address, tuple) and not _loopback(address[0]):
            refused.append(repr(address))
            raise NetworkGuardError(f"tests talk only to 127.0.0.1, not {address!r}")

    def connect(self: socket.socket, address: Any) -> None:
        check(address)
        real_connect(self, address)

    def connect_ex(self: socket.socket, address: Any) -> int:
        check(address)
        return real_connect_ex(self, address)

    def getaddrinfo(host: Any, *args: Any, **kwargs: Any) -> Any:
        if host is not None:
            check((host, 0))
        return real_getaddrinfo(host, *args, **kwargs)

    monkeypatch.setattr(socket.socket, "connect", connect)
    monkeypatch.setattr(socket.socket, "connect_ex", connect_ex)
    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    yield refused
    assert not refused, f"the test tried to reach the network: {refused}"


# --- parts ------------------------------------------------------------------------


@pytest.fixture
async def server() -> Any:
    async with WireServer() as s:
        yield s


@pytest.fixture
def key(monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv(KEY_ENV, SECRET)
    return SECRET


READ_TOOL = ToolDefinition(
    name="read",
    description="Read a file.",
    input_schema={
        "type": "object",
        "properties": {"file_path": {"type": "string"}},
        "required": ["file_path"],
    },
)


def call_input(*messages: Message, system: str = "Be brief.") -> ModelCallInput:
    if not messages:
        messages = (Message(role="user", content=(TextBlock(text="hello"),)),)
    return ModelCallInput(
        run_id="run-1", model=f"p/{MODEL}", system_prompt=system, messages=messages, tools=(READ_TOOL,)
    )


def provider_for(wire: Wire, server: WireServer, tmp_path: Path, **extra: Any) -> ModelProvider:
    data: dict[str, object] = {
        "default_model": f"p/{MODEL}",
        "providers": {"p": wire.provider(server.base_url, KEY_ENV, **extra)},
    }
    return build_providers(parse_config(data, tmp_path))["p"]


def http_config(wire: Wire, server: WireServer, tmp_path: Path, **extra: Any) -> Any:
    """A worker config whose default model is ``<kind>/test-model`` on ``server``."""
    return scripted_config(
        tmp_path,
        [final()],
        default_model=f"{wire.kind}/{MODEL}",
        providers={wire.kind: wire.provider(server.base_url, KEY_ENV, **extra)},
    )


def model_attempts(history: Any) -> list[tuple[int, str]]:
    """(attempt, last failure message) of each started model call in a history."""
    scheduled = {
        e.event_id
        for e in history.events
        if e.HasField("activity_task_scheduled_event_attributes")
        and e.activity_task_scheduled_event_attributes.activity_type.name == "agent.model_call"
    }
    return [
        (a.attempt, a.last_failure.message)
        for e in history.events
        if e.HasField("activity_task_started_event_attributes")
        and (a := e.activity_task_started_event_attributes).scheduled_event_id in scheduled
    ]


# --- streaming, tool calls and usage (provider called directly) ----------------------


@pytest.mark.parametrize("wire", WIRES)
async def test_a_plain_answer_streams_its_text_and_reports_usage(
    wire: Wire, server: WireServer, tmp_path: Path, key: str
) -> None:
    # cut into 5-byte HTTP chunks: lines, events and "ö" all split across reads
    server.queue(wire.stream(text=["Hel", "lo, ", "wörld", "!"], usage=(10, 5), rechunk=5))
    provider = provider_for(wire, server, tmp_path)
    pieces: list[str] = []
    response = await provider.complete(call_input(), MODEL, pieces.append)
    assert pieces == ["Hel", "lo, ", "wörld", "!"]
    assert response.message.role == "assistant"
    assert response.message.content == (TextBlock(text="Hello, wörld!"),)
    assert response.stop_reason == "end_turn"
    usage = response.usage
    assert (usage.prompt_tokens, usage.completion_tokens, usage.total_tokens) == (10, 5, 15)
    assert usage.cache_read_tokens == 2
    [request] = server.requests
    assert (request.method, request.path) == ("POST", wire.path)
    assert wire.key_sent(request) == key
    assert request.body["model"] == MODEL and request.body["stream"] is True
    assert wire.tool_names(request) == ["read"]
    assert request.headers["accept"] == "text/event-stream"


ARGS_1 = {"file_path": "src/ünïcode €.py", "offset": 3}
ARGS_2 = {"file_path": 'we "quote" \\ and\nbreak', "limit": 1}


def decoded(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Messages as sent, with OpenAI's tool-call arguments (a JSON string each) decoded."""
    for m in messages:
        for c in m.get("tool_calls", []):
            c["function"]["arguments"] = json.loads(c["function"]["arguments"])
    return messages


# How each protocol sends the assistant step back: where it sits in the messages (OpenAI's
# first message is the system prompt) and what it is.
ASSISTANT_STEP_SENT = [
    pytest.param(
        OpenAIWire(),
        2,
        {
            "role": "assistant",
            "content": "Let me look.",
            "tool_calls": [
                {"id": "call_a", "type": "function", "function": {"name": "read", "arguments": ARGS_1}},
                {"id": "call_b", "type": "function", "function": {"name": "read", "arguments": ARGS_2}},
            ],
        },
        id="openai",
    ),
    pytest.param(
        AnthropicWire(),
        1,
        {
            "role": "assistant",
            "content": [
                {"type": "text", "text": "Let me look."},
                {"type": "tool_use", "id": "call_a", "name": "read", "input": ARGS_1},
                {"type": "tool_use", "id": "call_b", "name": "read", "input": ARGS_2},
            ],
        },
        id="anthropic",
    ),
]


@pytest.mark.parametrize(("wire", "at", "assistant"), ASSISTANT_STEP_SENT)
async def test_several_tool_calls_with_arguments_split_across_chunks_are_reassembled_exactly(
    wire: Wire, at: int, assistant: dict[str, Any], server: WireServer, tmp_path: Path, key: str
) -> None:
    calls = [Call("call_a", "read", ARGS_1, piece=1), Call("call_b", "read", ARGS_2, piece=2)]
    server.queue(wire.stream(text=["Let me look."], calls=calls, rechunk=7), wire.stream(text=["done"]))
    provider = provider_for(wire, server, tmp_path)
    response = await provider.complete(call_input(), MODEL, lambda _: None)
    assert response.message.content == (
        TextBlock(text="Let me look."),
        ToolUseBlock(id="call_a", name="read", input=ARGS_1),
        ToolUseBlock(id="call_b", name="read", input=ARGS_2),
    )
    assert response.stop_reason == "tool_use"
    # back on the wire, the assistant step is what the server sent: nothing lost
    results = Message(
        role="user",
        content=(
            ToolResultBlock(tool_use_id="call_a", content="print('hi')"),
            ToolResultBlock(tool_use_id="call_b", content="no such file", is_error=True),
        ),
    )
    prompt = Message(role="user", content=(TextBlock(text="hello"),))
    await provider.complete(call_input(prompt, response.message, results), MODEL, lambda _: None)
    assert decoded(wire.messages(server.requests[1]))[at] == assistant


async def test_openai_tool_calls_sent_whole_without_an_index_are_kept_apart(
    server: WireServer, tmp_path: Path, key: str
) -> None:
    # some compatible servers send each call in one chunk, without "index" and with "stop"
    def chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
        return sse({"choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})

    calls = [
        {
            "id": f"c{i}",
            "type": "function",
            "function": {"name": "read", "arguments": f'{{"file_path": "{i}"}}'},
        }
        for i in (1, 2)
    ]
    server.queue(
        Reply.sse([chunk({"tool_calls": [calls[0]]}), chunk({"tool_calls": [calls[1]]}), chunk({}, "stop")])
    )
    response = await provider_for(OpenAIWire(), server, tmp_path).complete(
        call_input(), MODEL, lambda _: None
    )
    assert response.message.tool_uses() == [
        ToolUseBlock(id="c1", name="read", input={"file_path": "1"}),
        ToolUseBlock(id="c2", name="read", input={"file_path": "2"}),
    ]
    assert response.stop_reason == "tool_use" and response.usage.total_tokens == 0


CONVERSATION = (
    Message(role="user", content=(TextBlock(text="Read both files"),)),
    Message(
        role="assistant",
        content=(
            TextBlock(text="Reading them."),
            ToolUseBlock(id="r1", name="read", input={"file_path": "a.txt"}),
            ToolUseBlock(id="r2", name="read", input={"file_path": "b ü.txt"}),
        ),
    ),
    Message(
        role="user",
        content=(
            ToolResultBlock(tool_use_id="r1", content="alpha"),
            ToolResultBlock(tool_use_id="r2", content="no such file", is_error=True),
        ),
    ),
)


@dataclass(frozen=True)
class WireFormat:
    """What one protocol puts on the wire for ``CONVERSATION``: headers, and body fields."""

    wire: Wire
    headers: dict[str, str]  # sent, with these values
    not_headers: tuple[str, ...]  # never sent
    body: dict[str, Any]  # fields of the JSON body (tool-call arguments decoded), with these values
    not_body: tuple[str, ...]  # fields never sent


WIRE_FORMATS = [
    pytest.param(
        WireFormat(
            OpenAIWire(),
            headers={"authorization": f"Bearer {SECRET}"},
            not_headers=("x-api-key", "anthropic-version"),
            body={
                "stream_options": {"include_usage": True},
                "tools": [
                    {
                        "type": "function",
                        "function": {
                            "name": "read",
                            "description": "Read a file.",
                            "parameters": READ_TOOL.input_schema,
                        },
                    }
                ],
                "messages": [
                    {"role": "system", "content": "You are terse."},
                    {"role": "user", "content": "Read both files"},
                    {
                        "role": "assistant",
                        "content": "Reading them.",
                        "tool_calls": [
                            {
                                "id": "r1",
                                "type": "function",
                                "function": {"name": "read", "arguments": {"file_path": "a.txt"}},
                            },
                            {
                                "id": "r2",
                                "type": "function",
                                "function": {"name": "read", "arguments": {"file_path": "b ü.txt"}},
                            },
                        ],
                    },
                    {"role": "tool", "tool_call_id": "r1", "content": "alpha"},
                    {"role": "tool", "tool_call_id": "r2", "content": "Error: no such file"},
                ],
            },
            not_body=("max_tokens", "temperature", "system"),
        ),
        id="openai",
    ),
    pytest.param(
        WireFormat(
            AnthropicWire(),
            headers={"x-api-key": SECRET, "anthropic-version": "2023-06-01"},
            not_headers=("authorization",),
            body={
                # prompt caching (on by default): breakpoints on the last tool, the system
                # prompt and the last block of each of the two newest user messages
                "system": [
                    {"type": "text", "text": "You are terse.", "cache_control": {"type": "ephemeral"}}
                ],
                "max_tokens": 4096,
                "tools": [
                    {
                        "name": "read",
                        "description": "Read a file.",
                        "input_schema": READ_TOOL.input_schema,
                        "cache_control": {"type": "ephemeral"},
                    }
                ],
                "messages": [
                    {
                        "role": "user",
                        "content": [
                            {
                                "type": "text",
                                "text": "Read both files",
                                "cache_control": {"type": "ephemeral"},
                            }
                        ],
                    },
                    {
                        "role": "assistant",
                        "content": [
                            {"type": "text", "text": "Reading them."},
                            {"type": "tool_use", "id": "r1", "name": "read", "input": {"file_path": "a.txt"}},
                            {
                                "type": "tool_use",
                                "id": "r2",
                                "name": "read",
                                "input": {"file_path": "b ü.txt"},
                            },
                        ],
                    },
                    {
                        "role": "user",
                        "content": [
                            {"type": "tool_result", "tool_use_id": "r1", "content": "alpha"},
                            {
                                "type": "tool_result",
                                "tool_use_id": "r2",
                                "content": "no such file",
                                "is_error": True,
                                "cache_control": {"type": "ephemeral"},
                            },
                        ],
                    },
                ],
            },
            not_body=("stream_options", "temperature"),
        ),
        id="anthropic",
    ),
]


@pytest.mark.parametrize("expected", WIRE_FORMATS)
async def test_the_wire_format_of_a_conversation(
    expected: WireFormat, server: WireServer, tmp_path: Path, key: str
) -> None:
    wire = expected.wire
    server.queue(wire.stream(text=["ok"]))
    await provider_for(wire, server, tmp_path).complete(
        call_input(*CONVERSATION, system="You are terse."), MODEL, lambda _: None
    )
    [request] = server.requests
    assert wire.key_sent(request) == key
    for name, value in expected.headers.items():
        assert request.headers[name] == value, name
    assert [h for h in expected.not_headers if h in request.headers] == []
    body = {**request.body, "messages": decoded(request.body["messages"])}
    for name, value in expected.body.items():
        assert body[name] == value, name
    assert [f for f in expected.not_body if f in body] == []


@pytest.mark.parametrize("wire", WIRES)
async def test_provider_and_model_settings_reach_the_wire(
    wire: Wire, server: WireServer, tmp_path: Path, key: str
) -> None:
    server.queue(wire.stream(text=["a"]), wire.stream(text=["b"]))
    provider = provider_for(
        wire,
        server,
        tmp_path,
        max_tokens=100,
        temperature=0.2,
        headers={"X-Team": "core", "X-Trace": "on"},
        models={"big-model": {"max_tokens": 9000, "temperature": 0.7, "headers": {"x-team": "research"}}},
    )
    await provider.complete(call_input(), MODEL, lambda _: None)
    await provider.complete(call_input(), "big-model", lambda _: None)
    plain, big = server.requests
    assert (plain.body["max_tokens"], plain.body["temperature"], plain.headers["x-team"]) == (
        100,
        0.2,
        "core",
    )
    assert (big.body["max_tokens"], big.body["temperature"], big.headers["x-team"]) == (9000, 0.7, "research")
    assert big.body["model"] == "big-model" and big.headers["x-trace"] == "on"
    assert wire.key_sent(big) == key  # extra headers add to the credential, never replace it


# --- failures, classified (provider called directly) ------------------------------------


@pytest.mark.parametrize("wire", WIRES)
async def test_a_malformed_stream_is_a_clear_failure_that_is_not_retried(
    wire: Wire, server: WireServer, tmp_path: Path, key: str
) -> None:
    server.queue(
        Reply.sse([sse("{not json")]),
        Reply(200, {"content-type": "text/html"}, body=b"<html>Bad gateway page</html>"),
        Reply.json(200, {"choices": [{"message": {"content": "not streamed"}}]}),
    )
    provider = provider_for(wire, server, tmp_path)
    for expected in ("not json", "text/html", "application/json"):
        with pytest.raises(ProviderError) as caught:
            await provider.complete(call_input(), MODEL, lambda _: None)
        assert not caught.value.retryable
        message = str(caught.value)
        assert message.startswith(f"model p/{MODEL}: the response did not parse")
        assert expected in message and key not in message


@pytest.mark.parametrize("wire", WIRES)
async def test_a_stream_cut_off_mid_answer_is_retryable(
    wire: Wire, server: WireServer, tmp_path: Path, key: str
) -> None:
    cut = wire.stream(text=["partial"])
    cut.chunks = cut.chunks[:-3]  # no finish, no stop: the connection "dropped"
    server.queue(cut)
    with pytest.raises(ProviderError, match="ended before the answer was complete") as caught:
        await provider_for(wire, server, tmp_path).complete(call_input(), MODEL, lambda _: None)
    assert caught.value.retryable


@pytest.mark.parametrize(
    ("wire", "event", "retryable"),
    [
        (OpenAIWire(), {"error": {"message": "upstream overloaded", "code": 503}}, True),
        (OpenAIWire(), {"error": {"message": "context length exceeded", "code": 400}}, False),
        (AnthropicWire(), {"type": "error", "error": {"type": "overloaded_error", "message": "busy"}}, True),
        (
            AnthropicWire(),
            {"type": "error", "error": {"type": "invalid_request_error", "message": "no"}},
            False,
        ),
    ],
    ids=["openai-503", "openai-400", "anthropic-overloaded", "anthropic-invalid"],
)
async def test_an_error_event_in_the_stream_is_classified(
    wire: Wire, event: dict[str, Any], retryable: bool, server: WireServer, tmp_path: Path, key: str
) -> None:
    stream = wire.stream(text=["start"], stall=True)
    server.queue(Reply.sse([*stream.chunks, sse(event, "error")]))
    with pytest.raises(ProviderError, match="error event in the response stream") as caught:
        await provider_for(wire, server, tmp_path).complete(call_input(), MODEL, lambda _: None)
    assert caught.value.retryable is retryable


@pytest.mark.parametrize(
    ("wire", "finish"),
    [
        pytest.param(OpenAIWire(), "length", id="openai"),
        pytest.param(AnthropicWire(), "max_tokens", id="anthropic"),
    ],
)
async def test_a_tool_call_cut_off_by_max_tokens_says_to_raise_it(
    wire: Wire, finish: str, server: WireServer, tmp_path: Path, key: str
) -> None:
    # the output limit struck mid-arguments (each protocol's own stop reason): the JSON is incomplete
    cut = Call("c1", "read", {}, raw='{"file_path": "a-long-na')
    reply = wire.stream(calls=[cut], finish=finish)
    server.queue(reply)
    with pytest.raises(ProviderError, match="max_tokens=50 in the middle of a call to tool 'read'") as caught:
        await provider_for(wire, server, tmp_path, max_tokens=50).complete(
            call_input(), MODEL, lambda _: None
        )
    assert not caught.value.retryable


# Each protocol's refusal of a request over the context window, as the wire server sends it
# (``wire.overflow``): the prompt alone over it, and the prompt with the ``max_tokens`` asked for.
OVERFLOW_SAID = [
    pytest.param(
        OpenAIWire(),
        "This model's maximum context length is 300 tokens. However, you requested",
        "in the messages, 100 in the completion). Please reduce the length of the messages or completion.",
        id="openai",
    ),
    pytest.param(
        AnthropicWire(),
        "prompt is too long: ",
        "input length and `max_tokens` exceed context limit: ",
        id="anthropic",
    ),
]


@pytest.mark.parametrize(("wire", "too_long", "with_output"), OVERFLOW_SAID)
async def test_a_request_over_the_context_window_is_a_context_overflow_that_is_not_retried(
    wire: Wire, too_long: str, with_output: str, tmp_path: Path, key: str
) -> None:
    async with WireServer(wire, context_window=300) as server:
        server.queue(wire.stream(text=["fits"]))
        provider = provider_for(wire, server, tmp_path, max_tokens=100)
        # ~40 tokens of prompt: answered, and the server's count is recorded
        response = await provider.complete(call_input(), MODEL, lambda _: None)
        assert response.message.text() == "fits" and 0 < server.requests[0].tokens <= 300
        for words, said in ((400, too_long), (220, with_output)):  # 1 token a word ("abc ")
            big = Message(role="user", content=(TextBlock(text="abc " * words),))
            with pytest.raises(ProviderError) as caught:
                await provider.complete(call_input(big), MODEL, lambda _: None)
            error = caught.value
            assert error.context_overflow and not error.retryable
            assert str(error).startswith(f"model p/{MODEL}: HTTP 400 Bad Request (not retried): ")
            assert said in str(error) and key not in str(error)
            assert server.requests[-1].overflowed and server.requests[-1].tokens > 300
        # ordinary refusals and failures are not overflows
        server.queue(wire.error(400, "messages: roles must alternate"), wire.error(413, "request too large"))
        for _ in range(2):
            with pytest.raises(ProviderError) as caught:
                await provider.complete(call_input(), MODEL, lambda _: None)
            assert not caught.value.context_overflow and not caught.value.retryable


@pytest.mark.parametrize(
    "error",
    [
        pytest.param(
            {
                "message": "This model's maximum context length is 128000 tokens. However, your messages "
                "resulted in 130412 tokens. Please reduce the length of the messages.",
                "type": "invalid_request_error",
                "param": "messages",
                "code": "context_length_exceeded",
            },
            id="openai",
        ),
        pytest.param(
            {
                "object": "error",
                "message": "This model's maximum context length is 32768 tokens. However, you requested "
                "33100 tokens (32076 in the messages, 1024 in the completion). Please reduce the length "
                "of the messages or completion.",
                "type": "BadRequestError",
                "param": None,
                "code": 400,
            },
            id="vllm",
        ),
        pytest.param(
            {
                "code": 400,
                "message": "request (4476 tokens) exceeds the available context size (4096 tokens)",
                "type": "exceed_context_size_error",
                "n_prompt_tokens": 4476,
                "n_ctx": 4096,
            },
            id="llama.cpp",
        ),
        pytest.param(
            {
                "type": "invalid_request_error",
                "message": "prompt is too long: 213462 tokens > 200000 maximum",
            },
            id="anthropic",
        ),
        pytest.param(
            {
                "type": "invalid_request_error",
                "message": "input length and `max_tokens` exceed context limit: 199759 + 8192 > 200000, "
                "decrease input length or `max_tokens` and try again",
            },
            id="anthropic-max-tokens",
        ),
    ],
)
def test_the_context_overflow_shapes_of_each_server(error: dict[str, Any]) -> None:
    body = json.dumps({"type": "error", "error": error} if "param" not in error else {"error": error})
    failure = Failures("p", "m", SECRET).status(400, httpx.Headers(), body.encode())
    assert failure.context_overflow and not failure.retryable
    assert error["message"][:40] in str(failure)
    # the same words in a retryable status, or another kind of 400, are not an overflow
    assert not Failures("p", "m", SECRET).status(503, httpx.Headers(), body.encode()).context_overflow
    other = json.dumps({"error": {"type": "invalid_request_error", "message": "prompt is required"}})
    assert not Failures("p", "m", SECRET).status(400, httpx.Headers(), other.encode()).context_overflow


async def test_an_unreachable_server_is_a_retryable_network_error(tmp_path: Path, key: str) -> None:
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    data: dict[str, object] = {
        "default_model": "p/m",
        "providers": {
            "p": {"kind": "openai", "base_url": f"http://127.0.0.1:{port}/v1", "api_key_env": KEY_ENV}
        },
    }
    provider = build_providers(parse_config(data, tmp_path))["p"]
    with pytest.raises(ProviderError) as caught:
        await provider.complete(call_input(), "m", lambda _: None)
    assert caught.value.retryable
    assert f"model p/m: network error talking to http://127.0.0.1:{port}: ConnectError" in str(caught.value)


@pytest.mark.parametrize("status", [408, 409, 429, 500, 502, 503, 504, 529])
def test_retryable_statuses(status: int) -> None:
    error = Failures("p", "m", SECRET).status(status, httpx.Headers({"retry-after": "7"}), b"{}")
    assert error.retryable and error.retry_after == timedelta(seconds=7)


@pytest.mark.parametrize("status", [400, 401, 402, 403, 404, 413, 422])
def test_non_retryable_statuses_name_provider_model_and_what_the_server_said(status: int) -> None:
    body = json.dumps({"error": {"message": f"bad key {SECRET}", "type": "authentication_error"}}).encode()
    error = Failures("vendor", "big-1", SECRET).status(status, httpx.Headers({"retry-after": "7"}), body)
    assert not error.retryable and error.retry_after is None
    assert str(error).startswith(f"model vendor/big-1: HTTP {status} ")
    assert "(not retried): authentication_error: bad key ***" in str(error)
    assert SECRET not in str(error)


def test_retry_after_in_seconds_milliseconds_and_http_dates_capped() -> None:
    now = datetime(2025, 1, 1, 12, 0, 0, tzinfo=UTC)

    def parse(**headers: str) -> timedelta | None:
        return parse_retry_after(httpx.Headers({k.replace("_", "-"): v for k, v in headers.items()}), now)

    assert parse(retry_after="3") == timedelta(seconds=3)
    assert parse(retry_after=" 1.5 ") == timedelta(seconds=1.5)
    assert parse(retry_after_ms="250", retry_after="9") == timedelta(milliseconds=250)
    assert parse(retry_after="Wed, 01 Jan 2025 12:00:42 GMT") == timedelta(seconds=42)
    assert parse(retry_after="Wed, 01 Jan 2025 11:00:00 GMT") is None  # in the past
    assert parse(retry_after="86400") == MAX_RETRY_AFTER
    assert parse(retry_after="Thu, 01 Jan 2026 00:00:00 GMT") == MAX_RETRY_AFTER
    for junk in ("soon", "", "-5", "0", "nan"):
        assert parse(retry_after=junk) is None
    assert parse() is None


@pytest.mark.parametrize("wire", WIRES)
async def test_a_cancelled_call_closes_its_connection(
    wire: Wire, server: WireServer, tmp_path: Path, key: str
) -> None:
    server.queue(wire.stream(text=["thinking"], stall=True))
    pieces: list[str] = []
    task = asyncio.create_task(
        provider_for(wire, server, tmp_path).complete(call_input(), MODEL, pieces.append)
    )
    [request] = await server.wait_for_requests(1)
    await until("the first streamed text", lambda: pieces, 5, interval=0.02)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await asyncio.wait_for(request.closed.wait(), 5)
    assert not request.complete


# --- config ---------------------------------------------------------------------------


def test_a_three_line_provider_entry_is_enough(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "agent.toml"
    path.write_text(
        'default_model = "claude/claude-sonnet-4-5"\n'
        '[providers.claude]\nkind = "anthropic"\napi_key_env = "AGENT_HTTP_TEST_KEY"\n'
        '[providers.gpt]\nkind = "openai"\napi_key_env = "AGENT_HTTP_TEST_KEY"\n'
        '[providers.ollama]\nkind = "openai"\nbase_url = "http://localhost:11434/v1/"\n'
    )
    monkeypatch.setenv(KEY_ENV, SECRET)
    config = load_config(path)
    claude, gpt, ollama = (config.providers[n] for n in ("claude", "gpt", "ollama"))
    assert claude.kind == "anthropic" and claude.base_url == "https://api.anthropic.com"
    assert gpt.kind == "openai" and gpt.base_url == "https://api.openai.com/v1"
    assert ollama.kind == "openai" and ollama.base_url == "http://localhost:11434/v1"
    assert ollama.api_key_env is None  # a local server needs no key
    providers = AgentActivities(config).providers
    assert set(providers) == {"claude", "gpt", "ollama"}


@pytest.mark.parametrize("kind", ["openai", "anthropic"])
def test_a_missing_credential_is_a_clear_error_at_worker_start(
    kind: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("AGENT_NO_SUCH_KEY", raising=False)
    data: dict[str, object] = {
        "default_model": "p/m",
        "providers": {"p": {"kind": kind, "api_key_env": "AGENT_NO_SUCH_KEY"}},
    }
    with pytest.raises(ConfigError, match=r"provider 'p' needs a credential .* AGENT_NO_SUCH_KEY"):
        AgentActivities(parse_config(data, tmp_path))


@pytest.mark.parametrize("wire", WIRES)
async def test_a_key_pasted_with_a_newline_works_and_one_a_header_cannot_carry_is_refused(
    wire: Wire, server: WireServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(KEY_ENV, f"  {SECRET}\n")
    server.queue(wire.stream(text=["ok"]))
    await provider_for(wire, server, tmp_path).complete(call_input(), MODEL, lambda _: None)
    assert wire.key_sent(server.requests[0]) == SECRET
    monkeypatch.setenv(KEY_ENV, "sk-two words-é")
    with pytest.raises(ConfigError, match=f"credential in {KEY_ENV} holds characters") as caught:
        provider_for(wire, server, tmp_path)
    assert "two words" not in str(caught.value)


async def test_an_openai_compatible_server_without_a_key_gets_no_authorization(
    server: WireServer, tmp_path: Path
) -> None:
    wire = OpenAIWire()
    server.queue(wire.stream(text=["local model here"]))
    data: dict[str, object] = {
        "default_model": "local/llama",
        "providers": {"local": wire.provider(server.base_url, None)},
    }
    provider = build_providers(parse_config(data, tmp_path))["local"]
    response = await provider.complete(call_input(), "llama", lambda _: None)
    assert response.message.text() == "local model here"
    assert "authorization" not in server.requests[0].headers


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ({"kind": "anthropic"}, "providers.p.anthropic.api_key_env: Field required"),
        ({"kind": "openai", "base_url": "api.openai.com"}, "base_url must start with http"),
        ({"kind": "openai", "api_key": "sk-literal"}, "api_key: Extra inputs are not permitted"),
        ({"kind": "openai", "timeout_seconds": 0}, "timeout_seconds"),
        ({"kind": "openai", "models": {"m": {"max_tokens": 0}}}, "max_tokens"),
    ],
)
def test_invalid_provider_entries_are_clear_errors(
    tmp_path: Path, entry: dict[str, Any], message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_config({"default_model": "p/m", "providers": {"p": entry}}, tmp_path)


async def test_the_guard_refuses_every_host_but_loopback(
    loopback_only: list[str], tmp_path: Path, key: str
) -> None:
    with pytest.raises(NetworkGuardError):
        socket.create_connection(("192.0.2.1", 443), timeout=1)
    # a provider left at its default base URL would go to the internet: it is refused
    data: dict[str, object] = {
        "default_model": "p/m",
        "providers": {"p": {"kind": "openai", "api_key_env": KEY_ENV}},
    }
    provider = build_providers(parse_config(data, tmp_path))["p"]
    with pytest.raises(ProviderError, match=r"api\.openai\.com"):
        await provider.complete(call_input(), "m", lambda _: None)
    assert any("192.0.2.1" in r for r in loopback_only) and any("api.openai.com" in r for r in loopback_only)
    loopback_only.clear()  # refused as it should be; any other test doing this fails


# --- through AgentRun on the real Temporal dev server -----------------------------------


@pytest.mark.parametrize("wire", WIRES)
async def test_a_full_run_reads_a_file_exports_and_answers(
    wire: Wire, client: Client, server: WireServer, tmp_path: Path, key: str
) -> None:
    server.queue(
        wire.stream(
            text=["I will read it."], calls=[Call("t1", "read", {"file_path": "evidence.txt"})], usage=(20, 7)
        ),
        wire.stream(text=["The evidence ", "says: 42."], usage=(40, 9)),
    )
    ws = workspace_with(tmp_path, {"evidence.txt": "the answer is 42\n"})
    async with running_worker(client, AgentActivities(http_config(wire, server, tmp_path))) as queue:
        handle = await start(client, queue, ws, "What does the evidence say?")
        result = await asyncio.wait_for(handle.result(), 20)
        history = await handle.fetch_history()
    assert result.status == "completed", result.error
    assert result.text == "The evidence says: 42."
    assert result.tool_calls_count == 1 and [e.turn for e in result.exports] == [1]
    assert (result.usage.prompt_tokens, result.usage.completion_tokens, result.usage.total_tokens) == (
        60,
        16,
        76,
    )
    assert len(list((tmp_path / "exports").rglob("*.json"))) == 1
    first, second = server.requests
    assert wire.key_sent(first) == wire.key_sent(second) == key
    assert first.body["model"] == second.body["model"] == MODEL
    assert wire.tool_names(first) == [
        "read",
        "todo_write",
    ]  # todo_write touches nothing: offered unless denied
    sent = json.dumps(wire.messages(second))
    assert "What does the evidence say?" in sent and "the answer is 42" in sent and "t1" in sent
    # the credential stays on the worker: not in the history, not in the export
    dumped = history.to_json()
    assert SECRET not in dumped and KEY_ENV not in dumped
    assert all(SECRET not in p.read_text() for p in (tmp_path / "exports").rglob("*.json"))


@pytest.mark.parametrize("wire", WIRES)
async def test_429_with_retry_after_is_retried_by_temporal_after_that_delay(
    wire: Wire, client: Client, server: WireServer, tmp_path: Path, key: str
) -> None:
    # 3 s: longer than the retry policy's own 2 s, so the gap proves Retry-After was honoured
    server.queue(wire.error(429, "slow down", {"retry-after": "3"}), wire.stream(text=["fine now"]))
    async with running_worker(client, AgentActivities(http_config(wire, server, tmp_path))) as queue:
        handle = await start(client, queue, workspace_with(tmp_path, {}), "hello")
        result = await asyncio.wait_for(handle.result(), 20)
        history = await handle.fetch_history()
    assert result.status == "completed" and result.text == "fine now"
    first, second = server.requests
    assert 2.9 <= second.at - first.at < 8
    [(attempt, last_failure)] = model_attempts(history)
    assert attempt == 2
    assert f"model {wire.kind}/{MODEL}: HTTP 429 Too Many Requests: " in last_failure
    assert "slow down" in last_failure


@pytest.mark.parametrize("wire", WIRES)
async def test_500_then_success_is_retried_by_temporal(
    wire: Wire, client: Client, server: WireServer, tmp_path: Path, key: str
) -> None:
    server.queue(
        Reply(500, {"content-type": "text/plain"}, body=b"upstream fell over"), wire.stream(text=["ok"])
    )
    async with running_worker(client, AgentActivities(http_config(wire, server, tmp_path))) as queue:
        handle = await start(client, queue, workspace_with(tmp_path, {}), "hello")
        result = await asyncio.wait_for(handle.result(), 20)
        history = await handle.fetch_history()
    assert result.status == "completed" and result.text == "ok"
    assert len(server.requests) == 2
    [(attempt, last_failure)] = model_attempts(history)
    assert attempt == 2 and "HTTP 500 Internal Server Error: upstream fell over" in last_failure


@pytest.mark.parametrize("wire", WIRES)
async def test_401_fails_the_run_at_once_with_one_request_and_without_the_key(
    wire: Wire, client: Client, server: WireServer, tmp_path: Path, key: str
) -> None:
    # the server quotes the refused key back, as some do: it must not reach the history
    server.queue(wire.error(401, f"invalid x-api-key {key}"), wire.stream(text=["never"]))
    async with running_worker(client, AgentActivities(http_config(wire, server, tmp_path))) as queue:
        handle = await start(client, queue, workspace_with(tmp_path, {}), "hello")
        result = await asyncio.wait_for(handle.result(), 15)
        history = await handle.fetch_history()
    assert result.status == "failed"
    assert result.error == (
        f"model call failed: model {wire.kind}/{MODEL}: HTTP 401 Unauthorized (not retried): "
        "invalid_request_error: invalid x-api-key ***"
    )
    assert len(server.requests) == 1
    assert [a for a, _ in model_attempts(history)] == [1]
    assert SECRET not in history.to_json()


@pytest.mark.parametrize("wire", WIRES)
async def test_a_malformed_body_fails_the_run_at_once(
    wire: Wire, client: Client, server: WireServer, tmp_path: Path, key: str
) -> None:
    server.queue(Reply.sse([sse("data that is not JSON")]), wire.stream(text=["never"]))
    async with running_worker(client, AgentActivities(http_config(wire, server, tmp_path))) as queue:
        handle = await start(client, queue, workspace_with(tmp_path, {}), "hello")
        result = await asyncio.wait_for(handle.result(), 15)
    assert result.status == "failed"
    assert (
        result.error is not None and f"model {wire.kind}/{MODEL}: the response did not parse" in result.error
    )
    assert len(server.requests) == 1


async def _first_live_text(handle: Any) -> LiveText:
    async for item in follow_run(handle, poll_seconds=0.1):
        if isinstance(item, LiveText):
            return item
    raise AssertionError("the run ended without live text")


@pytest.mark.parametrize("wire", WIRES)
async def test_cancel_while_the_model_streams_stops_the_http_request(
    wire: Wire, client: Client, server: WireServer, tmp_path: Path, key: str
) -> None:
    server.queue(wire.stream(text=["Let me think", " about this"], stall=True))
    async with running_worker(client, AgentActivities(http_config(wire, server, tmp_path))) as queue:
        handle = await start(client, queue, workspace_with(tmp_path, {}), "think forever")
        [request] = await server.wait_for_requests(1)
        # a follower sees the text while the model is still answering
        live = await asyncio.wait_for(_first_live_text(handle), 10)
        assert (live.attempt, live.text) == (1, "Let me think about this")
        await handle.signal("cancel", "enough")
        result = await asyncio.wait_for(run_result(client, handle.id), 15)
    assert result.status == "cancelled" and result.error == "enough"
    await asyncio.wait_for(request.closed.wait(), 5)
    assert not request.complete and len(server.requests) == 1
