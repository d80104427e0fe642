"""A changed shell decision is taken in workflow code: runs recorded before replay their old one.

Against the dev server. A run recorded by the code before the fail-closed rules (simulated:
the worker's ``decide_call`` takes the legacy decision) asked a person about
``bash <<< 'git push'``; today's rules deny it. Its history replays on today's code because the
new decision sits behind the ``shell-judge-unseen`` patch, and fails to replay without that
gate. A new run takes the new decision and records the patch marker (in its first task, as it
asks every patch: ``starting.ask_patches_first``); on the code before that, a run whose
decisions did not change recorded none.

Issue 38 again, behind ``shell-judge-programs``: a run recorded by the code before it
(simulated: the workflow never asks that patch) ran ``python3 -c 'print(1)'`` under a broad allow
and a deny rule; today's rules deny it. Its history replays on today's code, and fails to
replay without the gate.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from temporalio import workflow
from temporalio.client import Client, WorkflowHistory
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.worker import Replayer, UnsandboxedWorkflowRunner

from durable_agent.activities import AgentActivities
from durable_agent.core.events import ConfirmationRequiredEvent, PermissionDeniedEvent, ToolEndEvent
from durable_agent.core.permissions import Decision, PermissionPolicy
from durable_agent.workflows import AgentRun, shell_gate, starting
from durable_agent.workflows.patches import PATCH_SHELL_PROGRAMS, PATCH_SHELL_UNSEEN
from tests.helpers import (
    RecordingSink,
    awaiting_approval,
    final,
    running_worker,
    scripted_config,
    start,
    tool_call,
)
from tests.test_approvals import decide
from tests.test_replay import replayer

# No allow rule; the deny rule could match the here-string's script; `ask = ["bash"]` is the ask path.
PERMISSIONS = {"deny": ["bash(git push:*)"], "ask": ["bash"], "default": "deny"}
FED = "bash <<< 'git push'"  # legacy: ask (a here-string is opaque); today: deny (its script is read)


def asks_nothing_first(*, new_run: bool) -> bool:
    """The code before ``local-start-and-finish``: no patch is asked until its branch is."""
    return False


def legacy_decide(policy: PermissionPolicy, tool: str, target: str | None) -> Decision:
    """What the worker decided before the fail-closed rules."""
    return policy.decide(tool, target, era="legacy")


def new_decide(policy: PermissionPolicy, tool: str, target: str | None) -> Decision:
    """Today's decision without the patch gate: what a replay must not take for an old run."""
    return policy.decide(tool, target)


def markers(history: WorkflowHistory, patch: str = PATCH_SHELL_UNSEEN) -> int:
    return sum(
        1
        for e in history.events
        if e.HasField("marker_recorded_event_attributes") and patch.encode() in e.SerializeToString()
    )


