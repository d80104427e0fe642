"""What a tool step costs in time and in export bytes, ours against the naive design, and a takeover.

Run it from the repository root:

    python bench/step_cost.py                    # everything: 10+ minutes
    python bench/step_cost.py --boundaries 10 50 --repeat 1 --throughput-runs 4 \\
        --throughput-steps 10 --takeover-rounds 1  # a quick look
    python bench/step_cost.py --skip-takeover --skip-throughput --json

It starts one Temporal dev server (in memory, as ``bench/boundary_cost.py``)
unless ``TEMPORAL_ADDRESS`` is set, and runs the scripted conversation of
``bench/tokens.py``: N ``read`` calls of one 20,000-byte file (``--file-bytes``),
one call a step, then an answer; the model has no context window, so the naive
design is not refused before the server stops it. Ours is an ``AgentRun``
(``start_run``) whose every tool boundary is exported to the real filesystem
sink (``[sinks]`` of the config, a fresh temp folder); naive is
``NaiveAgentRun`` (``bench/naive.py``). Steps are counted as completed
``agent.tool_call`` activities in the run's histories (every execution).
It prints numbers and never judges them; the goals are printed beside them.

1. ms per step, per N (``--boundaries``; a warm-up run of each design first):
   ``ms/step`` = wall time from start to result, as the client sees it, over
   the steps completed; the median of ``--repeat`` runs for N <= 200, one run
   above. The naive design runs up to N = 200 (``--naive-max``); its history
   passes the server's 50 MB limit near 70 steps and the server terminates it:
   then its ``ms/step`` is over the steps it completed and ``outcome`` says
   ``dies at b=K``. ``ours/naive``: the ratio of the two ``ms/step`` (goal <= 0.5).
   ``floor``: the same N steps of ``bench/floor.py``'s loop (one empty activity and
   its workflow task a step, ours' worker options), what the server and the SDK
   charge any design that makes an activity a step. Then where the step's time
   goes at the largest N, from the histories' event times (``bench/step_phases.py``)
   and, for local activities, a worker interceptor's clock.
2. Throughput: ``--throughput-runs`` runs of ``--throughput-steps`` steps at
   once on one worker (one ``Worker`` for the workflow and its activities),
   ours, then naive: steps completed / wall seconds, and ours/naive (goal >= 1).
   Ours runs workflow code without Temporal's sandbox (``worker.py``), the naive
   design with Temporal's defaults (sandboxed), as the published integrations
   do; a third phase runs the naive design unsandboxed too, for comparison.
   ``--throughput-rounds K`` runs the three phases K times, each round starting
   with the next design, and prints each design's median steps/s with its
   range, and each round's ratios: on a small machine one round's figures
   differ from the next by a fifth or more.
3. Sink bytes, per ours run: every byte under the sink's folder after the run
   (the folder is emptied between runs, so all of it is the run's), over its
   steps (``sink B/step``); the final export's ``size_bytes`` (its descriptor,
   read from the newest export file with ``read_export_file``); ``sink/final``
   = the sink's bytes over the final export's (goal <= ~2). Medians over repeats.
4. Flat in length, from the largest N's histories: the server time of each
   ``agent.tool_call`` completion; a boundary's duration is the time between
   two; the mean of the first 100 and of the last 100 and ``last/first`` (goal
   <= 1.2); history bytes (protobuf ``ByteSize()``, every execution) over the
   conversation's bytes (canonical JSON of the final export's messages; goal <= 1.5).
5. Takeover after ``kill -9`` (``bench/takeover.py``, which explains
   ``takeover`` and ``resumed``; goal <= 5 s), ``--takeover-rounds`` rounds, and
   the heartbeat traffic that 100 concurrent runs would send.

``--json`` adds one JSON line per figure group (steps, throughput, sink,
flat, takeover), every run's figures included.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import os
import shutil
import signal
import socket
import statistics
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout

from temporalio.api.history.v1 import History
from temporalio.client import Client, WorkflowHandle, WorkflowHistory
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.worker import UnsandboxedWorkflowRunner, Worker
from temporalio.worker.workflow_sandbox import SandboxedWorkflowRunner

from bench.floor import FLOOR_WORKFLOW, floor_worker
from bench.naive import NAIVE_WORKFLOW, NaiveAgentRun, NaiveInput, NaiveModel
from bench.reader_setup import (
    add_workload_arguments,
    prepare,
    reader_activities,
    reader_config,
    sink_root,
    workspace_of,
)
from bench.runs import CoreLog, call_times, completed_calls, ending, fetch_chain, settle
from bench.step_phases import LocalActivityClock, phases
from bench.step_report import report, summarize
from bench.takeover import measure_takeover
from durable_agent.activities import AgentActivities
from durable_agent.activities.sinks import read_export_file
from durable_agent.client import connect, ensure_search_attributes, exit_process, start_run
from durable_agent.core.activity_api import TOOL_CALL
from durable_agent.core.canonical import canonical_bytes
from durable_agent.core.run_api import AgentRunInput
from durable_agent.core.tool_specs import offered_tools
from durable_agent.devserver import start_dev_server, stop_dev_server
from durable_agent.worker import build_worker

Handle = WorkflowHandle[Any, Any]


@dataclass
class Bench:
    client: Client
    base: Path
    acts: AgentActivities
    sink: Path
    queue: str
    naive_queue: str
    naive: NaiveInput  # the naive design's input less the prompt, model and steps
    # times the local activities of the workers built on ``client``, when it is one of its interceptors
    clock: LocalActivityClock = field(default_factory=LocalActivityClock)
    floor_queue: str = ""  # the empty loop's (``bench/floor.py``)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# --- starting runs ------------------------------------------------------------------


async def start_ours(b: Bench, n: int, queue: str) -> Handle:
    run = AgentRunInput(
        prompt=f"read data.txt {n} times",
        workspace=str(workspace_of(b.base)),
        model=f"reader/n{n}",
        max_tool_rounds=n + 1,
    )
    return await start_run(b.client, run, queue=queue, workflow_id=f"step-ours-{n}-{uuid.uuid4().hex[:8]}")


async def start_naive(b: Bench, n: int, queue: str) -> Handle:
    inp = b.naive.model_copy(
        update={"prompt": f"read data.txt {n} times", "model": f"reader/n{n}", "max_steps": n + 1}
    )
    wid = f"step-naive-{n}-{uuid.uuid4().hex[:8]}"
    return await b.client.start_workflow(NAIVE_WORKFLOW, inp, id=wid, task_queue=queue, result_type=int)


NAIVE_UNSANDBOXED = "naive-unsandboxed"


def naive_worker(b: Bench, queue: str, *, sandboxed: bool = True) -> Worker:
    """The naive design's worker: Temporal's defaults (its workflow in the sandbox), as the
    published integrations run; ``sandboxed=False`` runs it as ours runs (``worker.py``)."""
    return Worker(
        b.client,
        task_queue=queue,
        workflows=[NaiveAgentRun],
        activities=[NaiveModel(b.acts.providers).model_call, b.acts.tool_calls.tool_call],
        workflow_runner=SandboxedWorkflowRunner() if sandboxed else UnsandboxedWorkflowRunner(),
    )


# --- what a run left behind ---------------------------------------------------------


def folder_bytes(root: Path) -> int:
    return sum(p.stat().st_size for p in root.rglob("*") if p.is_file())


def empty(root: Path) -> None:
    if root.exists():
        shutil.rmtree(root)
    root.mkdir(parents=True)


def final_export(root: Path, digest: str | None) -> tuple[int | None, int | None]:
    """The final export's ``size_bytes`` and its conversation's canonical bytes (None: not found).

    The newest file that reads as an export, preferring the one whose digest
    is the run's last export's (its result's ``exports``).
    """
    files = sorted((p for p in root.rglob("*") if p.is_file()), key=lambda p: p.stat().st_mtime, reverse=True)
    found = None
    for path in files[:20]:
        try:
            export = read_export_file(path)
        except Exception:
            continue
        found = found or export
        if digest is None or export.descriptor.content_digest == digest:
            found = export
            break
    if found is None:
        return None, None
    try:
        messages = found.open().logical_resume.messages
        conversation: int | None = len(canonical_bytes([m.model_dump(mode="json") for m in messages]))
    except Exception as exc:
        print(f"the final export does not open: {exc}", file=sys.stderr)
        conversation = None
    return found.descriptor.size_bytes, conversation


def step_times(histories: list[WorkflowHistory]) -> list[float]:
    """The server time of each ``agent.tool_call`` completion (ordinary or local), in order,
    over every execution."""
    return sorted(t for h in histories for t in call_times(h, TOOL_CALL.name))


def flatness(histories: list[WorkflowHistory], conversation: int | None) -> dict[str, Any]:
    times = step_times(histories)
    durations = [(b - a) * 1000 for a, b in itertools.pairwise(times)]
    k = min(100, len(durations) // 2)
    first = statistics.fmean(durations[:k]) if k else None
    last = statistics.fmean(durations[-k:]) if k else None
    history = sum(History(events=h.events).ByteSize() for h in histories)
    return {
        "boundaries_timed": len(durations),
        "window": k,
        "first_mean_ms": round(first, 1) if first is not None else None,
        "last_mean_ms": round(last, 1) if last is not None else None,
        "last_to_first": round(last / first, 2) if first and last is not None else None,
        "history_bytes": history,
        "conversation_bytes": conversation,
        "history_to_conversation": round(history / conversation, 2) if conversation else None,
    }


# --- one run ------------------------------------------------------------------------


async def measure(b: Bench, design: str, n: int, details: bool = False) -> dict[str, Any]:
    started = time.perf_counter()
    if design == "ours":
        handle = await start_ours(b, n, b.queue)
    else:
        handle = await start_naive(b, n, b.naive_queue)
    problem = await settle(handle, 300 + 2 * n)
    wall = time.perf_counter() - started
    histories = await fetch_chain(b.client, handle.id)
    done = completed_calls(histories, TOOL_CALL.name)
    digest = None
    if problem is None and design == "ours":
        result = await handle.result()
        problem = None if result.status == "completed" else f"{result.status}: {result.error}"
        digest = result.exports[-1].content_digest if result.exports else None
    elif problem is not None:
        problem = ending(histories[0])
    row: dict[str, Any] = {
        "design": design,
        "boundaries": n,
        "completed": done,
        "workflow_id": handle.id,
        "executions": len(histories),
        "wall_s": round(wall, 3),
        "ms_per_step": round(wall * 1000 / max(done, 1), 1),
        "outcome": problem or "ok",
        "phases": phases(histories, done) | b.clock.take(handle.id, done),
    }
    if design == "ours":
        sink_bytes = await asyncio.to_thread(folder_bytes, b.sink)
        final, conversation = await asyncio.to_thread(final_export, b.sink, digest)
        row |= {
            "sink_bytes": sink_bytes,
            "sink_bytes_per_step": round(sink_bytes / max(done, 1)),
            "final_export_bytes": final,
            "sink_to_final": round(sink_bytes / final, 2) if final else None,
        }
        if details:
            row["flat"] = flatness(histories, conversation)
        await asyncio.to_thread(empty, b.sink)
    print(f"{design} N={n}: {row['outcome']}, {done} steps in {wall:.1f} s", file=sys.stderr)
    return row


async def measure_floor(b: Bench, n: int) -> dict[str, Any]:
    """The empty loop of ``bench/floor.py``: ``n`` steps of one empty activity and its task."""
    started = time.perf_counter()
    wid = f"step-floor-{n}-{uuid.uuid4().hex[:8]}"
    await b.client.execute_workflow(FLOOR_WORKFLOW, n, id=wid, task_queue=b.floor_queue, result_type=int)
    wall = time.perf_counter() - started
    histories = await fetch_chain(b.client, wid)
    return {
        "design": "floor",
        "boundaries": n,
        "completed": n,
        "workflow_id": wid,
        "wall_s": round(wall, 3),
        "ms_per_step": round(wall * 1000 / n, 1),
        "outcome": "ok",
        "phases": phases(histories, n),
    }


async def throughput(b: Bench, design: str, runs: int, steps: int) -> dict[str, Any]:
    """``runs`` runs of ``steps`` steps at once on one worker: steps completed per second."""
    queue = f"step-tp-{design}-{uuid.uuid4().hex[:6]}"
    start = start_ours if design == "ours" else start_naive
    worker = build(b, queue) if design == "ours" else naive_worker(b, queue, sandboxed=design == "naive")
    async with worker:
        await settle(await start(b, 1, queue), 120)  # warm-up, not counted
        started = time.perf_counter()
        handles = await asyncio.gather(*(start(b, steps, queue) for _ in range(runs)))
        problems = await asyncio.gather(*(settle(h, 600 + 20 * steps) for h in handles))
        wall = time.perf_counter() - started
    done = 0
    for h in handles:
        done += completed_calls(await fetch_chain(b.client, h.id), TOOL_CALL.name)
    await asyncio.to_thread(empty, b.sink)
    failed = [p for p in problems if p is not None]
    print(f"throughput {design}: {done} steps in {wall:.1f} s, {len(failed)} runs failed", file=sys.stderr)
    return {
        "design": design,
        "runs": runs,
        "steps": steps,
        "completed": done,
        "wall_s": round(wall, 3),
        "steps_per_s": round(done / wall, 2),
        "failed_runs": len(failed),
        "failures": failed[:3],
    }


def build(b: Bench, queue: str) -> Worker:
    return build_worker(b.client, b.acts, queue)


# --- the whole bench ------------------------------------------------------------------


async def run_all(client: Client, address: str, tmp: Path, args: argparse.Namespace) -> dict[str, Any]:
    base = tmp / "bench"
    prepare(base, args.file_bytes)
    config = reader_config(base)
    acts, _model = reader_activities(config)
    offers = offered_tools((t.spec for t in acts.tools.values()), config.permissions)
    tag = uuid.uuid4().hex[:8]
    naive = NaiveInput(
        prompt="-", workspace=str(workspace_of(base)), model="reader/n1", system_prompt=config.system_prompt,
        tools=tuple(t.offer().definition for t in offers), max_steps=2,
    )  # fmt: skip
    clock = LocalActivityClock()
    timed = client.config()
    timed["interceptors"] = [clock]  # the workers built on this client run it too
    queues = f"step-{tag}", f"step-naive-{tag}"
    b = Bench(Client(**timed), base, acts, sink_root(config), *queues, naive, clock, f"step-floor-{tag}")
    empty(b.sink)
    rows: list[dict[str, Any]] = []
    out: dict[str, Any] = {"rows": rows, "throughput": [], "takeover": None}
    floor = floor_worker(b.client, b.floor_queue, config.worker.workflow_task_slots)
    async with build(b, b.queue), naive_worker(b, b.naive_queue), floor:
        await measure(b, "ours", 1)  # warm-up
        await measure(b, "naive", 1)
        await measure_floor(b, 1)
        for n in args.boundaries:
            for _ in range(args.repeat if n <= 200 else 1):
                rows.append(await measure(b, "ours", n, details=n == max(args.boundaries)))
                if n <= args.naive_max:
                    rows.append(await measure(b, "naive", n))
                rows.append(await measure_floor(b, n))
    if not args.skip_throughput:
        designs = ("ours", "naive", NAIVE_UNSANDBOXED)
        for round_ in range(args.throughput_rounds):
            # each round starts with the next design: no design always runs first (or last)
            for design in designs[round_ % 3 :] + designs[: round_ % 3]:
                result = await throughput(b, design, args.throughput_runs, args.throughput_steps)
                out["throughput"].append({**result, "round": round_ + 1})
    await acts.aclose()
    if not args.skip_takeover:
        base_t = tmp / "takeover"
        prepare(base_t, args.file_bytes)
        out["takeover"] = await measure_takeover(
            client, address, base_t, args.takeover_rounds, args.takeover_runs, args.takeover_steps,
            config.timeouts.heartbeat_seconds,
        )  # fmt: skip
    return out


async def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_workload_arguments(parser)
    parser.add_argument("--repeat", type=int, default=3, help="runs per N up to 200 (median); one above")
    parser.add_argument("--throughput-runs", type=int, default=20)
    parser.add_argument("--throughput-steps", type=int, default=50)
    parser.add_argument(
        "--throughput-rounds", type=int, default=1, help="rounds of the three phases (median and range)"
    )
    parser.add_argument("--takeover-rounds", type=int, default=3)
    parser.add_argument("--takeover-runs", type=int, default=10, help="runs a round")
    parser.add_argument("--takeover-steps", type=int, default=400, help="steps a run (never reached)")
    parser.add_argument("--skip-takeover", action="store_true")
    parser.add_argument("--skip-throughput", action="store_true")
    parser.add_argument("--json", action="store_true", help="also one JSON line per figure group")
    args = parser.parse_args()
    if min(args.boundaries) < 1 or args.repeat < 1 or args.throughput_rounds < 1 or args.file_bytes < 100:
        parser.error(
            "--boundaries, --repeat and --throughput-rounds must be at least 1, --file-bytes at least 100"
        )
    args.boundaries = sorted(set(args.boundaries))
    core_log = CoreLog()  # the SDK's payload-size warnings (the naive design's) kept off the terminal
    with tempfile.TemporaryDirectory(prefix="step-cost-") as tmp_name:
        tmp = Path(tmp_name)
        server = None
        if os.environ.get("TEMPORAL_ADDRESS"):
            address = os.environ["TEMPORAL_ADDRESS"]
            client = await connect(runtime=core_log.runtime())
            await ensure_search_attributes(client)
        else:
            port = free_port()
            address = f"127.0.0.1:{port}"
            server = start_dev_server(port=port, ui_port=free_port(), log_file=tmp / "server.log")
        try:
            if server is not None:
                client = await Client.connect(
                    address, data_converter=pydantic_data_converter, runtime=core_log.runtime()
                )
            results = await run_all(client, address, tmp, args)
        finally:
            if server is not None:
                stop_dev_server(server)
    report(args, summarize(args, results), results)
    return 0


def interrupt(_signum: int, _frame: object) -> None:
    """SIGTERM as Ctrl-C: the runs are terminated, the worker processes and the server stopped."""
    raise KeyboardInterrupt


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, interrupt)
    exit_process(asyncio.run(main()))
