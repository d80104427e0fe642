"""A path opened inside the workspace one name at a time, never through a link the kernel follows.

``confine`` resolves a path and the tool then opens it by name: between the two, a
link inside the workspace can be pointed elsewhere (``notes.txt -> .env``, ``out ->
.git/hooks``), and the open follows it. ``walk`` closes that gap: from a descriptor
of the workspace, it opens each name of the path with ``O_NOFOLLOW``, relative to
the folder opened before it. A link is read (``readlinkat`` on the link itself) and
its target walked the same way, so what is opened is exactly the path walked, and
no later change of a link can make it another file. The walk then judges the path
it opened (``path_guard.check_opened``: the run's rules, as the tool activity set
them) before the tool reads or writes a byte.

Linux's ``O_PATH`` opens a folder on the way without needing to read it; elsewhere
the walk opens folders for reading.

The searches (``glob``, ``grep``) reach many paths in one call: ``Beneath`` holds the
workspace open for them and reaches each path as ``walk`` does, without judging it (the
search judges what each leads to), and ``read_regular`` reads a file found in a folder the
search holds open, never through a link.
"""

from __future__ import annotations

import contextlib
import errno
import os
import posixpath
import secrets
import stat
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from durable_agent.activities.tools.path_guard import check_opened
from durable_agent.activities.tools.tool import ToolFailure

# As the kernel allows (Linux: 40 links in one lookup); a loop ends here.
MAX_LINKS: Final = 40
# A name that changes kind while it is opened (a file swapped for a link, again and again) is
# walked again at most this many times before the call fails: someone is racing the tool.
MAX_RETRIES: Final = 100

_HANDLE = getattr(os, "O_PATH", os.O_RDONLY)  # a folder on the way: Linux needs no read permission
_NOFOLLOW = os.O_NOFOLLOW | os.O_CLOEXEC
_READ = os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | _NOFOLLOW  # a pipe never blocks, a tty never adopts
# The last name of a path a search reaches: Linux opens it for its identity and kind only (no
# device or pipe opened for reading, no read permission needed); elsewhere it is opened to read.
_PEEK = _HANDLE | _NOFOLLOW if hasattr(os, "O_PATH") else _READ


