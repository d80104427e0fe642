"""The scratch folders of ``bash`` calls and hooks: named for the worker that made them, so that
one a killed worker left behind is removed later (``sweep_scratch``)."""

from __future__ import annotations

import functools
import os
import shutil
import tempfile
from pathlib import Path

# A call's scratch folder is named ``agent-bash-<pid of the worker>-<random>``.
SCRATCH_PREFIX = "agent-bash-"


@functools.cache
def sweep_scratch_once() -> None:
    """``sweep_scratch`` in the system's temporary folder, at a process's first call."""
    sweep_scratch(Path(tempfile.gettempdir()))


def sweep_scratch(root: Path) -> list[Path]:
    """Remove the scratch folders that worker processes gone since left in ``root``.

    A worker killed during a call (``kill -9``, an out-of-memory kill) cannot remove its
    call's folder. Each folder's name holds the pid of the worker that made it; a folder
    whose worker no longer runs is removed. One whose pid is now another process's is
    kept (it may be removed later), never one of a live worker.

    Args:
        root: where the folders are (the system's temporary folder).

    Returns:
        The folders removed.
    """
    removed: list[Path] = []
    try:
        names = os.listdir(root)
    except OSError:
        return removed
    for name in names:
        pid, dash, _ = name.removeprefix(SCRATCH_PREFIX).partition("-")
        if not name.startswith(SCRATCH_PREFIX) or not dash or not pid.isdigit() or _process_runs(int(pid)):
            continue
        shutil.rmtree(root / name, ignore_errors=True)  # another user's stays: not ours to remove
        if not os.path.lexists(root / name):
            removed.append(root / name)
    return removed


def _process_runs(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True
