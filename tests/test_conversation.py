"""Conversations that go on (follow-up prompts, ``chat``), steering, and budgets."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from typing import Any

import pytest
from temporalio.client import Client, WorkflowHandle, WorkflowUpdateFailedError
from temporalio.service import RPCError

from durable_agent.activities import AgentActivities
from durable_agent.activities.providers import build_providers
from durable_agent.activities.tools import Tool, builtin_tools
from durable_agent.client import end_conversation, resume_run, run_result, send_prompt, steer_run
from durable_agent.config import AgentConfig
from durable_agent.core.events import BudgetExhaustedEvent, EventRecord, ToolEndEvent, UserMessageEvent
from durable_agent.core.models import Message, TextBlock, ToolResultBlock
from durable_agent.core.run_api import AgentRunResult
from durable_agent.core.run_log import RunLog
from durable_agent.core.tool_specs import ToolArgs, ToolSpec
from tests.helpers import (
    RecordingProvider,
    RecordingSink,
    final,
    read_call,
    running_worker,
    scripted_config,
    start,
    status_when,
    tool_call,
    workspace_with,
)
from tests.test_cli import cli_env


def recording(config: AgentConfig, **kw: Any) -> tuple[AgentActivities, RecordingProvider, RecordingSink]:
    model = RecordingProvider(build_providers(config)["scripted"])
    sink = RecordingSink()
    return AgentActivities(config, providers={"scripted": model}, sinks={"local": sink}, **kw), model, sink


async def events_of(handle: WorkflowHandle[Any, Any]) -> list[EventRecord]:
    records: list[EventRecord] = await handle.query("events", 0, result_type=list[EventRecord])
    return records


async def awaiting_prompt(handle: WorkflowHandle[Any, Any]) -> None:
    await status_when(handle, lambda s: s.status == "awaiting_prompt", "the run to await a prompt")


async def test_a_follow_up_continues_the_same_conversation(client: Client, tmp_path: Path) -> None:
    ws = workspace_with(tmp_path, {"a.txt": "alpha\n", "b.txt": "beta\n"})
    config = scripted_config(
        tmp_path,
        [read_call("r1", "a.txt"), final("one"), read_call("r2", "b.txt"), final("two")],
    )
    acts, model, sink = recording(config)
    async with running_worker(client, acts) as queue:
        handle = await start(client, queue, ws, "read a.txt", follow_ups=True)
        await awaiting_prompt(handle)
        desc = await handle.describe()
        assert desc.search_attributes.get("AgentRunStatus") == ["awaiting_prompt"]
        accepted = await send_prompt(handle, "now read b.txt")
        assert accepted.after_sequence > 0
        await awaiting_prompt(handle)
        assert model.calls == 4
        await end_conversation(handle)
        result = await handle.result()
    assert result.status == "completed" and result.text == "two"
    # the model's third request holds the first turn and the new prompt
    third = model.seen[2]
    assert third[0].text() == "read a.txt"
    assert [m.role for m in third] == ["user", "assistant", "user", "assistant", "user"]
    assert third[-1] == Message(role="user", content=(TextBlock(text="now read b.txt"),))
    # the exports continue one series, turns increasing
    assert [e.descriptor.turn for e in sink.exports] == [1, 2]
    assert len({e.descriptor.run_id for e in sink.exports}) == 1
    last = sink.exports[-1].open()
    kinds = [r.event for r in last.source_run().events if isinstance(r.event, UserMessageEvent)]
    assert [(k.kind, k.text) for k in kinds] == [("follow_up", "now read b.txt")]


async def test_the_idle_timeout_closes_a_conversation(client: Client, tmp_path: Path) -> None:
    ws = workspace_with(tmp_path, {})
    config = scripted_config(tmp_path, [final("only answer")])
    acts, model, _ = recording(config)
    async with running_worker(client, acts) as queue:
        handle = await start(client, queue, ws, "hello", follow_ups=True, idle_timeout_seconds=1)
        result = await asyncio.wait_for(handle.result(), 20)
    assert result.status == "completed" and result.text == "only answer"
    assert model.calls == 1


async def test_a_prompt_while_the_run_works_is_rejected(client: Client, tmp_path: Path) -> None:
    ws = workspace_with(tmp_path, {})
    config = scripted_config(tmp_path, [{"text": "slow answer", "delay_ms": 3000}, final("two")])
    acts, model, _ = recording(config)
    async with running_worker(client, acts) as queue:
        handle = await start(client, queue, ws, "hello", follow_ups=True)
        await status_when(handle, lambda s: s.status == "executing" and s.event_count >= 1, "the run to work")
        with pytest.raises(WorkflowUpdateFailedError) as rejected:
            await send_prompt(handle, "too early")
        assert "steer" in str(rejected.value.cause)
        await awaiting_prompt(handle)
        with pytest.raises(WorkflowUpdateFailedError) as steer_rejected:
            await steer_run(handle, "a steer while waiting")
        assert "prompt" in str(steer_rejected.value.cause)
        await end_conversation(handle)
        result = await handle.result()
    assert result.status == "completed" and result.text == "slow answer"
    assert model.calls == 1
    # a run without follow_ups never waits, and a prompt to it is rejected too
    history = await handle.fetch_history()
    assert "too early" not in history.to_json()


class WaitArgs(ToolArgs):
    seconds: float


class WaitTool:
    def __init__(self) -> None:
        self.started = asyncio.Event()
        self.cancelled = False

    async def run(self, args: WaitArgs, workspace: Path) -> str:
        self.started.set()
        try:
            await asyncio.sleep(args.seconds)
        except asyncio.CancelledError:
            self.cancelled = True
            raise
        return f"waited {args.seconds} s"

    def tools(self) -> dict[str, Tool]:
        return {**builtin_tools(), "wait": Tool(ToolSpec("wait", "Wait a while.", WaitArgs, None), self.run)}


async def test_a_steer_during_a_slow_tool_reaches_the_next_request(client: Client, tmp_path: Path) -> None:
    ws = workspace_with(tmp_path, {})
    config = scripted_config(
        tmp_path,
        [tool_call("w1", "wait", seconds=2), final("steered")],
        permissions={"allow": ["read(*)", "wait"]},
    )
    waiter = WaitTool()
    acts, model, _ = recording(config, tools=waiter.tools())
    async with running_worker(client, acts) as queue:
        handle = await start(client, queue, ws, "wait a bit")
        await asyncio.wait_for(waiter.started.wait(), 10)
        accepted = await steer_run(handle, "also check the tests")
        assert accepted.queued == 1
        result = await handle.result()
        with pytest.raises((WorkflowUpdateFailedError, RPCError)):  # the server refuses it once closed
            await steer_run(handle, "too late")
        events = await events_of(handle)
    assert result.status == "completed" and result.text == "steered"
    assert not waiter.cancelled
    last = model.seen[1][-1]
    assert last.role == "user"
    assert isinstance(last.content[0], ToolResultBlock) and last.content[0].content == "waited 2.0 s"
    assert last.content[1] == TextBlock(text="also check the tests")
    ends = [r.event for r in events if isinstance(r.event, ToolEndEvent)]
    assert [e.is_error for e in ends] == [False]
    steers = [r.event for r in events if isinstance(r.event, UserMessageEvent)]
    assert [(s.kind, s.text) for s in steers] == [("steer", "also check the tests")]


USAGE = {"prompt_tokens": 1000, "completion_tokens": 500, "total_tokens": 1500}


async def budget_run(
    client: Client, tmp_path: Path, provider_extra: dict[str, Any], **fields: Any
) -> tuple[AgentRunResult, RecordingProvider, RecordingSink, list[EventRecord], list[str]]:
    ws = workspace_with(tmp_path, {"a.txt": "alpha\n"})
    responses = [{**read_call("r1", "a.txt"), "usage": USAGE}, {**final("never"), "usage": USAGE}]
    config = scripted_config(tmp_path, responses)
    if provider_extra:
        scripted = config.providers["scripted"].model_copy(update=provider_extra)
        config = config.model_copy(update={"providers": {"scripted": scripted}})
    acts, model, sink = recording(config)
    async with running_worker(client, acts) as queue:
        handle = await start(client, queue, ws, "read a.txt", **fields)
        result = await handle.result()
        events = await events_of(handle)
        desc = await handle.describe()
    return result, model, sink, events, list(desc.search_attributes.get("AgentRunStatus", []))  # type: ignore[arg-type]


async def test_a_token_budget_stops_the_run_at_the_boundary(client: Client, tmp_path: Path) -> None:
    result, model, sink, events, status = await budget_run(client, tmp_path, {}, max_total_tokens=1000)
    assert result.status == "budget_exhausted"
    assert result.error is not None and result.error.startswith("budget exhausted: 1500 tokens")
    assert model.calls == 1  # the answer's tool call was made, and the model never asked again
    assert [e.descriptor.turn for e in sink.exports] == [1] and len(result.exports) == 1
    budget = [r.event for r in events if isinstance(r.event, BudgetExhaustedEvent)]
    assert [(b.budget, b.used, b.limit) for b in budget] == [("tokens", 1500, 1000)]
    assert status == ["budget_exhausted"]


async def test_a_cost_budget_stops_the_run(client: Client, tmp_path: Path) -> None:
    prices = {"input_usd_per_mtok": 10.0, "output_usd_per_mtok": 20.0}
    result, model, sink, events, _ = await budget_run(client, tmp_path, prices, max_cost_usd=0.01)
    assert result.status == "budget_exhausted" and model.calls == 1
    budget = [r.event for r in events if isinstance(r.event, BudgetExhaustedEvent)]
    assert [(b.budget, b.limit) for b in budget] == [("cost", 0.01)]
    assert budget[0].used == pytest.approx(0.02)  # 1000 × $10/M + 500 × $20/M
    assert len(sink.exports) == 1


async def test_a_cost_budget_without_prices_is_refused(client: Client, tmp_path: Path) -> None:
    from temporalio.client import WorkflowFailureError

    with pytest.raises(WorkflowFailureError) as refused:
        await budget_run(client, tmp_path, {}, max_cost_usd=0.01)
    assert "no prices" in str(refused.value.cause)


async def test_resume_with_a_prompt_sends_the_prompt(client: Client, tmp_path: Path) -> None:
    ws = workspace_with(tmp_path, {"a.txt": "alpha\n"})
    responses = [read_call("r1", "a.txt"), final("done")]
    acts, _, sink = recording(scripted_config(tmp_path, responses))
    async with running_worker(client, acts) as queue:
        assert (await (await start(client, queue, ws, "read a.txt")).result()).status == "completed"
    export = sink.exports[0]
    acts, model, _ = recording(scripted_config(tmp_path, responses))
    async with running_worker(client, acts) as queue:
        handle = await resume_run(client, export, queue=queue, workspace=str(ws), prompt="and say why")
        result = await handle.result()
        events = await events_of(handle)
    assert result.status == "completed" and result.text == "done"
    last = model.seen[0][-1]
    assert last.role == "user" and isinstance(last.content[0], ToolResultBlock)
    assert last.content[-1] == TextBlock(text="and say why")
    said = [r.event for r in events if isinstance(r.event, UserMessageEvent)]
    assert [(s.kind, s.text) for s in said] == [("resume_prompt", "and say why")]


async def test_chat_through_stdin(client: Client, tmp_path: Path) -> None:
    ws = workspace_with(tmp_path, {"a.txt": "alpha\n"})
    config = scripted_config(
        tmp_path, [read_call("r1", "a.txt"), final("first answer"), final("second answer")]
    )
    async with running_worker(client, AgentActivities(config)) as queue:
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "durable_agent.cli",
            "chat",
            "--workspace",
            str(ws),
            cwd=tmp_path,
            env=cli_env(client, queue),
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        out, err = await asyncio.wait_for(proc.communicate(b"read a.txt\nand then?\n"), 60)
    text = out.decode()
    assert proc.returncode == 0, (text, err.decode())
    assert "first answer" in text and "second answer" in text
    assert text.index("first answer") < text.index("» prompt: and then?") < text.index("second answer")
    assert "Result: completed" in text


async def test_a_run_waiting_for_a_prompt_has_its_answer_in_the_store(client: Client, tmp_path: Path) -> None:
    """Turns without tool calls reach the store before the run waits, so no later model
    request carries them again as unsaved."""
    ws = workspace_with(tmp_path, {"a.txt": "alpha\n"})
    config = scripted_config(tmp_path, [final("first"), final("second")])
    acts, model, _sink = recording(config)
    async with running_worker(client, acts) as queue:
        handle = await start(client, queue, ws, "say something", follow_ups=True)
        await awaiting_prompt(handle)
        run_id = handle.first_execution_run_id
        assert run_id is not None
        head = await acts.store.log_head(run_id)
        assert head is not None
        log = RunLog(run_id)
        log.apply_all(await acts.store.read_log(run_id, 0, head.version))
        assert [m.text() for m in log.messages] == ["say something", "first"]
        await send_prompt(handle, "and again")
        await status_when(
            handle, lambda s: s.status == "awaiting_prompt" and len(model.seen) == 2, "a second answer"
        )
        await end_conversation(handle)
        result = await handle.result()
    assert result.status == "completed" and result.text == "second"
    assert [m.text() for m in model.seen[1]] == ["say something", "first", "and again"]


async def test_a_cancel_while_waiting_for_a_prompt_is_not_lost(client: Client, tmp_path: Path) -> None:
    ws = workspace_with(tmp_path, {"a.txt": "alpha\n"})
    config = scripted_config(tmp_path, [final("first")])
    async with running_worker(client, AgentActivities(config)) as queue:
        handle = await start(client, queue, ws, "say something", follow_ups=True)
        await awaiting_prompt(handle)
        await handle.signal("cancel", "enough")
        result = await run_result(client, handle.id)
    assert (result.status, result.error, result.text) == ("cancelled", "enough", "first")
