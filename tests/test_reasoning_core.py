"""Reasoning and cache accounting in the core: the thinking a step keeps, what redaction does
to a signed block, prices of cached tokens, and the model settings a config resolves."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from temporalio.client import Client

from durable_agent.activities import AgentActivities
from durable_agent.activities.model_call import unsigned_where_changed
from durable_agent.cli.render import EventPrinter
from durable_agent.config import ConfigError, parse_config, takes_images
from durable_agent.core.events import EventRecord, ThinkingEvent
from durable_agent.core.models import (
    Message,
    RedactedThinkingBlock,
    TextBlock,
    ThinkingBlock,
    TokenUsage,
    ToolUseBlock,
    usage_cost_usd,
)
from tests.helpers import RecordingProvider, RecordingSink, read_call, running_worker, scripted_config, start


def test_cached_tokens_are_priced_at_their_own_prices_and_as_input_without_them() -> None:
    usage = TokenUsage(
        prompt_tokens=1_000_000,
        completion_tokens=100_000,
        cache_read_tokens=800_000,
        cache_write_tokens=100_000,
    )
    # 100k plain at $3, 800k read at $0.30, 100k written at $3.75, 100k out at $15
    assert usage_cost_usd(usage, 3.0, 15.0, 0.30, 3.75) == pytest.approx(0.3 + 0.24 + 0.375 + 1.5)
    assert usage_cost_usd(usage, 3.0, 15.0) == pytest.approx(3.0 + 1.5)
    assert usage_cost_usd(usage, None, 15.0, 0.3, 3.75) is None


def test_redaction_that_changes_a_signed_thinking_block_drops_its_signature_only() -> None:
    signed = ThinkingBlock(thinking="the key is s3cret", signature="sig", wire="anthropic")
    kept = ThinkingBlock(thinking="nothing secret", signature="sig2", wire="anthropic")
    original = Message(
        role="assistant",
        content=(signed, kept, RedactedThinkingBlock(data="opaque"), ToolUseBlock(id="t", name="read")),
    )
    redacted = original.model_copy(
        update={
            "content": (
                signed.model_copy(update={"thinking": "the key is [REDACTED]"}),
                *original.content[1:],
            )
        }
    )
    out = unsigned_where_changed(original, redacted)
    first = out.content[0]
    assert isinstance(first, ThinkingBlock) and first.signature is None and "[REDACTED]" in first.thinking
    assert out.content[1:] == original.content[1:]


def test_model_settings_for_reasoning_caching_and_images_resolve_model_over_provider(tmp_path: Path) -> None:
    config = parse_config(
        {
            "default_model": "claude/big",
            "providers": {
                "claude": {
                    "kind": "anthropic",
                    "api_key_env": "K",
                    "thinking_budget_tokens": 2048,
                    "attachment": True,
                    "cache_read_usd_per_mtok": 0.3,
                    "models": {"small": {"attachment": False, "prompt_cache": False}},
                },
                "oai": {"kind": "openai", "api": "responses", "reasoning": True, "reasoning_effort": "high"},
            },
        },
        tmp_path,
    )
    claude = config.providers["claude"]
    assert not isinstance(claude, type(config.providers["oai"]))
    big, small = claude.settings_for("big"), claude.settings_for("small")  # type: ignore[union-attr]
    assert (big.thinking_budget_tokens, big.attachment, big.prompt_cache) == (2048, True, True)
    assert (small.thinking_budget_tokens, small.attachment, small.prompt_cache) == (2048, False, False)
    oai = config.providers["oai"].settings_for("gpt-5")  # type: ignore[union-attr]
    assert (oai.reasoning, oai.reasoning_effort) == (True, "high")
    assert takes_images(config, "claude/big") and not takes_images(config, "claude/small")
    assert not takes_images(config, "nowhere/x")


@pytest.mark.parametrize(
    "entry",
    [
        {"kind": "openai", "reasoning_effort": "extreme"},
        {"kind": "openai", "api": "assistants"},
        {"kind": "anthropic", "api_key_env": "K", "thinking_budget_tokens": 100},
        {"kind": "openai", "cache_read_usd_per_mtok": -1},
    ],
)
def test_invalid_reasoning_and_cache_settings_are_clear_config_errors(
    entry: dict[str, object], tmp_path: Path
) -> None:
    with pytest.raises(ConfigError):
        parse_config({"default_model": "p/m", "providers": {"p": entry}}, tmp_path)


def test_thinking_is_printed_as_thinking_not_as_the_answer() -> None:
    out = io.StringIO()
    printer = EventPrinter(out)
    printer.show(EventRecord(sequence=1, timestamp_ms=0, event=ThinkingEvent(text="first I  look\nat it")))
    printer.finish()
    assert "∴ thinking: first I look at it" in out.getvalue()


async def test_a_steps_thinking_is_kept_passed_back_and_an_event_not_the_answer(
    client: Client, tmp_path: Path
) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "a.txt").write_text("42\n")
    responses = [
        {"thinking": "I should read a.txt first.", **read_call("r1", "a.txt")},
        {"thinking": "It says 42.", "text": "The answer is 42."},
    ]
    config = scripted_config(tmp_path, responses)
    sink = RecordingSink()
    acts = AgentActivities(config, sinks={"local": sink})
    recorder = RecordingProvider(acts.providers["scripted"])
    acts.providers["scripted"] = recorder
    async with running_worker(client, acts) as queue:
        result = await (await start(client, queue, ws, "what is in a.txt?")).result()
    assert result.status == "completed", result.error
    assert result.text == "The answer is 42."
    # the second request carries the first step's thinking, first in its message
    [step] = [m for m in recorder.seen[1] if m.role == "assistant"]
    assert step.content[0] == ThinkingBlock(thinking="I should read a.txt first.")
    events = sink.exports[-1].open().source_run().events
    assert [r.event.text for r in events if isinstance(r.event, ThinkingEvent)] == [
        "I should read a.txt first."
    ]
    assert all(
        "I should read" not in b.text for m in recorder.seen[1] for b in m.content if isinstance(b, TextBlock)
    )
