"""Linear history on a real server: the run's log lives in the session store, and a store
that lost it (a fresh one, another machine's) is brought back from the run's own history,
or from its last export after a continue-as-new."""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from temporalio.api.history.v1 import History, HistoryEvent
from temporalio.client import Client, WorkflowHandle

from durable_agent.activities import AgentActivities
from durable_agent.activities.sinks import read_export_file
from durable_agent.activities.store import FilesystemSessionStore
from durable_agent.client import resume_run
from durable_agent.config import AgentConfig
from durable_agent.core.canonical import canonical_bytes
from durable_agent.core.models import ToolResultBlock
from durable_agent.core.run_api import AgentRunResult, ApprovalAnswer, ApprovalDecision
from durable_agent.worker import build_worker
from tests.helpers import (
    RecordingSink,
    awaiting_approval,
    final,
    read_call,
    scripted_config,
    start,
    tool_call,
)

PERMISSIONS = {"allow": ["read(*)"], "ask": ["ls"], "default": "deny"}
READS = 6


def responses() -> list[dict[str, Any]]:
    reads = [read_call(f"r{i}", "a.txt") for i in range(1, READS + 1)]
    return [*reads, tool_call("l1", "ls", path="."), final("all done")]


def configs(tmp_path: Path, **limits: int) -> tuple[AgentConfig, AgentConfig]:
    """The same worker config twice, with two session stores (two machines); one export folder."""
    extra: dict[str, Any] = {"permissions": PERMISSIONS}
    if limits:
        extra["limits"] = limits
    here = scripted_config(tmp_path, responses(), store={"path": str(tmp_path / "store-a")}, **extra)
    there = scripted_config(tmp_path, responses(), store={"path": str(tmp_path / "store-b")}, **extra)
    return here, there


def workspace(tmp_path: Path) -> Path:
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "a.txt").write_text("".join(f"{i:04d} alpha beta gamma delta\n" for i in range(200)))  # ~5 KB
    return ws


async def approve_on(
    client: Client, activities: AgentActivities, queue: str, handle: WorkflowHandle[Any, AgentRunResult]
) -> AgentRunResult:
    """Approve the waiting ``ls`` with a worker (another machine's) running, and wait for the end."""
    async with build_worker(client, activities, queue):
        assert [p.call_id for p in (await awaiting_approval(handle)).pending_approvals] == ["l1"]
        await handle.execute_update(
            "approve", ApprovalDecision(call_id="l1", approved=True), result_type=ApprovalAnswer
        )
        return await handle.result()


def summaries(events: Sequence[HistoryEvent]) -> list[str]:
    out = []
    for e in events:
        if e.HasField("activity_task_scheduled_event_attributes") and e.user_metadata.HasField("summary"):
            out.append(json.loads(e.user_metadata.summary.data))
    return out


def tool_results(export_content: str) -> list[str]:
    messages = json.loads(export_content)["logical_resume"]["messages"]
    return [b["tool_use_id"] for m in messages for b in m["content"] if b["type"] == "tool_result"]


async def run_until_approval(
    client: Client, tmp_path: Path, activities: AgentActivities, queue: str
) -> WorkflowHandle[Any, AgentRunResult]:
    async with build_worker(client, activities, queue):
        handle = await start(client, queue, workspace(tmp_path), "read a.txt six times", max_tool_rounds=10)
        status = await awaiting_approval(handle)
        assert status.turn == READS
    return handle


async def test_a_fresh_store_mid_run_is_restored_from_the_run_history(client: Client, tmp_path: Path) -> None:
    here, there = configs(tmp_path)
    sink = RecordingSink()
    queue = f"linear-{time.monotonic_ns()}"
    handle = await run_until_approval(client, tmp_path, AgentActivities(here, sinks={"local": sink}), queue)
    # the run goes on on a machine whose store has never seen it
    result = await approve_on(client, AgentActivities(there, sinks={"local": sink}), queue, handle)
    assert result.status == "completed" and result.text == "all done", result
    assert not result.persistence_failures and not result.export_failures
    assert [e.turn for e in result.exports] == list(range(1, READS + 2))
    assert tool_results(sink.exports[-1].content) == [*(f"r{i}" for i in range(1, READS + 1)), "l1"]
    assert sink.exports[-1].open().logical_resume.turn == READS + 1
    history = await handle.fetch_history()
    assert any(s.startswith("restore run log") for s in summaries(history.events))
    # the store it was restored in let the run end there: its record is kept, its log dropped
    store = FilesystemSessionStore(tmp_path / "store-b")
    assert await store.log_head(result.run_id) is None
    [record] = await store.load_run_records(result.session_id)
    assert record.snapshot.status == "completed" and record.snapshot.event_count == record.events[-1].sequence


