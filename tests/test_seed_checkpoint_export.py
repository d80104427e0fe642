"""The five scenarios of ``shared/seed/agent_live_checkpoint_export_v1.rs``, on a real server."""

from __future__ import annotations

import asyncio
from pathlib import Path

from temporalio.client import Client

from durable_agent.activities import AgentActivities
from durable_agent.activities.providers import build_providers
from durable_agent.client import follow_events, follow_run
from durable_agent.core.events import EndEvent, EventRecord, TextDeltaEvent, ToolEndEvent
from durable_agent.core.export import LoopCheckpoint, tool_end_ids
from durable_agent.core.models import LiveText, TokenUsage, ToolResultBlock
from durable_agent.core.run_api import AgentRunResult, RunStatusView
from durable_agent.core.run_log import RunLog
from tests.helpers import (
    BlockingSink,
    RecordingProvider,
    RecordingSink,
    final,
    read_call,
    run_status,
    running_worker,
    scripted_config,
    start,
    workspace_with,
)


async def run_with_sink(
    client: Client, tmp_path: Path, sink: RecordingSink, session_id: str = "live-export-session"
) -> AgentRunResult:
    ws = workspace_with(tmp_path, {"evidence.txt": "same-boundary evidence\n"})
    config = scripted_config(tmp_path, [read_call("read-boundary-1", "evidence.txt"), final()])
    async with running_worker(client, AgentActivities(config, sinks={"local": sink})) as queue:
        handle = await start(client, queue, ws, session_id=session_id)
        return await handle.result()


async def test_live_tool_boundary_exports_one_self_consistent_portable_checkpoint(
    client: Client, tmp_path: Path
) -> None:
    sink = RecordingSink()
    result = await run_with_sink(client, tmp_path, sink)
    assert result.status == "completed"
    assert result.text == "boundary export complete"
    assert len(sink.exports) == 1
    payload = sink.exports[0].open()
    logical = payload.logical_resume
    assert logical.session_id == "live-export-session" == result.session_id
    assert logical.turn == 1
    assert any(isinstance(b, ToolResultBlock) for m in logical.messages for b in m.content)
    source = payload.source_run()  # the same snapshot holds the source run
    assert logical.capability_binding.catalog_generation == 0
    assert source.snapshot.capability_binding == logical.capability_binding
    assert not source.snapshot.is_terminal
    assert "read-boundary-1" in tool_end_ids(source)
    # portable: no sink configuration or worker path in the artifact
    assert str(tmp_path / "exports") not in sink.exports[0].content
    assert result.exports[0].content_digest == sink.exports[0].descriptor.content_digest


async def test_successive_tool_boundaries_form_an_ordered_checkpoint_series(
    client: Client, tmp_path: Path
) -> None:
    ws = workspace_with(tmp_path, {"first.txt": "first boundary\n", "second.txt": "second boundary\n"})
    config = scripted_config(
        tmp_path,
        [read_call("read-boundary-1", "first.txt"), read_call("read-boundary-2", "second.txt"), final()],
    )
    sink = RecordingSink()
    async with running_worker(client, AgentActivities(config, sinks={"local": sink})) as queue:
        handle = await start(client, queue, ws, "read both files", session_id="ordered-export-session")
        result = await handle.result()
    assert result.tool_calls_count == 2
    assert len(sink.exports) == 2
    previous_count, previous_digest = 0, None
    for index, export in enumerate(sink.exports):
        digest = export.descriptor.content_digest
        assert digest != previous_digest
        previous_digest = digest
        payload = export.open()
        assert payload.logical_resume.turn == index + 1
        source = payload.source_run()
        assert source.snapshot.event_count > previous_count
        previous_count = source.snapshot.event_count
        assert f"read-boundary-{index + 1}" in tool_end_ids(source)
    assert [e.turn for e in result.exports] == [1, 2]


async def test_streaming_runs_use_the_same_acknowledged_export_boundary(
    client: Client, tmp_path: Path
) -> None:
    ws = workspace_with(tmp_path, {"evidence.txt": "stream boundary\n"})
    config = scripted_config(tmp_path, [read_call("stream-read-boundary", "evidence.txt"), final()])
    sink = RecordingSink()
    async with running_worker(client, AgentActivities(config, sinks={"local": sink})) as queue:
        handle = await start(client, queue, ws, session_id="stream-export-session")
        seen = [record async for record in follow_events(handle)]
        await handle.result()
    kinds = [r.event.type for r in seen]
    assert isinstance(seen[-1].event, EndEvent)
    assert [r.sequence for r in seen] == list(range(1, len(seen) + 1))  # no gap, no repeat
    assert kinds.index("tool_end") < kinds.index("checkpoint_exported") < kinds.index("end")
    assert len(sink.exports) == 1
    payload = sink.exports[0].open()
    assert "stream-read-boundary" in tool_end_ids(payload.source_run())


