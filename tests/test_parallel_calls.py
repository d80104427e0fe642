"""Parallel tool calls (``workflows/call_batch.py``): the calls of one answer that are safe together
run at once, their boundaries exported in the answer's order, and the calls that need a person's
decision are asked about together. Real Temporal, real workers, a scripted model."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

from temporalio.api.enums.v1 import EventType, PendingActivityState
from temporalio.client import Client, WorkflowHandle, WorkflowHistory
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.worker import Replayer

from durable_agent import AgentActivities, tool
from durable_agent.activities.mcp.catalog import mcp_tool
from durable_agent.activities.mcp.model_text import McpToolInfo
from durable_agent.client import run_result, start_run
from durable_agent.config import McpServerConfig, parse_config
from durable_agent.core.activity_api import TOOL_CALL
from durable_agent.core.builtin_catalog import BUILTIN_TOOLS
from durable_agent.core.events import (
    ConfirmationReceivedEvent,
    ConfirmationRequiredEvent,
    ToolEndEvent,
    ToolStartEvent,
)
from durable_agent.core.models import ToolDefinition, ToolUseBlock
from durable_agent.core.run_api import AgentRunInput, AgentRunResult, ApprovalAnswer, ApprovalDecision
from durable_agent.core.tool_specs import ToolOffer
from durable_agent.workflows import AgentRun
from durable_agent.workflows.call_batch import batches, worth_batching
from durable_agent.workflows.tool_step import Verdict
from tests.helpers import (
    RecordingSink,
    activity_calls,
    final,
    read_call,
    running_worker,
    scripted_config,
    start,
    status_when,
    tool_call,
    until,
    workspace_with,
)
from tests.test_crash_recovery import (
    N_CALLS,
    check_recovered_run,
    export_files,
    retried_attempts,
    touching,
    until_alive,
    workers,
    write_setup,
)

HISTORIES = Path(__file__).parent / "histories"


def answer(*responses: dict[str, Any]) -> dict[str, Any]:
    """One model answer holding the calls of ``responses`` (each made by ``tool_call``)."""
    return {"tool_calls": [call for r in responses for call in r["tool_calls"]]}


def five_reads() -> dict[str, Any]:
    return answer(*(read_call(f"r{i}", f"f{i}.txt") for i in range(1, 6)))


def files(tmp_path: Path, name: str = "workspace") -> Path:
    ws = workspace_with(tmp_path / name, {f"f{i}.txt": f"file {i}\n" for i in range(1, 6)})
    return ws


async def tool_activities(handle: WorkflowHandle[Any, Any]) -> list[tuple[str, int]]:
    """The history's tool activity events, in order: ``("scheduled"|"completed", scheduled id)``,
    and ``("local", id of the workflow task completion)`` for a local one's marker."""
    scheduled: set[int] = set()
    out: list[tuple[str, int]] = []
    task = 0
    async for event in handle.fetch_history_events():
        if event.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED:
            task = event.event_id
        elif activity_calls([event]) == [("local", TOOL_CALL.name)]:
            out.append(("local", task))
        elif event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
            if event.activity_task_scheduled_event_attributes.activity_type.name == TOOL_CALL.name:
                scheduled.add(event.event_id)
                out.append(("scheduled", event.event_id))
        elif event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED:
            done = event.activity_task_completed_event_attributes.scheduled_event_id
            if done in scheduled:
                out.append(("completed", done))
    return out


def shape(tool_events: list[tuple[str, int]]) -> str:
    """``SSSCC…``: the order tool activities were scheduled (S) and completed (C) in."""
    return "".join(kind[0].upper() for kind, _ in tool_events)


def normalised(value: Any, ids: dict[str, str]) -> Any:
    """An export's payload without what differs between two runs of the same calls: times, the
    run's ids, the digests of exports (which cover those)."""
    if isinstance(value, dict):
        return {
            k: normalised(v, ids)
            for k, v in value.items()
            if not k.endswith("_ms") and k not in ("content_digest", "created_at", "updated_at")
        }
    if isinstance(value, list):
        return [normalised(v, ids) for v in value]
    if isinstance(value, str):
        for real, placeholder in ids.items():
            value = value.replace(real, placeholder)
    return value


