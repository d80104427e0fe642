"""The search tools: ``glob`` and ``grep``, confined to the workspace.

Both walk the workspace themselves rather than through ``pathlib.glob`` (which
follows linked folders before Python 3.13): a walk never enters a linked
folder, since a link may lead outside the workspace or back into itself; it
skips links whose target is outside the workspace or missing; and it does not
search .git, .hg or .svn folders, whose contents are noise to a coding agent.

No name is opened through a link the kernel follows, so a link flipped while a
search runs cannot redirect it: the start folder (or file) is reached from the
workspace's descriptor one name at a time (``beneath.Beneath``), each folder
below it is opened from the open folder above it with ``O_NOFOLLOW``, each file
from the folder it was found in with ``O_NOFOLLOW``, and a link is followed only
by reading it and reaching its target the same way. What is opened is then
judged: ``grep`` reads a file only when no explicit ``read`` deny rule covers the
path it was found at nor the path it was opened at, and ``glob`` judges its
pattern as reached with the call's rules (``path_guard.check_opened``). A walk
holds at most ``OPEN_FOLDERS`` folders open (those on its way down); deeper,
it opens the farthest up again, by name and without following links, when it
comes back to them.

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
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

import re2

from durable_agent.activities.tools.beneath import Beneath, Walked, read_regular
from durable_agent.activities.tools.fs import is_binary
from durable_agent.activities.tools.grep_lines import candidates, scanner
from durable_agent.activities.tools.path_guard import READ_DENIED, check_opened
from durable_agent.activities.tools.tool import ToolFailure
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
# Folders a walk holds open at once: those on its way down. Deeper, the farthest up are closed,
# and opened again by name (never through a link) when the walk comes back to them.
OPEN_FOLDERS: Final = 32
_MAGIC = re.compile(r"[*?\[{]")
_LIST = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC


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

    relative: str  # to the folder walked, "/"-separated
    is_folder: bool  # for a link: whether it leads to a folder
    name: str
    folder_fd: int  # the open folder it is in: valid only until the walk moves on
    regular: bool = False  # a regular file (for a link: it leads to one), as the walk saw it
    target: Walked | None = None  # a link: what it leads to, opened; valid until the walk moves on


@dataclass
class _Frame:
    """A folder on the walk's way down: where it is, and the subfolders of it left to walk."""

    name: str  # in the folder above ("" for the folder walked)
    relative: str  # to the folder walked
    depth: int
    fd: int | None  # None: closed to bound the descriptors held; opened again by name if needed
    below: list[str] | None = None  # subfolders left to walk, the next last; None until listed


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
        """Everything under the folder ``base`` of the workspace (see ``below``); nothing when
        it is not a folder."""
        with Beneath(self.root) as space, _reached(space, str(base)) as start:
            if start is not None and start.is_folder():
                yield from self.below(space, start, max_depth)

    def below(self, space: Beneath, start: Walked, max_depth: int | None = None) -> Iterator[Entry]:
        """Everything under the folder ``start`` (reached in ``space``), folder by folder in
        name order.

        Each folder is opened from the open folder above it, without following a link, and
        its entries reached through it: what the walk lists is what lies at the path it
        walked, whatever links change meanwhile, and a deep tree costs no more per entry than
        a flat one. A link is listed with the kind of what it leads to, reached from the
        workspace as the tools reach a path (``Beneath.reach``), but never entered; a link
        leading outside the workspace, or nowhere, is left out.
        """
        try:
            top = os.open(".", _LIST, dir_fd=start.fd)
        except OSError:
            return  # unreadable, or removed meanwhile
        frames = [_Frame("", "", 1, top)]
        prefix = _prefix(start.relative)
        try:
            while frames:
                frame = frames[-1]
                if frame.below is None:
                    frame.below = []
                    yield from self._listed(space, frame, prefix, max_depth)
                    if self.cut or self.stopped():
                        return
                    frame.below.reverse()
                    continue
                if not frame.below:
                    frames.pop()
                    if frame.fd is not None:
                        os.close(frame.fd)
                    continue
                name = frame.below.pop()
                folder = frame.fd if frame.fd is not None else _reopened(frames, start)
                if folder is None:  # the way back to it changed: its other subfolders are not walked
                    frame.below.clear()
                    continue
                try:
                    # O_NOFOLLOW: a folder swapped for a link since it was listed is not entered.
                    fd = os.open(name, _LIST | os.O_NOFOLLOW, dir_fd=folder)
                except OSError:
                    continue  # unreadable, removed meanwhile, or a link now
                frames.append(_Frame(name, _joined(frame.relative, name), frame.depth + 1, fd))
                farthest = frames[-1 - OPEN_FOLDERS] if len(frames) > OPEN_FOLDERS else None
                if farthest is not None and farthest.fd is not None:
                    os.close(farthest.fd)
                    farthest.fd = None
        finally:
            for frame in frames:
                if frame.fd is not None:
                    os.close(frame.fd)

    def _listed(self, space: Beneath, frame: _Frame, prefix: str, max_depth: int | None) -> Iterator[Entry]:
        """The entries of the open folder ``frame``, in name order; its subfolders to walk go to
        ``frame.below``."""
        assert frame.fd is not None and frame.below is not None
        for item in self._listing(frame.fd):
            if self.stopped():
                return
            name = item.name
            inner = _joined(frame.relative, name)
            try:
                if item.is_symlink():
                    with _reached(space, prefix + inner) as target:
                        if target is not None and target.fd is not None:
                            mode = os.fstat(target.fd).st_mode
                            yield Entry(inner, stat.S_ISDIR(mode), name, frame.fd, stat.S_ISREG(mode), target)
                elif item.is_dir(follow_symlinks=False):
                    yield Entry(inner, True, name, frame.fd)
                    if name not in VCS_FOLDERS and (max_depth is None or frame.depth < max_depth):
                        frame.below.append(name)
                else:
                    yield Entry(inner, False, name, frame.fd, item.is_file(follow_symlinks=False))
            except OSError:
                continue

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


