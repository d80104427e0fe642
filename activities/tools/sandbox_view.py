"""What a sandboxed command sees of the machine: the mount part of its bwrap command line.

An allow-list. The sandbox's root is empty; into it go, in this order (a later
mount shows through an earlier one):

1. ``system_paths`` read-only (``/usr``, ``/bin``, ``/lib*``, ``/etc``,
   ``/opt``, ``/nix``, ``/sys``, those that exist; a link stays a link);
2. a minimal ``/dev`` (its ``/dev/shm`` as large as the memory bound, made
   in ``sandbox.bwrap_argv``) and a ``/proc`` of its own, whose kernel
   settings (``/proc/sys``, ``/proc/sysrq-trigger``, ``/proc/irq``, ...) are
   read-only and whose kernel memory and key files are masked: a command that
   is uid 0 on the host can otherwise write them whatever its capabilities;
3. ``/tmp``, the call's own scratch folder;
4. the workspace, writable; then ``read_only`` and ``writable`` paths;
5. hidden again: ``hide`` paths (with the worker's session store and export
   sinks), the worker's home where a shown path holds it, and, when the command
   is root on the host, what ``/etc`` keeps from other users (``/etc/shadow``,
   private keys), which uid 0 could read;
6. the workspace's ``.git`` pinned, its ``hooks`` and ``config`` (and its
   submodules') read-only unless ``git_metadata_writable``: git runs and
   reads them later, outside the sandbox;
7. the root and ``/dev`` themselves read-only (both in memory), so nothing is
   written outside the mounts above.

Everything else, ``/home``, ``/root``, ``/run``, ``/var``, ``/srv``, ``/mnt``,
the host's ``/tmp`` (and the UNIX sockets in them), other workspaces, is absent.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
import time
from collections.abc import Iterable, Sequence
from pathlib import Path

from durable_agent.config import SandboxConfig

# /proc entries a process that is uid 0 on the host may write without a capability.
PROC_READ_ONLY = ("sys", "sysrq-trigger", "irq", "bus", "fs", "acpi", "scsi", "driver")
# /proc and /sys entries that show the kernel's memory, keys and timers, or firmware: masked.
PROC_MASKED = ("kcore", "keys", "timer_list", "sched_debug", "latency_stats")
SYS_MASKED = ("firmware",)
ETC_SCAN_SECONDS = 60.0  # how long a scan of /etc for what others may not read is reused

_etc_scan: tuple[float, tuple[Path, ...]] | None = None


def shown(settings: SandboxConfig) -> list[Path]:
    """The system paths that exist here, in the order of the settings."""
    return [path for path in settings.system_paths if os.path.lexists(path)]


def system_mounts(settings: SandboxConfig) -> list[str]:
    """Steps 1 and 2: the system paths, ``/dev`` and ``/proc``."""
    argv: list[str] = []
    for path in shown(settings):
        if path.is_symlink():
            argv += ["--symlink", os.readlink(path), str(path)]
        else:
            argv += ["--ro-bind", str(path), str(path)]
    argv += ["--dev", "/dev", "--proc", "/proc"]
    for name in PROC_READ_ONLY:
        if os.path.lexists(f"/proc/{name}"):
            argv += ["--ro-bind", f"/proc/{name}", f"/proc/{name}"]
    argv += _masks(Path("/proc", name) for name in PROC_MASKED)
    if Path("/sys") in shown(settings):
        argv += _masks(Path("/sys", name) for name in SYS_MASKED)
    return argv


def _masks(paths: Iterable[Path]) -> list[str]:
    """Hide existing files behind /dev/null and folders behind an empty read-only tmpfs."""
    argv: list[str] = []
    for path in paths:
        if path.is_symlink() or not path.exists():
            continue
        if path.is_dir():
            argv += ["--tmpfs", str(path), "--remount-ro", str(path)]
        else:
            argv += ["--ro-bind", "/dev/null", str(path)]
    return argv


def _under(path: Path, roots: Iterable[Path]) -> bool:
    return any(path == root or path.is_relative_to(root) for root in roots)


def hidden_mounts(settings: SandboxConfig, workspace: Path, host_root: bool) -> list[str]:
    """Step 5: the paths hidden again, among those the earlier steps show.

    A path that holds the workspace (or is it) cannot be hidden and is left.
    A missing path is made an empty read-only folder when the command could
    otherwise create it (in the workspace or a ``writable`` path); elsewhere
    it cannot appear and is left.
    """
    writable = [workspace, *(path.resolve() for path in settings.writable)]
    visible = [*writable, *(path.resolve() for path in settings.read_only), *shown(settings)]
    targets = [(workspace / path if not path.is_absolute() else path) for path in settings.hide]
    argv: list[str] = []
    # Resolved: a link's target is what to hide, and bwrap mounts on targets anyway.
    for target in dict.fromkeys(path.resolve() for path in targets):
        if _under(workspace, [target]) or not _under(target, visible):
            continue
        if target.exists():
            argv += _masks([target])
        elif _under(target, writable):
            argv += ["--tmpfs", str(target), "--remount-ro", str(target)]
    if host_root and Path("/etc") in shown(settings):
        argv += _masks(path for path in _etc_secrets() if not _under(workspace, [path]))
    return argv


def _etc_secrets() -> tuple[Path, ...]:
    """What in /etc others may not read (its folders, the first closed one): uid 0 could."""
    global _etc_scan
    now = time.monotonic()
    if _etc_scan is not None and now - _etc_scan[0] < ETC_SCAN_SECONDS:
        return _etc_scan[1]
    found: dict[Path, None] = {}
    for folder, folders, files in os.walk("/etc"):
        for name in [*folders, *files]:
            path = Path(folder, name)
            try:
                mode = path.lstat().st_mode
            except OSError:
                continue
            if stat.S_ISLNK(mode):
                continue
            closed = not mode & stat.S_IROTH or (stat.S_ISDIR(mode) and not mode & stat.S_IXOTH)
            if closed:
                found[path] = None
        folders[:] = [name for name in folders if Path(folder, name) not in found]
    _etc_scan = (now, tuple(found))
    return _etc_scan[1]


def git_directories(settings: SandboxConfig, workspace: Path) -> list[Path]:
    """The repositories whose metadata step 6 guards: the workspace's ``.git`` and its submodules'.

    Also the common folder a ``commondir`` file names (a linked worktree's),
    when that is in the workspace. None when ``git_metadata_writable``.
    """
    if settings.git_metadata_writable:
        return []
    git = workspace / ".git"
    if git.is_symlink() or not git.is_dir():
        return []
    repositories = [git]
    modules = git / "modules"
    if modules.is_dir() and not modules.is_symlink():
        for folder, folders, files in os.walk(modules):
            if "config" in files and "HEAD" in files:
                repositories.append(Path(folder))
            folders[:] = [name for name in folders if name not in ("objects", "refs", "logs", "hooks")]
    for repository in list(repositories):
        common = repository / "commondir"
        if common.is_file():
            with contextlib.suppress(OSError, ValueError):
                target = (repository / common.read_text().strip()).resolve()
                if target.is_dir() and target.is_relative_to(workspace) and target not in repositories:
                    repositories.append(target)
    return repositories


def git_metadata_mounts(repositories: Sequence[Path]) -> list[str]:
    """Step 6: each repository folder pinned, its ``hooks`` and ``config`` read-only.

    Pinned (bound onto itself): a mount point cannot be renamed or removed, so
    the command cannot move ``.git`` aside and put a repository of its own,
    with hooks, in its place. A repository with no ``hooks`` folder gets an
    empty read-only one (its mount point is made in it), so the command cannot
    add one; one without ``config`` gets an empty read-only file likewise. An
    existing ``commondir`` is read-only too; one the command makes is removed
    after the call (``stray_commondirs``): an empty one would break git.
    """
    argv: list[str] = []
    for repository in repositories:
        argv += ["--bind", str(repository), str(repository)]
        hooks, config, common = repository / "hooks", repository / "config", repository / "commondir"
        if hooks.is_symlink() or hooks.exists():
            argv += ["--ro-bind", str(hooks), str(hooks)]
        else:
            argv += ["--tmpfs", str(hooks), "--remount-ro", str(hooks)]
        argv += ["--ro-bind", str(config) if config.exists() else "/dev/null", str(config)]
        if common.exists():
            argv += ["--ro-bind", str(common), str(common)]
    return argv


def stray_commondirs(repositories: Sequence[Path]) -> list[Path]:
    """Where a ``commondir`` the command makes would point git elsewhere for hooks and config."""
    return [
        repository / "commondir"
        for repository in repositories
        if not os.path.lexists(repository / "commondir")
    ]


def remove_strays(paths: Sequence[Path]) -> list[str]:
    """Remove the ``commondir`` files the command made; a note for each."""
    notes = []
    for path in paths:
        if not os.path.lexists(path):
            continue
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
        else:
            with contextlib.suppress(OSError):
                path.unlink()
        notes.append(
            f"[removed {path}, made by the command: it would point git outside .git for hooks and config]"
        )
    return notes
