"""The ``bash`` tool's sandbox: each command in a bubblewrap (``bwrap``) sandbox of its own.

With ``[sandbox] kind = "bubblewrap"`` (the default) a command sees:

- the file system read-only, at the real paths, except: the workspace,
  writable at its real path (so paths in the output mean the same on the
  worker); ``/tmp``, which is the call's scratch folder (HOME is
  ``/tmp/home``), removed after the call; the worker's home folder and
  ``/run``, which are empty, so credential files (``~/.aws``, ``~/.ssh``,
  ``~/.config``) and daemons' sockets (``docker.sock``) are out of reach; and
  the ``read_only`` and ``writable`` paths of the config, at their real paths
  (a ``read_only`` path under the worker's home shows it again);
- a minimal ``/dev`` and its own ``/proc`` in a new PID namespace, so the
  worker's processes and their environment are invisible;
- no network but a loopback of its own unless ``network = true``; its own
  IPC and host name; no capabilities, even when the worker runs as root, and
  no new privileges (setuid programs do not raise them);
- only the tool's allowlisted environment. bwrap itself gets that environment
  too: the sandbox's pid 1 is a fork of bwrap, and its ``/proc/1/environ``
  would show whatever bwrap was started with.

A process tree that dies with the call: the command runs under bwrap's init
(pid 1 of the namespace). When the command ends, the init ends, and the
kernel kills whatever is left in the namespace (``setsid`` and daemons
included) before bwrap returns. Stopping a call early is SIGTERM to the
processes inside, then SIGKILL to bwrap and its init (``bash``).
``--die-with-parent`` kills bwrap and its init when the worker dies, even by
``kill -9``, and with them the whole namespace.

``DURABLE_AGENT_BWRAP`` names the bwrap program (default: ``bwrap`` on PATH).
"""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path

from durable_agent.config import SandboxConfig

BWRAP_VARIABLE = "DURABLE_AGENT_BWRAP"
SCRATCH_INSIDE = "/tmp"
HOME_INSIDE = "/tmp/home"
INSTALL_HINT = "apt-get install bubblewrap (Debian, Ubuntu), dnf install bubblewrap (Fedora)"
PROBE_SECONDS = 10.0

_probed: dict[tuple[str, SandboxConfig], str | None] = {}


def bwrap_program() -> str:
    """The bwrap program to run: ``DURABLE_AGENT_BWRAP``, else ``bwrap`` on PATH."""
    return os.environ.get(BWRAP_VARIABLE) or "bwrap"


def inside_environment(env: Mapping[str, str]) -> dict[str, str]:
    """The tool's environment with HOME and TMPDIR moved to where the scratch folder is inside."""
    return {**env, "HOME": HOME_INSIDE, "TMPDIR": SCRATCH_INSIDE}


def _worker_homes() -> list[Path]:
    homes = set()
    for home in (os.environ.get("HOME"), os.path.expanduser(f"~{_user()}")):
        if home and home.startswith("/") and Path(home).is_dir() and Path(home).resolve() != Path("/"):
            homes.add(Path(home).resolve())
    return sorted(homes)


def _user() -> str:
    try:
        return pwd.getpwuid(os.getuid()).pw_name
    except KeyError:
        return ""


def _resolver_under_run() -> Path | None:
    """Where /etc/resolv.conf really is when that is under /run (systemd-resolved), which is hidden."""
    real = Path("/etc/resolv.conf").resolve()
    return real if real.is_relative_to("/run") and real.exists() else None


def bwrap_argv(
    settings: SandboxConfig,
    workspace: Path,
    scratch: Path,
    env: Mapping[str, str],
    command: Sequence[str],
    program: str | None = None,
) -> list[str]:
    """The bwrap command line that runs ``command`` in ``workspace`` inside the sandbox.

    Mounts are applied in order, so a later one shows through an earlier one:
    the workspace inside a hidden home stays visible.
    """
    argv = [program or bwrap_program(), "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc"]
    # Hidden behind empty folders, made read-only once every later mount has made its mount
    # point in them (those show a path inside again: a workspace in the worker's home).
    # A folder that is, or is inside, one of those mounts stays as that mount shows it.
    shown = [Path(SCRATCH_INSIDE), workspace, *settings.read_only, *settings.writable]
    hidden = [
        str(folder)
        for folder in [Path("/run"), *_worker_homes()]
        if not any(folder == path or folder.is_relative_to(path) for path in shown)
    ]
    for folder in hidden:
        argv += ["--tmpfs", folder]
    argv += ["--bind", str(scratch), SCRATCH_INSIDE]
    resolver = _resolver_under_run() if settings.network else None
    if resolver is not None:
        argv += ["--ro-bind", str(resolver), str(resolver)]
    argv += ["--bind", str(workspace), str(workspace)]
    for path in settings.read_only:
        argv += ["--ro-bind", str(path), str(path)]
    for path in settings.writable:
        argv += ["--bind", str(path), str(path)]
    for folder in hidden:
        argv += ["--remount-ro", folder]
    argv += ["--unshare-pid", "--unshare-ipc", "--unshare-uts"]
    if not settings.network:
        argv.append("--unshare-net")
    # Not root: bwrap adds a user namespace by itself. --cap-drop matters when the worker is
    # root: without it, root inside could remount / writable.
    argv += ["--die-with-parent", "--new-session", "--cap-drop", "ALL", "--clearenv"]
    for name, value in sorted(env.items()):
        argv += ["--setenv", name, value]
    argv += ["--chdir", str(workspace), "--", *command]
    return argv


