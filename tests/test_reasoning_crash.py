"""kill -9 of a worker process in the middle of a reasoning model's run, and a resume from one of
its exports: the reasoning the model must have back survives both.

A DeepSeek-style server (``DeepSeekReader``) refuses, with a 400, a conversation whose
``reasoning_content`` it gave came back missing or changed; the Anthropic server
(``AnthropicThinking``) refuses thinking whose signature does not match its text, and a
tool-use turn whose thinking was dropped; the Responses API server (``ResponsesModel``)
refuses a function call passed back without its reasoning item, or with its encrypted
content changed. Each runs in the test process; the worker is a real
``python worker.py`` (``tests/test_crash_recovery.py``), killed with SIGKILL while a model
call streams, after the run's second export. The second worker process must finish the run
with no request refused, every boundary exported once, and a run resumed from one of the
exports must go on the same way.
"""

from __future__ import annotations

import asyncio
import base64
import json
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from temporalio.client import Client

from durable_agent.activities import AgentActivities
from durable_agent.activities.sinks import read_export_file
from durable_agent.client import resume_run, start_run
from durable_agent.config import load_config
from durable_agent.core.activity_api import MODEL_CALL
from durable_agent.core.models import Message, RedactedThinkingBlock, ThinkingBlock
from durable_agent.core.run_api import AgentRunInput, AgentRunResult
from tests.helpers import running_worker
from tests.test_crash_recovery import (
    N_CALLS,
    RESULT_TIMEOUT,
    check_recovered_run,
    export_files,
    pending_activity,
    retried_attempts,
    until_alive,
    workers,
)
from tests.test_http_providers import loopback_only  # noqa: F401  (the network guard, in-process)
from tests.wire_anthropic import AnthropicThinking, Step, sent_thinking
from tests.wire_openai_reasoning import DeepSeekReader, sent_reasoning
from tests.wire_responses import ResponsesModel, model_turns, provider_entry
from tests.wire_responses import Step as ResponsesStep
from tests.wire_servers import Call, Received, Reply, WireServer

KEY_ENV = "AGENT_REASONING_CRASH_KEY"
MODEL = "test-model"
BUDGET = 2048
CHUNK_DELAY = 0.04  # seconds between a streamed answer's chunks: a step takes about a second
TINY_PNG = bytes.fromhex(
    "89504e470d0a1a0a0000000d4948445200000001000000010806000000"
    "1f15c4890000000d49444154789c6360f8cfc0f01f0005000201e5273e1e0000000049454e44ae426082"
)
TINY_B64 = base64.b64encode(TINY_PNG).decode()
# what the run reads, one file a step; the Anthropic run's second is an image, read before the kill
TEXT_FILES = [f"file{i}.txt" for i in range(1, N_CALLS + 1)]
IMAGE_FILES = [TEXT_FILES[0], "plot.png", *TEXT_FILES[2:]]


@pytest.fixture(autouse=True)
def key(monkeypatch: pytest.MonkeyPatch) -> None:
    # set before the worker processes are started: they are given this process's environment
    monkeypatch.setenv(KEY_ENV, "sk-reasoning-crash")


def slowed(respond: Callable[[Received], Reply]) -> Callable[[Received], Reply]:
    """``respond`` with its streamed answers slowed down, so that a kill lands inside one."""

    def answer(request: Received) -> Reply:
        reply = respond(request)
        if reply.chunks:
            reply.delay = CHUNK_DELAY
        return reply

    return answer


def tool_results(request: Received) -> int:
    """How many tool results the request's conversation holds: the run's progress."""
    return sum(
        1
        for m in request.body.get("messages") or []
        for b in (m.get("content") if isinstance(m.get("content"), list) else [])
        if isinstance(b, dict) and b.get("type") == "tool_result"
    )


@dataclass
class ThinkingReader(AnthropicThinking):
    """``AnthropicThinking`` that answers by the run's progress (its step is the number of tool
    results in the request), not in arrival order: a call retried after the kill gets the step
    it asked for the first time, as a model would give an equivalent answer."""

    def __call__(self, request: Received) -> Reply:
        step = self.steps[min(tool_results(request), len(self.steps) - 1)]
        self._script = deque([step])
        return super().__call__(request)


def thinking_steps() -> list[Step]:
    steps = [
        Step(
            thinking=f"Step {i}: {name} is next; the read tool gives it.",
            redacted=i == 1,
            calls=[Call(f"t{i}", "read", {"file_path": name})],
        )
        for i, name in enumerate(IMAGE_FILES)
    ]
    return [*steps, Step(thinking="Every file is read; time to answer.", text="All files are read.")]


# --- set-up -------------------------------------------------------------------


