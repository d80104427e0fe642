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
pattern as reached with the call's rules (``path_guard.check_opened``). The
walk itself is ``tree_walk.Walk``.

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
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import re2

from durable_agent.activities.tools.beneath import Beneath, Walked, read_regular
from durable_agent.activities.tools.fs import is_binary
from durable_agent.activities.tools.grep_lines import candidates, scanner
from durable_agent.activities.tools.path_guard import READ_DENIED, check_opened
from durable_agent.activities.tools.tool import ToolFailure
from durable_agent.activities.tools.tree_walk import Walk, prefix_of, reached
from durable_agent.core.globs import GlobError, compile_glob
from durable_agent.core.tool_args import (
    GLOB_MAX_RESULTS,
    GREP_LINE_BUDGET,
    GREP_MAX_FILE_BYTES,
    GREP_MAX_LINE_CHARS,
    GREP_MAX_MATCHES,
    GlobArgs,
    GrepArgs,
    grep_regex,
)

_MAGIC = re.compile(r"[*?\[{]")


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
    with _space(workspace) as space, reached(space, base_text, start=True) as base:
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
        prefix = prefix_of(base.relative)
        found = sorted(
            prefix + entry.relative + ("/" if entry.is_folder else "")
            for entry in walk.below(space, base, depth)
            if (entry.is_folder or not folders_only) and regex.fullmatch(entry.relative)
        )
    if not found:
        return "\n".join([f"no paths match {pattern!r}", *walk.cut_note()])
    lines = found[:GLOB_MAX_RESULTS]
    if len(found) > GLOB_MAX_RESULTS:
        lines.append(f"[{len(found) - GLOB_MAX_RESULTS} more paths not shown; narrow the pattern]")
    return "\n".join([*lines, *walk.cut_note()])


def _space(workspace: Path) -> Beneath:
    """The workspace held open for a search; a ``ToolFailure`` when it cannot be opened."""
    try:
        return Beneath(workspace)
    except OSError as exc:
        raise ToolFailure(f"the workspace cannot be opened: {exc.strerror or exc}") from None


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
    prefix = prefix_of(start.relative)
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
    with _space(workspace) as space, reached(space, args.path, start=True) as start:
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
    notes += walk.cut_note()
    if not matches:
        return "\n".join([f"no matches for {args.pattern!r} ({searched} file(s) searched)", *notes])
    return "\n".join([*matches, *notes])
