"""Hooks in runs (``workflows/hook_runner.py``): real runs on the Temporal dev server, a real
worker and the scripted model, with ``[hooks]`` commands run in the bubblewrap sandbox.

What is checked: a ``pre_tool_use`` hook that exits 2 keeps ``bash`` from running and the model
gets its reason; a ``post_tool_use`` formatter's edit is on disk; a failing hook is recorded and
the run goes on; a matcher that does not match runs nothing; the document on stdin; the
``user_prompt_submit`` and ``stop`` hooks (a refused first prompt fails the run, a refused
follow-up is dropped and the run waits again); the ``hook_run`` events in the exports and the
CLI's line for them; a cancel stops a hook; a worker killed mid-hook leaves it to another; and a
run without hooks schedules nothing new.
"""

from __future__ import annotations

import io
import json
import sys
from pathlib import Path
from typing import Any

import pytest
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowHandle

from durable_agent.activities import AgentActivities
from durable_agent.activities.workspaces.shadow import ShadowRepo
from durable_agent.cli.render import EventPrinter
from durable_agent.client import end_conversation, run_result, send_prompt, start_run
from durable_agent.core.activity_api import HOOK, MODEL_CALL, TOOL_CALL
from durable_agent.core.events import EventRecord, HookRunEvent, ToolEndEvent, UserMessageEvent
from durable_agent.core.models import Message, ToolResultBlock
from durable_agent.core.run_api import AgentRunInput
from durable_agent.workflows.patches import HOOKS_PATCH
from tests.helpers import (
    RecordingSink,
    final,
    read_call,
    running_worker,
    scripted_config,
    start,
    status_when,
    tool_call,
    until,
)
from tests.test_crash_recovery import (
    check_recovered_run,
    pending_activity,
    read_responses,
    retried_attempts,
    touching,
    until_alive,
    workers,
    write_setup,
)
from tests.test_sandbox import marker, none_left, processes_with

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="bubblewrap runs on Linux only")


async def scheduled(handle: WorkflowHandle[Any, Any]) -> list[str]:
    """The activity types the run scheduled, in order."""
    names = []
    async for event in handle.fetch_history_events():
        if event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
            names.append(event.activity_task_scheduled_event_attributes.activity_type.name)
    return names


async def has_patch_marker(handle: WorkflowHandle[Any, Any]) -> bool:
    async for event in handle.fetch_history_events():
        if event.event_type == EventType.EVENT_TYPE_MARKER_RECORDED and HOOKS_PATCH.encode() in (
            event.SerializeToString()
        ):
            return True
    return False


def last_export(sink: RecordingSink) -> tuple[list[EventRecord], tuple[Message, ...]]:
    """The events and conversation of the run's last export."""
    payload = sink.exports[-1].open()
    run = payload.source_run()
    return list(run.events), payload.logical_resume.messages


async def run_events(handle: WorkflowHandle[Any, Any]) -> list[EventRecord]:
    """Every event of the run (the ``events`` query, which a closed run answers too)."""
    events: list[EventRecord] = await handle.query("events", 0, result_type=list[EventRecord])
    return events


def hook_runs(records: list[EventRecord]) -> list[HookRunEvent]:
    return [r.event for r in records if isinstance(r.event, HookRunEvent)]


def result_of(messages: tuple[Message, ...], call_id: str) -> ToolResultBlock:
    return next(
        b for m in messages for b in m.content if isinstance(b, ToolResultBlock) and b.tool_use_id == call_id
    )


# --- a run with a hook at each moment ------------------------------------------------------------