def sandbox_problem(settings: SandboxConfig) -> str | None:
    """Why the sandbox the settings ask for cannot start here, with what to do; ``None`` when it can.

    Starts ``bwrap … /bin/true`` once with these settings (the answer is kept
    for the life of the process), so a missing program, a kernel or container
    that forbids namespaces and a configured path that does not exist all show
    up at worker start rather than at the first command.
    """
    if settings.kind == "none":
        return None
    program = bwrap_program()
    found = shutil.which(program)
    if found is None:
        where = "" if "/" in program else " on PATH"
        return f"bubblewrap is not installed ({program!r} not found{where}): {INSTALL_HINT}"
    key = (found, settings)
    if key not in _probed:
        _probed[key] = _probe(found, settings)
    return _probed[key]


def _probe(program: str, settings: SandboxConfig) -> str | None:
    with tempfile.TemporaryDirectory(prefix="agent-sandbox-probe-") as folder:
        workspace, scratch = Path(folder) / "workspace", Path(folder) / "scratch"
        workspace.mkdir()
        scratch.mkdir()
        env = {"PATH": "/usr/bin:/bin"}
        argv = bwrap_argv(settings, workspace, scratch, env, ["/bin/true"], program)
        try:
            done = subprocess.run(argv, env=env, capture_output=True, timeout=PROBE_SECONDS, check=False)
        except subprocess.TimeoutExpired:
            return f"bwrap ({program}) did not finish a test run within {PROBE_SECONDS:g} s"
        except OSError as exc:
            return f"bwrap ({program}) cannot be run: {exc.strerror or exc}"
    if done.returncode == 0:
        return None
    said = done.stderr.decode(errors="replace").strip() or f"exit code {done.returncode}"
    hint = ""
    if "namespace" in said or "not permitted" in said:
        hint = (
            " (the kernel or the container forbids the namespaces it needs; in Docker the worker's"
            " container needs e.g. --security-opt seccomp=unconfined --security-opt apparmor=unconfined)"
        )
    return f"bwrap cannot create its sandbox here: {said}{hint}"


# --- the sandbox's processes, seen from the worker ---------------------------------------


def _stat(pid: int) -> tuple[str, int] | None:
    """(state, parent pid) of a process; ``None`` when there is none."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            # after the command name, which may hold anything: state, ppid, ...
            state, ppid = f.read().rpartition(")")[2].split()[:2]
    except (OSError, ValueError):
        return None
    return state, int(ppid)


def _pids() -> list[int]:
    try:
        return [int(name) for name in os.listdir("/proc") if name.isdigit()]
    except OSError:
        return []


def running(pid: int) -> bool:
    """Whether ``pid`` is a process that has not exited (a zombie has)."""
    stat = _stat(pid)
    return stat is not None and stat[0] not in ("Z", "X")


def namespace_init(bwrap_pid: int) -> int | None:
    """The worker-side pid of the sandbox's pid 1 (bwrap's child), while it runs."""
    for pid in _pids():
        stat = _stat(pid)
        if stat is not None and stat[1] == bwrap_pid and stat[0] not in ("Z", "X"):
            return pid
    return None


def namespace_members(init: int) -> list[int]:
    """The worker-side pids of every process in the sandbox but its init."""
    try:
        namespace = os.readlink(f"/proc/{init}/ns/pid")
    except OSError:
        return []
    members = []
    for pid in _pids():
        if pid == init:
            continue
        try:
            if os.readlink(f"/proc/{pid}/ns/pid") == namespace:
                members.append(pid)
        except OSError:  # gone, or another user's
            continue
    return members
