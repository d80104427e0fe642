"""Commands in a subprocess, as the ``bash`` tool and the ``agent.hook`` activity run them.

What the two share: the call's working folder, scratch HOME and TMPDIR and allowlisted
environment (``scratch.py``); the timeout, fitted inside the activity's own limit; the start,
directly (in a process group of its own, dying with the worker) or in the sandbox
(``sandbox.py``); output kept to its first and last bytes; and the stop of everything the
command started, on timeout, on cancel and when it exits leaving processes behind. ``bash.py``
tells how.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import functools
import os
import signal
import sys
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
)
from durable_agent.activities.tools.sandbox_limits import SandboxUnavailable, limited
from durable_agent.activities.tools.tool import ToolFailure
from durable_agent.config import SandboxConfig

KILL_GRACE_SECONDS = 2.0
# Kept free of the activity's own time limit: to stop the command and report, instead of the
# activity timing out, being retried and running the command again.
ACTIVITY_MARGIN_SECONDS = 10.0
# How long to wait for the output to end once the command's processes are gone: only a
# process outside the group (see the module docs) can hold it open longer.
DRAIN_SECONDS = 1.0
# The program to start, its environment, its subprocess options, and what to do once it ended.
Prepared = tuple[list[str], dict[str, str], dict[str, Any], Callable[[], list[str]]]


def time_limit(requested: float) -> tuple[float, str | None]:
    """The timeout to use: the one asked for, lowered to fit inside the activity's own limit.

    Args:
        requested: The timeout asked for, in seconds.

    Returns:
        The timeout to use and, when it was lowered, a note that says so.
    """
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


class BoundedOutput:
    """The command's combined output: its first and last bytes, and how much came in all."""

    def __init__(self, head: int, tail: int) -> None:
        self.head_limit, self.tail_limit = head, tail
        self.head = bytearray()
        self.tail = bytearray()
        self.total = 0

    def add(self, chunk: bytes) -> None:
        """Keep what fits of ``chunk`` in the head, the rest in the tail, and count it."""
        self.total += len(chunk)
        room = self.head_limit - len(self.head)
        if room > 0:
            self.head += chunk[:room]
            chunk = chunk[room:]
        self.tail += chunk
        if len(self.tail) > 2 * self.tail_limit:  # trim now and then, not on every chunk
            del self.tail[: -self.tail_limit]

    def text(self) -> str:
        """The output kept, with a note of how many bytes were cut from its middle."""
        tail = bytes(self.tail[-self.tail_limit :])
        cut = self.total - len(self.head) - len(tail)
        middle = f"\n[… {cut} bytes of output cut here …]\n" if cut else ""
        return self.head.decode(errors="replace") + middle + tail.decode(errors="replace")


async def drain(stream: asyncio.StreamReader, output: BoundedOutput) -> None:
    """Read ``stream`` into ``output`` until it ends."""
    while chunk := await stream.read(65536):
        output.add(chunk)


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def group_alive(pgid: int) -> bool:
    """Whether a process of the group is still running (exited ones waiting to be reaped are not).

    Args:
        pgid: The process group's id.

    Returns:
        True while a live member is left.
    """
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
    if not await asyncio.to_thread(group_alive, pgid):
        return
    _signal_group(pgid, signal.SIGTERM)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + KILL_GRACE_SECONDS
    try:
        while loop.time() < deadline:
            await asyncio.sleep(0.05)
            if not await asyncio.to_thread(group_alive, pgid):
                return
    finally:
        # Also when a second cancel cuts the grace short: nothing of the group may outlive the call.
        _signal_group(pgid, signal.SIGKILL)


