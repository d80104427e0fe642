"""The ``bash`` tool: one command, in the workspace, in a sandbox of its own.

The command runs as ``/bin/bash -c COMMAND`` with the workspace as its
working folder, stdin from /dev/null and an environment built from an
allowlist (``environment``), so the worker's credentials (model API keys,
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
then SIGKILL after ``KILL_GRACE_SECONDS``) when the command times out, when
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
import contextlib
import ctypes
import functools
import os
import pwd
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from temporalio import activity

from durable_agent.activities.tools.sandbox import (
    SHELL,
    launch,
    namespace_init,
    namespace_members,
    running,
    sandbox_problem,
)
from durable_agent.activities.tools.sandbox_limits import SandboxUnavailable, limited
from durable_agent.activities.tools.tool import ToolFailure, confine
from durable_agent.config import SandboxConfig
from durable_agent.core.tool_args import BASH_OUTPUT_HEAD_BYTES, BASH_OUTPUT_TAIL_BYTES, BashArgs

KILL_GRACE_SECONDS = 2.0
# Kept free of the activity's own time limit: to stop the command and report, instead of the
# activity timing out, being retried and running the command again.
ACTIVITY_MARGIN_SECONDS = 10.0
# How long to wait for the output to end once the command's processes are gone: only a
# process outside the group (see the module docs) can hold it open longer.
DRAIN_SECONDS = 1.0
# Variables passed through from the worker when set; everything else is left out.
PASSED_VARIABLES = frozenset({"PATH", "LANG", "LANGUAGE"})
DEFAULT_PATH = "/usr/local/bin:/usr/bin:/bin"
# The program to start, its environment, its subprocess options, and what to do once it ended.
Prepared = tuple[list[str], dict[str, str], dict[str, Any], Callable[[], list[str]]]


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


def _prepare(workspace: Path) -> tuple[Path, Path, dict[str, str]]:
    """The working folder (the workspace, resolved), a fresh scratch folder and the environment."""
    cwd = confine(workspace, ".")
    if not cwd.is_dir():
        raise ToolFailure(f"the workspace {str(workspace)!r} is not a folder")
    scratch = Path(tempfile.mkdtemp(prefix="agent-bash-"))
    (scratch / "home").mkdir()
    (scratch / "tmp").mkdir()
    return cwd, scratch, environment(scratch)


def _time_limit(requested: float) -> tuple[float, str | None]:
    """The timeout to use: the one asked for, lowered to fit inside the activity's own limit."""
    if not activity.in_activity():
        return requested, None
    info = activity.info()
    limits = []
    elapsed = (datetime.now(UTC) - info.started_time).total_seconds()
    if info.start_to_close_timeout:
        limits.append(info.start_to_close_timeout.total_seconds() - elapsed)
    if info.schedule_to_close_timeout:
        since = (datetime.now(UTC) - info.current_attempt_scheduled_time).total_seconds()
        limits.append(info.schedule_to_close_timeout.total_seconds() - since)
    if not limits or min(limits) - ACTIVITY_MARGIN_SECONDS >= requested:
        return requested, None
    lowered = max(1.0, min(limits) - ACTIVITY_MARGIN_SECONDS)
    return lowered, f"[timeout lowered from {requested:g} s to {lowered:.0f} s: the worker's tool time limit]"


class _Output:
    """The command's combined output: its first and last bytes, and how much came in all."""

    def __init__(self, head: int, tail: int) -> None:
        self.head_limit, self.tail_limit = head, tail
        self.head = bytearray()
        self.tail = bytearray()
        self.total = 0

    def add(self, chunk: bytes) -> None:
        self.total += len(chunk)
        room = self.head_limit - len(self.head)
        if room > 0:
            self.head += chunk[:room]
            chunk = chunk[room:]
        self.tail += chunk
        if len(self.tail) > 2 * self.tail_limit:  # trim now and then, not on every chunk
            del self.tail[: -self.tail_limit]

    def text(self) -> str:
        tail = bytes(self.tail[-self.tail_limit :])
        cut = self.total - len(self.head) - len(tail)
        middle = f"\n[… {cut} bytes of output cut here …]\n" if cut else ""
        return self.head.decode(errors="replace") + middle + tail.decode(errors="replace")


