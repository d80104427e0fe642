"""What one tool boundary costs in Temporal history, ours against the naive design.

Run it from the repository root:

    python bench/boundary_cost.py                      # N = 10 50 200 1000, 20 KB tool outputs
    python bench/boundary_cost.py --boundaries 10 50   # a quick look
    python bench/boundary_cost.py --boundaries 10 50 --naive-max 50 --json
    python bench/boundary_cost.py --boundaries 200 --window 128000   # the tokens a run sends

It starts its own Temporal dev server (``temporal server start-dev``, in
memory, log level ``warn``, its log in a file it scans) unless
``TEMPORAL_ADDRESS`` is set, then runs in-process workers. For each N, two
runs of the same scripted conversation, N ``read`` calls of one 20,000-byte
file (``--file-bytes``), one call a step, then an answer. The model
(``bench/tokens.py``) counts every request as the test wire servers do and
refuses one over its context window (``--window``, 128,000 tokens; 0: none)
with OpenAI's own overflow answer; ours knows the window
(``context_window`` of its provider) and manages its context:

* ours: an ``AgentRun`` (``start_run``). Each boundary's checkpoint export goes
  to a sink of the bench's own (``bench/digest_sink.py``) that checks its digest and
  keeps only the last one: a 1,000-boundary run exports about 12 GB in all,
  too much for the filesystem sink;
* naive: ``NaiveAgentRun`` (``bench/naive.py``), which keeps the conversation
  in the workflow and sends all of it with every model call. Its history
  passes the server's 50 MB limit near 70 boundaries and the server terminates
  it; with a window, its requests pass the window long before (near 21
  boundaries for 128,000 tokens) and the model refuses them. After the N where
  it failed, and above ``--naive-max``, it is not run again (``—``).

Columns, per N and design (``/b`` = divided by the boundaries the run completed):

* ``execs``: executions of the run (ours continues as new as its history grows);
* ``ev/b``: history events; ``hist B/b``: history bytes, the protobuf
  ``ByteSize()`` of the fetched history; both summed over every execution;
* ``ratio``: history bytes / conversation bytes, the canonical JSON of the
  conversation at the last tool boundary (ours: the last export's messages;
  naive: the last model call's input). The goal: at most 2 at every N;
* ``ms/b``: wall time from start to result, as the client sees it;
* ``warn``: lines of the server log naming this workflow id that say
  ``exceeds warn limit`` / ``exceeds error limit`` (history size or count,
  mutable state) or ``Blob data size exceeds`` (one payload over 512 KB); the
  server throttles these lines, so a count of lines, not of events
  (``bench/runs.py`` has the messages). The goal: none for ours;
* ``tok sent``: prompt tokens sent to the model over the run, summed over its
  requests (summaries included) by the model's count; ``max req``: the largest
  request, its prompt and the ``max_tokens`` it asks room for (never over the
  window for ours);
* ``cmp%``: ours, the share of model steps whose request needed a compaction
  first (``context_compacted`` events before its ``model_usage``, up to the
  last boundary, from the last export's event log);
* ``outcome``: ``ok``, or how the run ended, at which boundary (details below the table).

``--json`` adds one line per N and design with every figure (export count and
bytes, largest execution, the warning messages). A warm-up run (N = 1) of each
design goes first and is not reported. The SDK's own warnings of a payload
over 512 KB (``TMPRL1103``) are counted too, in a line below the table.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout

from temporalio.api.history.v1 import History
from temporalio.client import Client, WorkflowHistory
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.worker import Worker

from bench.digest_sink import DigestSink
from bench.naive import NAIVE_MODEL, NAIVE_WORKFLOW, NaiveAgentRun, NaiveInput, NaiveModel
from bench.reader_setup import add_workload_arguments, make_file
from bench.runs import CoreLog, completed_calls, ending, fetch_chain, last_model_input, scan_warnings, settle
from bench.text_table import Column, formatted, padded
from bench.tokens import ReaderModel, Tally
from durable_agent.activities import AgentActivities
from durable_agent.client import connect, ensure_search_attributes, exit_process, start_run
from durable_agent.config import parse_config
from durable_agent.core.activity_api import TOOL_CALL
from durable_agent.core.canonical import canonical_bytes
from durable_agent.core.context import DEFAULT_RESERVE
from durable_agent.core.events import ContextCompactedEvent, ModelUsageEvent
from durable_agent.core.export import ExportError, RunRecord
from durable_agent.core.models import Message, ToolDefinition, ToolResultBlock
from durable_agent.core.run_api import AgentRunInput
from durable_agent.core.tool_specs import offered_tools
from durable_agent.devserver import start_dev_server, stop_dev_server
from durable_agent.worker import build_worker


def write_script(tmp: Path) -> Path:
    """A script for the config's entry; ``ReaderModel`` answers in its place."""
    script = tmp / "script.json"
    script.write_text(json.dumps({"responses": [{"text": "unused: ReaderModel answers"}]}))
    return script


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Bench:
    client: Client
    workspace: Path
    sink: DigestSink
    queue: str
    naive_queue: str
    system_prompt: str
    tools: tuple[ToolDefinition, ...]
    model: ReaderModel


