"""Hooks (``[hooks]``): the config and its checks, the matcher, the document a hook reads, and the
``agent.hook`` activity running real commands in the bash tool's sandbox, through a real
Temporal worker and the workflow's own ``CallRunner``."""

from __future__ import annotations

import json
import sys
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from temporalio import workflow
from temporalio.client import Client
from temporalio.exceptions import ActivityError
from temporalio.worker import UnsandboxedWorkflowRunner, Worker

from durable_agent.activities.hook_call import HookCalls
from durable_agent.activities.redact import Redactor
from durable_agent.activities.resolve_run import RunPlanner
from durable_agent.activities.tools.builtin import builtin_tools
from durable_agent.config import ConfigError, SandboxConfig, load_config, parse_config
from durable_agent.core.activity_api import HOOK, HOOK_MARGIN_SECONDS, ResolveInput, hook_call
from durable_agent.core.events import EventRecord, HookRunEvent
from durable_agent.core.hooks import (
    HOOK_VALUE_MAX_CHARS,
    HookConfig,
    HookDocument,
    HookEventName,
    HookInput,
    HookOutcome,
    HooksConfig,
    block_reason,
    failed_outcome,
    hook_document,
    hook_event,
    hooks_for,
    matches,
)
from durable_agent.core.models import Frozen
from durable_agent.core.plan import RunPlan, Timeouts
from durable_agent.core.run_api import RunSettings
from durable_agent.workflows.calls import CallRunner, Cancellation, RunCancelled
from tests.helpers import scripted_config, until
from tests.test_sandbox import marker, none_left, processes_with

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="bubblewrap runs on Linux only")

SECRET = "hook-secret-value-0123456789"


def config_with(hooks: dict[str, Any]) -> HooksConfig:
    return parse_config({"hooks": hooks}, Path(".")).hooks


# --- the config ----------------------------------------------------------------------------------


def test_hooks_load_from_toml_as_arrays_of_tables(tmp_path: Path) -> None:
    file = tmp_path / "agent.toml"
    file.write_text(
        """
[[hooks.pre_tool_use]]
matcher = "bash|write"
command = "./check.sh"
timeout_seconds = 5

[[hooks.pre_tool_use]]
command = "true"

[[hooks.stop]]
command = "echo done"
""",
        encoding="utf-8",
    )
    hooks = load_config(file).hooks
    assert hooks.pre_tool_use == (
        HookConfig(matcher="bash|write", command="./check.sh", timeout_seconds=5),
        HookConfig(command="true"),
    )
    assert hooks.stop == (HookConfig(command="echo done"),)
    assert hooks.post_tool_use == () and not hooks.empty
    assert load_config(None).hooks.empty  # none by default


@pytest.mark.parametrize(
    ("hooks", "said"),
    [
        ({"PreToolUse": [{"command": "x"}]}, "unknown hook event 'PreToolUse' (write it pre_tool_use)"),
        (
            {"on_start": [{"command": "x"}]},
            "the events are pre_tool_use, post_tool_use, user_prompt_submit, stop",
        ),
        ({"pre_tool_use": [{"command": "x", "matcher": "(["}]}, "not a valid regular expression (RE2)"),
        ({"stop": [{"command": "x", "matcher": "bash"}]}, "stop[0]: matcher 'bash' is for the tool events"),
        ({"pre_tool_use": [{"command": ""}]}, "hooks.pre_tool_use.0.command"),
        ({"pre_tool_use": [{"command": "x", "timeout_seconds": 0}]}, "timeout_seconds"),
        ({"pre_tool_use": [{"command": "x", "timeout": 5}]}, "timeout"),  # Claude Code's key is not ours
        ({"stop": [{"command": "x" * 8000}] * 5}, "over 32768"),
    ],
)
def test_a_bad_hook_is_refused_with_where_and_why(hooks: dict[str, Any], said: str) -> None:
    with pytest.raises(ConfigError) as refused:
        config_with(hooks)
    assert said in str(refused.value)