async def test_a_store_lost_after_continue_as_new_is_seeded_from_the_last_export(
    client: Client, tmp_path: Path
) -> None:
    here, there = configs(tmp_path, continue_as_new_events=50)
    queue = f"linear-{time.monotonic_ns()}"
    # the filesystem sink (the config's): it can give the run's last export back
    handle = await run_until_approval(client, tmp_path, AgentActivities(here), queue)
    started = (await handle.fetch_history()).events[0].workflow_execution_started_event_attributes
    assert started.continued_execution_run_id, "the run has not continued as new yet"
    result = await approve_on(client, AgentActivities(there), queue, handle)
    assert result.status == "completed" and result.text == "all done", result
    assert not result.persistence_failures and not result.export_failures
    assert [e.turn for e in result.exports] == list(range(1, READS + 2))
    last = sorted((tmp_path / "exports").rglob("turn-*.json"))[-1]
    content = read_export_file(last).content
    assert tool_results(content) == [*(f"r{i}" for i in range(1, READS + 1)), "l1"]


async def test_a_run_whose_state_is_lost_everywhere_fails_saying_how_to_go_on(
    client: Client, tmp_path: Path
) -> None:
    here, there = configs(tmp_path, continue_as_new_events=50)
    queue = f"linear-{time.monotonic_ns()}"
    # a sink that cannot give exports back, and a fresh store: nothing holds the state
    handle = await run_until_approval(
        client, tmp_path, AgentActivities(here, sinks={"local": RecordingSink()}), queue
    )
    result = await approve_on(client, AgentActivities(there, sinks={"local": RecordingSink()}), queue, handle)
    assert result.status == "failed"
    assert "in neither the session store nor sink 'local'" in (result.error or "")
    assert "durable-agent resume" in (result.error or "")
    assert result.exports[-1].content_digest in (result.error or "")  # the export to resume from


class NoStaging(FilesystemSessionStore):
    """A store that cannot keep tool outputs (full disk, say) but works otherwise."""

    async def stage_text(self, run_id: str, digest: str, text: str) -> None:
        raise OSError("no space left on device")


async def test_a_store_that_cannot_stage_costs_history_bytes_not_the_run(
    client: Client, tmp_path: Path
) -> None:
    here, _ = configs(tmp_path)
    # the tools' calls as ordinary activities, which stage what they return (local ones do not)
    here = here.model_copy(update={"tools": here.tools.model_copy(update={"local_calls": False})})
    ws = workspace(tmp_path)
    sink = RecordingSink()
    activities = AgentActivities(here, store=NoStaging(tmp_path / "store-a"), sinks={"local": sink})
    queue = f"linear-{time.monotonic_ns()}"
    async with build_worker(client, activities, queue):
        handle = await start(client, queue, ws, "read", max_tool_rounds=10)
        await awaiting_approval(handle)
        await handle.execute_update(
            "approve", ApprovalDecision(call_id="l1", approved=True), result_type=ApprovalAnswer
        )
        result = await handle.result()
    assert result.status == "completed" and not result.persistence_failures, result
    history = await handle.fetch_history()
    assert not any(s.startswith("restore") for s in summaries(history.events))  # no round trip lost
    # each tool call's result carried the output itself, and it entered the history once: the
    # checkpoint (a local activity) records its result, not its input
    tools = {
        e.event_id
        for e in history.events
        if e.activity_task_scheduled_event_attributes.activity_type.name == "agent.tool_call"
    }
    outputs = [
        e.activity_task_completed_event_attributes.result.payloads[0].data
        for e in history.events
        if e.activity_task_completed_event_attributes.scheduled_event_id in tools
    ]
    size = (ws / "a.txt").stat().st_size
    assert sum(len(s) > size for s in outputs) == READS
    assert not any(
        e.activity_task_scheduled_event_attributes.activity_type.name == "agent.save_checkpoint"
        for e in history.events
    )
    assert History(events=history.events).ByteSize() < (READS + 1) * size + 60_000
    results = [
        b
        for m in sink.exports[-1].open().logical_resume.messages
        for b in m.content
        if isinstance(b, ToolResultBlock)
    ]
    assert len(results) == READS + 1 and all(b.content for b in results)


