"""Export sinks: where the host receives each acknowledged checkpoint export."""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from durable_agent.activities.files import fsync_dir, write_atomic, write_synced
from durable_agent.activities.sink_files import (
    newest_manifest,
    parts_present,
    read_export_file,
    read_manifest,
    whole_document,
    write_parted,
)
from durable_agent.activities.sink_manifest import HeaderCache
from durable_agent.activities.store.session_store import legacy_name, name_under
from durable_agent.core.errors import DurableAgentError
from durable_agent.core.export import ExportDescriptor, SessionCheckpointExportV1
from durable_agent.core.export_parts import PartedExport

__all__ = [
    "ExportSink",
    "FetchingSink",
    "FilesystemExportSink",
    "ObjectSink",
    "PartedSink",
    "SinkError",
    "read_export_file",
]


class SinkError(DurableAgentError):
    """A sink could not take an export. ``retryable=False`` stops retries at once.

    Args:
        message: Why the sink could not take the export (recorded on the run, with the
            sink's name).
        retryable: Whether Temporal may try the delivery again; ``False`` stops its retries
            at once.
    """

    def __init__(self, message: str, *, retryable: bool = True) -> None:
        super().__init__(message)
        self.retryable = retryable


class ExportSink(Protocol):
    """Returns only once the export is held durably. Must treat a repeat digest as done.

    A sink that can also give an export back (``FetchingSink``, as the filesystem sink
    is) lets a run that continued as new recover its state from its last export when the
    session store has lost it; one that takes an export as parts (``PartedSink``) stores
    only what is new. The worker tells them apart with ``isinstance``.
    ``durable_agent.conformance.check_sink`` holds a sink to this contract.
    """

    async def deliver(self, export: SessionCheckpointExportV1) -> None:
        """Hold ``export`` durably, then return.

        Args:
            export: The boundary's export, validated; its ``descriptor.content_digest``
                names it. A digest already held is done: return without writing.

        Raises:
            SinkError: The sink cannot hold it; ``retryable=False`` stops Temporal's retries
                at once. When the retries end, the run records the failed export and goes
                on. Raise it for every failure: any other exception fails the delivery too
                (and is retried), but the run cannot tell it from a failed save.
        """
        ...


@runtime_checkable
class PartedSink(ExportSink, Protocol):
    """A sink that can also take an export as parts (``durable_agent.core.export_parts``),
    to store only what is new since the run's last export; the worker then never
    joins the parts into one string. Same rules as ``deliver``."""

    async def deliver_parts(self, export: PartedExport) -> None:
        """Hold ``export``, given as parts, durably, then return; what the worker calls
        instead of ``deliver`` on a sink that has it.

        Args:
            export: The export as parts (``PartedExport``): store what is new since the
                run's last export; ``export.whole()`` gives it joined.

        Raises:
            SinkError: As ``deliver``.
        """
        ...


@runtime_checkable
class FetchingSink(ExportSink, Protocol):
    """A sink that can also give an export back: a run that continued as new recovers its
    state from its last export when the session store has lost it."""

    async def fetch(self, descriptor: ExportDescriptor) -> SessionCheckpointExportV1 | None:
        """The export this sink holds for ``descriptor``.

        Args:
            descriptor: The export's descriptor, as the run recorded it.

        Returns:
            The export as held (not yet validated), or ``None`` when the sink holds none.
        """
        ...


@runtime_checkable
class ObjectSink(ExportSink, Protocol):
    """A sink that also holds the workspace's files as git objects
    (``activities/workspace_tree.py``): content-addressed, each kept once, whatever run sent it.
    An object is git's loose object (zlib of ``"<type> <size>\\0<body>"``) named by its SHA-1
    (40 hex digits); the worker checks each against its id, both ways."""

    async def missing_objects(self, ids: Sequence[str]) -> list[str]:
        """Those of ``ids`` the sink does not hold, in their order.

        Raises:
            SinkError: The sink cannot say.
        """
        ...

    async def put_objects(self, objects: Mapping[str, bytes]) -> None:
        """Hold ``objects`` (id -> loose object) durably, then return; an id held is done.

        Raises:
            SinkError: As ``deliver``.
        """
        ...

    async def get_objects(self, ids: Sequence[str]) -> dict[str, bytes]:
        """The objects of ``ids`` the sink holds (id -> loose object); those it lacks are not in it.

        Raises:
            SinkError: The sink cannot be read.
        """
        ...


# Where the filesystem sink keeps objects: a name ``safe_name`` never gives a session (an
# escaped name has ``~`` then two hex digits).
OBJECTS_FOLDER = "~objects"


def object_id_checked(oid: str) -> str:
    """``oid``, if it is an object id (40 lowercase hex digits).

    Raises:
        SinkError: It is not (not retryable).
    """
    if len(oid) != 40 or any(c not in "0123456789abcdef" for c in oid):
        raise SinkError(f"{oid!r} is not an object id", retryable=False)
    return oid