# --- one run ------------------------------------------------------------------


def conversation_size(messages: tuple[Message, ...]) -> tuple[int, int]:
    """The conversation's canonical JSON bytes, and the characters of its last tool output."""
    outputs = [b.content for m in messages for b in m.content if isinstance(b, ToolResultBlock)]
    size = len(canonical_bytes([m.model_dump(mode="json") for m in messages]))
    return size, len(outputs[-1]) if outputs else 0


def token_figures(tally: Tally, record: RunRecord | None) -> dict[str, Any]:
    """What the run sent the model; with ours' event log, how many steps needed a compaction."""
    row: dict[str, Any] = {
        "model_requests": len(tally.requests),
        "summary_requests": tally.summaries,
        "tokens_sent": tally.sent,
        "largest_request": tally.largest,
        "refused_requests": len(tally.refused),
        "refused_tokens": tally.refused[0] if tally.refused else None,
    }
    if record is not None:
        steps = compacted = compactions = 0
        pending = False
        for item in record.events:
            if isinstance(item.event, ContextCompactedEvent):
                compactions += 1
                pending = True
            elif isinstance(item.event, ModelUsageEvent):
                steps += 1
                compacted += pending
                pending = False
        row |= {
            "compactions": compactions,
            "steps_counted": steps,
            "compacted_steps": compacted,
            "compaction_share_pct": round(100 * compacted / steps, 1) if steps else None,
        }
    return row


def figures(
    n: int, histories: list[WorkflowHistory], done: int, wall: float, messages: tuple[Message, ...]
) -> dict[str, Any]:
    sizes = [History(events=h.events).ByteSize() for h in histories]
    events = sum(len(h.events) for h in histories)
    conversation, output_chars = conversation_size(messages)
    per = max(done, 1)
    return {
        "boundaries": n,
        "completed_boundaries": done,
        "workflow_id": histories[0].workflow_id,
        "wall_s": round(wall, 3),
        "ms_per_boundary": round(wall * 1000 / per, 1),
        "executions": len(histories),
        "history_events": events,
        "events_per_boundary": round(events / per, 1),
        "history_bytes": sum(sizes),
        "history_bytes_per_boundary": round(sum(sizes) / per),
        "largest_execution_bytes": max(sizes),
        "conversation_bytes": conversation,
        "history_to_conversation": round(sum(sizes) / conversation, 2) if conversation else None,
        "tool_output_chars": output_chars,
    }