async def _drain(stream: asyncio.StreamReader, output: _Output) -> None:
    while chunk := await stream.read(65536):
        output.add(chunk)


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def _group_alive(pgid: int) -> bool:
    """Whether a process of the group is still running (exited ones waiting to be reaped are not)."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # kill() also reaches zombies, which only their parent (often init) can remove; on Linux,
    # look for a member that is not one.
    try:
        pids = [name for name in os.listdir("/proc") if name.isdigit()]
    except OSError:
        return True
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                # after the command name, which may hold anything: state, ppid, pgrp, ...
                state, _, group = f.read().rpartition(")")[2].split()[:3]
        except (OSError, ValueError):
            continue
        if group == str(pgid) and state not in ("Z", "X"):
            return True
    return False


async def stop_group(pgid: int) -> None:
    """SIGTERM the process group, give it ``KILL_GRACE_SECONDS``, then SIGKILL what is left."""
    if not await asyncio.to_thread(_group_alive, pgid):
        return
    _signal_group(pgid, signal.SIGTERM)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + KILL_GRACE_SECONDS
    try:
        while loop.time() < deadline:
            await asyncio.sleep(0.05)
            if not await asyncio.to_thread(_group_alive, pgid):
                return
    finally:
        # Also when a second cancel cuts the grace short: nothing of the group may outlive the call.
        _signal_group(pgid, signal.SIGKILL)


async def _wait_gone(pid: int, timeout: float) -> bool:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while await asyncio.to_thread(running, pid):
        if loop.time() >= deadline:
            return False
        await asyncio.sleep(0.02)
    return True


async def stop_sandbox(proc: asyncio.subprocess.Process) -> None:
    """SIGTERM all in the sandbox, give them ``KILL_GRACE_SECONDS``, then SIGKILL bwrap and its init.

    The namespace's init ignores SIGTERM, and killing it (or bwrap, which
    takes its init along) kills the rest: returns once the init is gone,
    which the kernel allows only once the whole namespace is.
    """
    if proc.returncode is not None:  # bwrap ends only after its init, so after all inside
        return
    init = await asyncio.to_thread(namespace_init, proc.pid)
    try:
        if init is not None:
            for pid in await asyncio.to_thread(namespace_members, init):
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGTERM)
            await _wait_gone(init, KILL_GRACE_SECONDS)
    finally:
        _signal_group(proc.pid, signal.SIGKILL)
        if init is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(init, signal.SIGKILL)
            await _wait_gone(init, KILL_GRACE_SECONDS)


@functools.cache
def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def _die_with_worker() -> Callable[[], None] | None:
    """A ``preexec_fn`` that has the kernel SIGKILL the shell when the worker dies (Linux only).

    It binds to the thread that starts the shell: the event loop's, which lives as long as the worker.
    """
    if not sys.platform.startswith("linux"):
        return None
    prctl = _libc().prctl
    worker, pr_set_pdeathsig, sigkill = os.getpid(), 1, int(signal.SIGKILL)

    def preexec() -> None:  # in the child between fork and exec: no imports, no locks
        prctl(pr_set_pdeathsig, sigkill)
        if os.getppid() != worker:  # the worker died before the prctl took hold
            os.kill(os.getpid(), sigkill)

    return preexec


async def _exited(proc: asyncio.subprocess.Process, timeout: float) -> bool:
    """Wait up to ``timeout`` for the shell to exit; whether it did.

    Not ``proc.wait()``: before Python 3.12 it also waits for the output pipe to
    close, which a process the command left in the background can hold open.
    """
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    pause = 0.005
    while proc.returncode is None:
        if loop.time() >= deadline:
            return False
        await asyncio.sleep(min(pause, max(0.0, deadline - loop.time())))
        pause = min(pause * 2, 0.1)
    return True


def _exit_note(code: int | None, sandboxed: bool) -> str:
    if code is not None and code < 0:
        return f"[killed by signal {signal.Signals(-code).name}]"
    if sandboxed and code is not None and code > 128 and code - 128 in signal.valid_signals():
        return f"[exit code {code}, as for a kill by {signal.Signals(code - 128).name}]"
    return f"[exit code {code}]"


def _command(
    args: BashArgs, settings: SandboxConfig, cwd: Path, scratch: Path, env: dict[str, str]
) -> Prepared:
    """The program to start, its environment, the subprocess options, and what to do once it ended.

    Blocking (it may probe the sandbox as the workspace's owner, make a cgroup): run it in a thread.
    """
    if settings.kind == "none":
        # The process bound is left out: without a user namespace the kernel counts all the
        # worker user's processes, not the call's.
        shell = limited(settings, SHELL, args.command, processes=False)
        return shell, env, {"preexec_fn": _die_with_worker()}, _nothing
    try:
        start = launch(settings, cwd, scratch, env, args.command)
    except SandboxUnavailable as exc:
        raise ToolFailure(f"the bash sandbox cannot run this command: {exc}") from None
    return start.argv, start.env, start.options(), start.close


def _nothing() -> list[str]:
    return []


async def _prepared(
    args: BashArgs, settings: SandboxConfig, cwd: Path, scratch: Path, env: dict[str, str]
) -> Prepared:
    """``_command`` in a thread; a cancel meanwhile lets it finish, then undoes it (its cgroup)."""
    work = asyncio.ensure_future(asyncio.to_thread(_command, args, settings, cwd, scratch, env))
    try:
        return await asyncio.shield(work)
    except asyncio.CancelledError:

        def undo(
            done: asyncio.Future[Prepared],
        ) -> None:
            if not done.cancelled() and done.exception() is None:
                done.result()[3]()

        work.add_done_callback(undo)
        raise


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
    timeout, timeout_note = _time_limit(args.timeout_seconds)
    cwd, scratch, env = await asyncio.to_thread(_prepare, workspace)

    async def stop() -> None:
        await (stop_sandbox(proc) if sandboxed else stop_group(proc.pid))

    ended: Callable[[], list[str]] = _nothing
    try:
        argv, env, options, ended = await _prepared(args, settings, cwd, scratch, env)
        try:
            proc = await asyncio.create_subprocess_exec(
                *argv,
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
        output = _Output(BASH_OUTPUT_HEAD_BYTES, BASH_OUTPUT_TAIL_BYTES)
        reader = asyncio.create_task(_drain(proc.stdout, output))
        try:
            timed_out = not await _exited(proc, timeout)
            await stop()
            await _exited(proc, KILL_GRACE_SECONDS)
            # With the group gone the output ends at once, unless a process escaped the group.
            done, _ = await asyncio.wait({reader}, timeout=DRAIN_SECONDS)
            stray = not done
        except BaseException:
            await stop()
            raise
        finally:
            reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reader
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
