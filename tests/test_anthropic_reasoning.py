"""The ``anthropic`` provider with today's models: extended thinking kept across tool
calls, prompt caching and images.

Request bodies are checked as built; the stream, the fallback and full runs through
``AgentRun`` on the Temporal dev server go over real HTTP to ``AnthropicThinking``
(tests/wire_anthropic.py), a local server that signs its thinking and refuses what
Anthropic's API refuses, with its own 400 bodies.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import httpx
import pytest
from temporalio.client import Client

from durable_agent.activities import AgentActivities
from durable_agent.activities.providers import ModelProvider, ProviderError, build_providers
from durable_agent.activities.providers.anthropic_wire import (
    DEFAULT_THINKING_BUDGET,
    EPHEMERAL,
    add_cache_breakpoints,
    request_body,
)
from durable_agent.config import AnthropicProviderConfig, parse_config
from durable_agent.core.activity_api import ModelCallInput
from durable_agent.core.builtin_catalog import BUILTIN_TOOLS
from durable_agent.core.models import (
    ImageBlock,
    Message,
    RedactedThinkingBlock,
    TextBlock,
    ThinkingBlock,
    ToolResultBlock,
    ToolUseBlock,
)
from tests.helpers import final, running_worker, scripted_config, start, workspace_with
from tests.wire_anthropic import MISSING_THINKING, AnthropicThinking, Step, sent_thinking
from tests.wire_cache import CacheUsage
from tests.wire_servers import AnthropicWire, Call, Reply, WireServer, sse

KEY_ENV = "AGENT_ANTHROPIC_REASONING_KEY"
MODEL = "test-model"
BUDGET = 2048


@pytest.fixture(autouse=True)
def key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(KEY_ENV, "sk-ant-reasoning-test")


def call_input(*messages: Message, system: str = "Be brief.") -> ModelCallInput:
    return ModelCallInput(
        run_id="run-1",
        model=f"p/{MODEL}",
        system_prompt=system,
        messages=messages,
        tools=tuple(BUILTIN_TOOLS[name].offer().definition for name in ("read", "grep")),
    )


def settings(**fields: Any) -> Any:
    return AnthropicProviderConfig(kind="anthropic", api_key_env=KEY_ENV, **fields).settings_for(MODEL)


def user(*blocks: Any) -> Message:
    return Message(role="user", content=blocks)


def assistant(*blocks: Any) -> Message:
    return Message(role="assistant", content=blocks)


def signed(text: str, signature: str = "sig-1") -> ThinkingBlock:
    return ThinkingBlock(thinking=text, signature=signature, wire="anthropic")


PROMPT = user(TextBlock(text="Read a.txt"))
READ_A = ToolUseBlock(id="t1", name="read", input={"file_path": "a.txt"})
RESULT_A = ToolResultBlock(tool_use_id="t1", content="alpha")


def cache_marks(body: dict[str, Any]) -> list[str]:
    """Where a body's ``cache_control`` breakpoints are, as readable paths."""
    marks = [f"tools.{i}" for i, t in enumerate(body.get("tools") or []) if "cache_control" in t]
    system = body.get("system")
    if isinstance(system, list):
        marks += [f"system.{i}" for i, b in enumerate(system) if "cache_control" in b]
    for i, message in enumerate(body["messages"]):
        marks += [f"messages.{i}.{j}" for j, b in enumerate(message["content"]) if "cache_control" in b]
    return marks


# --- the request -------------------------------------------------------------------------


def test_a_thinking_budget_enables_thinking_grows_max_tokens_and_drops_temperature() -> None:
    body = request_body(
        call_input(PROMPT), MODEL, settings(thinking_budget_tokens=BUDGET, max_tokens=1000, temperature=0.5)
    )
    assert body["thinking"] == {"type": "enabled", "budget_tokens": BUDGET}
    assert body["max_tokens"] == 1000 + BUDGET
    assert "temperature" not in body


def test_reasoning_without_a_budget_thinks_with_the_default_budget() -> None:
    body = request_body(call_input(PROMPT), MODEL, settings(reasoning=True))
    assert body["thinking"] == {"type": "enabled", "budget_tokens": DEFAULT_THINKING_BUDGET}
    assert body["max_tokens"] == 4096 + DEFAULT_THINKING_BUDGET


