"""The search tools: ``glob`` and ``grep``, confined to the workspace.

Both walk the workspace themselves rather than through ``pathlib.glob`` (which
follows linked folders before Python 3.13): a walk never enters a linked
folder, since a link may lead outside the workspace or back into itself; it
skips links whose target is outside the workspace or missing; and it does not
search .git, .hg or .svn folders, whose contents are noise to a coding agent.

No input makes a search stall its worker. Patterns run on RE2 (linear in the
text, GIL released); grep refuses patterns that compile too large and matches
an overlong line in its first part only, so one match call takes under a
second. A walk visits at most ``WALK_MAX_ENTRIES`` entries, gives up after
``SEARCH_MAX_SECONDS``, reaches entries through their open folder (a deep tree
costs no more per entry than a flat one) and checks its stop flag between
entries and lines, so a cancelled search ends within a second.

Both only read, so a repeat (Temporal runs activities at least once)
changes nothing and answers from the files as they are then.
"""

from __future__ import annotations

import os
import re
import stat
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import re2

from durable_agent.activities.tools.base import ToolFailure, confine, is_inside
from durable_agent.activities.tools.fs import is_binary
from durable_agent.activities.tools.grep_lines import candidates, load, scanner
from durable_agent.activities.tools.path_guard import READ_DENIED
from durable_agent.core.globs import GlobError, compile_glob
from durable_agent.core.tool_args import (
    GLOB_MAX_RESULTS,
    GREP_LINE_BUDGET,
    GREP_MAX_FILE_BYTES,
    GREP_MAX_LINE_CHARS,
    GREP_MAX_MATCHES,
    SEARCH_MAX_SECONDS,
    WALK_MAX_ENTRIES,
    GlobArgs,
    GrepArgs,
    grep_regex,
)

VCS_FOLDERS = frozenset({".git", ".hg", ".svn"})
_MAGIC = re.compile(r"[*?\[{]")
# Opens a path for its identity only: the kernel resolves a link's whole chain in one call.
_O_PATH: int | None = getattr(os, "O_PATH", None)


def glob_regex(pattern: str) -> re2._Regexp[str]:
    """A glob as a regular expression over ``/``-separated relative paths.

    ``*`` and ``?`` do not cross ``/``, ``**`` does (``a/**/b`` also matches
    ``a/b``), ``[abc]`` / ``[!abc]`` are character classes and ``{x,y}`` are
    alternatives. ``*`` matches names starting with a dot, as the permission
    patterns do.
    """
    try:
        return compile_glob(pattern, extended=True)
    except GlobError as exc:
        raise ToolFailure(str(exc)) from None


@dataclass(frozen=True)
class Entry:
    """One entry a walk found."""

    path: str  # absolute
    relative: str  # to the folder walked, "/"-separated
    is_folder: bool
    name: str
    folder_fd: int  # the open folder it is in: valid only until the walk moves on


