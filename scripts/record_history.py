"""Record the history that ``tests/test_replay.py`` replays.

Run it only when a workflow change is meant to break replay (and then ship the
change behind ``workflow.patched``, or with a new workflow version): ::

    python scripts/record_history.py tests/histories/agent_run_v1.json

It starts a dev server, runs a scripted ``AgentRun`` with two tool boundaries,
a denied call and an unknown tool, and writes the history as JSON.
"""

from __future__ import annotations

import asyncio
import json
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from activities import AgentActivities  # noqa: E402
from durable_agent.config import parse_config  # noqa: E402
from durable_agent.devserver import start_ephemeral_server  # noqa: E402
from tests.helpers import final, read_call, running_worker, start, tool_call  # noqa: E402

RESPONSES = [
    {"text": "Looking.", **read_call("r1", "a.txt")},
    read_call("r2", "b.txt"),
    tool_call("r3", "frobnicate"),
    read_call("r4", "../escape.txt"),
    final("two files read"),
]


async def record(out: Path) -> None:
    env = await start_ephemeral_server()
    try:
        with tempfile.TemporaryDirectory() as tmp_name:
            tmp = Path(tmp_name)
            ws = tmp / "ws"
            ws.mkdir()
            (ws / "a.txt").write_text("alpha\n")
            (ws / "b.txt").write_text("beta\n")
            script = tmp / "script.json"
            script.write_text(json.dumps({"responses": RESPONSES}))
            config = parse_config(
                {
                    "default_model": "scripted/static",
                    "providers": {"scripted": {"kind": "scripted", "script": str(script)}},
                    "store": {"path": str(tmp / "store")},
                    "sinks": {"local": {"kind": "filesystem", "path": str(tmp / "exports")}},
                    "permissions": {"allow": ["read(*)"]},
                },
                tmp,
            )
            async with running_worker(env.client, AgentActivities(config)) as queue:
                handle = await start(env.client, queue, ws, "read a.txt and b.txt", session_id="replay")
                result = await handle.result()
                assert result.status == "completed", result
                history = await handle.fetch_history()
        out.write_text(history.to_json())
        print(f"wrote {out} ({len(history.events)} events)")
    finally:
        await env.shutdown()


if __name__ == "__main__":
    asyncio.run(record(Path(sys.argv[1] if len(sys.argv) > 1 else "tests/histories/agent_run_v1.json")))
