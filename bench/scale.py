"""Throughput as the work grows: many runs at once on one worker, then 3 workers on PostgreSQL.

Run it from the repository root:

    python bench/scale.py                                   # C = 20 100 200, 20 steps a run
    python bench/scale.py --concurrency 5 20 --steps 5 --pg-runs 10 --pg-steps 5   # a quick look
    python bench/scale.py --concurrency 20 100 --steps 10 --json

It starts a Temporal dev server (``durable_agent/devserver.py``) unless
``TEMPORAL_ADDRESS`` is set (then ``--server-pid`` names its process, for its
CPU). Every worker is a process of its own (``bench/scale_worker.py``), so its
CPU and memory are its own; the runs are started and awaited from this process.
A run is the scripted reader conversation of ``bench/step_cost.py``: S
``read`` calls of one 20,000-byte file (``--file-bytes``), one a step.

Phase 1, one worker: for each design (ours: ``AgentRun`` with its exports to
the filesystem sink; naive: ``NaiveAgentRun`` unsandboxed) and each C of
``--concurrency``, a fresh worker with ``--slots`` (default max(100, C))
activity and local-activity slots (workflow-task slots: ours keeps its
``[worker] workflow_task_slots`` unless ``--workflow-task-slots`` says otherwise, the naive loop
gets ``--slots``) takes a warm-up run, then C
runs of ``--steps`` steps started at once. Printed per row:

* ``steps``: tool calls completed, ``local`` of them as local activities
  (``[tools] local_calls``; ``--remote-tools`` turns it off for ours);
  ``steps/s``: steps over the wall seconds from the first start to the last
  result; ``failed``: runs that did not complete; ``trouble``: workflow tasks
  and activities that timed out or failed (a timed-out workflow task is run
  again: a slow step and more CPU);
* ``p50 ms`` / ``p99 ms``: step latency, the server time between consecutive
  tool-call completions within a run (an ``ActivityTaskCompleted`` of
  ``agent.tool_call``, or the ``MarkerRecorded`` of a local ``agent.tool_call``:
  ``bench/step_history.py``), pooled over the runs;
* ``RSS MB`` before the runs, ``peak`` while they ran, ``after`` they ended,
  and ``KB/run`` = (peak - before) / C: the worker's memory per run in flight;
* CPU, between the first start and the last result: ``worker``, ``server``
  (the dev server) and ``bench`` (this process) in ms of CPU per step and in
  cores (CPU seconds over wall seconds), ``machine`` = busy cores of all
  (2 here: near 2 means the machine is the limit), ``others`` = the part of
  them spent outside these processes (other users of the machine, py-spy),
  and the worker's CPU by thread name (``python``: the interpreter's threads,
  which share one GIL; ``tokio-*``: the SDK core's).

At C = ``--profile-at`` (ours only), ``py-spy record --gil --nonblocking``
(``--py-spy``, default: on PATH) samples the worker for ``--profile-seconds``
from the first start (so the C runs' own starts weigh in, ``resolve_run``):
the 10 functions most often on top of the stack of the thread holding the GIL
(``own``) and anywhere in it (``total``, less the event loop's frames; ``ours``:
the project's functions only), as shares of the samples (``--profile-raw``
keeps py-spy's stacks); ``gil busy`` = samples over rate x seconds, roughly how
much of the time some thread held the GIL (near 1: the interpreter is the
limit). py-spy's own CPU is printed: it is in ``machine``, not in ``worker``.

Phase 2, PostgreSQL store and sink (``tests/pg_server.py`` starts a throwaway
server from Debian's binaries unless ``AGENT_TEST_PG_DSN`` names one): ours,
``--pg-runs`` runs of ``--pg-steps`` steps spread by the task queue over 1,
then ``--pg-workers`` worker processes: steps/s, p50/p99, CPU per step of the
workers, the dev server and PostgreSQL (all its processes), the workflow
tasks each worker completed, and ``ratio`` = steps/s with N workers over 1.
Without PostgreSQL's programs it says so and skips the phase.

``--json`` prints all of it as one JSON line at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout

from temporalio.client import Client, WorkflowHandle, WorkflowHistory
from temporalio.contrib.pydantic import pydantic_data_converter

from bench.pg_cost import DSN_ENV
from bench.proc_sample import Sampler, py_spy
from bench.reader_setup import prepare
from bench.runs import fetch_chain
from bench.scale_report import print_report
from bench.scale_worker import reader_bench
from bench.step_cost import Bench, free_port, interrupt, start_naive, start_ours
from bench.step_history import step_figures, trouble, wft_by_worker
from bench.takeover import drain, kill, wait_ready
from durable_agent.client import ensure_search_attributes, exit_process
from durable_agent.devserver import start_dev_server, stop_dev_server
from durable_agent.worker import connect_storage
from tests.pg_server import PG_DSN_ENV, LocalPostgres, pg_bin

Handle = WorkflowHandle[Any, Any]
WORKER_SCRIPT = Path(__file__).resolve().with_name("scale_worker.py")
# --- worker processes and runs ----------------------------------------------------------


@dataclass
class Setup:
    """What every batch shares: the bench (its ``queue`` set per batch), the server, the options."""

    b: Bench
    address: str
    server: int | None  # the Temporal server's pid, for its CPU
    args: argparse.Namespace
    postgres: bool = False  # the workers' store and sink on BENCH_PG_DSN's server
    pg: int | None = None  # that server's pid (its postmaster), for its CPU


@dataclass
class Batch:
    design: str
    workers: int
    runs: int
    steps: int
    profile: bool = False


def spawn(s: Setup, identity: str, design: str, slots: int, log: IO[bytes]) -> subprocess.Popen[bytes]:
    args = [sys.executable, str(WORKER_SCRIPT), "--base", str(s.b.base), "--queue", s.b.queue,
            "--identity", identity, "--design", design, "--slots", str(slots)]  # fmt: skip
    env = {**os.environ, "TEMPORAL_ADDRESS": s.address}
    flags = ["--postgres"] * s.postgres + ["--remote-tools"] * s.args.remote_tools
    flags += ["--workflow-task-slots", str(s.args.workflow_task_slots)] * bool(s.args.workflow_task_slots)
    return subprocess.Popen(args + flags, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log, env=env)


def stop(proc: subprocess.Popen[bytes], drained: threading.Thread | None) -> None:
    """Close the worker's standard input (it stops), wait up to 15 s (and for ``drained`` to copy
    the last of its output), then kill it."""
    if proc.stdin is not None:
        with contextlib.suppress(OSError):
            proc.stdin.close()
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(15)
    if drained is not None:
        drained.join(5)
    kill(proc)


async def finish(handles: list[Handle], limit: float) -> list[str | None]:
    """Each run's result: None when it completed, else why not; runs open after ``limit`` are terminated."""
    tasks = [asyncio.ensure_future(h.result()) for h in handles]
    _, pending = await asyncio.wait(tasks, timeout=limit)
    problems: list[str | None] = []
    for h, t in zip(handles, tasks, strict=True):
        if t in pending:
            t.cancel()
            with contextlib.suppress(Exception):
                await h.terminate("bench/scale: no result in time")
            problems.append(f"no result in {limit:.0f} s")
        elif t.exception() is not None:
            problems.append(f"{type(t.exception()).__name__}: {t.exception()}")
        else:
            result = t.result()  # the naive design's is an int
            status = getattr(result, "status", "completed")
            problems.append(None if status == "completed" else f"{status}: {getattr(result, 'error', '')}")
    return problems