@dataclass
class Walk:
    """A bounded, stoppable walk below a folder of the workspace.

    It stops at ``WALK_MAX_ENTRIES`` entries (``cut``), after
    ``SEARCH_MAX_SECONDS`` (``timed_out``) and as soon as ``stop`` is set: the
    thread a search runs in cannot be interrupted, so it must look often.
    """

    root: Path  # the workspace, resolved
    stop: threading.Event
    visited: int = 0
    cut: bool = False  # stopped at WALK_MAX_ENTRIES
    timed_out: bool = False
    deadline: float = field(default_factory=lambda: time.monotonic() + SEARCH_MAX_SECONDS)

    def stopped(self) -> bool:
        """Whether to stop now: cancelled, or out of time."""
        if self.stop.is_set():
            return True
        if time.monotonic() > self.deadline:
            self.timed_out = True
        return self.timed_out

    def entries(self, base: Path, max_depth: int | None = None) -> Iterator[Entry]:
        """Everything under ``base``, folder by folder in name order.

        A link inside the workspace is listed with its target's kind but never
        entered; a link leading outside, or nowhere, is left out. Folders are
        opened one at a time and their entries reached through that open
        folder, so a deep tree costs no more per entry than a flat one.
        """
        stack: list[tuple[str, str, int]] = [(str(base), "", 1)]
        while stack:
            folder, relative, depth = stack.pop()
            try:
                # O_NOFOLLOW: a folder swapped for a link since it was listed is not entered.
                fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
            except OSError:
                continue  # unreadable, or removed meanwhile
            try:
                below: list[tuple[str, str, int]] = []
                for item in self._listing(fd):
                    if self.stopped():
                        return
                    name = item.name
                    path = os.path.join(folder, name)
                    inner = f"{relative}/{name}" if relative else name
                    try:
                        if item.is_symlink():
                            kind = self._link_kind(path)
                            if kind is not None:
                                yield Entry(path, inner, kind, name, fd)
                        elif item.is_dir(follow_symlinks=False):
                            yield Entry(path, inner, True, name, fd)
                            if name not in VCS_FOLDERS and (max_depth is None or depth < max_depth):
                                below.append((path, inner, depth + 1))
                        else:
                            yield Entry(path, inner, False, name, fd)
                    except OSError:
                        continue
            finally:
                os.close(fd)
            if self.cut or self.stopped():
                return
            stack.extend(reversed(below))

    def _listing(self, fd: int) -> list[os.DirEntry[str]]:
        """A folder's entries in name order, read no further than the walk may go.

        Counting while reading, not after, keeps a folder of millions of
        entries from being read (and sorted) whole before the bound applies.
        """
        items: list[os.DirEntry[str]] = []
        try:
            with os.scandir(fd) as listing:
                for item in listing:
                    if self.visited >= WALK_MAX_ENTRIES:
                        self.cut = True
                        break
                    if self.stopped():
                        break
                    self.visited += 1
                    items.append(item)
        except OSError:
            pass  # what was read before the error is listed
        items.sort(key=lambda e: e.name)
        return items

    def _link_kind(self, path: str) -> bool | None:
        """Whether the link at ``path`` leads to a folder inside the workspace; None: outside or nowhere."""
        if _O_PATH is None:  # not Linux: resolve in Python, one component at a time
            if not is_inside(self.root, Path(path)):
                return None
            return os.path.isdir(path)
        try:
            fd = os.open(path, _O_PATH)
        except OSError:
            return None  # dangling, a loop, or not ours to look at
        try:
            real = os.readlink(f"/proc/self/fd/{fd}")
            is_folder = stat.S_ISDIR(os.fstat(fd).st_mode)
        except OSError:
            return os.path.isdir(path) if is_inside(self.root, Path(path)) else None
        finally:
            os.close(fd)
        root = str(self.root)
        inside = real == root or real.startswith(root.rstrip("/") + "/")
        return is_folder if inside else None


def _cut_note(walk: Walk) -> list[str]:
    if walk.timed_out:
        return [f"[search stopped after {SEARCH_MAX_SECONDS} s; results are incomplete: narrow it down]"]
    if not walk.cut:
        return []
    return [f"[search stopped after {WALK_MAX_ENTRIES} entries; results are incomplete: narrow it down]"]


def glob(args: GlobArgs, workspace: Path, stop: threading.Event) -> str:
    """Paths in the workspace matching ``pattern``, relative to it, sorted, bounded.

    The pattern's leading plain folders (``src/app`` in ``src/app/**/*.py``)
    are confined like any path, then only that folder is walked, and no
    deeper than the pattern can reach without ``**``. Only reads, so a repeat
    changes nothing.
    """
    root = workspace.resolve()
    pattern = args.pattern
    folders_only = pattern.endswith("/") and len(pattern) > 1
    segments = pattern.rstrip("/").split("/") if len(pattern) > 1 else [pattern]
    plain = 0
    while plain < len(segments) and not _MAGIC.search(segments[plain]):
        plain += 1
    # An absolute pattern keeps its leading "/": confine then decides whether it is inside.
    base_text = "/".join(segments[:plain]) or ("/" if plain else ".")
    base = confine(workspace, base_text)
    if plain == len(segments):  # no wildcard: the pattern names one path
        if not os.path.lexists(base) or (folders_only and not base.is_dir()):
            return f"no paths match {pattern!r}"
        return _shown(root, base, base.is_dir())
    if not base.is_dir():
        return f"no paths match {pattern!r} (folder {base_text!r} does not exist)"
    rest = segments[plain:]
    regex = glob_regex("/".join(rest))
    walk = Walk(root, stop)
    depth = None if any("**" in s for s in rest) else len(rest)
    prefix = _prefix(root, base)
    found = sorted(
        prefix + entry.relative + ("/" if entry.is_folder else "")
        for entry in walk.entries(base, depth)
        if (entry.is_folder or not folders_only) and regex.fullmatch(entry.relative)
    )
    if not found:
        return "\n".join([f"no paths match {pattern!r}", *_cut_note(walk)])
    lines = found[:GLOB_MAX_RESULTS]
    if len(found) > GLOB_MAX_RESULTS:
        lines.append(f"[{len(found) - GLOB_MAX_RESULTS} more paths not shown; narrow the pattern]")
    return "\n".join([*lines, *_cut_note(walk)])


