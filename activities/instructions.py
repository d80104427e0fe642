"""Project instructions: the ``AGENTS.md`` files a run's system prompt takes in.

At a run's start the resolve activity (``resolve_run.py``) looks for the repository around
the workspace (the nearest folder above it, or the workspace itself, that holds ``.git``;
with none, the workspace alone) and reads, in each folder from that root down to the
workspace, the first of ``[instructions] file_names`` that is there (``AGENTS.md``, else
``CLAUDE.md``). The system prompt is then the config's ``system_prompt``, these files
(outermost first, each headed with its path from the root) and the run's own
``instructions``.

Each file is opened as the file tools open a path (``tools/beneath.py``): one name at a
time from a descriptor of the root, never through a link the kernel follows, so a link may
lead to another file of the repository (``CLAUDE.md -> AGENTS.md``) but never out of it,
and no link changed meanwhile makes it another file. What is read is bounded: the first
``MAX_FILE_BYTES`` of each file, and ``MAX_PROJECT_BYTES`` of them all, as JSON (the
system prompt travels in the run's payloads); a file cut says so where it is cut. Bytes
that are not UTF-8 are read as U+FFFD.
"""

from __future__ import annotations

import codecs
import os
import stat
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from durable_agent.activities.tools.beneath import Beneath
from durable_agent.activities.tools.tool import ToolFailure
from durable_agent.core.canonical import canonical_bytes, sha256_digest
from durable_agent.core.models import InstructionFile

# What one file may bring: its first 32 KiB are read, the rest is cut (with a note).
MAX_FILE_BYTES: Final = 32_768
# What all of them may bring together, as JSON: a file that would pass it is cut to fit, the
# files after it are left out. With a run's ``instructions`` (``MAX_INSTRUCTIONS_BYTES``), well
# within what ``INPUT_BUDGET_BYTES`` leaves of a payload for the system prompt.
MAX_PROJECT_BYTES: Final = 65_536

_READ: Final = os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_NOFOLLOW | os.O_CLOEXEC

PROJECT_HEADING: Final = (
    "# Project instructions\n\n"
    "From the repository's instruction files, outermost first (paths from the repository's root): "
    "where two disagree, the one nearer the workspace wins."
)
RUN_HEADING: Final = "# Instructions for this run"


@dataclass(frozen=True)
class ProjectFile:
    """One instruction file as the system prompt takes it in: what the run records of it, and
    its text (with a note where it was cut)."""

    record: InstructionFile
    text: str


@dataclass(frozen=True)
class ProjectInstructions:
    """What was found: the files read (outermost first), the workspace's path from the root
    (``"."``: the root itself), and why a file found was not read (for the worker's log)."""

    files: tuple[ProjectFile, ...] = ()
    workspace: str = "."
    skipped: tuple[str, ...] = ()

    @property
    def records(self) -> tuple[InstructionFile, ...]:
        return tuple(f.record for f in self.files)


def repository_root(workspace: Path) -> Path:
    """The nearest folder, from ``workspace`` up, that holds ``.git`` (a folder, or the file of a
    worktree or submodule); ``workspace`` itself when there is none.

    Args:
        workspace: The run's workspace, resolved.

    Returns:
        The folder project files are read from, down to the workspace.
    """
    for folder in (workspace, *workspace.parents):
        if os.path.lexists(folder / ".git"):
            return folder
    return workspace


def json_size(text: str) -> int:
    """The bytes ``text`` takes in a payload: its JSON string, UTF-8."""
    return len(canonical_bytes(text))


def decoded(data: bytes, *, whole: bool) -> str:
    """``data`` as text, bytes that are not UTF-8 as U+FFFD; a sequence cut at the end of a
    prefix (``whole`` False) is left out rather than replaced; a byte order mark is dropped."""
    return codecs.getincrementaldecoder("utf-8")("replace").decode(data, final=whole).removeprefix("\ufeff")


def read_project_files(workspace: Path, names: Sequence[str]) -> ProjectInstructions:
    """Read the instruction files from the repository's root down to ``workspace``.

    Args:
        workspace: The run's workspace, resolved.
        names: The names to look for in each folder, in order: the first there is read.

    Returns:
        The files read, outermost first, within ``MAX_FILE_BYTES`` each and
        ``MAX_PROJECT_BYTES`` in all; what was found and not read, and why.
    """
    root = repository_root(workspace)
    below = workspace.relative_to(root).parts
    folders = [".", *("/".join(below[: i + 1]) for i in range(len(below)))]
    skipped: list[str] = []
    found: list[tuple[str, bytes, int]] = []
    seen: set[str] = set()
    try:
        with Beneath(root) as base:
            for folder in folders:
                for name in names:
                    path = name if folder == "." else f"{folder}/{name}"
                    outcome = _read_one(base, path, seen)
                    if isinstance(outcome, _Skip):
                        skipped.append(f"{path}: {outcome.reason}")
                        if outcome.final:
                            break
                    elif outcome is not None:
                        found.append((path, *outcome))
                        break
    except OSError as exc:  # the root itself cannot be opened
        skipped.append(f"{root}: {exc.strerror or exc}")
    files = _within_budget(found, skipped)
    return ProjectInstructions(files=files, workspace="/".join(below) or ".", skipped=tuple(skipped))


