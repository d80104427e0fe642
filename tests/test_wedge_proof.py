"""Inputs that cannot wedge a run, on a real Temporal server with the sizes the issue gives.

A model answer with a lone surrogate, an MCP server with 128 tools of 31 KB, a 1.9 MB
prompt, 28 large steers during one model call, a flood of small ones, a start prompt too
large for the run's header: each either goes on or is refused at once with a typed reason,
and the run stays whole (its queries answer, a legitimate update is taken, no workflow task
fails). What an update is told is what happened to it. (Codec integrity: ``test_codec.py``.)
"""

from __future__ import annotations

import asyncio
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest
from temporalio.api.common.v1 import Payload
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowFailureError, WorkflowHandle, WorkflowUpdateFailedError
from temporalio.common import RawValue
from temporalio.exceptions import ApplicationError
from temporalio.service import RPCError

from durable_agent.activities import AgentActivities
from durable_agent.activities.providers import build_providers
from durable_agent.client import run_result, send_prompt, steer_run
from durable_agent.core.events import (
    ErrorEvent,
    EventRecord,
    ToolEndEvent,
    ToolsUnavailableEvent,
    UserMessageEvent,
)
from durable_agent.core.models import TextBlock
from durable_agent.core.plan import Limits
from durable_agent.core.run_api import (
    HISTORY_FULL,
    INPUT_TOO_LARGE,
    QUEUE_FULL,
    AgentRunResult,
    FollowUpPrompt,
    SteerMessage,
)
from durable_agent.devserver import start_ephemeral_server
from tests.helpers import (
    RecordingProvider,
    RecordingSink,
    final,
    running_worker,
    scripted_config,
    start,
    status_when,
    tool_call,
    until,
    workspace_with,
)
from tests.wire_servers import AnthropicWire, Call, OpenAIWire, Reply, WireServer, sse

BIG_SCHEMAS = Path(__file__).parent / "mcp_servers" / "big_schemas.py"
AGENT_TOOLS = Path(__file__).parent / "mcp_servers" / "agent_tools.py"
KEY_ENV = "AGENT_WEDGE_TEST_KEY"


def recording(config: Any) -> tuple[AgentActivities, RecordingProvider, RecordingSink]:
    model = RecordingProvider(build_providers(config)["scripted"])
    sink = RecordingSink()
    return AgentActivities(config, providers={"scripted": model}, sinks={"local": sink}), model, sink


def held(config: Any) -> tuple[AgentActivities, RecordingProvider]:
    """Activities whose model holds its first call until ``model.released`` is set."""
    model = RecordingProvider(build_providers(config)["scripted"], hold_first=True)
    return AgentActivities(config, providers={"scripted": model}, sinks={"local": RecordingSink()}), model


async def events_of(handle: WorkflowHandle[Any, Any]) -> list[EventRecord]:
    records: list[EventRecord] = await handle.query("events", 0, result_type=list[EventRecord])
    return records


async def failed_workflow_tasks(handle: WorkflowHandle[Any, Any]) -> int:
    history = await handle.fetch_history()
    return sum(1 for e in history.events if e.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_FAILED)


def rejection(caught: pytest.ExceptionInfo[WorkflowUpdateFailedError]) -> ApplicationError:
    return failure_of(caught.value)


def failure_of(error: object) -> ApplicationError:
    """The typed failure a rejected update carries."""
    assert isinstance(error, WorkflowUpdateFailedError), error
    assert isinstance(error.cause, ApplicationError), error.cause
    return error.cause


def user_texts(seen: tuple[Any, ...]) -> list[str]:
    """The text blocks of the user messages of one model request."""
    return [b.text for m in seen if m.role == "user" for b in m.content if isinstance(b, TextBlock)]


# --- a lone surrogate in a model's answer -------------------------------------------------


async def test_a_lone_surrogate_in_tool_arguments_and_text_becomes_u_fffd_without_retries(
    client: Client, tmp_path: Path
) -> None:
    ws = workspace_with(tmp_path, {"a.txt": "a\n"})
    # the script is JSON: json.dumps writes "\ud800" as the escape a model's JSON would hold
    script = [
        tool_call("w1", "write", file_path="x\ud800.txt", content="a\ud800b"),
        final("bad \ud800 text"),
    ]
    config = scripted_config(tmp_path, script, permissions={"allow": ["read", "write"], "default": "deny"})
    acts, model, sink = recording(config)
    async with running_worker(client, acts) as queue:
        handle = await start(client, queue, ws)
        result = await asyncio.wait_for(handle.result(), 60)
        assert await failed_workflow_tasks(handle) == 0
    assert result.status == "completed", result.error
    assert model.calls == 2  # one call per step: nothing retried, nothing billed twice
    assert result.text == "bad \ufffd text"
    assert (ws / "x\ufffd.txt").read_text() == "a\ufffdb"
    export = sink.exports[-1]
    assert "\ufffd" in export.model_dump_json()
    export.open()  # its digests hold


