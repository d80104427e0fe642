"""Test parts: scripted configs, in-process workers and sinks the way hosts write them."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from temporalio.client import Client, WorkflowHandle

from activities import AgentActivities
from activities.providers import ModelProvider, TextSink
from activities.sinks import SinkError
from durable_agent.checkpoint import SessionCheckpointExportV1
from durable_agent.client import start_run
from durable_agent.config import AgentConfig, parse_config
from durable_agent.models import Message, ModelResponse
from durable_agent.run_io import AgentRunInput, AgentRunResult, ModelCallInput, RunStatusView
from worker import build_worker


def tool_call(call_id: str, name: str, **args: Any) -> dict[str, Any]:
    return {"tool_calls": [{"id": call_id, "name": name, "input": args}]}


def read_call(call_id: str, file_path: str) -> dict[str, Any]:
    return tool_call(call_id, "read", file_path=file_path)


def final(text: str = "boundary export complete") -> dict[str, Any]:
    return {"text": text}


def scripted_config(
    tmp: Path, responses: list[dict[str, Any]], *, api_key_env: str | None = None, **extra: Any
) -> AgentConfig:
    """A config whose ``scripted/static`` model answers with ``responses`` in order."""
    script = tmp / f"script-{uuid.uuid4().hex[:8]}.json"
    script.write_text(json.dumps({"responses": responses}))
    provider: dict[str, Any] = {"kind": "scripted", "script": str(script)}
    if api_key_env:
        provider["api_key_env"] = api_key_env
    data: dict[str, Any] = {
        "default_model": "scripted/static",
        "providers": {"scripted": provider},
        "store": {"path": str(tmp / "store")},
        "sinks": {"local": {"kind": "filesystem", "path": str(tmp / "exports")}},
        "permissions": {"allow": ["read(*)"], "default": "deny"},
        "timeouts": {"heartbeat_seconds": 2},
    }
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(data.get(key), dict):
            data[key] = {**data[key], **value}
        else:
            data[key] = value
    return parse_config(data, tmp)


def read_cap_text() -> str:
    """About 100 KB of text: what one ``read`` returns at most (a 2.5 MB conversation is 25 reads)."""
    return "".join(f"{i:06d} {'lorem ipsum dolor sit amet ' * 3}\n" for i in range(1200))


def workspace_with(tmp: Path, files: dict[str, str]) -> Path:
    ws = tmp / "workspace"
    for name, text in files.items():
        (ws / name).parent.mkdir(parents=True, exist_ok=True)
        (ws / name).write_text(text)
    ws.mkdir(exist_ok=True)
    return ws


class RecordingSink:
    """Keeps every export it is handed; optionally fails each one, non-retryably."""

    def __init__(self, *, fail: bool = False) -> None:
        self.exports: list[SessionCheckpointExportV1] = []
        self.fail = fail

    async def deliver(self, export: SessionCheckpointExportV1) -> None:
        self.exports.append(export)
        if self.fail:
            raise SinkError("deterministic export failure", retryable=False)


class BlockingSink:
    """Holds each export until the test releases it."""

    def __init__(self) -> None:
        self.exports: list[SessionCheckpointExportV1] = []
        self.entered = asyncio.Semaphore(0)
        self.release = asyncio.Semaphore(0)

    async def deliver(self, export: SessionCheckpointExportV1) -> None:
        self.exports.append(export)
        self.entered.release()
        await self.release.acquire()


@asynccontextmanager
async def running_worker(client: Client, activities: AgentActivities) -> AsyncIterator[str]:
    """An in-process worker on a fresh task queue; yields the queue's name."""
    queue = f"test-{uuid.uuid4().hex[:10]}"
    async with build_worker(client, activities, queue):
        yield queue


async def start(
    client: Client, queue: str, workspace: Path, prompt: str = "read the evidence", **fields: Any
) -> WorkflowHandle[Any, AgentRunResult]:
    run = AgentRunInput(prompt=prompt, workspace=str(workspace), **fields)
    return await start_run(client, run, queue=queue)


class RecordingProvider:
    """Wraps a provider; keeps the conversation of every model call that reaches it."""

    def __init__(self, inner: ModelProvider) -> None:
        self.inner = inner
        self.seen: list[tuple[Message, ...]] = []

    @property
    def calls(self) -> int:
        return len(self.seen)

    async def complete(self, call: ModelCallInput, model: str, on_text: TextSink) -> ModelResponse:
        self.seen.append(call.messages)
        return await self.inner.complete(call, model, on_text)


async def awaiting_approval(
    handle: WorkflowHandle[Any, AgentRunResult], timeout: float = 20
) -> RunStatusView:
    """The run's status once a call waits for approval (or when ``timeout`` is up)."""
    deadline = time.monotonic() + timeout
    while True:
        status = await handle.query("status", result_type=RunStatusView)
        if status.pending_approvals or time.monotonic() > deadline:
            return status
        await asyncio.sleep(0.1)
