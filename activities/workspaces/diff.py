"""What a run changed in its workspace: the unified diff between two of the git trees its
events recorded (``activities/workspace_tree.py``), read in a shadow repository from the sink
that holds their objects.

A run's trees are in its events: its base (the workspace when it started) in ``run_start``, and
after each call to a tool that may change files the tree in that call's ``tool_end``
(``run_trees``). The diff reads only what it compares: both trees' folders, then the objects
of the files that differ (``git diff-tree`` compares trees without their files' contents), so a
diff of a large workspace on a fresh shadow fetches the changed files, not the workspace. It runs
on git's plumbing alone, never on a work tree: a machine without the run's workspace reads it in
an empty folder's shadow (``reading_repo``).
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from durable_agent.activities.sinks import ObjectSink
from durable_agent.activities.workspaces.errors import WorkspaceTreeError
from durable_agent.activities.workspaces.fetching import fetch_tree
from durable_agent.activities.workspaces.shadow import ShadowRepo
from durable_agent.core.events import EventRecord, RewindEvent, RunStartEvent, ToolEndEvent
from durable_agent.core.models import DIFF_SHOWN_BYTES, DIFF_SHOWN_FILES, WorkspaceChange

__all__ = [
    "EMPTY_TREE",
    "Boundary",
    "FileStat",
    "RunTrees",
    "diff_stat",
    "reading_repo",
    "run_trees",
    "workspace_change",
    "write_diff",
]

# git's tree with no entries: what a diff starts from when there is no base tree
EMPTY_TREE = "4b825dc642cb6eb9a060e54bf8d69288fbee4904"
_NO_OBJECT = "0" * 40  # the id a raw diff gives the side a file is absent from
_GITLINK = "160000"  # a nested repository's commit: not among the workspace's objects
_BATCH = 500  # objects asked of a sink at once, as ``fetch_tree`` does
# git alone decides what the diff says: no colors, no external diff program, no rename guesses
_DIFF_TREE = ("diff-tree", "-r", "--no-renames", "--no-color", "--no-ext-diff")
# the empty folder whose shadow ``reading_repo`` reads trees in, inside the shadow root
_READING_WORKSPACE = "reading-workspace"


# --- a run's trees, from its events -------------------------------------------------------


@dataclass(frozen=True)
class Boundary:
    """One tool boundary of a run: the call that ended it, and the tree that call recorded.

    Attributes:
        turn: The boundary's turn (1 for the run's first tool call; an export's ``turn``).
        call_id: The call's id.
        tool: The call's tool.
        recorded: The workspace's tree after the call (None: it recorded none: its tool changes
            no file, or the worker records no trees).
    """

    turn: int
    call_id: str
    tool: str
    recorded: str | None


@dataclass(frozen=True)
class RunTrees:
    """A run's workspace trees by turn (``run_trees``).

    Attributes:
        base: The workspace's tree when the run started (None: not recorded).
        boundaries: The run's tool boundaries in order, ``boundaries[n - 1]`` that of turn ``n``.
    """

    base: str | None
    boundaries: tuple[Boundary, ...]

    @property
    def turns(self) -> int:
        """The run's last turn (0: it made no tool call)."""
        return len(self.boundaries)

    def at(self, turn: int) -> str | None:
        """The workspace's tree at a boundary: the newest tree recorded at or before it.

        Args:
            turn: The boundary's turn; 0 is the run's start.

        Returns:
            The tree; the base when no call had recorded one by then (None: nor the base).

        Raises:
            ValueError: The run has no such turn.
        """
        if not 0 <= turn <= self.turns:
            raise ValueError(f"the run has no turn {turn} (its turns: 1 to {self.turns})")
        recorded = (b.recorded for b in reversed(self.boundaries[:turn]) if b.recorded is not None)
        return next(recorded, self.base)

    @property
    def final(self) -> str | None:
        """The tree at the run's last boundary (``at(turns)``)."""
        return self.at(self.turns)

    def first_recorded(self) -> Boundary | None:
        """The first boundary whose call recorded a tree (None: none did)."""
        return next((b for b in self.boundaries if b.recorded is not None), None)