async def histories(client: Client, handles: list[Handle]) -> list[list[WorkflowHistory]]:
    gate = asyncio.Semaphore(16)

    async def one(h: Handle) -> list[WorkflowHistory]:
        async with gate:
            return await fetch_chain(client, h.id)

    return await asyncio.gather(*(one(h) for h in handles))


def memory(before: float, peak: float, after: float, runs: int) -> dict[str, Any]:
    return {
        "rss_before_mb": round(before, 1),
        "rss_peak_mb": peak,
        "rss_after_mb": round(after, 1),
        "kb_per_run": round((peak - before) * 1024 / runs, 1),
    }


async def batch(s: Setup, job: Batch, procs: list[subprocess.Popen[bytes]]) -> dict[str, Any]:
    """A warm-up run, then ``job.runs`` runs of ``job.steps`` steps at once on the workers ``procs``."""
    b = s.b
    start = start_ours if job.design == "ours" else start_naive
    warm = await finish([await start(b, 1, b.queue)], 120)
    groups = {
        "worker": [p.pid for p in procs],
        "bench": [os.getpid()],
        "server": [s.server] if s.server else [],
    }
    groups |= {"postgres": [s.pg]} if s.pg else {}
    sampler = Sampler(
        groups, "worker", threads=procs[0].pid if len(procs) == 1 else None, trees=("postgres",)
    )
    before = sampler.rss()
    sampler.start()
    spy = None
    if job.profile:
        seconds = s.args.profile_seconds
        raw = s.args.profile_raw or b.base / "spy.txt"
        spy = asyncio.ensure_future(py_spy(s.args.py_spy, procs[0].pid, seconds, raw))
    started = time.perf_counter()
    handles = list(await asyncio.gather(*(start(b, job.steps, b.queue) for _ in range(job.runs))))
    problems = await finish(handles, s.args.limit)
    wall = time.perf_counter() - started
    cpu = await sampler.stop()
    after = sampler.rss()
    chains = await histories(b.client, handles)
    row: dict[str, Any] = {"design": job.design, "runs": job.runs, "workers": job.workers}
    row |= step_figures(chains, wall) | memory(before, cpu.pop("peak_mb"), after, job.runs)
    failed = [p for p in problems if p is not None]
    row |= {"failed": len(failed), "failures": failed[:3], "warm_up": warm[0] or "ok"}
    for name in groups:
        cpu[name]["ms_per_step"] = round(cpu[name]["cpu_s"] * 1000 / max(row["steps"], 1), 2)
    row |= {"cpu": cpu, "wft_by_worker": wft_by_worker(chains), "trouble": trouble(chains)}
    if spy is not None:
        row["profile"] = await spy
    print(
        f"{job.design} x{job.runs} on {job.workers} worker(s): {row['steps']} steps in {wall:.1f} s",
        file=sys.stderr,
    )
    return row


