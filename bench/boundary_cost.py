"""What one tool boundary costs: wall time, Temporal history and export bytes.

Run it from the repository root:

    python bench/boundary_cost.py                      # N = 1 10 50 boundaries, 2000-byte files
    python bench/boundary_cost.py --boundaries 5 100 --file-bytes 10000 --json

It starts its own Temporal dev server (in memory) unless ``TEMPORAL_ADDRESS`` is
set, runs an in-process worker and, for each N, one ``AgentRun`` whose scripted
model asks for N ``read`` calls of one file, one call a step, then answers.
Each read is one tool boundary: model call, tool call, checkpoint save, export.

Columns, per N (``/b`` = divided by N; the fixed cost of a run is in there too):

* ``wall`` and ``ms/b``: time from start to result, as the client sees it;
* ``execs``: the run's executions (it continues as new when its history grows);
* ``events``: history events; ``hist`` bytes: the protobuf ``ByteSize()`` of
  the history, both summed over every execution (the JSON of
  ``WorkflowHistory.to_json()`` and the largest execution are in ``--json``);
* ``export``: bytes of the files the filesystem sink wrote for the run.

The last line is the marginal cost of one more boundary between the smallest
and the largest N. A warm-up run (N = 1) goes first and is not reported.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout

from temporalio.api.history.v1 import History
from temporalio.client import Client
from temporalio.testing import WorkflowEnvironment

from activities import AgentActivities
from activities.store import safe_name
from durable_agent.client import connect, ensure_search_attributes, start_run
from durable_agent.config import parse_config
from durable_agent.devserver import start_ephemeral_server
from durable_agent.run_io import AgentRunInput
from worker import build_worker


def make_file(path: Path, size: int) -> None:
    line = "the quick brown fox jumps over the lazy dog; 0123456789 " * 2
    text = "".join(f"{i:05d} {line}\n" for i in range(size // (len(line) + 7) + 1))
    path.write_text(text[:size])


def write_script(tmp: Path, n: int) -> Path:
    calls = [{"tool_calls": [{"name": "read", "input": {"file_path": "data.txt"}}]} for _ in range(n)]
    script = tmp / f"script-{n}.json"
    script.write_text(json.dumps({"responses": [*calls, {"text": f"read data.txt {n} times"}]}))
    return script


async def measure(client: Client, queue: str, workspace: Path, sinks: Path, n: int) -> dict[str, Any]:
    run = AgentRunInput(
        prompt=f"read {n}x", workspace=str(workspace), model=f"n{n}/bench", max_tool_rounds=n + 1
    )
    started = time.perf_counter()
    handle = await start_run(client, run, queue=queue, workflow_id=f"bench-{n}-{uuid.uuid4().hex[:8]}")
    try:
        result = await asyncio.wait_for(handle.result(), timeout=60 + 5 * n)
    except TimeoutError:  # e.g. an activity input over the 2 MB payload limit: the task fails forever
        await handle.terminate("boundary_cost: timed out")
        raise SystemExit(f"N={n}: no result in {60 + 5 * n} s (see the log above); terminated") from None
    wall = time.perf_counter() - started
    if result.status != "completed" or result.tool_calls_count != n:
        raise SystemExit(f"N={n}: {result.status} after {result.tool_calls_count} calls: {result.error}")
    # every execution of the run: it may have continued as new, so walk the chain back
    histories = []
    run_id: str | None = None
    while True:
        history = await client.get_workflow_handle(handle.id, run_id=run_id).fetch_history()
        histories.append(history)
        run_id = history.events[0].workflow_execution_started_event_attributes.continued_execution_run_id
        if not run_id:
            break
    events = sum(len(h.events) for h in histories)
    sizes = [History(events=h.events).ByteSize() for h in histories]
    proto_bytes = sum(sizes)
    folder = sinks / safe_name(result.session_id) / safe_name(result.run_id)
    export_bytes = sum(p.stat().st_size for p in folder.glob("turn-*.json"))
    return {
        "boundaries": n,
        "wall_s": round(wall, 3),
        "ms_per_boundary": round(wall * 1000 / n, 1),
        "executions": len(histories),
        "largest_execution_bytes": max(sizes),
        "history_events": events,
        "events_per_boundary": round(events / n, 1),
        "history_bytes_proto": proto_bytes,
        "history_bytes_json": sum(len(h.to_json()) for h in histories),
        "history_bytes_per_boundary": round(proto_bytes / n),
        "export_files": len(result.exports),
        "export_bytes": export_bytes,
        "export_bytes_per_boundary": round(export_bytes / n),
    }


COLUMNS = [  # header, key, format
    ("N", "boundaries", "{:>5}"),
    ("execs", "executions", "{:>5}"),
    ("wall s", "wall_s", "{:>8.2f}"),
    ("ms/b", "ms_per_boundary", "{:>8.1f}"),
    ("events", "history_events", "{:>7}"),
    ("ev/b", "events_per_boundary", "{:>6.1f}"),
    ("hist bytes", "history_bytes_proto", "{:>12,}"),
    ("hist B/b", "history_bytes_per_boundary", "{:>10,}"),
    ("export bytes", "export_bytes", "{:>13,}"),
    ("export B/b", "export_bytes_per_boundary", "{:>11,}"),
]


def print_table(rows: list[dict[str, Any]]) -> None:
    widths = [len(fmt.format(0)) for _, _, fmt in COLUMNS]
    print("  ".join(h.rjust(w) for (h, _, _), w in zip(COLUMNS, widths, strict=True)))
    for row in rows:
        print("  ".join(fmt.format(row[key]) for _, key, fmt in COLUMNS))
    if len(rows) >= 2:
        a, b = rows[0], rows[-1]
        dn = b["boundaries"] - a["boundaries"]

        def slope(key: str) -> float:
            return (b[key] - a[key]) / dn

        print(
            f"marginal boundary (N={a['boundaries']}→{b['boundaries']}): "
            f"{slope('wall_s') * 1000:.1f} ms, {slope('history_events'):.1f} events, "
            f"{slope('history_bytes_proto'):,.0f} history bytes (protobuf), "
            f"{slope('export_bytes'):,.0f} export bytes"
        )


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--boundaries", type=int, nargs="+", default=[1, 10, 50], metavar="N")
    parser.add_argument("--file-bytes", type=int, default=2000, help="size of the file each read returns")
    parser.add_argument("--json", action="store_true", help="also print one JSON line per N")
    args = parser.parse_args()
    if min(args.boundaries) < 1:
        parser.error("--boundaries must be at least 1")

    env: WorkflowEnvironment | None = None
    if os.environ.get("TEMPORAL_ADDRESS"):
        client = await connect()
        await ensure_search_attributes(client)
    else:
        saved_stdout = os.dup(1)  # the dev server inherits fd 1 and prints a banner: keep it out
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 1)
        try:
            env = await start_ephemeral_server(dev_server_log_level="error")
        finally:
            os.dup2(saved_stdout, 1)
            os.close(saved_stdout)
            os.close(devnull)
        client = env.client
    try:
        with tempfile.TemporaryDirectory(prefix="boundary-cost-") as tmp_name:
            tmp = Path(tmp_name)
            workspace = tmp / "workspace"
            workspace.mkdir()
            make_file(workspace / "data.txt", args.file_bytes)
            sizes = sorted({1, *args.boundaries})  # N = 1 also serves as the warm-up
            config = parse_config(
                {
                    "default_model": "n1/bench",
                    "providers": {
                        f"n{n}": {"kind": "scripted", "script": str(write_script(tmp, n))} for n in sizes
                    },
                    "store": {"path": str(tmp / "store")},
                    "sinks": {"local": {"kind": "filesystem", "path": str(tmp / "exports")}},
                    "permissions": {"allow": ["read(*)"], "default": "deny"},
                },
                tmp,
            )
            queue = f"bench-{uuid.uuid4().hex[:8]}"
            async with build_worker(client, AgentActivities(config), queue):
                await measure(client, queue, workspace, tmp / "exports", 1)  # warm-up
                rows = [await measure(client, queue, workspace, tmp / "exports", n) for n in args.boundaries]
        where = os.environ.get("TEMPORAL_ADDRESS") or "dev server (in memory)"
        print(f"boundary cost: read of a {args.file_bytes}-byte file per boundary; server: {where}")
        print("history bytes = protobuf ByteSize() of the fetched history\n")
        print_table(rows)
        if args.json:
            print()
            for row in rows:
                print(json.dumps({**row, "file_bytes": args.file_bytes}))
    finally:
        if env is not None:
            await env.shutdown()


if __name__ == "__main__":
    asyncio.run(main())