def test_without_reasoning_no_thinking_is_asked_for_and_temperature_goes() -> None:
    body = request_body(call_input(PROMPT), MODEL, settings(max_tokens=1000, temperature=0.5))
    assert "thinking" not in body
    assert (body["max_tokens"], body["temperature"]) == (1000, 0.5)


def test_signed_thinking_goes_back_verbatim_and_first_and_foreign_or_unsigned_thinking_does_not() -> None:
    older = assistant(
        ThinkingBlock(thinking="chat reasoning", wire="openai-chat"),
        ThinkingBlock(thinking="redacted ****", wire="anthropic"),  # its signature dropped
        TextBlock(text="Let me look."),
        ToolUseBlock(id="t0", name="grep", input={"file_path": "x"}),
    )
    newest = assistant(
        signed("I should read a.txt."),
        RedactedThinkingBlock(data="opaque-data=="),
        TextBlock(text="Reading."),
        READ_A,
    )
    messages = (
        PROMPT,
        older,
        user(ToolResultBlock(tool_use_id="t0", content="none")),
        newest,
        user(RESULT_A),
    )
    body = request_body(
        call_input(*messages), MODEL, settings(thinking_budget_tokens=BUDGET, prompt_cache=False)
    )
    assert body["thinking"]["budget_tokens"] == BUDGET
    assert body["messages"][1]["content"] == [
        {"type": "text", "text": "Let me look."},
        {"type": "tool_use", "id": "t0", "name": "grep", "input": {"file_path": "x"}},
    ]
    assert body["messages"][3]["content"] == [
        {"type": "thinking", "thinking": "I should read a.txt.", "signature": "sig-1"},
        {"type": "redacted_thinking", "data": "opaque-data=="},
        {"type": "text", "text": "Reading."},
        {"type": "tool_use", "id": "t1", "name": "read", "input": {"file_path": "a.txt"}},
    ]


@pytest.mark.parametrize(
    "turn",
    [
        pytest.param(assistant(TextBlock(text="Reading."), READ_A), id="no-thinking"),
        pytest.param(
            assistant(ThinkingBlock(thinking="[REDACTED]", wire="anthropic"), READ_A), id="unsigned"
        ),
        pytest.param(
            assistant(signed("plan", "sig").model_copy(update={"wire": "openai-chat"}), READ_A), id="foreign"
        ),
    ],
)
def test_a_tool_turn_without_its_signed_thinking_is_continued_without_thinking(turn: Message) -> None:
    body = request_body(
        call_input(PROMPT, turn, user(RESULT_A)),
        MODEL,
        settings(thinking_budget_tokens=BUDGET, temperature=0.3),
    )
    assert "thinking" not in body
    assert body["max_tokens"] == 4096
    assert "temperature" not in body  # the run's sampling stays what thinking gave it


def test_a_new_turn_thinks_again_after_a_tool_turn_without_thinking() -> None:
    messages = (
        PROMPT,
        assistant(TextBlock(text="Reading."), READ_A),
        user(RESULT_A),
        assistant(TextBlock(text="It says alpha.")),
        user(TextBlock(text="And b.txt?")),
    )
    body = request_body(call_input(*messages), MODEL, settings(thinking_budget_tokens=BUDGET))
    assert body["thinking"] == {"type": "enabled", "budget_tokens": BUDGET}


def test_cache_breakpoints_on_the_last_tool_the_system_prompt_and_the_two_newest_user_turns() -> None:
    messages = (
        PROMPT,
        assistant(signed("plan"), READ_A),
        user(RESULT_A),
        assistant(signed("next"), TextBlock(text="And b."), ToolUseBlock(id="t2", name="read", input={})),
        user(ToolResultBlock(tool_use_id="t2", content="beta"), TextBlock(text="steer: hurry")),
    )
    body = request_body(call_input(*messages), MODEL, settings(thinking_budget_tokens=BUDGET))
    assert body["system"] == [{"type": "text", "text": "Be brief.", "cache_control": EPHEMERAL}]
    assert cache_marks(body) == ["tools.1", "system.0", "messages.2.0", "messages.4.1"]
    # the rest of the request is as without caching
    plain = request_body(
        call_input(*messages), MODEL, settings(thinking_budget_tokens=BUDGET, prompt_cache=False)
    )
    assert cache_marks(plain) == [] and plain["system"] == "Be brief."
    for message in body["messages"]:
        for block in message["content"]:
            block.pop("cache_control", None)
    assert body["messages"] == plain["messages"]