async def on_workers(s: Setup, job: Batch) -> dict[str, Any]:
    """Start ``job.workers`` worker processes on a fresh queue, run ``batch`` on them, stop them."""
    s.b.queue = f"scale-{job.design}-{job.runs}-{uuid.uuid4().hex[:6]}"
    slots = s.args.slots or max(100, job.runs)
    procs: list[subprocess.Popen[bytes]] = []
    drains: list[threading.Thread] = []
    with open(s.b.base / "workers.log", "ab") as log:
        try:
            for i in range(job.workers):
                identity = f"{s.b.queue}-w{i}"
                procs.append(spawn(s, identity, job.design, slots, log))
                await wait_ready(procs[-1], identity)
                drains.append(drain(procs[-1], log))
            row = await batch(s, job, procs)
        finally:
            for proc, thread in itertools.zip_longest(procs, drains):
                stop(proc, thread)
    return row | {"slots": slots}


# --- the phases ----------------------------------------------------------------------------


async def phase_one(
    client: Client, tmp: Path, address: str, server: int | None, args: argparse.Namespace
) -> Any:
    """One worker, each design at each C of ``--concurrency``: a row each."""
    base = tmp / "fs"
    prepare(base, args.file_bytes)
    s = Setup(reader_bench(client, base, "-"), address, server, args)
    rows = []
    for design in args.designs:
        for c in args.concurrency:
            profile = design == "ours" and c == args.profile_at and args.py_spy is not None
            rows.append(await on_workers(s, Batch(design, 1, c, args.steps, profile)))
            shutil.rmtree(base / "exports", ignore_errors=True)  # the sink's files of the runs
    await s.b.acts.aclose()
    return rows


