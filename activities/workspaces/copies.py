"""This machine's copies of run workspaces, each kept at the tree its run expects.

A run whose workspace follows it (``RunPlan.workspace_base``) holds, in its workflow, the git
tree its workspace must be at. Every call that reads or changes files carries that tree; before
it runs, ``WorkspaceCopies.enter`` makes this machine's copy equal to it, and after a call that
may change files ``leave`` records the new tree and puts its new objects in the run's sink
before the activity returns (``activities/workspace_tree.py``). The workflow advances the tree
only from those results, so a call that was cut short (its worker killed mid-``bash``) is run
again from the tree before it, on whatever machine runs it.

The fast path costs a small file's read: each copy's shadow repository holds a mark, the tree
this machine last left the copy at, cleared (durably) before a call that may change files and
written again once the call's tree is recorded. A copy whose mark is the expected tree is used
as it is: a person's edit made meanwhile on this machine stays, and the next boundary records
it. Any other copy is restored where it diverges: its files are recorded first (the tree they
made stays in this machine's shadow, named in the event), the objects of the expected tree this
machine lacks are fetched from the sink, and git's ``read-tree --reset -u`` rewrites the files
that differ. Files the tree never holds (ignored ones, ``node_modules``, build output) are left
as they are, and do not come along from the machine the run was on.

Calls of one run that run together (an answer's parallel calls) share the copy at their tree;
a call that expects another tree (a late attempt of a worker that was stopped, another run on
the same folder) waits until they are done.

A worker that is not the run's host (``ToolCallInput.host``) and whose copy is not at the tree
does not restore it: the call comes back ``elsewhere`` and the workflow sends it to the host's
own task queue (``core/run_workspace.py``), or, when the host does not take it in time, to any
worker with ``take_over`` (docs/workspaces.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import shutil
import socket
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from durable_agent.activities.files import fsync_dir, write_synced
from durable_agent.activities.workspace_tree import WorkspaceTooLarge, WorkspaceTrees
from durable_agent.activities.workspaces.errors import WorkspaceTreeError
from durable_agent.activities.workspaces.fetching import fetch_tree
from durable_agent.activities.workspaces.setup import WorkspaceSetup
from durable_agent.activities.workspaces.shadow import ShadowRepo
from durable_agent.core.models import WorkspaceRestore, WorkspaceState

__all__ = ["Held", "WorkspaceCopies", "new_host_id", "sweep"]

log = logging.getLogger(__name__)

_MARK = "durable-agent-at"  # in the shadow's git folder: "<tree>\n", the copy's tree on this machine


def new_host_id() -> str:
    """A worker process's id as a run's host: the machine's name, the process and a random part
    (a process that starts again is another host, whose copies may hold what the last left)."""
    return f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"


@functools.cache
def _boot_id() -> str:
    """This boot of the machine (Linux's ``boot_id``; elsewhere the process's start, so that a
    mark is never trusted across a start it cannot tell from a reboot)."""
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text(encoding="ascii").strip()
    except OSError:
        return f"process-{os.getpid()}-{uuid.uuid4().hex}"


@dataclass(frozen=True)
class Held:
    """A call's hold on this machine's copy: where it is, the tree it started at, and the
    restore that made it so (None: the copy was at the tree already)."""

    workspace: Path
    tree: str
    changes: bool
    restored: WorkspaceRestore | None = None
    # what the model is told of the workspace's ``[workspaces] setup`` run first (None: none ran)
    setup: str | None = None


@dataclass
class _Copy:
    """The calls of this process in one copy: the tree they started at, and how many run."""

    ready: asyncio.Condition = field(default_factory=asyncio.Condition)
    tree: str | None = None
    running: int = 0


class WorkspaceCopies:
    """The worker's side of a run whose workspace follows it (see the module's docstring).

    Args:
        trees: The worker's shadow repositories and sinks (``WorkspaceTrees``).
        host: This worker's host id (``new_host_id``).
        shared: The workspaces are on a disk every worker shares: nothing is restored.
    """

    def __init__(
        self,
        trees: WorkspaceTrees,
        host: str,
        *,
        shared: bool = False,
        max_bytes: int | None = None,
        setup: WorkspaceSetup | None = None,
    ) -> None:
        self.trees = trees
        self.host = host
        self.shared = shared
        self.max_bytes = max_bytes
        self.setup = setup
        self._copies: dict[Path, _Copy] = {}

    # --- the mark --------------------------------------------------------------------------

    @staticmethod
    def mark_of(repo: ShadowRepo) -> str | None:
        """The tree this machine last left the copy at; None: none, a call may have changed it,
        or the machine started again since (its files may not all have reached the disk)."""
        try:
            tree, _, boot = (repo.git_dir / _MARK).read_text(encoding="ascii").strip().partition(" ")
        except (OSError, UnicodeDecodeError):
            return None
        return (tree or None) if boot == _boot_id() else None

    @staticmethod
    def _set_mark(repo: ShadowRepo, tree: str) -> None:
        # Not fsynced, and neither are the files it vouches for: the mark names the machine's boot,
        # so after a crash of the machine the copy is restored where it differs, never trusted.
        write_synced(repo.git_dir / _MARK, f"{tree} {_boot_id()}\n".encode("ascii"), sync=False)

    @staticmethod
    def _clear_mark(repo: ShadowRepo) -> None:
        """Before a call that may change files: durably, so that a machine that crashes mid-call
        never trusts the files the call left half-written."""
        path = repo.git_dir / _MARK
        try:
            path.unlink()
        except FileNotFoundError:
            return
        fsync_dir(repo.git_dir)

    async def adopt(self, workspace: Path, tree: str) -> None:
        """Mark the copy at ``workspace`` as at ``tree``, just recorded there (a run's base).

        Args:
            workspace: The copy's folder on this machine.
            tree: The tree its files were recorded as.
        """
        repo = self.trees.repo(workspace)
        await asyncio.to_thread(self._set_mark, repo, tree)

    # --- a call's hold ---------------------------------------------------------------------

    async def enter(
        self,
        workspace: Path,
        tree: str,
        sink: str,
        *,
        host: str | None,
        take_over: bool,
        changes: bool,
    ) -> Held | None:
        """Make this machine's copy hold ``tree`` before a call runs (see the module's docstring).

        Args:
            workspace: The run's workspace folder.
            tree: The tree the run expects it at.
            sink: The run's export sink, which holds the tree's objects.
            host: The run's host (None: none yet).
            take_over: Restore even where another worker is the run's host (it did not take the
                call in time, or a retry: the host is likely gone).
            changes: The call may change files: the mark is cleared while it runs.

        Returns:
            The call's hold, or None: the copy is not at the tree and the run's host is another
                worker, which should run the call.

        Raises:
            WorkspaceTreeError: The tree could not be restored (its objects are not in the sink,
                git failed).
        """
        folder = workspace.resolve()
        copy = self._copies.setdefault(folder, _Copy())
        repo = self.trees.repo(folder)
        with contextlib.suppress(OSError):  # the copy's last use, for ``sweep``: on our shadow, not
            os.utime(repo.git_dir)  # on the workspace's own folder
        async with copy.ready:
            await copy.ready.wait_for(lambda: copy.running == 0 or copy.tree == tree)
            restored: WorkspaceRestore | None = None
            set_up: str | None = None
            if copy.running == 0:
                if not self.shared:
                    at = await asyncio.to_thread(self.mark_of, repo)
                    if at != tree:
                        if host not in (None, self.host) and not take_over:
                            return None
                        restored = await self._restore(repo, tree, sink, host)
                if self.setup is not None:
                    set_up = await self.setup.ensure(repo, folder)
            if changes:
                await asyncio.to_thread(self._clear_mark, repo)
            copy.tree = tree
            copy.running += 1
        return Held(folder, tree, changes, restored, set_up)

    async def leave(self, held: Held, sink: str | None, *, record: bool) -> WorkspaceState | None:
        """End a call's hold; with ``record``, record the copy and put the tree's new objects in
        ``sink`` first.

        Args:
            held: What ``enter`` gave.
            sink: The run's export sink.
            record: The call may have changed files.

        Returns:
            The copy's tree after the call (with ``record``), its objects in the sink.

        Raises:
            WorkspaceTreeError: The copy could not be recorded, or the sink did not take its
                objects: the call's changes are nowhere the run can reach them.
            WorkspaceTooLarge: Past ``max_bytes``: the copy is back at ``held.tree``.
        """
        copy = self._copies[held.workspace]
        async with copy.ready:
            try:
                try:
                    state = (
                        await self.trees.record(held.workspace, sink, strict=True, max_bytes=self.max_bytes)
                        if record
                        else None
                    )
                except WorkspaceTooLarge:
                    # nothing beyond the tree the call started at: its files are put back
                    repo = self.trees.repo(held.workspace)
                    await asyncio.to_thread(repo.checkout, held.tree)
                    if copy.running == 1:
                        await asyncio.to_thread(self._set_mark, repo, held.tree)
                    raise
                if state is not None and copy.running == 1 and not self.shared:
                    await asyncio.to_thread(self._set_mark, self.trees.repo(held.workspace), state.tree)
            finally:
                copy.running -= 1
                copy.ready.notify_all()
        return state

    async def _restore(
        self, repo: ShadowRepo, tree: str, sink_name: str, host: str | None
    ) -> WorkspaceRestore | None:
        """Make the copy hold ``tree`` (its objects fetched from the sink as needed); None when
        this host's copy held its files already and only its mark was missing (a call that changed
        nothing was cut short, a child run recorded the files here): nothing to tell."""
        sink = self.trees.object_sink(sink_name)
        if sink is None:
            raise WorkspaceTreeError(f"the run's sink {sink_name!r} holds no workspace trees to restore from")
        started = time.monotonic()
        await asyncio.to_thread(repo.prepare)
        fetched = await fetch_tree(repo, tree, sink)
        replaced = await asyncio.to_thread(repo.checkout, tree)
        await asyncio.to_thread(self._set_mark, repo, tree)
        took = int((time.monotonic() - started) * 1000)
        moved = host is not None and host != self.host
        if not moved and replaced == tree:
            return None
        log.info(
            "workspace %s restored to %s (%s; %d objects, %d bytes fetched, %d ms)",
            repo.workspace,
            tree,
            "the run moved here" if moved else "the copy had diverged",
            fetched.objects,
            fetched.size,
            took,
        )
        return WorkspaceRestore(
            tree=tree,
            host=self.host,
            from_host=host,
            objects=fetched.objects,
            bytes=fetched.size,
            duration_ms=took,
            reason="moved" if moved else "diverged",
            replaced=None if replaced == tree else replaced,
        )


def sweep(copies: WorkspaceCopies, root: Path, keep_hours: float, now: float | None = None) -> list[Path]:
    """Remove the runs' own folders under ``root`` (``<root>/<session>/<run>``, made from a source)
    unused for ``keep_hours``, with their shadow repositories: a run that acts again restores its
    copy from its sink. A folder a call of this process holds is kept.

    Args:
        copies: This worker's copies (their shadow repositories, the calls running).
        root: ``[workspaces] root``.
        keep_hours: How long an unused folder stays.
        now: The time to measure from (default: now).

    Returns:
        The folders removed.
    """
    limit = (time.time() if now is None else now) - keep_hours * 3600
    removed = []
    for folder in sorted(root.glob("*/*")):
        if folder.parts[-2].startswith(".") or not folder.is_dir():
            continue  # the mirrors of repositories (``.git-cache``)
        held = copies._copies.get(folder.resolve())
        shadow = copies.trees.repo(folder).git_dir
        try:
            used = max(folder.stat().st_mtime, shadow.stat().st_mtime if shadow.exists() else 0.0)
        except OSError:
            continue
        if (held is not None and held.running) or used > limit:
            continue
        shutil.rmtree(shadow, ignore_errors=True)
        shutil.rmtree(folder, ignore_errors=True)
        copies._copies.pop(folder.resolve(), None)  # this process's record of it, with it
        with contextlib.suppress(OSError):
            folder.parent.rmdir()  # the session's folder, once its last run's is gone
        removed.append(folder)
    if removed:
        log.info("removed %d run workspaces unused for %g hours under %s", len(removed), keep_hours, root)
    return removed
