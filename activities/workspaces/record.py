"""A workspace's files recorded in its shadow repository's index with one scan of them
(``ShadowRepo.record``, ``activities/workspaces/shadow.py``).

``git add -A`` alone walks every folder and ``lstat``s every file, and the files past the size
bounds had to be found first by ``git ls-files --modified --others``, a second walk: two scans
of ~45 ms each on a 10,000-file workspace (docs/costs.md). Here one ``git status`` finds what
changed, and only those paths are added:

- the shadow's ``HEAD`` is a commit of the last tree recorded (written here, not by git: no
  process), so ``status`` compares the index with it through its cache tree, not file by file,
  and lists only what differs;
- its untracked cache (``core.untrackedCache``, kept for ``--untracked-files=all`` by
  ``status.showUntrackedFiles=all``) reads again only the folders whose stat data changed;
- the paths it lists are given to ``git update-index`` (literal paths, never pathspecs): those
  it found deleted removed first (``--force-remove``: a path now beyond a symbolic link is one,
  which ``--remove`` refuses), then the rest added or removed as git finds them, less the files
  past the size bounds; the index then holds what ``git add -A`` gives (``status`` and ``add``
  judge a file changed by the same stat data and the same ignore rules), which
  ``tests/test_workspace_record_paths.py`` checks case by case against a plain ``git add -A``;
- anything else (a line it does not expect, git refusing a path) takes the whole way, as before:
  ``git ls-files --modified --others`` for the size bounds, then ``git add -A``.

What remains is ``status``'s ``lstat`` of every file the index holds, which git needs to see a
change without a file watcher (git 2.39 has no ``fsmonitor`` daemon on Linux).
"""

from __future__ import annotations

import hashlib
import os
import stat
import zlib
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from durable_agent.activities.files import write_synced

__all__ = [
    "STATUS_ARGS",
    "Changes",
    "changes_of",
    "drop_head",
    "head_tree",
    "loose_objects_since",
    "set_head",
    "too_large",
]

STATUS_ARGS = (
    "status",
    "--porcelain=v2",
    "-z",
    "--untracked-files=all",
    # a nested repository counts by its commit, as ``git add`` records it; not by its own files
    "--ignore-submodules=dirty",
    "--no-renames",
)
# The shadow's HEAD commit only names the tree for ``status``: fixed names and time, so the same
# tree gives the same commit.
_COMMIT = "tree {tree}\nauthor durable-agent <durable-agent@localhost> 0 +0000\n" + (
    "committer durable-agent <durable-agent@localhost> 0 +0000\n\nworkspace recorded\n"
)


@dataclass
class Changes:
    """What ``git status`` said differs.

    Attributes:
        paths: Paths whose files differ from the index (changed, deleted, a nested repository's
            new commit) or that it lacks (untracked, not ignored), as git names them (bytes; a
            nested repository's ends with ``/``).
        tracked: Those of ``paths`` the index holds.
        deleted: Those of ``tracked`` whose file is gone (or is now a folder, or beyond a link).
        staged: The index differs from HEAD (HEAD is not the last tree recorded: a record cut
            short, a checkout, a shadow without HEAD): the tree must be written again.
    """

    paths: list[bytes] = field(default_factory=list)
    tracked: set[bytes] = field(default_factory=set)
    deleted: list[bytes] = field(default_factory=list)
    staged: bool = False


def changes_of(out: bytes) -> Changes | None:
    """What ``git status`` (``STATUS_ARGS``) printed, read.

    Args:
        out: Its standard output.

    Returns:
        The changes, or None: a line it does not expect (the caller records the whole way).
    """
    found = Changes()
    for entry in out.split(b"\0"):
        if not entry:
            continue
        if entry.startswith(b"? "):
            found.paths.append(entry[2:])
        elif entry.startswith(b"1 "):
            # "1 <XY> <sub> <mH> <mI> <mW> <hH> <hI> <path>": X the index against HEAD, Y the file
            # against the index
            parts = entry.split(b" ", 8)
            if len(parts) != 9 or len(parts[1]) != 2:
                return None
            if parts[1][:1] != b".":
                found.staged = True
            if parts[1][1:] != b".":
                found.paths.append(parts[8])
                found.tracked.add(parts[8])
                if parts[1][1:] == b"D":
                    found.deleted.append(parts[8])
        else:  # a rename ("2"), an unmerged entry ("u"): not in a shadow's index
            return None
    return found


