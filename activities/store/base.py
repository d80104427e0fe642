"""The session store: a running run's log and header, and a session's ended runs.

The workflow never passes a run's whole conversation through Temporal: it
appends what is new to the run's log here (``durable_agent.core.run_log``), and the
activities read the rest from here. The filesystem store is the default; a
shared store (PostgreSQL, an S3-compatible bucket) implements the same
protocol, and the workflow does not change.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Protocol

from durable_agent.core.export import RunRecord
from durable_agent.core.run_log import GENESIS, LogEntry, LogRef, RunHeader, StateMissing


class SessionStore(Protocol):
    """Where runs keep their state between activities, on any worker that shares it.

    Implementations make every write durable before returning and every
    operation safe to repeat (activities run at least once). A run's log is a
    chain of entries by version: ``append_log`` refuses, with ``StateMissing``,
    an entry that does not follow what is stored, and an entry written at a
    version replaces the one there and drops those after it (a run that went
    back, e.g. after a Temporal reset, overwrites its abandoned branch).
    """

    async def save_header(self, header: RunHeader) -> None: ...

    async def load_header(self, run_id: str) -> RunHeader | None: ...

    async def append_log(self, run_id: str, entries: Sequence[LogEntry]) -> None:
        """Store contiguous ``entries``; the first follows the stored entry before it,
        or starts the log (version 1 on ``GENESIS``), or replaces the state outright."""
        ...

    async def read_log(self, run_id: str, after: int, upto: int) -> list[LogEntry]:
        """Stored entries with ``after < version <= upto``, in order; missing ones are left out."""
        ...

    async def log_head(self, run_id: str) -> LogRef | None:
        """The newest stored entry of the run's log, ``None`` when it has none."""
        ...

    async def stage_text(self, run_id: str, digest: str, text: str) -> None:
        """Keep a tool's output by its digest until the save that names it."""
        ...

    async def staged_text(self, run_id: str, digest: str) -> str | None: ...

    async def drop_run(self, run_id: str) -> None:
        """Forget an ended run's header, log and staged outputs (its record stays)."""
        ...

    async def save_run_record(self, record: RunRecord) -> None: ...

    async def load_run_records(self, session_id: str) -> list[RunRecord]: ...


_SAFE = re.compile(r"[^A-Za-z0-9._-]")


def safe_name(key: str) -> str:
    """A file name for ``key`` that cannot climb out of its folder."""
    name = _SAFE.sub("_", key)
    return name if name.strip(".") else "_" + name


def follows(first: LogEntry, before: LogEntry | None) -> bool:
    """Whether ``first`` may be stored after ``before`` (the stored entry at its version - 1)."""
    if first.delta.replace:
        return True
    return first.parent == (GENESIS if first.version == 1 else (before.digest if before else None))


def not_following(run_id: str, first: LogEntry, head: LogRef | None) -> StateMissing:
    return StateMissing(
        f"the store does not hold version {first.version - 1} of run {run_id!r}'s log "
        f"with digest {first.parent}",
        head,
    )
