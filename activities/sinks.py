"""Export sinks: where the host receives each acknowledged checkpoint export."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Protocol

from durable_agent.activities.files import write_atomic
from durable_agent.activities.store.base import safe_name
from durable_agent.core.export import ExportDescriptor, SessionCheckpointExportV1, load_export


class SinkError(Exception):
    """A sink could not take an export. ``retryable=False`` stops retries at once."""

    def __init__(self, message: str, *, retryable: bool = True) -> None:
        super().__init__(message)
        self.retryable = retryable


class ExportSink(Protocol):
    """Returns only once the export is held durably. Must treat a repeat digest as done.

    A sink that can also give an export back (``fetch``, as the filesystem sink
    does) lets a run that continued as new recover its state from its last
    export when the session store has lost it.
    """

    async def deliver(self, export: SessionCheckpointExportV1) -> None: ...


class FilesystemExportSink:
    """One JSON file an export: ``<root>/<session>/<run>/turn-000001-<digest>.json``.

    The name sorts in series order; a second delivery of the same digest finds
    its file and does nothing. The file holds the descriptor and the content as
    a string, so anyone can check ``sha256(content)``.
    """

    def __init__(self, root: Path) -> None:
        self.root = root

    def path_for(self, export: SessionCheckpointExportV1) -> Path:
        return self._path(export.descriptor)

    def _path(self, d: ExportDescriptor) -> Path:
        digest = d.content_digest.removeprefix("sha256:")
        folder = self.root / safe_name(d.session_id) / safe_name(d.run_id)
        return folder / f"turn-{d.turn:06d}-{digest[:16]}.json"

    async def deliver(self, export: SessionCheckpointExportV1) -> None:
        path = self.path_for(export)
        if path.exists():
            return
        document = {
            "descriptor": export.descriptor.model_dump(mode="json"),
            "content": export.content,
        }
        data = json.dumps(document, indent=2, ensure_ascii=False).encode("utf-8") + b"\n"
        try:
            await asyncio.to_thread(write_atomic, path, data)
        except OSError as exc:
            raise SinkError(f"cannot write {path}: {exc}") from exc

    async def fetch(self, descriptor: ExportDescriptor) -> SessionCheckpointExportV1 | None:
        """The export this sink holds for ``descriptor``, if any (not yet validated)."""
        path = self._path(descriptor)
        try:
            return await asyncio.to_thread(read_export_file, path)
        except FileNotFoundError:
            return None


def read_export_file(path: Path) -> SessionCheckpointExportV1:
    """Read a file the filesystem sink wrote, within the JSON limits (call ``open()`` to validate it)."""
    return load_export(path.read_bytes())
