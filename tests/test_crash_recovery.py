"""kill -9 of a real ``python worker.py`` in the middle of a run, and a second worker finishing it.

Each test starts the worker as a separate process on its own task queue, lets
the run reach some tool boundaries, SIGKILLs the process (no shutdown, no
heartbeat, no goodbye), starts a fresh worker process and waits for the run.
The run must complete with every boundary exported exactly once per digest:
a boundary that was exported twice (the export activity retried after the
crash) must carry the same bytes both times.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from collections import defaultdict
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from temporalio.api.enums.v1 import EventType, PendingActivityState
from temporalio.client import Client, WorkflowHandle

from durable_agent.activities.sinks import read_export_file
from durable_agent.client import start_run
from durable_agent.core.activity_api import MODEL_CALL, TOOL_CALL
from durable_agent.core.run_api import AgentRunInput, AgentRunResult
from tests.helpers import activity_calls, until

REPO_ROOT = Path(__file__).resolve().parent.parent
N_CALLS = 6
EXPORT_NAME = re.compile(r"^turn-(\d{6})-([0-9a-f]{16})\.json$")
RESULT_TIMEOUT = 90.0


# --- set-up -------------------------------------------------------------------


def _toml_str(value: Path | str) -> str:
    return json.dumps(str(value))  # a JSON string is a valid TOML basic string


def write_setup(tmp: Path, responses: list[dict[str, Any]], extra: str = "") -> tuple[Path, Path, Path]:
    """Write the script and the worker's TOML config; return (config, workspace, sink root)."""
    workspace = tmp / "workspace"
    workspace.mkdir()
    for i in range(1, N_CALLS + 1):
        (workspace / f"file{i}.txt").write_text(f"evidence {i}\n" + "line\n" * i)
    script = tmp / "script.json"
    script.write_text(json.dumps({"responses": responses}))
    sink_root = tmp / "exports"
    config = tmp / "worker.toml"
    config.write_text(
        f"""
default_model = "scripted/static"
default_sink = "local"
default_workspace = {_toml_str(workspace)}

[providers.scripted]
kind = "scripted"
script = {_toml_str(script)}

[store]
kind = "filesystem"
path = {_toml_str(tmp / "store")}

[sinks.local]
kind = "filesystem"
path = {_toml_str(sink_root)}

[permissions]
allow = ["read(*)", "bash"]
default = "deny"

[timeouts]
heartbeat_seconds = 2
"""
        + extra
    )
    return config, workspace, sink_root


def read_responses(delay_ms: int = 300, slow: dict[int, int] | None = None) -> list[dict[str, Any]]:
    """N_CALLS responses of one ``read`` each, then a final text; ``slow`` maps index -> delay_ms."""
    responses: list[dict[str, Any]] = [
        {"tool_calls": [{"id": f"r{i}", "name": "read", "input": {"file_path": f"file{i}.txt"}}]}
        for i in range(1, N_CALLS + 1)
    ]
    responses.append({"text": "read every file"})
    for index, response in enumerate(responses):
        response["delay_ms"] = (slow or {}).get(index, delay_ms)
    return responses


@contextlib.asynccontextmanager
async def touching(path: Path) -> AsyncIterator[None]:
    """``path`` made again and again while the block runs: a retry of a call first restores the
    run's files (the workspace follows the run, docs/workspaces.md), which removes a file made
    while it restores."""

    async def touch() -> None:
        while True:
            path.touch()
            await asyncio.sleep(0.1)

    task = asyncio.create_task(touch())
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