def export_series(sink: RecordingSink, result: AgentRunResult) -> list[str]:
    """Each export's normalised content, in the order the sink took them."""
    ids = {result.run_id: "RUN", result.session_id: "SESSION"}
    out = []
    for export in sink.exports:
        payload = json.loads(export.content)
        out.append(json.dumps(normalised(payload, ids), sort_keys=True))
    return out


async def run_five_reads(client: Client, tmp_path: Path, name: str, **tools: Any) -> tuple[Any, ...]:
    ws = files(tmp_path, name)
    config = scripted_config(tmp_path / name, [five_reads(), final("five read")], tools=tools)
    sink = RecordingSink()
    async with running_worker(client, AgentActivities(config, sinks={"local": sink})) as queue:
        handle = await start(client, queue, ws, "read five files", session_id=f"s-{name}")
        result = await run_result(client, handle.id)
        events = await tool_activities(handle)
    return result, sink, events


async def test_five_reads_run_together_and_export_as_one_after_another(
    client: Client, tmp_path: Path
) -> None:
    remote = {"local_calls": False}
    together, together_sink, together_events = await run_five_reads(client, tmp_path, "on", **remote)
    alone, alone_sink, alone_events = await run_five_reads(
        client, tmp_path, "off", parallel_calls=False, **remote
    )
    local, local_sink, local_events = await run_five_reads(client, tmp_path, "local")
    assert together.status == alone.status == local.status == "completed"
    # all five scheduled in one workflow task, before any completed; one after another without
    assert shape(together_events) == "SSSSSCCCCC"
    assert shape(alone_events) == "SC" * 5
    # as local activities (the default for reads), all five within one workflow task
    assert shape(local_events) == "LLLLL" and len({task for _, task in local_events}) == 1
    # the same series of exports, turn by turn, digest by digest (times and ids left out)
    for sink in (together_sink, alone_sink, local_sink):
        assert [e.descriptor.turn for e in sink.exports] == [1, 2, 3, 4, 5]
    ours, theirs = export_series(together_sink, together), export_series(alone_sink, alone)
    inside = export_series(local_sink, local)
    assert len(ours) == len(theirs) == len(inside) == 5
    for turn, (a, b, c) in enumerate(zip(ours, theirs, inside, strict=True), 1):
        assert a == b == c, f"export {turn} differs"
    events = [r.event for r in together_sink.exports[-1].open().source_run().events]
    tools = [(type(e).__name__, e.id) for e in events if isinstance(e, ToolStartEvent | ToolEndEvent)]
    assert tools == [(kind, f"r{i}") for i in range(1, 6) for kind in ("ToolStartEvent", "ToolEndEvent")]


async def test_a_slow_read_only_tool_runs_its_calls_at_once(client: Client, tmp_path: Path) -> None:
    # three calls that each wait for the other two: they finish only if all three run at once
    barrier = asyncio.Barrier(3)

    @tool(read_only=True)
    async def meet(who: str) -> str:
        """Wait for two others, then answer.

        Args:
            who: who comes.
        """
        await asyncio.wait_for(barrier.wait(), 15)
        return f"{who} met the others"

    calls = answer(*(tool_call(f"m{i}", "meet", who=f"n{i}") for i in range(3)))
    config = scripted_config(tmp_path, [calls, final("met")], permissions={"allow": ["meet"]})
    sink = RecordingSink()
    async with running_worker(client, AgentActivities(config, tools=[meet], sinks={"local": sink})) as queue:
        handle = await start(client, queue, files(tmp_path))
        result = await asyncio.wait_for(run_result(client, handle.id), 60)
    assert result.status == "completed", result.error
    events = [r.event for r in sink.exports[-1].open().source_run().events]
    ends = [e for e in events if isinstance(e, ToolEndEvent)]
    assert [(e.id, e.is_error) for e in ends] == [("m0", False), ("m1", False), ("m2", False)]


