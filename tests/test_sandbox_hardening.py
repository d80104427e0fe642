"""The ``bash`` sandbox against a command that is, or tries to be, root (issue 22).

Run for real, like ``test_sandbox``: as root (the kernel's settings, the
workspace's owner, a cgroup for the process bound) and as a user that is not
root (the tests that need root to give a folder to another user say so and
are skipped there; ``test_a_worker_that_is_not_root`` runs a worker as one
from a root test run).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from durable_agent.activities import AgentActivities
from durable_agent.activities.tools import ToolFailure, sandbox, sandbox_limits
from durable_agent.activities.tools.sandbox_limits import CGROUP_PARENT, _pids_hierarchies
from durable_agent.activities.tools.tool import text_of
from durable_agent.config import ConfigError, SandboxConfig, load_config
from durable_agent.core.tool_specs import validate_args
from tests.helpers import final, scripted_config
from tests.test_sandbox import bash, marker, none_left

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="bubblewrap runs on Linux only")

ROOT = os.geteuid() == 0
needs_root = pytest.mark.skipif(not ROOT, reason="giving a workspace to another user needs root")
OTHER_UID = 1000  # not the worker, when the worker is root
REPO = Path(__file__).resolve().parent.parent
FORKS = """python3 -c '
import os, time
n = 0
try:
    while n < 1500:
        if os.fork() == 0:
            time.sleep(30)
            os._exit(0)
        n += 1
except OSError as exc:
    print("refused after", n, type(exc).__name__)
else:
    print("made", n)
'"""


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    workspace = tmp_path / "ws"
    workspace.mkdir()
    return workspace


@contextlib.contextmanager
def owned_workspace(uid: int) -> Iterator[Path]:
    """A workspace in /tmp (which everyone may enter) owned by ``uid``."""
    folder = Path(tempfile.mkdtemp(prefix="agent-owned-ws-", dir="/tmp"))
    try:
        os.chown(folder, uid, uid)
        folder.chmod(0o755)
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def own_cgroups() -> list[Path]:
    """The call cgroups this process made that are still there."""
    found = []
    for _, top in _pids_hierarchies():
        with contextlib.suppress(OSError):
            found += [p for p in (top / CGROUP_PARENT).iterdir() if p.name.startswith(f"call-{os.getpid()}-")]
    return found


# --- kernel settings and root -------------------------------------------------------------------


async def test_kernel_settings_cannot_be_written(ws: Path) -> None:
    """The issue's first failure: as root, core_pattern was writable (a pipe there runs as host root)."""
    out = await bash(
        ws, 'v=$(cat /proc/sys/kernel/core_pattern); echo "$v" > /proc/sys/kernel/core_pattern && echo WROTE'
    )
    assert out == "/bin/bash: line 1: /proc/sys/kernel/core_pattern: Read-only file system\n[exit code 1]"
    # Opened, never written: harmless on a host where the sandbox would fail.
    for path in ("/proc/sysrq-trigger", "/proc/irq/default_smp_affinity", "/sys/kernel/uevent_helper"):
        if Path(path).exists():
            out = await bash(ws, f"exec 3>{path} && echo OPENED")
            assert out == f"/bin/bash: line 1: {path}: Read-only file system\n[exit code 1]", path
    out = await bash(ws, "echo 1 > /proc/sys/vm/drop_caches; cat /proc/kcore 2>&1 | head -c 0; echo done")
    assert "Read-only file system" in out and out.endswith("done\n[exit code 0]")


async def test_the_command_is_not_root_and_cannot_become_it(ws: Path) -> None:
    out = await bash(
        ws, "id -u; id -g; echo $USER; grep CapEff /proc/self/status; unshare -r true || echo no-userns"
    )
    lines = out.splitlines()
    assert lines[:2] == ["1000", "1000"] and lines[3] == "CapEff:\t0000000000000000"
    if sandbox._supports(shutil.which(sandbox.bwrap_program()) or "bwrap", "--disable-userns"):
        assert lines[-2:] == ["no-userns", "[exit code 0]"]  # bwrap 0.8 and later
    out = await bash(ws, "id -u; id -g", SandboxConfig(uid=4321, gid=4322))
    assert out == "4321\n4322\n[exit code 0]"


