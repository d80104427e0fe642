"""Test parts: scripted configs, in-process workers and sinks the way hosts write them."""

from __future__ import annotations

import asyncio
import inspect
import json
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, TypeVar, overload

from temporalio.api.enums.v1 import EventType
from temporalio.api.history.v1 import HistoryEvent
from temporalio.client import Client, WorkflowHandle

from durable_agent.activities import AgentActivities
from durable_agent.activities.providers import ModelProvider, TextSink
from durable_agent.activities.sinks import SinkError
from durable_agent.client import start_run
from durable_agent.config import AgentConfig, parse_config
from durable_agent.core.activity_api import ModelCallInput
from durable_agent.core.export import SessionCheckpointExportV1
from durable_agent.core.models import Message, ModelResponse, ToolResultBlock
from durable_agent.core.run_api import AgentRunInput, AgentRunResult, RunStatusView
from durable_agent.worker import build_worker

T = TypeVar("T")


def tool_call(call_id: str, name: str, **args: Any) -> dict[str, Any]:
    return {"tool_calls": [{"id": call_id, "name": name, "input": args}]}


def activity_calls(events: Iterable[HistoryEvent]) -> list[tuple[str, str]]:
    """Each activity of a history in order: ``("remote", type)`` where it was scheduled, and
    ``("local", type)`` at a local activity's marker (a quick tool's call, a checkpoint)."""
    out: list[tuple[str, str]] = []
    for event in events:
        name = activity_type_of(event)
        if name:
            local = event.event_type == EventType.EVENT_TYPE_MARKER_RECORDED
            out.append(("local" if local else "remote", name))
    return out


def activity_type_of(event: HistoryEvent) -> str:
    """The activity type an event schedules (an ordinary activity) or records (a local one's
    marker); "" for any other event."""
    if event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
        return event.activity_task_scheduled_event_attributes.activity_type.name
    marker = event.marker_recorded_event_attributes
    local = marker.marker_name == "core_local_activity"
    if event.event_type == EventType.EVENT_TYPE_MARKER_RECORDED and local:
        return str(json.loads(marker.details["data"].payloads[0].data)["activity_type"])
    return ""


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
    """Wraps a provider; keeps the conversation of every model call that reaches it, and its answer.

    ``hold_first``: the first call, counted as soon as it arrives, waits to answer until the test
    sets ``released`` (a test that floods a run during a model call then does not race a delay).
    """

    def __init__(self, inner: ModelProvider, *, hold_first: bool = False) -> None:
        self.inner = inner
        self.seen: list[tuple[Message, ...]] = []
        self.answers: list[ModelResponse] = []
        self.released = asyncio.Event()
        if not hold_first:
            self.released.set()

    @property
    def calls(self) -> int:
        return len(self.seen)

    async def complete(self, call: ModelCallInput, model: str, on_text: TextSink) -> ModelResponse:
        self.seen.append(call.messages)
        if len(self.seen) == 1:
            await self.released.wait()
        answer = await self.inner.complete(call, model, on_text)
        self.answers.append(answer)
        return answer


@overload
async def until(
    what: str | Callable[[], str],
    check: Callable[[], Awaitable[T | None]],
    timeout: float = 20,
    *,
    interval: float = 0.05,
    still: Callable[[], object] | None = None,
) -> T: ...


@overload
async def until(
    what: str | Callable[[], str],
    check: Callable[[], T | None],
    timeout: float = 20,
    *,
    interval: float = 0.05,
    still: Callable[[], object] | None = None,
) -> T: ...


async def until(
    what: str | Callable[[], str],
    check: Callable[[], object],
    timeout: float = 20,
    *,
    interval: float = 0.05,
    still: Callable[[], object] | None = None,
) -> object:
    """Poll ``check`` (a plain or an async callable) until it gives something truthy; return that.

    ``what`` names what is awaited (or is called, at the timeout, to say it with what
    was last seen): after ``timeout`` seconds an ``AssertionError`` says
    ``timed out after 20 s waiting for <what>`` and shows the last value seen.
    ``still``, when given, runs before each pause and may raise to stop the wait at
    once (e.g. asserting that a worker process it depends on is still alive).
    """
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if inspect.isawaitable(value):
            value = await value
        if value:
            return value
        if still is not None:
            still()
        if time.monotonic() >= deadline:
            awaited = what if isinstance(what, str) else what()
            raise AssertionError(f"timed out after {timeout:g} s waiting for {awaited} (last: {value!r})")
        await asyncio.sleep(interval)


async def run_status(handle: WorkflowHandle[Any, Any]) -> RunStatusView:
    """The run's ``status`` query, typed."""
    status: RunStatusView = await handle.query("status", result_type=RunStatusView)
    return status


async def status_when(
    handle: WorkflowHandle[Any, Any], fits: Callable[[RunStatusView], bool], what: str, timeout: float = 20
) -> RunStatusView:
    """The run's status once it ``fits`` (``what`` says how, for the timeout's message)."""
    seen: list[RunStatusView] = []

    async def fitting() -> RunStatusView | None:
        seen[:] = [await run_status(handle)]
        return seen[0] if fits(seen[0]) else None

    return await until(lambda: f"{what}; the run's status: {seen[-1:]}", fitting, timeout, interval=0.1)


async def awaiting_approval(
    handle: WorkflowHandle[Any, AgentRunResult], timeout: float = 20
) -> RunStatusView:
    """The run's status once a call waits for approval."""
    return await status_when(handle, lambda s: bool(s.pending_approvals), "a call to await approval", timeout)


def tool_result_ids(export: SessionCheckpointExportV1) -> list[str]:
    """The tool calls whose results an export's conversation holds, in order (the export opened)."""
    return [
        b.tool_use_id
        for m in export.open().logical_resume.messages
        for b in m.content
        if isinstance(b, ToolResultBlock)
    ]
