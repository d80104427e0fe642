"""A run's workspace made from a source (``activities/workspaces/sources.py``): a git repository's
ref cloned through the machine's mirror into the run's own folder, and a tree of an earlier run
(a fork); refused clearly when the source cannot be had."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
from temporalio.client import Client, WorkflowFailureError

from durable_agent.activities import AgentActivities
from durable_agent.cli.commands import build_parser
from durable_agent.cli.run_commands import workspace_source
from durable_agent.client import end_conversation, send_prompt, start_run
from durable_agent.core.events import EventRecord, ToolEndEvent
from durable_agent.core.failures import INVALID_RUN_INPUT
from durable_agent.core.run_api import (
    UPDATE_REWIND,
    AgentRunInput,
    ApprovalAnswer,
    ApprovalDecision,
    RewindAccepted,
    RewindRequest,
)
from durable_agent.core.run_workspace import GitSource, TreeSource
from tests.helpers import awaiting_approval, final, running_worker, scripted_config, status_when, tool_call

GIT = ["git", "-c", "user.email=test@example.com", "-c", "user.name=test", "-c", "init.defaultBranch=main"]


def repository(tmp: Path) -> tuple[Path, str]:
    """A bare repository with a ``main`` branch of two files; and ``main``'s tree."""
    work = tmp / "work"
    work.mkdir()
    (work / "a.txt").write_text("one\n")
    (work / "src").mkdir()
    (work / "src" / "app.py").write_text("print('app')\n")
    for args in (["init", "-q"], ["add", "."], ["commit", "-qm", "first"]):
        subprocess.run([*GIT, *args], cwd=work, check=True)
    bare = tmp / "origin.git"
    subprocess.run([*GIT, "clone", "-q", "--bare", str(work), str(bare)], check=True)
    tree = subprocess.run(
        ["git", "--git-dir", str(bare), "rev-parse", "main^{tree}"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    return bare, tree


def config_for(tmp: Path, responses: list[dict[str, Any]]) -> Any:
    tmp.mkdir(exist_ok=True)
    return scripted_config(
        tmp,
        responses,
        permissions={"allow": ["read(**)", "write(**)", "bash"], "default": "deny"},
        workspaces={"root": str(tmp / "workspaces")},
    )


async def events_of(client: Client, workflow_id: str) -> list[Any]:
    handle = client.get_workflow_handle(workflow_id)
    records: list[EventRecord] = await handle.query("events", 0, result_type=list[EventRecord])
    return [r.event for r in records]


async def test_a_run_from_a_git_ref_and_a_second_from_its_final_tree(client: Client, tmp_path: Path) -> None:
    bare, main_tree = repository(tmp_path)
    first = config_for(
        tmp_path / "one",
        [
            tool_call("w1", "write", file_path="new.txt", content="written by the first run\n"),
            tool_call("b1", "bash", command="ls -a; sed -i s/one/two/ a.txt"),
            final("done"),
        ],
    )
    async with running_worker(client, AgentActivities(first)) as queue:
        run = AgentRunInput(prompt="edit", workspace=GitSource(git=str(bare), ref="main"))
        result = await (await start_run(client, run, queue=queue)).result()
        events = await events_of(client, result.session_id)
    assert result.status == "completed", result.error
    change = result.workspace
    assert change is not None and change.base == main_tree and change.final not in (None, main_tree)
    assert set(change.files) == {"a.txt", "new.txt"} and "+two" in change.diff, change
    listing = next(e for e in events if isinstance(e, ToolEndEvent) and e.id == "b1").output
    assert ".git" not in listing.split() and "src" in listing.split()  # the files, not a clone
    # the run's own folder under the root, and the machine's mirror beside the runs' folders
    root = tmp_path / "one" / "workspaces"
    assert (root / ".git-cache").is_dir() and len(list((root / ".git-cache").glob("*.git"))) == 1
    [folder] = [p for p in root.glob("*/*") if p.is_dir() and ".git-cache" not in p.parts]
    assert (folder / "a.txt").read_text() == "two\n"

    # ``durable-agent run --from-export`` names that tree from the first run's newest export file
    newest = sorted((tmp_path / "one" / "exports").rglob("turn-*.json"))[-1]
    parsed = build_parser().parse_args(["run", "--prompt", "go on", "--from-export", str(newest)])
    assert workspace_source(parsed) == {"tree": change.final}

    # a fork: a second run starts from the first's final tree, read from the sink
    second = config_for(
        tmp_path / "one",  # the same sink holds the first run's objects
        [tool_call("r1", "read", file_path="new.txt"), final("read")],
    )
    async with running_worker(client, AgentActivities(second)) as queue:
        assert change.final is not None
        run = AgentRunInput(prompt="go on", workspace=TreeSource(tree=change.final))
        forked = await (await start_run(client, run, queue=queue)).result()
        events = await events_of(client, forked.session_id)
    assert forked.status == "completed", forked.error
    assert forked.workspace is not None and forked.workspace.base == change.final
    read = next(e for e in events if isinstance(e, ToolEndEvent) and e.id == "r1")
    assert "written by the first run" in read.output


@pytest.mark.parametrize(
    ("source", "said"),
    [
        (GitSource(git="ORIGIN", ref="no-such-branch"), "no ref 'no-such-branch'"),
        (GitSource(git="ext::sh -c touch% /tmp/pwned"), "git clone failed"),
        (TreeSource(tree="0" * 40), "does not hold tree"),
    ],
)
async def test_a_source_that_cannot_be_had_refuses_the_run_with_the_reason(
    client: Client, tmp_path: Path, source: GitSource | TreeSource, said: str
) -> None:
    bare, _ = repository(tmp_path)
    if isinstance(source, GitSource) and source.git == "ORIGIN":
        source = source.model_copy(update={"git": str(bare)})
    config = config_for(tmp_path, [final("never")])
    async with running_worker(client, AgentActivities(config)) as queue:
        handle = await start_run(client, AgentRunInput(prompt="edit", workspace=source), queue=queue)
        with pytest.raises(WorkflowFailureError) as info:
            await handle.result()
    cause = info.value.cause
    assert getattr(cause, "type", None) == INVALID_RUN_INPUT
    assert said in str(cause), cause
    assert not Path("/tmp/pwned").exists()


def test_the_run_command_takes_a_source_instead_of_a_folder() -> None:
    parser = build_parser()
    args = parser.parse_args(["run", "--prompt", "p", "--git", "/srv/repo.git", "--ref", "main"])
    assert workspace_source(args) == {"git": "/srv/repo.git", "ref": "main"}
    args = parser.parse_args(["run", "--prompt", "p", "--from-tree", "a" * 40])
    assert workspace_source(args) == {"tree": "a" * 40}
    assert workspace_source(parser.parse_args(["run", "--prompt", "p", "--workspace", "/w"])) is None
    with pytest.raises(SystemExit):
        parser.parse_args(["run", "--prompt", "p", "--git", "x", "--from-tree", "a" * 40])
    with pytest.raises(ValueError, match="does not go with"):
        workspace_source(parser.parse_args(["run", "--prompt", "p", "--git", "x", "--workspace", "/w"]))


async def test_a_write_past_max_bytes_is_a_tool_error_and_its_file_is_not_kept(
    client: Client, tmp_path: Path
) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "a.txt").write_text("small\n")
    config = scripted_config(
        tmp_path,
        [tool_call("w1", "write", file_path="big.txt", content="x" * 5000), final("done")],
        permissions={"allow": ["write(**)"], "default": "deny"},
        workspaces={"max_bytes": 2000},
    )
    async with running_worker(client, AgentActivities(config)) as queue:
        run = AgentRunInput(prompt="write", workspace=str(ws))
        result = await (await start_run(client, run, queue=queue)).result()
        events = await events_of(client, result.session_id)
    assert result.status == "completed", result.error
    end = next(e for e in events if isinstance(e, ToolEndEvent) and e.id == "w1")
    assert end.is_error and "max_bytes=2,000" in end.output and end.workspace is None, end
    assert not (ws / "big.txt").exists()
    assert result.workspace is not None and result.workspace.final == result.workspace.base


async def test_setup_runs_once_a_machine_and_again_when_its_key_changes(
    client: Client, tmp_path: Path
) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / ".gitignore").write_text("deps/\n.setup-log\n")
    (ws / "lock.txt").write_text("v1\n")
    setup = "echo installed >> .setup-log && mkdir -p deps && cp lock.txt deps/lib.txt"
    config = scripted_config(
        tmp_path,
        [
            tool_call("b1", "bash", command="cat deps/lib.txt"),
            tool_call("b2", "bash", command="cat .setup-log"),
            tool_call("w1", "write", file_path="lock.txt", content="v2\n"),
            tool_call("b3", "bash", command="cat .setup-log deps/lib.txt"),
            final("done"),
        ],
        permissions={"allow": ["bash", "write(**)"], "default": "deny"},
        workspaces={"setup": setup, "setup_key": ["lock.txt"]},
    )
    async with running_worker(client, AgentActivities(config)) as queue:
        run = AgentRunInput(prompt="build", workspace=str(ws))
        result = await (await start_run(client, run, queue=queue)).result()
        events = await events_of(client, result.session_id)
    assert result.status == "completed", result.error
    ends = {e.id: e.output for e in events if isinstance(e, ToolEndEvent)}
    assert ends["b1"].startswith("v1") and "ran on this machine first" in ends["b1"], ends["b1"]
    assert ends["b2"].splitlines().count("installed") == 1 and "setup" not in ends["b2"], ends["b2"]
    # the lockfile changed: set up again before the next call, which sees the new dependency
    assert "ran on this machine first" in ends["b3"], ends["b3"]
    assert ends["b3"].splitlines().count("installed") == 2, ends["b3"]
    assert "v2" in ends["b3"]
    # what the setup made is the machine's cache, not the run's files
    assert result.workspace is not None and set(result.workspace.files) == {"lock.txt"}