@needs_root
async def test_without_a_user_namespace_root_stays_powerless(ws: Path) -> None:
    """``user_namespace = false`` (for kernels that refuse one): uid 0 inside, still no capabilities."""
    settings = SandboxConfig(user_namespace=False)
    assert sandbox.sandbox_problem(settings) is None
    out = await bash(
        ws, "id -u; grep CapEff /proc/self/status; echo x > /proc/sys/kernel/core_pattern", settings
    )
    assert out == (
        "0\nCapEff:\t0000000000000000\n"
        "/bin/bash: line 1: /proc/sys/kernel/core_pattern: Read-only file system\n[exit code 1]"
    )


async def test_files_made_inside_belong_to_the_worker_outside(ws: Path) -> None:
    out = await bash(ws, "echo x > made && ls -n made | cut -d' ' -f3,4")
    assert out == "1000 1000\n[exit code 0]"  # the namespace's uid inside
    assert (ws / "made").stat().st_uid == os.geteuid()  # the worker's (root's: the workspace's) outside


@needs_root
async def test_a_root_worker_runs_the_command_as_the_workspace_owner() -> None:
    with owned_workspace(OTHER_UID) as ws:
        out = await bash(ws, "id -u; echo x > made; cat /etc/shadow 2>/dev/null || echo no-shadow")
        assert out == "1000\nno-shadow\n[exit code 0]"
        made = (ws / "made").stat()
        assert (made.st_uid, made.st_gid) != (0, 0) and made.st_uid == OTHER_UID
        # run_as = "worker": the command is root's on the host again, and may not write the owner's folder
        out = await bash(ws, "echo y > other", SandboxConfig(run_as="worker"))
        assert out == "/bin/bash: line 1: other: Permission denied\n[exit code 1]"


@needs_root
async def test_an_owner_who_cannot_reach_the_workspace_is_a_clear_failure(tmp_path: Path) -> None:
    closed = Path(tempfile.mkdtemp(prefix="agent-closed-", dir="/tmp"))  # 0700, root's
    try:
        ws = closed / "ws"
        ws.mkdir()
        os.chown(ws, OTHER_UID, OTHER_UID)
        with pytest.raises(ToolFailure) as failure:
            await bash(ws, "echo hi")
        assert str(failure.value) == (
            "the bash sandbox cannot run this command: the command runs as the workspace's owner"
            f" (uid {OTHER_UID}), who cannot reach the workspace: {str(closed)!r} is closed to it; open"
            ' that folder to the owner, or set [sandbox] run_as = "worker" to run commands as the worker'
        )
    finally:
        shutil.rmtree(closed)


@needs_root
async def test_etc_secrets_are_masked_when_the_command_is_host_root(ws: Path) -> None:
    """uid 0 without capabilities still reads root's own files: /etc/shadow, private keys."""
    out = await bash(
        ws, "cat /etc/shadow 2>&1; ls -A /etc/ssl/private 2>/dev/null | wc -l; grep -c ^root: /etc/passwd"
    )
    assert out == "cat: /etc/shadow: Permission denied\n0\n1\n[exit code 0]"


# --- resource bounds -------------------------------------------------------------------------


async def test_the_bounds_have_their_defaults(ws: Path) -> None:
    out = await bash(ws, "ulimit -u; ulimit -v; ulimit -f; ulimit -t; ulimit -H -t; ulimit -c")
    assert out == "1024\n4194304\n1048576\n3600\n3601\n0\n[exit code 0]"


async def test_1500_processes_are_refused(ws: Path) -> None:
    out = await bash(ws, FORKS, SandboxConfig(max_processes=64))
    refused, count, error = out.splitlines()[0].rsplit(" ", 2)
    assert refused == "refused after" and error == "BlockingIOError" and 50 <= int(count) < 64, out
    assert own_cgroups() == []


