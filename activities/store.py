"""The session store: where a run's latest logical checkpoint lives while it runs."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path
from typing import Protocol

from activities.files import fsync_dir, write_atomic
from durable_agent.canonical import canonical_bytes
from durable_agent.checkpoint import LoopCheckpoint, RunRecord


class SessionStore(Protocol):
    """A running run's logical checkpoint (by run id) and a session's ended runs.

    Implementations make every write durable before returning, and every
    operation safe to repeat (activities run at least once).
    """

    async def save_loop_checkpoint(self, checkpoint: LoopCheckpoint) -> None: ...

    async def load_loop_checkpoint(self, run_id: str) -> LoopCheckpoint | None: ...

    async def delete_loop_checkpoint(self, run_id: str) -> None: ...

    async def save_run_record(self, record: RunRecord) -> None: ...

    async def load_run_records(self, session_id: str) -> list[RunRecord]: ...


_SAFE = re.compile(r"[^A-Za-z0-9._-]")


def safe_name(key: str) -> str:
    """A file name for ``key`` that cannot climb out of its folder."""
    name = _SAFE.sub("_", key)
    return name if name.strip(".") else "_" + name


class FilesystemSessionStore:
    """One canonical JSON file a run, written atomically; survives worker restarts."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def _path(self, run_id: str) -> Path:
        return self.root / "runs" / f"{safe_name(run_id)}.checkpoint.json"

    async def save_loop_checkpoint(self, checkpoint: LoopCheckpoint) -> None:
        await asyncio.to_thread(write_atomic, self._path(checkpoint.run_id), canonical_bytes(checkpoint))

    async def load_loop_checkpoint(self, run_id: str) -> LoopCheckpoint | None:
        try:
            data = await asyncio.to_thread(self._path(run_id).read_bytes)
        except FileNotFoundError:
            return None
        return LoopCheckpoint.model_validate_json(data)

    async def delete_loop_checkpoint(self, run_id: str) -> None:
        path = self._path(run_id)

        def delete() -> None:
            path.unlink(missing_ok=True)
            if path.parent.exists():
                fsync_dir(path.parent)

        await asyncio.to_thread(delete)

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
        self.checkpoints: dict[str, LoopCheckpoint] = {}
        self.runs: dict[str, dict[str, RunRecord]] = {}

    async def save_loop_checkpoint(self, checkpoint: LoopCheckpoint) -> None:
        self.checkpoints[checkpoint.run_id] = checkpoint

    async def load_loop_checkpoint(self, run_id: str) -> LoopCheckpoint | None:
        return self.checkpoints.get(run_id)

    async def delete_loop_checkpoint(self, run_id: str) -> None:
        self.checkpoints.pop(run_id, None)

    async def save_run_record(self, record: RunRecord) -> None:
        self.runs.setdefault(record.snapshot.session_id, {})[record.snapshot.id] = record

    async def load_run_records(self, session_id: str) -> list[RunRecord]:
        records = self.runs.get(session_id, {}).values()
        return sorted(records, key=lambda r: (r.snapshot.created_at_ms, r.snapshot.id))