def write_setup(tmp: Path, provider: dict[str, Any]) -> tuple[Path, Path, Path]:
    """The workspace, and a worker config whose default model is ``provider``'s; (config,
    workspace, sink root)."""
    workspace = tmp / "workspace"
    workspace.mkdir()
    for i, name in enumerate(TEXT_FILES, 1):
        (workspace / name).write_text(f"evidence {i}\n" + "line\n" * i)
    (workspace / "plot.png").write_bytes(TINY_PNG)
    sink_root = tmp / "exports"
    entry = "\n".join(f"{k} = {json.dumps(v)}" for k, v in provider.items())
    config = tmp / "worker.toml"
    config.write_text(
        f"""
default_model = "{provider["kind"]}/{MODEL}"
default_sink = "local"
default_workspace = {json.dumps(str(workspace))}

[providers.{provider["kind"]}]
{entry}

[store]
kind = "filesystem"
path = {json.dumps(str(tmp / "store"))}

[sinks.local]
kind = "filesystem"
path = {json.dumps(str(sink_root))}

[permissions]
allow = ["read(*)"]
default = "deny"

[timeouts]
heartbeat_seconds = 2
"""
    )
    return config, workspace, sink_root


async def crash_mid_run(client: Client, tmp: Path, config: Path, server: WireServer) -> AgentRunResult:
    """Run on a worker process, kill it while a model call streams after the second export, and
    let a second process finish the run; its result."""
    sink_root = tmp / "exports"
    with workers(client, config, tmp) as procs:
        first = procs.start()
        run = AgentRunInput(prompt="Read every file, then say you did.", workspace=str(tmp / "workspace"))
        handle = await start_run(client, run, queue=procs.queue)

        async def model_call_streaming_after_two_exports() -> bool:
            if len(export_files(sink_root)) < 2:
                return False
            pending = await pending_activity(handle, MODEL_CALL.name)
            # the call has reached the server: its answer is on its way when the worker dies
            return pending is not None and pending[1] and not server.requests[-1].complete

        await until_alive(
            "a model call streaming after two exports", model_call_streaming_after_two_exports, 60, procs
        )
        procs.kill(first)
        before = len(server.requests)
        assert len(export_files(sink_root)) < N_CALLS, "the run finished before the kill: no crash tested"
        second = procs.start()
        result = await check_recovered_run(handle, sink_root, (first.pid, second.pid))
    assert len(server.requests) > before, "the second worker asked the model nothing"
    # the call cut short by the kill was made again, by the second worker
    assert max(await retried_attempts(handle, MODEL_CALL.name)) >= 2
    return result


def third_export(sink_root: Path) -> Path:
    [path] = [p for p in export_files(sink_root) if p.name.startswith("turn-000003-")]
    return path


async def resume_in_process(client: Client, config: Path, export: Path, workspace: Path) -> AgentRunResult:
    """A run resumed from ``export`` on a worker in this process, with the same config; its result."""
    async with running_worker(client, AgentActivities(load_config(config))) as queue:
        handle = await resume_run(client, read_export_file(export), queue=queue, workspace=str(workspace))
        return await asyncio.wait_for(handle.result(), RESULT_TIMEOUT)


def sent_images(request: Received) -> list[str]:
    """The base64 data of each image in the request's tool results."""
    return [
        part["source"]["data"]
        for m in request.body["messages"]
        if isinstance(m["content"], list)
        for b in m["content"]
        if b.get("type") == "tool_result" and isinstance(b["content"], list)
        for part in b["content"]
        if part.get("type") == "image"
    ]


def thinking_of(messages: tuple[Message, ...]) -> list[list[dict[str, Any]]]:
    """Each assistant message's reasoning blocks, as the Messages API takes them back."""
    out = []
    for m in messages:
        if m.role != "assistant":
            continue
        blocks: list[dict[str, Any]] = []
        for b in m.content:
            if isinstance(b, ThinkingBlock):
                blocks.append({"type": "thinking", "thinking": b.thinking, "signature": b.signature})
            elif isinstance(b, RedactedThinkingBlock):
                blocks.append({"type": "redacted_thinking", "data": b.data})
        out.append(blocks)
    return out


# --- DeepSeek-style reasoning_content ---------------------------------------------------------


