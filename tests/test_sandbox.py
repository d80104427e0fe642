"""The ``bash`` tool's bubblewrap sandbox, tried the way a hostile command would try it.

These run bwrap for real: on Linux a missing or broken bubblewrap fails them
(CI installs it), it never skips them. Commands run in this process, as in a
worker, except where a real ``python worker.py`` is started to be killed.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from temporalio.client import Client

from durable_agent.activities import AgentActivities
from durable_agent.activities.tools import ToolFailure, builtin_tools, sandbox
from durable_agent.activities.tools.scratch import sweep_scratch
from durable_agent.activities.tools.tool import text_of
from durable_agent.client import run_result, start_run
from durable_agent.config import ConfigError, SandboxConfig, load_config
from durable_agent.core.run_api import AgentRunInput
from durable_agent.core.tool_specs import validate_args
from tests.helpers import final, running_worker, scripted_config, start, tool_call, until
from tests.test_cli import cli
from tests.test_crash_recovery import REPO_ROOT, until_alive, workers, write_setup

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="bubblewrap runs on Linux only")

SECRET = "sk-agent-test-secret-4242"
MISSING_BWRAP = "/nonexistent/bin/bwrap"
WORKER_REFUSAL = (
    f"worker: the bash sandbox cannot start: bubblewrap is not installed ({MISSING_BWRAP!r} not found):"
    f' {sandbox.INSTALL_HINT} (install bubblewrap, or set [sandbox] kind = "none" in the config to run'
    " bash unsandboxed)\n"
)


async def bash(ws: Path, command: str, settings: SandboxConfig | None = None, **args: Any) -> str:
    tool = builtin_tools(settings or SandboxConfig())["bash"]
    return text_of(await tool.run(validate_args(tool.spec, {"command": command, **args}), ws))


@pytest.fixture
def ws(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A workspace, and a worker whose environment holds a secret."""
    monkeypatch.setenv("AGENT_TEST_SECRET", SECRET)
    workspace = tmp_path / "ws"
    workspace.mkdir()
    return workspace


def marker() -> str:
    """A sleep length no other process on the machine uses: its argv finds the command's processes."""
    return f"{4000 + random.randrange(1000)}.{uuid.uuid4().int % 10**9:09d}"


def processes_with(text: str) -> list[int]:
    """Every process whose command line holds ``text`` (bwrap's holds the whole command)."""
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == os.getpid():
            continue
        with contextlib.suppress(OSError):
            if text.encode() in Path(f"/proc/{name}/cmdline").read_bytes() and sandbox.running(int(name)):
                found.append(int(name))
    return found


async def none_left(text: str, within: float = 3.0) -> bool:
    """True once no process has ``text`` in its command line; fails, naming them, after ``within`` s."""
    return await until(
        lambda: f"every process with {text!r} to end (left: {processes_with(text)})",
        lambda: not processes_with(text),
        within,
    )


