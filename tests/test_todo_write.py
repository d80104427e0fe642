"""``todo_write``: the model's plan, answered by the workflow itself and shown everywhere a
person looks (status, the UI's details, followers, the exports)."""

from __future__ import annotations

import io
import re
from pathlib import Path
from typing import Any

from temporalio.api.sdk.v1 import WorkflowMetadata
from temporalio.client import Client, WorkflowHandle

from durable_agent.activities import AgentActivities
from durable_agent.activities.sinks import read_export_file
from durable_agent.cli.render import EventPrinter, print_status
from durable_agent.client import follow_events, resume_run
from durable_agent.core.activity_api import TOOL_CALL
from durable_agent.core.builtin_catalog import BUILTIN_TOOLS
from durable_agent.core.events import TodoEvent, TodoItem, ToolEndEvent
from durable_agent.core.export import CheckpointPayload
from durable_agent.core.models import ToolResultBlock
from durable_agent.core.permissions import PermissionPolicy
from durable_agent.core.run_api import AgentRunResult
from durable_agent.core.todo_list import answer_todo_write, checklist_markdown
from durable_agent.core.tool_args import TODO_MAX_ITEMS
from durable_agent.core.tool_specs import in_workflow_policy, offered_tools
from tests.helpers import (
    RecordingSink,
    activity_calls,
    final,
    read_call,
    run_status,
    running_worker,
    scripted_config,
    start,
    tool_call,
    workspace_with,
)
from tests.test_cli import cli
from tests.test_replay import replayer

FIRST = [
    {"id": "plan", "content": "Read a.txt", "status": "in_progress"},
    {"id": "fix", "content": "Fix the bug", "status": "pending"},
    {"content": "Run the tests", "status": "pending"},
]
SECOND = [
    {"id": "plan", "content": "Read a.txt", "status": "completed"},
    {"id": "fix", "content": "Fix the bug", "status": "in_progress"},
    {"content": "Run the tests", "status": "pending"},
]


def todo_call(call_id: str, todos: list[dict[str, Any]]) -> dict[str, Any]:
    return tool_call(call_id, "todo_write", todos=todos)


def items(todos: list[dict[str, Any]]) -> tuple[TodoItem, ...]:
    return tuple(TodoItem.model_validate(t) for t in todos)


def results(payload: CheckpointPayload) -> dict[str, ToolResultBlock]:
    """The tool results of an export's conversation, by call id."""
    blocks = (b for m in payload.logical_resume.messages for b in m.content)
    return {b.tool_use_id: b for b in blocks if isinstance(b, ToolResultBlock)}


async def details(handle: WorkflowHandle[Any, Any]) -> str:
    """The UI's current details of the run (its latest execution)."""
    metadata = await handle.query("__temporal_workflow_metadata", result_type=WorkflowMetadata)
    shown: str = metadata.current_details
    return shown


async def test_the_plan_is_in_status_details_followers_and_exports(client: Client, tmp_path: Path) -> None:
    ws = workspace_with(tmp_path, {"a.txt": "alpha\n"})
    script = [todo_call("t1", FIRST), read_call("r1", "a.txt"), todo_call("t2", SECOND), final("planned")]
    sink = RecordingSink()
    config = scripted_config(tmp_path, script)
    async with running_worker(client, AgentActivities(config, sinks={"local": sink})) as queue:
        handle = await start(client, queue, ws, "plan, read, and say so")
        printed = io.StringIO()
        printer = EventPrinter(printed)
        async for record in follow_events(handle):
            printer.show(record)
        printer.finish()
        result: AgentRunResult = await handle.result()
        view = await run_status(handle)
        shown = await details(handle)
        status_cli = await cli("status", handle.id, client=client, cwd=tmp_path)
        history = await handle.fetch_history()
    assert (result.status, result.text, result.tool_calls_count) == ("completed", "planned", 3)
    # status: the newest list
    assert view.todos == items(SECOND)
    assert status_cli.code == 0, status_cli.err
    assert re.search(r"^plan:\s+3 tasks: 1 completed, 1 in progress, 1 pending$", status_cli.out, re.M)
    assert "☑ Read a.txt" in status_cli.out and "◐ Fix the bug" in status_cli.out
    out = io.StringIO()
    print_status(view, out)
    assert "☐ Run the tests" in out.getvalue()
    # followers: each list as it was written
    log = printed.getvalue()
    assert "→ todo_write" in log
    assert "☰ plan: 3 tasks: 0 completed, 1 in progress, 2 pending" in log
    assert "☰ plan: 3 tasks: 1 completed, 1 in progress, 1 pending" in log
    assert log.index("◐ Read a.txt") < log.index("☑ Read a.txt") < log.index("◐ Fix the bug")
    # the UI's details: the newest list as a checklist, under the counters
    assert "plan: 3 tasks: 1 completed, 1 in progress, 1 pending" in shown
    assert "- [x] Read a.txt\n- [~] Fix the bug\n- [ ] Run the tests" in shown
    assert shown.index("status: completed") < shown.index("- [x] Read a.txt")
    # the exports: both lists, as events; a boundary for each call, whose result says it was saved
    assert [e.descriptor.turn for e in sink.exports] == [1, 2, 3]
    last = sink.exports[-1].open()
    todos = [r.event for r in last.source_run().events if isinstance(r.event, TodoEvent)]
    assert [t.todos for t in todos] == [items(FIRST), items(SECOND)]
    said = results(last)
    assert not said["t1"].is_error
    assert said["t1"].content.startswith("The plan is saved (3 tasks: 0 completed, 1 in progress, 2 pending)")
    # answered by the workflow: the one tool activity is the read's, and the run replays
    assert [name for _, name in activity_calls(history.events)].count(TOOL_CALL.name) == 1
    replay = await replayer().replay_workflow(history, raise_on_replay_failure=False)
    assert replay.replay_failure is None, replay.replay_failure