async def measure_ours(b: Bench, n: int) -> dict[str, Any]:
    run = AgentRunInput(
        prompt=f"read data.txt {n} times",
        workspace=str(b.workspace),
        model=f"reader/n{n}",
        max_tool_rounds=n + 1,
    )
    workflow_id = f"bench-ours-{n}-{uuid.uuid4().hex[:8]}"
    started, window = time.perf_counter(), time.time()
    handle = await start_run(b.client, run, queue=b.queue, workflow_id=workflow_id)
    problem = await settle(handle, 120 + 2 * n)
    wall = time.perf_counter() - started
    histories = await fetch_chain(b.client, workflow_id)
    if problem is None:
        result = await handle.result()
        problem = None if result.status == "completed" else f"{result.status}: {result.error}"
    else:
        problem = ending(histories[0])
    first_run = histories[-1].events[0].workflow_execution_started_event_attributes.first_execution_run_id
    exports = b.sink.take(first_run)
    record: RunRecord | None = None
    try:  # opening re-validates the whole export: a while for 20 MB, once a run
        payload = exports.last.open() if exports.last else None
        messages = payload.logical_resume.messages if payload else ()
        record = payload.source_run() if payload else None
    except ExportError as exc:
        print(f"N={n}: the last export does not open: {exc}", file=sys.stderr)
        messages = ()
    done = completed_calls(histories, TOOL_CALL.name)
    row = figures(n, histories, done, wall, messages)
    return {
        **row,
        **token_figures(b.model.take(), record),
        "window": (window, window + wall),
        "design": "ours",
        "outcome": problem or "ok",
        "export_count": exports.count,
        "export_bytes": exports.content_bytes,
    }


async def measure_naive(b: Bench, n: int) -> dict[str, Any]:
    inp = NaiveInput(
        prompt=f"read data.txt {n} times",
        workspace=str(b.workspace),
        model=f"reader/n{n}",
        system_prompt=b.system_prompt,
        tools=b.tools,
        max_steps=n + 1,
    )
    workflow_id = f"bench-naive-{n}-{uuid.uuid4().hex[:8]}"
    started, window = time.perf_counter(), time.time()
    handle = await b.client.start_workflow(
        NAIVE_WORKFLOW, inp, id=workflow_id, task_queue=b.naive_queue, result_type=int
    )
    problem = await settle(handle, 60 + n)
    wall = time.perf_counter() - started
    histories = await fetch_chain(b.client, workflow_id)
    done = completed_calls(histories, TOOL_CALL.name)
    row = figures(n, histories, done, wall, last_model_input(histories, NAIVE_MODEL))
    outcome = "ok" if problem is None else ending(histories[0])
    tokens = token_figures(b.model.take(), None)
    return {**row, **tokens, "window": (window, window + wall), "design": "naive", "outcome": outcome}


# --- the table --------------------------------------------------------------------

OURS: list[Column] = [
    ("execs", "executions", "{}"),
    ("ev/b", "events_per_boundary", "{:.1f}"),
    ("hist B/b", "history_bytes_per_boundary", "{:,}"),
    ("ratio", "history_to_conversation", "{:.2f}"),
    ("ms/b", "ms_per_boundary", "{:.0f}"),
    ("warn", "server_warnings", "{}"),
    ("tok sent", "tokens_sent", "{:,}"),
    ("max req", "largest_request", "{:,}"),
    ("cmp%", "compaction_share_pct", "{:.0f}"),
]
NAIVE = OURS[1:-1]


def cells(row: dict[str, Any] | None, columns: list[Column], skipped: str) -> list[str]:
    if row is None:
        return ["—"] * len(columns) + [skipped]
    values = formatted(row, columns)
    if row["outcome"] == "ok":
        return [*values, "ok"]
    word = "died" if row["outcome"].startswith("terminated") else "failed"
    return [*values, f"{word} at b={row['completed_boundaries']}"]


def print_table(
    ns: list[int], ours: dict[int, dict[str, Any]], naive: dict[int, dict[str, Any]], skipped: dict[int, str]
) -> None:
    header = ["N", *(h for h, _, _ in OURS), "outcome", *(h for h, _, _ in NAIVE), "outcome"]
    table = [header] + [
        [str(n), *cells(ours[n], OURS, ""), *cells(naive.get(n), NAIVE, skipped.get(n, ""))] for n in ns
    ]
    lines = padded(table, left={i for i, h in enumerate(header) if h == "outcome"})
    split = 1 + len(OURS) + 1  # N, ours' columns and outcome
    n_width, lead = len(lines[0][0]), len("  ".join(lines[0][1:split]))  # the widths of N and of ours
    print(f"{'':>{n_width}}  {'ours: AgentRun':<{lead}} | naive: the whole conversation in each model call")
    for texts in lines:
        print("  ".join(texts[:split]) + " | " + "  ".join(texts[split:]).rstrip())
    for row in [*ours.values(), *naive.values()]:
        if row["outcome"] != "ok":
            print(f"  {row['design']} N={row['boundaries']}: {row['outcome']}")


