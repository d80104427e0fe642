"""Tool implementations, each confined to the run's workspace.

Every built-in tool here only reads, so running one again after a crash
(Temporal runs activities at least once) gives the same answer and changes
nothing.
"""

from __future__ import annotations

import asyncio
import os
import stat
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from durable_agent.tool_specs import BUILTIN_TOOLS, LsArgs, ReadArgs, ToolArgs, ToolSpec

READ_MAX_BYTES = 256 * 1024
LS_MAX_ENTRIES = 1000


class ToolFailure(Exception):
    """An expected failure (a missing file, a path outside the workspace): shown to the model."""


ToolImpl = Callable[[Any, Path], Awaitable[str]]


@dataclass(frozen=True)
class Tool:
    spec: ToolSpec
    run: ToolImpl


def confine(workspace: Path, path: str) -> Path:
    """Resolve ``path`` inside ``workspace``, following links; refuse anything outside."""
    root = workspace.resolve()
    candidate = (root / path).resolve()
    if candidate != root and not candidate.is_relative_to(root):
        raise ToolFailure(f"path {path!r} is outside the workspace")
    return candidate


def _read(args: ReadArgs, workspace: Path) -> str:
    path = confine(workspace, args.file_path)
    try:
        if path.is_dir():
            raise ToolFailure(f"{args.file_path!r} is a folder; use ls to list it")
        with path.open("rb") as f:
            data = f.read(READ_MAX_BYTES + 1)
    except FileNotFoundError:
        raise ToolFailure(f"file {args.file_path!r} does not exist") from None
    except PermissionError:
        raise ToolFailure(f"file {args.file_path!r} cannot be read (permission denied)") from None
    if b"\0" in data[:8192]:
        size = path.stat().st_size
        return f"{args.file_path} is a binary file ({size} bytes); its content is not shown"
    truncated = len(data) > READ_MAX_BYTES
    text = data[:READ_MAX_BYTES].decode("utf-8", errors="replace")
    lines = text.splitlines()
    if truncated and lines:
        lines = lines[:-1]  # the last line may be cut mid-way
    end = len(lines) if args.limit is None else min(len(lines), args.offset + args.limit)
    shown = lines[args.offset : end]
    out = "\n".join(f"{n:>6}\t{line}" for n, line in enumerate(shown, start=args.offset + 1))
    notes = []
    if truncated:
        notes.append(f"[output cut: the file is larger than {READ_MAX_BYTES} bytes; use offset/limit]")
    elif end < len(lines):
        notes.append(f"[{len(lines) - end} more lines; use offset={end} to read on]")
    if not shown and not notes:
        return f"[{args.file_path} has no lines at offset {args.offset}]"
    return "\n".join([out, *notes]) if out else "\n".join(notes)


def _ls(args: LsArgs, workspace: Path) -> str:
    folder = confine(workspace, args.path)
    try:
        names = sorted(os.listdir(folder))
    except FileNotFoundError:
        raise ToolFailure(f"folder {args.path!r} does not exist") from None
    except NotADirectoryError:
        raise ToolFailure(f"{args.path!r} is a file; use read to see it") from None
    lines = []
    for name in names[:LS_MAX_ENTRIES]:
        st = os.lstat(folder / name)
        if stat.S_ISLNK(st.st_mode):
            lines.append(f"link  {name} -> {os.readlink(folder / name)}")
        elif stat.S_ISDIR(st.st_mode):
            lines.append(f"dir   {name}/")
        else:
            lines.append(f"file  {name}  ({st.st_size} bytes)")
    if len(names) > LS_MAX_ENTRIES:
        lines.append(f"[{len(names) - LS_MAX_ENTRIES} more entries not shown]")
    return "\n".join(lines) if lines else f"[{args.path} is empty]"


def _threaded(fn: Callable[[Any, Path], str]) -> ToolImpl:
    async def run(args: Any, workspace: Path) -> str:
        return await asyncio.to_thread(fn, args, workspace)

    return run


def builtin_tools() -> dict[str, Tool]:
    """The tools every worker has; tests and embedders may add their own."""
    impls: dict[str, Callable[[Any, Path], str]] = {"read": _read, "ls": _ls}
    return {name: Tool(BUILTIN_TOOLS[name], _threaded(fn)) for name, fn in impls.items()}


__all__ = ["Tool", "ToolArgs", "ToolFailure", "builtin_tools", "confine"]
