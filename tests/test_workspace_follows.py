"""The workspace follows the run: workers on machines that do not share a disk.

Each "machine" is a ``python worker.py`` in a mount namespace of its own
(``unshare --mount``), where the run's workspace path is a folder of that machine alone
(bind-mounted over it), with its own state folder (``XDG_STATE_HOME``: its shadow
repositories); the session store and the export sink are one PostgreSQL database, and nothing
else is shared. Both disks start with the same files.

- ``kill -9`` of the run's host after its 4th export: the other machine takes the run over,
  restores the files from the sink, and the run ends with every file written on either machine,
  at the tree the same script gives on one machine.
- A host stopped (``SIGSTOP``) in the middle of a ``bash`` call until the run moves, then
  resumed: its late work changes nothing the run sees; then the other machine is stopped and
  the run comes back to the first, whose copy is restored again. Calls run on both machines.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from temporalio.client import Client, WorkflowHandle

from durable_agent.activities.pg_sink import PostgresExportSink
from durable_agent.activities.workspaces.shadow import ShadowRepo
from durable_agent.client import start_run
from durable_agent.core.events import EventRecord, ToolEndEvent, WorkspaceRestoredEvent
from durable_agent.core.run_api import AgentRunInput, AgentRunResult
from tests.test_crash_recovery import REPO_ROOT, _toml_str

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("unshare") is None,
    reason="machines without a shared disk need mount namespaces: root and unshare",
)

DSN_ENV = "AGENT_TEST_FOLLOW_PG_DSN"
FILES = 8


class Machine:
    """One machine: a worker process in a mount namespace of its own, its own disk at the
    workspace's path, its own state folder."""

    def __init__(self, client: Client, tmp: Path, name: str, workspace: Path, script: Path, dsn: str) -> None:
        self.name = name
        self.home = tmp / name
        self.disk = self.home / "disk"  # what the machine sees at ``workspace``
        self.disk.mkdir(parents=True)
        self.workspace = workspace
        self.log = self.home / "worker.log"
        config = self.home / "worker.toml"
        config.write_text(
            f"""
default_model = "scripted/static"
default_sink = "db"
default_workspace = {_toml_str(workspace)}

[providers.scripted]
kind = "scripted"
script = {_toml_str(script)}

[store]
kind = "postgres"
dsn_env = "{DSN_ENV}"

[sinks.db]
kind = "postgres"
dsn_env = "{DSN_ENV}"

[permissions]
allow = ["read(**)", "write(**)", "bash"]
default = "deny"

[workspaces]
host_wait_seconds = 2

# A stopped worker's last polls still take tasks (each then times out on its heartbeat): a call
# needs more attempts than those polls to reach the other machine.
[timeouts]
tool_max_attempts = 12
model_max_attempts = 12
"""
        )
        self.env = {
            **os.environ,
            "TEMPORAL_ADDRESS": client.service_client.config.target_host,
            "TEMPORAL_NAMESPACE": client.namespace,
            "AGENT_CONFIG": str(config),
            "XDG_STATE_HOME": str(self.home / "state"),
            DSN_ENV: dsn,
            "PYTHONUNBUFFERED": "1",
        }
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, queue: str) -> int:
        """The machine's worker, its disk mounted at the workspace's path in its own namespace."""
        self.env["AGENT_TASK_QUEUE"] = queue
        inner = f"mount --bind {self.disk} {self.workspace} && exec {sys.executable} worker.py"
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(
                ["unshare", "--mount", "--propagation", "private", "--", "sh", "-c", inner],
                cwd=REPO_ROOT,
                env=self.env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        return self.proc.pid

    def signal(self, sig: signal.Signals) -> None:
        assert self.proc is not None
        os.killpg(self.proc.pid, sig)  # its session: the worker and the commands it runs

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGCONT)
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)