async def phase_two(
    client: Client, tmp: Path, address: str, server: int | None, args: argparse.Namespace
) -> Any:
    """Ours on PostgreSQL, on 1 and on ``--pg-workers`` workers; or why it was skipped."""
    dsn = os.environ.get(PG_DSN_ENV)
    if dsn is None and (pg_bin("initdb") is None or pg_bin("pg_ctl") is None):
        return {"skipped": f"no PostgreSQL server programs here (initdb, pg_ctl) and {PG_DSN_ENV} is unset"}
    local = None if dsn else LocalPostgres()
    try:
        os.environ[DSN_ENV] = dsn or (local.dsn if local else "")
        base = tmp / "pg"
        prepare(base, args.file_bytes)
        postmaster = int((local.data / "postmaster.pid").read_text().split()[0]) if local else None
        s = Setup(reader_bench(client, base, "-", postgres=True), address, server, args, True, postmaster)
        await connect_storage(s.b.acts)  # the schema, once, before the workers race to make it
        await s.b.acts.aclose()
        rows = []
        for workers in sorted({1, args.pg_workers}):
            rows.append(await on_workers(s, Batch("ours", workers, args.pg_runs, args.pg_steps)))
        rows[-1]["ratio"] = round(rows[-1]["steps_per_s"] / max(rows[0]["steps_per_s"], 1e-9), 2)
        return {"rows": rows}
    finally:
        if local is not None:
            local.close()


async def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--concurrency", type=int, nargs="+", default=[20, 100, 200], metavar="C")
    parser.add_argument("--steps", type=int, default=20, help="tool steps a run (phase 1)")
    parser.add_argument("--designs", nargs="+", choices=("ours", "naive"), default=["ours", "naive"])
    parser.add_argument("--file-bytes", type=int, default=20_000, help="size of the file each read returns")
    parser.add_argument(
        "--slots", type=int, default=0, help="worker slots of each kind; default max(100, runs)"
    )
    parser.add_argument("--pg-runs", type=int, default=60)
    parser.add_argument("--pg-steps", type=int, default=20)
    parser.add_argument("--pg-workers", type=int, default=3)
    parser.add_argument("--skip-pg", action="store_true")
    parser.add_argument(
        "--workflow-task-slots", type=int, default=0, help="ours' workflow-task slots; default: its own"
    )
    parser.add_argument("--remote-tools", action="store_true", help="ours: every tool call an activity")
    parser.add_argument("--profile-at", type=int, default=100, help="C at which py-spy samples ours' worker")
    parser.add_argument("--profile-seconds", type=float, default=10.0)
    parser.add_argument(
        "--py-spy", default=shutil.which("py-spy"), help="the py-spy program (default: on PATH)"
    )
    parser.add_argument("--profile-raw", type=Path, help="keep py-spy's raw stacks in this file")
    parser.add_argument("--limit", type=float, default=900.0, help="seconds a batch of runs may take")
    parser.add_argument("--server-pid", type=int, help="the Temporal server's pid, with TEMPORAL_ADDRESS")
    parser.add_argument("--json", action="store_true", help="also everything as one JSON line")
    args = parser.parse_args()
    if min(args.concurrency) < 1 or args.steps < 2 or args.pg_steps < 2 or args.pg_runs < 1:
        parser.error("--concurrency and --pg-runs must be at least 1, --steps and --pg-steps at least 2")
    out: dict[str, Any] = {"load_before": os.getloadavg(), "cores": os.cpu_count(), "args": vars(args).copy()}
    with tempfile.TemporaryDirectory(prefix="scale-") as tmp_name:
        tmp = Path(tmp_name)
        server = None
        server_pid = args.server_pid
        if os.environ.get("TEMPORAL_ADDRESS"):
            address = os.environ["TEMPORAL_ADDRESS"]
        else:
            port = free_port()
            address = f"127.0.0.1:{port}"
            server = start_dev_server(port=port, ui_port=free_port(), log_file=tmp / "server.log")
            server_pid = server.pid
        try:
            client = await Client.connect(address, data_converter=pydantic_data_converter)
            await ensure_search_attributes(client)
            out["phase1"] = await phase_one(client, tmp, address, server_pid, args)
            if args.skip_pg:
                out["phase2"] = {"skipped": "--skip-pg"}
            else:
                out["phase2"] = await phase_two(client, tmp, address, server_pid, args)
        finally:
            if server is not None:
                stop_dev_server(server)
    out["load_after"] = os.getloadavg()
    print_report(out)
    if args.json:
        print(json.dumps(out, default=str))
    return 0


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, interrupt)
    exit_process(asyncio.run(main()))