def test_a_breakpoint_never_lands_on_thinking_or_empty_text() -> None:
    body: dict[str, Any] = {
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "go"}, {"type": "text", "text": ""}]},
            {
                "role": "assistant",
                "content": [
                    {"type": "text", "text": "so"},
                    {"type": "thinking", "thinking": "t", "signature": "s"},
                    {"type": "redacted_thinking", "data": "d"},
                ],
            },
        ]
    }
    add_cache_breakpoints(body)
    assert cache_marks(body) == ["messages.0.0", "messages.1.0"]


def test_a_tool_results_images_follow_its_text_as_base64_image_blocks() -> None:
    png = ImageBlock(media_type="image/png", data="iVBORw0KGgo=", digest="sha256:aa", size=8)
    jpeg = ImageBlock(media_type="image/jpeg", data="/9j/4AAQ", digest="sha256:bb", size=6)
    messages = (
        PROMPT,
        assistant(READ_A, ToolUseBlock(id="t2", name="read", input={})),
        user(
            ToolResultBlock(tool_use_id="t1", content="a.png: 8 bytes", images=(png, jpeg)),
            ToolResultBlock(tool_use_id="t2", content="", images=(jpeg,)),
        ),
    )
    body = request_body(call_input(*messages), MODEL, settings(prompt_cache=False))
    first, second = body["messages"][2]["content"]
    assert first["content"] == [
        {"type": "text", "text": "a.png: 8 bytes"},
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}},
        {"type": "image", "source": {"type": "base64", "media_type": "image/jpeg", "data": "/9j/4AAQ"}},
    ]
    assert second["content"] == [
        {"type": "image", "source": {"type": "base64", "media_type": "image/jpeg", "data": "/9j/4AAQ"}}
    ]
    unfilled = user(ToolResultBlock(tool_use_id="t1", content="x", images=(png.reference(),)))
    with pytest.raises(ProviderError, match="without its data") as raised:
        request_body(call_input(PROMPT, assistant(READ_A), unfilled), MODEL, settings())
    assert not raised.value.retryable


# --- the stream --------------------------------------------------------------------------


def provider_for(server: WireServer, tmp_path: Path, **extra: Any) -> ModelProvider:
    entry = AnthropicWire().provider(server.base_url, KEY_ENV, **extra)
    data: dict[str, object] = {"default_model": f"p/{MODEL}", "providers": {"p": entry}}
    return build_providers(parse_config(data, tmp_path))["p"]


async def test_thinking_split_across_deltas_its_signature_and_redacted_thinking_are_kept_in_order(
    tmp_path: Path,
) -> None:
    model = AnthropicThinking([], piece=3)
    step = Step(
        thinking="The file is named a.txt; reading it first.",
        redacted=True,
        text="Reading it now.",
        calls=[Call("t1", "read", {"file_path": "a.txt"})],
    )
    async with WireServer() as server:
        server.queue(model.stream(step, CacheUsage(read=0, written=0, uncached=10), thinking=True))
        shown: list[str] = []
        response = await provider_for(server, tmp_path, thinking_budget_tokens=BUDGET).complete(
            call_input(PROMPT), MODEL, shown.append
        )
    thinking, redacted, text, use = response.message.content
    assert thinking == ThinkingBlock(
        thinking=step.thinking, signature=model.sign(step.thinking), wire="anthropic"
    )
    assert isinstance(redacted, RedactedThinkingBlock) and redacted.data
    assert text == TextBlock(text="Reading it now.")
    assert use == ToolUseBlock(id="t1", name="read", input={"file_path": "a.txt"})
    assert "".join(shown) == "Reading it now."  # the thinking is not the answer
    assert response.message.thinking() == step.thinking
    [request] = server.requests
    assert request.body["thinking"] == {"type": "enabled", "budget_tokens": BUDGET}


