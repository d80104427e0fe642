"""A ``bash`` call's or a hook's working folder, scratch folder and environment: the scratch
folder is named for the worker that made it, so that one a killed worker left behind is removed
later (``sweep_scratch``); the environment is an allowlist, never a copy of the worker's."""

from __future__ import annotations

import functools
import os
import pwd
import shutil
import tempfile
from pathlib import Path

from durable_agent.activities.tools.sandbox import SHELL
from durable_agent.activities.tools.tool import ToolFailure, confine

# A call's scratch folder is named ``agent-bash-<pid of the worker>-<random>``.
SCRATCH_PREFIX = "agent-bash-"
# Variables passed through from the worker when set; everything else is left out.
PASSED_VARIABLES = frozenset({"PATH", "LANG", "LANGUAGE"})
DEFAULT_PATH = "/usr/local/bin:/usr/bin:/bin"


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


def environment(scratch: Path) -> dict[str, str]:
    """The command's environment: an allowlist, never a copy of the worker's.

    PATH, LANG, LANGUAGE and LC_* come from the worker; HOME and TMPDIR are
    folders in ``scratch``; TERM is ``dumb`` and pagers are ``cat`` so that
    no tool waits for a terminal or colours its output.
    """
    env = {k: v for k, v in os.environ.items() if k in PASSED_VARIABLES or k.startswith("LC_")}
    env.setdefault("PATH", DEFAULT_PATH)
    env.setdefault("LANG", "C.UTF-8")
    env.update(
        HOME=str(scratch / "home"),
        TMPDIR=str(scratch / "tmp"),
        USER=_user_name(),
        SHELL=SHELL,
        TERM="dumb",
        PAGER="cat",
        GIT_PAGER="cat",
        GIT_TERMINAL_PROMPT="0",
    )
    return env


def _user_name() -> str:
    try:
        return pwd.getpwuid(os.getuid()).pw_name
    except KeyError:  # a uid without a passwd entry, as in some containers
        return str(os.getuid())


def prepare_call(workspace: Path) -> tuple[Path, Path, dict[str, str]]:
    """The working folder (the workspace, resolved), a fresh scratch folder and the environment.

    Args:
        workspace: The run's workspace.

    Returns:
        The working folder, the scratch folder (the caller removes it) and the environment.

    Raises:
        ToolFailure: The workspace is not a folder.
    """
    cwd = confine(workspace, ".")
    if not cwd.is_dir():
        raise ToolFailure(f"the workspace {str(workspace)!r} is not a folder")
    sweep_scratch_once()
    scratch = Path(tempfile.mkdtemp(prefix=f"{SCRATCH_PREFIX}{os.getpid()}-"))
    (scratch / "home").mkdir()
    (scratch / "tmp").mkdir()
    return cwd, scratch, environment(scratch)