@dataclass(frozen=True)
class _Skip:
    """A name that is there and is not read: why; ``final`` when the folder's next names are
    not looked for (it is a file read already)."""

    reason: str
    final: bool = False


def _read_one(base: Beneath, path: str, seen: set[str]) -> tuple[bytes, int] | _Skip | None:
    """The first ``MAX_FILE_BYTES + 1`` bytes of ``path`` and its size; None when it is not there."""
    try:
        with base.reach(path) as at:
            if at.fd is None:
                return None
            if at.relative in seen:  # a link to a file read already (``pkg/AGENTS.md -> ../AGENTS.md``)
                return _Skip(f"the same file as {at.relative}, read once", final=True)
            got = _read_prefix(at.folder, at.name)
            if got is None:
                return _Skip("not a regular file")
            seen.add(at.relative)
            return got
    except ToolFailure as exc:  # a link out of the repository, or a loop
        return _Skip(str(exc).replace("the workspace", "the repository"))
    except OSError as exc:
        return _Skip(exc.strerror or str(exc))


def _read_prefix(folder: int, name: str) -> tuple[bytes, int] | None:
    """The regular file ``name`` in ``folder`` (opened without following a link): its first
    ``MAX_FILE_BYTES + 1`` bytes and its size; None when it is not a regular file."""
    fd = os.open(name, _READ, dir_fd=folder)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return None
        with os.fdopen(os.dup(fd), "rb") as f:
            data = f.read(MAX_FILE_BYTES + 1)
        return data, max(st.st_size, len(data))
    finally:
        os.close(fd)


def _within_budget(found: list[tuple[str, bytes, int]], skipped: list[str]) -> tuple[ProjectFile, ...]:
    """The files as the prompt takes them: each cut to ``MAX_FILE_BYTES``, and all of them to
    ``MAX_PROJECT_BYTES`` as JSON (a file that would pass it is cut to fit, later ones left out)."""
    files: list[ProjectFile] = []
    used = 0
    for path, data, size in found:
        if not data:
            skipped.append(f"{path}: empty")
            continue
        data = data[:MAX_FILE_BYTES]
        room = MAX_PROJECT_BYTES - used
        taken = len(data)
        if json_size(decoded(data, whole=taken == size)) > room:
            taken = _fitting(data, room)
        if taken == 0:
            skipped.append(f"{path}: left out, the project files reached {MAX_PROJECT_BYTES} bytes")
            continue
        part = data[:taken]
        text = decoded(part, whole=taken == size)
        used += json_size(text)
        if taken < size:
            text += (
                f"\n\n[… {path} is cut here: it is {size} bytes, of which the first {taken} are read "
                f"(at most {MAX_FILE_BYTES} bytes a file, {MAX_PROJECT_BYTES} in all)]"
            )
        record = InstructionFile(path=path, digest=sha256_digest(part), bytes=taken)
        files.append(ProjectFile(record=record, text=text))
    return tuple(files)


def _fitting(data: bytes, room: int) -> int:
    """The longest prefix of ``data`` whose text takes at most ``room`` bytes as JSON."""
    low, high = 0, len(data)
    while low < high:
        middle = (low + high + 1) // 2
        if json_size(decoded(data[:middle], whole=False)) <= room:
            low = middle
        else:
            high = middle - 1
    return low


def system_prompt(base: str, project: ProjectInstructions, instructions: str | None) -> str:
    """A run's system prompt: the config's, then the project files, then the run's own
    instructions; ``base`` alone when there are neither.

    Args:
        base: The worker config's ``system_prompt``.
        project: The instruction files read.
        instructions: The run input's ``instructions``.

    Returns:
        The system prompt the run's model calls send.
    """
    parts = [base] if base else []
    if project.files:
        heading = PROJECT_HEADING
        if project.workspace != ".":
            heading += f" The workspace is `{project.workspace}` in the repository."
        parts.append(heading)
        parts.extend(f"## {f.record.path}\n\n{f.text.rstrip()}" for f in project.files)
    if instructions:
        parts.append(f"{RUN_HEADING}\n\n{instructions}")
    return "\n\n".join(parts)
