"""The session store: a running run's log and header, and a session's ended runs.

The workflow never passes a run's whole conversation through Temporal: it
appends what is new to the run's log here (``durable_agent.run_log``), and the
activities read the rest from here. The filesystem store is the default; a
shared store (PostgreSQL, an S3-compatible bucket) implements the same
protocol, and the workflow does not change.
"""

from __future__ import annotations

import asyncio
import re
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol

from activities.files import fsync_dir, write_atomic
from durable_agent.canonical import canonical_bytes
from durable_agent.checkpoint import RunRecord
from durable_agent.run_log import GENESIS, LogEntry, LogRef, RunHeader, StateMissing


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


class FilesystemSessionStore:
    """Files under ``root``: ``runs/<run>/`` holds a running run, ``sessions/<session>/`` ended runs.

    A log entry is one canonical JSON file, written atomically; appending does
    not rewrite what is there, so a long run's saves stay the size of what is new.
    """

    def __init__(self, root: Path) -> None:
        self.root = root

    def _run_dir(self, run_id: str) -> Path:
        return self.root / "runs" / safe_name(run_id)

    def _entry_path(self, run_id: str, version: int) -> Path:
        return self._run_dir(run_id) / "log" / f"{version:010d}.json"

    async def save_header(self, header: RunHeader) -> None:
        path = self._run_dir(header.run_id) / "header.json"
        await asyncio.to_thread(write_atomic, path, canonical_bytes(header))

    async def load_header(self, run_id: str) -> RunHeader | None:
        path = self._run_dir(run_id) / "header.json"
        try:
            data = await asyncio.to_thread(path.read_bytes)
        except FileNotFoundError:
            return None
        return RunHeader.model_validate_json(data)

    def _read_entry(self, run_id: str, version: int) -> LogEntry | None:
        try:
            return LogEntry.model_validate_json(self._entry_path(run_id, version).read_bytes())
        except FileNotFoundError:
            return None

    def _versions(self, run_id: str) -> list[int]:
        folder = self._run_dir(run_id) / "log"
        if not folder.is_dir():
            return []
        return sorted(int(p.stem) for p in folder.glob("*.json") if p.stem.isdigit())

    def _head(self, run_id: str) -> LogRef | None:
        versions = self._versions(run_id)
        entry = self._read_entry(run_id, versions[-1]) if versions else None
        return entry.ref(run_id) if entry else None

    async def append_log(self, run_id: str, entries: Sequence[LogEntry]) -> None:
        if not entries:
            return

        def append() -> None:
            first = entries[0]
            before = self._read_entry(run_id, first.version - 1) if first.version > 1 else None
            if not follows(first, before):
                raise not_following(run_id, first, self._head(run_id))
            for entry in entries:
                write_atomic(self._entry_path(run_id, entry.version), canonical_bytes(entry))
            stale = [v for v in self._versions(run_id) if v > entries[-1].version]
            for version in stale:
                self._entry_path(run_id, version).unlink(missing_ok=True)
            if stale:
                fsync_dir(self._entry_path(run_id, 1).parent)

        await asyncio.to_thread(append)

    async def read_log(self, run_id: str, after: int, upto: int) -> list[LogEntry]:
        def read() -> list[LogEntry]:
            out = []
            for version in self._versions(run_id):
                if after < version <= upto and (entry := self._read_entry(run_id, version)) is not None:
                    out.append(entry)
            return out

        return await asyncio.to_thread(read)

    async def log_head(self, run_id: str) -> LogRef | None:
        return await asyncio.to_thread(self._head, run_id)

    def _staged_path(self, run_id: str, digest: str) -> Path:
        return self._run_dir(run_id) / "staged" / f"{safe_name(digest.removeprefix('sha256:'))}.txt"

    async def stage_text(self, run_id: str, digest: str, text: str) -> None:
        await asyncio.to_thread(write_atomic, self._staged_path(run_id, digest), text.encode("utf-8"))

    async def staged_text(self, run_id: str, digest: str) -> str | None:
        try:
            data = await asyncio.to_thread(self._staged_path(run_id, digest).read_bytes)
        except FileNotFoundError:
            return None
        return data.decode("utf-8")

    async def drop_run(self, run_id: str) -> None:
        folder = self._run_dir(run_id)

        def drop() -> None:
            shutil.rmtree(folder, ignore_errors=True)
            if folder.parent.exists():
                fsync_dir(folder.parent)

        await asyncio.to_thread(drop)

    def _session_dir(self, session_id: str) -> Path:
        return self.root / "sessions" / safe_name(session_id)

    async def save_run_record(self, record: RunRecord) -> None:
        path = self._session_dir(record.snapshot.session_id) / f"{safe_name(record.snapshot.id)}.run.json"
        await asyncio.to_thread(write_atomic, path, canonical_bytes(record))

    async def load_run_records(self, session_id: str) -> list[RunRecord]:
        folder = self._session_dir(session_id)

        def load() -> list[RunRecord]:
            if not folder.is_dir():
                return []
            return [RunRecord.model_validate_json(p.read_bytes()) for p in folder.glob("*.run.json")]

        records = await asyncio.to_thread(load)
        return sorted(records, key=lambda r: (r.snapshot.created_at_ms, r.snapshot.id))


class MemorySessionStore:
    """A store in memory, for tests and embedding."""

    def __init__(self) -> None:
        self.headers: dict[str, RunHeader] = {}
        self.logs: dict[str, dict[int, LogEntry]] = {}
        self.staged: dict[tuple[str, str], str] = {}
        self.runs: dict[str, dict[str, RunRecord]] = {}

    async def save_header(self, header: RunHeader) -> None:
        self.headers[header.run_id] = header

    async def load_header(self, run_id: str) -> RunHeader | None:
        return self.headers.get(run_id)

    async def append_log(self, run_id: str, entries: Sequence[LogEntry]) -> None:
        if not entries:
            return
        log = self.logs.setdefault(run_id, {})
        first = entries[0]
        if not follows(first, log.get(first.version - 1)):
            raise not_following(run_id, first, await self.log_head(run_id))
        for entry in entries:
            log[entry.version] = entry
        for version in [v for v in log if v > entries[-1].version]:
            del log[version]

    async def read_log(self, run_id: str, after: int, upto: int) -> list[LogEntry]:
        log = self.logs.get(run_id, {})
        return [log[v] for v in sorted(log) if after < v <= upto]

    async def log_head(self, run_id: str) -> LogRef | None:
        log = self.logs.get(run_id)
        return log[max(log)].ref(run_id) if log else None

    async def stage_text(self, run_id: str, digest: str, text: str) -> None:
        self.staged[(run_id, digest)] = text

    async def staged_text(self, run_id: str, digest: str) -> str | None:
        return self.staged.get((run_id, digest))

    async def drop_run(self, run_id: str) -> None:
        self.headers.pop(run_id, None)
        self.logs.pop(run_id, None)
        for key in [k for k in self.staged if k[0] == run_id]:
            del self.staged[key]

    async def save_run_record(self, record: RunRecord) -> None:
        self.runs.setdefault(record.snapshot.session_id, {})[record.snapshot.id] = record

    async def load_run_records(self, session_id: str) -> list[RunRecord]:
        records = self.runs.get(session_id, {}).values()
        return sorted(records, key=lambda r: (r.snapshot.created_at_ms, r.snapshot.id))