async def start_command(argv: list[str], sandboxed: bool, **options: Any) -> asyncio.subprocess.Process:
    """``asyncio.create_subprocess_exec(*argv, **options)``, whose processes a cancel does not
    leave running.

    A cancel while asyncio connects the new process's pipes (long enough, on a loaded machine,
    for the command to have started children) closes them and kills that one process, not
    its group or sandbox: here the start is let finish, then everything the command started
    is stopped, as ``supervise`` stops it, before the cancel goes on.

    Args:
        argv: The program and its arguments.
        sandboxed: Whether it is the sandbox (bwrap) rather than the command itself.
        options: ``create_subprocess_exec``'s (``start_new_session=True`` unsandboxed).

    Returns:
        The started process.
    """
    spawn = asyncio.ensure_future(asyncio.create_subprocess_exec(*argv, **options))
    try:
        return await asyncio.shield(spawn)
    except asyncio.CancelledError:
        with contextlib.suppress(Exception):  # one that did not start has nothing to stop
            proc = await spawn
            await (stop_sandbox(proc) if sandboxed else stop_group(proc.pid))
            await asyncio.wait_for(proc.wait(), KILL_GRACE_SECONDS)
        raise


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


async def exited(proc: asyncio.subprocess.Process, timeout: float) -> bool:
    """Wait up to ``timeout`` for the shell to exit.

    Args:
        proc: The shell (or bwrap).
        timeout: How long to wait, in seconds.

    Returns:
        Whether it exited. Not ``proc.wait()``: before Python 3.12 it also waits for the output pipe to
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


def _command(
    command: str, settings: SandboxConfig, cwd: Path, scratch: Path, env: dict[str, str]
) -> Prepared:
    """The program to start, its environment, the subprocess options, and what to do once it ended.

    Blocking (it may probe the sandbox as the workspace's owner, make a cgroup): run it in a thread.
    """
    if settings.kind == "none":
        # The process bound is left out: without a user namespace the kernel counts all the
        # worker user's processes, not the call's.
        shell = limited(settings, SHELL, command, processes=False)
        return shell, env, {"preexec_fn": _die_with_worker()}, nothing
    try:
        start = launch(settings, cwd, scratch, env, command)
    except SandboxUnavailable as exc:
        raise ToolFailure(f"the bash sandbox cannot run this command: {exc}") from None
    return start.argv, start.env, start.options(), start.close


async def supervise(
    proc: asyncio.subprocess.Process,
    timeout: float,
    sandboxed: bool,
    readers: list[asyncio.Task[None]],
    others: tuple[asyncio.Task[None], ...] = (),
) -> tuple[bool, bool]:
    """Wait for the command, then stop all it started; its readers get ``DRAIN_SECONDS`` to end.

    Everything is stopped also when the wait is cancelled; the tasks are cancelled at the end.

    Args:
        proc: The started command (in a process group of its own, or bwrap).
        timeout: How long it may run, in seconds.
        sandboxed: Whether it runs in the sandbox (bwrap) rather than directly.
        readers: The tasks that read its output.
        others: Other tasks of the call (a writer of its stdin).

    Returns:
        Whether it timed out, and whether a reader was still open after the drain (a process
        that left its group holds the output).
    """

    async def stop() -> None:
        await (stop_sandbox(proc) if sandboxed else stop_group(proc.pid))

    try:
        timed_out = not await exited(proc, timeout)
        await stop()
        await exited(proc, KILL_GRACE_SECONDS)
        # With the group gone the output ends at once, unless a process escaped the group.
        _, pending = await asyncio.wait(readers, timeout=DRAIN_SECONDS)
    except BaseException:
        await stop()
        raise
    finally:
        for task in (*others, *readers):
            task.cancel()
        for task in (*others, *readers):
            with contextlib.suppress(asyncio.CancelledError):
                await task
    return timed_out, bool(pending)


def nothing() -> list[str]:
    """What to do after a command that needs no undoing: nothing, and no notes."""
    return []


async def prepared(
    command: str, settings: SandboxConfig, cwd: Path, scratch: Path, env: dict[str, str]
) -> Prepared:
    """The start of ``command``, made in a thread; a cancel meanwhile lets it finish, then undoes it.

    Args:
        command: The shell command, for ``/bin/bash -c``.
        settings: Where it runs: directly or in the sandbox.
        cwd: Its working folder (from ``prepare_call``).
        scratch: The call's scratch folder (from ``prepare_call``).
        env: Its environment (from ``prepare_call``).

    Returns:
        The program to start, its environment, its subprocess options, and what to do once it
        ended (undo its cgroup; returns notes for the output).

    Raises:
        ToolFailure: The sandbox cannot run the command.
    """
    work = asyncio.ensure_future(asyncio.to_thread(_command, command, settings, cwd, scratch, env))
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