async def test_kill_9_mid_run_on_a_deepseek_style_server_then_a_resume_pass_reasoning_back(
    client: Client, tmp_path: Path
) -> None:
    reader = DeepSeekReader(TEXT_FILES)
    async with WireServer(respond=slowed(reader)) as server:
        provider = {"kind": "openai", "base_url": server.base_url, "api_key_env": KEY_ENV}
        config, workspace, sink_root = write_setup(tmp_path, provider)
        result = await crash_mid_run(client, tmp_path, config, server)
        assert result.text == reader.answer
        assert reader.refused == [], "a request dropped or changed reasoning the server gave (400)"
        # every request, before and after the kill, brought each earlier answer's reasoning back
        given = list(reader.reasoning_given.values())
        for request in server.requests:
            sent = sent_reasoning(request)
            assert sent == given[: len(sent)], sent

        export = third_export(sink_root)
        exported = read_export_file(export).open().logical_resume.messages
        served = len(server.requests)
        resumed = await resume_in_process(client, config, export, workspace)
        assert resumed.status == "completed", resumed.error
        assert resumed.text == reader.answer and resumed.tool_calls_count == N_CALLS - 3
        assert reader.refused == []
        first = server.requests[served]
        expected = [m.thinking() for m in exported if m.role == "assistant"]
        assert sent_reasoning(first) == expected and all(expected)


# --- Anthropic signed thinking ------------------------------------------------------------------


async def test_kill_9_mid_run_with_anthropic_thinking_then_a_resume_send_it_back_signed(
    client: Client, tmp_path: Path
) -> None:
    model = ThinkingReader(thinking_steps())
    async with WireServer(respond=slowed(model)) as server:
        provider = {
            "kind": "anthropic",
            "base_url": server.base_url,
            "api_key_env": KEY_ENV,
            "thinking_budget_tokens": BUDGET,
            "attachment": True,
        }
        config, workspace, sink_root = write_setup(tmp_path, provider)
        result = await crash_mid_run(client, tmp_path, config, server)
        assert result.text == "All files are read."
        assert model.refusals == [], model.refusals
        assert all(
            r.body.get("thinking") == {"type": "enabled", "budget_tokens": BUDGET} for r in server.requests
        )
        # each request carried every earlier step's thinking, signed, first in its message, and
        # the image read before the kill: the second worker found it in the store
        for request in server.requests:
            for blocks in sent_thinking(request):
                assert blocks and blocks[0]["type"] == "thinking"
                assert blocks[0]["signature"] == model.sign(blocks[0]["thinking"])
            assert sent_images(request) == ([TINY_B64] if tool_results(request) >= 2 else [])

        export = third_export(sink_root)
        exported = read_export_file(export).open().logical_resume.messages
        assert [i.data for m in exported for i in m.images()] == [TINY_B64]  # whole, in the export
        served = len(server.requests)
        resumed = await resume_in_process(client, config, export, workspace)
        assert resumed.status == "completed", resumed.error
        assert resumed.text == "All files are read." and resumed.tool_calls_count == N_CALLS - 3
        assert model.refusals == []
        first = server.requests[served]
        assert sent_thinking(first) == thinking_of(exported)  # signatures and redacted data exact
        assert all(sent_images(r) == [TINY_B64] for r in server.requests[served:])


# --- OpenAI Responses API: encrypted reasoning items ---------------------------------------------


def reasoning_items(request: Received) -> list[dict[str, Any]]:
    return [i for i in request.body["input"] if i.get("type") == "reasoning"]


async def test_kill_9_mid_run_on_the_responses_api_then_a_resume_pass_encrypted_reasoning_back(
    client: Client, tmp_path: Path
) -> None:
    steps = [
        ResponsesStep(
            summary=[f"Step {i}: {name} is next."], calls=[Call(f"c{i}", "read", {"file_path": name})]
        )
        for i, name in enumerate(TEXT_FILES)
    ]
    model = ResponsesModel(
        [*steps, ResponsesStep(summary=["Every file is read."], text=["All files are read."])]
    )
    async with WireServer(respond=slowed(model)) as server:
        provider = provider_entry(server.base_url, KEY_ENV, reasoning=True)
        config, workspace, sink_root = write_setup(tmp_path, provider)
        result = await crash_mid_run(client, tmp_path, config, server)
        assert result.text == "All files are read."
        assert model.refused == [], model.refused
        # each request, before and after the kill, passed every earlier turn's reasoning item back,
        # its encrypted content as the server sealed it
        for request in server.requests:
            items = reasoning_items(request)
            assert len(items) == model_turns(request.body["input"]) and all(model.verified(i) for i in items)

        export = third_export(sink_root)
        exported = read_export_file(export).open().logical_resume.messages
        served = len(server.requests)
        resumed = await resume_in_process(client, config, export, workspace)
        assert resumed.status == "completed", resumed.error
        assert resumed.text == "All files are read." and resumed.tool_calls_count == N_CALLS - 3
        assert model.refused == []
        sent = [(i["id"], i["encrypted_content"]) for i in reasoning_items(server.requests[served])]
        kept = [(b.id, b.signature) for m in exported for b in m.content if isinstance(b, ThinkingBlock)]
        assert sent == kept and kept