def _prefix(root: Path, base: Path) -> str:
    """What goes before a path relative to ``base`` to make it relative to ``root``."""
    return "" if base == root else base.relative_to(root).as_posix() + "/"


def _shown(root: Path, path: Path, is_folder: bool) -> str:
    relative = "." if path == root else path.relative_to(root).as_posix()
    return relative + "/" if is_folder and relative != "." else relative


def grep(args: GrepArgs, workspace: Path, stop: threading.Event) -> str:
    """Lines matching an RE2 regular expression, as ``file:line: text``, bounded.

    ``path`` is a folder to walk or one file; ``glob`` keeps files whose name
    (or, when it contains ``/``, whose workspace-relative path) matches. Only
    regular text files are read: binary files, files over
    ``GREP_MAX_FILE_BYTES``, pipes and devices are skipped. Stops at
    ``GREP_MAX_MATCHES``; lines are cut at ``GREP_MAX_LINE_CHARS``. RE2 takes
    time linear in the line, times the compiled pattern's size when its fast
    matcher gives up; so a line longer than ``GREP_LINE_BUDGET`` divided by that
    size is matched in its first part only, and the result says so. Only
    reads, so a repeat changes nothing.
    """
    root = workspace.resolve()
    start = confine(workspace, args.path)
    try:
        regex = grep_regex(args.pattern, case_insensitive=args.case_insensitive)
    except ValueError as exc:
        raise ToolFailure(str(exc)) from None
    match_chars = max(1, GREP_LINE_BUDGET // regex.programsize)
    scan = scanner(args.pattern, args.case_insensitive)
    name_filter = glob_regex(args.glob) if args.glob else None
    by_path = args.glob is not None and "/" in args.glob
    walk = Walk(root, stop)
    if start.is_dir():
        prefix = _prefix(root, start)
        files: Iterator[tuple[str, str, str, int | None]] = (
            (prefix + e.relative, e.name, e.name, e.folder_fd) for e in walk.entries(start) if not e.is_folder
        )
    elif start.exists():
        files = iter([(start.relative_to(root).as_posix(), start.name, str(start), None)])
    else:
        raise ToolFailure(f"path {args.path!r} does not exist")
    read_denied = READ_DENIED.get()
    matches: list[str] = []
    searched = binary = large = partial = 0
    full = False
    for relative, name, opened, dir_fd in files:
        if full or walk.stopped():
            break
        if name_filter and not name_filter.fullmatch(relative if by_path else name):
            continue
        if read_denied is not None and read_denied(relative):
            continue  # an explicit read deny rule covers it, as walked or through a link
        data = load(opened, dir_fd, GREP_MAX_FILE_BYTES)
        if data is None:
            continue
        if isinstance(data, int) or len(data) > GREP_MAX_FILE_BYTES:
            large += 1
            continue
        if is_binary(data):
            binary += 1
            continue
        searched += 1
        text = data.decode("utf-8", errors="replace")
        for number, line in candidates(text, regex, scan, walk.stopped, GREP_LINE_BUDGET):
            if len(line) > match_chars:
                partial += 1
            if regex.search(line if len(line) <= match_chars else line[:match_chars]):
                if len(matches) == GREP_MAX_MATCHES:
                    full = True
                    break
                line = line.rstrip("\r")
                if len(line) > GREP_MAX_LINE_CHARS:
                    line = line[:GREP_MAX_LINE_CHARS] + " [… line cut]"
                matches.append(f"{relative}:{number}: {line}")
    notes = []
    if full:
        notes.append(f"[stopped at {GREP_MAX_MATCHES} matches; narrow the pattern, path or glob]")
    skipped = [f"{binary} binary file(s)"] if binary else []
    skipped += [f"{large} file(s) over {GREP_MAX_FILE_BYTES} bytes"] if large else []
    if skipped:
        notes.append(f"[skipped {' and '.join(skipped)}]")
    if partial:
        notes.append(
            f"[{partial} line(s) longer than {match_chars} characters were searched in their first "
            f"{match_chars} characters only]"
        )
    notes += _cut_note(walk)
    if not matches:
        return "\n".join([f"no matches for {args.pattern!r} ({searched} file(s) searched)", *notes])
    return "\n".join([*matches, *notes])