def git_out(bare: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "--git-dir", str(bare), *args], capture_output=True, text=True
    ).stdout.strip()


@pytest.mark.parametrize("rule", ["allow", "deny", "ask"])
async def test_the_change_from_a_git_source_is_pushed_to_its_branch_as_the_rules_say(
    client: Client, tmp_path: Path, rule: str
) -> None:
    bare, _ = repository(tmp_path)
    main = git_out(bare, "rev-parse", "main")
    permissions: dict[str, Any] = {"allow": ["write(**)"], "default": "deny"}
    if rule != "deny":
        permissions[rule] = [*permissions.get(rule, []), "git_push(agent/*)"]
    config = scripted_config(
        tmp_path,
        [tool_call("w1", "write", file_path="fix.txt", content="fixed\n"), final("done")],
        permissions=permissions,
        workspaces={"root": str(tmp_path / "workspaces"), "commit": True},
    )
    async with running_worker(client, AgentActivities(config)) as queue:
        run = AgentRunInput(prompt="Fix it\nplease", workspace=GitSource(git=str(bare), ref="main"))
        handle = await start_run(client, run, queue=queue)
        if rule == "ask":
            status = await awaiting_approval(handle)
            assert [p.call_id for p in status.pending_approvals] == ["git_push"]
            decision = ApprovalDecision(call_id="git_push", approved=True, reason="ship it")
            await handle.execute_update("approve", decision, result_type=ApprovalAnswer)
        result = await handle.result()
    assert result.status == "completed", result.error
    change = result.workspace
    branch = f"agent/{result.session_id}"
    assert change is not None and change.branch == branch
    if rule == "deny":
        assert change.commit is None and "permission denied: git_push" in (change.pushed or "")
        assert git_out(bare, "branch", "--list", branch) == ""
        return
    assert change.commit is not None and change.pushed is None
    assert git_out(bare, "rev-parse", branch) == change.commit
    assert git_out(bare, "rev-parse", f"{branch}^{{tree}}") == change.final
    assert git_out(bare, "rev-parse", f"{branch}^") == main  # on the commit the run started from
    assert git_out(bare, "log", "-1", "--format=%s", branch) == "Fix it"


