"""A workspace's shadow repository: its files recorded as a git tree, the tree's objects read
and kept, a tree checked out into the workspace.

Each workspace has a shadow repository of its own, outside it (``<root>/<digest of the
workspace's path>``), which git's plumbing runs with ``GIT_DIR`` the shadow, ``GIT_WORK_TREE``
the workspace and the shadow's own index: the workspace's ``.git`` (its history, its index)
is never read or written. The tree is the one ``git add -A`` then ``git write-tree`` give, found
with one scan of the files: ``git status`` lists what changed since the last record (the shadow's
HEAD), and only those paths are added (``workspaces/record.py``); the index keeps each file's
stat data, so a boundary that changed one file hashes one file. Files the
workspace's ``.gitignore`` files (or its ``.git/info/exclude``) ignore are left out, as are
``.git`` folders, the worker's own folders inside the workspace, and files past the size
bounds (``[workspace_checkpoints]``), which the event names.

Git's own settings (``~/.gitconfig``, ``/etc/gitconfig``) are not read.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import subprocess
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from durable_agent.activities.files import write_synced
from durable_agent.activities.workspaces.errors import WorkspaceTreeError
from durable_agent.activities.workspaces.objects import _loose, _object_parts, object_id
from durable_agent.activities.workspaces.packs import pack_of
from durable_agent.activities.workspaces.record import (
    STATUS_ARGS,
    changes_of,
    drop_head,
    head_tree,
    loose_objects_since,
    set_head,
    too_large,
)

__all__ = ["ShadowRepo", "default_shadow_root"]

# git alone: neither the user's settings nor the system's, no prompt, plain messages
_ENV = {
    "GIT_CONFIG_GLOBAL": os.devnull,
    "GIT_CONFIG_NOSYSTEM": "1",
    "GIT_TERMINAL_PROMPT": "0",
    "LC_ALL": "C",
}
_SETTINGS = (
    ("gc.auto", "0"),
    ("core.autocrlf", "false"),
    ("core.symlinks", "true"),
    ("core.filemode", "true"),
    # an index and an untracked cache made for large workspaces: a boundary reads only what changed
    ("feature.manyFiles", "true"),
    # the untracked cache serves ``status --untracked-files=all`` only when that is the setting
    ("status.showUntrackedFiles", "all"),
    # an index write is of the entries changed since the shared part (~30 KB, not ~750 KB), which
    # is written again past 20% of them; a shared part replaced goes after a day
    ("core.splitIndex", "true"),
    ("splitIndex.sharedIndexExpire", "1.day.ago"),
)
# the settings a shadow has, named in it, so that a shadow made before they changed gets them
_SETTINGS_FILE = "durable-agent-settings"
_SETTINGS_KEY = hashlib.sha256(repr(_SETTINGS).encode()).hexdigest()[:16]
_PACK_MIN_OBJECTS = 64  # fewer are written as loose objects, a file each
_MOST_PACKS = 32

# one record at a time in each shadow: the threads of this worker share the index
_locks: dict[Path, threading.Lock] = {}
_locks_guard = threading.Lock()


def default_shadow_root() -> Path:
    """``$XDG_STATE_HOME/durable-agent/shadow`` (``~/.local/state/durable-agent/shadow``)."""
    state = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    return Path(state) / "durable-agent" / "shadow"


def _lock(path: Path) -> threading.Lock:
    with _locks_guard:
        return _locks.setdefault(path, threading.Lock())


@dataclass(frozen=True)
class Recorded:
    """A workspace recorded: its tree, and the files past the size bounds left out of it."""

    tree: str
    left_out: tuple[str, ...] = ()


class ShadowRepo:
    """The shadow repository of one workspace (see the module's docstring).

    Args:
        root: Where the shadow repositories are (one folder a workspace).
        workspace: The workspace's folder.
        max_file_bytes: A larger file is left out of the tree.
        max_total_bytes: Past this in all, the largest files are left out until the rest fit.
        exclude: Folders of the worker's own (its store, its sinks, the shadows) left out where
            they are inside the workspace.
    """

    def __init__(
        self,
        root: Path,
        workspace: Path,
        *,
        max_file_bytes: int = 10 * 1024 * 1024,
        max_total_bytes: int = 1024 * 1024 * 1024,
        exclude: Sequence[Path] = (),
    ) -> None:
        self.workspace = workspace.resolve()
        self.git_dir = root.absolute() / hashlib.sha256(os.fsencode(self.workspace)).hexdigest()[:32]
        self.max_file_bytes = max_file_bytes
        self.max_total_bytes = max_total_bytes
        self.exclude = (root, *exclude)

    # --- git ------------------------------------------------------------------------------

    def git(self, *args: str, stdin: bytes | None = None) -> bytes:
        """Run git on the shadow and the workspace; its standard output.

        Raises:
            WorkspaceTreeError: git failed (its message), or is not installed.
        """
        env = {**os.environ, **_ENV, "GIT_DIR": str(self.git_dir), "GIT_WORK_TREE": str(self.workspace)}
        env.pop("GIT_INDEX_FILE", None)
        for attempt in range(40):
            try:
                done = subprocess.run(
                    ["git", *args], input=stdin, capture_output=True, env=env, cwd=self.workspace, check=False
                )
            except OSError as exc:
                raise WorkspaceTreeError(f"cannot run git: {exc}") from None
            if done.returncode == 0:
                return done.stdout
            message = done.stderr.decode("utf-8", "replace").strip()
            # another worker's process holds the index for a moment
            if "index.lock" not in message or attempt == 39:
                raise WorkspaceTreeError(f"git {args[0]} failed: {message}")
            time.sleep(0.05)
        raise AssertionError("unreachable")

    def prepare(self) -> None:
        """Make the workspace's folder and the shadow, where they are not yet (a rebuild)."""
        self.workspace.mkdir(parents=True, exist_ok=True)
        with _lock(self.git_dir):
            self._init()

    def _init(self) -> None:
        if (self.git_dir / "HEAD").exists():
            try:
                if (self.git_dir / _SETTINGS_FILE).read_text(encoding="ascii").strip() == _SETTINGS_KEY:
                    return
            except (OSError, UnicodeDecodeError):
                pass
        else:
            self.git_dir.mkdir(parents=True, exist_ok=True)
            self.git("init", "-q", "--template=")
        # appended to the config file, not a ``git config`` process each (8 of them, ~3 ms apiece):
        # of a key set twice git takes the last
        block = "".join(
            f"[{key.split('.')[0]}]\n\t{key.split('.')[1]} = {value}\n" for key, value in _SETTINGS
        )
        with open(self.git_dir / "config", "a", encoding="utf-8") as config:
            config.write(block)
        write_synced(self.git_dir / _SETTINGS_FILE, _SETTINGS_KEY.encode("ascii") + b"\n", sync=False)

    def _write_excludes(self) -> None:
        """The shadow's ``info/exclude``: the workspace's own, and the worker's folders in it."""
        lines: list[str] = []
        own = self.workspace / ".git" / "info" / "exclude"
        with contextlib.suppress(OSError):
            lines.append(own.read_text(encoding="utf-8", errors="replace"))
        for path in self.exclude:
            try:
                inside = path.absolute().resolve().relative_to(self.workspace)
            except ValueError:
                continue
            if inside.parts:
                lines.append("/" + inside.as_posix() + "/")
        text = "\n".join(lines) + "\n"
        target = self.git_dir / "info" / "exclude"
        try:
            if target.read_text(encoding="utf-8") == text:
                return
        except OSError:
            pass
        target.parent.mkdir(exist_ok=True)
        target.write_text(text, encoding="utf-8")

    # --- recording ------------------------------------------------------------------------

    def record(self) -> Recorded:
        """Record the workspace's files as they are now (see the module's docstring).

        Returns:
            The tree, and the files left out for their size.

        Raises:
            WorkspaceTreeError: The workspace is not a folder, or git failed.
        """
        if not self.workspace.is_dir():
            raise WorkspaceTreeError(f"workspace {str(self.workspace)!r} is not a folder")
        with _lock(self.git_dir):
            self._init()
            self._write_excludes()
            try:
                recorded = self._record_changes()
            except WorkspaceTreeError:
                recorded = None
            if recorded is None:
                # git refused a path, or HEAD does not read (a machine's crash): the whole way
                drop_head(self.git_dir)
                recorded = self._record_whole()
                set_head(self.git_dir, recorded.tree)
        return recorded

    def _record_changes(self) -> Recorded | None:
        """One ``git status``, then only the paths it lists (``workspaces/record.py``); None: it
        printed what it should not have, take the whole way."""
        changes = changes_of(self.git(*STATUS_ARGS))
        if changes is None:
            return None
        head = head_tree(self.git_dir)
        left_out = too_large(self.workspace, changes.paths, self.max_file_bytes, self.max_total_bytes)
        skip = {os.fsencode(name) for name in left_out}
        drop = changes.deleted + [p for p in changes.tracked if p in skip]
        gone = set(changes.deleted)
        add = [p.rstrip(b"/") for p in changes.paths if p not in skip and p not in gone]
        if drop:  # first: a file gone where a folder is now added, and the other way round
            self.git(
                "update-index", "--force-remove", "-z", "--stdin", stdin=b"".join(p + b"\0" for p in drop)
            )
        if add:
            self.git(
                "update-index", "--add", "--remove", "--replace", "-z", "--stdin",
                stdin=b"".join(p + b"\0" for p in add),
            )  # fmt: skip
        if head is not None and not (drop or add or changes.staged):
            return Recorded(head, tuple(left_out))  # the index is HEAD's tree: nothing to write
        tree = self.git("write-tree").decode().strip()
        if tree != head:
            set_head(self.git_dir, tree)
        return Recorded(tree, tuple(left_out))

    def _record_whole(self) -> Recorded:
        """``git add -A`` of every file, the files past the size bounds found first by
        ``git ls-files``: two scans of the workspace."""
        listed = self.git("ls-files", "-z", "--modified", "--others", "--exclude-standard")
        left_out = too_large(self.workspace, listed.split(b"\0"), self.max_file_bytes, self.max_total_bytes)
        if left_out:
            skip = b"".join(b":(exclude,literal)" + os.fsencode(p) + b"\0" for p in left_out)
            self.git("add", "-A", "--pathspec-from-file=-", "--pathspec-file-nul", stdin=b".\0" + skip)
            # not ``git rm --cached``, which refuses a file whose index entry is neither the file
            # nor HEAD's (a tracked file grown past the bound, in a shadow without HEAD)
            drop = b"".join(os.fsencode(p) + b"\0" for p in left_out)
            self.git("update-index", "--force-remove", "-z", "--stdin", stdin=drop)
        else:
            self.git("add", "-A")
        tree = self.git("write-tree").decode().strip()
        return Recorded(tree, tuple(left_out))

    def tree_bytes(self, tree: str) -> int:
        """The size of the files ``tree`` holds (its blobs, as files)."""
        listed = self.git("ls-tree", "-r", "-l", "-z", tree)
        total = 0
        for entry in listed.split(b"\0"):
            size = entry.split(b"\t", 1)[0].split()[-1:] if entry else []
            if size and size[0].isdigit():  # a submodule's entry has "-"
                total += int(size[0])
        return total

    def objects_since(self, tree: str, since: str | None) -> list[str]:
        """The ids of ``tree`` and of the objects under it, less those ``since`` holds at the same
        path: what a boundary may have to send (the sink is asked which it lacks).

        Read from the two trees' loose objects where they are (a record writes its trees loose:
        no process), else from ``git diff-tree``, which walks only the folders that differ
        (``rev-list --objects`` walked both trees whole: 24 ms against 6 on 10,000 files); without
        ``since``, or where the shadow lacks it, every object of ``tree``.
        """
        if since == tree:
            return []
        if since is not None:
            found = loose_objects_since(self.git_dir, tree, since)
            if found is not None:
                return found
            try:
                changed = self.git("diff-tree", "-r", "-t", "-z", "--no-renames", since, tree)
            except WorkspaceTreeError:  # ``since`` is not in this shadow (a fresh one)
                changed = None
            if changed is not None:
                found = [tree]
                # each change is ":<old mode> <new mode> <old id> <new id> <status>", then its path
                for head in changed.split(b"\0")[::2]:
                    if not head.startswith(b":"):
                        continue
                    _, mode, _, oid, _ = head[1:].split(b" ")
                    if mode not in (b"000000", b"160000"):  # removed; a submodule's commit
                        found.append(oid.decode())
                return found
        return [
            line.split(b" ", 1)[0].decode() for line in self.git("rev-list", "--objects", tree).splitlines()
        ]

    def has(self, ids: Sequence[str]) -> set[str]:
        """Those of ``ids`` the shadow holds."""
        if not ids:
            return set()
        out = self.git(
            "cat-file", "--batch-check=%(objectname) %(objecttype)", stdin="\n".join(ids).encode() + b"\n"
        )
        return {line.split(b" ")[0].decode() for line in out.splitlines() if not line.endswith(b" missing")}

    def read(self, ids: Sequence[str]) -> dict[str, tuple[str, bytes]]:
        """The objects of ``ids`` the shadow holds: (type, body)."""
        if not ids:
            return {}
        out = self.git("cat-file", "--batch", stdin="\n".join(ids).encode() + b"\n")
        found: dict[str, tuple[str, bytes]] = {}
        at = 0
        while at < len(out):
            end = out.index(b"\n", at)
            head = out[at:end].split(b" ")
            at = end + 1
            if len(head) != 3:  # "<id> missing"
                continue
            size = int(head[2])
            found[head[0].decode()] = (head[1].decode(), out[at : at + size])
            at += size + 1
        return found

    def loose(self, ids: Sequence[str]) -> dict[str, bytes]:
        """The objects of ``ids`` as loose objects, each checked against its id.

        Raises:
            WorkspaceTreeError: The shadow lacks one, or holds one damaged.
        """
        found: dict[str, bytes] = {}
        packed = []
        for oid in ids:
            try:
                found[oid] = (self.git_dir / "objects" / oid[:2] / oid[2:]).read_bytes()
            except FileNotFoundError:
                packed.append(oid)
        for oid, (kind, body) in self.read(packed).items():
            found[oid] = _loose(kind, body)
        for oid in ids:
            if oid not in found:
                raise WorkspaceTreeError(f"the shadow {self.git_dir} lacks object {oid}")
            if object_id(found[oid]) != oid:
                raise WorkspaceTreeError(f"object {oid} in the shadow {self.git_dir} is damaged")
        return found

    def add_objects(self, objects: Mapping[str, bytes]) -> None:
        """Keep loose objects (from a sink) in the shadow, each checked against its id first: many
        as one pack (``workspaces/packs.py``), a few as a file each.

        Raises:
            WorkspaceTreeError: One is not the object its id names, or git did not take the pack.
        """
        parts = {}
        for oid, data in objects.items():
            found, kind, body = _object_parts(data)
            if found != oid:
                raise WorkspaceTreeError(f"the object given as {oid} is not that object")
            parts[oid] = (kind, body)
        if len(parts) >= _PACK_MIN_OBJECTS:
            self.git("index-pack", "--stdin", stdin=pack_of(parts.values()))
            with _lock(self.git_dir):
                self._pack_count_bounded()
            return
        for oid, data in objects.items():
            path = self.git_dir / "objects" / oid[:2] / oid[2:]
            if not path.exists():  # a copy: the sink holds the object durably
                write_synced(path, data, 0o444, sync=False)

    def _pack_count_bounded(self) -> None:
        """One pack a restore: past ``_MOST_PACKS`` (a long-lived shadow, ``gc.auto`` off) they are
        made one, so that looking an object up does not search them all."""
        packs = list((self.git_dir / "objects" / "pack").glob("*.pack"))
        if len(packs) > _MOST_PACKS:
            self.git("repack", "-a", "-d", "-q")

    # --- pushing and rebuilding ----------------------------------------------------------

    def pushed_to(self, sink_name: str) -> str | None:
        """The last tree whose objects all went to ``sink_name`` from here."""
        try:
            return (self.git_dir / "pushed" / _key(sink_name)).read_text().strip() or None
        except OSError:
            return None

    def mark_pushed(self, sink_name: str, tree: str) -> None:
        # Not fsynced: after a machine's crash the mark is the tree before, or empty (none), and
        # the next boundary asks the sink about more objects; it never names a tree the sink
        # lacks, since ``put_objects`` returned first.
        write_synced(self.git_dir / "pushed" / _key(sink_name), tree.encode() + b"\n", sync=False)

    def checkout(self, tree: str) -> str:
        """Make the workspace's files those of ``tree``, whose objects the shadow holds: the files
        recorded now and not in it are removed; files never recorded (ignored, left out for their
        size) are left as they are.

        Returns:
            The tree the files made before (recorded first, so it stays in the shadow).
        """
        self.prepare()
        before = self.record().tree
        if before != tree:
            with _lock(self.git_dir):
                self.git("read-tree", "--reset", "-u", tree)
                set_head(self.git_dir, tree)  # the next record's ``status`` lists what differs from it
        return before

    def differences(self, was: str, now: str) -> list[str]:
        """The paths that differ from tree ``was`` (a checkpoint's) to ``now`` (the workspace's):
        ``path: changed``, ``path: missing`` (not in ``now``), ``path: not in the checkpoint``."""
        out = self.git("diff-tree", "-r", "--no-renames", "--name-status", "-z", was, now)
        fields = [os.fsdecode(f) for f in out.split(b"\0") if f]
        said = {"A": "not in the checkpoint", "D": "missing"}
        return [
            f"{path}: {said.get(s, 'changed')}" for s, path in zip(fields[::2], fields[1::2], strict=True)
        ]


def _key(name: str) -> str:
    return hashlib.sha256(name.encode("utf-8")).hexdigest()[:32]