def _reopened(frames: list[_Frame], start: Walked) -> int | None:
    """The last frame's folder, opened again one name at a time from the folder walked (no link
    followed), and the ``OPEN_FOLDERS`` folders above it kept open on the way; None when
    something on the way is no longer a folder."""
    keep = len(frames) - OPEN_FOLDERS
    here, passing = start.fd, None  # ``passing``: a folder on the way that no frame keeps
    try:
        for i, frame in enumerate(frames):
            if frame.fd is not None:
                here = frame.fd
                continue
            flags = _LIST | os.O_NOFOLLOW if frame.name else _LIST
            opened = os.open(frame.name or ".", flags, dir_fd=here)
            if passing is not None:
                os.close(passing)
                passing = None
            if i >= keep:
                frame.fd = opened
            else:
                passing = opened
            here = opened
    except OSError:
        return None
    finally:
        if passing is not None:
            os.close(passing)
    return frames[-1].fd


@contextmanager
def _reached(space: Beneath, path: str, *, start: bool = False) -> Iterator[Walked | None]:
    """``space.reach(path)``; None when a folder on its way is missing, a file, or closed to the
    worker, or (unless it is where a search ``start``s, which is refused with a ``ToolFailure``)
    when it leads outside the workspace or loops."""
    with ExitStack() as held:
        try:
            at: Walked | None = held.enter_context(space.reach(path))
        except OSError:
            at = None
        except ToolFailure:
            if start:
                raise
            at = None
        yield at


def _joined(folder: str, name: str) -> str:
    return f"{folder}/{name}" if folder else name


def _cut_note(walk: Walk) -> list[str]:
    if walk.timed_out:
        return [f"[search stopped after {SEARCH_MAX_SECONDS} s; results are incomplete: narrow it down]"]
    if not walk.cut:
        return []
    return [f"[search stopped after {WALK_MAX_ENTRIES} entries; results are incomplete: narrow it down]"]


