"""The search tools: ``glob`` and ``grep``, confined to the workspace.

Both walk the workspace themselves rather than through ``pathlib.glob`` (which
follows linked folders before Python 3.13): a walk never enters a linked
folder, since a link may lead outside the workspace or back into itself; it
skips links whose target is outside the workspace; and it does not search
.git, .hg or .svn folders, whose contents are noise to a coding agent. Each
walk visits at most ``WALK_MAX_ENTRIES`` entries and says so when it stops.

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

from activities.tools import ToolFailure, confine, is_inside
from activities.tools_fs import is_binary
from durable_agent.globs import GlobError, compile_glob
from durable_agent.tool_args import (
    GLOB_MAX_RESULTS,
    GREP_MAX_FILE_BYTES,
    GREP_MAX_LINE_CHARS,
    GREP_MAX_MATCHES,
    WALK_MAX_ENTRIES,
    GlobArgs,
    GrepArgs,
)

VCS_FOLDERS = frozenset({".git", ".hg", ".svn"})
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


@dataclass
class Walk:
    """A bounded, stoppable walk below a folder of the workspace."""

    root: Path  # the workspace, resolved
    stop: threading.Event
    visited: int = 0
    cut: bool = False  # stopped at WALK_MAX_ENTRIES

    def entries(self, base: Path, max_depth: int | None = None) -> Iterator[tuple[Path, bool]]:
        """``(path, is_folder)`` for everything under ``base``, folder by folder in name order.

        A link inside the workspace is listed with its target's kind but never
        entered; a link leading outside is left out.
        """
        stack: list[tuple[Path, int]] = [(base, 1)]
        while stack:
            folder, depth = stack.pop()
            try:
                with os.scandir(folder) as listing:
                    items = sorted(listing, key=lambda e: e.name)
            except OSError:
                continue  # unreadable, or removed meanwhile
            below: list[tuple[Path, int]] = []
            for entry in items:
                if self.stop.is_set():
                    return
                self.visited += 1
                if self.visited > WALK_MAX_ENTRIES:
                    self.cut = True
                    return
                path = Path(entry.path)
                try:
                    if entry.is_symlink():
                        if is_inside(self.root, path):
                            yield path, path.is_dir()
                    elif entry.is_dir(follow_symlinks=False):
                        yield path, True
                        if entry.name not in VCS_FOLDERS and (max_depth is None or depth < max_depth):
                            below.append((path, depth + 1))
                    else:
                        yield path, False
                except OSError:
                    continue
            stack.extend(reversed(below))


def _cut_note(walk: Walk) -> list[str]:
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
    found = sorted(
        _shown(root, path, is_folder)
        for path, is_folder in walk.entries(base, depth)
        if (is_folder or not folders_only) and regex.fullmatch(path.relative_to(base).as_posix())
    )
    if not found:
        return "\n".join([f"no paths match {pattern!r}", *_cut_note(walk)])
    lines = found[:GLOB_MAX_RESULTS]
    if len(found) > GLOB_MAX_RESULTS:
        lines.append(f"[{len(found) - GLOB_MAX_RESULTS} more paths not shown; narrow the pattern]")
    return "\n".join([*lines, *_cut_note(walk)])


def _shown(root: Path, path: Path, is_folder: bool) -> str:
    relative = "." if path == root else path.relative_to(root).as_posix()
    return relative + "/" if is_folder and relative != "." else relative


def grep(args: GrepArgs, workspace: Path, stop: threading.Event) -> str:
    """Lines matching a regular expression, as ``file:line: text``, bounded.

    ``path`` is a folder to walk or one file; ``glob`` keeps files whose name
    (or, when it contains ``/``, whose workspace-relative path) matches. Only
    regular text files are read: binary files, files over
    ``GREP_MAX_FILE_BYTES``, pipes and devices are skipped. Stops at
    ``GREP_MAX_MATCHES``; lines are cut at ``GREP_MAX_LINE_CHARS``. Only
    reads, so a repeat changes nothing.
    """
    root = workspace.resolve()
    start = confine(workspace, args.path)
    regex = re.compile(args.pattern, re.IGNORECASE if args.case_insensitive else 0)
    name_filter = glob_regex(args.glob) if args.glob else None
    by_path = args.glob is not None and "/" in args.glob
    walk = Walk(root, stop)
    if start.is_dir():
        files: Iterator[Path] | list[Path] = (p for p, is_folder in walk.entries(start) if not is_folder)
    elif start.exists():
        files = [start]
    else:
        raise ToolFailure(f"path {args.path!r} does not exist")
    matches: list[str] = []
    searched = binary = large = 0
    full = False
    for path in files:
        if stop.is_set() or full:
            break
        relative = path.relative_to(root).as_posix()
        if name_filter and not name_filter.fullmatch(relative if by_path else path.name):
            continue
        try:
            st = path.stat()
            if not stat.S_ISREG(st.st_mode):
                continue  # reading a pipe would block for ever
            if st.st_size > GREP_MAX_FILE_BYTES:
                large += 1
                continue
            data = path.read_bytes()
        except OSError:
            continue
        if is_binary(data):
            binary += 1
            continue
        searched += 1
        text = data.decode("utf-8", errors="replace")
        # Split on \n only, so line numbers agree with ``read``'s.
        lines = text.split("\n")
        if lines and lines[-1] == "":
            lines.pop()
        for number, line in enumerate(lines, start=1):
            if regex.search(line):
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
    notes += _cut_note(walk)
    if not matches:
        return "\n".join([f"no matches for {args.pattern!r} ({searched} file(s) searched)", *notes])
    return "\n".join([*matches, *notes])
