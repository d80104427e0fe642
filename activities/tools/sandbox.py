"""The ``bash`` tool's sandbox: each command in a bubblewrap (``bwrap``) sandbox of its own.

With ``[sandbox] kind = "bubblewrap"`` (the default) a command sees
(``sandbox_view``): the system folders read-only, the workspace writable at its
real path (so paths in the output mean the same on the worker), ``/tmp`` as the
call's scratch folder (HOME is ``/tmp/home``), removed after the call, and the
``read_only`` and ``writable`` paths of the config; nothing else of the host
(homes, ``/run``, ``/var``, the host's ``/tmp`` and their UNIX sockets, the
session store, export sinks, other workspaces). Also:

- a minimal ``/dev`` and its own ``/proc`` in a new PID namespace, so the
  worker's processes and their environment are invisible, with the kernel's
  settings (``/proc/sys`` and the like) read-only;
- a user namespace of its own, in which the command is ``uid``/``gid`` (1000),
  not root, and cannot make another (``--disable-userns``); on the host it is
  who ``sandbox_limits.host_user`` says: the worker, or, for a worker running
  as root, the workspace's owner;
- no network but a loopback of its own unless ``network = true``, which
  shares the host's network but makes no UNIX sockets (``sandbox_seccomp``:
  the host's abstract ones are in its network namespace); its own
  IPC, cgroup view and host name; no capabilities, even when the worker runs
  as root, and no new privileges (setuid programs do not raise them);
- the call's resource bounds (``sandbox_limits``);
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

import functools
import os
import pwd
import shutil
import subprocess
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from durable_agent.activities.tools.sandbox_limits import (
    CallCgroup,
    HostUser,
    SandboxUnavailable,
    call_cgroup,
    give_to,
    host_user,
    limited,
)
from durable_agent.activities.tools.sandbox_seccomp import SeccompUnsupported, unix_socket_filter_fd
from durable_agent.activities.tools.sandbox_view import (
    git_directories,
    git_metadata_mounts,
    hidden_mounts,
    remove_strays,
    shown,
    stray_commondirs,
    system_mounts,
)
from durable_agent.config import AgentConfig, FilesystemSinkConfig, FilesystemStoreConfig, SandboxConfig

BWRAP_VARIABLE = "DURABLE_AGENT_BWRAP"
SCRATCH_INSIDE = "/tmp"
HOME_INSIDE = "/tmp/home"
INSTALL_HINT = "apt-get install bubblewrap (Debian, Ubuntu), dnf install bubblewrap (Fedora)"
PROBE_SECONDS = 10.0
SHELL = "/bin/bash"

_probed: dict[tuple[str, SandboxConfig, HostUser | None], str | None] = {}


def bwrap_program() -> str:
    """The bwrap program to run: ``DURABLE_AGENT_BWRAP``, else ``bwrap`` on PATH."""
    return os.environ.get(BWRAP_VARIABLE) or "bwrap"


def sandbox_settings(config: AgentConfig) -> SandboxConfig:
    """``[sandbox]``, with the worker's session store and filesystem export sinks added to ``hide``."""
    own = [config.store.path] if isinstance(config.store, FilesystemStoreConfig) else []
    own += [sink.path for sink in config.sinks.values() if isinstance(sink, FilesystemSinkConfig)]
    hide = (*config.sandbox.hide, *(path.absolute() for path in own))
    return config.sandbox.model_copy(update={"hide": tuple(dict.fromkeys(hide))})


def inside_environment(env: Mapping[str, str], settings: SandboxConfig | None = None) -> dict[str, str]:
    """The tool's environment with HOME and TMPDIR moved to the scratch folder inside, USER the uid's."""
    inside = {**env, "HOME": HOME_INSIDE, "TMPDIR": SCRATCH_INSIDE}
    if settings is not None and settings.user_namespace:
        try:
            inside["USER"] = pwd.getpwuid(settings.uid).pw_name
        except KeyError:
            inside["USER"] = str(settings.uid)
    return inside


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