async def test_a_long_model_message_enters_the_history_once(client: Client, tmp_path: Path) -> None:
    # a model that writes files: the content is in its messages (the tool calls' input)
    content = "".join(f"{i:05d} the quick brown fox jumps over the lazy dog\n" for i in range(2000))
    writes = [tool_call(f"w{i}", "write", file_path=f"f{i}.txt", content=content) for i in range(5)]
    config = scripted_config(
        tmp_path, [*writes, final("written")], permissions={"allow": ["write(*)"], "default": "deny"}
    )
    ws = tmp_path / "ws"
    ws.mkdir()
    sink = RecordingSink()
    queue = f"linear-{time.monotonic_ns()}"
    async with build_worker(client, AgentActivities(config, sinks={"local": sink}), queue):
        handle = await start(client, queue, ws, "write five files", max_tool_rounds=10)
        result = await handle.result()
    assert result.status == "completed" and (ws / "f4.txt").read_text() == content, result
    messages = sink.exports[-1].open().logical_resume.messages
    conversation = len(canonical_bytes([m.model_dump(mode="json") for m in messages]))
    assert conversation > 5 * len(content)
    history = await handle.fetch_history()
    assert History(events=history.events).ByteSize() < 1.3 * conversation


class Forgetful(FilesystemSessionStore):
    """Stages, then cannot find what it staged: the next activity ran on another machine."""

    async def staged_text(self, run_id: str, digest: str) -> str | None:
        return None


async def test_staged_arguments_and_outputs_that_vanish_are_sent_whole(
    client: Client, tmp_path: Path
) -> None:
    content = "".join(f"{i:05d} the quick brown fox\n" for i in range(500))
    config = scripted_config(
        tmp_path,
        [tool_call("w1", "write", file_path="f.txt", content=content), read_call("r1", "f.txt"), final("ok")],
        permissions={"allow": ["write(*)", "read(*)"], "default": "deny"},
        tools={"local_calls": False},  # ordinary activities stage what they return; local ones do not
    )
    ws = tmp_path / "ws"
    ws.mkdir()
    sink = RecordingSink()
    activities = AgentActivities(config, store=Forgetful(tmp_path / "store"), sinks={"local": sink})
    queue = f"linear-{time.monotonic_ns()}"
    async with build_worker(client, activities, queue):
        handle = await start(client, queue, ws, "write then read", max_tool_rounds=5)
        result = await handle.result()
    assert result.status == "completed" and not result.persistence_failures, result
    assert (ws / "f.txt").read_text() == content
    names = summaries((await handle.fetch_history()).events)
    assert names.count("write f.txt") == 2  # by reference, then with the arguments themselves
    assert sum(n.startswith("restore run log") for n in names) == 2  # each save's staged part, sent whole
    messages = sink.exports[-1].open().logical_resume.messages
    [write] = [b for m in messages for b in m.tool_uses() if b.name == "write"]
    assert write.input["content"] == content
    results = [b for m in messages for b in m.content if isinstance(b, ToolResultBlock)]
    assert results[-1].content.count("the quick brown fox") == 500


async def test_a_run_resumed_from_a_file_recovers_a_lost_store_from_that_file(
    client: Client, tmp_path: Path
) -> None:
    ws = workspace(tmp_path)
    reads = [read_call("r1", "a.txt"), read_call("r2", "a.txt")]
    source_config = scripted_config(tmp_path, [*reads, final("source done")], permissions=PERMISSIONS)
    queue = f"linear-{time.monotonic_ns()}"
    async with build_worker(client, AgentActivities(source_config), queue):
        await (await start(client, queue, ws, "read twice")).result()
    [path] = sorted((tmp_path / "exports").rglob("turn-000002-*.json"))
    resumed = [*reads, tool_call("l1", "ls", path="."), final("resumed done")]
    extra: dict[str, Any] = {"permissions": PERMISSIONS}
    here = scripted_config(tmp_path, resumed, store={"path": str(tmp_path / "store-a")}, **extra)
    there = scripted_config(tmp_path, resumed, store={"path": str(tmp_path / "store-b")}, **extra)
    sink = RecordingSink()
    async with build_worker(client, AgentActivities(here, sinks={"local": sink}), queue):
        handle = await resume_run(client, path, queue=queue, workspace=str(ws))
        await awaiting_approval(handle)
    result = await approve_on(client, AgentActivities(there, sinks={"local": sink}), queue, handle)
    assert result.status == "completed" and result.text == "resumed done", result
    assert not result.persistence_failures and [e.turn for e in result.exports] == [1]
    assert tool_results(sink.exports[-1].content) == ["r1", "r2", "l1"]
    run = sink.exports[-1].open().source_run()
    assert run.snapshot.resumed_from is not None and run.events[0].event.type == "run_start"
    assert any(s.startswith("restore run log") for s in summaries((await handle.fetch_history()).events))