def print_summary(
    ours: dict[int, dict[str, Any]], naive: dict[int, dict[str, Any]], unattributed: int | None
) -> None:
    first, last = ours[min(ours)], ours[max(ours)]
    ratios = [r["history_to_conversation"] for r in ours.values() if r["history_to_conversation"] is not None]
    growth = last["history_bytes_per_boundary"] / max(first["history_bytes_per_boundary"], 1)
    print(
        f"\nours: history bytes per boundary N={first['boundaries']}→{last['boundaries']}: "
        f"{first['history_bytes_per_boundary']:,} → {last['history_bytes_per_boundary']:,} (×{growth:.2f}); "
        f"history/conversation at most {max(ratios, default=float('nan')):.2f}"
    )
    dead = next((r for r in naive.values() if r["outcome"] != "ok"), None)
    if dead:
        print(f"naive: died at N={dead['boundaries']}, b={dead['completed_boundaries']}: {dead['outcome']}")
    ended = "completed" if last["outcome"] == "ok" else f"did not complete ({last['outcome']})"
    warned = (
        "server warnings not checked (TEMPORAL_ADDRESS is set)"
        if unattributed is None
        else f"{last['server_warnings']} limit warnings (history size or count, blob size) from the server"
    )
    sdk = [sum(r["sdk_payload_warnings"] for r in d.values()) for d in (ours, naive)]
    print(f"the SDK's warnings of a payload over 512 KB (TMPRL1103): ours {sdk[0]}, naive {sdk[1]}")
    print(f"largest ours run (N={last['boundaries']}): {ended}, {warned}")
    print_tokens(ours, naive)
    if unattributed:
        print(f"({unattributed} limit warnings in the server log name no workflow id)")


def print_tokens(ours: dict[int, dict[str, Any]], naive: dict[int, dict[str, Any]]) -> None:
    """Tokens sent, ours against naive, at the largest N; where the naive design passed the window."""
    last = ours[max(ours)]
    n = last["boundaries"]
    print(
        f"tokens sent over N={n}: ours {last['tokens_sent']:,} in {last['model_requests']} requests "
        f"({last['summary_requests']} for summaries), the largest {last['largest_request']:,}; "
        f"{last.get('compacted_steps', '?')} of {last.get('steps_counted', '?')} model steps "
        f"({last.get('compaction_share_pct', '?')} %) needed a compaction"
    )
    over = next((r for r in naive.values() if r["refused_requests"]), None)
    if over is not None:
        print(
            f"naive: the request after boundary {over['completed_boundaries']} "
            f"({over['refused_tokens']:,} tokens) was over the window and refused: the run failed there, "
            f"having sent {over['tokens_sent']:,} tokens"
        )
    elif naive:
        top = naive[max(naive)]
        print(f"naive: N={top['boundaries']} sent {top['tokens_sent']:,} tokens, the largest request "
              f"{top['largest_request']:,}")  # fmt: skip