@pytest.mark.parametrize("wire", [OpenAIWire(), AnthropicWire()], ids=["openai", "anthropic"])
async def test_a_lone_surrogate_over_the_wire_is_one_call_not_eight(
    client: Client, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, wire: Any
) -> None:
    monkeypatch.setenv(KEY_ENV, "sk-wedge-test-0123456789")
    ws = workspace_with(tmp_path, {"a.txt": "a\n"})
    arguments = '{"file_path": "w\\ud800.txt", "content": "q\\udc00q"}'  # JSON escapes, as sent
    async with WireServer() as server:
        server.queue(wire.stream(calls=[Call("c1", "write", {}, raw=arguments)]), wire.stream(text=["done"]))
        config = scripted_config(
            tmp_path,
            [final()],
            default_model=f"{wire.kind}/m",
            providers={wire.kind: wire.provider(server.base_url, KEY_ENV)},
            permissions={"allow": ["write"], "default": "deny"},
        )
        async with running_worker(client, AgentActivities(config)) as queue:
            result = await asyncio.wait_for((await start(client, queue, ws)).result(), 60)
        assert result.status == "completed", result.error
        assert len(server.requests) == 2
        assert (ws / "w\ufffd.txt").read_text() == "q\ufffdq"

        # a lone surrogate in the answer's text does not parse as the wire's JSON: one clear failure
        if wire.kind == "openai":
            delta = '{"role":"assistant","content":"a\\ud800b"}'
            bad = sse(f'{{"id":"c","choices":[{{"index":0,"delta":{delta},"finish_reason":null}}]}}')
            opening = wire.stream(text=["x"]).chunks[:1]
        else:
            delta = '{"type":"text_delta","text":"a\\ud800b"}'
            bad = sse(f'{{"type":"content_block_delta","index":0,"delta":{delta}}}', "content_block_delta")
            opening = wire.stream(text=["x"]).chunks[:3]  # message_start, ping, the text block's start
        server.queue(Reply.sse([*opening, bad]))
        async with running_worker(client, AgentActivities(config)) as queue:
            failed = await asyncio.wait_for((await start(client, queue, ws)).result(), 60)
        assert failed.status == "failed" and "did not parse" in (failed.error or ""), failed.error
        assert len(server.requests) == 3  # tried once


# --- an MCP server whose catalog the plan cannot carry ------------------------------------


async def test_an_mcp_server_with_128_tools_of_31_kb_is_left_out_and_the_run_goes_on(
    client: Client, tmp_path: Path
) -> None:
    ws = workspace_with(tmp_path, {"a.txt": "alpha\n"})
    servers = {
        "big": {
            "command": sys.executable,
            "args": [str(BIG_SCHEMAS), "--tools", "128", "--schema-bytes", "31000"],
        },
        "small": {"command": sys.executable, "args": [str(AGENT_TOOLS)]},
    }
    script = [
        tool_call("e1", "mcp__small__echo", text="still here"),
        tool_call("b1", "mcp__big__tool_000", spec="x"),
        final("done"),
    ]
    config = scripted_config(
        tmp_path, script, mcp=servers, permissions={"allow": ["mcp__*", "read"], "default": "deny"}
    )
    acts, _model, sink = recording(config)
    # listed whole first (a run's start waits 4 s at most for a listing; this one takes longer)
    await acts.mcp.refresh()
    assert len(acts.mcp.tool_names("big")) == 128
    async with running_worker(client, acts) as queue:
        handle = await start(client, queue, ws)
        result = await asyncio.wait_for(handle.result(), 90)
        assert await failed_workflow_tasks(handle) == 0
    await acts.aclose()
    assert result.status == "completed", result.error
    events = [r.event for r in exported_events(sink)]
    [gap] = [e for e in events if isinstance(e, ToolsUnavailableEvent)]
    assert gap.server == "big" and len(gap.tools) == 128
    assert "max_tool_catalog_bytes=524288" in gap.reason and "left out" in gap.reason
    outputs = {e.id: e.output for e in events if isinstance(e, ToolEndEvent)}
    assert "echo: still here" in outputs["e1"]
    assert "unknown tool 'mcp__big__tool_000'" in outputs["b1"]
    binding = sink.exports[-1].open().logical_resume.capability_binding
    assert "mcp__small__echo" in binding.tools and not any(t.startswith("mcp__big__") for t in binding.tools)