def test_an_empty_or_star_matcher_is_allowed_on_every_event() -> None:
    hooks = config_with(
        {"stop": [{"command": "x", "matcher": "*"}], "user_prompt_submit": [{"command": "y"}]}
    )
    assert len(hooks.stop) == 1 and len(hooks.user_prompt_submit) == 1


# --- the matcher -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("matcher", "tool", "expected"),
    [
        ("", "bash", True),
        ("*", "mcp__db__query", True),
        ("bash", "bash", True),
        ("bash", "Bash", False),  # case-sensitive, as Claude Code's
        ("bas", "bash", False),  # a plain name is exact, not a part
        ("write|edit", "edit", True),
        ("write|edit", "read", False),
        ("^mcp__", "mcp__db__query", True),
        ("^mcp__", "bash", False),
        ("mcp__db__.*", "mcp__db__query", True),
        ("mcp__db__.*", "mcp__web__fetch", False),
        ("ba.h", "xbashx", True),  # a regular expression is searched for, as in Claude Code
    ],
)
def test_the_matcher_works_as_claude_codes(matcher: str, tool: str, expected: bool) -> None:
    assert matches(matcher, tool) is expected


def test_hooks_for_keeps_the_order_and_each_hooks_index() -> None:
    hooks = config_with(
        {
            "pre_tool_use": [
                {"command": "a", "matcher": "write"},
                {"command": "b"},
                {"command": "c", "matcher": "bash|write"},
            ],
            "stop": [{"command": "d"}],
        }
    )
    assert [(r.index, r.hook.command) for r in hooks_for(hooks, "pre_tool_use", "write")] == [
        (0, "a"),
        (1, "b"),
        (2, "c"),
    ]
    assert [r.index for r in hooks_for(hooks, "pre_tool_use", "bash")] == [1, 2]
    assert hooks_for(hooks, "post_tool_use", "bash") == ()
    assert [r.hook.command for r in hooks_for(hooks, "stop")] == ["d"]


# --- the document and the outcome ------------------------------------------------------------------


def document(event: HookEventName, **fields: Any) -> HookDocument:
    return hook_document(event, session_id="s1", run_id="r1", workspace="/work/ws", **fields)


def test_each_event_sends_claude_codes_fields_and_only_its_own() -> None:
    pre = document("pre_tool_use", tool_use_id="c1", tool_name="bash", arguments={"command": "ls"})
    assert json.loads(pre.model_dump_json()) == {
        "session_id": "s1",
        "run_id": "r1",
        "cwd": "/work/ws",
        "hook_event_name": "PreToolUse",
        "tool_name": "bash",
        "tool_use_id": "c1",
        "tool_input": {"command": "ls"},
    }
    post = document(
        "post_tool_use",
        tool_use_id="c1",
        tool_name="bash",
        arguments={"x": None},
        output="out",
        is_error=True,
    )
    data = json.loads(post.model_dump_json())
    assert data["hook_event_name"] == "PostToolUse"
    assert data["tool_response"] == {"content": "out", "is_error": True}
    assert data["tool_input"] == {"x": None}  # the model's own None stays
    prompt = json.loads(document("user_prompt_submit", prompt="fix it").model_dump_json())
    assert prompt == {
        **{k: v for k, v in pre.model_dump().items() if k in ("session_id", "run_id", "cwd")},
        "hook_event_name": "UserPromptSubmit",
        "prompt": "fix it",
    }
    stop = json.loads(document("stop", status="completed", result="done").model_dump_json())
    assert stop["hook_event_name"] == "Stop"
    assert (stop["status"], stop["result"], stop["stop_hook_active"]) == ("completed", "done", False)
    assert "tool_name" not in stop and "prompt" not in stop


def test_long_strings_of_the_document_are_cut_with_a_note() -> None:
    long = "x" * (HOOK_VALUE_MAX_CHARS + 10)
    doc = document(
        "post_tool_use",
        tool_use_id="c",
        tool_name="write",
        arguments={"content": long, "n": [long]},
        output=long,
    )
    assert doc.tool_input is not None and doc.tool_response is not None
    for text in (doc.tool_input["content"], doc.tool_input["n"][0], doc.tool_response.content):
        assert text.endswith("…[10 more characters]") and len(text) < HOOK_VALUE_MAX_CHARS + 30