@contextlib.asynccontextmanager
async def serving() -> AsyncIterator[tuple[int, list[str]]]:
    """A TCP server on 127.0.0.1 that says ``hello``; yields its port and who connected."""
    seen: list[str] = []

    async def greet(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        seen.append(str(writer.get_extra_info("peername")))
        writer.write(b"hello")
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(greet, "127.0.0.1", 0)
    async with server:
        yield server.sockets[0].getsockname()[1], seen


# --- the probe --------------------------------------------------------------------------------


def test_bubblewrap_is_installed_and_starts_here() -> None:
    assert sandbox.sandbox_problem(SandboxConfig()) is None
    assert sandbox.sandbox_problem(SandboxConfig(network=True)) is None
    assert sandbox.sandbox_problem(SandboxConfig(kind="none")) is None


def test_probe_names_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DURABLE_AGENT_BWRAP", MISSING_BWRAP)
    assert sandbox.sandbox_problem(SandboxConfig()) == (
        f"bubblewrap is not installed ({MISSING_BWRAP!r} not found): {sandbox.INSTALL_HINT}"
    )
    monkeypatch.setenv("DURABLE_AGENT_BWRAP", "no-such-bwrap")
    assert sandbox.sandbox_problem(SandboxConfig()) == (
        f"bubblewrap is not installed ('no-such-bwrap' not found on PATH): {sandbox.INSTALL_HINT}"
    )
    assert sandbox.sandbox_problem(SandboxConfig(kind="none")) is None


def test_probe_reports_what_bwrap_said(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake = tmp_path / "bwrap"
    fake.write_text("#!/bin/sh\necho 'bwrap: No permissions to create new namespace' >&2\nexit 1\n")
    fake.chmod(0o755)
    monkeypatch.setenv("DURABLE_AGENT_BWRAP", str(fake))
    problem = sandbox.sandbox_problem(SandboxConfig())
    assert problem is not None and problem.startswith(
        "bwrap cannot create its sandbox here: bwrap: No permissions to create new namespace (the kernel"
    )
    monkeypatch.delenv("DURABLE_AGENT_BWRAP")
    missing = tmp_path / "not-there"
    assert sandbox.sandbox_problem(SandboxConfig(read_only=(missing,))) == (
        "bwrap cannot create its sandbox here: bwrap: Can't find source path"
        f" {missing}: No such file or directory"
    )


async def test_a_call_without_bubblewrap_is_a_clear_tool_error(
    ws: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DURABLE_AGENT_BWRAP", MISSING_BWRAP)
    with pytest.raises(ToolFailure) as failure:
        await bash(ws, "echo hi")
    assert str(failure.value) == (
        f"the bash sandbox cannot start: bubblewrap is not installed ({MISSING_BWRAP!r} not found):"
        f" {sandbox.INSTALL_HINT}"
    )


# --- what the command can see ---------------------------------------------------------------


async def test_the_worker_environment_is_out_of_reach(ws: Path) -> None:
    out = await bash(ws, "cat /proc/1/environ /proc/$PPID/environ /proc/self/environ | tr '\\0' '\\n'; env")
    assert SECRET not in out and "AGENT_TEST_SECRET" not in out
    assert "HOME=/tmp/home" in out.splitlines() and out.endswith("[exit code 0]")


async def test_proc_shows_only_the_sandbox(ws: Path) -> None:
    out = await bash(
        ws, f"echo $$ $PPID; cd /proc && echo [0-9]*; test -e /proc/{os.getpid()} || echo hidden"
    )
    assert out == "2 1\n1 2\nhidden\n[exit code 0]"


async def test_no_network_by_default(ws: Path) -> None:
    async with serving() as (port, seen):
        out = await bash(ws, f"exec 3<>/dev/tcp/127.0.0.1/{port} && head -c 5 <&3")
    assert "Connection refused" in out and "hello" not in out and out.endswith("[exit code 1]")
    assert seen == []


async def test_network_true_reaches_the_host(ws: Path) -> None:
    async with serving() as (port, seen):
        out = await bash(
            ws, f"exec 3<>/dev/tcp/127.0.0.1/{port} && head -c 5 <&3", SandboxConfig(network=True)
        )
    assert out == "hello\n[exit code 0]" and len(seen) == 1


async def test_network_true_reaches_no_abstract_unix_socket_of_the_host(ws: Path) -> None:
    """The host's abstract UNIX sockets are names in its network namespace, which ``network =
    true`` shares: the sandbox makes no UNIX sockets, so it reaches none (a socketpair still works)."""
    name = f"durable-agent-test-{uuid.uuid4().hex[:8]}"
    seen: list[bool] = []

    async def greet(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        seen.append(True)
        writer.write(b"hello")
        await writer.drain()
        writer.close()

    server = await asyncio.start_unix_server(greet, path="\0" + name)
    probe = (
        "import socket\n"
        "a, b = socket.socketpair(); a.send(b'pair'); print(b.recv(4).decode())\n"
        "s = socket.socket(socket.AF_UNIX)\n"
        f"s.connect('\\0{name}'); print(s.recv(5).decode())\n"
    )
    (ws / "probe.py").write_text(probe)
    async with server:
        # the host reaches it: the socket is there to reach
        host = await asyncio.to_thread(
            subprocess.run,
            [sys.executable, str(ws / "probe.py")],
            capture_output=True,
            text=True,
            check=False,
        )
        assert host.stdout == "pair\nhello\n", host.stderr
        out = await bash(ws, "python3 probe.py", SandboxConfig(network=True))
    assert out.startswith("pair\n") and "hello" not in out, out
    assert "Address family not supported" in out and out.endswith("[exit code 1]"), out
    assert seen == [True]  # the host's connection only


async def test_no_capabilities_even_as_root(ws: Path) -> None:
    out = await bash(ws, "grep CapEff /proc/self/status; mount -o remount,rw / 2>/dev/null || echo refused")
    assert out == "CapEff:\t0000000000000000\nrefused\n[exit code 0]"


# --- writes -------------------------------------------------------------------------------------


async def test_writes_in_the_workspace_land(ws: Path) -> None:
    out = await bash(ws, "pwd; mkdir -p a/b && echo data > a/b/c.txt && cat a/b/c.txt")
    assert out == f"{ws.resolve()}\ndata\n[exit code 0]"
    assert (ws / "a/b/c.txt").read_text() == "data\n"


async def test_writes_to_etc_fail_and_leave_nothing(ws: Path) -> None:
    name = f"agent-sandbox-{uuid.uuid4().hex}"
    out = await bash(ws, f"echo x > /etc/{name}")
    assert out == f"/bin/bash: line 1: /etc/{name}: Read-only file system\n[exit code 1]"
    assert not Path("/etc", name).exists()


async def test_the_worker_home_is_absent(ws: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    home = Path("/var/tmp") / f"agent-sandbox-home-{uuid.uuid4().hex}"  # not under /tmp, which is replaced
    (home / ".aws").mkdir(parents=True)
    (home / ".aws" / "credentials").write_text(SECRET)
    monkeypatch.setenv("HOME", str(home))
    try:
        out = await bash(ws, f"ls -A {home}; cat {home}/.aws/credentials; echo x > {home}/new")
        assert SECRET not in out
        # not a system path: not there at all (and nothing can be made there)
        assert out.splitlines()[-2:] == [
            f"/bin/bash: line 1: {home}/new: No such file or directory",
            "[exit code 1]",
        ]
        assert sorted(p.name for p in home.iterdir()) == [".aws"]
        # a workspace inside the hidden home is still there, writable; the rest of the home is not
        inner = home / "repo"
        inner.mkdir()
        out = await bash(inner, "echo y > f && cat f && ls -A .. && cat ../.aws/credentials")
        assert out.splitlines()[:2] == ["y", "repo"] and SECRET not in out and out.endswith("[exit code 1]")
        assert (inner / "f").read_text() == "y\n"
    finally:
        subprocess.run(["rm", "-rf", str(home)], check=True)


async def test_tmp_is_the_call_s_own_and_thrown_away(ws: Path, tmp_path: Path) -> None:
    outside = tmp_path / "outside.txt"
    outside.write_text(SECRET)
    name = f"/tmp/agent-sandbox-{uuid.uuid4().hex}"
    out = await bash(ws, f"cat {outside}; echo x > {name} && cat {name}; echo $HOME $TMPDIR; ls -A $HOME")
    assert out.splitlines()[1:] == ["x", "/tmp/home /tmp", "[exit code 0]"]
    assert "No such file or directory" in out.splitlines()[0] and SECRET not in out
    assert not Path(name).exists()
    assert await bash(ws, f"cat {name} 2>/dev/null || echo gone") == "gone\n[exit code 0]"


async def test_extra_writable_and_read_only_paths(ws: Path, tmp_path: Path) -> None:
    writable, readable = Path("/var/tmp") / f"agent-sandbox-rw-{uuid.uuid4().hex}", tmp_path / "ro"
    writable.mkdir()
    readable.mkdir()
    (readable / "data.txt").write_text("reference\n")
    settings = SandboxConfig(read_only=(readable,), writable=(writable,))
    try:
        out = await bash(
            ws, f"echo out > {writable}/w.txt && cat {readable}/data.txt && echo z > {readable}/z", settings
        )
        assert out == f"reference\n/bin/bash: line 1: {readable}/z: Read-only file system\n[exit code 1]"
        assert (writable / "w.txt").read_text() == "out\n" and not (readable / "z").exists()
        # without them, neither /var/tmp nor tmp_path (under /tmp) is there at all
        out = await bash(ws, f"echo out > {writable}/w2.txt; cat {readable}/data.txt")
        assert out.count("No such file or directory") == 2 and not (writable / "w2.txt").exists()
    finally:
        subprocess.run(["rm", "-rf", str(writable)], check=True)


# --- the process tree ---------------------------------------------------------------------------


async def test_exit_codes_and_signals(ws: Path) -> None:
    assert await bash(ws, "echo out; echo err >&2; exit 3") == "out\nerr\n[exit code 3]"
    assert await bash(ws, "kill -SEGV $$") == "(no output)\n[exit code 139, as for a kill by SIGSEGV]"


async def test_setsid_does_not_outlive_the_call(ws: Path) -> None:
    mark = marker()
    started = time.monotonic()
    out = await bash(
        ws, f"setsid sleep {mark} & nohup sleep {mark} >/dev/null 2>&1 & sleep 0.2; echo started"
    )
    assert out == "started\n[exit code 0]" and time.monotonic() - started < 5
    assert processes_with(mark) == []


async def test_a_timeout_kills_everything(ws: Path) -> None:
    mark = marker()
    started = time.monotonic()
    with pytest.raises(ToolFailure) as failure:
        await bash(ws, f"setsid sleep {mark} & echo waiting; sleep {mark}", timeout_seconds=1)
    assert time.monotonic() - started < 5
    assert str(failure.value).startswith("command timed out after 1 s") and "waiting" in str(failure.value)
    assert processes_with(mark) == []


async def test_a_cancel_terms_then_kills_everything(ws: Path) -> None:
    mark = marker()
    command = (
        f"trap 'echo term > got-term; exit 0' TERM; setsid sleep {mark} & sleep {mark} & touch ready; wait"
    )
    task = asyncio.create_task(bash(ws, command))
    await until(
        "the command to start",
        lambda: (ws / "ready").exists() and len(processes_with(f"sleep\0{mark}")) >= 2,
        10,
    )
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert processes_with(mark) == []
    assert (ws / "got-term").read_text() == "term\n"  # SIGTERM first: the command could clean up


async def test_a_cancelled_run_leaves_no_process(client: Client, tmp_path: Path, ws: Path) -> None:
    mark = marker()
    config = scripted_config(
        tmp_path,
        [tool_call("b1", "bash", command=f"setsid sleep {mark} & touch ready; sleep {mark}"), final("never")],
        permissions={"allow": ["bash"]},
    )
    async with running_worker(client, AgentActivities(config)) as queue:
        handle = await start(client, queue, ws, "sleep")
        await until("the command to start", (ws / "ready").exists, 10)
        await handle.signal("cancel", "stop")
        result = await asyncio.wait_for(run_result(client, handle.id), 15)
    assert result.status == "cancelled"
    assert processes_with(mark) == []


async def test_kill_9_of_the_worker_kills_the_command(client: Client, tmp_path: Path) -> None:
    mark = marker()
    command = f"setsid sleep {mark} & sleep {mark} & echo > started; sleep {mark}"
    config, workspace, _ = write_setup(tmp_path, [tool_call("b1", "bash", command=command), final("never")])
    temp = tmp_path / "worker-tmp"  # the worker's temporary folder, where calls make their scratch
    temp.mkdir()
    with workers(client, config, tmp_path) as procs:
        procs.env["TMPDIR"] = str(temp)
        worker = procs.start()
        handle = await start_run(
            client, AgentRunInput(prompt="sleep", workspace=str(workspace)), queue=procs.queue
        )
        try:

            async def running() -> bool:
                return (workspace / "started").exists() and len(processes_with(f"sleep\0{mark}")) == 3

            await until_alive("the command to start", running, 30, procs)
            procs.kill(worker)
            assert await none_left(mark), f"left running after kill -9: {processes_with(mark)}"
            # the killed worker could not remove its call's scratch folder: a later worker does
            (left,) = temp.glob(f"agent-bash-{worker.pid}-*")
            assert sweep_scratch(temp) == [left] and not left.exists()
        finally:
            await handle.terminate("test over")


async def test_unsandboxed_the_shell_still_dies_with_the_worker(client: Client, tmp_path: Path) -> None:
    """kind = "none": the shell dies with the worker; what it left in the background does not."""
    mark = marker()
    command = f"sleep {mark} & echo $$ > shell; wait"
    extra = '\n[sandbox]\nkind = "none"\n'
    config, workspace, _ = write_setup(
        tmp_path, [tool_call("b1", "bash", command=command), final("never")], extra
    )
    with workers(client, config, tmp_path) as procs:
        procs.env["DURABLE_AGENT_BWRAP"] = MISSING_BWRAP  # not needed without a sandbox
        worker = procs.start()
        handle = await start_run(
            client, AgentRunInput(prompt="sleep", workspace=str(workspace)), queue=procs.queue
        )
        shell = 0
        try:

            async def running() -> bool:
                return (workspace / "shell").exists() and len(processes_with(f"sleep\0{mark}")) == 1

            await until_alive("the command to start", running, 30, procs)
            shell = int((workspace / "shell").read_text())
            procs.kill(worker)
            await until("the shell to end with the worker", lambda: not sandbox.running(shell), 3)
            assert len(processes_with(mark)) == 1  # its child sleeps on: only the sandbox stops that
        finally:
            with contextlib.suppress(ProcessLookupError):
                if shell:
                    os.killpg(shell, signal.SIGKILL)
            await handle.terminate("test over")


def test_sweep_removes_only_the_scratch_of_workers_gone(tmp_path: Path) -> None:
    ended = subprocess.Popen(["true"])  # a process that ran and ended
    ended.wait()
    names = {
        "dead": f"agent-bash-{ended.pid}-ab_1",
        "live": f"agent-bash-{os.getpid()}-cd_2",
        "init": "agent-bash-1-ef_3",  # pid 1 runs (another user's, or ours): kept
        "older": "agent-bash-0d5_6suy",  # named before the pid was in it: its worker is unknown
        "other": f"{ended.pid}-gh_4",
    }
    for name in names.values():
        (tmp_path / name / "home").mkdir(parents=True)
    assert sweep_scratch(tmp_path) == [tmp_path / names["dead"]]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(v for k, v in names.items() if k != "dead")


# --- config, worker and demo ----------------------------------------------------------------------


def test_sandbox_config_and_its_paths(tmp_path: Path) -> None:
    file = tmp_path / "agent.toml"
    file.write_text('[sandbox]\nnetwork = true\nread_only = ["data", "/opt/x"]\nwritable = ["cache"]\n')
    settings = load_config(file).sandbox
    assert settings == SandboxConfig(
        kind="bubblewrap",
        network=True,
        read_only=(tmp_path / "data", Path("/opt/x")),
        writable=(tmp_path / "cache",),
    )
    file.write_text('[sandbox]\nkind = "docker"\nmounts = []\nnetwork = "maybe"\n')
    with pytest.raises(ConfigError) as error:
        load_config(file)
    assert str(error.value) == (
        f"{file}: invalid agent config:\n"
        "  sandbox.kind: Input should be 'bubblewrap' or 'none'\n"
        "  sandbox.network: Input should be a valid boolean, unable to interpret input\n"
        "  sandbox.mounts: Extra inputs are not permitted"
    )


def test_a_worker_without_bubblewrap_refuses_to_start(tmp_path: Path) -> None:
    file = tmp_path / "agent.toml"
    file.write_text("max_tool_rounds = 5\n")
    env = {**os.environ, "AGENT_CONFIG": str(file), "DURABLE_AGENT_BWRAP": MISSING_BWRAP}
    env["TEMPORAL_ADDRESS"] = "127.0.0.1:9"  # it must stop before it connects anywhere
    done = subprocess.run(
        [sys.executable, "worker.py"], cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=30
    )
    assert (done.returncode, done.stderr) == (2, WORKER_REFUSAL)


async def test_the_demo_runs_without_bash_where_no_sandbox_starts(
    temporal_client: Client, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DURABLE_AGENT_BWRAP", MISSING_BWRAP)
    done = await cli("demo", "--exit", client=temporal_client, cwd=tmp_path)
    assert done.code == 0, done.err
    assert done.out.startswith(
        f"Bash:      unavailable, its sandbox cannot start: bubblewrap is not installed ({MISSING_BWRAP!r}"
    )
    assert "does not guard against a zero divisor" in done.out