@functools.cache
def _supports(program: str, option: str) -> bool:
    """Whether this bwrap knows ``option`` (``--disable-userns`` came with 0.8)."""
    try:
        done = subprocess.run([program, "--help"], capture_output=True, timeout=PROBE_SECONDS, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return option.encode() in done.stdout + done.stderr


def bwrap_argv(
    settings: SandboxConfig,
    workspace: Path,
    scratch: Path,
    env: Mapping[str, str],
    command: Sequence[str],
    program: str | None = None,
    *,
    host_root: bool = False,
    repositories: Sequence[Path] | None = None,
    seccomp_fd: int | None = None,
) -> list[str]:
    """The bwrap command line that runs ``command`` in ``workspace`` inside the sandbox.

    Mounts are applied in order, so a later one shows through an earlier one
    (``sandbox_view``). ``host_root``: the command will be uid 0 on the host,
    so what /etc keeps from other users is masked too. ``repositories``: the
    git folders to guard (default: found in the workspace now). ``seccomp_fd``: the
    descriptor bwrap reads the seccomp filter from (``sandbox_seccomp``), passed to it.
    """
    program = program or bwrap_program()
    argv = [program]
    if settings.user_namespace:
        argv += ["--unshare-user", "--uid", str(settings.uid), "--gid", str(settings.gid)]
        if _supports(program, "--disable-userns"):
            argv.append("--disable-userns")
    argv += system_mounts(settings)
    if settings.max_memory_bytes and _supports(program, "--size"):
        # Shared memory is memory: a tmpfs of the address-space bound, not half the host's RAM.
        argv += ["--perms", "1777", "--size", str(settings.max_memory_bytes), "--tmpfs", "/dev/shm"]
    # The worker's home, where a system path shows it: hidden behind an empty folder, made
    # read-only once every later mount has made its mount point in it (a workspace there).
    in_view = [Path(SCRATCH_INSIDE), workspace, *settings.read_only, *settings.writable]
    homes = [
        str(home)
        for home in _worker_homes()
        if any(home.is_relative_to(path) for path in shown(settings))
        and not any(home == path or home.is_relative_to(path) for path in in_view)
    ]
    for home in homes:
        argv += ["--tmpfs", home]
    argv += ["--bind", str(scratch), SCRATCH_INSIDE]
    resolver = _resolver_under_run() if settings.network else None
    if resolver is not None:
        argv += ["--ro-bind", str(resolver), str(resolver)]
    argv += ["--bind", str(workspace), str(workspace)]
    for path in settings.read_only:
        argv += ["--ro-bind", str(path), str(path)]
    for path in settings.writable:
        argv += ["--bind", str(path), str(path)]
    argv += hidden_mounts(settings, workspace, host_root)
    argv += git_metadata_mounts(
        repositories if repositories is not None else git_directories(settings, workspace)
    )
    for home in homes:
        argv += ["--remount-ro", home]
    # The root and /dev (their own tmpfs, in memory) take no files: only the mounts in them do.
    argv += ["--remount-ro", "/", "--remount-ro", "/dev"]
    argv += ["--unshare-pid", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try"]
    if not settings.network:
        argv.append("--unshare-net")
    # --cap-drop matters when the worker is root: without it, root inside could remount / writable.
    argv += ["--die-with-parent", "--new-session", "--cap-drop", "ALL", "--clearenv"]
    if seccomp_fd is not None:
        argv += ["--seccomp", str(seccomp_fd)]
    for name, value in sorted(env.items()):
        argv += ["--setenv", name, value]
    argv += ["--chdir", str(workspace), "--", *command]
    return argv


@dataclass
class Launch:
    """How to start one sandboxed command: the program, as whom, in which cgroup; ``close`` after."""

    argv: list[str]
    env: dict[str, str]
    user: HostUser | None = None
    cgroup: CallCgroup | None = None
    strays: Sequence[Path] = ()  # files the command must not leave behind (a new .git/commondir)
    seccomp_fd: int | None = None  # bwrap reads its seccomp filter from it (``network = true``)

    def options(self) -> dict[str, Any]:
        """The subprocess options that start it as ``user`` (no other groups) and in ``cgroup``,
        with the seccomp filter's descriptor passed to bwrap."""
        options: dict[str, Any] = {}
        if self.seccomp_fd is not None:
            options["pass_fds"] = (self.seccomp_fd,)
        if self.user is not None:
            options.update(user=self.user.uid, group=self.user.gid, extra_groups=[])
        if self.cgroup is not None:
            options["preexec_fn"] = self.cgroup.join
        return options

    def close(self) -> list[str]:
        """Remove the call's cgroup and what the command must not leave; notes on what it left."""
        if self.cgroup is not None:
            self.cgroup.remove()
        if self.seccomp_fd is not None:
            os.close(self.seccomp_fd)
            self.seccomp_fd = None
        return remove_strays(self.strays)


def launch(
    settings: SandboxConfig, workspace: Path, scratch: Path, env: Mapping[str, str], command: str
) -> Launch:
    """The sandboxed start of ``command``; ``SandboxUnavailable`` when it cannot run as configured.

    Blocking (it may run the probe as the workspace's owner): call it in a thread.
    """
    user = host_user(settings, workspace)
    if user is not None:
        problem = sandbox_problem(settings, user)
        if problem is not None:
            raise SandboxUnavailable(f"{problem} (as uid {user.uid}, the workspace's owner)")
        give_to(user, scratch, *scratch.iterdir())
    host_root = os.geteuid() == 0 and user is None
    inside = inside_environment(env, settings)
    shell = limited(settings, SHELL, command)
    repositories = git_directories(settings, workspace)
    cgroup = call_cgroup(settings.max_processes) if host_root and settings.max_processes else None
    seccomp_fd = _seccomp_fd(settings)
    argv = bwrap_argv(
        settings,
        workspace,
        scratch,
        inside,
        shell,
        host_root=host_root,
        repositories=repositories,
        seccomp_fd=seccomp_fd,
    )
    return Launch(argv, inside, user, cgroup, stray_commondirs(repositories), seccomp_fd)


def _seccomp_fd(settings: SandboxConfig) -> int | None:
    """With the network, the filter that keeps the host's abstract UNIX sockets out of reach
    (``sandbox_seccomp``); without it, none is needed (a network namespace of its own)."""
    if not settings.network:
        return None
    try:
        return unix_socket_filter_fd()
    except (SeccompUnsupported, OSError) as exc:
        raise SandboxUnavailable(
            f"network = true needs a seccomp filter that closes the host's UNIX sockets: {exc}"
        ) from None


def sandbox_problem(settings: SandboxConfig, user: HostUser | None = None) -> str | None:
    """Why the sandbox the settings ask for cannot start here, with what to do; ``None`` when it can.

    Starts a command in the sandbox once with these settings (the answer is
    kept for the life of the process), so a missing program, a kernel or
    container that forbids namespaces and a configured path that does not
    exist all show up at worker start rather than at the first command.
    ``user``: started as that host user, as a call in its workspace would be.
    """
    if settings.kind == "none":
        return None
    program = bwrap_program()
    found = shutil.which(program)
    if found is None:
        where = "" if "/" in program else " on PATH"
        return f"bubblewrap is not installed ({program!r} not found{where}): {INSTALL_HINT}"
    key = (found, settings, user)
    if key not in _probed:
        _probed[key] = _probe(found, settings, user)
    return _probed[key]


def _probe(program: str, settings: SandboxConfig, user: HostUser | None) -> str | None:
    with tempfile.TemporaryDirectory(prefix="agent-sandbox-probe-") as folder:
        workspace, scratch = Path(folder) / "workspace", Path(folder) / "scratch"
        workspace.mkdir()
        scratch.mkdir()
        give_to(user, Path(folder), workspace, scratch)
        env = {"PATH": "/usr/bin:/bin"}
        shell = limited(settings, SHELL, "true")
        try:
            seccomp_fd = _seccomp_fd(settings)
        except SandboxUnavailable as exc:
            return str(exc)
        argv = bwrap_argv(settings, workspace, scratch, env, shell, program, seccomp_fd=seccomp_fd)
        options: dict[str, Any] = {}
        if user is not None:
            options.update(user=user.uid, group=user.gid, extra_groups=[])
        if seccomp_fd is not None:
            options["pass_fds"] = (seccomp_fd,)
        try:
            done = subprocess.run(
                argv, env=env, capture_output=True, timeout=PROBE_SECONDS, check=False, **options
            )
        except subprocess.TimeoutExpired:
            return f"bwrap ({program}) did not finish a test run within {PROBE_SECONDS:g} s"
        except OSError as exc:
            return f"bwrap ({program}) cannot be run: {exc.strerror or exc}"
        finally:
            if seccomp_fd is not None:
                os.close(seccomp_fd)
    if done.returncode == 0:
        return None
    said = done.stderr.decode(errors="replace").strip() or f"exit code {done.returncode}"
    hint = ""
    if "namespace" in said or "not permitted" in said or "uid map" in said:
        hint = (
            " (the kernel or the container forbids the namespaces it needs; in Docker the worker's"
            " container needs e.g. --security-opt seccomp=unconfined --security-opt apparmor=unconfined"
        )
        if settings.user_namespace:
            hint += (
                "; where only user namespaces are refused (user.max_user_namespaces = 0, AppArmor's"
                " kernel.apparmor_restrict_unprivileged_userns), [sandbox] user_namespace = false runs"
                " without one: a worker running as root then runs commands as uid 0 inside"
            )
        hint += ")"
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