async def test_session_store_and_host_export_observe_the_same_live_boundary(
    client: Client, tmp_path: Path
) -> None:
    ws = workspace_with(tmp_path, {"evidence.txt": "dual sink boundary\n"})
    usage = {"prompt_tokens": 31, "completion_tokens": 7, "total_tokens": 38, "cache_read_tokens": 5}
    config = scripted_config(
        tmp_path, [{**read_call("dual-sink-read", "evidence.txt"), "usage": usage}, final()]
    )
    sink = BlockingSink()
    provider = RecordingProvider(build_providers(config)["scripted"])
    activities = AgentActivities(config, sinks={"local": sink}, providers={"scripted": provider})
    async with running_worker(client, activities) as queue:
        handle = await start(client, queue, ws, session_id="dual-sink-session")
        await asyncio.wait_for(sink.entered.acquire(), timeout=10)
        exported = sink.exports[-1].open().logical_resume
        # the logical checkpoint the store holds, read through the store the worker used: the
        # run's header and its log folded; the counters an export adds to them (the turn, the
        # usage, the boundary's time) come with the export request, so they are checked against
        # what the stored log shows (one tool_end a turn) and what the model answered
        header = await activities.store.load_header(exported.run_id)
        assert header is not None, "the run's header must be stored before its export is acknowledged"
        stored = RunLog(exported.run_id)
        stored.apply_all(await activities.store.read_log(exported.run_id, 0, 1_000_000))
        assert stored.version > 0, "the logical store write must precede host export acknowledgement"
        turns = sum(isinstance(r.event, ToolEndEvent) for r in stored.events)
        held = LoopCheckpoint(
            session_id=header.session_id,
            run_id=header.run_id,
            turn=turns,
            messages=tuple(stored.messages),
            capability_binding=header.capability_binding,
            total_usage=sum((a.usage for a in provider.answers), TokenUsage()),
            tool_calls_count=turns,
            checkpoint_ms=exported.checkpoint_ms,  # when the export was taken: checked below
        )
        assert set(type(held).model_fields) == set(type(exported).model_fields)
        for field in type(exported).model_fields:
            assert getattr(held, field) == getattr(exported, field), f"store and export differ in {field}"
        assert held == exported
        assert (held.session_id, held.turn, held.total_usage.total_tokens) == ("dual-sink-session", 1, 38)
        assert stored.events and exported.checkpoint_ms >= stored.events[-1].timestamp_ms
        assert exported.capability_binding == sink.exports[-1].open().source_run().snapshot.capability_binding
        # the loop waits for the sink: the model has not been asked again
        await asyncio.sleep(0.5)
        assert provider.calls == 1
        status = await run_status(handle)
        assert (status.turn, status.exports_delivered) == (1, 0)
        sink.release.release()
        result = await handle.result()
    assert result.text == "boundary export complete"
    assert provider.calls == 2
    assert await activities.store.log_head(exported.run_id) is None


async def test_checkpoint_export_failure_is_observable_but_does_not_halt_the_live_run(
    client: Client, tmp_path: Path
) -> None:
    sink = RecordingSink(fail=True)
    ws = workspace_with(tmp_path, {"evidence.txt": "same-boundary evidence\n"})
    config = scripted_config(tmp_path, [read_call("read-boundary-1", "evidence.txt"), final()])
    async with running_worker(client, AgentActivities(config, sinks={"local": sink})) as queue:
        handle = await start(client, queue, ws)
        result = await handle.result()
        status = await handle.query("status", result_type=RunStatusView)
    assert result.status == "completed"
    assert result.text == "boundary export complete"
    assert len(sink.exports) == 1  # a non-retryable failure: one attempt
    assert result.exports == ()
    [failure] = result.export_failures
    assert failure.turn == 1 and "deterministic export failure" in failure.reason
    assert failure.content_digest == sink.exports[0].descriptor.content_digest  # what was not delivered
    assert status.export_failures == 1 and status.exports_delivered == 0
    events = [r.event.type for r in sink.exports[0].open().source_run().events]
    assert "tool_end" in events


async def test_a_session_snapshot_holds_every_run_of_the_session(client: Client, tmp_path: Path) -> None:
    ws = workspace_with(tmp_path, {"evidence.txt": "e\n"})
    config = scripted_config(tmp_path, [read_call("r1", "evidence.txt"), final()])
    sink = RecordingSink()
    async with running_worker(client, AgentActivities(config, sinks={"local": sink})) as queue:
        first = await (await start(client, queue, ws, session_id="two-run-session")).result()
        second = await (await start(client, queue, ws, session_id="two-run-session")).result()
    assert first.run_id != second.run_id
    payload = sink.exports[-1].open()
    runs = {r.snapshot.id: r.snapshot for r in payload.snapshot.run_records}
    assert list(runs) == [first.run_id, second.run_id]
    assert runs[first.run_id].status == "completed" and runs[first.run_id].result_text
    assert runs[second.run_id].status == "executing"
    assert payload.logical_resume.run_id == second.run_id


async def test_a_follower_sees_the_model_text_while_it_streams(client: Client, tmp_path: Path) -> None:
    ws = workspace_with(tmp_path, {})
    text = "one two three four five six seven eight nine ten"
    config = scripted_config(tmp_path, [{"text": text, "delay_ms": 3000}])
    async with running_worker(client, AgentActivities(config)) as queue:
        handle = await start(client, queue, ws, "count to ten slowly")
        seen = [item async for item in follow_run(handle)]
    live = [i for i in seen if isinstance(i, LiveText)]
    events = [i for i in seen if isinstance(i, EventRecord)]
    assert len(live) >= 2, "the text should show up in pieces while the call runs"
    assert all(text.startswith(piece.text) for piece in live)
    assert len({piece.text for piece in live}) == len(live)  # each one new
    assert live[0].text != text  # the first piece arrived before the answer was complete
    assert all(piece.attempt == 1 for piece in live)
    deltas = [e.event for e in events if isinstance(e.event, TextDeltaEvent)]
    assert [d.text for d in deltas] == [text]  # the durable event holds the whole text, once
    assert seen.index(live[-1]) < seen.index(next(e for e in events if isinstance(e.event, TextDeltaEvent)))