class FilesystemExportSink:
    """One file an export: ``<root>/<session>/<run>/turn-000001-<digest>.json``.

    The name sorts in series order; a second delivery of the same digest finds
    its file and does nothing. ``deliver_parts`` (what the worker uses) writes a
    manifest there and what the boundary added under ``parts/``
    (``activities/sink_files.py``); ``deliver`` writes the descriptor and the
    content as one document. ``read_export_file`` and ``fetch`` give either
    back whole, so anyone can check ``sha256(content)``.
    """

    def __init__(self, root: Path) -> None:
        self.root = root
        # the newest manifest written in each run folder, so a boundary need not look for it
        self._newest: dict[Path, tuple[str, dict[str, Any]]] = {}
        # the parts' headers read so far: a boundary checks its chain without reading them again
        self._headers = HeaderCache()

    def object_path(self, oid: str) -> Path:
        """Where the object ``oid`` is: ``<root>/~objects/<2 hex>/<38 hex>``."""
        oid = object_id_checked(oid)
        return self.root / OBJECTS_FOLDER / oid[:2] / oid[2:]

    async def missing_objects(self, ids: Sequence[str]) -> list[str]:
        return await asyncio.to_thread(lambda: [oid for oid in ids if not self._renewed(oid)])

    def _renewed(self, oid: str) -> bool:
        """Whether the object is here. One that is gets a new mtime: the boundary asking counts on
        it until its export names it, and ``durable-agent gc`` keeps an object that young
        (``sink_gc/filesystem.py``)."""
        path = self.object_path(oid)
        try:
            os.utime(path)
        except FileNotFoundError:
            return False
        except OSError:  # another user's file, a read-only sink: there all the same
            return path.exists()
        return True

    async def put_objects(self, objects: Mapping[str, bytes]) -> None:
        def put() -> None:
            folders = set()
            for oid, data in objects.items():
                path = self.object_path(oid)
                if not path.exists():
                    write_synced(path, data)
                    folders.add(path.parent)
            for folder in folders:  # once a folder, not once an object
                fsync_dir(folder)

        try:
            await asyncio.to_thread(put)
        except OSError as exc:
            raise SinkError(f"cannot write objects under {self.root / OBJECTS_FOLDER}: {exc}") from exc

    async def get_objects(self, ids: Sequence[str]) -> dict[str, bytes]:
        def get() -> dict[str, bytes]:
            found = {}
            for oid in ids:
                with contextlib.suppress(FileNotFoundError):
                    found[oid] = self.object_path(oid).read_bytes()
            return found

        try:
            return await asyncio.to_thread(get)
        except OSError as exc:
            raise SinkError(f"cannot read objects under {self.root / OBJECTS_FOLDER}: {exc}") from exc

    def path_for(self, export: SessionCheckpointExportV1) -> Path:
        return self._path(export.descriptor)

    def _path(self, d: ExportDescriptor) -> Path:
        digest = d.content_digest.removeprefix("sha256:")
        folder = self.root / name_under(self.root, d.session_id) / name_under(self.root, d.run_id)
        return folder / f"turn-{d.turn:06d}-{digest[:16]}.json"

    async def deliver(self, export: SessionCheckpointExportV1) -> None:
        path = self.path_for(export)
        if path.exists():
            return
        data = whole_document(export)
        try:
            await asyncio.to_thread(write_atomic, path, data)
        except OSError as exc:
            raise SinkError(f"cannot write {path}: {exc}") from exc

    async def deliver_parts(self, export: PartedExport) -> None:
        path = self._path(export.descriptor)
        try:
            await asyncio.to_thread(self._deliver_parts, path, export)
        except OSError as exc:
            raise SinkError(f"cannot write {path} or its parts: {exc}") from exc

    def _deliver_parts(self, path: Path, export: PartedExport) -> None:
        """Write the export unless the sink holds it whole (one thread for both: a boundary's
        export comes here, and each hop to a thread costs a little)."""
        if not self._holds(path):
            self._write_parts(path, export)

    def _holds(self, path: Path) -> bool:
        """Whether the export's manifest is here with every part its chain needs (a machine that
        crashed after the manifest's rename may have lost a part, someone may have deleted
        one: the export is written again then, never acknowledged unreadable)."""
        if not path.exists():
            return False
        try:
            manifest = read_manifest(path)
        except (OSError, ValueError):
            return False
        return manifest is not None and parts_present(path.parent, manifest, self._headers)

    def _write_parts(self, path: Path, export: PartedExport) -> None:
        known = self._newest.get(path.parent)
        parent = (
            known[1] if known is not None and known[0] < path.name else newest_manifest(path.parent, path)
        )
        if parent is not None and not parts_present(path.parent, parent, self._headers):  # a part is gone
            parent = None
        manifest = write_parted(path, export, parent)
        if known is None or known[0] < path.name:
            self._newest[path.parent] = (path.name, manifest)
        while len(self._newest) > 64:  # runs that ended long ago
            del self._newest[next(iter(self._newest))]

    async def fetch(self, descriptor: ExportDescriptor) -> SessionCheckpointExportV1 | None:
        """The export this sink holds for ``descriptor``, if any (not yet validated)."""
        path = self._path(descriptor)
        try:
            return await asyncio.to_thread(read_export_file, path)
        except FileNotFoundError:
            pass
        # written by an earlier version under a session folder other ids shared: only if it is this one
        legacy = self.root / legacy_name(descriptor.session_id) / path.parent.name / path.name
        if legacy == path:
            return None
        try:
            export = await asyncio.to_thread(read_export_file, legacy)
        except FileNotFoundError:
            return None
        return export if export.descriptor == descriptor else None
