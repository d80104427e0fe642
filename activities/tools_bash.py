"""The ``bash`` tool: one command, in the workspace, in its own process group.

The command runs as ``/bin/bash -c COMMAND`` with the workspace as its
working folder, stdin from /dev/null and an environment built from an
allowlist (``environment``), so the worker's credentials (model API keys,
Temporal certificates, cloud tokens) never reach it. HOME and TMPDIR point
into a temporary folder made for the call and removed after it.

The shell starts a new session, so it and everything it starts share one
process group, which is stopped as a whole (SIGTERM, then SIGKILL after
``KILL_GRACE_SECONDS``) when the command times out, when the run is
cancelled, and when the shell exits leaving processes behind. A process that
starts a session of its own (``setsid``, a daemon) escapes the group; nothing
short of a container would stop it.

A repeat (Temporal runs activities at least once, so a call may run again
after a worker crash) runs the command again. The tool cannot make an
arbitrary command safe to repeat; permission rules should allow only
commands that are (tests, builds, reads) and ask for the others.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import pwd
import shutil
import signal
import tempfile
from datetime import UTC, datetime
from pathlib import Path

from temporalio import activity

from activities.tools import ToolFailure, confine
from durable_agent.tool_args import BASH_OUTPUT_HEAD_BYTES, BASH_OUTPUT_TAIL_BYTES, BashArgs

SHELL = "/bin/bash"
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


def _exit_note(code: int | None) -> str:
    if code is not None and code < 0:
        return f"[killed by signal {signal.Signals(-code).name}]"
    return f"[exit code {code}]"


async def bash(args: BashArgs, workspace: Path) -> str:
    """Run ``command`` in the workspace; return its output and exit code.

    A non-zero exit code is reported, not a failure; a timeout is a failure
    (``ToolFailure``) that carries the output so far. On timeout and on
    cancel (``asyncio.CancelledError``) the whole process group is stopped
    before the call returns or the cancel goes on; processes the command
    leaves running when it ends are stopped too. A repeat runs the command
    again.
    """
    timeout, timeout_note = _time_limit(args.timeout_seconds)
    cwd, scratch, env = await asyncio.to_thread(_prepare, workspace)
    try:
        try:
            proc = await asyncio.create_subprocess_exec(
                SHELL,
                "-c",
                args.command,
                cwd=cwd,
                env=env,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.STDOUT,
                start_new_session=True,  # its own process group, id = its pid
            )
        except OSError as exc:
            raise ToolFailure(f"cannot start {SHELL}: {exc.strerror or exc}") from None
        assert proc.stdout is not None
        output = _Output(BASH_OUTPUT_HEAD_BYTES, BASH_OUTPUT_TAIL_BYTES)
        reader = asyncio.create_task(_drain(proc.stdout, output))
        try:
            timed_out = not await _exited(proc, timeout)
            await stop_group(proc.pid)
            await _exited(proc, KILL_GRACE_SECONDS)
            # With the group gone the output ends at once, unless a process escaped the group.
            done, _ = await asyncio.wait({reader}, timeout=DRAIN_SECONDS)
            stray = not done
        except BaseException:
            await stop_group(proc.pid)
            raise
        finally:
            reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reader
    finally:
        await asyncio.to_thread(shutil.rmtree, scratch, ignore_errors=True)
    notes = [n for n in (timeout_note,) if n]
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
    return "\n".join([body, *notes, _exit_note(proc.returncode)])
