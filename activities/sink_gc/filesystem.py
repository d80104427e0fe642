"""Collecting the filesystem sink (``sink_gc/rules.py`` has the rules): run folders one at a time, then
the objects under ``~objects/``.

A worker may write while this runs. Exports and parts written after the run folder was listed
are not seen, so they stay; a part older than the grace period that no kept manifest's chain
needs goes. An object goes only when no kept export's tree nor recent object reaches it, and its
mtime is older than the grace period: the sink's ``missing_objects`` renews the mtime of every
object a boundary finds there (the boundary then counts on it), and an object is first renamed
aside, its mtime looked at again, and only then deleted, so that an object renewed at that
moment is put back, and a boundary that looks for it meanwhile does not find it and writes it
again.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from pathlib import Path

from durable_agent.activities.sink_files import PARTS, PartReader, folder_reader
from durable_agent.activities.sink_gc.refs import StoredExport, kept_exports, stored_export
from durable_agent.activities.sink_gc.rules import GcOptions, GcReport, Tally
from durable_agent.activities.sink_manifest import ManifestError, part_name
from durable_agent.activities.sinks import OBJECTS_FOLDER, FilesystemExportSink

# What an object is renamed to while gc decides (a name no id has: ``missing_objects`` never sees it).
ASIDE = ".gc"


class _Collection(Tally):
    """One collection of one filesystem sink."""

    def __init__(self, name: str, sink: FilesystemExportSink, options: GcOptions) -> None:
        super().__init__(name, "filesystem", options)
        self.sink = sink
        _, self.cutoff, self.young_after = options.started()

    # --- exports and parts ------------------------------------------------------------------

    def exports(self) -> set[str]:
        """Collect every run folder's exports and parts; the trees the kept exports need."""
        trees: set[str] = set()
        for session in _folders(self.sink.root):
            if session.name != OBJECTS_FOLDER:
                for run in _folders(session):
                    trees |= self._run(run)
        return trees

    def _run(self, folder: Path) -> set[str]:
        exports = [_read(path) for path in sorted(folder.glob("turn-*.json"))]
        reader = PartReader(folder_reader(folder / PARTS))
        keep, trees, parts = self.run_needs(exports, kept_exports(exports, self.cutoff), reader)
        for export, kept in zip(exports, keep, strict=True):
            if kept:
                self.counts["exports_kept"] += 1
            elif self._remove(Path(export.name), export.size):
                self.counts["exports_removed"] += 1
                self.removed.append(export.name)
        self._parts(folder / PARTS, parts)
        return trees

    def _parts(self, folder: Path, needed: set[str] | None) -> None:
        """Remove the old parts no kept manifest needs (``needed`` None: keep every part)."""
        try:
            names = sorted(os.listdir(folder))
        except FileNotFoundError:
            return
        for name in names:
            try:
                part_name(name)
            except ManifestError:
                continue  # a temporary file of a write under way, or not the sink's
            path = folder / name
            try:
                st = path.stat()
            except FileNotFoundError:
                continue
            if needed is None or name in needed or st.st_mtime >= self.young_after:
                self.counts["parts_kept"] += 1
            elif self._remove(path, st.st_size):
                self.counts["parts_removed"] += 1

    def _remove(self, path: Path, size: int) -> bool:
        """Remove ``path`` (not in a dry run), counting its bytes; False when it was gone already."""
        if not self.options.dry_run:
            try:
                path.unlink()
            except FileNotFoundError:
                return False
        self.counts["bytes_freed"] += size
        return True

    # --- objects ----------------------------------------------------------------------------

    def held_objects(self) -> dict[str, tuple[float, int]]:
        """The objects here (id -> mtime, size). One a gc that was interrupted left aside is put
        back first (a boundary may have counted on it at that moment): this gc decides again."""
        held: dict[str, tuple[float, int]] = {}
        for folder in _folders(self.sink.root / OBJECTS_FOLDER):
            for path in sorted(folder.iterdir(), key=lambda p: p.name.endswith(ASIDE)):
                oid = folder.name + path.name.removesuffix(ASIDE)
                if len(oid) != 40 or any(c not in "0123456789abcdef" for c in oid):
                    continue  # a temporary file of a write under way
                with contextlib.suppress(FileNotFoundError):
                    if path.name.endswith(ASIDE) and not self.options.dry_run:
                        if oid in held:  # written again since: the copy aside is not needed
                            path.unlink()
                            continue
                        os.rename(path, self.sink.object_path(oid))
                        path = self.sink.object_path(oid)
                    st = path.stat()
                    held.setdefault(oid, (st.st_mtime, st.st_size))
        return held

    def remove_objects(self, ids: list[str]) -> tuple[int, int]:
        """Remove ``ids``, each renamed aside first (see the module's docstring); how many went
        and their bytes."""
        count = size = 0
        for oid in ids:
            freed = self._remove_object(self.sink.object_path(oid))
            if freed is not None:
                count += 1
                size += freed
        return count, size

    def _remove_object(self, path: Path) -> int | None:
        if self.options.dry_run:
            try:
                return path.stat().st_size
            except FileNotFoundError:
                return None
        moved = path.with_name(path.name + ASIDE)
        try:
            os.rename(path, moved)
        except FileNotFoundError:
            return None
        st = moved.stat()
        if st.st_mtime >= self.young_after:  # a boundary found it a moment ago and counts on it
            os.rename(moved, path)
            return None
        moved.unlink()
        return st.st_size


def _folders(folder: Path) -> list[Path]:
    try:
        return sorted(p for p in folder.iterdir() if p.is_dir() and not p.name.startswith("."))
    except FileNotFoundError:
        return []


def _read(path: Path) -> StoredExport:
    digits = path.name[5:11]
    turn = int(digits) if digits.isdigit() else -1
    try:
        return stored_export(str(path), turn, path.read_bytes())
    except OSError as exc:
        return StoredExport(str(path), turn, 0, None, None, f"{path} cannot be read: {exc}")


async def collect_filesystem(name: str, sink: FilesystemExportSink, options: GcOptions) -> GcReport:
    """Collect a filesystem sink (see the module's docstring and ``sink_gc/rules.py``).

    Args:
        name: The sink's name in the config (for the report).
        sink: The sink.
        options: The retention, the grace period, whether to remove anything.

    Returns:
        What was removed and kept.
    """
    collection = _Collection(name, sink, options)
    trees = await asyncio.to_thread(collection.exports)
    held = await asyncio.to_thread(collection.held_objects)
    young = [oid for oid, (mtime, _) in held.items() if mtime >= collection.young_after]
    gone = await collection.unreached(held, young, trees, sink.get_objects)
    removed, freed = await asyncio.to_thread(collection.remove_objects, gone)
    collection.counts["bytes_freed"] += freed
    return collection.report(removed, len(held) - removed)