async def test_a_server_that_fits_the_catalog_budget_is_offered_whole(client: Client, tmp_path: Path) -> None:
    ws = workspace_with(tmp_path, {"a.txt": "alpha\n"})
    servers = {
        "big": {
            "command": sys.executable,
            "args": [str(BIG_SCHEMAS), "--tools", "12", "--schema-bytes", "31000"],
        }
    }
    config = scripted_config(
        tmp_path,
        [tool_call("b1", "mcp__big__tool_011", spec="x"), final("done")],
        mcp=servers,
        permissions={"allow": ["mcp__*"], "default": "deny"},
    )
    acts, _model, sink = recording(config)
    await acts.mcp.refresh()
    async with running_worker(client, acts) as queue:
        result = await asyncio.wait_for((await start(client, queue, ws)).result(), 90)
    await acts.aclose()
    assert result.status == "completed", result.error
    events = [r.event for r in exported_events(sink)]
    assert not any(isinstance(e, ToolsUnavailableEvent) for e in events)
    assert [e.output for e in events if isinstance(e, ToolEndEvent)] == ["ok tool_011"]


def exported_events(sink: RecordingSink) -> list[EventRecord]:
    return list(sink.exports[-1].open().source_run().events)


def test_the_input_limits_fit_together_in_a_payload() -> None:
    limits = Limits()
    assert (limits.max_message_bytes, limits.max_queued_messages, limits.max_queued_bytes) == (
        262_144,
        32,
        524_288,
    )
    assert limits.max_tool_catalog_bytes == 524_288
    with pytest.raises(ValueError, match="within Temporal's 2 MiB payload limit"):
        Limits(max_message_bytes=393_216, max_queued_bytes=1_048_576)
    with pytest.raises(ValueError, match="less than or equal to 393216"):
        Limits(max_message_bytes=1_000_000)
    with pytest.raises(ValueError, match="less than or equal to 1048576"):
        Limits(max_tool_catalog_bytes=4_000_000)


# --- updates past the run's limits ---------------------------------------------------------


async def test_a_1_9_mb_prompt_is_rejected_and_the_run_takes_the_next_one(
    client: Client, tmp_path: Path
) -> None:
    ws = workspace_with(tmp_path, {"a.txt": "a\n"})
    config = scripted_config(tmp_path, [final("one"), final("two")])
    acts, model, _ = recording(config)
    async with running_worker(client, acts) as queue:
        handle = await start(client, queue, ws, "hi", follow_ups=True)
        await status_when(handle, lambda s: s.status == "awaiting_prompt", "the run to await a prompt")
        # sent as any client may: the run rejects it
        with pytest.raises(WorkflowUpdateFailedError) as caught:
            await handle.execute_update("prompt", FollowUpPrompt(text="p" * 1_900_000))
        cause = rejection(caught)
        assert cause.type == INPUT_TOO_LARGE and cause.non_retryable
        assert "1900002 bytes as JSON, over [limits] max_message_bytes=262144" in cause.message
        # escapes count: 60,000 control characters are 360,002 bytes of JSON
        with pytest.raises(WorkflowUpdateFailedError) as escaped:
            await send_prompt(handle, "\x01" * 60_000)
        assert rejection(escaped).type == INPUT_TOO_LARGE
        assert "360002 bytes as JSON, over [limits] max_message_bytes=262144" in rejection(escaped).message
        # our client does not even send what no run takes
        with pytest.raises(WorkflowUpdateFailedError) as local:
            await send_prompt(handle, "p" * 1_900_000)
        assert rejection(local).type == INPUT_TOO_LARGE and "not sent" in rejection(local).message
        # the run is whole: its queries answer at once, and a prompt within the limit is taken
        status = await asyncio.wait_for(handle.query("status"), 5)
        assert status is not None
        accepted = await asyncio.wait_for(send_prompt(handle, "q" * 200_000), 10)
        assert accepted.after_sequence > 0
        await status_when(handle, lambda s: s.status == "awaiting_prompt" and model.calls == 2, "the answer")
        await handle.signal("end")
        result = await asyncio.wait_for(handle.result(), 30)
        assert await failed_workflow_tasks(handle) == 0
    assert result.status == "completed" and result.text == "two"
    assert user_texts(model.seen[1])[-1] == "q" * 200_000