def test_block_reason_joins_the_blocking_hooks_reasons() -> None:
    outcomes = [
        HookOutcome(decision="continue", exit_code=0),
        HookOutcome(decision="block", exit_code=2, reason="no rm"),
        HookOutcome(decision="error", exit_code=1, reason="exit code 1"),
        HookOutcome(decision="block", exit_code=2, reason="not on Fridays"),
    ]
    assert block_reason(outcomes) == "no rm\nnot on Fridays"
    assert block_reason(outcomes[:1] + outcomes[2:3]) is None


def test_a_hook_run_event_records_the_outcome_in_the_runs_events() -> None:
    hooks = config_with({"pre_tool_use": [{"command": "x" * 3000, "matcher": "bash"}]})
    [ref] = hooks_for(hooks, "pre_tool_use", "bash")
    doc = document("pre_tool_use", tool_use_id="c1", tool_name="bash", arguments={})
    inp = HookInput(
        run_id="r1",
        workspace="/w",
        event="pre_tool_use",
        index=ref.index,
        hook=ref.hook,
        document=doc,
        timeout_seconds=5,
    )
    event = hook_event(inp, HookOutcome(decision="block", exit_code=2, reason="no", duration_ms=7))
    assert (event.type, event.decision, event.reason, event.tool_use_id, event.duration_ms) == (
        "hook_run",
        "block",
        "no",
        "c1",
        7,
    )
    assert len(event.command) == 2000
    record = EventRecord(sequence=1, timestamp_ms=1, event=event)
    assert EventRecord.model_validate_json(record.model_dump_json()) == record


# --- the plan and the activity's options -----------------------------------------------------------


def test_a_plan_recorded_before_hooks_parses_with_none() -> None:
    plan = minimal_plan()
    data = json.loads(plan.model_dump_json())
    del data["hooks"]
    del data["timeouts"]["hook_seconds"], data["timeouts"]["hook_max_attempts"]
    old = RunPlan.model_validate(data)
    assert old.hooks.empty and old.timeouts.hook_seconds == 60


async def test_the_plan_carries_the_workers_hooks(tmp_path: Path) -> None:
    config = scripted_config(tmp_path, [], hooks={"stop": [{"command": "echo bye"}]})
    planner = RunPlanner(config, {"scripted": object()}, builtin_tools(), {"local": object()})  # type: ignore[dict-item]
    plan = await planner.resolve_run(
        ResolveInput(session_id="s", run_id="r", settings=RunSettings(workspace=str(tmp_path)))
    )
    assert plan.hooks == config.hooks and plan.hooks.stop[0].command == "echo bye"


def test_hook_call_gives_the_activity_the_hooks_own_time_limit() -> None:
    plan = minimal_plan(
        hooks=config_with({"pre_tool_use": [{"command": "a", "timeout_seconds": 7}, {"command": "b"}]}),
        timeouts=Timeouts(hook_seconds=30, hook_max_attempts=4),
    )
    own, default = hooks_for(plan.hooks, "pre_tool_use", "bash")
    doc = hook_document("pre_tool_use", session_id="s", run_id="r", workspace="/w", tool_name="bash")
    inp, timeouts = hook_call(plan, own, "pre_tool_use", doc)
    assert (inp.timeout_seconds, inp.index, inp.workspace, inp.run_id) == (7, 0, plan.workspace, plan.run_id)
    options = HOOK.options(timeouts)
    assert options.start_to_close_seconds == 7 + HOOK_MARGIN_SECONDS
    assert options.maximum_attempts == 4 and options.heartbeat_seconds == plan.timeouts.heartbeat_seconds
    inp, timeouts = hook_call(plan, default, "pre_tool_use", doc)
    assert (
        inp.timeout_seconds == 30
        and HOOK.options(timeouts).start_to_close_seconds == 30 + HOOK_MARGIN_SECONDS
    )