@pytest.fixture
def machines(client: Client, tmp_path: Path, pg_dsn: str) -> Iterator[tuple[Machine, Machine, Path]]:
    workspace = tmp_path / "workspace"  # the path runs name; each machine mounts its own disk there
    workspace.mkdir()
    script = tmp_path / "script.json"
    pair = (
        Machine(client, tmp_path, "machine-a", workspace, script, pg_dsn),
        Machine(client, tmp_path, "machine-b", workspace, script, pg_dsn),
    )
    for machine in pair:  # the same files on both disks
        (machine.disk / "README.md").write_text("# the project\n")
        (machine.disk / "src").mkdir()
        (machine.disk / "src" / "app.py").write_text("print('app')\n")
    try:
        yield pair[0], pair[1], script
    finally:
        for machine in pair:
            machine.kill()
            if machine.log.exists():
                print(f"--- {machine.name} ---\n{machine.log.read_text(errors='replace')[-4000:]}")


def expected_tree(tmp: Path, files: dict[str, str]) -> str:
    """The tree of a folder holding ``files`` (the script run on one machine)."""
    folder = tmp / f"expected-{uuid.uuid4().hex[:6]}"
    for name, text in files.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text(text)
    return ShadowRepo(tmp / "expected-shadow", folder).record().tree


def call(call_id: str, name: str, **args: Any) -> dict[str, Any]:
    return {"id": call_id, "name": name, "input": args}


async def exports(dsn: str, result_or_handle: AgentRunResult | tuple[str, str]) -> int:
    session, run = (
        (result_or_handle.session_id, result_or_handle.run_id)
        if isinstance(result_or_handle, AgentRunResult)
        else result_or_handle
    )
    sink = PostgresExportSink(dsn, name="db")
    try:
        return len(await sink.series(session, run))
    finally:
        await sink.aclose()


async def test_kill_9_of_the_host_and_the_other_machine_takes_the_run_over_with_its_files(
    client: Client, machines: tuple[Machine, Machine, Path], pg_dsn: str, tmp_path: Path
) -> None:
    a, b, script = machines
    writes = [
        {
            "tool_calls": [call(f"w{i}", "write", file_path=f"f{i}.txt", content=f"file {i}\n")],
            "delay_ms": 300,
        }
        for i in range(FILES)
    ]
    cat = {"tool_calls": [call("cat", "bash", command="cat f*.txt")], "delay_ms": 100}
    script.write_text(json.dumps({"responses": [*writes, cat, {"text": "all written"}]}))
    queue = f"follow-{uuid.uuid4().hex[:8]}"
    a.start(queue)
    handle = await start_run(
        client, AgentRunInput(prompt="write the files", max_tool_rounds=FILES + 3), queue=queue
    )
    session, run = handle.id, (await handle.describe()).run_id
    # the run's host after its 4th export: machine A, the only worker so far
    for _ in range(600):
        if await exports(pg_dsn, (session, run)) >= 4:
            break
        await asyncio.sleep(0.05)
    else:
        raise AssertionError("the run did not reach its 4th export")
    b.start(queue)
    a.signal(signal.SIGKILL)
    result = await asyncio.wait_for(handle.result(), 120)

    assert result.status == "completed", result
    files = {"README.md": "# the project\n", "src/app.py": "print('app')\n"}
    files |= {f"f{i}.txt": f"file {i}\n" for i in range(FILES)}
    assert result.workspace is not None
    assert result.workspace.final == expected_tree(tmp_path, files), "the final tree is not the script's"
    start = {k: files[k] for k in ("README.md", "src/app.py")}
    assert result.workspace.base == expected_tree(tmp_path, start)
    # the change set: every file the run wrote, on either machine
    assert result.workspace.files == tuple(f"f{i}.txt" for i in range(FILES))
    assert all(f"+file {i}" in result.workspace.diff for i in range(FILES)), result.workspace.diff
    # every file written before the kill is on the machine that took over, and ``cat`` saw all
    for i in range(FILES):
        assert (b.disk / f"f{i}.txt").read_text() == f"file {i}\n"
    events = await _events(handle)
    cat_end = next(e for e in events if isinstance(e, ToolEndEvent) and e.id == "cat")
    assert cat_end.output.count("file ") == FILES, cat_end.output
    restored = [e for e in events if isinstance(e, WorkspaceRestoredEvent)]
    assert restored and restored[0].reason == "moved", restored
    assert restored[0].objects > 0 and restored[0].bytes > 0
    # the model was told in the result of the call that restored the copy
    told = next(e for e in events if isinstance(e, ToolEndEvent) and e.id == restored[0].id)
    assert "did not come along" in told.output


