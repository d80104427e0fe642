"""Who a sandboxed command is on the host, and the bounds of one call.

Who: a worker that is not root runs bwrap, and so the command, as itself. A
worker running as root starts bwrap as the owner of the workspace folder when
that owner is not root (``run_as = "workspace-owner"``, the default): the
command is then that user on the host, and what it creates in the workspace is
that user's, like the rest of the workspace. A workspace owned by root (or
``run_as = "worker"``) leaves the command uid 0 on the host: without
capabilities, in a user namespace where it is ``uid``, with the kernel's
settings read-only (``sandbox_view``), but still root for the checks that ask
for uid 0 and not a capability.

Bounds: rlimits, set by the shell that starts the command inside the sandbox
(``limits_prefix``): address space, file size and CPU time per process, and
processes at once. The kernel counts that last one per user namespace (each
call has its own), and never for uid 0: when the command is root on the host,
the number of processes is bounded by a cgroup of the call's own (``pids.max``,
cgroup v2 or v1) instead, and where none can be made the call fails rather
than running unbounded.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import resource
import stat
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from durable_agent.config import SandboxConfig

CGROUP_PARENT = "durable-agent"
# How long to wait for a call's cgroup to empty before removing it (its last processes are reaped).
CGROUP_REMOVE_SECONDS = 1.0


class SandboxUnavailable(Exception):
    """The sandbox cannot run this call as configured; the message says why and what to do."""


@dataclass(frozen=True)
class HostUser:
    """The host uid and gid bwrap is started as, when not the worker's own."""

    uid: int
    gid: int


def host_user(settings: SandboxConfig, workspace: Path) -> HostUser | None:
    """Who to start bwrap as: ``None`` for the worker itself, else the workspace's owner.

    Raises ``SandboxUnavailable`` when that owner cannot reach the workspace.
    """
    if os.geteuid() != 0 or settings.run_as == "worker":
        return None
    owner = workspace.stat()
    if owner.st_uid == 0:
        return None
    try:
        gid = pwd.getpwuid(owner.st_uid).pw_gid
    except KeyError:  # a uid without a passwd entry: the folder's group, never root's
        gid = owner.st_gid or owner.st_uid
    user = HostUser(owner.st_uid, gid)
    closed = _closed_ancestor(workspace, user)
    if closed is not None:
        raise SandboxUnavailable(
            f"the command runs as the workspace's owner (uid {user.uid}), who cannot reach the"
            f" workspace: {str(closed)!r} is closed to it; open that folder to the owner, or set"
            ' [sandbox] run_as = "worker" to run commands as the worker'
        )
    return user


def _closed_ancestor(path: Path, user: HostUser) -> Path | None:
    """The first folder on the way to ``path`` that ``user`` (without groups but its own) cannot enter."""
    for folder in [*reversed(path.parents), path]:
        info = folder.stat()
        if info.st_uid == user.uid:
            allowed = info.st_mode & stat.S_IXUSR
        elif info.st_gid == user.gid:
            allowed = info.st_mode & stat.S_IXGRP
        else:
            allowed = info.st_mode & stat.S_IXOTH
        if not allowed:
            return folder
    return None


def give_to(user: HostUser | None, *paths: Path) -> None:
    """Make the call's own folders (its scratch folder) the user's who runs the command."""
    if user is not None:
        for path in paths:
            os.chown(path, user.uid, user.gid)


# --- rlimits ------------------------------------------------------------------------------


def _bounded(wanted: int, kind: int) -> int:
    """``wanted``, lowered to the hard limit the worker has (which nothing unprivileged can raise)."""
    hard = resource.getrlimit(kind)[1]
    return wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)


def limits_prefix(settings: SandboxConfig, processes: bool = True) -> str:
    """The shell code that sets the call's rlimits (soft and hard) before it runs the command.

    Core dumps are off: with the kernel's settings read-only nothing could use
    them, and a large process would leave a file of its size in the workspace.
    ``processes`` is false where the count would not be the call's own (no sandbox).
    """
    options = ["-c 0"]
    if settings.max_memory_bytes:
        options.append(f"-v {_bounded(settings.max_memory_bytes, resource.RLIMIT_AS) // 1024}")
    if settings.max_file_bytes:
        options.append(f"-f {_bounded(settings.max_file_bytes, resource.RLIMIT_FSIZE) // 1024}")
    if processes and settings.max_processes:
        options.append(f"-u {_bounded(settings.max_processes, resource.RLIMIT_NPROC)}")
    # bash counts -v in KiB and -f in 1024-byte blocks (outside POSIX mode, which -c is not)
    steps = [f"ulimit -S -H {' '.join(options)}"]
    if settings.max_cpu_seconds:
        # SIGXCPU at the limit (a clear "killed by SIGXCPU"), SIGKILL a second later if ignored
        cpu = _bounded(settings.max_cpu_seconds + 1, resource.RLIMIT_CPU)
        steps += [f"ulimit -S -t {min(settings.max_cpu_seconds, cpu)}", f"ulimit -H -t {cpu}"]
    return " && ".join(steps) + " || { echo 'sandbox: cannot set the resource limits' >&2; exit 126; }\n"