def minimal_plan(**fields: Any) -> RunPlan:
    from durable_agent.core.permissions import PermissionPolicy
    from durable_agent.core.tool_specs import capability_binding

    base: dict[str, Any] = {
        "session_id": "s",
        "run_id": "r",
        "workspace": "/w",
        "model": "scripted/static",
        "system_prompt": "",
        "tools": (),
        "permissions": PermissionPolicy(),
        "capability_binding": capability_binding((), PermissionPolicy()),
        "export_sink": "local",
        "max_tool_rounds": 5,
    }
    return RunPlan(**{**base, **fields})


# --- the activity, through a real Temporal worker ---------------------------------------------------


class Probe(Frozen):
    hook: HookInput
    timeouts: Timeouts


@workflow.defn(name="HookProbe")
class HookProbe:
    """Runs one hook as ``AgentRun`` will: ``CallRunner.run(HOOK, ...)``; a failed activity is an error."""

    @workflow.run
    async def run(self, probe: Probe) -> HookOutcome:
        try:
            return await CallRunner(Cancellation()).run(
                HOOK, probe.hook, summary="hook", timeouts=probe.timeouts
            )
        except ActivityError as exc:
            return failed_outcome(str(exc.cause or exc))
        except RunCancelled:
            return failed_outcome("cancelled")


@asynccontextmanager
async def hook_worker(client: Client, sandbox: SandboxConfig) -> AsyncIterator[str]:
    queue = f"hooks-{uuid.uuid4().hex[:10]}"
    calls = HookCalls(sandbox, Redactor.of({"HOOK_TEST_SECRET": SECRET}))
    async with Worker(
        client,
        task_queue=queue,
        workflows=[HookProbe],
        activities=[calls.hook],
        workflow_runner=UnsandboxedWorkflowRunner(),
    ):
        yield queue


async def run_hook(
    client: Client,
    queue: str,
    ws: Path,
    command: str,
    *,
    timeout_seconds: float | None = None,
    event: str = "pre_tool_use",
    arguments: dict[str, Any] | None = None,
    cancel_when: Callable[[], bool] | None = None,
) -> tuple[HookOutcome, HookInput]:
    hooks = config_with({event: [{"command": command, "timeout_seconds": timeout_seconds}]})
    plan = minimal_plan(
        workspace=str(ws),
        hooks=hooks,
        timeouts=Timeouts(heartbeat_seconds=2, hook_seconds=20, hook_max_attempts=2),
    )
    [ref] = hooks_for(plan.hooks, event, "bash")  # type: ignore[arg-type]
    doc = hook_document(
        event,  # type: ignore[arg-type]
        session_id=plan.session_id,
        run_id=plan.run_id,
        workspace=plan.workspace,
        tool_use_id="call-1",
        tool_name="bash",
        arguments=arguments if arguments is not None else {"command": "rm -rf build"},
    )
    inp, timeouts = hook_call(plan, ref, event, doc)  # type: ignore[arg-type]
    handle = await client.start_workflow(
        HookProbe.run,
        Probe(hook=inp, timeouts=timeouts),
        id=f"hook-probe-{uuid.uuid4().hex[:10]}",
        task_queue=queue,
        execution_timeout=timedelta(seconds=120),
    )
    if cancel_when is not None:
        await until(lambda: "the hook to start", cancel_when, 20)
        await handle.cancel()
    outcome = await handle.result()
    assert isinstance(outcome, HookOutcome)
    return outcome, inp


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    workspace = tmp_path / "ws"
    workspace.mkdir()
    return workspace


SANDBOXES = [SandboxConfig(), SandboxConfig(kind="none")]