class WorkerProcesses:
    """``python worker.py`` subprocesses sharing one task queue and one log file."""

    def __init__(self, client: Client, config: Path, log: Path) -> None:
        self.queue = f"crash-{uuid.uuid4().hex[:10]}"
        self.log = log
        self.procs: list[subprocess.Popen[bytes]] = []
        self.env = {
            **os.environ,
            "TEMPORAL_ADDRESS": client.service_client.config.target_host,
            "TEMPORAL_NAMESPACE": client.namespace,
            "AGENT_TASK_QUEUE": self.queue,
            "AGENT_CONFIG": str(config),
            "PYTHONUNBUFFERED": "1",
        }

    def start(self, *command: str) -> subprocess.Popen[bytes]:
        """A worker process: ``python worker.py``, or ``python COMMAND...`` (a test's own worker)."""
        with self.log.open("ab") as out:
            out.write(f"===== worker {len(self.procs) + 1} =====\n".encode())
            out.flush()
            proc = subprocess.Popen(
                [sys.executable, *(command or ("worker.py",))],
                cwd=REPO_ROOT,
                env=self.env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.procs.append(proc)
        return proc

    def kill(self, proc: subprocess.Popen[bytes]) -> None:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)

    def kill_all(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)  # its own session: only its group
                proc.wait(10)

    def log_text(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else "(no worker log)"


@contextmanager
def workers(client: Client, config: Path, tmp: Path) -> Iterator[WorkerProcesses]:
    procs = WorkerProcesses(client, config, tmp / "workers.log")
    ok = False
    try:
        yield procs
        ok = True
    finally:
        procs.kill_all()
        if not ok:
            print(f"--- worker log ({procs.log}) ---\n{procs.log_text()}")


# --- waiting ------------------------------------------------------------------


async def until_alive(
    what: str, check: Callable[[], Awaitable[bool]], timeout: float, procs: WorkerProcesses
) -> None:
    """``until``, failing at once should the newest worker process exit meanwhile."""

    def worker_runs() -> None:
        for proc in procs.procs[-1:]:
            assert proc.poll() is None, f"worker exited with {proc.returncode} while waiting for {what}"

    await until(what, check, timeout, still=worker_runs)


def export_files(sink_root: Path) -> list[Path]:
    return sorted(p for p in sink_root.rglob("turn-*.json") if EXPORT_NAME.match(p.name))


async def pending_activity(handle: WorkflowHandle[Any, Any], activity_type: str) -> tuple[int, bool] | None:
    """(attempt, started) of the pending activity of that type, if there is one."""
    desc = await handle.describe()
    for pa in desc.raw_description.pending_activities:
        if pa.activity_type.name == activity_type:
            return pa.attempt, pa.state == PendingActivityState.PENDING_ACTIVITY_STATE_STARTED
    return None


# --- checks -------------------------------------------------------------------


async def check_recovered_run(
    handle: WorkflowHandle[Any, AgentRunResult],
    sink_root: Path,
    pids: tuple[int, int],
    *,
    both_in_history: bool = True,
) -> AgentRunResult:
    """The run completed after its worker was killed, its exports whole and one per turn; with
    ``both_in_history``, both workers (``pids``: the killed one's, the second's) took part in it."""
    waited = time.monotonic()
    result = await asyncio.wait_for(handle.result(), RESULT_TIMEOUT)
    print(f"run finished {time.monotonic() - waited:.1f} s after the second worker started")
    assert result.status == "completed", result.error
    assert result.tool_calls_count == N_CALLS
    assert not result.export_failures
    assert not result.persistence_failures

    files = export_files(sink_root)
    digests_by_turn: dict[int, set[str]] = defaultdict(set)
    for path in files:
        export = read_export_file(path)
        payload = export.open()  # raises on any drift, truncation or bad encoding
        name = EXPORT_NAME.match(path.name)
        assert name is not None
        turn, prefix = name.groups()
        digest = export.descriptor.content_digest
        assert export.descriptor.turn == int(turn) == payload.logical_resume.turn, path
        assert digest.removeprefix("sha256:")[:16] == prefix, path
        assert export.descriptor.run_id == result.run_id
        digests_by_turn[int(turn)].add(digest)
    assert sorted(digests_by_turn) == list(range(1, N_CALLS + 1)), [p.name for p in files]
    print(f"{len(files)} export files for {len(digests_by_turn)} turns")
    for turn, digests in digests_by_turn.items():
        assert len(digests) == 1, f"turn {turn} was exported with different content: {digests}"

    assert [ref.turn for ref in result.exports] == list(range(1, N_CALLS + 1))
    for ref in result.exports:
        assert digests_by_turn[ref.turn] == {ref.content_digest}, ref

    if not both_in_history:  # the run continued as new: the history read below is its last execution's
        return result
    # Both worker processes took part: workflow tasks completed by each identity (pid@host).
    identities = set()
    async for event in handle.fetch_history_events():
        if event.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED:
            identities.add(event.workflow_task_completed_event_attributes.identity.split("@")[0])
    assert {str(pid) for pid in pids} <= identities, identities
    return result


async def retried_attempts(handle: WorkflowHandle[Any, Any], activity_type: str) -> list[int]:
    """The attempt of each completed activity of that type, in order."""
    scheduled: dict[int, str] = {}
    attempts: list[int] = []
    async for event in handle.fetch_history_events():
        if event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
            scheduled[event.event_id] = event.activity_task_scheduled_event_attributes.activity_type.name
        elif event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED:
            attrs = event.activity_task_started_event_attributes
            if scheduled.get(attrs.scheduled_event_id) == activity_type:
                attempts.append(attrs.attempt)
    return attempts


# --- tests --------------------------------------------------------------------


async def test_kill_9_after_two_exports_second_worker_finishes(client: Client, tmp_path: Path) -> None:
    config, workspace, sink_root = write_setup(tmp_path, read_responses(delay_ms=300))
    with workers(client, config, tmp_path) as procs:
        first = procs.start()
        handle = await start_run(
            client, AgentRunInput(prompt="read the files", workspace=str(workspace)), queue=procs.queue
        )

        async def two_exports() -> bool:
            return len(export_files(sink_root)) >= 2

        await until_alive("two export files", two_exports, 45, procs)
        procs.kill(first)
        assert len(export_files(sink_root)) < N_CALLS, "the run finished before the kill: no crash tested"
        second = procs.start()
        await check_recovered_run(handle, sink_root, (first.pid, second.pid))


async def test_kill_9_while_model_call_in_flight(client: Client, tmp_path: Path) -> None:
    # The 3rd model step (index 2) takes 5 s, on each attempt: the kill lands inside the first.
    config, workspace, sink_root = write_setup(tmp_path, read_responses(delay_ms=100, slow={2: 5_000}))
    with workers(client, config, tmp_path) as procs:
        first = procs.start()
        handle = await start_run(
            client, AgentRunInput(prompt="read the files", workspace=str(workspace)), queue=procs.queue
        )

        async def third_model_call_running() -> bool:
            pending = await pending_activity(handle, MODEL_CALL.name)
            return len(export_files(sink_root)) == 2 and pending is not None and pending[1]

        await until_alive("the 3rd model call to start", third_model_call_running, 45, procs)
        procs.kill(first)
        second = procs.start()
        await check_recovered_run(handle, sink_root, (first.pid, second.pid))
    model_attempts = await retried_attempts(handle, MODEL_CALL.name)
    assert model_attempts[2] >= 2, model_attempts  # the 3rd model call ran again after the kill
    assert all(a == 1 for i, a in enumerate(model_attempts) if i != 2), model_attempts


async def test_kill_9_while_tool_call_in_flight(client: Client, tmp_path: Path) -> None:
    # The 3rd tool call is a bash loop that waits for the test to create ``go``,
    # so it is in flight (and heartbeating) when the worker dies.
    responses = read_responses(delay_ms=100)
    command = "while [ ! -e go ]; do sleep 0.05; done; cat file3.txt"
    responses[2] = {"tool_calls": [{"id": "r3", "name": "bash", "input": {"command": command}}]}
    config, workspace, sink_root = write_setup(tmp_path, responses)
    with workers(client, config, tmp_path) as procs:
        first = procs.start()
        handle = await start_run(
            client, AgentRunInput(prompt="read the files", workspace=str(workspace)), queue=procs.queue
        )

        async def tool_attempt_running(attempt: int) -> bool:
            if len(export_files(sink_root)) != 2:  # after turn 2, the only tool call is the 3rd
                return False
            pending = await pending_activity(handle, TOOL_CALL.name)
            return pending is not None and pending[0] >= attempt and pending[1]

        await until_alive("the 3rd tool call to start", lambda: tool_attempt_running(1), 45, procs)
        assert len(export_files(sink_root)) == 2
        procs.kill(first)
        second = procs.start()
        await until_alive("the 3rd tool call to be retried", lambda: tool_attempt_running(2), 45, procs)
        async with touching(workspace / "go"):
            await check_recovered_run(handle, sink_root, (first.pid, second.pid))
    # the bash call is the one ordinary tool activity (the reads are local ones), run again
    tool_attempts = await retried_attempts(handle, TOOL_CALL.name)
    assert len(tool_attempts) == 1 and tool_attempts[0] >= 2, tool_attempts
    calls = activity_calls([e async for e in handle.fetch_history_events()])
    assert calls.count(("local", TOOL_CALL.name)) == N_CALLS - 1, calls


async def test_kill_9_as_the_run_continues_as_new(client: Client, tmp_path: Path) -> None:
    extra = "\n[limits]\ncontinue_as_new_events = 50\n"
    config, workspace, sink_root = write_setup(tmp_path, read_responses(delay_ms=150), extra)
    with workers(client, config, tmp_path) as procs:
        first = procs.start()
        handle = await start_run(
            client, AgentRunInput(prompt="read the files", workspace=str(workspace)), queue=procs.queue
        )

        async def continued() -> bool:
            return (await handle.describe()).run_id != handle.first_execution_run_id

        await until_alive("the run to continue as new", continued, 45, procs)
        procs.kill(first)  # the new execution's first workflow task is in flight, or only just done
        assert len(export_files(sink_root)) < N_CALLS, "the run finished before the kill: no crash tested"
        second = procs.start()
        result = await check_recovered_run(handle, sink_root, (first.pid, second.pid), both_in_history=False)
    assert (await handle.describe()).run_id != handle.first_execution_run_id
    assert result.run_id == handle.first_execution_run_id  # one run, whatever its executions