def run_trees(events: Iterable[EventRecord]) -> RunTrees:
    """A run's base tree and the tree of each boundary, from its events.

    The base is ``run_start``'s ``workspace``; for a run that has none there (its workers
    recorded no base), a ``rewind`` event before its first tool call (the run a rewind went on
    as) names the tree it started from. Each ``tool_end`` is one boundary, its turn counted from
    the run's start as the run counts them.

    Args:
        events: The run's events in order (an export's ``source_run().events``).

    Returns:
        The base (None: not recorded) and the boundaries.
    """
    base: str | None = None
    started = False
    boundaries: list[Boundary] = []
    for record in events:
        event = record.event
        if isinstance(event, RunStartEvent) and not started:
            started = True
            base = event.workspace.tree if event.workspace is not None else None
        elif isinstance(event, RewindEvent) and not boundaries and base is None:
            base = event.tree
        elif isinstance(event, ToolEndEvent):
            tree = event.workspace.tree if event.workspace is not None else None
            boundaries.append(Boundary(len(boundaries) + 1, event.id, event.name, tree))
    return RunTrees(base, tuple(boundaries))


# --- the diff ---------------------------------------------------------------------------


def reading_repo(root: Path) -> ShadowRepo:
    """A shadow repository to read a run's trees in on a machine without its workspace: its
    workspace an empty folder under ``root`` (a diff never reads a work tree), the same one each
    time, so the objects one diff fetched serve the next.

    Args:
        root: Where shadow repositories are (``[workspace_checkpoints] path``, or
            ``default_shadow_root()``).

    Returns:
        The repository (made on first use).
    """
    return ShadowRepo(root, root / _READING_WORKSPACE)


def _text(raw: bytes) -> str:
    return raw.decode("utf-8", "replace")


def _changed(raw: bytes) -> tuple[list[str], dict[str, tuple[str, int]]]:
    """A raw ``diff-tree -z`` listing's paths, and the objects of its files: id -> (path, side),
    side 0 the first tree's, 1 the second's."""
    fields = raw.split(b"\0")
    paths: list[str] = []
    blobs: dict[str, tuple[str, int]] = {}
    for meta, path in zip(fields[0:-1:2], fields[1::2], strict=True):
        old_mode, new_mode, old, new, _ = meta.decode().lstrip(":").split(" ")
        name = _text(path)
        paths.append(name)
        for side, (mode, oid) in enumerate(((old_mode, old), (new_mode, new))):
            if oid != _NO_OBJECT and mode != _GITLINK:
                blobs.setdefault(oid, (name, side))
    return paths, blobs


async def _bring(repo: ShadowRepo, sink: ObjectSink, base: str | None, final: str) -> list[str]:
    """Bring what the diff of ``base`` to ``final`` reads into ``repo``: both trees' folders, then
    the objects of the files that differ, those it lacks from ``sink``.

    Returns:
        The paths that differ, in git's order.

    Raises:
        WorkspaceTreeError: The sink lacks a tree or a file's object (named), or git failed.
    """
    await asyncio.to_thread(repo.prepare)
    if base is None:  # git knows the empty tree, but writing it keeps every git read of it plain
        await asyncio.to_thread(repo.git, "hash-object", "-t", "tree", "-w", "--stdin", stdin=b"")
    for tree in (base, final):
        if tree is not None:
            await fetch_tree(repo, tree, sink, blobs=False)
    trees = (base or EMPTY_TREE, final)
    raw = await asyncio.to_thread(repo.git, *_DIFF_TREE, "--raw", "--no-abbrev", "-z", *trees)
    paths, blobs = _changed(raw)
    held = await asyncio.to_thread(repo.has, sorted(blobs))
    missing = sorted(oid for oid in blobs if oid not in held)
    for start in range(0, len(missing), _BATCH):
        batch = missing[start : start + _BATCH]
        got = await sink.get_objects(batch)
        if lacking := [oid for oid in batch if oid not in got]:
            path, side = blobs[lacking[0]]
            raise WorkspaceTreeError(
                f"the sink does not hold object {lacking[0]} (file {path!r} of workspace tree {trees[side]})"
            )
        await asyncio.to_thread(repo.add_objects, got)
    return paths


def _patch_into(repo: ShadowRepo, base: str | None, final: str, path: Path) -> int:
    """Write the unified diff of ``base`` to ``final`` into the file ``path`` (git writes it
    there, so no diff is held whole in memory); its size."""
    repo.git(*_DIFF_TREE, "-p", f"--output={path}", base or EMPTY_TREE, final)
    return path.stat().st_size


def _head(path: Path, size: int) -> bytes:
    with path.open("rb") as f:
        return f.read(size)