async def test_a_start_prompt_past_the_limit_refuses_the_run(client: Client, tmp_path: Path) -> None:
    ws = workspace_with(tmp_path, {"a.txt": "a\n"})
    acts, model, _ = recording(scripted_config(tmp_path, [final()]))
    async with running_worker(client, acts) as queue:
        handle = await start(client, queue, ws, "p" * 1_900_000)
        with pytest.raises(WorkflowFailureError) as caught:
            await asyncio.wait_for(handle.result(), 30)
        assert await failed_workflow_tasks(handle) == 0
    cause = caught.value.cause
    assert isinstance(cause, ApplicationError) and cause.type == INPUT_TOO_LARGE
    assert "max_message_bytes=262144" in cause.message
    assert model.calls == 0


async def test_28_large_steers_during_one_model_call_are_rejected_and_the_run_completes(
    client: Client, tmp_path: Path
) -> None:
    ws = workspace_with(tmp_path, {"a.txt": "a\n"})
    acts, model = held(scripted_config(tmp_path, [{"text": "slow"}, final("two")]))
    async with running_worker(client, acts) as queue:
        handle = await start(client, queue, ws, "hi")
        await until("the model call", lambda: model.calls == 1)
        outcomes: list[object] = []
        for i in range(28):  # as the issue sent them: one after the other, by a client of any kind
            try:
                outcomes.append(
                    await handle.execute_update("steer", SteerMessage(text=f"{i:02d}" + "s" * 1_900_000))
                )
            except WorkflowUpdateFailedError as exc:
                outcomes.append(exc)
        # at once, through our client: refused before sending
        at_once = await asyncio.gather(
            *(steer_run(handle, f"{i:02d}" + "s" * 1_900_000) for i in range(28)), return_exceptions=True
        )
        model.released.set()
        result: AgentRunResult = await asyncio.wait_for(handle.result(), 60)
        assert await failed_workflow_tasks(handle) == 0
    assert {failure_of(o).type for o in outcomes + at_once} == {INPUT_TOO_LARGE}
    assert all("not sent" in failure_of(o).message for o in at_once)
    assert result.status == "completed" and result.text == "slow" and model.calls == 1
    history = await handle.fetch_history()
    assert len(history.to_json()) < 1_000_000  # none of them entered the history


async def steer_in_waves(handle: WorkflowHandle[Any, Any], texts: list[str]) -> list[object]:
    """Steer with ``texts``, eight at a time: concurrent, yet below the 10 updates Temporal lets
    wait on one run (past which it refuses them itself, before the run sees them)."""
    outcomes: list[object] = []
    for i in range(0, len(texts), 8):
        wave = texts[i : i + 8]
        outcomes += await asyncio.gather(*(steer_run(handle, t) for t in wave), return_exceptions=True)
    return outcomes


async def test_a_flood_of_steers_is_bounded_and_each_outcome_is_what_happened(
    client: Client, tmp_path: Path
) -> None:
    ws = workspace_with(tmp_path, {"a.txt": "a\n"})
    acts, model = held(scripted_config(tmp_path, [{"text": "slow"}, final("answered")]))
    async with running_worker(client, acts) as queue:
        handle = await start(client, queue, ws, "hi")
        await until("the model call", lambda: model.calls == 1)
        texts = [f"steer {i:02d} " + "m" * 100_000 for i in range(40)] + [f"small {i:02d}" for i in range(40)]
        outcomes = await steer_in_waves(handle, texts)
        assert model.calls == 1
        model.released.set()
        result = await asyncio.wait_for(handle.result(), 60)
        assert await failed_workflow_tasks(handle) == 0
        steered = [r.event.text for r in await events_of(handle) if isinstance(r.event, UserMessageEvent)]
    accepted = [t for t, o in zip(texts, outcomes, strict=True) if not isinstance(o, BaseException)]
    refused = [o for o in outcomes if isinstance(o, BaseException)]
    # 524,288 bytes hold five 100 KB steers; 32 messages at most wait
    assert sum(1 for t in accepted if t.startswith("steer")) == 5
    assert len(accepted) == 32
    assert {failure_of(o).type for o in refused} == {QUEUE_FULL}
    assert result.status == "completed" and result.text == "answered" and model.calls == 2
    # what each was told is what happened: the accepted ones, and only those, reached the model
    assert sorted(user_texts(model.seen[1])[1:]) == sorted(accepted)
    assert sorted(steered) == sorted(accepted)