def glob(args: GlobArgs, workspace: Path, stop: threading.Event) -> str:
    """Paths in the workspace matching ``pattern``, relative to it, sorted, bounded.

    The pattern's leading plain folders (``src/app`` in ``src/app/**/*.py``)
    are reached like any path (``Beneath.reach``: never out of the workspace) and the
    pattern as reached is judged by the call's rules (``check_opened``), then only that
    folder is walked, and no deeper than the pattern can reach without ``**``. Only
    reads, so a repeat changes nothing.
    """
    pattern = args.pattern
    folders_only = pattern.endswith("/") and len(pattern) > 1
    segments = pattern.rstrip("/").split("/") if len(pattern) > 1 else [pattern]
    plain = 0
    while plain < len(segments) and not _MAGIC.search(segments[plain]):
        plain += 1
    # An absolute pattern keeps its leading "/": reaching it decides whether it is inside.
    base_text = "/".join(segments[:plain]) or ("/" if plain else ".")
    rest = segments[plain:]
    with _space(workspace) as space, _reached(space, base_text, start=True) as base:
        if base is not None and base.fd is not None:
            check_opened("/".join([*([] if base.relative == "." else [base.relative]), *rest]) or ".")
        if plain == len(segments):  # no wildcard: the pattern names one path
            if base is None or base.fd is None or (folders_only and not base.is_folder()):
                return f"no paths match {pattern!r}"
            return _shown(base.relative, base.is_folder())
        if base is None or not base.is_folder():
            return f"no paths match {pattern!r} (folder {base_text!r} does not exist)"
        regex = glob_regex("/".join(rest))
        walk = Walk(space.root, stop)
        depth = None if any("**" in s for s in rest) else len(rest)
        prefix = _prefix(base.relative)
        found = sorted(
            prefix + entry.relative + ("/" if entry.is_folder else "")
            for entry in walk.below(space, base, depth)
            if (entry.is_folder or not folders_only) and regex.fullmatch(entry.relative)
        )
    if not found:
        return "\n".join([f"no paths match {pattern!r}", *_cut_note(walk)])
    lines = found[:GLOB_MAX_RESULTS]
    if len(found) > GLOB_MAX_RESULTS:
        lines.append(f"[{len(found) - GLOB_MAX_RESULTS} more paths not shown; narrow the pattern]")
    return "\n".join([*lines, *_cut_note(walk)])


def _space(workspace: Path) -> Beneath:
    """The workspace held open for a search; a ``ToolFailure`` when it cannot be opened."""
    try:
        return Beneath(workspace)
    except OSError as exc:
        raise ToolFailure(f"the workspace cannot be opened: {exc.strerror or exc}") from None


def _prefix(relative: str) -> str:
    """What goes before a path relative to the folder at ``relative`` to make it relative to the workspace."""
    return "" if relative == "." else relative + "/"


def _shown(relative: str, is_folder: bool) -> str:
    return relative + "/" if is_folder and relative != "." else relative


@dataclass(frozen=True)
class _File:
    """A file grep may read: as shown, as its name, where it is opened, and what it leads to."""

    relative: str  # to the workspace, as walked (a link's own path)
    name: str
    folder: int  # the open folder holding what is read
    opened: str  # the name in ``folder`` that is read
    regular: bool
    resolved: str | None = None  # a link: the path, workspace-relative, of what it leads to


def _files(walk: Walk, space: Beneath, start: Walked) -> Iterator[_File]:
    """The files grep may read, starting at ``start``: itself, or those below it."""
    if not start.is_folder():
        regular = stat.S_ISREG(os.fstat(start.fd).st_mode) if start.fd is not None else False
        yield _File(start.relative, start.name, start.folder, start.name, regular)
        return
    prefix = _prefix(start.relative)
    for e in walk.below(space, start):
        if e.is_folder:
            continue
        if e.target is None:
            yield _File(prefix + e.relative, e.name, e.folder_fd, e.name, e.regular)
        else:
            target = e.target
            yield _File(prefix + e.relative, e.name, target.folder, target.name, e.regular, target.relative)


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

    Every file is opened from the open folder it was found in, without following a
    link (a link is reached from the workspace, ``Beneath.reach``), and judged by the
    path it was opened at: a link flipped meanwhile never makes it read a file outside
    the workspace, nor one an explicit ``read`` deny rule covers.
    """
    with _space(workspace) as space, _reached(space, args.path, start=True) as start:
        return _grep(args, space, start, stop)


def _grep(args: GrepArgs, space: Beneath, start: Walked | None, stop: threading.Event) -> str:
    try:
        regex = grep_regex(args.pattern, case_insensitive=args.case_insensitive)
    except ValueError as exc:
        raise ToolFailure(str(exc)) from None
    match_chars = max(1, GREP_LINE_BUDGET // regex.programsize)
    scan = scanner(args.pattern, args.case_insensitive)
    name_filter = glob_regex(args.glob) if args.glob else None
    by_path = args.glob is not None and "/" in args.glob
    walk = Walk(space.root, stop)
    if start is None or start.fd is None:
        raise ToolFailure(f"path {args.path!r} does not exist")
    read_denied = READ_DENIED.get()
    matches: list[str] = []
    searched = binary = large = partial = 0
    full = False
    for file in _files(walk, space, start):
        if full or walk.stopped():
            break
        relative = file.relative
        if name_filter and not name_filter.fullmatch(relative if by_path else file.name):
            continue
        if read_denied is not None and (
            read_denied(relative) or (file.resolved is not None and read_denied(file.resolved))
        ):
            continue  # an explicit read deny rule covers it, as walked or where its link leads
        if not file.regular:
            continue
        data = read_regular(file.folder, file.opened, GREP_MAX_FILE_BYTES)
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