def _copy(path: Path, out: BinaryIO) -> None:
    with path.open("rb") as f:
        shutil.copyfileobj(f, out)
    out.flush()


async def workspace_change(
    repo: ShadowRepo,
    sink: ObjectSink,
    base: str | None,
    final: str | None,
    *,
    max_bytes: int = DIFF_SHOWN_BYTES,
    max_files: int = DIFF_SHOWN_FILES,
) -> WorkspaceChange:
    """What changed from tree ``base`` to tree ``final``: the unified diff (a binary file as
    git's ``Binary files … differ``), at most ``max_bytes`` of it, and the paths that differ.

    Args:
        repo: The shadow repository to read the trees in (``reading_repo`` where the workspace is
            not on this machine); the objects it lacks come from ``sink``.
        sink: The sink that holds the trees' objects.
        base: The tree the run started from (None: none; the diff starts from the empty tree).
        final: The tree it ended at (None: not recorded; nothing is compared).
        max_bytes: The most of the diff kept; a longer one is cut at the end of its last whole
            line within it.
        max_files: The most paths named.

    Returns:
        The change: ``diff_bytes`` the whole diff's size, ``truncated`` whether ``diff`` is cut.

    Raises:
        WorkspaceTreeError: The sink lacks an object of either tree (the message names it), or
            git failed.
    """
    if final is None or base == final:
        return WorkspaceChange(base=base, final=final)
    paths = await _bring(repo, sink, base, final)
    with tempfile.TemporaryDirectory(prefix="durable-agent-diff-") as folder:
        path = Path(folder) / "diff"
        size = await asyncio.to_thread(_patch_into, repo, base, final, path)
        head = await asyncio.to_thread(_head, path, max_bytes)
    truncated = size > max_bytes
    if truncated:
        head = head[: head.rfind(b"\n") + 1]
    return WorkspaceChange(
        base=base,
        final=final,
        diff=_text(head),
        diff_bytes=size,
        truncated=truncated,
        files=tuple(paths[:max_files]),
    )


async def write_diff(repo: ShadowRepo, sink: ObjectSink, base: str | None, final: str, out: BinaryIO) -> int:
    """Write the whole unified diff from tree ``base`` to tree ``final`` to ``out``.

    Args:
        repo: The shadow repository to read the trees in (see ``workspace_change``).
        sink: The sink that holds the trees' objects.
        base: The tree to compare from (None: the empty tree).
        final: The tree to compare to.
        out: Where the diff goes (``sys.stdout.buffer``, a file opened for writing bytes).

    Returns:
        The diff's size in bytes (0: the trees hold the same files).

    Raises:
        WorkspaceTreeError: As ``workspace_change``.
    """
    if base == final:
        return 0
    await _bring(repo, sink, base, final)
    with tempfile.TemporaryDirectory(prefix="durable-agent-diff-") as folder:
        path = Path(folder) / "diff"
        size = await asyncio.to_thread(_patch_into, repo, base, final, path)
        await asyncio.to_thread(_copy, path, out)
    return size


@dataclass(frozen=True)
class FileStat:
    """A path that differs between two trees, and its lines added and deleted.

    Attributes:
        path: The file's path in the workspace.
        added: Lines added (None: a binary file).
        deleted: Lines deleted (None: a binary file).
    """

    path: str
    added: int | None
    deleted: int | None


async def diff_stat(repo: ShadowRepo, sink: ObjectSink, base: str | None, final: str) -> list[FileStat]:
    """The paths that differ from tree ``base`` to tree ``final``, with their line counts
    (git's ``--numstat``).

    Args:
        repo: The shadow repository to read the trees in (see ``workspace_change``).
        sink: The sink that holds the trees' objects.
        base: The tree to compare from (None: the empty tree).
        final: The tree to compare to.

    Returns:
        One ``FileStat`` a path, in git's order (empty: the same files).

    Raises:
        WorkspaceTreeError: As ``workspace_change``.
    """
    if base == final:
        return []
    await _bring(repo, sink, base, final)
    raw = await asyncio.to_thread(repo.git, *_DIFF_TREE, "--numstat", "-z", base or EMPTY_TREE, final)
    out = []
    for line in raw.split(b"\0"):
        if not line:
            continue
        added, deleted, path = line.split(b"\t", 2)
        binary = added == b"-"
        out.append(FileStat(_text(path), None if binary else int(added), None if binary else int(deleted)))
    return out
