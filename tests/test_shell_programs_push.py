"""Issue 38, end to end: ``python3 -c 'import os; os.system("git push")'`` under ``allow = ["bash"]``
and ``deny = ["bash(git push:*)"]`` no longer pushes; nor does a script the model wrote and runs
by its path (``./x.sh``), nor a runner given ``git push`` as words (``npm exec -- git push``).

Against the dev server, with a real repository whose ``origin`` is a bare repository one commit
behind it, and the ``bash`` tool run on the worker's machine (``[sandbox] kind = "none"``, so
that nothing but the rules stands between the line and the remote). The judge before issue 38
let the line run and the push happened (the last test, with the worker's ``decide_call``
taking that judge's decision); today's denies it (the default), or asks a person
(``default = "ask"``), who refuses.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from temporalio.client import Client

from durable_agent.activities import AgentActivities
from durable_agent.core.events import AgentEvent, ConfirmationRequiredEvent, PermissionDeniedEvent
from durable_agent.core.permissions import Decision, PermissionPolicy
from durable_agent.workflows import shell_gate
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

PUSH = """python3 -c 'import os; os.system("git push")'"""
RULES = {"allow": ["bash", "write"], "deny": ["bash(git push:*)"]}
# A script the model writes with the ``write`` tool, then runs by its path; and a runner that runs
# a command given as words (``npm exec``, installed here where ``uv`` may not be).
SCRIPT = [tool_call("w1", "write", file_path="x.sh", content="#!/bin/sh\ngit push -q\n")]
BY_PATH = "chmod +x x.sh && ./x.sh"
RUNNER = "npm exec --no -- git push -q"


def git(cwd: Path, *args: str) -> str:
    done = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, check=True)
    return done.stdout.strip()


def repository(tmp_path: Path) -> tuple[Path, Path]:
    """A workspace that is a git repository one commit ahead of its ``origin``, a bare one."""
    remote, ws = tmp_path / "remote.git", tmp_path / "ws"
    git(tmp_path, "init", "-q", "--bare", "-b", "main", str(remote))
    git(tmp_path, "init", "-q", "-b", "main", str(ws))
    git(ws, "config", "user.name", "t")
    git(ws, "config", "user.email", "t@example.com")
    (ws / "a.txt").write_text("alpha\n")
    git(ws, "add", "a.txt")
    git(ws, "commit", "-q", "-m", "first")
    git(ws, "remote", "add", "origin", str(remote))
    git(ws, "push", "-q", "-u", "origin", "main")
    (ws / "a.txt").write_text("beta\n")
    git(ws, "commit", "-q", "-am", "second, not to be pushed")
    assert remote_head(remote) != git(ws, "rev-parse", "HEAD")
    return ws, remote


def remote_head(remote: Path) -> str:
    return git(remote, "rev-parse", "main")


def unseen_era(policy: PermissionPolicy, tool: str, target: str | None) -> Decision:
    """What the worker decided before issue 38."""
    return policy.decide(tool, target, era="unseen")


async def run_push(
    client: Client, tmp_path: Path, default: str, line: str = PUSH, first: tuple[dict[str, object], ...] = ()
) -> tuple[str, list[AgentEvent], str, str]:
    """Runs the line once (after the calls ``first``); the run's status, its events, and the
    remote's head before and after."""
    ws, remote = repository(tmp_path)
    before = remote_head(remote)
    config = scripted_config(
        tmp_path,
        [*first, tool_call("b1", "bash", command=line), final("done")],
        permissions={**RULES, "default": default},
        sandbox={"kind": "none"},
    )
    sink = RecordingSink()
    async with running_worker(client, AgentActivities(config, sinks={"local": sink})) as queue:
        handle = await start(client, queue, ws, prompt="push")
        if default == "ask":
            status = await awaiting_approval(handle)
            assert [p.call_id for p in status.pending_approvals] == ["b1"]
            assert remote_head(remote) == before  # nothing ran while it waited
            await decide(handle, "b1", False, "not without a review")
        result = await handle.result()
    events = [r.event for r in sink.exports[-1].open().source_run().events]
    return result.status, events, before, remote_head(remote)


async def test_the_push_is_denied_by_default(client: Client, tmp_path: Path) -> None:
    status, events, before, after = await run_push(client, tmp_path, "deny")
    assert status == "completed"
    assert [e.id for e in events if isinstance(e, PermissionDeniedEvent)] == ["b1"]
    assert after == before


async def test_with_default_ask_a_person_is_asked_and_refuses(client: Client, tmp_path: Path) -> None:
    status, events, before, after = await run_push(client, tmp_path, "ask")
    assert status == "completed"
    assert [e.id for e in events if isinstance(e, ConfirmationRequiredEvent)] == ["b1"]
    assert after == before


async def test_the_judge_before_let_it_push(
    client: Client, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(shell_gate, "decide_call", unseen_era)
    status, events, before, after = await run_push(client, tmp_path, "deny")
    assert status == "completed"
    assert not [e for e in events if isinstance(e, PermissionDeniedEvent)]
    assert after != before and after == git(tmp_path / "ws", "rev-parse", "HEAD")  # pushed


@pytest.mark.parametrize(("line", "first"), [(BY_PATH, SCRIPT), (RUNNER, [])], ids=["by-path", "runner"])
async def test_a_script_by_its_path_or_a_runner_does_not_push(
    client: Client, tmp_path: Path, line: str, first: list[dict[str, object]]
) -> None:
    status, events, before, after = await run_push(client, tmp_path, "deny", line, tuple(first))
    assert status == "completed"
    assert [e.id for e in events if isinstance(e, PermissionDeniedEvent)] == ["b1"]
    assert after == before


@pytest.mark.parametrize(("line", "first"), [(BY_PATH, SCRIPT), (RUNNER, [])], ids=["by-path", "runner"])
async def test_the_judge_before_let_a_script_or_a_runner_push(
    client: Client, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, line: str, first: list[dict[str, object]]
) -> None:
    monkeypatch.setattr(shell_gate, "decide_call", unseen_era)
    status, events, before, after = await run_push(client, tmp_path, "deny", line, tuple(first))
    assert status == "completed"
    assert not [e for e in events if isinstance(e, PermissionDeniedEvent)]
    assert after != before and after == git(tmp_path / "ws", "rev-parse", "HEAD")  # pushed
