"""One command run as the ``bash`` tool runs its commands, for the worker's own commands: a
``[hooks]`` command (``activities/hook_call.py``) and a workspace's ``[workspaces] setup``
(``activities/workspaces/setup.py``).

``/bin/bash -c COMMAND`` in the workspace, in the sandbox ``[sandbox]`` configures (the same
allowlisted environment, scratch HOME and TMPDIR, bounds, and a process tree that dies with the
call), with ``stdin`` fed in and closed, stdout and stderr kept apart, each bounded to its first
and last bytes.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from durable_agent.activities.tools import process
from durable_agent.activities.tools.sandbox import sandbox_problem
from durable_agent.activities.tools.scratch import prepare_call
from durable_agent.activities.tools.tool import ToolFailure
from durable_agent.config import SandboxConfig

__all__ = ["CommandRun", "run_command"]


@dataclass(frozen=True)
class CommandRun:
    """How a command ended: its exit code (None: stopped at its time limit), its output."""

    code: int | None
    stdout: str
    stderr: str
    timed_out: bool
    timeout: float


async def run_command(
    command: str,
    settings: SandboxConfig,
    workspace: Path,
    timeout_seconds: float,
    *,
    stdin: bytes = b"",
    folder_vars: tuple[str, ...] = (),
    head: int,
    tail: int,
) -> CommandRun:
    """Run ``command`` in ``workspace`` as the ``bash`` tool would (see the module's docstring).

    Args:
        command: The shell line.
        settings: The worker's ``[sandbox]``.
        workspace: The folder it runs in.
        timeout_seconds: Its time limit (bounded as the ``bash`` tool's).
        stdin: What it reads on its standard input.
        folder_vars: Variables set to the folder it runs in (the workspace, resolved).
        head: The first bytes of each output kept.
        tail: The last bytes of each output kept.

    Returns:
        Its exit code and output.

    Raises:
        ToolFailure: The sandbox cannot start on this worker.
        OSError: The command could not be started.
    """
    sandboxed = settings.kind != "none"
    if sandboxed and (problem := await asyncio.to_thread(sandbox_problem, settings)):
        raise ToolFailure(f"the sandbox cannot start: {problem}")
    timeout, _ = process.time_limit(timeout_seconds)
    cwd, scratch, env = await asyncio.to_thread(prepare_call, workspace)
    env.update(dict.fromkeys(folder_vars, str(cwd)))
    ended: Callable[[], list[str]] = process.nothing
    try:
        # the bash tool's start, for this command (its timeout is not used: ours is)
        argv, env, options, ended = await process.prepared(command, settings, cwd, scratch, env)
        proc = await process.start_command(
            argv,
            sandboxed,
            cwd=cwd,
            env=env,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            start_new_session=True,
            **options,
        )
        assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
        out = process.BoundedOutput(head, tail)
        err = process.BoundedOutput(head, tail)
        feed = asyncio.create_task(_feed(proc.stdin, stdin))
        readers = [
            asyncio.create_task(process.drain(proc.stdout, out)),
            asyncio.create_task(process.drain(proc.stderr, err)),
        ]
        timed_out, _ = await process.supervise(proc, timeout, sandboxed, readers, (feed,))
    finally:
        await asyncio.to_thread(ended)
        await asyncio.to_thread(shutil.rmtree, scratch, ignore_errors=True)
    return CommandRun(None if timed_out else proc.returncode, out.text(), err.text(), timed_out, timeout)


async def _feed(pipe: asyncio.StreamWriter, data: bytes) -> None:
    """Write ``data`` to the command's stdin and close it; a command that does not read it is fine."""
    with contextlib.suppress(BrokenPipeError, ConnectionResetError):
        pipe.write(data)
        await pipe.drain()
    with contextlib.suppress(BrokenPipeError, ConnectionResetError):
        pipe.close()
        await pipe.wait_closed()