async def test_a_write_between_reads_runs_alone_in_its_place(client: Client, tmp_path: Path) -> None:
    ws = files(tmp_path)
    calls = answer(
        read_call("r1", "f1.txt"),
        read_call("r2", "f2.txt"),
        tool_call("w1", "write", file_path="new.txt", content="written\n"),
        read_call("r3", "new.txt"),
        read_call("r4", "f4.txt"),
    )
    config = scripted_config(
        tmp_path, [calls, final()], permissions={"allow": ["read(*)", "write(*)"], "default": "deny"}
    )
    sink = RecordingSink()
    async with running_worker(client, AgentActivities(config, sinks={"local": sink})) as queue:
        handle = await start(client, queue, ws)
        result = await run_result(client, handle.id)
        events = await tool_activities(handle)
    assert result.status == "completed", result.error
    # r1 and r2 together (local activities, in one workflow task); the write alone once they
    # are done; then r3 and r4 together, in the task its completion starts
    assert shape(events) == "LL" + "SC" + "LL"
    tasks = [task for kind, task in events if kind == "local"]
    assert tasks[0] == tasks[1] < tasks[2] == tasks[3], events
    run_events = [r.event for r in sink.exports[-1].open().source_run().events]
    ends = [e for e in run_events if isinstance(e, ToolEndEvent)]
    assert [e.id for e in ends] == ["r1", "r2", "w1", "r3", "r4"]
    assert "written" in ends[3].output  # r3 read what the write, before it, wrote
    assert [e.descriptor.turn for e in sink.exports] == [1, 2, 3, 4, 5]


async def test_two_calls_that_need_approval_are_asked_together(client: Client, tmp_path: Path) -> None:
    ws = files(tmp_path)
    (ws / "src").mkdir()
    calls = answer(
        tool_call("l1", "ls", path="."), read_call("r1", "f1.txt"), tool_call("l2", "ls", path="src")
    )
    config = scripted_config(
        tmp_path, [calls, final()], permissions={"allow": ["read(*)"], "ask": ["ls"], "default": "deny"}
    )
    sink = RecordingSink()
    async with running_worker(client, AgentActivities(config, sinks={"local": sink})) as queue:
        handle = await start(client, queue, ws)
        both = await status_when(handle, lambda s: len(s.pending_approvals) == 2, "two calls waiting at once")
        assert [p.call_id for p in both.pending_approvals] == ["l1", "l2"]
        assert both.status == "awaiting_approval" and both.turn == 0  # nothing ran meanwhile
        no = ApprovalDecision(call_id="l2", approved=False, reason="not src")
        answer_l2 = await handle.execute_update("approve", no, result_type=ApprovalAnswer)
        assert not answer_l2.approved
        still = await status_when(handle, lambda s: len(s.pending_approvals) == 1, "one call left")
        assert [p.call_id for p in still.pending_approvals] == ["l1"]
        yes = ApprovalDecision(call_id="l1", approved=True)
        await handle.execute_update("approve", yes, result_type=ApprovalAnswer)
        result = await run_result(client, handle.id)
    assert result.status == "completed", result.error
    events = [r.event for r in sink.exports[-1].open().source_run().events]
    asked = [i for i, e in enumerate(events) if isinstance(e, ConfirmationRequiredEvent)]
    answered = [i for i, e in enumerate(events) if isinstance(e, ConfirmationReceivedEvent)]
    assert len(asked) == len(answered) == 2 and max(asked) < min(answered)
    ends = {e.id: e for e in events if isinstance(e, ToolEndEvent)}
    assert list(ends) == ["l1", "r1", "l2"]
    assert not ends["l1"].is_error and not ends["r1"].is_error
    assert ends["l2"].is_error and "not approved: not src" in ends["l2"].output