def too_large(
    workspace: Path, paths: Iterable[bytes], max_file_bytes: int, max_total_bytes: int
) -> list[str]:
    """The files past the size bounds, in name order: of ``paths`` (new or changed since the last
    record; those left out before are new again), the larger than ``max_file_bytes``, and the
    largest of the rest while together they pass ``max_total_bytes``.

    Args:
        workspace: The workspace's folder.
        paths: Paths in it, as git names them (a nested repository's ends with ``/``).
        max_file_bytes: A larger file is left out.
        max_total_bytes: Past this in all, the largest files are left out until the rest fit.

    Returns:
        Their names (``os.fsdecode``), sorted.
    """
    sizes: dict[str, int] = {}
    base = os.fsencode(workspace)
    for raw in paths:
        if not raw or raw.endswith(b"/"):  # a nested repository, listed as a folder
            continue
        try:
            st = os.lstat(os.path.join(base, raw))
        except OSError:
            continue  # deleted: dropped from the index by ``add -A``
        if stat.S_ISREG(st.st_mode):
            sizes[os.fsdecode(raw)] = st.st_size
    out = {name for name, size in sizes.items() if size > max_file_bytes}
    total = sum(size for name, size in sizes.items() if name not in out)
    for name, size in sorted(sizes.items(), key=lambda item: (-item[1], item[0])):
        if total <= max_total_bytes:
            break
        if name not in out:
            out.add(name)
            total -= size
    return sorted(out)


def head_tree(git_dir: Path) -> str | None:
    """The tree of the shadow's HEAD (the last tree recorded), read from the loose commit
    ``set_head`` wrote (no process); None: no HEAD commit, or not a loose one (``repack`` took
    it: the caller writes the tree, and HEAD again).
    """
    try:
        head = (git_dir / "HEAD").read_bytes().strip()
        if len(head) != 40 or head.startswith(b"ref:"):
            return None  # unborn: a fresh shadow, or one recorded before HEAD was kept
        oid = head.decode("ascii")
        raw = zlib.decompress((git_dir / "objects" / oid[:2] / oid[2:]).read_bytes())
    except (OSError, UnicodeDecodeError, zlib.error):
        return None
    head_line, _, body = raw.partition(b"\0")
    if not head_line.startswith(b"commit ") or not body.startswith(b"tree ") or body[45:46] != b"\n":
        return None
    return body[5:45].decode("ascii", "replace")


def set_head(git_dir: Path, tree: str) -> None:
    """Make the shadow's HEAD a commit of ``tree`` (detached: the shadow has no branches).

    Neither file is fsynced, as git's own loose objects are not: after a machine's crash a HEAD
    that does not read is dropped and the record takes the whole way (``ShadowRepo.record``),
    then comes here, where a commit file that does not read is written again.
    """
    body = _COMMIT.format(tree=tree).encode("ascii")
    raw = b"commit %d\0" % len(body) + body
    oid = hashlib.sha1(raw).hexdigest()
    path = git_dir / "objects" / oid[:2] / oid[2:]
    try:
        held = zlib.decompress(path.read_bytes()) == raw
    except (OSError, zlib.error):
        held = False
    if not held:  # missing, or left damaged by a crash: written again
        write_synced(path, zlib.compress(raw, 1), 0o444, sync=False)
    write_synced(git_dir / "HEAD", oid.encode("ascii") + b"\n", sync=False)


def drop_head(git_dir: Path) -> None:
    """Make the shadow's HEAD unborn again (one git could not read)."""
    write_synced(git_dir / "HEAD", b"ref: refs/heads/master\n", sync=False)


def loose_objects_since(git_dir: Path, tree: str, since: str) -> list[str] | None:
    """What ``git diff-tree -r -t`` of ``since`` and ``tree`` names, read in this process from the
    loose objects (those a record just wrote are): ``tree``, then each subtree and file whose id
    or mode differs from ``since``'s at its path, all of a folder new there, no submodule's
    commit (``ShadowRepo.objects_since``, without a process). None: an object is packed.

    Args:
        git_dir: The shadow.
        tree: The tree recorded.
        since: The tree sent before.

    Returns:
        The ids, or None.
    """
    found = [tree]

    def walk(old: str | None, new: str) -> bool:
        new_entries = _loose_tree(git_dir, new)
        old_entries = {} if old is None else _loose_tree(git_dir, old)
        if new_entries is None or old_entries is None:
            return False
        for name, (mode, oid) in new_entries.items():
            was = old_entries.get(name)
            if was == (mode, oid) or mode == b"160000":
                continue
            found.append(oid)
            if mode == b"40000" and not walk(was[1] if was and was[0] == b"40000" else None, oid):
                return False
        return True

    return found if walk(since, tree) else None


def _loose_tree(git_dir: Path, oid: str) -> dict[bytes, tuple[bytes, str]] | None:
    """A loose tree object's entries (name -> mode, id); None: not a loose tree."""
    try:
        raw = zlib.decompress((git_dir / "objects" / oid[:2] / oid[2:]).read_bytes())
    except (OSError, zlib.error):
        return None
    head, _, body = raw.partition(b"\0")
    if not head.startswith(b"tree "):
        return None
    out, at = {}, 0
    while at < len(body):
        space = body.index(b" ", at)
        nul = body.index(b"\0", space)
        out[body[space + 1 : nul]] = (body[at:space], body[nul + 1 : nul + 21].hex())
        at = nul + 21
    return out
