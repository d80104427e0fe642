"""The session store: where a run's latest logical checkpoint lives while it runs."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path
from typing import Protocol

from activities.files import fsync_dir, write_atomic
from durable_agent.canonical import canonical_bytes
from durable_agent.checkpoint import LoopCheckpoint


class SessionStore(Protocol):
    """Keyed by run id. Implementations must make ``save`` durable before returning."""

    async def save_loop_checkpoint(self, checkpoint: LoopCheckpoint) -> None: ...

    async def load_loop_checkpoint(self, run_id: str) -> LoopCheckpoint | None: ...

    async def delete_loop_checkpoint(self, run_id: str) -> None: ...


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


class MemorySessionStore:
    """A store in memory, for tests and embedding."""

    def __init__(self) -> None:
        self.checkpoints: dict[str, LoopCheckpoint] = {}

    async def save_loop_checkpoint(self, checkpoint: LoopCheckpoint) -> None:
        self.checkpoints[checkpoint.run_id] = checkpoint

    async def load_loop_checkpoint(self, run_id: str) -> LoopCheckpoint | None:
        return self.checkpoints.get(run_id)

    async def delete_loop_checkpoint(self, run_id: str) -> None:
        self.checkpoints.pop(run_id, None)
