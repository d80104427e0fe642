"""Calls of the quick built-in tools as local activities (``[tools] local_calls``): a step is one
workflow task, the outputs are in the history as markers, and a worker killed after a
boundary's export but before its workflow task completed loses nothing and exports nothing
twice. Real Temporal, real worker processes, a scripted model."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowHandle
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment

from durable_agent import AgentActivities
from durable_agent.activities.sinks import read_export_file
from durable_agent.client import run_result, start_run
from durable_agent.core.activity_api import MODEL_CALL, TOOL_CALL, FinishRunInput
from durable_agent.core.events import EventRecord, PermissionDeniedEvent, ToolEndEvent
from durable_agent.core.models import Message, TextBlock, ToolResultBlock
from durable_agent.core.run_api import AgentRunInput
from durable_agent.core.run_log import GENESIS, LogDelta, LogEntry, LogRef, recorded_result
from tests.helpers import (
    activity_calls,
    final,
    read_call,
    running_worker,
    scripted_config,
    start,
    until,
    workspace_with,
)
from tests.test_crash_recovery import (
    N_CALLS,
    check_recovered_run,
    export_files,
    read_responses,
    workers,
    write_setup,
)

REPO_ROOT = Path(__file__).resolve().parent.parent


async def activity_kinds(handle: WorkflowHandle[Any, Any]) -> list[tuple[str, str]]:
    return activity_calls([e async for e in handle.fetch_history_events()])


async def workflow_tasks(handle: WorkflowHandle[Any, Any]) -> int:
    completed = EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED
    return len([e async for e in handle.fetch_history_events() if e.event_type == completed])


async def run_reads(client: Client, tmp_path: Path, **tools: Any) -> tuple[Any, WorkflowHandle[Any, Any]]:
    ws = workspace_with(tmp_path / "ws", {f"f{i}.txt": f"file {i}\n" for i in range(1, 4)})
    steps = [read_call(f"r{i}", f"f{i}.txt") for i in range(1, 4)]
    config = scripted_config(tmp_path, [*steps, final("read three")], tools=tools)
    async with running_worker(client, AgentActivities(config)) as queue:
        handle = await start(client, queue, ws, "read three files")
        result = await run_result(client, handle.id)
    return result, handle


async def test_a_read_runs_as_a_local_activity_and_a_step_is_one_workflow_task(
    client: Client, tmp_path: Path
) -> None:
    result, handle = await run_reads(client, tmp_path / "local")
    assert result.status == "completed", result.error
    assert result.tool_calls_count == 3 and [e.turn for e in result.exports] == [1, 2, 3]
    kinds = await activity_kinds(handle)
    tool_calls = [where for where, name in kinds if name == TOOL_CALL.name]
    assert tool_calls == ["local"] * 3, kinds
    assert [where for where, name in kinds if name == MODEL_CALL.name] == ["remote"] * 4
    local_tasks = await workflow_tasks(handle)

    # the same run with ordinary activities: one more workflow task a step
    off, off_handle = await run_reads(client, tmp_path / "remote", local_calls=False)
    assert off.status == "completed", off.error
    assert [w for w, name in await activity_kinds(off_handle) if name == TOOL_CALL.name] == ["remote"] * 3
    assert await workflow_tasks(off_handle) == local_tasks + 3
    # and the same conversation
    ours = result.exports[-1]
    theirs = off.exports[-1]
    assert ours.turn == theirs.turn == 3


async def test_a_finish_run_again_after_it_kept_the_record_is_done(client: Client, tmp_path: Path) -> None:
    # agent.finish_run (a local activity) keeps the record, drops the log, then times out: the
    # attempt after it finds no log, and the record kept is the answer
    ws = workspace_with(tmp_path / "ws", {"f1.txt": "file 1\n"})
    config = scripted_config(tmp_path, [read_call("r1", "f1.txt"), final("read it")])
    acts = AgentActivities(config)
    async with running_worker(client, acts) as queue:
        handle = await start(client, queue, ws, "read a file")
        result = await run_result(client, handle.id)
    assert result.status == "completed"
    again = FinishRunInput(
        log=LogRef(run_id=result.run_id, version=3, digest=GENESIS),
        events=(),
        status="completed",
        updated_at_ms=0,
        session_id=result.session_id,
    )
    env = ActivityEnvironment()
    await env.run(acts.run_logs.finish_run, again)  # no error: it is done
    # another end than the one kept is not this finish: the log is missing, as it says
    with pytest.raises(ApplicationError, match=r"no header"):
        await env.run(acts.run_logs.finish_run, again.model_copy(update={"status": "failed"}))
    # a workflow before the field existed sends no session: nothing to look in
    with pytest.raises(ApplicationError):
        await env.run(acts.run_logs.finish_run, again.model_copy(update={"session_id": None}))


def entry(version: int, parent: str, delta: LogDelta) -> LogEntry:
    return LogEntry(version=version, parent=parent, delta=delta, digest=delta.chained(parent))


def test_a_recorded_result_is_found_only_after_what_the_workflow_knows() -> None:
    after = LogRef(run_id="r", version=3, digest="sha256:" + "1" * 64)
    result = ToolResultBlock(tool_use_id="c1", content="file 1\n")
    delta = LogDelta(
        messages=(Message(role="user", content=(result,)),),
        events=(
            EventRecord(
                sequence=9, timestamp_ms=1234, event=ToolEndEvent.of("c1", "read", "file 1\n", False)
            ),
        ),
    )
    found = recorded_result([entry(4, after.digest, delta)], after, "c1")
    assert found is not None and found.block == result and found.ended_at_ms == 1234 and not found.denied
    assert recorded_result([entry(4, after.digest, delta)], after, "c2") is None  # another call
    assert recorded_result([entry(4, GENESIS, delta)], after, "c1") is None  # not after ``after``
    assert recorded_result([entry(5, after.digest, delta)], after, "c1") is None  # a gap
    assert recorded_result([], after, "c1") is None
    # a result without its ``tool_end`` is not a boundary's: not taken
    bare = LogDelta(messages=(Message(role="user", content=(result,)),))
    assert recorded_result([entry(4, after.digest, bare)], after, "c1") is None
    # a call refused by the path it resolved to keeps its refusal
    refused = delta.model_copy(
        update={
            "events": (
                EventRecord(
                    sequence=8,
                    timestamp_ms=1200,
                    event=PermissionDeniedEvent(id="c1", name="read", reason="no"),
                ),
                *delta.events,
            )
        }
    )
    found = recorded_result([entry(4, after.digest, refused)], after, "c1")
    assert found is not None and found.denied
    # text of a person's joining the results does not hide them
    joined = LogDelta(extend_last=(result, TextBlock(text="go on")), events=delta.events)
    assert recorded_result([entry(4, after.digest, joined)], after, "c1") is not None


async def test_kill_9_after_a_local_reads_export_keeps_its_output(client: Client, tmp_path: Path) -> None:
    # The first worker's sink dies right after it holds turn 2's export, having changed
    # file2.txt: run again, the read of it would return something else. The second worker
    # runs the lost workflow task again; the read gives back what the export holds.
    config, workspace, sink_root = write_setup(tmp_path, read_responses(delay_ms=100))
    changed = workspace / "file2.txt"
    original = changed.read_text()
    with workers(client, config, tmp_path) as procs:
        first = procs.start(str(REPO_ROOT / "tests" / "dying_sink_worker.py"), "2", str(changed))
        handle = await start_run(
            client, AgentRunInput(prompt="read the files", workspace=str(workspace)), queue=procs.queue
        )

        async def died() -> bool:
            return first.poll() is not None

        await until("the first worker to die after turn 2's export", died, 45)
        assert changed.read_text() != original, "the first worker did not die where it should"
        assert len(export_files(sink_root)) == 2
        second = procs.start()
        result = await check_recovered_run(handle, sink_root, (first.pid, second.pid))
        log = procs.log_text()
    assert "its boundary was exported already" in log
    # the conversation holds what the read returned before the kill, as turn 2's export does
    last = read_export_file(max(export_files(sink_root))).open()
    results = [
        b.content
        for m in last.logical_resume.messages
        for b in m.content
        if isinstance(b, ToolResultBlock) and b.tool_use_id == "r2"
    ]
    assert len(results) == 1 and "written after the export" not in results[0] and "evidence 2" in results[0]
    assert result.tool_calls_count == N_CALLS
    # the lost workflow task timed out, and the next one ran it again
    timed_out = [
        e
        async for e in handle.fetch_history_events()
        if e.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_TIMED_OUT
    ]
    assert timed_out