@pytest.mark.parametrize("sandbox", SANDBOXES, ids=["bubblewrap", "none"])
async def test_exit_0_goes_on_and_the_hook_reads_the_document_on_stdin(
    client: Client, ws: Path, sandbox: SandboxConfig
) -> None:
    command = 'cat > received.json; echo "checked in $PWD"; echo "$CLAUDE_PROJECT_DIR" > project_dir'
    async with hook_worker(client, sandbox) as queue:
        outcome, inp = await run_hook(client, queue, ws, command)
    assert (outcome.decision, outcome.exit_code, outcome.reason) == ("continue", 0, None)
    assert outcome.stdout.strip() == f"checked in {ws.resolve()}"
    assert outcome.completed_at_ms is not None and outcome.duration_ms >= 0
    received = json.loads((ws / "received.json").read_text())
    assert received == json.loads(inp.document.model_dump_json())
    assert received["hook_event_name"] == "PreToolUse" and received["tool_input"] == {
        "command": "rm -rf build"
    }
    assert (ws / "project_dir").read_text().strip() == str(ws.resolve())


async def test_exit_2_blocks_with_the_hooks_stderr_as_the_reason(client: Client, ws: Path) -> None:
    command = 'jq_free=$(cat); echo "rm is not allowed here" >&2; echo "seen"; exit 2'
    async with hook_worker(client, SandboxConfig()) as queue:
        outcome, inp = await run_hook(client, queue, ws, command)
    assert (outcome.decision, outcome.exit_code) == ("block", 2)
    assert outcome.reason == "rm is not allowed here"
    assert outcome.stdout.strip() == "seen"
    assert block_reason([outcome]) == "rm is not allowed here"
    event = hook_event(inp, outcome)
    assert isinstance(event, HookRunEvent) and event.decision == "block" and event.tool_name == "bash"


async def test_another_exit_is_an_error_recorded_and_the_secret_redacted(client: Client, ws: Path) -> None:
    command = f'echo "broke with {SECRET}" >&2; exit 1'
    async with hook_worker(client, SandboxConfig()) as queue:
        outcome, _ = await run_hook(client, queue, ws, command)
    assert (outcome.decision, outcome.exit_code) == ("error", 1)
    assert outcome.reason is not None and outcome.reason.startswith("exit code 1: broke with")
    assert SECRET not in outcome.reason and SECRET not in outcome.stderr
    assert block_reason([outcome]) is None


async def test_a_hook_past_its_time_limit_is_stopped_and_recorded_as_an_error(
    client: Client, ws: Path
) -> None:
    async with hook_worker(client, SandboxConfig()) as queue:
        outcome, _ = await run_hook(client, queue, ws, "echo started; sleep 60", timeout_seconds=1)
    assert outcome.decision == "error" and outcome.timed_out and outcome.exit_code is None
    assert outcome.reason is not None and "timed out after 1 s" in outcome.reason
    assert outcome.stdout.strip() == "started"
    assert outcome.duration_ms < 30_000


async def test_a_hook_that_does_not_read_a_large_document_still_goes_on(client: Client, ws: Path) -> None:
    big = {"content": "y" * HOOK_VALUE_MAX_CHARS, "more": "z" * HOOK_VALUE_MAX_CHARS}
    async with hook_worker(client, SandboxConfig()) as queue:
        outcome, _ = await run_hook(client, queue, ws, "exit 0", arguments=big)
    assert (outcome.decision, outcome.exit_code) == ("continue", 0)


async def test_a_sandbox_that_cannot_start_fails_the_activity_which_the_run_records(
    client: Client, ws: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DURABLE_AGENT_BWRAP", "/nonexistent/bin/bwrap")
    async with hook_worker(client, SandboxConfig()) as queue:
        outcome, _ = await run_hook(client, queue, ws, "true")
    assert outcome.decision == "error" and outcome.exit_code is None
    assert outcome.reason is not None and "bubblewrap is not installed" in outcome.reason


async def test_a_cancelled_run_stops_its_hook_and_everything_it_started(client: Client, ws: Path) -> None:
    sleep = marker()
    async with hook_worker(client, SandboxConfig()) as queue:
        outcome, _ = await run_hook(
            client,
            queue,
            ws,
            f"sleep {sleep} & sleep {sleep}",
            cancel_when=lambda: bool(processes_with(sleep)),
        )
        assert outcome.reason == "the hook could not be run: cancelled"
        assert await none_left(sleep, within=10)