async def test_an_invalid_list_is_a_tool_error_and_keeps_the_plan(client: Client, tmp_path: Path) -> None:
    ws = workspace_with(tmp_path, {})
    bad_status = [{"content": "Read a.txt", "status": "done"}]
    too_many = [{"content": f"task {i}", "status": "pending"} for i in range(TODO_MAX_ITEMS + 1)]
    script = [
        todo_call("t1", FIRST),
        todo_call("t2", bad_status),
        todo_call("t3", too_many),
        tool_call("t4", "todo_write", todo=FIRST),  # a misspelt argument
        final("kept"),
    ]
    sink = RecordingSink()
    config = scripted_config(tmp_path, script)
    async with running_worker(client, AgentActivities(config, sinks={"local": sink})) as queue:
        handle = await start(client, queue, ws, "plan badly")
        result = await handle.result()
        view = await run_status(handle)
    assert result.status == "completed" and result.tool_calls_count == 4
    assert view.todos == items(FIRST)  # the last valid list stands
    payload = sink.exports[-1].open()
    said = results(payload)
    assert said["t2"].is_error and "todos.0.status: Input should be 'pending'" in said["t2"].content
    assert said["t3"].is_error and f"at most {TODO_MAX_ITEMS} items" in said["t3"].content
    assert said["t4"].is_error and "todos: Field required" in said["t4"].content
    events = [r.event for r in payload.source_run().events]
    assert len([e for e in events if isinstance(e, TodoEvent)]) == 1
    ends = {e.id: e for e in events if isinstance(e, ToolEndEvent)}
    assert [ends[i].is_error for i in ("t1", "t2", "t3", "t4")] == [False, True, True, True]


async def test_the_plan_survives_continue_as_new(client: Client, tmp_path: Path) -> None:
    ws = workspace_with(tmp_path, {"a.txt": "alpha\n"})
    reads = [read_call(f"r{i}", "a.txt") for i in range(1, 7)]
    script = [todo_call("t1", SECOND), *reads, final("long")]
    sink = RecordingSink()
    config = scripted_config(tmp_path, script, limits={"continue_as_new_events": 50})
    async with running_worker(client, AgentActivities(config, sinks={"local": sink})) as queue:
        handle = await start(client, queue, ws, "plan, then read a lot")
        result = await handle.result()
        view = await run_status(handle)
        shown = await details(handle)
        history = await handle.fetch_history()  # the last execution's
    assert result.status == "completed" and result.tool_calls_count == 7
    started = history.events[0].workflow_execution_started_event_attributes
    assert started.continued_execution_run_id, "the run never continued as new"
    # the last execution never saw the call, and still knows the plan
    assert view.todos == items(SECOND)
    assert checklist_markdown(items(SECOND)) in shown
    events = [r.event for r in sink.exports[-1].open().source_run().events]
    assert [e.todos for e in events if isinstance(e, TodoEvent)] == [items(SECOND)]