async def assert_replays_only_through_the_gate(
    history: WorkflowHistory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Today's code, under Temporal's sandbox, replays ``history`` (the gate keeps the old
    decision); without the gate it no longer does, since the decision is taken in workflow code."""
    replay = await replayer().replay_workflow(history, raise_on_replay_failure=False)
    assert replay.replay_failure is None, replay.replay_failure
    monkeypatch.setattr(shell_gate, "decide_call", new_decide)
    ungated = Replayer(
        workflows=[AgentRun],
        data_converter=pydantic_data_converter,
        workflow_runner=UnsandboxedWorkflowRunner(),
    )
    broken = await ungated.replay_workflow(history, raise_on_replay_failure=False)
    assert broken.replay_failure is not None


def workspace(tmp_path: Path) -> Path:
    ws = tmp_path / "ws"
    ws.mkdir()
    return ws


async def test_a_run_recorded_before_replays_its_old_decision(
    client: Client, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = scripted_config(
        tmp_path, [tool_call("b1", "bash", command=FED), final("asked")], permissions=PERMISSIONS
    )
    sink = RecordingSink()
    with monkeypatch.context() as old_code:
        old_code.setattr(shell_gate, "decide_call", legacy_decide)
        old_code.setattr(starting, "ask_patches_first", asks_nothing_first)
        async with running_worker(client, AgentActivities(config, sinks={"local": sink})) as queue:
            handle = await start(client, queue, workspace(tmp_path))
            status = await awaiting_approval(handle)
            assert [p.call_id for p in status.pending_approvals] == ["b1"]  # the legacy decision: ask
            await decide(handle, "b1", False, "no")
            result = await handle.result()
            history = await handle.fetch_history()
    assert result.status == "completed" and markers(history) == 0
    events = [r.event for r in sink.exports[-1].open().source_run().events]
    assert [e.id for e in events if isinstance(e, ConfirmationRequiredEvent)] == ["b1"]

    await assert_replays_only_through_the_gate(history, monkeypatch)


async def test_a_new_run_takes_the_new_decision_and_records_the_patch(client: Client, tmp_path: Path) -> None:
    responses = [
        tool_call("b0", "bash", command="bash -c 'git push'"),  # denied by both rules: no marker yet
        tool_call("b1", "bash", command=FED),
        final("denied twice"),
    ]
    config = scripted_config(tmp_path, responses, permissions=PERMISSIONS)
    sink = RecordingSink()
    async with running_worker(client, AgentActivities(config, sinks={"local": sink})) as queue:
        handle = await start(client, queue, workspace(tmp_path))
        result = await handle.result()
        history = await handle.fetch_history()
    assert result.status == "completed" and result.text == "denied twice"
    events = [r.event for r in sink.exports[-1].open().source_run().events]
    assert [e.id for e in events if isinstance(e, PermissionDeniedEvent)] == ["b0", "b1"]
    assert not [e for e in events if isinstance(e, ConfirmationRequiredEvent)]
    assert markers(history) == 1
    replay = await replayer().replay_workflow(history, raise_on_replay_failure=False)
    assert replay.replay_failure is None, replay.replay_failure


async def test_a_run_whose_decisions_did_not_change_records_no_marker(
    client: Client, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    responses = [tool_call("b0", "bash", command="bash -c 'git push'"), final("denied")]
    config = scripted_config(tmp_path, responses, permissions=PERMISSIONS)
    with monkeypatch.context() as before:
        before.setattr(starting, "ask_patches_first", asks_nothing_first)
        async with running_worker(client, AgentActivities(config)) as queue:
            handle = await start(client, queue, workspace(tmp_path))
            result = await handle.result()
            history = await handle.fetch_history()
    assert result.status == "completed" and markers(history) == 0


async def test_a_run_recorded_before_programs_were_read_replays_its_old_decision(
    client: Client, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    line = "python3 -c 'print(1)'"  # the judge before: allowed; today's: the code is unseen, denied
    config = scripted_config(
        tmp_path,
        [tool_call("p1", "bash", command=line), final("ran")],
        permissions={"allow": ["bash"], "deny": ["bash(git push:*)"], "default": "deny"},
        sandbox={"kind": "none"},
    )
    sdk = workflow.patched
    sink = RecordingSink()
    with monkeypatch.context() as old_code:
        # the code before issue 38 never asked the patch: it has no marker, and took the old decision
        old_code.setattr(workflow, "patched", lambda patch: patch != PATCH_SHELL_PROGRAMS and sdk(patch))
        async with running_worker(client, AgentActivities(config, sinks={"local": sink})) as queue:
            handle = await start(client, queue, workspace(tmp_path))
            result = await handle.result()
            history = await handle.fetch_history()
    assert result.status == "completed" and markers(history, PATCH_SHELL_PROGRAMS) == 0
    events = [r.event for r in sink.exports[-1].open().source_run().events]
    assert [e.id for e in events if isinstance(e, ToolEndEvent)] == ["p1"]  # it ran
    assert not [e for e in events if isinstance(e, PermissionDeniedEvent)]

    await assert_replays_only_through_the_gate(history, monkeypatch)


async def test_a_new_run_takes_the_programs_decision(client: Client, tmp_path: Path) -> None:
    config = scripted_config(
        tmp_path,
        [tool_call("p1", "bash", command="python3 -c 'print(1)'"), final("denied")],
        permissions={"allow": ["bash"], "deny": ["bash(git push:*)"], "default": "deny"},
    )
    sink = RecordingSink()
    async with running_worker(client, AgentActivities(config, sinks={"local": sink})) as queue:
        handle = await start(client, queue, workspace(tmp_path))
        result = await handle.result()
        history = await handle.fetch_history()
    assert result.status == "completed" and markers(history, PATCH_SHELL_PROGRAMS) == 1
    events = [r.event for r in sink.exports[-1].open().source_run().events]
    assert [e.id for e in events if isinstance(e, PermissionDeniedEvent)] == ["p1"]
    replay = await replayer().replay_workflow(history, raise_on_replay_failure=False)
    assert replay.replay_failure is None, replay.replay_failure
