"""How long runs wait after their worker process is killed with ``kill -9`` (``bench/step_cost.py``).

A round: worker process A (``bench/takeover_worker.py``, a real subprocess on
a task queue of its own) takes ``runs`` runs of ``steps`` tool steps each;
once each has completed some tool calls, worker process B (the same script,
another identity) starts on the queue; once B polls, after a random pause, A
gets ``SIGKILL``. For each run, from its Temporal history (the server's event
times; ``time.time()`` at the kill, on the same machine):

* ``takeover``: the first ``ActivityTaskCompleted`` after the kill of an
  activity B started (the identity of its ``ActivityTaskStarted`` event),
  minus the kill time;
* ``resumed``: the same for an activity also *scheduled* after the kill, that
  is after a workflow task that ran on B. B polls the same queue before the
  kill and takes some of A's runs' activities, so ``takeover`` can be a call
  B already had in flight while the run itself still waits for A's sticky
  workflow task to time out; ``resumed`` is when the run moves again.

The runs are terminated and B is killed at the end of the round, and every
process the round started is killed on the way out, whatever happens.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import IO, Any

from temporalio.api.enums.v1 import EventType
from temporalio.api.history.v1 import HistoryEvent
from temporalio.client import Client, WorkflowHandle, WorkflowHistory

from bench.reader_setup import workspace_of
from bench.runs import call_times
from durable_agent.client import start_run
from durable_agent.core.activity_api import TOOL_CALL
from durable_agent.core.run_api import AgentRunInput
from durable_agent.plugin import HEARTBEAT_THROTTLE

WORKER_SCRIPT = Path(__file__).resolve().with_name("takeover_worker.py")
SCHEDULED = EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
STARTED = EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED
COMPLETED = EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED
STEPS_BEFORE_B = 3  # tool calls each run completes on A before B starts
RESUME_LIMIT_S = 180.0  # how long to wait for a run to move again after the kill


def when(event: HistoryEvent) -> float:
    """The event's server time, in seconds since the epoch."""
    return event.event_time.seconds + event.event_time.nanos / 1e9


def spawn(base: Path, queue: str, identity: str, address: str, log: IO[bytes]) -> subprocess.Popen[bytes]:
    env = {**os.environ, "TEMPORAL_ADDRESS": address}
    args = [sys.executable, str(WORKER_SCRIPT), "--base", str(base), "--queue", queue, "--identity", identity]
    return subprocess.Popen(args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log, env=env)


async def wait_ready(proc: subprocess.Popen[bytes], identity: str, timeout: float = 60) -> None:
    assert proc.stdout is not None
    try:
        line = await asyncio.wait_for(asyncio.to_thread(proc.stdout.readline), timeout)
    except TimeoutError:
        line = b""
    if line.strip() != b"ready":
        raise RuntimeError(f"worker {identity} did not start (exit code {proc.poll()}); see its log")


def drain(proc: subprocess.Popen[bytes], log: IO[bytes]) -> threading.Thread:
    """Copy the rest of the worker's standard output to ``log``, in a thread of its own. The SDK
    core writes its warnings there: a pipe nobody reads fills up (64 KB) and the core's thread
    that writes to it blocks, and with it the worker (it stops polling, its runs wait)."""
    assert proc.stdout is not None
    thread = threading.Thread(target=shutil.copyfileobj, args=(proc.stdout, log), daemon=True)
    thread.start()
    return thread


def kill(proc: subprocess.Popen[bytes]) -> None:
    """SIGKILL the process (by its pid) if it still runs, and reap it."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    for stream in (proc.stdin, proc.stdout):
        if stream is not None:
            with contextlib.suppress(OSError):
                stream.close()


async def executions_since(client: Client, workflow_id: str, since: float) -> list[WorkflowHistory]:
    """The run's latest execution, and the ones before it back to the first that started before ``since``."""
    histories: list[WorkflowHistory] = []
    run_id: str | None = None
    while True:
        history = await client.get_workflow_handle(workflow_id, run_id=run_id).fetch_history()
        histories.append(history)
        first = history.events[0]
        run_id = first.workflow_execution_started_event_attributes.continued_execution_run_id
        if not run_id or when(first) < since:
            return histories


def tool_calls_done(history: WorkflowHistory) -> int:
    return len(call_times(history, TOOL_CALL.name))  # ordinary or local


def after_kill(histories: list[WorkflowHistory], killed: float, b: str) -> tuple[float | None, float | None]:
    """Seconds from the kill to B's first completion, and to B's first of an activity scheduled after it."""
    first_any: float | None = None
    first_new: float | None = None
    for history in histories:
        scheduled = {e.event_id: when(e) for e in history.events if e.event_type == SCHEDULED}
        started = {
            e.event_id: e.activity_task_started_event_attributes.identity
            for e in history.events
            if e.event_type == STARTED
        }
        for e in history.events:
            if e.event_type != COMPLETED or when(e) <= killed:
                continue
            attrs = e.activity_task_completed_event_attributes
            if (started.get(attrs.started_event_id) or attrs.identity) != b:
                continue
            delay = when(e) - killed
            first_any = delay if first_any is None else min(first_any, delay)
            if scheduled.get(attrs.scheduled_event_id, 0.0) > killed:
                first_new = delay if first_new is None else min(first_new, delay)
    return first_any, first_new


async def wait_steps(client: Client, handles: list[WorkflowHandle[Any, Any]], limit_s: float) -> None:
    """Until every run has completed ``STEPS_BEFORE_B`` tool calls (or continued as new)."""
    deadline = time.monotonic() + limit_s
    pending = list(handles)
    while pending:
        if time.monotonic() > deadline:
            raise RuntimeError(f"{len(pending)} runs did not reach {STEPS_BEFORE_B} steps in {limit_s:.0f} s")
        await asyncio.sleep(0.5)
        for h in list(pending):
            history = await h.fetch_history()
            started = history.events[0].workflow_execution_started_event_attributes
            if started.continued_execution_run_id or tool_calls_done(history) >= STEPS_BEFORE_B:
                pending.remove(h)


