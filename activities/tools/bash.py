"""The ``bash`` tool: one command, in the workspace, in a sandbox of its own.

The command runs as ``/bin/bash -c COMMAND`` with the workspace as its
working folder, stdin from /dev/null and an environment built from an
allowlist (``scratch.environment``), so the worker's credentials (model API keys,
Temporal certificates, cloud tokens) never reach it. HOME and TMPDIR point
into a temporary folder made for the call and removed after it.

With ``[sandbox] kind = "bubblewrap"`` (the default) the command runs in a
bubblewrap sandbox (``tools/sandbox.py``): only the system folders (read-only),
the workspace and a private /tmp in view, the kernel's settings read-only, not
root (a user namespace), no network unless the config allows it, bounded in
processes, memory, file size and CPU time (``sandbox_limits``), and in a PID
namespace of its own, so that nothing it starts, ``setsid`` and daemons
included, outlives the call, a timeout, a cancel or the worker's own death
(even by ``kill -9``). There, an exit by a signal shows as exit code 128 + the
signal's number, as shells report it (bwrap passes the status on that way).

With ``kind = "none"`` the shell runs directly, as the worker's user (with
the memory, file size and CPU bounds), in a new session: it and everything
it starts share one process group, which is stopped as a whole (SIGTERM,
then SIGKILL after ``process.KILL_GRACE_SECONDS``) when the command times out, when
the run is cancelled, and when the shell exits leaving processes behind; on
Linux the shell is also killed when the worker dies. A process that starts
a session of its own (``setsid``, a daemon) escapes the group and outlives
the call and the worker: only the sandbox stops that.

A repeat (Temporal runs activities at least once, so a call may run again
after a worker crash) runs the command again. The tool cannot make an
arbitrary command safe to repeat; permission rules should allow only
commands that are (tests, builds, reads) and ask for the others.
"""

from __future__ import annotations

import asyncio
import shutil
import signal
import subprocess
from collections.abc import Callable
from pathlib import Path

from durable_agent.activities.tools.process import (
    BoundedOutput,
    drain,
    nothing,
    prepared,
    start_command,
    supervise,
    time_limit,
)
from durable_agent.activities.tools.sandbox import sandbox_problem
from durable_agent.activities.tools.scratch import prepare_call
from durable_agent.activities.tools.tool import ToolFailure
from durable_agent.config import SandboxConfig
from durable_agent.core.tool_args import BASH_OUTPUT_HEAD_BYTES, BASH_OUTPUT_TAIL_BYTES, BashArgs


def _exit_note(code: int | None, sandboxed: bool) -> str:
    if code is not None and code < 0:
        return f"[killed by signal {signal.Signals(-code).name}]"
    if sandboxed and code is not None and code > 128 and code - 128 in signal.valid_signals():
        return f"[exit code {code}, as for a kill by {signal.Signals(code - 128).name}]"
    return f"[exit code {code}]"


async def bash(args: BashArgs, workspace: Path, settings: SandboxConfig | None = None) -> str:
    """Run ``command`` in the workspace; return its output and exit code.

    A non-zero exit code is reported, not a failure; a timeout is a failure
    (``ToolFailure``) that carries the output so far. On timeout and on
    cancel (``asyncio.CancelledError``) the whole process group is stopped
    before the call returns or the cancel goes on; processes the command
    leaves running when it ends are stopped too. A repeat runs the command
    again. ``settings`` say where it runs (default: the bubblewrap sandbox).
    """
    settings = settings or SandboxConfig()
    sandboxed = settings.kind != "none"
    if sandboxed and (problem := await asyncio.to_thread(sandbox_problem, settings)):
        raise ToolFailure(f"the bash sandbox cannot start: {problem}")
    timeout, timeout_note = time_limit(args.timeout_seconds)
    cwd, scratch, env = await asyncio.to_thread(prepare_call, workspace)
    ended: Callable[[], list[str]] = nothing
    try:
        argv, env, options, ended = await prepared(args.command, settings, cwd, scratch, env)
        try:
            proc = await start_command(
                argv,
                sandboxed,
                cwd=cwd,
                env=env,  # bwrap's too: the sandbox's pid 1 is its fork, /proc/1/environ its environment
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.STDOUT,
                start_new_session=True,  # its own process group, id = its pid
                **options,
            )
        except (OSError, subprocess.SubprocessError) as exc:  # the latter: joining the call's cgroup failed
            raise ToolFailure(f"cannot start {argv[0]}: {getattr(exc, 'strerror', None) or exc}") from None
        assert proc.stdout is not None
        output = BoundedOutput(BASH_OUTPUT_HEAD_BYTES, BASH_OUTPUT_TAIL_BYTES)
        reader = asyncio.create_task(drain(proc.stdout, output))
        timed_out, stray = await supervise(proc, timeout, sandboxed, [reader])
    finally:
        left = await asyncio.to_thread(ended)
        await asyncio.to_thread(shutil.rmtree, scratch, ignore_errors=True)
    notes = [n for n in (timeout_note,) if n] + left
    if stray:
        notes.append("[output still open after the command ended (a process left its group); not read on]")
    text = output.text()
    if timed_out:
        raise ToolFailure(
            "\n".join(
                [f"command timed out after {timeout:g} s; it and every process it started were stopped"]
                + ([f"output so far:\n{text.rstrip()}"] if text.strip() else ["(no output)"])
                + notes
            )
        )
    body = text.rstrip("\n") if text.strip() else "(no output)"
    return "\n".join([body, *notes, _exit_note(proc.returncode, sandboxed)])