async def test_a_rewound_run_from_a_git_source_pushes_its_files_after_the_first_runs_commit(
    client: Client, tmp_path: Path
) -> None:
    bare, _ = repository(tmp_path)
    main = git_out(bare, "rev-parse", "main")
    config = scripted_config(
        tmp_path,
        [
            tool_call("w1", "write", file_path="one.txt", content="turn one\n"),
            final("first"),
            tool_call("w2", "write", file_path="two.txt", content="turn two\n"),
            final("second"),
        ],
        permissions={"allow": ["write(**)", "git_push(agent/*)"], "default": "deny"},
        workspaces={"root": str(tmp_path / "workspaces"), "commit": True},
    )
    async with running_worker(client, AgentActivities(config)) as queue:
        run = AgentRunInput(prompt="Fix it", workspace=GitSource(git=str(bare), ref="main"), follow_ups=True)
        handle = await start_run(client, run, queue=queue)
        first = await status_when(handle, lambda s: s.status == "awaiting_prompt", "the first turn")
        await send_prompt(handle, "and more")
        await status_when(handle, lambda s: s.status == "awaiting_prompt" and s.turn >= 2, "the second turn")
        # the repository moves on meanwhile: the rewound run's change still goes on ``main`` as it was
        moved = tmp_path / "moved"
        subprocess.run([*GIT, "clone", "-q", str(bare), str(moved)], check=True)
        (moved / "other.txt").write_text("someone else\n")
        for args in (["add", "."], ["commit", "-qm", "meanwhile"], ["push", "-q", "origin", "main"]):
            subprocess.run([*GIT, *args], cwd=moved, check=True)
        await handle.execute_update(
            UPDATE_REWIND, RewindRequest(turn=1, prompt="instead"), result_type=RewindAccepted
        )
        await status_when(
            handle, lambda s: s.status == "awaiting_prompt" and s.run_id != first.run_id, "the rewound turn"
        )
        await end_conversation(handle)
        result = await handle.result()
    assert result.status == "completed", result.error
    change = result.workspace
    assert change is not None and change.commit is not None, change
    branch = f"agent/{result.session_id}"
    assert git_out(bare, "rev-parse", branch) == change.commit
    # on the run's first commit, which the rewind ended, on ``main`` as the run found it (not
    # the commit the repository moved to): a fast-forward, never forced
    assert git_out(bare, "rev-parse", f"{branch}^^") == main
    assert "two.txt" in git_out(bare, "ls-tree", "--name-only", f"{branch}^").split()
    files = git_out(bare, "ls-tree", "--name-only", branch).split()
    # the files of turn 1, where the run went back to
    assert "one.txt" in files and "two.txt" not in files and "other.txt" not in files, files
