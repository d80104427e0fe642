"""The file tools ``read``, ``write`` and ``ls``, each confined to the workspace, and how the
file tools reach a file (``walked``, ``reader``).

They block, so ``builtin_tools`` runs them in a thread. What a repeat does
(Temporal runs activities at least once):

- ``read`` and ``ls`` only read: a repeat answers from the files as they are.
- ``write`` replaces the file atomically with the same content: harmless, and
  reported as "already had this content".

``edit`` and ``multi_edit`` are in ``edits.py``.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO

from durable_agent.activities.tools.beneath import Walked, walk
from durable_agent.activities.tools.tool import ToolContent, ToolFailure
from durable_agent.core.images import IMAGE_MAX_BYTES, MediaType, image_block, sniff_media_type
from durable_agent.core.tool_args import (
    LS_MAX_ENTRIES,
    READ_MAX_BYTES,
    READ_MAX_LINE_CHARS,
    LsArgs,
    ReadArgs,
    WriteArgs,
)

# A NUL byte in the first block marks a binary file, as git and grep decide it.
BINARY_SNIFF_BYTES = 8192
# Past the shown lines, ``read`` counts the rest of the file up to this much, to say how much is left.
READ_COUNT_BYTES = 32 * 1024 * 1024

# The longest line prefix ``read`` keeps in memory: enough for READ_MAX_LINE_CHARS of UTF-8.
_LINE_PREFIX_BYTES = READ_MAX_LINE_CHARS * 4


def is_binary(head: bytes) -> bool:
    """Whether a file starting with ``head`` is binary."""
    return b"\0" in head[:BINARY_SNIFF_BYTES]


def reader(at: Walked, shown: str) -> BinaryIO:
    """The walked file, for reading; a folder, pipe or device is a clear failure, never a hang
    (``walk`` opened it without blocking).

    Args:
        at: The path as ``walked`` opened it.
        shown: The path as the model gave it, for the messages.

    Returns:
        The file, opened for reading (the caller closes it).

    Raises:
        ToolFailure: It does not exist, or is not a regular file.
    """
    if at.fd is None:
        raise ToolFailure(f"file {shown!r} does not exist")
    if at.is_folder():
        raise ToolFailure(f"{shown!r} is a folder; use ls to list it")
    if not stat.S_ISREG(os.fstat(at.fd).st_mode):
        raise ToolFailure(f"{shown!r} is not a regular file")
    return os.fdopen(os.dup(at.fd), "rb")


@contextmanager
def walked(workspace: Path, path: str, *, make_folders: bool = False) -> Iterator[Walked]:
    """``walk`` with the failures of the folders on the way said as the tools say them.

    Args:
        workspace: The run's workspace.
        path: The path as the model gave it.
        make_folders: Create the missing folders on the way (to write a file).

    Returns:
        A context that gives the path, opened (``beneath.Walked``).

    Raises:
        ToolFailure: A folder on the way is missing, a file, or not ours to enter.
    """
    try:
        with walk(workspace, path, make_folders=make_folders) as at:
            yield at
    except FileNotFoundError:
        raise ToolFailure(f"{path!r} does not exist (a folder on its way is missing)") from None
    except NotADirectoryError:
        raise ToolFailure(f"{path!r} cannot be reached: part of its folder path is a file") from None
    except PermissionError:
        raise ToolFailure(f"{path!r} cannot be reached (permission denied)") from None


def _next_line(f: BinaryIO) -> tuple[bytes, int] | None:
    """The next line's first bytes (without its line break) and its full length; None at the end.

    A line longer than the prefix is skipped over in pieces, so a huge
    single-line file (minified code, a data dump) never sits whole in memory.
    """
    prefix = f.readline(_LINE_PREFIX_BYTES)
    if not prefix:
        return None
    length = len(prefix)
    if not prefix.endswith(b"\n"):
        while True:
            rest = f.readline(1024 * 1024)
            length += len(rest)
            if not rest or rest.endswith(b"\n"):
                break
    return prefix.rstrip(b"\r\n"), length


def _count_lines(f: BinaryIO, budget: int) -> int | None:
    """Lines left in ``f``, or None when there is more than ``budget`` bytes to count."""
    count, seen, last = 0, 0, b"\n"
    while chunk := f.read(1024 * 1024):
        count += chunk.count(b"\n")
        seen += len(chunk)
        last = chunk[-1:]
        if seen > budget:
            return None
    return count + (last != b"\n")


def _image(f: BinaryIO, shown: str, media_type: MediaType) -> str | ToolContent:
    """An image file (PNG, JPEG, GIF or WebP, by its first bytes) as an image for the model,
    up to ``IMAGE_MAX_BYTES``."""
    size = os.fstat(f.fileno()).st_size
    what = f"{shown} is an image ({media_type}, {size} bytes)"
    if size > IMAGE_MAX_BYTES:
        return f"{what}, larger than the {IMAGE_MAX_BYTES} bytes a model is shown; it is not shown"
    f.seek(0)
    raw = f.read(IMAGE_MAX_BYTES + 1)
    return ToolContent(text=what, images=(image_block(raw, media_type),))


def read(args: ReadArgs, workspace: Path) -> str | ToolContent:
    """A text file's lines, numbered from 1, from ``offset`` for ``limit`` lines; an image
    (PNG, JPEG, GIF, WebP) as an image.

    Stops at ``READ_MAX_BYTES`` of text and cuts lines longer than
    ``READ_MAX_LINE_CHARS``, saying so and how to read on; reports a binary
    file instead of showing it. Only reads, so a repeat changes nothing.
    """
    with walked(workspace, args.file_path) as at, reader(at, args.file_path) as f:
        head = f.read(BINARY_SNIFF_BYTES)
        media_type = sniff_media_type(head)
        if media_type is not None:
            return _image(f, args.file_path, media_type)
        if is_binary(head):
            file_size = os.fstat(f.fileno()).st_size
            return f"{args.file_path} is a binary file ({file_size} bytes); its content is not shown"
        f.seek(0)
        for skipped in range(args.offset):
            if _next_line(f) is None:
                if skipped == 0:
                    return f"[{args.file_path} is empty]"
                return f"[{args.file_path} has {skipped} lines; offset {args.offset} is past the end]"
        shown: list[str] = []
        used, cut_lines, full = 0, 0, False
        while args.limit is None or len(shown) < args.limit:
            position = f.tell()
            line = _next_line(f)
            if line is None:
                break
            prefix, length = line
            text = prefix.decode("utf-8", errors="replace")
            if len(text) > READ_MAX_LINE_CHARS or length > _LINE_PREFIX_BYTES:
                text = f"{text[:READ_MAX_LINE_CHARS]} [… line cut at {READ_MAX_LINE_CHARS} characters]"
                cut_lines += 1
            number = args.offset + len(shown) + 1
            entry = f"{number:>6}\t{text}"
            size = len(entry.encode("utf-8")) + 1
            if shown and used + size > READ_MAX_BYTES:
                f.seek(position)  # this line is counted among those left
                full = True
                break
            shown.append(entry)
            used += size
        end = args.offset + len(shown)
        left = _count_lines(f, READ_COUNT_BYTES)
    if not shown:
        if args.offset == 0:
            return f"[{args.file_path} is empty]"
        return f"[{args.file_path} has {args.offset} lines; offset {args.offset} is past the end]"
    notes = []
    more = "more lines follow" if left is None else f"{left} more lines"
    if full:
        notes.append(f"[output cut at {READ_MAX_BYTES} bytes; {more}; use offset={end} to read on]")
    elif left != 0:
        notes.append(f"[{more}; use offset={end} to read on]")
    if cut_lines:
        notes.append(
            f"[output cut: {cut_lines} line(s) longer than {READ_MAX_LINE_CHARS} characters shown in part]"
        )
    return "\n".join([*shown, *notes])


def write(args: WriteArgs, workspace: Path) -> str:
    """Create or replace a file with ``content``, creating parent folders inside the workspace.

    An existing file is replaced atomically and keeps its permissions. A
    repeat writes the same content again, which changes nothing; the result
    then says the file already had that content.
    """
    data = args.content.encode("utf-8")
    try:
        with walked(workspace, args.file_path, make_folders=True) as at:
            if at.fd is None:
                if at.create(data):
                    return f"created {args.file_path} ({len(data)} bytes written)"
                raise ToolFailure(f"{args.file_path!r} appeared while it was being created; write again")
            if at.is_folder():
                raise ToolFailure(f"{args.file_path!r} is a folder; give a file path")
            st = os.fstat(at.fd)
            if not stat.S_ISREG(st.st_mode):
                raise ToolFailure(f"{args.file_path!r} is not a regular file")
            if st.st_size == len(data):
                with os.fdopen(os.dup(at.fd), "rb") as f:
                    if f.read(len(data) + 1) == data:
                        return (
                            f"{args.file_path} already had this content ({len(data)} bytes); nothing changed"
                        )
            at.replace(data, stat.S_IMODE(st.st_mode))
    except PermissionError:
        raise ToolFailure(f"cannot write {args.file_path!r}: permission denied") from None
    except OSError as exc:
        raise ToolFailure(f"cannot write {args.file_path!r}: {exc.strerror or exc}") from None
    return f"replaced {args.file_path} ({len(data)} bytes written; it had {st.st_size} bytes)"


def ls(args: LsArgs, workspace: Path) -> str:
    """A folder's entries, sorted: kind, name, size (links shown with their target), bounded.

    Only reads, so a repeat changes nothing.
    """
    with walked(workspace, args.path) as at:
        if at.fd is None:
            raise ToolFailure(f"folder {args.path!r} does not exist")
        if not at.is_folder():
            raise ToolFailure(f"{args.path!r} is a file; use read to see it")
        try:
            names = sorted(os.listdir(at.fd))
        except PermissionError:
            raise ToolFailure(f"folder {args.path!r} cannot be listed (permission denied)") from None
        return _listing(args, at.fd, names)


def _listing(args: LsArgs, folder: int, names: list[str]) -> str:
    """``ls``'s lines for ``names`` in the open ``folder``."""
    lines = []
    for name in names[:LS_MAX_ENTRIES]:
        try:
            st = os.stat(name, dir_fd=folder, follow_symlinks=False)
            if stat.S_ISLNK(st.st_mode):
                lines.append(f"link  {name} -> {os.readlink(name, dir_fd=folder)}")
            elif stat.S_ISDIR(st.st_mode):
                lines.append(f"dir   {name}/")
            else:
                lines.append(f"file  {name}  ({st.st_size} bytes)")
        except OSError:
            continue  # removed since the listing, or not ours to look at
    if len(names) > LS_MAX_ENTRIES:
        lines.append(f"[{len(names) - LS_MAX_ENTRIES} more entries not shown]")
    return "\n".join(lines) if lines else f"[{args.path} is empty]"
