"""Check that a run started by an older version goes on, live, on this one.

    python scripts/check_upgrade.py [OLD_COMMIT]      # default: a6d5508, boundaries in two activities

(``a6d5508`` is the last main before one-task boundaries; ``e0b4055``, the last main before
linear history, and ``c144c0f``, before 0.2's layout, check those upgrades too.)

A worker of the old commit (a git worktree) starts a run that reads a file
twice, then waits for a person's approval of an ``ls``; the old worker stops.
A worker of this tree approves it and takes the run to its end. The check
passes when the run completes with an unbroken export series whose last export
holds every tool result. Replaying recorded histories (``tests/test_replay.py``)
checks determinism; this checks what replay cannot: the old run's store, in
the old format, as the new code finds it.
"""

from __future__ import annotations

import asyncio
import importlib
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
ADDRESS = "127.0.0.1:7299"
QUEUE = "upgrade-check"
WORKFLOW_ID = "upgrade-check-run"
RESPONSES: list[dict[str, Any]] = [
    {"tool_calls": [{"id": "r1", "name": "read", "input": {"file_path": "a.txt"}}]},
    {"tool_calls": [{"id": "r2", "name": "read", "input": {"file_path": "a.txt"}}]},
    {"tool_calls": [{"id": "l1", "name": "ls", "input": {"path": "."}}]},
    {"tool_calls": [{"id": "r3", "name": "read", "input": {"file_path": "a.txt"}}]},
    {"text": "upgraded"},
]
PERMISSIONS = {"allow": ["read(*)"], "ask": ["ls"], "default": "deny"}


async def phase(name: str, tmp: Path) -> None:
    """One side of the check, run with the code on ``sys.path`` (the old tree or this one)."""
    from temporalio.client import Client
    from temporalio.contrib.pydantic import pydantic_data_converter

    api = _layout()
    AgentActivities, build_worker = api["AgentActivities"], api["build_worker"]
    AgentRunInput, AgentRunResult = api["AgentRunInput"], api["AgentRunResult"]
    ApprovalAnswer, ApprovalDecision, RunStatusView = (
        api["ApprovalAnswer"],
        api["ApprovalDecision"],
        api["RunStatusView"],
    )
    from durable_agent.client import ensure_search_attributes, start_run
    from tests.helpers import scripted_config

    client = await Client.connect(ADDRESS, data_converter=pydantic_data_converter)
    config = scripted_config(tmp, RESPONSES, permissions=PERMISSIONS)
    async with build_worker(client, AgentActivities(config), QUEUE):
        if name == "old":
            await ensure_search_attributes(client)
            run = AgentRunInput(prompt="upgrade me", workspace=str(tmp / "ws"))
            handle = await start_run(client, run, queue=QUEUE, workflow_id=WORKFLOW_ID)
            for _ in range(200):
                status = await handle.query("status", result_type=RunStatusView)
                if status.pending_approvals:
                    print(f"old: waiting for approval at turn {status.turn}", flush=True)
                    return
                await asyncio.sleep(0.1)
            raise SystemExit("old: the run never asked for approval")
        handle = client.get_workflow_handle(WORKFLOW_ID, result_type=AgentRunResult)
        decision = ApprovalDecision(call_id="l1", approved=True)
        await handle.execute_update("approve", decision, result_type=ApprovalAnswer)
        result = await handle.result()
    print(f"new: {result.status} {result.text!r}, exports {[e.turn for e in result.exports]}", flush=True)
    read_export_file = api["read_export_file"]
    last = read_export_file(sorted((tmp / "exports").rglob("turn-*.json"))[-1]).open()
    ids = [b.tool_use_id for m in last.logical_resume.messages for b in m.content if b.type == "tool_result"]
    print(f"new: last export turn {last.logical_resume.turn} holds results {ids}", flush=True)
    ok = result.status == "completed" and [e.turn for e in result.exports] == [1, 2, 3, 4]
    if not (ok and ids == ["r1", "r2", "l1", "r3"] and not result.persistence_failures):
        raise SystemExit("upgrade check FAILED")
    print("upgrade check passed", flush=True)


RUN_API_NAMES = ("AgentRunInput", "AgentRunResult", "ApprovalAnswer", "ApprovalDecision", "RunStatusView")


def _layout() -> dict[str, Any]:
    """The names a phase needs, from either layout: ``durable_agent.*`` (0.2 on) or the
    top-level ``activities``/``worker`` modules and ``durable_agent.run_io`` before it."""
    names = {
        "AgentActivities": ("durable_agent.activities", "activities"),
        "build_worker": ("durable_agent.worker", "worker"),
        "read_export_file": ("durable_agent.activities.sinks", "activities.sinks"),
        **{
            name: ("durable_agent.core.run_api", "durable_agent.run_io")
            for name in (
                "AgentRunInput",
                "AgentRunResult",
                "ApprovalAnswer",
                "ApprovalDecision",
                "RunStatusView",
            )
        },
    }
    tree = Path(os.environ["PYTHONPATH"]).resolve()
    found: dict[str, Any] = {}
    for name, (new, old) in names.items():
        try:
            module = importlib.import_module(new)
            # an editable install of this tree must not stand in for the old tree's modules
            if not Path(str(module.__file__)).resolve().is_relative_to(tree):
                raise ImportError(new)
        except ImportError:
            module = importlib.import_module(old)
        found[name] = getattr(module, name)
    return found


def run_phase(name: str, tree: Path, tmp: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    args = [sys.executable, str(Path(__file__).resolve()), "--phase", name, str(tmp)]
    subprocess.run(args, cwd=tree, env=env, check=True)


def main() -> None:
    if len(sys.argv) == 4 and sys.argv[1] == "--phase":
        sys.path.insert(0, os.environ["PYTHONPATH"])
        asyncio.run(phase(sys.argv[2], Path(sys.argv[3])))
        os._exit(0)  # temporalio/sdk-python#300: leave before interpreter shutdown
    old_commit = sys.argv[1] if len(sys.argv) > 1 else "a6d5508"
    sys.path.insert(0, str(ROOT))
    from durable_agent.devserver import start_dev_server, stop_dev_server

    with tempfile.TemporaryDirectory(prefix="upgrade-check-") as name:
        tmp = Path(name)
        (tmp / "ws").mkdir()
        (tmp / "ws" / "a.txt").write_text("alpha\n" * 500)
        old_tree = tmp / "old"
        subprocess.run(
            ["git", "-C", str(ROOT), "worktree", "add", "-q", str(old_tree), old_commit], check=True
        )
        server = start_dev_server(port=7299, ui_port=8299)
        try:
            run_phase("old", old_tree, tmp)
            run_phase("new", ROOT, tmp)
        finally:
            stop_dev_server(server)
            subprocess.run(
                ["git", "-C", str(ROOT), "worktree", "remove", "--force", str(old_tree)], check=False
            )
    print(json.dumps({"old": old_commit, "result": "passed"}))


if __name__ == "__main__":
    main()
