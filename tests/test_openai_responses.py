"""The ``openai`` kind on the Responses API (``api = "responses"``), against a local server
that is as strict about reasoning items as OpenAI is under ``store: false``.

Request bodies are checked as built; streams are read by the provider over real
HTTP from ``tests.wire_responses``; a tool-using run goes through ``AgentRun`` on
the Temporal dev server and must pass every request's reasoning check.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from temporalio.client import Client

from durable_agent.activities import AgentActivities
from durable_agent.activities.providers import ModelProvider, ProviderError, build_providers
from durable_agent.activities.providers.openai import OpenAIProvider
from durable_agent.activities.providers.openai_responses import OpenAIResponsesProvider, request_body
from durable_agent.config import ResolvedModelSettings, parse_config
from durable_agent.core.activity_api import ModelCallInput
from durable_agent.core.models import (
    ImageBlock,
    Message,
    TextBlock,
    ThinkingBlock,
    ToolResultBlock,
    ToolUseBlock,
)
from tests.helpers import final, running_worker, scripted_config, start, workspace_with
from tests.test_http_providers import KEY_ENV, READ_TOOL, loopback_only  # noqa: F401  (the guard is autouse)
from tests.wire_responses import ResponsesModel, Step, error_reply, provider_entry
from tests.wire_servers import Call, Reply, WireServer, sse

MODEL = "gpt-test"
SECRET = "sk-responses-test-never-in-history"
WIRE = "openai-responses"

PNG = ImageBlock(media_type="image/png", data="iVBORw0KGgo=", digest="sha256:png", size=8)


@pytest.fixture
def key(monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv(KEY_ENV, SECRET)
    return SECRET


def settings(**fields: Any) -> ResolvedModelSettings:
    return ResolvedModelSettings(**{"max_tokens": None, "temperature": None, "headers": {}, **fields})


def user(text: str) -> Message:
    return Message(role="user", content=(TextBlock(text=text),))


def call_input(*messages: Message, session: str | None = "session-1") -> ModelCallInput:
    return ModelCallInput(
        run_id="run-1",
        model=f"p/{MODEL}",
        system_prompt="Be brief.",
        messages=messages or (user("hello"),),
        tools=(READ_TOOL,),
        session_id=session,
    )


def provider_for(server: WireServer, tmp_path: Path, **extra: Any) -> ModelProvider:
    data: dict[str, object] = {
        "default_model": f"p/{MODEL}",
        "providers": {"p": provider_entry(server.base_url, KEY_ENV, **extra)},
    }
    return build_providers(parse_config(data, tmp_path))["p"]


def reasoning_items(body: dict[str, Any]) -> list[dict[str, Any]]:
    return [item for item in body["input"] if item.get("type") == "reasoning"]


# --- the request ------------------------------------------------------------------------


def test_the_conversation_as_items_with_reasoning_passed_back_in_place() -> None:
    conversation = (
        user("read a and b"),
        Message(
            role="assistant",
            content=(
                ThinkingBlock(thinking="**Plan**\n\nRead both.", signature="enc-1", id="rs_1", wire=WIRE),
                TextBlock(text="Let me look."),
                ToolUseBlock(id="call_a", name="read", input={"file_path": "ä.txt"}),
                ToolUseBlock(id="call_b", name="read", input={"file_path": "b.png"}),
            ),
        ),
        Message(
            role="user",
            content=(
                ToolResultBlock(tool_use_id="call_a", content="alpha"),
                ToolResultBlock(tool_use_id="call_b", content="not found", is_error=True, images=(PNG,)),
                TextBlock(text="and be quick"),
            ),
        ),
        Message(
            role="assistant",
            content=(
                # an empty summary still goes back: the encrypted content is the reasoning
                ThinkingBlock(thinking="", signature="enc-2", id="rs_2", wire=WIRE),
                # other wires' thinking is not this wire's to pass back
                ThinkingBlock(thinking="claude's", signature="sig", wire="anthropic"),
                ThinkingBlock(thinking="deepseek's", wire="openai-chat"),
                # kept for reading, but without its encrypted content OpenAI cannot take it
                ThinkingBlock(thinking="redacted", id="rs_3", wire=WIRE),
                TextBlock(text="Done."),
            ),
        ),
        user("thanks"),
    )
    body = request_body(
        call_input(*conversation),
        MODEL,
        settings(reasoning=True, reasoning_effort="high", max_tokens=900, temperature=0.5),
    )
    assert body == {
        "model": MODEL,
        "instructions": "Be brief.",
        "input": [
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "read a and b"}]},
            {
                "type": "reasoning",
                "id": "rs_1",
                "summary": [{"type": "summary_text", "text": "**Plan**\n\nRead both."}],
                "encrypted_content": "enc-1",
            },
            {
                "type": "message",
                "role": "assistant",
                "content": [{"type": "output_text", "text": "Let me look."}],
            },
            {
                "type": "function_call",
                "call_id": "call_a",
                "name": "read",
                "arguments": '{"file_path": "ä.txt"}',
            },
            {
                "type": "function_call",
                "call_id": "call_b",
                "name": "read",
                "arguments": '{"file_path": "b.png"}',
            },
            {"type": "function_call_output", "call_id": "call_a", "output": "alpha"},
            {"type": "function_call_output", "call_id": "call_b", "output": "Error: not found"},
            {
                "type": "message",
                "role": "user",
                "content": [
                    {"type": "input_text", "text": "Images returned by tool call call_b:"},
                    {"type": "input_image", "image_url": "data:image/png;base64,iVBORw0KGgo="},
                ],
            },
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "and be quick"}]},
            {"type": "reasoning", "id": "rs_2", "summary": [], "encrypted_content": "enc-2"},
            {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Done."}]},
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "thanks"}]},
        ],
        "tools": [
            {
                "type": "function",
                "name": "read",
                "description": "Read a file.",
                "parameters": READ_TOOL.input_schema,
                "strict": False,
            }
        ],
        "stream": True,
        "store": False,
        "include": ["reasoning.encrypted_content"],
        "reasoning": {"effort": "high", "summary": "auto"},
        "max_output_tokens": 900,
        "temperature": 0.5,
        "prompt_cache_key": "session-1",
    }


def test_a_model_without_reasoning_is_asked_for_none_and_sent_none() -> None:
    answer = Message(
        role="assistant",
        content=(ThinkingBlock(thinking="t", signature="enc", id="rs_1", wire=WIRE), TextBlock(text="hi")),
    )
    body = request_body(call_input(user("a"), answer, user("b")), MODEL, settings(prompt_cache=False))
    # OpenAI refuses ``include`` of encrypted reasoning for GPT-4o and GPT-4.1
    assert "include" not in body and "reasoning" not in body and "prompt_cache_key" not in body
    assert reasoning_items(body) == []
    assert body["store"] is False and "max_output_tokens" not in body and "temperature" not in body
    # an effort alone: the reasoning is kept, but no summaries are asked for
    body = request_body(call_input(user("a"), answer, user("b")), MODEL, settings(reasoning_effort="low"))
    assert body["include"] == ["reasoning.encrypted_content"] and body["reasoning"] == {"effort": "low"}
    assert [i["id"] for i in reasoning_items(body)] == ["rs_1"]


def test_reasoning_cut_off_before_any_output_is_not_sent_alone() -> None:
    cut = Message(
        role="assistant",
        content=(ThinkingBlock(thinking="", signature="e", id="rs_9", wire=WIRE), TextBlock(text="")),
    )
    body = request_body(call_input(user("a"), cut, user("go on")), MODEL, settings(reasoning=True))
    assert [i.get("type", i.get("role")) for i in body["input"]] == ["message", "message"]


def test_a_long_session_id_is_shortened_to_a_cache_key_openai_takes() -> None:
    body = request_body(call_input(session="s" * 80), MODEL, settings())
    assert len(body["prompt_cache_key"]) <= 64 and body["prompt_cache_key"] != "s" * 64
    assert "prompt_cache_key" not in request_body(call_input(session=None), MODEL, settings())


def test_api_responses_builds_the_responses_provider(tmp_path: Path) -> None:
    data: dict[str, Any] = {
        "default_model": "a/m",
        "providers": {
            "a": {"kind": "openai", "base_url": "http://127.0.0.1:9", "api": "responses"},
            "b": {"kind": "openai", "base_url": "http://127.0.0.1:9"},
        },
    }
    providers = build_providers(parse_config(data, tmp_path))
    assert type(providers["a"]) is OpenAIResponsesProvider and type(providers["b"]) is OpenAIProvider


# --- the stream -------------------------------------------------------------------------


async def test_text_streams_as_it_comes_with_usage_and_cached_tokens(tmp_path: Path, key: str) -> None:
    model = ResponsesModel(
        [Step(text=["Hel", "lo, ", "wörld"]), Step(text=["again"])], reasoning=False, rechunk=5
    )
    async with WireServer(respond=model) as server:
        provider = provider_for(server, tmp_path)
        pieces: list[str] = []
        long_prompt = user("x" * 6000)
        first = await provider.complete(call_input(long_prompt), MODEL, pieces.append)
        second = await provider.complete(
            call_input(long_prompt, first.message, user("more")), MODEL, lambda _: None
        )
    assert pieces == ["Hel", "lo, ", "wörld"]
    assert first.message.content == (TextBlock(text="Hello, wörld"),) and first.stop_reason == "end_turn"
    one, two = model.served
    assert (first.usage.prompt_tokens, first.usage.completion_tokens) == (one.cache.total, 20)
    assert first.usage.total_tokens == one.cache.total + 20 and first.usage.cache_read_tokens == 0
    # the same key and a prefix of more than 1,024 tokens: the second prompt is read from the cache
    assert second.usage.cache_read_tokens == two.cache.read > 1024
    request = server.requests[0]
    assert (request.method, request.path) == ("POST", "/responses")
    assert request.headers["authorization"] == f"Bearer {key}"
    assert request.body["prompt_cache_key"] == "session-1" and "include" not in request.body


async def test_calls_and_reasoning_are_read_and_passed_back_as_the_server_requires(
    tmp_path: Path, key: str
) -> None:
    args = {"file_path": 'ü "quoted" \\ and\nbreak'}
    step = Step(
        summary=["**Looking**\n\nFirst a.", "Then b."],
        text=["Reading."],
        calls=[Call("call_a", "read", args, piece=1), Call("call_b", "read", {"file_path": "b"}, piece=2)],
    )
    model = ResponsesModel([step, Step(summary=["Done."], text=["All read."])])
    async with WireServer(respond=model) as server:
        provider = provider_for(server, tmp_path, reasoning=True, reasoning_effort="medium")
        shown: list[str] = []
        first = await provider.complete(call_input(user("read")), MODEL, shown.append)
        thinking, text, call_a, call_b = first.message.content
        assert isinstance(thinking, ThinkingBlock)
        assert thinking.thinking == "**Looking**\n\nFirst a.\n\nThen b."
        assert thinking.wire == WIRE and thinking.id is not None and thinking.id.startswith("rs_")
        assert thinking.signature
        assert text == TextBlock(text="Reading.")
        assert call_a == ToolUseBlock(id="call_a", name="read", input=args)
        assert call_b == ToolUseBlock(id="call_b", name="read", input={"file_path": "b"})
        assert first.stop_reason == "tool_use" and shown == ["Reading."]  # thinking is not the answer
        results = Message(
            role="user",
            content=(
                ToolResultBlock(tool_use_id="call_a", content="a"),
                ToolResultBlock(tool_use_id="call_b", content="b"),
            ),
        )
        second = await provider.complete(
            call_input(user("read"), first.message, results), MODEL, shown.append
        )
    assert model.refused == [] and second.message.text() == "All read." and second.stop_reason == "end_turn"
    assert second.message.thinking() == "Done."
    sent = server.requests[1].body
    assert sent["reasoning"] == {"effort": "medium", "summary": "auto"}
    assert [i.get("type") for i in sent["input"]] == [
        "message",
        "reasoning",
        "message",
        "function_call",
        "function_call",
        "function_call_output",
        "function_call_output",
    ]
    assert sent["input"][1]["encrypted_content"] == thinking.signature  # intact


@pytest.mark.parametrize(
    ("change", "refusal"),
    [
        pytest.param(
            lambda b: None,
            r"Item 'fc_\w+' of type 'function_call' was provided without its required "
            r"'reasoning' item: 'rs_\w+'\.",
            id="reasoning-dropped",
        ),
        pytest.param(
            lambda b: b.model_copy(update={"thinking": "a summary rewritten"}),
            r"The encrypted content for item rs_\w+ could not be verified\.",
            id="summary-changed",
        ),
        pytest.param(
            lambda b: b.model_copy(update={"signature": "Zm9yZ2Vk.Zm9yZ2Vk"}),
            r"The encrypted content for item rs_\w+ could not be verified\.",
            id="forged",
        ),
    ],
)
async def test_the_server_refuses_a_call_passed_back_without_its_reasoning_intact(
    change: Any, refusal: str, tmp_path: Path, key: str
) -> None:
    model = ResponsesModel([Step(summary=["Plan."], calls=[Call("call_a", "read", {"file_path": "a"})])] * 2)
    async with WireServer(respond=model) as server:
        provider = provider_for(server, tmp_path, reasoning=True)
        first = await provider.complete(call_input(user("read")), MODEL, lambda _: None)
        blocks = [change(b) if isinstance(b, ThinkingBlock) else b for b in first.message.content]
        answer = Message(role="assistant", content=tuple(b for b in blocks if b is not None))
        result = Message(role="user", content=(ToolResultBlock(tool_use_id="call_a", content="a"),))
        with pytest.raises(ProviderError, match=refusal) as caught:
            await provider.complete(call_input(user("read"), answer, result), MODEL, lambda _: None)
    assert not caught.value.retryable and "HTTP 400" in str(caught.value)
    assert len(model.refused) == 1


async def test_a_model_without_reasoning_refuses_a_request_for_encrypted_reasoning(
    tmp_path: Path, key: str
) -> None:
    model = ResponsesModel([Step(text=["hi"])], reasoning=False)
    async with WireServer(respond=model) as server:
        provider = provider_for(server, tmp_path, reasoning=True)
        with pytest.raises(ProviderError, match="Encrypted content is not supported with this model"):
            await provider.complete(call_input(), MODEL, lambda _: None)
        plain = await provider_for(server, tmp_path).complete(call_input(), MODEL, lambda _: None)
    assert plain.message.text() == "hi"


async def test_an_incomplete_answer_stops_at_max_tokens(tmp_path: Path, key: str) -> None:
    model = ResponsesModel(
        [Step(text=["partial"], finish="max_output_tokens"), Step(text=["hidden"], finish="content_filter")],
        reasoning=False,
    )
    async with WireServer(respond=model) as server:
        provider = provider_for(server, tmp_path, max_tokens=50)
        cut = await provider.complete(call_input(), MODEL, lambda _: None)
        answer = Message(role="assistant", content=(TextBlock(text="partial"),))
        filtered = await provider.complete(call_input(user("a"), answer, user("b")), MODEL, lambda _: None)
    assert (cut.message.text(), cut.stop_reason) == ("partial", "max_tokens")
    assert filtered.stop_reason == "content_filter"
    assert server.requests[0].body["max_output_tokens"] == 50


async def test_a_call_cut_off_by_max_output_tokens_says_to_raise_it(tmp_path: Path, key: str) -> None:
    step = Step(calls=[Call("call_a", "read", {}, raw='{"file_path": "a')], finish="max_output_tokens")
    async with WireServer(respond=ResponsesModel([step], reasoning=False)) as server:
        provider = provider_for(server, tmp_path, max_tokens=30)
        with pytest.raises(
            ProviderError, match="max_tokens=30 in the middle of a call to tool 'read'"
        ) as caught:
            await provider.complete(call_input(), MODEL, lambda _: None)
    assert not caught.value.retryable


def _events(*events: dict[str, Any]) -> Reply:
    return Reply.sse([sse({"sequence_number": n, **e}, e["type"]) for n, e in enumerate(events)])


CREATED = {"type": "response.created", "response": {"id": "resp_1", "status": "in_progress"}}


@pytest.mark.parametrize(
    ("event", "retryable", "overflow", "said"),
    [
        pytest.param(
            {
                "type": "response.failed",
                "response": {
                    "status": "failed",
                    "error": {"code": "rate_limit_exceeded", "message": "Rate limit reached for gpt-test"},
                },
            },
            True,
            False,
            "rate_limit_exceeded: Rate limit reached",
            id="failed-rate-limit",
        ),
        pytest.param(
            {"type": "response.failed", "response": {"error": {"code": "server_error", "message": "oops"}}},
            True,
            False,
            "server_error: oops",
            id="failed-server-error",
        ),
        pytest.param(
            {
                "type": "response.failed",
                "response": {"error": {"code": "invalid_image", "message": "bad png"}},
            },
            False,
            False,
            "invalid_image: bad png",
            id="failed-invalid-image",
        ),
        pytest.param(
            {
                "type": "error",
                "error": {
                    "type": "invalid_request_error",
                    "code": "context_length_exceeded",
                    "message": "Your input exceeds the context window of this model.",
                    "param": "input",
                },
            },
            False,
            True,
            "context_length_exceeded: Your input exceeds the context window",
            id="error-context-overflow",
        ),
        pytest.param(
            {"type": "error", "code": "invalid_prompt", "message": "flagged", "param": None},
            False,
            False,
            "invalid_prompt: flagged",
            id="error-invalid-prompt",
        ),
        pytest.param(
            {"type": "error", "code": None, "message": "An error occurred while processing your request."},
            True,
            False,
            "An error occurred",
            id="error-without-code",
        ),
    ],
)
async def test_failed_and_error_events_are_classified(
    event: dict[str, Any], retryable: bool, overflow: bool, said: str, tmp_path: Path, key: str
) -> None:
    async with WireServer() as server:
        server.queue(_events(CREATED, event))
        provider = provider_for(server, tmp_path)
        with pytest.raises(ProviderError) as caught:
            await provider.complete(call_input(), MODEL, lambda _: None)
    error = caught.value
    assert (error.retryable, error.context_overflow) == (retryable, overflow)
    assert f"model p/{MODEL}: error event in the response stream" in str(error) and said in str(error)


async def test_a_stream_cut_off_before_its_last_event_is_retryable(tmp_path: Path, key: str) -> None:
    model = ResponsesModel([Step(text=["cut"])], reasoning=False)
    whole = model.events(model.script[0], 0, {"model": MODEL}, model.cache.account([], None))
    async with WireServer() as server:
        server.queue(Reply.sse(whole[:-1]), Reply.sse(whole))
        provider = provider_for(server, tmp_path)
        with pytest.raises(ProviderError, match="ended before the answer was complete") as caught:
            await provider.complete(call_input(), MODEL, lambda _: None)
        assert caught.value.retryable
        again = await provider.complete(call_input(), MODEL, lambda _: None)
    assert again.message.text() == "cut"


async def test_an_answer_sent_whole_without_deltas_is_read(tmp_path: Path, key: str) -> None:
    item: dict[str, Any] = {"id": "msg_1", "type": "message", "role": "assistant"}
    item |= {"content": [{"type": "output_text", "text": "whole", "annotations": []}]}
    call = {"id": "fc_1", "type": "function_call", "call_id": "c1", "name": "read"}
    call |= {"arguments": '{"file_path": "x"}'}
    async with WireServer() as server:
        server.queue(
            _events(
                CREATED,
                {"type": "response.output_item.done", "output_index": 0, "item": item},
                {"type": "response.output_item.done", "output_index": 1, "item": call},
                {"type": "response.completed", "response": {"status": "completed", "usage": None}},
            )
        )
        shown: list[str] = []
        response = await provider_for(server, tmp_path).complete(call_input(), MODEL, shown.append)
    assert shown == ["whole"]
    assert response.message.content == (
        TextBlock(text="whole"),
        ToolUseBlock(id="c1", name="read", input={"file_path": "x"}),
    )


@pytest.mark.parametrize(
    "reply",
    [
        pytest.param(Reply.sse([sse("not json")]), id="not-json"),
        pytest.param(Reply.sse([sse({"no": "type"})]), id="no-type"),
        pytest.param(
            _events({"type": "response.output_text.delta", "output_index": 0, "delta": "x"}), id="delta-first"
        ),
        pytest.param(_events({"type": "response.completed"}), id="completed-without-response"),
    ],
)
async def test_a_malformed_stream_is_not_retried(reply: Reply, tmp_path: Path, key: str) -> None:
    async with WireServer() as server:
        server.queue(reply)
        with pytest.raises(ProviderError, match="the response did not parse") as caught:
            await provider_for(server, tmp_path).complete(call_input(), MODEL, lambda _: None)
    assert not caught.value.retryable


async def test_a_context_overflow_status_is_a_context_overflow(tmp_path: Path, key: str) -> None:
    async with WireServer() as server:
        message = (
            "Your input exceeds the context window of this model. Please adjust your input and try again."
        )
        server.queue(error_reply(400, message, code="context_length_exceeded"))
        with pytest.raises(ProviderError) as caught:
            await provider_for(server, tmp_path).complete(call_input(), MODEL, lambda _: None)
    assert caught.value.context_overflow and not caught.value.retryable


# --- through AgentRun on the real Temporal dev server -----------------------------------------


async def test_a_tool_using_run_keeps_its_reasoning_and_reads_the_cache(
    client: Client, tmp_path: Path, key: str
) -> None:
    script = [
        Step(
            summary=["**Reading a**\n\nStart with a."],
            text=["I will read a."],
            calls=[Call("call_1", "read", {"file_path": "a.txt"})],
        ),
        Step(
            summary=["Now b and c."],
            calls=[
                Call("call_2", "read", {"file_path": "b.txt"}),
                Call("call_3", "read", {"file_path": "c.txt"}),
            ],
        ),
        Step(calls=[Call("call_4", "read", {"file_path": "d.txt"})]),  # reasoning without a summary
        Step(summary=["All read."], text=["The files say ", "1 2 3 4."]),
    ]
    model = ResponsesModel(script)
    files = {f"{name}.txt": f"{n}\n" for n, name in enumerate("abcd", start=1)}
    async with WireServer(respond=model) as server:
        entry = provider_entry(server.base_url, KEY_ENV, reasoning=True, reasoning_effort="medium")
        config = scripted_config(
            tmp_path, [final()], default_model=f"responses/{MODEL}", providers={"responses": entry}
        )
        async with running_worker(client, AgentActivities(config)) as queue:
            # a prompt long enough (over 1,024 tokens) for a prefix that OpenAI caches
            prompt = "What do the files say? " + "Some background on the files. " * 200
            handle = await start(client, queue, workspace_with(tmp_path, files), prompt)
            result = await asyncio.wait_for(handle.result(), 30)
            history = await handle.fetch_history()
    assert result.status == "completed", result.error
    assert result.text == "The files say 1 2 3 4." and result.tool_calls_count == 4
    assert model.refused == [] and [s.turn for s in model.served] == [0, 1, 2, 3]
    bodies = [r.body for r in server.requests]
    assert all(b["store"] is False and b["prompt_cache_key"] == result.session_id for b in bodies)
    # every earlier answer's reasoning item goes back, in place and as the server sealed it
    for n, body in enumerate(bodies):
        sent = reasoning_items(body)
        assert len(sent) == n and all(model.verified(item) for item in sent)
    assert [i.get("type") for i in bodies[3]["input"]] == [
        "message",  # the prompt
        *("reasoning", "message", "function_call", "function_call_output"),
        *("reasoning", "function_call", "function_call", "function_call_output", "function_call_output"),
        *("reasoning", "function_call", "function_call_output"),
    ]
    assert [i["summary"] for i in reasoning_items(bodies[3])] == [
        [{"type": "summary_text", "text": "**Reading a**\n\nStart with a."}],
        [{"type": "summary_text", "text": "Now b and c."}],
        [],
    ]
    # the later requests share the first one's prefix: read from the cache, and reported
    reads = [s.cache.read for s in model.served]
    assert reads[0] == 0 and all(r > 1024 for r in reads[1:])
    assert result.usage.cache_read_tokens == sum(reads)
    assert result.usage.prompt_tokens == sum(s.cache.total for s in model.served)
    assert SECRET not in history.to_json()