async def one_round(
    client: Client, address: str, base: Path, runs: int, steps: int, number: int, rng: random.Random
) -> list[dict[str, Any]]:
    tag = uuid.uuid4().hex[:6]
    queue = f"takeover-{number}-{tag}"
    ids = {"A": f"bench-A-r{number}-{tag}", "B": f"bench-B-r{number}-{tag}"}
    procs: list[subprocess.Popen[bytes]] = []
    handles: list[WorkflowHandle[Any, Any]] = []
    with open(base / f"worker-r{number}.log", "ab") as log:
        try:
            procs.append(spawn(base, queue, ids["A"], address, log))
            await wait_ready(procs[0], ids["A"])
            drain(procs[0], log)
            for i in range(runs):
                run = AgentRunInput(
                    prompt=f"read data.txt {steps} times",
                    workspace=str(workspace_of(base)),
                    model=f"reader/n{steps}",
                    max_tool_rounds=steps + 1,
                )
                handles.append(await start_run(client, run, queue=queue, workflow_id=f"{queue}-run{i}"))
            await wait_steps(client, handles, 120)
            procs.append(spawn(base, queue, ids["B"], address, log))
            await wait_ready(procs[1], ids["B"])
            drain(procs[1], log)
            await asyncio.sleep(1.0 + rng.uniform(0.0, 2.0))  # B polls; A is killed at a random moment
            os.kill(procs[0].pid, signal.SIGKILL)
            killed = time.time()
            await asyncio.to_thread(procs[0].wait)
            return await follow(client, handles, killed, ids["B"], number)
        finally:
            for h in handles:
                with contextlib.suppress(Exception):
                    await h.terminate("step_cost: takeover round over")
            for proc in procs:
                kill(proc)


async def follow(
    client: Client, handles: list[WorkflowHandle[Any, Any]], killed: float, b: str, number: int
) -> list[dict[str, Any]]:
    """Watch each run's history until B moved it on after the kill (or ``RESUME_LIMIT_S`` passed)."""
    rows: dict[str, dict[str, Any]] = {
        h.id: {"round": number, "workflow_id": h.id, "takeover_s": None, "resumed_s": None} for h in handles
    }
    pending = list(handles)
    deadline = time.monotonic() + RESUME_LIMIT_S
    while pending and time.monotonic() < deadline:
        await asyncio.sleep(1.0)
        for h in list(pending):
            first_any, first_new = after_kill(await executions_since(client, h.id, killed), killed, b)
            rows[h.id] |= {"takeover_s": first_any, "resumed_s": first_new}
            if first_new is not None:
                pending.remove(h)
    return list(rows.values())


def spread(values: list[float | None]) -> dict[str, Any]:
    seen = [v for v in values if v is not None]
    return {
        "median_s": round(statistics.median(seen), 2) if seen else None,
        "max_s": round(max(seen), 2) if seen else None,
        "missing": len(values) - len(seen),
    }


async def measure_takeover(
    client: Client, address: str, base: Path, rounds: int, runs: int, steps: int, heartbeat_s: float
) -> dict[str, Any]:
    """``rounds`` rounds; the spread of ``takeover`` and ``resumed`` over every run of every round."""
    rng = random.Random()
    rows: list[dict[str, Any]] = []
    for number in range(1, rounds + 1):
        rows += await one_round(client, address, base, runs, steps, number, rng)
        print(f"takeover round {number}: done", file=sys.stderr)
    return {
        "group": "takeover",
        "rounds": rounds,
        "runs_per_round": runs,
        "steps_per_run": steps,
        "takeover": spread([r["takeover_s"] for r in rows]),
        "resumed": spread([r["resumed_s"] for r in rows]),
        "heartbeat_timeout_s": heartbeat_s,
        # a running activity heartbeats at most every 0.5 s (worker.py's max_heartbeat_throttle_interval)
        # at most one heartbeat a second a running activity (the throttle, ``plugin.HEARTBEAT_THROTTLE``)
        "heartbeats_per_s_at_100_runs": round(100 / HEARTBEAT_THROTTLE.total_seconds()),
        "runs": rows,
    }


def print_takeover(t: dict[str, Any], resume_limit: float = RESUME_LIMIT_S) -> None:
    def show(name: str, s: dict[str, Any]) -> str:
        fmt = "—" if s["median_s"] is None else f"median {s['median_s']:.2f} s, max {s['max_s']:.2f} s"
        gone = f" ({s['missing']} runs not within {resume_limit:.0f} s)" if s["missing"] else ""
        return f"  {name}{fmt}{gone}"

    print(f"\n5. takeover after kill -9: {t['rounds']} round(s) x {t['runs_per_round']} runs of "
          f"{t['steps_per_run']} steps; worker processes A then B on one queue, A killed")  # fmt: skip
    print(show("takeover (B's first activity completion after the kill): ", t["takeover"]))
    print(show("resumed  (B's first completion of an activity scheduled after the kill): ", t["resumed"]))
    print("  goal: <= 5 s")
    each = t["heartbeats_per_s_at_100_runs"] // 100
    print(f"  heartbeat traffic at 100 concurrent runs: 100 runs x {each} heartbeat/s a running activity = "
          f"{t['heartbeats_per_s_at_100_runs']} heartbeat calls/s at most (heartbeat timeout "
          f"{t['heartbeat_timeout_s']:g} s)")  # fmt: skip