async def run_all(client: Client, tmp: Path, args: argparse.Namespace) -> list[dict[str, Any]]:
    workspace = tmp / "workspace"
    workspace.mkdir()
    make_file(workspace / "data.txt", args.file_bytes)
    reader: dict[str, Any] = {"kind": "scripted", "script": str(write_script(tmp))}
    if args.window:
        reader["context_window"] = args.window
    config = parse_config(
        {
            "default_model": "reader/n1",
            "providers": {"reader": reader},
            "store": {"path": str(tmp / "store")},
            "default_sink": "bench",  # a name for the config; the bench's DigestSink takes its place
            "sinks": {"bench": {"kind": "filesystem", "path": str(tmp / "exports-unused")}},
            "permissions": {"allow": ["read(*)"], "default": "deny"},
        },
        tmp,
    )
    sink = DigestSink()
    # room for the answer: what ours keeps free for it when the provider sets no max_tokens
    model = ReaderModel(args.window or None, max_tokens=DEFAULT_RESERVE)
    acts = AgentActivities(config, sinks={"bench": sink}, providers={"reader": model})
    offers = offered_tools((t.spec for t in acts.tools.values()), config.permissions)
    tag = uuid.uuid4().hex[:8]
    b = Bench(client, workspace, sink, f"bench-{tag}", f"bench-naive-{tag}", config.system_prompt,
              tuple(t.offer().definition for t in offers), model)  # fmt: skip
    naive_worker = Worker(
        client,
        task_queue=b.naive_queue,
        workflows=[NaiveAgentRun],
        activities=[NaiveModel(acts.providers).model_call, acts.tool_calls.tool_call],
    )
    rows: list[dict[str, Any]] = []
    died: int | None = None
    async with build_worker(client, acts, b.queue), naive_worker:
        await measure_ours(b, 1)  # warm-up
        await measure_naive(b, 1)
        for n in args.boundaries:
            rows.append(await measure_ours(b, n))
            print(f"N={n}: ours {rows[-1]['outcome']} in {rows[-1]['wall_s']:.1f} s", file=sys.stderr)
            if died is None and n <= args.naive_max:
                rows.append(await measure_naive(b, n))
                print(f"N={n}: naive {rows[-1]['outcome']} in {rows[-1]['wall_s']:.1f} s", file=sys.stderr)
                died = n if rows[-1]["outcome"] != "ok" else None
    await acts.aclose()
    return rows


async def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_workload_arguments(parser)
    parser.add_argument(
        "--window", type=int, default=128_000, help="the model's context window in tokens (0: none)"
    )
    parser.add_argument(
        "--server-log", type=Path, help="keep the dev server's log here (default: a temp file)"
    )
    parser.add_argument("--json", action="store_true", help="also print one JSON line per N and design")
    args = parser.parse_args()
    if min(args.boundaries) < 1 or args.file_bytes < 100:
        parser.error("--boundaries must be at least 1 and --file-bytes at least 100")
    if args.window and args.window < 2 * DEFAULT_RESERVE:
        parser.error(f"--window must be 0 (none) or at least {2 * DEFAULT_RESERVE} tokens")
    args.boundaries = sorted(set(args.boundaries))
    with tempfile.TemporaryDirectory(prefix="boundary-cost-") as tmp_name:
        tmp = Path(tmp_name)
        log: Path | None = None
        core_log = CoreLog()
        if os.environ.get("TEMPORAL_ADDRESS"):
            client = await connect(runtime=core_log.runtime())
            await ensure_search_attributes(client)
            server = None
        else:
            log = args.server_log or tmp / "server.log"
            log.unlink(missing_ok=True)
            port = free_port()
            server = start_dev_server(port=port, ui_port=free_port(), log_file=log)
            client = await Client.connect(
                f"127.0.0.1:{port}", data_converter=pydantic_data_converter, runtime=core_log.runtime()
            )
        try:
            rows = await run_all(client, tmp, args)
        finally:
            if server is not None:
                stop_dev_server(server)
        unattributed = scan_warnings(log, rows) if log is not None else None
        core_log.count(rows)
    report(args, rows, unattributed)
    return 0


def report(args: argparse.Namespace, rows: list[dict[str, Any]], unattributed: int | None) -> None:
    ours = {r["boundaries"]: r for r in rows if r["design"] == "ours"}
    naive = {r["boundaries"]: r for r in rows if r["design"] == "naive"}
    died = next((n for n, r in naive.items() if r["outcome"] != "ok"), None)
    skipped = {
        n: f"(died at N={died})" if died is not None and n > died else "(above --naive-max)"
        for n in ours
        if n not in naive
    }
    where = os.environ.get("TEMPORAL_ADDRESS") or "dev server (in memory, log level warn)"
    chars = max(r["tool_output_chars"] for r in rows)
    print(f"\nboundary cost: a read of a {args.file_bytes:,}-byte file ({chars:,} characters of tool output) "
          f"per boundary; server: {where}")  # fmt: skip
    print("history bytes: protobuf ByteSize() of the fetched history; ratio: history / conversation bytes\n")
    print_table(args.boundaries, ours, naive, skipped)
    print_summary(ours, naive, unattributed)
    if args.json:
        print()
        for row in rows:
            print(json.dumps({**row, "file_bytes": args.file_bytes}))


if __name__ == "__main__":
    exit_process(asyncio.run(main()))