async def test_a_thinking_delta_for_a_text_block_is_a_malformed_stream(tmp_path: Path) -> None:
    start = {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}
    wrong = {"type": "content_block_delta", "index": 0, "delta": {"type": "thinking_delta", "thinking": "x"}}
    async with WireServer() as server:
        server.queue(Reply.sse([sse({"type": "message_start", "message": {}}), sse(start), sse(wrong)]))
        with pytest.raises(ProviderError, match="thinking_delta came for a text block") as raised:
            await provider_for(server, tmp_path).complete(call_input(PROMPT), MODEL, lambda _: None)
    assert not raised.value.retryable


# --- the wire server refuses what Anthropic refuses ----------------------------------------


async def test_the_server_refuses_a_tool_turn_without_thinking_and_modified_or_forged_signatures() -> None:
    model = AnthropicThinking([Step(text="fine")])
    base = {
        "model": MODEL,
        "max_tokens": 4096 + BUDGET,
        "thinking": {"type": "enabled", "budget_tokens": BUDGET},
    }
    tool_use = {"type": "tool_use", "id": "t1", "name": "read", "input": {}}
    result = {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "alpha"}]}
    prompt = {"role": "user", "content": "read a.txt"}

    def turn(*first: dict[str, Any]) -> dict[str, Any]:
        return {**base, "messages": [prompt, {"role": "assistant", "content": [*first, tool_use]}, result]}

    real = {"type": "thinking", "thinking": "plan", "signature": model.sign("plan")}
    async with WireServer(respond=model) as server, httpx.AsyncClient(base_url=server.base_url) as http:
        missing = await http.post("/v1/messages", json=turn())
        modified = await http.post("/v1/messages", json=turn({**real, "thinking": "plan, edited"}))
        forged = await http.post("/v1/messages", json=turn({**real, "signature": "Zm9yZ2Vk"}))
        with_temperature = await http.post("/v1/messages", json={**turn(real), "temperature": 0.5})
        accepted = await http.post("/v1/messages", json=turn(real))
    assert missing.status_code == 400
    assert missing.json() == {
        "type": "error",
        "error": {
            "type": "invalid_request_error",
            "message": MISSING_THINKING.format(index=1, found="tool_use"),
        },
    }
    assert "Expected `thinking` or `redacted_thinking`, but found `tool_use`" in missing.text
    for refused in (modified, forged):
        assert refused.status_code == 400
        assert (
            refused.json()["error"]["message"]
            == "messages.1.content.0: Invalid `signature` in `thinking` block"
        )
    assert with_temperature.status_code == 400
    assert accepted.status_code == 200 and "fine" in accepted.text
    assert len(model.accepted) == 1 and len(model.refusals) == 4


# --- the fallback ------------------------------------------------------------------------


async def test_a_tool_turn_without_signed_thinking_is_sent_without_thinking_and_accepted(
    tmp_path: Path,
) -> None:
    # As a resume from an export made before thinking was kept: the tool turn has none.
    conversation = (PROMPT, assistant(TextBlock(text="Reading."), READ_A), user(RESULT_A))
    model = AnthropicThinking(
        [Step(text="It says alpha."), Step(thinking="b.txt next.", text="b says beta.")]
    )
    async with WireServer(respond=model) as server:
        provider = provider_for(server, tmp_path, thinking_budget_tokens=BUDGET)
        answer = await provider.complete(call_input(*conversation), MODEL, lambda _: None)
        # the next turn thinks again
        follow_up = (*conversation, answer.message, user(TextBlock(text="And b.txt?")))
        again = await provider.complete(call_input(*follow_up), MODEL, lambda _: None)
        # the same first request with thinking on is what the API refuses
        async with httpx.AsyncClient(base_url=server.base_url) as http:
            forced = {**server.requests[0].body, "thinking": {"type": "enabled", "budget_tokens": BUDGET}}
            forced["max_tokens"] += BUDGET
            refused = await http.post("/v1/messages", json=forced)
    first, second, _ = server.requests
    assert "thinking" not in first.body and first.body["max_tokens"] == 4096
    assert answer.message.content == (TextBlock(text="It says alpha."),)
    assert second.body["thinking"] == {"type": "enabled", "budget_tokens": BUDGET}
    assert again.message.thinking() == "b.txt next." and again.message.text() == "b says beta."
    assert [a.thinking for a in model.accepted] == [False, True]
    assert refused.status_code == 400
    assert refused.json()["error"]["message"] == MISSING_THINKING.format(index=1, found="text")