async def test_an_update_that_would_take_the_history_past_its_limit_is_rejected(
    client: Client, tmp_path: Path
) -> None:
    ws = workspace_with(tmp_path, {"a.txt": "a\n"})
    config = scripted_config(tmp_path, [final("one"), final("two")], limits={"max_history_bytes": 300_000})
    acts, model, _ = recording(config)
    async with running_worker(client, acts) as queue:
        handle = await start(client, queue, ws, "hi", follow_ups=True)
        await status_when(handle, lambda s: s.status == "awaiting_prompt", "the run to await a prompt")
        with pytest.raises(WorkflowUpdateFailedError) as caught:
            await send_prompt(handle, "h" * 100_000)
        cause = rejection(caught)
        assert cause.type == HISTORY_FULL and "max_history_bytes=300000" in cause.message
        await send_prompt(handle, "a short one")
        await status_when(handle, lambda s: s.status == "awaiting_prompt" and model.calls == 2, "the answer")
        await handle.signal("end")
        result = await asyncio.wait_for(handle.result(), 30)
    assert result.status == "completed" and result.text == "two"


async def test_steers_accepted_but_never_delivered_are_on_the_record(client: Client, tmp_path: Path) -> None:
    ws = workspace_with(tmp_path, {"a.txt": "a\n"})
    acts, model, _sink = recording(scripted_config(tmp_path, [{"text": "slow", "delay_ms": 30_000}]))
    async with running_worker(client, acts) as queue:
        handle = await start(client, queue, ws, "hi")
        await until("the model call", lambda: model.calls == 1)
        await steer_run(handle, "one more thing")
        await handle.signal("cancel", "c" * 100_000)  # a signal is not refused: its reason is cut
        result = await asyncio.wait_for(run_result(client, handle.id), 30)
        errors = [r.event.message for r in await events_of(handle) if isinstance(r.event, ErrorEvent)]
    assert result.status == "cancelled" and result.error == "c" * 2000
    assert any("1 message(s) sent with steer were accepted but never reached the model" in e for e in errors)


async def test_a_flood_of_large_raw_updates_cannot_terminate_a_run_on_a_server_set_as_documented(
    tmp_path: Path,
) -> None:
    """With Temporal's defaults, a few ~2 MB updates at once from a raw client get the run
    terminated by Temporal (the SDK's answer echoes each, past the 4 MiB Temporal receives): with
    ``history.maxInFlightUpdates=1``, as the docs say, each is refused and none is applied."""
    env = await start_ephemeral_server(
        dev_server_extra_args=["--dynamic-config-value", "history.maxInFlightUpdates=1"]
    )
    try:
        client = env.client
        ws = workspace_with(tmp_path, {"a.txt": "a\n"})
        acts, model = held(scripted_config(tmp_path, [{"text": "slow"}, final()]))
        async with running_worker(client, acts) as queue:
            handle = await start(client, queue, ws, "hi")
            await until("the model call", lambda: model.calls == 1)
            big = (SteerMessage(text=f"{i:02d}" + "s" * 1_900_000) for i in range(28))
            outcomes = await asyncio.gather(
                *(handle.execute_update("steer", m) for m in big), return_exceptions=True
            )
            model.released.set()
            result = await asyncio.wait_for(handle.result(), 60)
            assert await failed_workflow_tasks(handle) == 0
        assert all(isinstance(o, (WorkflowUpdateFailedError, RPCError)) for o in outcomes), outcomes
        assert result.status == "completed" and result.text == "slow"
        # none reached the model (under this load a model call may time out and be tried again)
        assert all(user_texts(seen) == ["hi"] for seen in model.seen)
    finally:
        await env.shutdown()


@pytest.mark.parametrize(
    "data",
    [b'{"prompt": "a \\ud800 b", "workspace": "WS"}', b'["not", "an", "object"]', b"{not json"],
    ids=["lone-surrogate", "not-an-object", "not-json"],
)
async def test_a_start_input_the_worker_cannot_read_refuses_the_run(
    client: Client, tmp_path: Path, data: bytes
) -> None:
    """Sent as ``temporal workflow start --input`` would: raw JSON the SDK cannot convert failed
    the run's first workflow task for ever; the run reads it itself and refuses it."""
    ws = workspace_with(tmp_path, {"a.txt": "a\n"})
    acts, model, _ = recording(scripted_config(tmp_path, [final()]))
    payload = Payload(metadata={"encoding": b"json/plain"}, data=data.replace(b"WS", str(ws).encode()))
    async with running_worker(client, acts) as queue:
        handle = await client.start_workflow(
            "AgentRun", RawValue(payload), id=f"raw-{uuid.uuid4().hex[:8]}", task_queue=queue
        )
        with pytest.raises(WorkflowFailureError) as caught:
            await asyncio.wait_for(handle.result(), 30)
        assert await failed_workflow_tasks(handle) == 0
    cause = caught.value.cause
    assert isinstance(cause, ApplicationError) and cause.type == "InvalidRunInput", cause
    assert cause.message.startswith("invalid AgentRun input")
    assert model.calls == 0