async def test_hooks_block_format_fail_and_record_at_each_moment(client: Client, tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    outside = tmp_path / "outside"  # on the worker's machine, not in the sandbox
    outside.mkdir()
    hooks = {
        "pre_tool_use": [
            {"matcher": "bash", "command": 'cat > pre.json; echo "no shell today" >&2; exit 2'},
            {"matcher": "grep", "command": "touch never-ran"},
        ],
        "post_tool_use": [
            {
                "matcher": "write",
                "command": "cat > post.json; tr a-z A-Z < out.txt > out.tmp && mv out.tmp out.txt",
            },
            {"matcher": "write|bash", "command": "echo formatter crashed >&2; exit 1"},
        ],
        "user_prompt_submit": [
            {"command": f"cat > prompt.json; touch {outside}/escaped 2>/dev/null; exit 0"},
        ],
        "stop": [{"command": "cat > stop.json"}],
    }
    responses = [
        tool_call("b1", "bash", command="rm -rf /"),
        tool_call("w1", "write", file_path="out.txt", content="hello\n"),
        final("done"),
    ]
    config = scripted_config(
        tmp_path, responses, hooks=hooks, permissions={"allow": ["bash", "write(*)"], "default": "deny"}
    )
    sink = RecordingSink()
    async with running_worker(client, AgentActivities(config, sinks={"local": sink})) as queue:
        handle = await start(client, queue, ws, "tidy up")
        result = await run_result(client, handle.id)
        activities = await scheduled(handle)
        marked = await has_patch_marker(handle)
        events = await run_events(handle)
    assert result.status == "completed" and result.text == "done", result.error

    # the bash call never ran: one tool activity, the write's; and each hook was one activity
    assert activities.count(TOOL_CALL.name) == 1
    assert activities.count(HOOK.name) == 5 and marked
    records, messages = last_export(sink)
    blocked = result_of(messages, "b1")
    assert blocked.is_error and "no shell today" in blocked.content and "pre_tool_use" in blocked.content
    written = result_of(messages, "w1")
    assert not written.is_error and "post_tool_use" not in written.content  # an error adds nothing

    # the post_tool_use formatter ran after the write, on disk; the unmatched hook never ran
    assert (ws / "out.txt").read_text() == "HELLO\n"
    assert not (ws / "never-ran").exists()
    # in the sandbox: the worker's own /tmp (and what is beneath it) is not there
    assert not (outside / "escaped").exists()

    # the documents on stdin
    pre = json.loads((ws / "pre.json").read_text())
    assert pre["session_id"] == result.session_id and pre["run_id"] == result.run_id
    assert pre["hook_event_name"] == "PreToolUse" and pre["cwd"] == str(ws)
    assert (pre["tool_name"], pre["tool_use_id"], pre["tool_input"]) == (
        "bash",
        "b1",
        {"command": "rm -rf /"},
    )
    post = json.loads((ws / "post.json").read_text())
    assert post["hook_event_name"] == "PostToolUse" and post["tool_name"] == "write"
    assert post["tool_input"] == {"file_path": "out.txt", "content": "hello\n"}
    assert post["tool_response"]["is_error"] is False and post["tool_response"]["content"]
    prompt = json.loads((ws / "prompt.json").read_text())
    assert prompt["hook_event_name"] == "UserPromptSubmit" and prompt["prompt"] == "tidy up"
    stop = json.loads((ws / "stop.json").read_text())
    assert stop["hook_event_name"] == "Stop" and stop["status"] == "completed" and stop["result"] == "done"
    assert stop["stop_hook_active"] is False

    # the hook_run events, in order: the stop hook's before the run's end (after its last export)
    runs = hook_runs(events)
    assert [(r.event, r.hook, r.tool_name, r.decision) for r in runs] == [
        ("user_prompt_submit", 0, None, "continue"),
        ("pre_tool_use", 0, "bash", "block"),
        ("post_tool_use", 0, "write", "continue"),
        ("post_tool_use", 1, "write", "error"),
        ("stop", 0, None, "continue"),
    ]
    assert runs[1].reason == "no shell today" and runs[1].exit_code == 2 and runs[1].tool_use_id == "b1"
    assert runs[3].reason == "exit code 1: formatter crashed"
    assert [e.event.type for e in events[-2:]] == ["hook_run", "end"]
    assert hook_runs(records) == runs[:4]  # the exports hold those before its last boundary

    # the CLI's followers print them
    out = io.StringIO()
    printer = EventPrinter(out)
    for record in events:
        printer.show(record)
    printed = out.getvalue()
    assert "⚑ hook pre_tool_use[0] bash blocked: no shell today" in printed
    assert "⚑ hook post_tool_use[1] write failed: exit code 1: formatter crashed" in printed


async def test_a_post_tool_use_block_adds_its_reason_to_what_the_model_sees(
    client: Client, tmp_path: Path
) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "a.txt").write_text("alpha\n")
    hooks = {"post_tool_use": [{"matcher": "read", "command": 'echo "a.txt is stale" >&2; exit 2'}]}
    config = scripted_config(tmp_path, [read_call("r1", "a.txt"), final("ok")], hooks=hooks)
    sink = RecordingSink()
    async with running_worker(client, AgentActivities(config, sinks={"local": sink})) as queue:
        handle = await start(client, queue, ws)
        result = await run_result(client, handle.id)
    assert result.status == "completed", result.error
    _, messages = last_export(sink)
    seen = result_of(messages, "r1")
    assert "alpha" in seen.content and seen.content.endswith("a post_tool_use hook says: a.txt is stale")
    assert not seen.is_error  # the call ran