# --- through AgentRun on the Temporal dev server -------------------------------------------


def run_config(server: WireServer, tmp_path: Path, **extra: Any) -> Any:
    entry = AnthropicWire().provider(server.base_url, KEY_ENV, **extra)
    return scripted_config(
        tmp_path, [final()], default_model=f"anthropic/{MODEL}", providers={"anthropic": entry}
    )


def reads(*names: str) -> list[Step]:
    """A step per file, each reading it after thinking about it, then the answer."""
    steps = [
        Step(
            thinking=f"Next I need {name}; the read tool gives it.",
            redacted=i == 1,
            text=f"Reading {name}." if i == 0 else "",
            calls=[Call(f"t{i}", "read", {"file_path": name})],
        )
        for i, name in enumerate(names)
    ]
    return [*steps, Step(thinking="Every file is read; time to answer.", text="All files are read.")]


async def test_a_tool_using_run_with_thinking_completes_passing_its_signed_thinking_back(
    client: Client, tmp_path: Path
) -> None:
    names = ["a.txt", "b.txt", "c.txt"]
    model = AnthropicThinking(reads(*names))
    ws = workspace_with(tmp_path, {name: f"contents of {name}\n" for name in names})
    async with WireServer(respond=model) as server:
        config = run_config(server, tmp_path, thinking_budget_tokens=BUDGET)
        async with running_worker(client, AgentActivities(config)) as queue:
            handle = await start(client, queue, ws, "Read a, b and c.")
            result = await asyncio.wait_for(handle.result(), 30)
    assert result.status == "completed", result.error
    assert result.text == "All files are read."
    assert result.tool_calls_count == 3
    assert model.refusals == []
    assert len(server.requests) == 4
    assert all(r.body["thinking"] == {"type": "enabled", "budget_tokens": BUDGET} for r in server.requests)
    # each request carried every earlier step's thinking, signed, first in its message
    for n, request in enumerate(server.requests):
        passed = sent_thinking(request)
        assert len(passed) == n
        for step, blocks in zip(model.steps, passed, strict=False):
            assert blocks[0] == {
                "type": "thinking",
                "thinking": step.thinking,
                "signature": model.sign(step.thinking),
            }
            assert [b["type"] for b in blocks[1:]] == (["redacted_thinking"] if step.redacted else [])
        for message in request.body["messages"]:
            if message["role"] == "assistant":
                assert message["content"][0]["type"] == "thinking"
    assert "time to answer" not in result.text


async def test_prompt_caching_reads_on_later_requests_and_the_run_totals_add_up(
    client: Client, tmp_path: Path
) -> None:
    names = ["big-1.txt", "big-2.txt", "big-3.txt"]
    # files large enough that a turn's prefix is past the 1,024-token minimum of the cache
    files = {
        name: "".join(f"{name} {i:03d}: lorem ipsum dolor sit amet\n" for i in range(120)) for name in names
    }
    model = AnthropicThinking(reads(*names))
    async with WireServer(respond=model) as server:
        config = run_config(server, tmp_path, thinking_budget_tokens=BUDGET)
        async with running_worker(client, AgentActivities(config)) as queue:
            handle = await start(client, queue, workspace_with(tmp_path, files), "Read the big files.")
            result = await asyncio.wait_for(handle.result(), 30)
    assert result.status == "completed", result.error
    assert model.refusals == [] and len(model.accepted) == 4
    assert all(len(cache_marks(r.body)) <= 4 for r in server.requests)
    reads_seen = [a.usage.read for a in model.accepted]
    assert reads_seen[0] == 0 and all(read > 0 for read in reads_seen[2:]), reads_seen
    # the rolling breakpoint: a request reads the whole prompt of the one before it, once
    # that one was past the cache's minimum (the first two are not)
    totals = [a.usage.total for a in model.accepted]
    assert reads_seen[2:] == totals[1:3], (reads_seen, totals)
    usage = result.usage
    assert usage.cache_read_tokens == sum(reads_seen) > 0
    assert usage.cache_write_tokens == sum(a.usage.written for a in model.accepted) > 0
    assert usage.prompt_tokens == sum(a.usage.total for a in model.accepted)
    assert usage.completion_tokens == sum(a.output_tokens for a in model.accepted)
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens
