"""Issue 38: a reasoning model's thinking streams live (apart from its answer), its reasoning
tokens are recorded, and gpt-oss's ``reasoning_text`` on vLLM's Responses endpoint is read and
sent back.

Each provider is tested over real HTTP against a local server that speaks its wire
(``tests.wire_reasoning_streams``); the live view goes through ``AgentRun`` on the Temporal dev
server and is read as a follower reads it, from the model call's heartbeats (``follow_run``).
"""

from __future__ import annotations

import asyncio
import io
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import pytest
from temporalio.client import Client

from durable_agent.activities import AgentActivities
from durable_agent.activities.model_call import LIVE_TEXT_MAX_CHARS, LIVE_THINKING_MAX_CHARS, ModelCalls
from durable_agent.activities.providers import LiveParts, build_providers
from durable_agent.activities.redact import Redactor
from durable_agent.cli.render import EventPrinter, usage_line
from durable_agent.client import follow_run, run_result
from durable_agent.config import parse_config
from durable_agent.core.activity_api import ModelCallInput
from durable_agent.core.events import EventRecord, TextDeltaEvent, ThinkingEvent
from durable_agent.core.metrics import MODEL_TOKENS
from durable_agent.core.models import LiveText, Message, TextBlock, ThinkingBlock, TokenUsage
from durable_agent.telemetry import AgentMetrics, metrics_runtime
from tests.helpers import final, running_worker, scripted_config, start, workspace_with
from tests.test_http_providers import KEY_ENV, READ_TOOL, loopback_only  # noqa: F401  (the guard is autouse)
from tests.test_telemetry import Scrape, free_port
from tests.wire_reasoning_streams import (
    Turn,
    VllmGptOss,
    anthropic_stream,
    chat_stream,
    responses_stream,
)
from tests.wire_servers import Call, Reply, WireServer

SECRET = "sk-live-thinking-test-never-shown-7c1e"
MODEL = "test-model"


@pytest.fixture
def key(monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv(KEY_ENV, SECRET)
    return SECRET


@pytest.fixture
async def server() -> Any:
    async with WireServer() as s:
        yield s


def entry(kind: str, base_url: str) -> dict[str, Any]:
    """A provider entry of ``kind`` (``anthropic``, ``chat``, ``responses``) on ``base_url``."""
    if kind == "anthropic":
        return {"kind": "anthropic", "base_url": base_url, "api_key_env": KEY_ENV}
    found: dict[str, Any] = {"kind": "openai", "base_url": base_url, "api_key_env": KEY_ENV}
    return found | ({"api": "responses"} if kind == "responses" else {})


def call_input(*messages: Message) -> ModelCallInput:
    messages = messages or (Message(role="user", content=(TextBlock(text="hello"),)),)
    return ModelCallInput(
        run_id="run-1", model=f"p/{MODEL}", system_prompt="Be brief.", messages=messages, tools=(READ_TOOL,)
    )


async def complete(
    kind: str, server: WireServer, tmp_path: Path, *messages: Message
) -> tuple[Any, LiveParts]:
    data: dict[str, object] = {
        "default_model": f"p/{MODEL}",
        "providers": {"p": entry(kind, server.base_url)},
    }
    provider = build_providers(parse_config(data, tmp_path))["p"]
    parts = LiveParts()
    return await provider.complete(call_input(*messages), MODEL, parts), parts


THOUGHT = ["First I ", "look at ", "the file."]

# (provider kind, a reply that thinks the pieces given then answers, the step's reasoning tokens)
Stream = Callable[[list[str], list[str], bool], Reply]
STREAMS: list[Any] = [
    pytest.param("anthropic", lambda t, a, stall: anthropic_stream([t], a, stall=stall), 0, id="anthropic"),
    pytest.param("chat", lambda t, a, stall: chat_stream(t, a, stall=stall), 21, id="chat"),
    pytest.param(
        "chat", lambda t, a, stall: chat_stream(t, a, field="reasoning", stall=stall), 21, id="chat-reasoning"
    ),
    pytest.param(
        "responses",
        lambda t, a, stall: responses_stream(t, a, summary=True, stall=stall),
        17,
        id="responses-summary",
    ),
    pytest.param(
        "responses",
        lambda t, a, stall: responses_stream(t, a, summary=False, stall=stall),
        17,
        id="responses-reasoning-text",
    ),
]


# --- the providers, called directly -----------------------------------------------------


@pytest.mark.parametrize(("kind", "stream", "reasoning_tokens"), STREAMS)
async def test_each_provider_streams_its_thinking_apart_and_records_reasoning_tokens(
    kind: str,
    stream: Stream,
    reasoning_tokens: int,
    server: WireServer,
    tmp_path: Path,
    key: str,
) -> None:
    server.queue(stream(THOUGHT, ["Do", "ne."], False))
    response, parts = await complete(kind, server, tmp_path)
    assert parts.thought and "".join(parts.thought) == "First I look at the file."
    assert "".join(parts.text) == "Done."  # the thinking never reaches the answer's sink
    assert response.message.thinking() == "First I look at the file."
    assert response.message.text() == "Done."
    # Anthropic reports no reasoning tokens apart: its thinking is among output_tokens
    assert response.usage.reasoning_tokens == reasoning_tokens


async def test_a_plain_text_sink_never_gets_the_thinking(
    server: WireServer, tmp_path: Path, key: str
) -> None:
    # a host's own caller that hands ``complete`` a plain function gets the answer only
    server.queue(chat_stream(THOUGHT, ["Done."]))
    data: dict[str, object] = {
        "default_model": f"p/{MODEL}",
        "providers": {"p": entry("chat", server.base_url)},
    }
    provider = build_providers(parse_config(data, tmp_path))["p"]
    text: list[str] = []
    await provider.complete(call_input(), MODEL, text.append)
    assert text == ["Done."]


async def test_anthropic_thinking_blocks_stream_as_paragraphs(
    server: WireServer, tmp_path: Path, key: str
) -> None:
    server.queue(anthropic_stream([["one", " two"], ["three"]], ["ok"]))
    response, parts = await complete("anthropic", server, tmp_path)
    assert "".join(parts.thought) == response.message.thinking() == "one two\n\nthree"


async def test_gpt_oss_on_vllm_reasoning_text_is_read_and_sent_back_as_its_content(
    server: WireServer, tmp_path: Path, key: str
) -> None:
    server.queue(responses_stream(["I should ", "read it."], ["Reading."], summary=False))
    response, _ = await complete("responses", server, tmp_path)
    [block] = [b for b in response.message.content if isinstance(b, ThinkingBlock)]
    assert block == ThinkingBlock(
        thinking="I should read it.", id="rs_1", wire="openai-responses", reasoning_text=True
    )
    server.queue(responses_stream(["ok"], ["Done."], summary=False))
    later = Message(role="user", content=(TextBlock(text="go on"),))
    await complete("responses", server, tmp_path, call_input().messages[0], response.message, later)
    # no ``reasoning`` setting asked for: the server gave the text, so it goes back, as content
    [item] = [i for i in server.requests[1].body["input"] if i.get("type") == "reasoning"]
    assert item == {
        "type": "reasoning",
        "id": "rs_1",
        "summary": [],
        "content": [{"type": "reasoning_text", "text": "I should read it."}],
    }


def test_a_block_without_reasoning_text_keeps_its_bytes() -> None:
    # recorded histories and exports hold thinking blocks and usages written before the fields
    block = ThinkingBlock(thinking="t", signature="s", id="rs_1", wire="openai-responses")
    assert block.model_dump_json() == (
        '{"type":"thinking","thinking":"t","signature":"s","id":"rs_1","wire":"openai-responses"}'
    )
    usage = TokenUsage(prompt_tokens=3, completion_tokens=2, total_tokens=5)
    assert json.loads(usage.model_dump_json()) == {
        "prompt_tokens": 3,
        "completion_tokens": 2,
        "total_tokens": 5,
        "cache_read_tokens": 0,
        "cache_write_tokens": 0,
    }
    assert LiveText(attempt=1, text="hi").model_dump_json() == '{"type":"live_text","attempt":1,"text":"hi"}'


def test_reasoning_tokens_are_summed_shown_and_counted() -> None:
    a = TokenUsage(prompt_tokens=10, completion_tokens=30, total_tokens=40, reasoning_tokens=21)
    b = TokenUsage(prompt_tokens=5, completion_tokens=5, total_tokens=10)
    total = a + b
    assert total.reasoning_tokens == 21 and json.loads(total.model_dump_json())["reasoning_tokens"] == 21
    assert usage_line(total) == "50 (prompt 15, completion 35, of which reasoning 21)"
    assert usage_line(b) == "10 (prompt 5, completion 5)"


async def test_reasoning_tokens_are_a_type_of_the_tokens_metric() -> None:
    port = free_port()
    runtime = metrics_runtime(f"127.0.0.1:{port}")  # held: its endpoint lives as long as it does
    metrics = AgentMetrics(runtime.metric_meter)
    metrics.model_call("p", "m", "step", "ok", 1.0, (10, 30, 21))
    metrics.model_call("p", "m", "step", "ok", 1.0, (10, 30, 0))  # none apart: no reasoning sample
    scrape = await Scrape(port).read()
    tokens = {
        t: scrape.value(MODEL_TOKENS.name, provider="p", model="m", type=t) for t in ("input", "output")
    }
    assert tokens == {"input": 20, "output": 60}
    assert scrape.value(MODEL_TOKENS.name, provider="p", model="m", type="reasoning") == 21


# --- the heartbeat and the follower -------------------------------------------------------


def test_the_heartbeat_keeps_thinking_apart_redacted_and_bounded() -> None:
    calls = ModelCalls(
        providers={}, log_cache=cast(Any, None), store=cast(Any, None), redact=Redactor.of({KEY_ENV: SECRET})
    )
    parts = LiveParts()
    parts.thinking(f"the key is {SECRET}. ")
    parts("The answer.")
    live = calls._live(3, parts)
    assert (live.attempt, live.text) == (3, "The answer.")
    assert live.thinking.startswith("the key is ") and SECRET not in live.thinking
    parts.thinking("x" * (2 * LIVE_TEXT_MAX_CHARS))
    parts("y" * (2 * LIVE_TEXT_MAX_CHARS))
    live = calls._live(3, parts)
    assert len(live.thinking) == LIVE_THINKING_MAX_CHARS
    assert len(live.thinking) + len(live.text) == LIVE_TEXT_MAX_CHARS
    assert live.text.startswith("The answer.")


def _record(sequence: int, event: Any) -> EventRecord:
    return EventRecord(sequence=sequence, timestamp_ms=0, event=event)


def test_a_follower_prints_live_thinking_as_thinking_then_the_answer_once() -> None:
    out = io.StringIO()
    printer = EventPrinter(out)
    printer.show(LiveText(attempt=1, text="", thinking="First I"))
    printer.show(LiveText(attempt=1, text="", thinking="First I look\nat it."))
    printer.show(LiveText(attempt=1, text="The ans", thinking="First I look\nat it."))
    printer.show(_record(1, ThinkingEvent(text="First I look\nat it.")))
    printer.show(_record(2, TextDeltaEvent(text="The answer.")))
    printer.finish()
    assert out.getvalue() == "  ∴ First I look\n  ∴ at it.\n  The answer.\n"


def test_on_a_terminal_the_thinking_is_dimmed() -> None:
    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    out = Terminal()
    printer = EventPrinter(out)
    printer.show(LiveText(attempt=1, text="", thinking="hmm"))
    printer.show(_record(1, ThinkingEvent(text="hmm")))
    printer.show(_record(2, TextDeltaEvent(text="Yes.")))
    printer.finish()
    assert out.getvalue() == "  ∴ \x1b[2mhmm\x1b[0m\n  Yes.\n"


async def _live_thinking(handle: Any, expected: str) -> LiveText:
    async for item in follow_run(handle, poll_seconds=0.1):
        if isinstance(item, LiveText) and item.thinking.endswith(expected):
            return item
    raise AssertionError("the run ended without its thinking shown live")


@pytest.mark.parametrize(("kind", "stream", "reasoning_tokens"), STREAMS)
async def test_a_follower_sees_the_thinking_live_apart_from_the_answer_and_redacted(
    kind: str,
    stream: Stream,
    reasoning_tokens: int,
    client: Client,
    server: WireServer,
    tmp_path: Path,
    key: str,
) -> None:
    # the model thinks, a credential of the worker among its thoughts, then stalls before its
    # answer: the call is in flight, and only its heartbeats show the thinking
    server.queue(stream([*THOUGHT, f" The key is {SECRET}", ", so."], [], True))
    config = scripted_config(
        tmp_path, [final()], default_model=f"{kind}/{MODEL}", providers={kind: entry(kind, server.base_url)}
    )
    async with running_worker(client, AgentActivities(config)) as queue:
        handle = await start(client, queue, workspace_with(tmp_path, {}), "think")
        await server.wait_for_requests(1)
        live = await asyncio.wait_for(_live_thinking(handle, ", so."), 15)
        assert live.text == ""  # none of it is shown as the answer
        assert live.thinking.startswith("First I look at the file. The key is ")
        assert SECRET not in live.thinking
        await handle.signal("cancel", "enough")
        result = await asyncio.wait_for(run_result(client, handle.id), 15)
    assert result.status == "cancelled"


# --- gpt-oss on vLLM, a whole run ------------------------------------------------------------


async def test_a_gpt_oss_run_on_vllm_gets_its_reasoning_back_and_records_its_tokens(
    client: Client, tmp_path: Path, key: str
) -> None:
    model = VllmGptOss(
        [
            Turn(
                ["I should read ", "evidence.txt."],
                call=Call("call_1", "read", {"file_path": "evidence.txt"}),
            ),
            Turn(["It says ", "42."], text=["The evidence ", "says 42."], reasoning_tokens=5),
        ]
    )
    async with WireServer(respond=model) as server:
        config = scripted_config(
            tmp_path,
            [final()],
            default_model=f"vllm/{MODEL}",
            providers={"vllm": entry("responses", server.base_url)},
        )
        ws = workspace_with(tmp_path, {"evidence.txt": "the answer is 42\n"})
        async with running_worker(client, AgentActivities(config)) as queue:
            handle = await start(client, queue, ws, "What does the evidence say?")
            result = await asyncio.wait_for(handle.result(), 30)
    assert result.status == "completed", result.error
    assert result.text == "The evidence says 42."
    assert not model.refused
    # the second request carried the first answer's reasoning back, as its text
    assert model.read_back == [[], ["I should read evidence.txt."]]
    assert result.usage.reasoning_tokens == 14
