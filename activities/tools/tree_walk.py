"""The walk the search tools (``glob``, ``grep``) make below a folder of the workspace.

A walk never enters a linked folder, since a link may lead outside the workspace or back
into itself; it lists a link with the kind of what it leads to, reached from the workspace
one name at a time (``beneath.Beneath``), and leaves out links whose target is outside the
workspace or missing; it does not enter .git, .hg or .svn folders. Each folder below the
start is opened from the open folder above it with ``O_NOFOLLOW``, so a link flipped while
the walk runs cannot redirect it. It holds at most ``OPEN_FOLDERS`` folders open (those on its
way down); deeper, it opens the farthest up again, by name and without following links,
when it comes back to them. It visits at most ``WALK_MAX_ENTRIES`` entries, gives up after
``SEARCH_MAX_SECONDS`` and checks its stop flag between entries (``search.py`` tells why).
"""

from __future__ import annotations

import os
import stat
import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from durable_agent.activities.tools.beneath import Beneath, Walked
from durable_agent.activities.tools.tool import ToolFailure
from durable_agent.core.tool_args import SEARCH_MAX_SECONDS, WALK_MAX_ENTRIES

VCS_FOLDERS = frozenset({".git", ".hg", ".svn"})
# Folders a walk holds open at once: those on its way down. Deeper, the farthest up are closed,
# and opened again by name (never through a link) when the walk comes back to them.
OPEN_FOLDERS: Final = 32
_LIST = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC


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
        with Beneath(self.root) as space, reached(space, str(base)) as start:
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
        prefix = prefix_of(start.relative)
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
                    with reached(space, prefix + inner) as target:
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

    def cut_note(self) -> list[str]:
        """The note a search's result ends with when the walk stopped early: nothing, or why."""
        if self.timed_out:
            return [f"[search stopped after {SEARCH_MAX_SECONDS} s; results are incomplete: narrow it down]"]
        if not self.cut:
            return []
        return [f"[search stopped after {WALK_MAX_ENTRIES} entries; results are incomplete: narrow it down]"]


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
def reached(space: Beneath, path: str, *, start: bool = False) -> Iterator[Walked | None]:
    """``space.reach(path)``, or None where that fails.

    Args:
        space: The workspace, held open.
        path: The path, relative to the workspace.
        start: Whether it is where a search starts: then a path leading outside the workspace
            or looping is refused with a ``ToolFailure`` instead of being None.

    Returns:
        A context that gives what the path leads to, opened; None when a folder on its way is
        missing, a file, or closed to the worker, or (unless ``start``) when it leads outside
        the workspace or loops.
    """
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


def prefix_of(relative: str) -> str:
    """What goes before a path relative to a folder to make it relative to the workspace.

    Args:
        relative: The folder, relative to the workspace (``.``: the workspace itself).

    Returns:
        Nothing for the workspace, else the folder and a ``/``.
    """
    return "" if relative == "." else relative + "/"
