"""A model answer of any size either completes or fails the run at once, billed once."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from temporalio.client import Client

from durable_agent.activities import AgentActivities
from durable_agent.activities.model_call import MODEL_ANSWER_MAX_BYTES
from durable_agent.activities.providers import build_providers
from durable_agent.core.events import ToolEndEvent
from tests.helpers import (
    RecordingProvider,
    RecordingSink,
    final,
    running_worker,
    scripted_config,
    start,
    tool_call,
)


def workspace(tmp: Path) -> Path:
    ws = tmp / "ws"
    ws.mkdir()
    (ws / "a.txt").write_text("alpha\n")
    return ws


async def run(
    client: Client, tmp: Path, script: list[dict[str, Any]]
) -> tuple[Any, RecordingProvider, RecordingSink]:
    config = scripted_config(tmp, script, permissions={"allow": ["read", "write"], "default": "deny"})
    provider = RecordingProvider(build_providers(config)["scripted"])
    sink = RecordingSink()
    activities = AgentActivities(config, providers={"scripted": provider}, sinks={"local": sink})
    async with running_worker(client, activities) as queue:
        handle = await start(client, queue, workspace(tmp))
        result = await asyncio.wait_for(handle.result(), 60)
    return result, provider, sink


async def test_a_final_answer_near_the_limit_completes(client: Client, tmp_path: Path) -> None:
    text = "x" * (MODEL_ANSWER_MAX_BYTES - 200)
    result, provider, _ = await run(client, tmp_path, [{"text": text}])
    assert (result.status, result.text == text, provider.calls) == ("completed", True, 1)


async def test_a_long_answer_with_a_tool_call_completes(client: Client, tmp_path: Path) -> None:
    content = "y" * (MODEL_ANSWER_MAX_BYTES - 50_000)
    script = [tool_call("w1", "write", file_path="big.txt", content=content), final("done")]
    result, provider, sink = await run(client, tmp_path, script)
    assert (result.status, result.text, provider.calls) == ("completed", "done", 2)
    events = [r.event for r in sink.exports[-1].open().source_run().events]
    [end] = [e for e in events if isinstance(e, ToolEndEvent)]
    assert not end.is_error and f"({len(content)} bytes written)" in end.output


@pytest.mark.parametrize("size", [MODEL_ANSWER_MAX_BYTES + 1000, 3_000_000])
async def test_an_answer_over_the_limit_fails_the_run_at_once(
    client: Client, tmp_path: Path, size: int
) -> None:
    result, provider, _ = await run(client, tmp_path, [{"text": "z" * size}])
    assert result.status == "failed"
    assert provider.calls == 1  # a deterministic failure: never retried, never billed twice
    assert result.error is not None and "over the 983040 bytes one step can keep" in result.error
    assert f"the model's answer is {size + 58} bytes" in result.error


async def test_an_oversized_tool_call_answer_fails_with_an_error_event(
    client: Client, tmp_path: Path
) -> None:
    script = [tool_call("w1", "write", file_path="big.txt", content="q" * 2_000_000), final()]
    result, provider, _ = await run(client, tmp_path, script)
    assert (result.status, provider.calls, result.tool_calls_count) == ("failed", 1, 0)
    assert not (tmp_path / "ws" / "big.txt").exists()
    assert result.error is not None and "one step can keep" in result.error