def limited(settings: SandboxConfig, shell: str, command: str, processes: bool = True) -> list[str]:
    """The argv that runs ``command`` with ``shell -c`` under the call's rlimits.

    The limits are set by a first shell, which then becomes (``exec``) the
    command's own ``shell -c COMMAND``: the same process, ``$$`` and exit status.
    """
    script = limits_prefix(settings, processes) + f'exec {shell} -c "$1"'
    return [shell, "-c", script, shell, command]


# --- a cgroup for a call whose command is root on the host ----------------------------------


@dataclass
class CallCgroup:
    """A cgroup made for one call: bwrap joins it before it starts (``join``), and all inside with it."""

    path: Path
    procs: int  # an open descriptor on its cgroup.procs

    def join(self) -> None:
        """Move the calling process into the cgroup (a ``preexec_fn``: no locks, no imports)."""
        os.write(self.procs, b"0")

    def remove(self) -> None:
        """Close and remove the cgroup once its processes are gone (they are when bwrap has ended)."""
        if self.procs < 0:
            return  # removed already
        with contextlib.suppress(OSError):
            os.close(self.procs)
        self.procs = -1
        deadline = time.monotonic() + CGROUP_REMOVE_SECONDS
        while True:
            try:
                self.path.rmdir()
                return
            except FileNotFoundError:
                return
            except OSError:
                if time.monotonic() >= deadline:
                    return  # left for the next worker start to remove (_remove_stale)
                time.sleep(0.02)


def _pids_hierarchies() -> list[tuple[str, Path]]:
    """The cgroup file systems with the pids controller: ("v2" | "v1", folder to make cgroups in)."""
    found: list[tuple[str, Path]] = []
    own = _own_cgroups()
    try:
        lines = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError:
        return []
    for line in lines:
        fields, _, tail = line.partition(" - ")
        parts, extra = fields.split(), tail.split()
        if len(parts) < 5 or len(extra) < 3:
            continue
        root, mount = parts[3], Path(parts[4])
        if extra[0] == "cgroup2":
            with contextlib.suppress(OSError):
                if "pids" in (mount / "cgroup.controllers").read_text().split():
                    found.insert(0, ("v2", mount))
        elif extra[0] == "cgroup" and "pids" in extra[2].split(","):
            found.append(("v1", mount))
            # where the mount's top is not writable (a container), the worker's own cgroup may be
            mine = own.get("pids")
            if mine and mine != "/" and Path(mine).is_relative_to(root):
                found.append(("v1", mount / Path(mine).relative_to(root)))
    return found


def _own_cgroups() -> dict[str, str]:
    """The worker's cgroup in each v1 hierarchy, by controller."""
    own: dict[str, str] = {}
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/cgroup").read_text().splitlines():
            _, controllers, path = line.split(":", 2)
            for controller in controllers.split(","):
                own[controller] = path
    return own


def _enable_pids(folder: Path) -> None:
    control = folder / "cgroup.subtree_control"
    if "pids" not in control.read_text().split():
        control.write_text("+pids")


def _remove_stale(parent: Path) -> None:
    """Remove the empty cgroups of calls whose worker is gone (killed before it could)."""
    with contextlib.suppress(OSError):
        for child in parent.iterdir():
            pid = child.name.split("-")[1] if child.name.startswith("call-") else ""
            if pid.isdigit() and int(pid) != os.getpid() and not Path(f"/proc/{pid}").exists():
                with contextlib.suppress(OSError):
                    child.rmdir()


_cleaned: set[Path] = set()


def call_cgroup(max_processes: int) -> CallCgroup:
    """A new cgroup whose ``pids.max`` is ``max_processes``; ``SandboxUnavailable`` when none can be made."""
    tried = []
    for version, top in _pids_hierarchies():
        parent = top / CGROUP_PARENT
        try:
            if version == "v2":
                _enable_pids(top)
            parent.mkdir(exist_ok=True)
            if version == "v2":
                _enable_pids(parent)
            if parent not in _cleaned:
                _cleaned.add(parent)
                _remove_stale(parent)
            path = parent / f"call-{os.getpid()}-{uuid.uuid4().hex[:12]}"
            path.mkdir()
        except OSError as exc:
            tried.append(f"{parent}: {exc.strerror or exc}")
            continue
        try:
            (path / "pids.max").write_text(str(max_processes))
            procs = os.open(path / "cgroup.procs", os.O_WRONLY | os.O_CLOEXEC)
        except OSError as exc:
            with contextlib.suppress(OSError):
                path.rmdir()
            tried.append(f"{path}: {exc.strerror or exc}")
            continue
        return CallCgroup(path, procs)
    where = "; ".join(tried) if tried else "no cgroup file system with the pids controller is mounted"
    raise SandboxUnavailable(
        "the command would run as root on the host (the workspace is root's), where the kernel does"
        f" not apply the process limit, and no cgroup can be made to apply it ({where}). Run the"
        " worker as a user that is not root, give the workspace to one (chown), or set"
        " [sandbox] max_processes = 0 to run without a bound on processes"
    )