async def test_a_cancel_during_a_batch_cancels_its_activities(client: Client, tmp_path: Path) -> None:
    started: list[str] = []
    cancelled: list[str] = []
    forever = asyncio.Event()

    @tool(read_only=True)
    async def wait_long(who: str) -> str:
        """Wait until cancelled.

        Args:
            who: who waits.
        """
        started.append(who)
        try:
            await forever.wait()
        except asyncio.CancelledError:
            cancelled.append(who)
            raise
        return who

    calls = answer(*(tool_call(f"w{i}", "wait_long", who=f"n{i}") for i in range(3)))
    config = scripted_config(tmp_path, [calls, final("never")], permissions={"allow": ["wait_long"]})
    sink = RecordingSink()
    acts = AgentActivities(config, tools=[wait_long], sinks={"local": sink})
    async with running_worker(client, acts) as queue:
        handle = await start(client, queue, files(tmp_path))
        await until("the three calls to run", lambda: len(started) == 3)
        await handle.signal("cancel", "stop the batch")
        result = await asyncio.wait_for(run_result(client, handle.id), 60)
        await until("the three activities to be cancelled", lambda: len(cancelled) == 3)
    assert result.status == "cancelled" and result.error == "stop the batch"
    assert result.tool_calls_count == 0 and not sink.exports  # no result of the batch was recorded
    assert sorted(cancelled) == ["n0", "n1", "n2"]


async def test_kill_9_during_a_batch_loses_nothing(client: Client, tmp_path: Path) -> None:
    # the 2nd answer: two bash calls made parallel by the config, each waiting for ``go``, and a read
    wait = "while [ ! -e go ]; do sleep 0.05; done; cat "
    responses: list[dict[str, Any]] = [
        read_call("r1", "file1.txt"),
        answer(
            tool_call("b2", "bash", command=wait + "file2.txt"),
            tool_call("b3", "bash", command=wait + "file3.txt"),
            read_call("r4", "file4.txt"),
        ),
        answer(read_call("r5", "file5.txt"), read_call("r6", "file6.txt")),
        {"text": "read every file"},
    ]
    config, workspace, sink_root = write_setup(tmp_path, responses, '\n[tools]\nparallel = ["bash"]\n')
    with workers(client, config, tmp_path) as procs:
        first = procs.start()
        handle = await start_run(
            client, AgentRunInput(prompt="read the files", workspace=str(workspace)), queue=procs.queue
        )

        async def batch_running(attempt: int) -> bool:
            desc = await handle.describe()
            running = [
                pa
                for pa in desc.raw_description.pending_activities
                if pa.activity_type.name == TOOL_CALL.name
                and pa.attempt >= attempt
                and pa.state == PendingActivityState.PENDING_ACTIVITY_STATE_STARTED
            ]
            return len(running) == 2  # the two bash calls (the read is done)

        await until_alive("the batch to run", lambda: batch_running(1), 45, procs)
        assert len(export_files(sink_root)) == 1
        procs.kill(first)
        second = procs.start()
        await until_alive("the batch to run again", lambda: batch_running(2), 45, procs)
        async with touching(workspace / "go"):
            result = await check_recovered_run(handle, sink_root, (first.pid, second.pid))
    assert result.tool_calls_count == N_CALLS
    attempts = await retried_attempts(handle, TOOL_CALL.name)
    assert sorted(attempts)[-2:] == [2, 2], attempts  # the two bash calls ran again; nothing else did
    payload = read_last_export(sink_root)
    ends = [e for e in payload if e["type"] == "tool_end"]
    assert [e["id"] for e in ends] == ["r1", "b2", "b3", "r4", "r5", "r6"]


def read_last_export(sink_root: Path) -> list[dict[str, Any]]:
    """The events of the run's last export, as JSON."""
    from durable_agent.activities.sinks import read_export_file

    last = export_files(sink_root)[-1]
    export = read_export_file(last)
    return [r.event.model_dump(mode="json") for r in export.open().source_run().events]


async def test_old_and_new_histories_replay(tmp_path: Path) -> None:
    """A run recorded before parallel calls (two reads of one answer, one after another) replays
    one call at a time; the one recorded with them replays through the patch."""
    replayer = Replayer(workflows=[AgentRun], data_converter=pydantic_data_converter)
    for name in ("agent_run_continued_v5.json", "agent_run_approval_v5.json", "agent_run_parallel_v8.json"):
        history = WorkflowHistory.from_json(name, (HISTORIES / name).read_text())
        replay = await replayer.replay_workflow(history, raise_on_replay_failure=False)
        assert replay.replay_failure is None, f"{name}: {replay.replay_failure}"


