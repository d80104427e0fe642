"""The ``openai`` kind with today's models: reasoning kept across tool calls, prompt caching, images.

Stream parsing and request bodies are checked against a local server, the
provider called directly; the tool-using runs go through ``AgentRun`` on the
real Temporal dev server against ``DeepSeekReader``, which refuses, as
DeepSeek does, a conversation that drops the reasoning it sent.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
from pathlib import Path
from typing import Any

import pytest
from temporalio.client import Client

from durable_agent.activities import AgentActivities
from durable_agent.activities.providers.openai import request_body
from durable_agent.config import OpenAIProviderConfig, parse_config
from durable_agent.core.activity_api import ModelCallInput
from durable_agent.core.models import (
    ImageBlock,
    Message,
    TextBlock,
    ThinkingBlock,
    ToolResultBlock,
    ToolUseBlock,
)
from tests.helpers import running_worker, start, workspace_with
from tests.test_http_providers import (  # the network guard applies here too
    KEY_ENV,
    MODEL,
    call_input,
    http_config,
    loopback_only,  # noqa: F401
    provider_for,
)
from tests.wire_openai_reasoning import (
    REASONING_MISSING,
    DeepSeekReader,
    reasoning_stream,
    sent_reasoning,
)
from tests.wire_servers import Call, OpenAIWire, Received, Reply, WireServer, sse

WIRE = OpenAIWire()


@pytest.fixture
async def server() -> Any:
    async with WireServer() as s:
        yield s


@pytest.fixture(autouse=True)
def key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(KEY_ENV, "sk-reasoning-test")


def user(text: str) -> Message:
    return Message(role="user", content=(TextBlock(text=text),))


def body_for(call: ModelCallInput, tmp_path: Path, **settings: Any) -> dict[str, Any]:
    """The request ``call`` makes to a provider configured with ``settings``."""
    config = parse_config(
        {
            "default_model": f"p/{MODEL}",
            "providers": {"p": WIRE.provider("http://127.0.0.1:1", None, **settings)},
        },
        tmp_path,
    )
    provider = config.providers["p"]
    assert isinstance(provider, OpenAIProviderConfig)
    return request_body(call, MODEL, provider.settings_for(MODEL))


# --- reading reasoning from the stream ------------------------------------------------


async def test_reasoning_split_across_deltas_is_one_thinking_block_first_and_never_live_text(
    server: WireServer, tmp_path: Path
) -> None:
    call = Call("c1", "read", {"file_path": "a.txt"})
    server.queue(reasoning_stream(["The user ", "wants a.txt", "; ", "read it."], ["Reading."], [call]))
    live: list[str] = []
    response = await provider_for(WIRE, server, tmp_path).complete(call_input(), MODEL, live.append)
    assert response.message.content == (
        ThinkingBlock(thinking="The user wants a.txt; read it.", wire="openai-chat"),
        TextBlock(text="Reading."),
        ToolUseBlock(id="c1", name="read", input={"file_path": "a.txt"}),
    )
    assert live == ["Reading."]
    assert response.stop_reason == "tool_use"


def _chunks(*deltas: dict[str, Any]) -> Reply:
    events = [sse({"choices": [{"index": 0, "delta": d, "finish_reason": None}]}) for d in deltas]
    events.append(sse({"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}))
    return Reply.sse([*events, sse("[DONE]")])


OTHER_SERVERS = [
    pytest.param(
        _chunks({"reasoning": "Think"}, {"reasoning": "ing."}, {"content": "Done."}),
        id="openrouter-reasoning",
    ),
    pytest.param(
        # OpenRouter sends the same text twice, as a string and as details: once is kept
        _chunks(
            {"reasoning": "Think", "reasoning_details": [{"type": "reasoning.text", "text": "Think"}]},
            {"reasoning": "ing.", "reasoning_details": [{"type": "reasoning.text", "text": "ing."}]},
            {"content": "Done."},
        ),
        id="openrouter-both",
    ),
    pytest.param(
        _chunks(
            {"reasoning_details": [{"type": "reasoning.summary", "summary": "Think"}]},
            {
                "reasoning_details": [
                    {"type": "reasoning.text", "text": "ing."},
                    {"type": "reasoning.encrypted"},
                ]
            },
            {"content": "Done."},
        ),
        id="openrouter-details",
    ),
    pytest.param(
        # vLLM, renaming its field, sends it under both names
        _chunks(
            {"reasoning": "Think", "reasoning_content": "Think"},
            {"reasoning": "ing.", "reasoning_content": "ing."},
            {"content": "Done.", "reasoning": None, "reasoning_content": None},
        ),
        id="vllm-both-names",
    ),
]


@pytest.mark.parametrize("reply", OTHER_SERVERS)
async def test_reasoning_under_each_servers_name_is_read_once(
    reply: Reply, server: WireServer, tmp_path: Path
) -> None:
    server.queue(reply)
    live: list[str] = []
    response = await provider_for(WIRE, server, tmp_path).complete(call_input(), MODEL, live.append)
    assert response.message.content == (
        ThinkingBlock(thinking="Thinking.", wire="openai-chat"),
        TextBlock(text="Done."),
    )
    assert live == ["Done."] and response.stop_reason == "end_turn"


async def test_an_answer_of_reasoning_alone_still_has_its_text_block(
    server: WireServer, tmp_path: Path
) -> None:
    server.queue(reasoning_stream(["Nothing to say."]))
    response = await provider_for(WIRE, server, tmp_path).complete(call_input(), MODEL, lambda _: None)
    assert response.message.content == (
        ThinkingBlock(thinking="Nothing to say.", wire="openai-chat"),
        TextBlock(text=""),
    )


async def test_cached_tokens_are_read_from_openai_details_or_deepseek_hits(
    server: WireServer, tmp_path: Path
) -> None:
    both = {"prompt_tokens": 900, "completion_tokens": 9, "prompt_tokens_details": {"cached_tokens": 512}}
    deepseek = {"prompt_tokens": 900, "completion_tokens": 9, "prompt_cache_hit_tokens": 640}
    server.queue(
        reasoning_stream(["a"], ["b"], usage={**both, "prompt_cache_hit_tokens": 1}),
        reasoning_stream(["a"], ["b"], usage=deepseek),
    )
    provider = provider_for(WIRE, server, tmp_path)
    first = await provider.complete(call_input(), MODEL, lambda _: None)
    second = await provider.complete(call_input(), MODEL, lambda _: None)
    assert (first.usage.cache_read_tokens, first.usage.total_tokens) == (512, 909)
    assert (second.usage.cache_read_tokens, second.usage.prompt_tokens) == (640, 900)


# --- the request body -------------------------------------------------------------------


def _step(call_id: str, thinking: str | None, wire: Any = "openai-chat") -> tuple[Message, Message]:
    """An assistant step (with thinking, if any) that read a file, and its result."""
    blocks: list[Any] = [ThinkingBlock(thinking=thinking, wire=wire)] if thinking is not None else []
    blocks.append(ToolUseBlock(id=call_id, name="read", input={"file_path": f"{call_id}.txt"}))
    result = Message(role="user", content=(ToolResultBlock(tool_use_id=call_id, content="text"),))
    return Message(role="assistant", content=tuple(blocks)), result


CONVERSATION = (
    user("Read the files."),
    *_step("r1", "First I read r1."),
    *_step("r2", None),  # a step of a model that did not reason
    *_step("r3", "Claude's view.", wire="anthropic"),  # the session changed model
    *_step("r4", ""),
    *_step("r5", "Then r5.\nLast."),
    Message(
        role="assistant", content=(ThinkingBlock(thinking="Done.", wire="openai-chat"), TextBlock(text="ok"))
    ),
    user("Thanks."),
)


def _reasoning_sent(body: dict[str, Any]) -> list[str | None]:
    return [m.get("reasoning_content") for m in body["messages"] if m["role"] == "assistant"]


async def test_reasoning_content_goes_back_on_each_assistant_message_that_had_it(
    server: WireServer, tmp_path: Path
) -> None:
    server.queue(WIRE.stream(text=["fine"]))
    await provider_for(WIRE, server, tmp_path).complete(call_input(*CONVERSATION), MODEL, lambda _: None)
    [request] = server.requests
    assert sent_reasoning(request) == ["First I read r1.", None, None, None, "Then r5.\nLast.", "Done."]
    assistant = [m for m in request.body["messages"] if m["role"] == "assistant"]
    assert assistant[0] == {
        "role": "assistant",
        "content": None,
        "reasoning_content": "First I read r1.",
        "tool_calls": [
            {
                "id": "r1",
                "type": "function",
                "function": {"name": "read", "arguments": '{"file_path": "r1.txt"}'},
            }
        ],
    }
    assert assistant[-1] == {"role": "assistant", "content": "ok", "reasoning_content": "Done."}
    # nothing else is added by default: a strict compatible server sees only what it knows
    assert set(request.body) == {"model", "messages", "stream", "stream_options", "tools"}


def test_with_reasoning_on_the_thinking_of_other_wires_goes_back_too(tmp_path: Path) -> None:
    body = body_for(call_input(*CONVERSATION), tmp_path, models={MODEL: {"reasoning": True}})
    assert _reasoning_sent(body) == [
        "First I read r1.",
        None,
        "Claude's view.",
        None,
        "Then r5.\nLast.",
        "Done.",
    ]


def test_reasoning_effort_is_sent_when_set(tmp_path: Path) -> None:
    assert "reasoning_effort" not in body_for(call_input(), tmp_path)
    assert body_for(call_input(), tmp_path, reasoning_effort="high")["reasoning_effort"] == "high"
    own = body_for(
        call_input(), tmp_path, reasoning_effort="high", models={MODEL: {"reasoning_effort": "minimal"}}
    )
    assert own["reasoning_effort"] == "minimal"


def _in_session(session_id: str | None) -> ModelCallInput:
    return call_input().model_copy(update={"session_id": session_id})


def test_prompt_cache_key_is_the_session_unless_prompt_cache_is_off(tmp_path: Path) -> None:
    assert body_for(_in_session("sess-42"), tmp_path)["prompt_cache_key"] == "sess-42"
    assert "prompt_cache_key" not in body_for(_in_session(None), tmp_path)
    assert "prompt_cache_key" not in body_for(_in_session("sess-42"), tmp_path, prompt_cache=False)
    off = body_for(_in_session("sess-42"), tmp_path, models={MODEL: {"prompt_cache": False}})
    assert "prompt_cache_key" not in off
    # OpenAI refuses a key over 64 characters: a long session id goes as a stable digest
    long_id = "s" * 200
    keys = {body_for(_in_session(long_id), tmp_path)["prompt_cache_key"] for _ in range(2)}
    [long_key] = keys
    assert len(long_key) <= 64 and long_key != body_for(_in_session("t" * 200), tmp_path)["prompt_cache_key"]


def _image(data: bytes, media_type: Any = "image/png") -> ImageBlock:
    b64 = base64.b64encode(data).decode()
    return ImageBlock(
        media_type=media_type, data=b64, digest=hashlib.sha256(b64.encode()).hexdigest(), size=len(data)
    )


def test_tool_images_follow_the_tool_messages_in_one_user_message(tmp_path: Path) -> None:
    png, jpeg, gif = (
        _image(b"\x89PNG..."),
        _image(b"\xff\xd8jpeg", "image/jpeg"),
        _image(b"GIF89a", "image/gif"),
    )
    calls = Message(
        role="assistant",
        content=tuple(ToolUseBlock(id=i, name="read", input={"file_path": i}) for i in ("a", "b", "c")),
    )
    results = Message(
        role="user",
        content=(
            ToolResultBlock(tool_use_id="a", content="two images", images=(png, jpeg)),
            ToolResultBlock(tool_use_id="b", content="plain text"),
            ToolResultBlock(tool_use_id="c", content="", is_error=True, images=(gif,)),
            TextBlock(text="Look at them."),
        ),
    )
    messages = body_for(call_input(user("Show me."), calls, results), tmp_path)["messages"]
    assert messages[3:] == [
        {"role": "tool", "tool_call_id": "a", "content": "two images"},
        {"role": "tool", "tool_call_id": "b", "content": "plain text"},
        {"role": "tool", "tool_call_id": "c", "content": "Error: "},
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "Images returned by tool call a:"},
                {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{png.data}"}},
                {"type": "image_url", "image_url": {"url": f"data:image/jpeg;base64,{jpeg.data}"}},
                {"type": "text", "text": "Images returned by tool call c:"},
                {"type": "image_url", "image_url": {"url": f"data:image/gif;base64,{gif.data}"}},
                {"type": "text", "text": "Look at them."},
            ],
        },
    ]
    # without images, results keep their shape: tool messages, then the text as a string
    plain = results.model_copy(
        update={"content": tuple(b.model_copy(update={"images": ()}) for b in results.content)}
    )
    messages = body_for(call_input(user("Show me."), calls, plain), tmp_path)["messages"]
    assert [m["role"] for m in messages[3:]] == ["tool", "tool", "tool", "user"]
    assert messages[-1] == {"role": "user", "content": "Look at them."}


# --- the DeepSeek-style server itself -----------------------------------------------------


def test_the_deepseek_style_server_refuses_reasoning_dropped_or_changed() -> None:
    reader = DeepSeekReader(["a.txt"])

    def ask(messages: list[dict[str, Any]]) -> Reply:
        body = {
            "model": MODEL,
            "messages": messages,
            "tools": [{"type": "function", "function": {"name": "read"}}],
        }
        return reader(Received("POST", "/chat/completions", {}, body, 0.0))

    first = [{"role": "user", "content": "read"}]
    assert ask(first).status == 200
    [given] = reader.reasoning_given.values()
    call = {"id": "read-000", "type": "function", "function": {"name": "read", "arguments": "{}"}}
    result = {"role": "tool", "tool_call_id": "read-000", "content": "alpha"}

    def step(**reasoning: str) -> list[dict[str, Any]]:
        return [*first, {"role": "assistant", "content": None, **reasoning, "tool_calls": [call]}, result]

    for bad in (step(), step(reasoning_content=given + " "), step(reasoning=given)):
        refused = ask(bad)
        assert refused.status == 400 and refused.body is not None
        assert refused.body == Reply.json(400, REASONING_MISSING).body
    assert ask(step(reasoning_content=given)).status == 200
    assert len(reader.refused) == 3


# --- through AgentRun on the real Temporal dev server --------------------------------------


async def _run(
    client: Client, reader: DeepSeekReader, tmp_path: Path, files: dict[str, str], **fields: Any
) -> Any:
    async with WireServer(respond=reader) as server:
        ws = workspace_with(tmp_path, files)
        async with running_worker(client, AgentActivities(http_config(WIRE, server, tmp_path))) as queue:
            handle = await start(client, queue, ws, "Read the files, then say you did.", **fields)
            result = await asyncio.wait_for(handle.result(), 30)
        return result, list(server.requests)


async def test_a_tool_using_run_on_a_deepseek_style_server_passes_its_reasoning_back(
    client: Client, tmp_path: Path
) -> None:
    files = {"a.txt": "alpha\n", "b.txt": "beta\n", "c.txt": "gamma\n"}
    reader = DeepSeekReader(list(files))
    result, requests = await _run(client, reader, tmp_path, files)
    # a request without the reasoning is refused (400, not retried): the run would fail there
    assert result.status == "completed", result.error
    assert reader.refused == []
    assert result.text == reader.answer and result.tool_calls_count == 3
    assert len(requests) == 4
    given = list(reader.reasoning_given.values())
    for n, request in enumerate(requests):
        assert sent_reasoning(request) == given[:n]  # every earlier step's reasoning, unchanged
    # the reasoning is never taken for the answer's text
    assert all(m["content"] is None for r in requests for m in r.body["messages"] if m["role"] == "assistant")


async def test_later_requests_of_a_run_read_the_prompt_cache_by_session(
    client: Client, tmp_path: Path
) -> None:
    # files big enough that, from the third request on, the prefix in common with the one
    # before passes the 1,024-token minimum
    files = {f"part{i}.txt": f"part {i}\n" + "lorem ipsum dolor sit amet\n" * 200 for i in range(3)}
    reader = DeepSeekReader(list(files))
    result, requests = await _run(client, reader, tmp_path, files, session_id="sess-cache-1")
    assert result.status == "completed", result.error
    assert [r.body.get("prompt_cache_key") for r in requests] == ["sess-cache-1"] * 4
    # the prefix stays the same: system prompt first, then the same tools in the same order
    assert len({str(r.body["tools"]) for r in requests}) == 1
    assert (
        len({str(r.body["messages"][0]) for r in requests}) == 1
        and requests[0].body["messages"][0]["role"] == "system"
    )
    reads = [u.read for u in reader.cache_usage]
    assert reads[0] == 0 and all(r > 0 for r in reads[2:]), reads
    assert reads == sorted(reads)  # each request reads at least what the one before it sent
    assert result.usage.cache_read_tokens == sum(reads) > 0
