"""Three workers as three machines: one shared PostgreSQL, nothing else shared, kill -9 at random.

Each worker process has its own config and its own empty folders; the session
store and the export sink are the same PostgreSQL database. Three runs that
continue as new every few steps go on while the worker that holds a run is
killed with ``kill -9`` at random moments and a fresh one takes its place.
Every run must complete with one unbroken export series in the database.
"""

from __future__ import annotations

import asyncio
import json
import random
import uuid
from pathlib import Path
from typing import Any

import pytest
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowHandle

from durable_agent.activities.pg_sink import PostgresExportSink
from durable_agent.client import start_run
from durable_agent.core.run_api import AgentRunInput, AgentRunResult
from tests.helpers import tool_result_ids
from tests.test_crash_recovery import WorkerProcesses, _toml_str

STEPS = 12
RUNS = 3
KILLS = 4
DSN_ENV = "AGENT_TEST_MACHINES_PG_DSN"


def machine_config(tmp: Path, machine: int, workspace: Path, script: Path) -> Path:
    """One machine's worker config: its own folders; the store and the sink on PostgreSQL."""
    home = tmp / f"machine-{machine}"
    home.mkdir()
    config = home / "worker.toml"
    config.write_text(
        f"""
default_model = "scripted/static"
default_sink = "local"
default_workspace = {_toml_str(workspace)}

[providers.scripted]
kind = "scripted"
script = {_toml_str(script)}

[store]
kind = "postgres"
dsn_env = "{DSN_ENV}"

[sinks.local]
kind = "postgres"
dsn_env = "{DSN_ENV}"

[permissions]
allow = ["read(*)"]
default = "deny"

[limits]
continue_as_new_events = 50
"""
    )
    return config


def holder(events: Any) -> str | None:
    """The identity of the worker that took the run's newest workflow task."""
    started = [
        e.workflow_task_started_event_attributes.identity
        for e in events
        if e.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_STARTED
    ]
    return started[-1] if started else None


async def test_three_machines_one_database_kill_9_at_random(
    client: Client, tmp_path: Path, pg_dsn: str
) -> None:
    workspace = tmp_path / "workspace"
    workspace.mkdir()
    for i in range(STEPS):
        (workspace / f"f{i}.txt").write_text(f"file {i}\n" * 50)
    responses = [
        {
            "tool_calls": [{"id": f"r{i}", "name": "read", "input": {"file_path": f"f{i}.txt"}}],
            "delay_ms": 250,
        }
        for i in range(STEPS)
    ]
    script = tmp_path / "script.json"
    script.write_text(json.dumps({"responses": [*responses, {"text": "all read"}]}))
    configs = [machine_config(tmp_path, m, workspace, script) for m in range(1, 4)]
    machines = [
        WorkerProcesses(client, config, tmp_path / f"machine-{m + 1}.log") for m, config in enumerate(configs)
    ]
    queue = f"machines-{uuid.uuid4().hex[:8]}"
    for machine in machines:
        machine.queue = queue
        machine.env["AGENT_TASK_QUEUE"] = queue
        machine.env[DSN_ENV] = pg_dsn
    rng = random.Random()
    handles: list[WorkflowHandle[Any, AgentRunResult]] = []
    try:
        procs = {machine.start().pid: machine for machine in machines}
        for i in range(RUNS):
            run = AgentRunInput(
                prompt=f"read them all ({i})", workspace=str(workspace), max_tool_rounds=STEPS + 2
            )
            handles.append(await start_run(client, run, queue=queue))
        kills = 0
        while kills < KILLS:
            # a run still open, at a random moment: the machine holding it is the one killed (a
            # run that has ended may have ended on a machine already killed, and runs end sooner
            # as steps got faster: a pick among all of them could leave too few kills landed)
            await asyncio.sleep(rng.uniform(0.5, 2.0))
            running = [h for h in handles if not await _closed(h)]
            if not running:
                break
            target = holder((await rng.choice(running).fetch_history()).events)
            pid = int(target.split("@")[0]) if target and target.split("@")[0].isdigit() else None
            held = procs.pop(pid, None) if pid is not None else None
            if held is None:
                continue
            held.kill(next(p for p in held.procs if p.pid == pid))
            kills += 1
            procs[held.start().pid] = held  # the machine comes back, with its folders as they were
        results = [await asyncio.wait_for(h.result(), 240) for h in handles]
    finally:
        for machine in machines:
            machine.kill_all()
    assert kills >= 2, f"only {kills} kills landed: the runs finished too fast to test anything"
    sink = PostgresExportSink(pg_dsn, name="local")
    try:
        for result in results:
            assert result.status == "completed" and result.text == "all read", result
            series = await sink.series(result.session_id, result.run_id)
            turns = [d.turn for d in series]
            # one unbroken series: every turn once (a redelivery of the same bytes is one row)
            assert turns == list(range(1, STEPS + 1)), turns
            last = await sink.fetch(series[-1])
            assert last is not None
            ids = tool_result_ids(last)
            assert ids == [f"r{i}" for i in range(STEPS)]
            assert [e.turn for e in result.exports] == turns
    finally:
        await sink.aclose()


async def _closed(handle: WorkflowHandle[Any, Any]) -> bool:
    description = await handle.describe()
    return description.close_time is not None


pytestmark = pytest.mark.timeout(600)