async def test_only_a_deny_rule_keeps_the_plan_out(client: Client, tmp_path: Path) -> None:
    ws = workspace_with(tmp_path, {})
    script = [todo_call("t1", FIRST), final("done")]
    # default "ask", and no rule naming it: it runs, and no person is asked
    asking = scripted_config(tmp_path, script, permissions={"allow": [], "default": "ask"})
    async with running_worker(client, AgentActivities(asking)) as queue:
        handle = await start(client, queue, ws, "plan")
        result = await handle.result()
        view = await run_status(handle)
    assert result.status == "completed" and view.todos == items(FIRST)
    # a deny rule naming it: it is not offered, and a call of it is an unknown tool's
    denying = scripted_config(tmp_path, script, permissions={"allow": ["read(*)"], "deny": ["todo_write"]})
    sink = RecordingSink()
    async with running_worker(client, AgentActivities(denying, sinks={"local": sink})) as queue:
        handle = await start(client, queue, ws, "plan")
        result = await handle.result()
        view = await run_status(handle)
    assert result.status == "completed" and view.todos == ()
    payload = sink.exports[-1].open()
    assert "todo_write" not in payload.logical_resume.capability_binding.tools
    assert results(payload)["t1"].content.startswith("unknown tool 'todo_write'")


def test_the_rules_that_apply_are_the_deny_rules() -> None:
    specs = [BUILTIN_TOOLS["read"], BUILTIN_TOOLS["todo_write"]]

    def offered(**rules: Any) -> list[str]:
        return [s.name for s in offered_tools(specs, PermissionPolicy(**rules))]

    assert offered() == ["todo_write"]  # default deny does not apply to it
    assert offered(allow=("read(*)",), ask=("todo_write",)) == ["read", "todo_write"]
    assert offered(allow=("read(*)",), deny=("todo_write",)) == ["read"]
    assert offered(deny=("*",)) == []
    # it has no target: a rule with a pattern matches none of its calls
    policy = in_workflow_policy(PermissionPolicy(deny=("todo_write(x)",), ask=("todo_write",)))
    assert policy.decide("todo_write", None) == "allow"
    assert in_workflow_policy(PermissionPolicy(deny=("todo_*",))).decide("todo_write", None) == "deny"


def test_an_empty_list_clears_the_plan() -> None:
    empty = answer_todo_write({"todos": []})
    assert empty.todos == () and not empty.is_error and "cleared" in empty.text
    two = answer_todo_write({"todos": [{"content": "a", "status": "in_progress"}] * 2})
    assert two.todos is not None and "2 tasks are in progress" in two.text
    repeated = answer_todo_write({"todos": [{"id": "x", "content": "a", "status": "pending"}] * 2})
    assert repeated.is_error and "repeated: x" in repeated.text
    blank = answer_todo_write({"todos": [{"content": "  ", "status": "pending"}]})
    assert blank.is_error and "content must not be blank" in blank.text


async def test_a_run_resumed_from_an_export_shows_the_plan_it_was_exported_with(
    client: Client, tmp_path: Path
) -> None:
    ws = workspace_with(tmp_path, {"a.txt": "alpha\n"})
    script = [todo_call("t1", FIRST), read_call("r1", "a.txt"), read_call("r2", "a.txt"), final("done")]
    config = scripted_config(tmp_path, script)
    exports = tmp_path / "exports"
    async with running_worker(client, AgentActivities(config)) as queue:
        first = await (await start(client, queue, ws, "plan, then read", session_id="origin")).result()
        assert first.status == "completed", first.error
        before = set(exports.rglob("turn-*.json"))
        after_r1 = sorted(before)[1]  # turn 2: after the plan and r1
        # from a file on the worker, in another session (the default): the plan is there from
        # the start, and recorded as carried, so that the run's own exports hold it
        resumed = await resume_run(client, after_r1, queue=queue, workspace=str(ws))
        assert (await resumed.result()).status == "completed"
        assert (await run_status(resumed)).todos == items(FIRST)
        [again] = sorted(set(exports.rglob("turn-*.json")) - before)
        export = read_export_file(again)
        [carried] = [r.event for r in export.open().source_run().events if isinstance(r.event, TodoEvent)]
        assert carried.carried and carried.todos == items(FIRST)
        # it wrote no plan of its own, and its source run is in another session: a resume of its
        # export, in yet another session, still starts with the plan
        second = await resume_run(client, export, queue=queue, workspace=str(ws))  # by value
        assert (await second.result()).status == "completed"
        assert (await run_status(second)).todos == items(FIRST)
        # a run that wrote its plan records no carried one
        written = read_export_file(sorted(before)[-1]).open().source_run().events
        assert [r.event.carried for r in written if isinstance(r.event, TodoEvent)] == [False]