@needs_root
async def test_1500_processes_are_refused_to_the_workspace_owner() -> None:
    """The other path: a command that is not root on the host, bounded by the kernel's rlimit."""
    with owned_workspace(OTHER_UID) as ws:
        out = await bash(ws, FORKS, SandboxConfig(max_processes=64))
    assert out.startswith("refused after") and int(out.split()[2]) < 64, out


@needs_root
async def test_root_without_a_cgroup_fails_closed(ws: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Where no cgroup can be made (a container's read-only /sys/fs/cgroup), a root command does not run."""
    monkeypatch.setattr(sandbox_limits, "_pids_hierarchies", list)
    tag = marker()
    with pytest.raises(ToolFailure) as failure:
        await bash(ws, f"echo ran > ran; sleep {tag}")
    assert str(failure.value) == (
        "the bash sandbox cannot run this command: the command would run as root on the host (the"
        " workspace is root's), where the kernel does not apply the process limit, and no cgroup can be"
        " made to apply it (no cgroup file system with the pids controller is mounted). Run the worker as"
        " a user that is not root, give the workspace to one (chown), or set [sandbox] max_processes = 0"
        " to run without a bound on processes"
    )
    assert not (ws / "ran").exists()
    assert await bash(ws, "echo ran", SandboxConfig(max_processes=0)) == "ran\n[exit code 0]"
    with owned_workspace(OTHER_UID) as owned:  # not root on the host: the kernel's limit holds
        assert await bash(owned, "echo ran") == "ran\n[exit code 0]"


async def test_a_fork_bomb_is_bounded_and_ends_with_its_call(ws: Path) -> None:
    tag = marker()
    started = time.monotonic()
    with pytest.raises(ToolFailure) as failure:
        await bash(
            ws, f"b(){{ b | b & }}; b; sleep {tag}", SandboxConfig(max_processes=100), timeout_seconds=3
        )
    assert str(failure.value).startswith("command timed out after 3 s")
    assert time.monotonic() - started < 20
    assert await none_left(tag)
    assert own_cgroups() == []


async def test_a_2_gib_allocation_is_refused(ws: Path) -> None:
    settings = SandboxConfig(max_memory_bytes=1024**3)
    out = await bash(ws, "python3 -c 'bytearray(2 * 1024**3)'", settings)
    assert out.splitlines()[-2:] == ["MemoryError", "[exit code 1]"]
    out = await bash(ws, "python3 -c 'print(len(bytearray(200 * 1024**2)))'", settings)
    assert out == f"{200 * 1024**2}\n[exit code 0]"


async def test_a_600_mb_write_is_refused(ws: Path) -> None:
    settings = SandboxConfig(max_file_bytes=64 * 1024**2)
    out = await bash(ws, "head -c 600000000 /dev/zero > big; echo $?", settings)
    assert "File size limit exceeded" in out and out.endswith("153\n[exit code 0]")  # 128 + SIGXFSZ
    assert (ws / "big").stat().st_size == 64 * 1024**2
    out = await bash(ws, 'python3 -c \'open("big2", "wb").write(bytes(600 * 10**6))\'', settings)
    assert "OSError: [Errno 27] File too large" in out and out.endswith("[exit code 1]")


async def test_memory_backed_folders_are_bounded(ws: Path) -> None:
    """/dev/shm holds at most the memory bound; /dev and the root take no files (both live in RAM)."""
    settings = SandboxConfig(max_memory_bytes=64 * 1024**2)
    out = await bash(ws, "head -c 100000000 /dev/zero > /dev/shm/x; echo x > /dev/f; echo y > /f", settings)
    assert out.splitlines() == [
        "head: error writing 'standard output': No space left on device",
        "/bin/bash: line 1: /dev/f: Read-only file system",
        "/bin/bash: line 1: /f: Read-only file system",
        "[exit code 1]",
    ]


async def test_cpu_time_is_bounded(ws: Path) -> None:
    out = await bash(
        ws, "python3 -c 'while True: pass'", SandboxConfig(max_cpu_seconds=1), timeout_seconds=30
    )
    assert out == "(no output)\n[exit code 152, as for a kill by SIGXCPU]"


async def test_zero_means_no_bound_and_none_sandbox_keeps_the_others(ws: Path) -> None:
    settings = SandboxConfig(max_processes=0, max_memory_bytes=0, max_file_bytes=0, max_cpu_seconds=0)
    out = await bash(ws, "ulimit -v; ulimit -f; ulimit -t", settings)
    assert out == "unlimited\nunlimited\nunlimited\n[exit code 0]"
    before = subprocess.run(["bash", "-c", "ulimit -u"], capture_output=True, text=True).stdout
    out = await bash(
        ws, "ulimit -u; ulimit -v; ulimit -f", SandboxConfig(kind="none", max_memory_bytes=2**30)
    )
    assert out == f"{before.strip()}\n1048576\n1048576\n[exit code 0]"


# --- what the command sees -------------------------------------------------------------------


async def test_only_system_folders_the_workspace_and_tmp_are_there(ws: Path, tmp_path: Path) -> None:
    sibling = tmp_path / "other-workspace"
    sibling.mkdir()
    (sibling / "secret.txt").write_text("other session")
    out = await bash(ws, f"ls /; ls {REPO} {sibling} /home /root /var /srv /mnt 2>&1 | grep -c 'No such'")
    system = {"bin", "etc", "lib", "lib32", "lib64", "libx32", "nix", "opt", "sbin", "sys", "usr"}
    top = set(out.splitlines()[:-2])
    assert {"dev", "proc", "tmp", "usr", "etc"} <= top <= system | {"dev", "proc", "tmp", ws.parts[1]}, top
    assert out.splitlines()[-2:] == ["7", "[exit code 0]"]
    out = await bash(ws, "touch /usr/x /etc/x /new 2>&1 | grep -c 'Read-only file system'")
    assert out == "3\n[exit code 0]"
    narrow = SandboxConfig(system_paths=(Path("/usr"), Path("/bin"), Path("/lib"), Path("/lib64")))
    out = await bash(ws, "ls / | tr '\\n' ' '", narrow)
    assert "etc" not in out.split() and "opt" not in out.split()


async def test_host_unix_sockets_are_unreachable(ws: Path) -> None:
    paths = [
        Path("/tmp") / f"agent-host-{uuid.uuid4().hex[:8]}.sock",
        Path("/var/tmp") / f"h{uuid.uuid4().hex}.s",
    ]
    abstract = f"\0agent-host-{uuid.uuid4().hex}"
    servers = []
    try:
        for address in [*map(str, paths), abstract]:
            server = socket.socket(socket.AF_UNIX)
            server.bind(address)
            server.listen()
            servers.append(server)
        script = (
            "import socket\n"
            f"for a in {[*map(str, paths), abstract]!r}:\n"
            "    s = socket.socket(socket.AF_UNIX)\n"
            "    try:\n"
            "        s.connect(a); print('CONNECTED', a)\n"
            "    except OSError as e:\n"
            "        print(type(e).__name__)\n"
        )
        out = await bash(ws, f"python3 -c {_quote(script)}")
        assert out == "FileNotFoundError\nFileNotFoundError\nConnectionRefusedError\n[exit code 0]"
    finally:
        for server in servers:
            server.close()
        for path in paths:
            path.unlink(missing_ok=True)


def _quote(text: str) -> str:
    return "'" + text.replace("'", "'\\''") + "'"


async def test_the_store_and_sinks_are_hidden_and_hide_paths_too(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    config = scripted_config(
        tmp_path,
        [final()],
        store={"path": str(ws / ".agent" / "store")},
        sinks={"local": {"kind": "filesystem", "path": str(ws / ".agent" / "exports")}},
        sandbox={"hide": [".env"]},
    )
    (ws / ".agent" / "store").mkdir(parents=True)
    (ws / ".agent" / "store" / "session.json").write_text("a stored session")
    (ws / ".env").write_text("TOKEN=sk-hidden")
    activities = AgentActivities(config)  # as a worker builds its tools
    try:
        tool = activities.tools["bash"]
        command = (
            "ls -A .agent/store .agent/exports; cat .env; echo x > .agent/store/session.json;"
            " echo y > .agent/exports/forged; echo z > .env"
        )
        out = text_of(await tool.run(validate_args(tool.spec, {"command": command}), ws))
    finally:
        await activities.aclose()
    assert "a stored session" not in out and "sk-hidden" not in out
    assert out.count("Read-only file system") == 2 and out.count(".env: Permission denied") == 2, out
    assert (ws / ".agent" / "store" / "session.json").read_text() == "a stored session"
    assert (
        not (ws / ".agent" / "exports" / "forged").exists() and (ws / ".env").read_text() == "TOKEN=sk-hidden"
    )
    assert sandbox.sandbox_settings(config).hide == (
        Path(".env"),
        ws / ".agent" / "store",
        ws / ".agent" / "exports",
    )


# --- git metadata ------------------------------------------------------------------------------


def _git(ws: Path, *args: str) -> None:
    subprocess.run(["git", "-C", str(ws), *args], check=True, capture_output=True)


async def test_git_hooks_and_config_are_read_only(ws: Path) -> None:
    _git(ws, "init", "-q")
    shutil.rmtree(ws / ".git" / "hooks")  # no hooks folder: one cannot be made either
    (ws / ".git" / "modules" / "sub" / "hooks").mkdir(parents=True)
    (ws / ".git" / "modules" / "sub" / "config").write_text("[core]\n")
    (ws / ".git" / "modules" / "sub" / "HEAD").write_text("ref: refs/heads/main\n")
    config = (ws / ".git" / "config").read_text()
    attempts = (
        "mkdir -p .git/hooks; echo 'touch /tmp/pwned' > .git/hooks/pre-commit;"
        " echo '[core] hooksPath = /tmp' >> .git/config;"
        " echo x > .git/modules/sub/hooks/post-checkout; echo x >> .git/modules/sub/config;"
        " echo data > f && git add f && git -c user.name=a -c user.email=a@b commit -qm f && echo COMMITTED"
    )
    out = await bash(ws, attempts)
    assert out.count("Read-only file system") == 4 and "COMMITTED" in out, out
    assert list((ws / ".git" / "hooks").iterdir()) == [] and (ws / ".git" / "config").read_text() == config
    assert list((ws / ".git" / "modules" / "sub" / "hooks").iterdir()) == []
    out = await bash(
        ws, "echo x > .git/hooks/pre-commit && echo WROTE", SandboxConfig(git_metadata_writable=True)
    )
    assert out == "WROTE\n[exit code 0]" and (ws / ".git" / "hooks" / "pre-commit").exists()


# --- a worker that is not root, config ---------------------------------------------------------


def _python_for(uid: int) -> list[str] | None:
    """A Python that ``uid`` may run with this checkout's packages, or ``None``."""
    site = next((REPO / ".venv" / "lib").glob("python3*/site-packages"), None)
    boot = "import site, sys; site.addsitedir(sys.argv.pop(1)); exec(sys.argv.pop(1))"
    for python in (sys.executable, f"/usr/bin/python3.{sys.version_info.minor}"):
        command = [python, "-c", boot, str(site or REPO), "import durable_agent.activities.tools.bash"]
        try:
            done = subprocess.run(
                command, user=uid, group=uid, extra_groups=[], capture_output=True, check=False
            )
        except OSError:  # not even startable by uid (a Python under /root)
            continue
        if done.returncode == 0:
            return command[:-1]
    return None


@needs_root
def test_a_worker_that_is_not_root() -> None:
    python = _python_for(OTHER_UID)
    if python is None:
        pytest.skip(f"no Python here that uid {OTHER_UID} may run with this checkout's packages")
    script = (
        "import asyncio\n"
        "from pathlib import Path\n"
        "from durable_agent.activities.tools.bash import bash\n"
        "from durable_agent.config import SandboxConfig\n"
        "from durable_agent.core.tool_args import BashArgs\n"
        f"command = 'id -u; echo x > /proc/sys/kernel/core_pattern; echo made > f; ' + {FORKS!r}\n"
        "print(asyncio.run(bash(BashArgs(command=command), Path('.'), SandboxConfig(max_processes=64))))\n"
    )
    with owned_workspace(OTHER_UID) as ws:
        env = {"PATH": "/usr/bin:/bin", "HOME": str(ws), "PYTHONPATH": str(REPO)}
        done = subprocess.run(
            [*python, script], cwd=ws, env=env, user=OTHER_UID, group=OTHER_UID, extra_groups=[],
            capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        lines = done.stdout.splitlines()
        assert lines[0] == "1000" and "Read-only file system" in lines[1], done.stdout
        assert lines[2].startswith("refused after") and int(lines[2].split()[2]) < 64, done.stdout
        assert (ws / "f").stat().st_uid == OTHER_UID


def test_the_probe_says_how_to_run_without_a_user_namespace(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake = tmp_path / "bwrap"
    fake.write_text("#!/bin/sh\necho 'bwrap: setting up uid map: Permission denied' >&2\nexit 1\n")
    fake.chmod(0o755)
    monkeypatch.setenv("DURABLE_AGENT_BWRAP", str(fake))
    problem = sandbox.sandbox_problem(SandboxConfig())
    assert problem is not None and problem.startswith(
        "bwrap cannot create its sandbox here: bwrap: setting up uid map: Permission denied (the kernel"
    )
    assert "[sandbox] user_namespace = false runs without one" in problem


def test_the_sandbox_keys_and_their_checks(tmp_path: Path) -> None:
    file = tmp_path / "agent.toml"
    file.write_text(
        "[sandbox]\nmax_processes = 200\nmax_memory_bytes = 2147483648\nmax_file_bytes = 0\n"
        'max_cpu_seconds = 60\nuid = 2000\ngid = 2001\nrun_as = "worker"\nhide = [".env"]\n'
        'git_metadata_writable = true\nsystem_paths = ["/usr"]\nuser_namespace = false\n'
    )
    settings = load_config(file).sandbox
    assert settings == SandboxConfig(
        max_processes=200,
        max_memory_bytes=2**31,
        max_file_bytes=0,
        max_cpu_seconds=60,
        uid=2000,
        gid=2001,
        run_as="worker",
        hide=(Path(".env"),),
        git_metadata_writable=True,
        system_paths=(Path("/usr"),),
        user_namespace=False,
    )
    file.write_text(
        '[sandbox]\nuid = 0\nmax_memory_bytes = 1000\nsystem_paths = ["usr"]\nrun_as = "nobody"\n'
    )
    with pytest.raises(ConfigError) as error:
        load_config(file)
    assert str(error.value) == (
        f"{file}: invalid agent config:\n"
        "  sandbox.system_paths: Value error, system_paths are absolute paths: 'usr' is not\n"
        "  sandbox.uid: Input should be greater than or equal to 1\n"
        "  sandbox.run_as: Input should be 'workspace-owner' or 'worker'\n"
        "  sandbox.max_memory_bytes: Value error, below 33554432 bytes no shell starts (0: no limit)"
    )


async def test_calls_run_side_by_side_with_their_own_bounds(ws: Path) -> None:
    """Each call's process count is its own (its own user namespace or cgroup), not shared."""
    results = await asyncio.gather(*(bash(ws, FORKS, SandboxConfig(max_processes=40)) for _ in range(3)))
    for out in results:
        assert out.startswith("refused after") and 25 <= int(out.split()[2]) < 40, out
