"""Record the release's history that ``tests/test_replay.py`` replays on every release after it
(docs/deploys.md, "Replay across releases"): ::

    python scripts/record_release_history.py tests/histories/agent_run_release_0.2.json

A conversation on a versioned worker (a Worker Deployment's build ``b1``, current): two reads,
each a tool boundary, and an answer; the run waits for its next prompt. Build ``b2`` becomes
current and ``durable-agent upgrade`` wakes the run, which continues as new onto ``b2``
(``AUTO_UPGRADE``); there it waits again, answers a next prompt with a read, and ``end`` closes
it. OUT gets its first execution (on ``b1``: boundaries, the wait, the move), OUT-moved the one it
moved into (on ``b2``: a continued execution's start, a boundary, the wait, its end).

Record it at each release (and again if the release's workflow changes before it is tagged),
name it after the release (the ledger's names: ``workflows/patches.py``), and add it to the
``histories`` of the patches whose markers it carries (``tests/test_patch_ledger.py`` says which).
"""

from __future__ import annotations

import asyncio
import json
import sys
import uuid
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from temporalio.client import Client  # noqa: E402

from durable_agent.client import end_conversation, run_result, send_prompt, start_run  # noqa: E402
from durable_agent.config import AgentConfig, parse_config  # noqa: E402
from durable_agent.core.run_api import AWAITING_PROMPT, AgentRunInput  # noqa: E402
from scripts.record_history import record_histories  # noqa: E402
from tests.helpers import final, read_call, status_when, until  # noqa: E402
from tests.versioning import moved, set_current, task_builds, versioned_worker, woken  # noqa: E402

# The workflow id the tests replay every history under (``tests/test_replay.py``).
REPLAY_WORKFLOW_ID = "recorded"

RESPONSES: list[dict[str, Any]] = [
    read_call("r1", "a.txt"),
    read_call("r2", "b.txt"),
    final("alpha, then beta"),
    read_call("r3", "c.txt"),
    final("gamma"),
]


def config_of(tmp: Path, deployment: str, build_id: str) -> AgentConfig:
    """A worker config of ``deployment``'s build ``build_id``, every build with one store and sink."""
    script = tmp / "script.json"
    script.write_text(json.dumps({"responses": RESPONSES}))
    return parse_config(
        {
            "default_model": "scripted/static",
            "providers": {"scripted": {"kind": "scripted", "script": str(script)}},
            "store": {"path": str(tmp / "store")},
            "sinks": {"local": {"kind": "filesystem", "path": str(tmp / "exports")}},
            "permissions": {"allow": ["read(*)"]},
            "worker": {"deployment": deployment, "build_id": build_id},
        },
        tmp,
    )


async def run_release(client: Client, tmp: Path) -> dict[str, str]:
    """Run the scenario; its two executions' histories as JSON, by file suffix."""
    ws = tmp / "ws"
    ws.mkdir()
    for name, text in (("a.txt", "alpha\n"), ("b.txt", "beta\n"), ("c.txt", "gamma\n")):
        (ws / name).write_text(text)
    deployment, queue = f"release-{uuid.uuid4().hex[:8]}", f"release-{uuid.uuid4().hex[:8]}"
    async with AsyncExitStack() as stack:
        await stack.enter_async_context(versioned_worker(client, config_of(tmp, deployment, "b1"), queue))
        await set_current(client, deployment, "b1")
        run = AgentRunInput(
            prompt="read a.txt, then b.txt", workspace=str(ws), session_id="replay-release", follow_ups=True
        )
        handle = await start_run(client, run, queue=queue, workflow_id=REPLAY_WORKFLOW_ID)
        await status_when(handle, lambda s: s.status == AWAITING_PROMPT, "the first answer")
        first = (await handle.describe()).run_id
        await stack.enter_async_context(versioned_worker(client, config_of(tmp, deployment, "b2"), queue))
        await set_current(client, deployment, "b2")
        await until("the run to be woken", lambda: woken(client, queue, handle.id), 20, interval=0.3)
        second = await moved(client, handle, first, "b2")
        await status_when(handle, lambda s: s.status == AWAITING_PROMPT, "the moved run to wait")
        await send_prompt(handle, "now read c.txt")
        await status_when(handle, lambda s: s.status == AWAITING_PROMPT and s.turn == 3, "the second answer")
        await end_conversation(handle)
        result = await run_result(client, handle.id)
        assert result.status == "completed" and [e.turn for e in result.exports] == [1, 2, 3], result
        histories = {
            "": await client.get_workflow_handle(handle.id, run_id=first).fetch_history(),
            "-moved": await client.get_workflow_handle(handle.id, run_id=second).fetch_history(),
        }
    assert task_builds(histories[""]) == {"b1"} and task_builds(histories["-moved"]) == {"b2"}
    return {suffix: history.to_json() for suffix, history in histories.items()}


async def record(out: Path) -> None:
    await record_histories(run_release, out)


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python scripts/record_release_history.py OUT.json")
    asyncio.run(record(Path(sys.argv[1])))