# --- which calls run together --------------------------------------------------------------


def offer(name: str, parallel: bool) -> ToolOffer:
    definition = ToolDefinition(name=name, description=name, input_schema={"type": "object"})
    return ToolOffer(definition=definition, target_arg=None, parallel=parallel)


def verdict(name: str, parallel: bool, *, error: bool = False) -> Verdict:
    call = ToolUseBlock(id=name, name=name, input={})
    if error:
        return Verdict(call, None, "deny", error="unknown tool")
    return Verdict(call, offer(name, parallel), "allow")


def test_consecutive_safe_calls_make_a_batch_and_any_other_runs_alone() -> None:
    v = [
        verdict("a", True),
        verdict("b", True),
        verdict("unknown", False, error=True),
        verdict("w", False),
        verdict("c", True),
        verdict("d", False),
        verdict("e", False),
    ]
    refused = [False, False, False, False, False, True, False]
    # a refused call (d) runs nothing: it joins the safe call before it
    assert batches(v, refused) == [[0, 1, 2], [3], [4, 5], [6]]
    assert batches([], []) == []


def test_the_offers_say_which_tools_run_together(tmp_path: Path) -> None:
    reads = {name for name, spec in BUILTIN_TOOLS.items() if spec.offer().parallel}
    assert {"read", "ls", "glob", "grep", "web_fetch"} <= reads
    assert not reads & {"write", "edit", "multi_edit", "apply_patch", "bash"}
    assert "parallel" not in offer("x", False).model_dump()  # a plan without it keeps its bytes
    assert (
        ToolOffer.model_validate({"definition": offer("x", False).definition.model_dump()}).parallel is False
    )
    config = parse_config({"tools": {"parallel": ["bash"]}}, tmp_path)
    assert config.tools.runs_together("bash", False) and config.tools.runs_together("read", True)
    assert not config.tools.runs_together("write", False)
    off = parse_config({"tools": {"parallel_calls": False, "parallel": ["bash"]}}, tmp_path)
    assert not off.tools.runs_together("read", True) and not off.tools.runs_together("bash", False)

    @tool(read_only=True)
    def look(path: str) -> str:
        """Look.

        Args:
            path: where.
        """
        return path

    assert look.spec.offer().parallel

    class Server:
        name = "srv"

    server: Any = Server()
    marked = McpToolInfo(name="q", description="", input_schema={"type": "object"}, read_only=True)
    unmarked = McpToolInfo(name="w", description="", input_schema={"type": "object"})
    mcp = McpServerConfig(command="true")
    assert mcp_tool(server, mcp, marked).spec.offer().parallel
    assert not mcp_tool(server, mcp, unmarked).spec.offer().parallel


def test_an_answer_is_batched_only_when_some_of_its_calls_would_run_otherwise(tmp_path: Path) -> None:
    from durable_agent.core.permissions import PermissionPolicy
    from durable_agent.core.plan import RunPlan

    def plan_with(**rules: Any) -> RunPlan:
        fields = {
            "tools": (offer("read", True), offer("ls", True), offer("write", False)),
            "permissions": PermissionPolicy(**rules),
            "workspace": str(tmp_path),
        }
        return cast(RunPlan, SimpleNamespace(**fields))

    def calls(*names: str, ids: tuple[str, ...] | None = None) -> list[ToolUseBlock]:
        return [ToolUseBlock(id=(ids or names)[i] + str(i), name=n, input={}) for i, n in enumerate(names)]

    allow = plan_with(allow=("read", "ls", "write"))
    assert worth_batching(allow, calls("read", "ls"))
    assert not worth_batching(allow, calls("read", "write", "read"))
    assert not worth_batching(allow, calls("read"))
    asking = plan_with(ask=("write",))
    assert worth_batching(asking, calls("write", "write"))
    assert not worth_batching(asking, [ToolUseBlock(id="x", name="read", input={})] * 2)  # one id twice