async def _events(handle: WorkflowHandle[Any, AgentRunResult]) -> list[Any]:
    """The run's events as its ``events`` query gives them (a closed run answers it by replay)."""
    return [r.event for r in await handle.query("events", 0, result_type=list[EventRecord])]


async def until_exports(dsn: str, handle: WorkflowHandle[Any, AgentRunResult], count: int) -> None:
    """Wait until the sink holds ``count`` exports of the run."""
    run = (await handle.describe()).run_id
    for _ in range(1200):
        if await exports(dsn, (handle.id, run)) >= count:
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"the run did not reach export {count}")


async def test_a_stopped_host_s_late_work_changes_nothing_and_calls_run_on_both_machines(
    client: Client, machines: tuple[Machine, Machine, Path], pg_dsn: str, tmp_path: Path
) -> None:
    a, b, script = machines
    stamp = "date +%s%N >> out.txt"
    script.write_text(
        json.dumps(
            {
                "responses": [
                    {"tool_calls": [call("w1", "write", file_path="a.txt", content="a\n")], "delay_ms": 200},
                    # the host is stopped while this sleeps: the call runs again on the other machine
                    {"tool_calls": [call("b1", "bash", command=f"touch started; sleep 3; {stamp}")]},
                    # then that machine is stopped while the model answers: the run comes back
                    {"tool_calls": [call("r1", "read", file_path="out.txt")], "delay_ms": 2500},
                    {"tool_calls": [call("b2", "bash", command=f"{stamp}; cat out.txt a.txt")]},
                    {"text": "done"},
                ]
            }
        )
    )
    queue = f"follow-{uuid.uuid4().hex[:8]}"
    a.start(queue)
    b.start(queue)
    handle = await start_run(client, AgentRunInput(prompt="stamp it", max_tool_rounds=8), queue=queue)
    first: Machine | None = None
    for _ in range(1200):
        first = next((m for m in (a, b) if (m.disk / "started").exists()), None)
        if first is not None:
            break
        await asyncio.sleep(0.02)
    assert first is not None, "the bash call never started"
    other = b if first is a else a
    first.signal(signal.SIGSTOP)  # mid-call: its ``sleep 3`` and what follows wait with it
    await until_exports(pg_dsn, handle, 2)  # the call ran again on the other machine
    first.signal(signal.SIGCONT)
    other.signal(signal.SIGSTOP)  # while the model answers: the run goes back to the first
    await until_exports(pg_dsn, handle, 3)
    other.signal(signal.SIGCONT)
    result = await asyncio.wait_for(handle.result(), 120)

    assert result.status == "completed", result
    events = await _events(handle)
    restored = [e for e in events if isinstance(e, WorkspaceRestoredEvent)]
    assert [(e.id, e.reason) for e in restored] == [("b1", "moved"), ("r1", "moved")], restored
    assert restored[0].host != restored[1].host and restored[1].from_host == restored[0].host
    # the other machine's stamp is the run's: the stopped host's late one never reached it
    line = (other.disk / "out.txt").read_text().splitlines()[0]
    ends = {e.id: e for e in events if isinstance(e, ToolEndEvent)}
    assert ends["r1"].output.splitlines()[0].endswith(line), ends["r1"].output
    stamps = [line for line in ends["b2"].output.splitlines() if not line.startswith("[exit code")]
    assert len(stamps) == 3 and stamps[0] == line and stamps[2] == "a", ends["b2"].output
    # the first machine's copy is the run's final tree: restored over its late work, then changed
    assert (first.disk / "out.txt").read_text().splitlines() == stamps[:2]
    assert result.workspace is not None
    assert result.workspace.final == ShadowRepo(tmp_path / "check-shadow", first.disk).record().tree