@dataclass
class Walked:
    """What ``walk`` opened: ``fd`` (read-only; ``None`` when the last name does not exist),
    the folder that holds it (``folder``, a descriptor; ``name`` in it) and its path,
    workspace-relative, links resolved (``relative``, ``"."`` for the workspace)."""

    folder: int
    name: str
    fd: int | None
    relative: str

    def is_folder(self) -> bool:
        return self.fd is not None and stat.S_ISDIR(os.fstat(self.fd).st_mode)

    def create(self, data: bytes) -> bool:
        """Create ``name`` in the walked folder with ``data``; ``False`` if it appeared meanwhile."""
        try:
            # O_EXCL|O_NOFOLLOW, in the walked folder: never through a link planted since the walk.
            fd = os.open(
                self.name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW, 0o666, dir_fd=self.folder
            )
        except FileExistsError:
            return False
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        self.sync_folder()
        return True

    def replace(self, data: bytes, mode: int) -> None:
        """Replace ``name`` with ``data`` atomically (a temporary file in the same folder, renamed
        over it), each step relative to the walked folder's descriptor: a reader sees the old
        file or the new one, and no link changed meanwhile redirects the write."""
        tmp = f".{self.name[:200]}.{secrets.token_hex(6)}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW, 0o600, dir_fd=self.folder)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
                f.flush()
                os.fchmod(f.fileno(), mode)
                os.fsync(f.fileno())
            os.replace(tmp, self.name, src_dir_fd=self.folder, dst_dir_fd=self.folder)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp, dir_fd=self.folder)
            raise
        self.sync_folder()

    def sync_folder(self) -> None:
        """fsync the folder holding ``name`` (after a rename in it)."""
        fd = os.open(".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=self.folder)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


@contextmanager
def walk(workspace: Path, path: str, *, make_folders: bool = False) -> Iterator[Walked]:
    """Open ``path`` inside ``workspace`` without following links by name; judge what was
    opened; yield it (its descriptors are closed when the block ends).

    Args:
        workspace: the run's workspace (itself resolved once: it is the host's, not the model's).
        path: the path as the model gave it, relative or absolute.
        make_folders: create missing folders on the way (``write``), each judged first.

    Returns:
        The ``Walked`` path. ``ToolFailure`` when it leaves the workspace, loops or is refused by
        the run's rules; ``FileNotFoundError``, ``NotADirectoryError`` or ``PermissionError``
        when a folder on the way is missing, a file, or closed to the worker.
    """
    if "\0" in path:
        raise ToolFailure(f"path {path!r} cannot be resolved: it holds a NUL character")
    walker = _Walker(workspace, path)
    try:
        walked = walker.run(make_folders)
        check_opened(walked.relative)
        yield walked
    finally:
        walker.close()


class Beneath:
    """The workspace held open while a search reaches many paths in it.

    ``reach`` opens each path as ``walk`` does (one name at a time from the workspace's
    descriptor, no link followed by the kernel, none out of the workspace) but does not
    judge it: a search judges what each path leads to by its own rules. Close it (or use it
    as a context manager) when the search ends.
    """

    def __init__(self, workspace: Path) -> None:
        self.root = workspace.resolve()
        # an absolute path may name the workspace as configured or as resolved
        self.bases = {str(self.root), posixpath.normpath(os.path.abspath(workspace))}
        self.fd = os.open(self.root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)

    def close(self) -> None:
        os.close(self.fd)

    def __enter__(self) -> Beneath:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    @contextmanager
    def reach(self, path: str) -> Iterator[Walked]:
        """Open ``path`` (relative to the workspace, or absolute inside it) as ``walk`` does, its
        last name for its identity and kind only where Linux allows (``O_PATH``); not judged.

        Returns:
            The ``Walked`` path, whose descriptors are closed when the block ends; ``fd`` is
            ``None`` when the last name does not exist. Raises as ``walk`` does.
        """
        if "\0" in path:
            raise ToolFailure(f"path {path!r} cannot be resolved: it holds a NUL character")
        walker = _Walker(self.root, path, held=(self.bases, self.fd), last=_PEEK)
        try:
            yield walker.run(False)
        finally:
            walker.close()


def read_regular(folder: int, name: str, max_bytes: int) -> bytes | int | None:
    """The regular file ``name`` in the open ``folder``, opened without following a link: its
    first ``max_bytes + 1`` bytes, its size when it is larger than ``max_bytes``, or ``None`` when
    it is anything else (a link, a folder, a pipe, a device) or is gone.

    What is read is what the name holds when it is opened: a search that found ``name`` in
    ``folder`` judges the path it walked to, and no link changed since can make it another file.
    """
    try:
        fd = os.open(name, _READ, dir_fd=folder)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return None
        if st.st_size > max_bytes:
            return st.st_size
        with os.fdopen(os.dup(fd), "rb") as f:
            return f.read(max_bytes + 1)
    except OSError:
        return None
    finally:
        os.close(fd)


class _Walker:
    def __init__(
        self, workspace: Path, path: str, *, held: tuple[set[str], int] | None = None, last: int = _READ
    ) -> None:
        """``held``: the workspace's names and descriptor, held open by a ``Beneath`` (the walker
        uses a copy of the descriptor); ``last``: how the path's last name is opened."""
        if held is None:
            # an absolute path may name the workspace as configured or as resolved
            self.bases = {str(workspace.resolve()), posixpath.normpath(os.path.abspath(workspace))}
            self.root_fd = os.open(workspace.resolve(), os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        else:
            self.bases, self.root_fd = held[0], os.dup(held[1])
        self.path = path
        self.last_flags = last
        self.folders: list[tuple[str, int]] = []  # the folders below the root walked into
        self.last: int | None = None

    def close(self) -> None:
        for fd in (self.last, *(fd for _, fd in self.folders), self.root_fd):
            if fd is not None:
                os.close(fd)
        self.folders, self.last = [], None

    def here(self) -> int:
        return self.folders[-1][1] if self.folders else self.root_fd

    def relative(self, *more: str) -> str:
        return "/".join([name for name, _ in self.folders] + [m for m in more if m != "."]) or "."

    def outside(self) -> ToolFailure:
        return ToolFailure(f"path {self.path!r} is outside the workspace")

    def within(self, absolute: str) -> list[str]:
        """An absolute path's names below the workspace (a link's target, or the path given)."""
        # as written first (a ``..`` after a link is the link's parent), then lexically normal
        for candidate in (absolute, posixpath.normpath(absolute)):
            for base in sorted(self.bases, key=len, reverse=True):
                if candidate.rstrip("/") == base:
                    return []
                prefix = base.rstrip("/") + "/"
                if candidate.startswith(prefix):
                    return candidate[len(prefix) :].split("/")
        raise self.outside()

    def run(self, make_folders: bool) -> Walked:
        pending = deque(self.within(self.path) if self.path.startswith("/") else self.path.split("/"))
        links = retries = 0
        while True:
            while pending and pending[0] in ("", "."):
                pending.popleft()
            if not pending:  # the path ends at a folder (or is the workspace)
                return self._folder_itself()
            name = pending.popleft()
            if name == "..":
                if not self.folders:
                    raise self.outside()
                os.close(self.folders.pop()[1])
                continue
            last = all(rest in ("", ".") for rest in pending)
            flags = self.last_flags if last else _HANDLE | _NOFOLLOW
            try:
                fd: int | None = os.open(name, flags, dir_fd=self.here())
            except OSError as exc:
                if exc.errno == errno.ENOENT and last:
                    return Walked(self.here(), name, None, self.relative(name))
                if exc.errno == errno.ENOENT and make_folders:
                    if self._make_folder(name, pending):
                        pending.appendleft(name)
                    else:
                        retries = self._again(retries, pending, name)
                    continue
                if exc.errno not in (errno.ELOOP, errno.EMLINK):  # ELOOP: the name is a link
                    raise
                fd = None  # a link, seen without a descriptor (no O_PATH here)
            if fd is not None and not stat.S_ISLNK(os.fstat(fd).st_mode):
                if last:
                    self.last = fd
                    return Walked(self.here(), name, fd, self.relative(name))
                if not stat.S_ISDIR(os.fstat(fd).st_mode):
                    os.close(fd)
                    raise NotADirectoryError(errno.ENOTDIR, f"{name!r} is a file, not a folder")
                self.folders.append((name, fd))
                continue
            target = self._link_target(name, fd)
            if target is None:  # no longer a link: it changed since the open
                retries = self._again(retries, pending, name)
                continue
            links += 1
            if links > MAX_LINKS:
                raise ToolFailure(f"path {self.path!r} cannot be resolved: too many links (a loop?)")
            if target.startswith("/"):
                for _, folder in self.folders:
                    os.close(folder)
                self.folders = []
                pending.extendleft(reversed(self.within(target)))
            else:
                pending.extendleft(reversed(target.split("/")))

    def _again(self, retries: int, pending: deque[str], name: str) -> int:
        """Walk ``name`` again (it changed under the walk), at most ``MAX_RETRIES`` times."""
        if retries >= MAX_RETRIES:
            raise ToolFailure(f"path {self.path!r} keeps changing while it is opened")
        pending.appendleft(name)
        return retries + 1

    def _make_folder(self, name: str, pending: deque[str]) -> bool:
        """Create the missing folder ``name``, once the path it leads to is judged allowed;
        ``False`` when something was made there meanwhile (it is walked as it is)."""
        check_opened(posixpath.normpath(self.relative(name, *pending)))
        try:
            os.mkdir(name, 0o777, dir_fd=self.here())
        except FileExistsError:
            return False
        return True

    def _link_target(self, name: str, fd: int | None) -> str | None:
        """The target of the link ``name`` (read from its descriptor where there is one, so it
        is the link that was opened); ``None`` when it is not a link any more."""
        try:
            if fd is not None:
                return os.readlink("", dir_fd=fd)
            return os.readlink(name, dir_fd=self.here())
        except OSError:
            return None
        finally:
            if fd is not None:
                os.close(fd)

    def _folder_itself(self) -> Walked:
        """The folder walked into last (or the workspace), opened for reading and listing."""
        if self.folders:
            name, handle = self.folders.pop()
            self.last = os.open(".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=handle)
            os.close(handle)
            return Walked(self.here(), name, self.last, self.relative(name))
        self.last = os.open(".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=self.root_fd)
        return Walked(self.root_fd, ".", self.last, ".")