# --- prompts ------------------------------------------------------------------------------------


async def test_a_refused_first_prompt_fails_the_run_before_the_model_and_stop_still_runs(
    client: Client, tmp_path: Path
) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    hooks = {
        "user_prompt_submit": [{"command": 'echo "no prompts on Sundays" >&2; exit 2'}],
        "stop": [{"command": "cat > stop.json"}],
    }
    config = scripted_config(tmp_path, [final("never asked")], hooks=hooks)
    sink = RecordingSink()
    async with running_worker(client, AgentActivities(config, sinks={"local": sink})) as queue:
        handle = await start(client, queue, ws)
        result = await run_result(client, handle.id)
        activities = await scheduled(handle)
        events = await run_events(handle)
    assert result.status == "failed"
    assert result.error == "a user_prompt_submit hook refused the prompt: no prompts on Sundays"
    assert MODEL_CALL.name not in activities
    stop = json.loads((ws / "stop.json").read_text())
    assert stop["status"] == "failed" and "result" not in stop
    assert [(r.event, r.decision) for r in hook_runs(events)] == [
        ("user_prompt_submit", "block"),
        ("stop", "continue"),
    ]
    assert not sink.exports  # no tool boundary, no export


async def test_a_refused_follow_up_is_dropped_and_the_run_waits_again(client: Client, tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    check = 'grep -q forbidden && { echo "that word is not allowed" >&2; exit 2; }; exit 0'
    hooks = {"user_prompt_submit": [{"command": check}]}
    config = scripted_config(tmp_path, [final("first"), final("second")], hooks=hooks)
    async with running_worker(client, AgentActivities(config)) as queue:
        handle = await start(client, queue, ws, "hello", follow_ups=True)
        waiting = "awaiting_prompt"
        await status_when(handle, lambda s: s.status == waiting and s.turn == 0, "the first answer")
        await send_prompt(handle, "say something forbidden")

        async def refused() -> bool:
            events = await handle.query("events", 0, result_type=list[EventRecord])
            return any(isinstance(r.event, HookRunEvent) and r.event.decision == "block" for r in events)

        await until("the follow-up refused", refused)
        status = await status_when(handle, lambda s: s.status == waiting, "the run to wait again")
        await send_prompt(handle, "something fine")

        async def answered_twice() -> bool:
            events = await handle.query("events", 0, result_type=list[EventRecord])
            return sum(1 for r in events if r.event.type == "text_delta") == 2

        await until("the second answer", answered_twice)
        await status_when(handle, lambda s: s.status == waiting, "the run to wait a third time")
        await end_conversation(handle)
        result = await run_result(client, handle.id)
        events = await run_events(handle)
    assert status.status == waiting
    assert result.status == "completed" and result.text == "second", result.error
    # the refused prompt never joined the conversation: no user_message for it
    taken = [r.event.text for r in events if isinstance(r.event, UserMessageEvent)]
    assert taken == ["something fine"]
    runs = hook_runs(events)
    assert [r.decision for r in runs] == ["continue", "block", "continue"]
    assert runs[1].reason == "that word is not allowed"


# --- cancel and crash ---------------------------------------------------------------------------


async def test_a_cancel_while_a_hook_runs_stops_it_and_the_run(client: Client, tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "a.txt").write_text("alpha\n")
    mark = marker()
    hooks = {"pre_tool_use": [{"command": f"sleep {mark}"}]}
    config = scripted_config(tmp_path, [read_call("r1", "a.txt"), final("never")], hooks=hooks)
    async with running_worker(client, AgentActivities(config)) as queue:
        handle = await start(client, queue, ws)
        await until("the hook to run", lambda: processes_with(mark))
        await handle.signal("cancel", "stop the hook")
        result = await run_result(client, handle.id)
        activities = await scheduled(handle)
    assert result.status == "cancelled" and result.error == "stop the hook"
    assert await none_left(mark)
    assert TOOL_CALL.name not in activities


async def test_kill_9_while_a_hook_runs_leaves_it_to_another_worker(client: Client, tmp_path: Path) -> None:
    # the first prompt's hook waits for the test to create ``go``: in flight when the worker dies
    extra = """
[[hooks.user_prompt_submit]]
command = "while [ ! -e go ]; do sleep 0.05; done"
"""
    config, workspace, sink_root = write_setup(tmp_path, read_responses(delay_ms=50), extra)
    with workers(client, config, tmp_path) as procs:
        first = procs.start()
        handle = await start_run(
            client, AgentRunInput(prompt="read the files", workspace=str(workspace)), queue=procs.queue
        )

        async def hook_attempt_running(attempt: int) -> bool:
            pending = await pending_activity(handle, HOOK.name)
            return pending is not None and pending[0] >= attempt and pending[1]

        await until_alive("the hook to start", lambda: hook_attempt_running(1), 45, procs)
        procs.kill(first)
        second = procs.start()
        await until_alive("the hook to be retried", lambda: hook_attempt_running(2), 45, procs)
        async with touching(workspace / "go"):
            await check_recovered_run(handle, sink_root, (first.pid, second.pid))
    assert (await retried_attempts(handle, HOOK.name))[0] >= 2


# --- without hooks -----------------------------------------------------------------------------


async def test_a_run_without_hooks_schedules_nothing_new(client: Client, tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "a.txt").write_text("alpha\n")
    config = scripted_config(tmp_path, [read_call("r1", "a.txt"), final("ok")])
    sink = RecordingSink()
    async with running_worker(client, AgentActivities(config, sinks={"local": sink})) as queue:
        handle = await start(client, queue, ws)
        result = await run_result(client, handle.id)
        activities = await scheduled(handle)
    assert result.status == "completed"
    # the patch is asked (and its marker recorded) in every run's first task, hooks or not
    # (``starting.ask_patches_first``): what a run without hooks must not do is call one
    assert HOOK.name not in activities
    records, _ = last_export(sink)
    assert not hook_runs(records)
    assert '"hook_run"' not in sink.exports[-1].content


# --- hooks of a run whose workspace follows it -----------------------------------------------------


async def test_the_files_hooks_change_are_the_run_s_and_its_boundaries_record_them(
    client: Client, tmp_path: Path
) -> None:
    """A ``pre_tool_use`` and a ``post_tool_use`` hook that change files, in a run whose workspace
    follows it (the filesystem sink holds trees): each runs on the run's tree and its tree is
    recorded, so the next call, the call's ``tool_end`` and the run's change set have its files."""
    ws = tmp_path / "ws"
    ws.mkdir()
    hooks = {
        "pre_tool_use": [{"matcher": "bash", "command": "echo checked > pre.txt"}],
        "post_tool_use": [
            {"matcher": "write", "command": "tr a-z A-Z < out.txt > out.tmp && mv out.tmp out.txt"}
        ],
    }
    responses = [
        tool_call("w1", "write", file_path="out.txt", content="hello\n"),
        tool_call("b1", "bash", command="cat out.txt pre.txt"),
        final("done"),
    ]
    config = scripted_config(
        tmp_path, responses, hooks=hooks, permissions={"allow": ["bash", "write(*)"], "default": "deny"}
    )
    async with running_worker(client, AgentActivities(config)) as queue:
        handle = await start(client, queue, ws, "write and look")
        result = await run_result(client, handle.id)
        events = await run_events(handle)
    assert result.status == "completed", result.error
    ends = {r.event.id: r.event for r in events if isinstance(r.event, ToolEndEvent)}
    # the write's boundary has the tree the formatter left; the bash call ran on it, after the
    # pre_tool_use hook's file, and its boundary records both
    assert ends["b1"].output.splitlines()[:2] == ["HELLO", "checked"], ends["b1"].output
    assert ends["w1"].workspace is not None and ends["b1"].workspace is not None
    formatted = tmp_path / "formatted"
    formatted.mkdir()
    (formatted / "out.txt").write_text("HELLO\n")
    assert ends["w1"].workspace.tree == ShadowRepo(tmp_path / "check", formatted).record().tree
    assert result.workspace is not None and result.workspace.final == ends["b1"].workspace.tree
    assert set(result.workspace.files) == {"out.txt", "pre.txt"}
    assert "+HELLO" in result.workspace.diff and "+checked" in result.workspace.diff
