"""Atomic, durable file writes shared by the filesystem store and sink."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def write_atomic(path: Path, data: bytes, mode: int | None = None) -> None:
    """Write ``data`` to ``path`` so a reader sees the old file or the whole new one.

    The bytes are fsynced before the rename and the folder after it, so an
    acknowledged write survives a crash of the machine, not only of the worker.
    """
    write_synced(path, data, mode)
    fsync_dir(path.parent)


def write_synced(path: Path, data: bytes, mode: int | None = None, *, sync: bool = True) -> None:
    """``write_atomic`` without the folder's fsync, for a caller that writes many files in a few
    folders and fsyncs each folder once (``sync=False``: not even the file's bytes, for a copy
    that can be made again)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            if sync:
                f.flush()
                os.fsync(f.fileno())
        if mode is not None:
            os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def fsync_dir(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
