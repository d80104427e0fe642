"""What an export in a sink needs, for ``durable-agent gc`` (``sink_gc/rules.py``): its time, the trees
its run's events make it need, the parts of its chain, and the objects those trees reach.

Read from the stored JSON (a manifest with its parts, or a whole document), not through the
typed models: events of any version count, and a manifest's time is read without its parts.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from durable_agent.activities.sink_files import MANIFEST_SCHEMA, PartReader
from durable_agent.activities.sink_manifest import ManifestError, missing_part, parse_json
from durable_agent.activities.sinks import SinkError, object_id_checked
from durable_agent.activities.workspaces.objects import _tree_entries

__all__ = [
    "Needs",
    "StoredExport",
    "TreeWalk",
    "export_needs",
    "kept_exports",
    "stored_export",
    "trees_needed",
    "walk_trees",
]

# Objects read from a sink at once while following trees.
WALK_BATCH: Final = 500


@dataclass(frozen=True)
class Needs:
    """What one export needs besides itself: trees (their objects) and parts (by name)."""

    trees: frozenset[str]
    parts: frozenset[str]


@dataclass(frozen=True)
class StoredExport:
    """One export as its sink holds it: ``document`` the manifest or whole document (None and
    ``problem`` said when it cannot be read), ``time_ms`` its ``checkpoint_ms``."""

    name: str
    turn: int
    size: int
    document: dict[str, Any] | None
    time_ms: int | None
    problem: str | None = None


def stored_export(name: str, turn: int, data: bytes) -> StoredExport:
    """An export's stored bytes, read as far as gc needs: the document and the export's time.

    Args:
        name: How the report names it (a file's path, ``pg:SESSION/RUN/TURN``).
        turn: Its turn.
        data: The manifest or whole document as stored.

    Returns:
        The export; one with ``problem`` set (and kept) when the bytes are not an export.
    """
    try:
        document = parse_json(data, name)
        if not isinstance(document, dict):
            raise ManifestError(f"{name} is not a JSON object")
        return StoredExport(name, turn, len(data), document, _time_ms(document))
    except ManifestError as exc:
        return StoredExport(name, turn, len(data), None, None, f"{name}: {exc}")


def _time_ms(document: dict[str, Any]) -> int:
    """The export's ``checkpoint_ms``: for a manifest, from the logical resume's text around the
    conversation (which holds every field but the messages), not from its parts."""
    if document.get("schema") == MANIFEST_SCHEMA:
        head, tail = document.get("logical_head"), document.get("logical_tail")
        if not isinstance(head, str) or not isinstance(tail, str):
            raise ManifestError("the manifest has no logical resume's text")
        logical = parse_json((head + tail).encode("utf-8", "surrogatepass"), "the logical resume")
    else:
        logical = _field(_content(document), "logical_resume")
    value = _field(logical, "checkpoint_ms")
    if type(value) is not int:
        raise ManifestError(f"the export's checkpoint_ms is {value!r}, not a time")
    return value


def _content(document: dict[str, Any]) -> Any:
    content = document.get("content")
    if not isinstance(content, str):
        raise ManifestError("the document is neither a manifest nor an export")
    return parse_json(content.encode("utf-8", "surrogatepass"), "the export's content")


def _field(value: Any, key: str) -> Any:
    if not isinstance(value, dict) or key not in value:
        raise ManifestError(f"the export has no {key}")
    return value[key]


def kept_exports(exports: Sequence[StoredExport], cutoff_s: float) -> list[bool]:
    """Which of a run's exports stay: the newest (by turn, then name), those not older than the
    cutoff, and those that cannot be read.

    Args:
        exports: One run's exports.
        cutoff_s: An export whose time is before this (seconds since the epoch) is old.

    Returns:
        For each export, in order, whether it stays.
    """
    if not exports:
        return []
    newest = max(range(len(exports)), key=lambda i: (exports[i].turn, exports[i].name))
    return [i == newest or e.time_ms is None or e.time_ms >= cutoff_s * 1000 for i, e in enumerate(exports)]


def export_needs(document: dict[str, Any], parts: PartReader) -> Needs:
    """The trees and parts a stored export needs.

    Args:
        document: Its manifest, or its whole document.
        parts: Its run's parts (unused for a whole document).

    Returns:
        The trees (``trees_needed`` of its run's events) and the parts of its chain.

    Raises:
        ManifestError: A part of its chain is missing or damaged, or it does not add up.
    """
    if document.get("schema") != MANIFEST_SCHEMA:
        records = _field(_field(_content(document), "snapshot"), "run_records")
        if not isinstance(records, list) or not records:
            raise ManifestError("the export's snapshot has no run records")
        events = _field(records[-1], "events")  # the source run is the last record
        if not isinstance(events, list):
            raise ManifestError("the export's run has no event list")
        return Needs(frozenset(trees_needed(events)), frozenset())
    names: list[str] = []

    def header(name: str) -> dict[str, Any] | None:
        names.append(name)
        try:
            return parts.part(name)[0]
        except ManifestError:
            return None

    lacking = missing_part(document, header)
    if lacking is not None:
        raise ManifestError(f"its chain lacks {lacking}")
    # only an event that names a tree is parsed: most do not
    items = parts.items(document, "events")
    events = [parse_json(item, "an event") for item in items if b'"tree"' in item]
    return Needs(frozenset(trees_needed(events)), frozenset(names))


def trees_needed(events: Iterable[Any]) -> set[str]:
    """The trees a run's events make an export need: the last one recorded (``tool_end``'s
    ``workspace.tree``, a ``rewind``'s or ``workspace_restored``'s ``tree``, ``run_start``'s
    ``workspace.tree``), and the run's base (its ``run_start`` and ``rewind`` trees). Read from
    the JSON, so that events of any version count.

    Args:
        events: The run's event records (``{"event": {...}, ...}``), in order.

    Returns:
        The tree ids.
    """
    base: set[str] = set()
    last: str | None = None
    for record in events:
        event = record.get("event") if isinstance(record, dict) else None
        if not isinstance(event, dict):
            continue
        kind = event.get("type")
        held = event.get("workspace")
        tree = event.get("tree") if kind in ("rewind", "workspace_restored") else None
        if kind in ("tool_end", "run_start") and isinstance(held, dict):
            tree = held.get("tree")
        if not isinstance(tree, str) or not _is_id(tree):
            continue
        last = tree
        if kind in ("run_start", "rewind"):
            base.add(tree)
    return base if last is None else {*base, last}


def _is_id(value: str) -> bool:
    try:
        return object_id_checked(value) == value
    except SinkError:
        return False


class TreeWalk:
    """The objects of a sink that its roots reach, without I/O of its own: ``wanted()`` says
    what to read next (trees, and roots of unknown kind), ``add()`` takes what was read.

    Args:
        held: The objects the sink holds (only these are followed and counted).
        roots: Trees kept exports need, and recent objects of any kind.
    """

    def __init__(self, held: Collection[str], roots: Iterable[str]) -> None:
        self.held = held
        self.reached: set[str] = set()
        self.problems: list[str] = []
        self._queue: list[str] = []
        for oid in roots:
            self._reach(oid, follow=True)

    def _reach(self, oid: str, *, follow: bool) -> None:
        if oid in self.held and oid not in self.reached:
            self.reached.add(oid)
            if follow:
                self._queue.append(oid)

    def wanted(self) -> list[str]:
        """The next objects to read (empty: the walk is done)."""
        batch, self._queue = self._queue[:WALK_BATCH], self._queue[WALK_BATCH:]
        return batch

    def add(self, objects: Mapping[str, bytes]) -> None:
        """Follow the trees among ``objects`` (id -> loose object); the rest are leaves.

        A tree that cannot be read is a problem: what it reaches is unknown."""
        for oid, data in objects.items():
            try:
                reader = zlib.decompressobj()
                head = reader.decompress(data, 64)  # the kind, without inflating a large file
                if not head.startswith(b"tree "):
                    continue
                raw = head + reader.decompress(reader.unconsumed_tail) + reader.flush()
                entries = _tree_entries(raw.partition(b"\0")[2])
            except (zlib.error, ValueError) as exc:
                self.problems.append(f"object {oid} cannot be read as a tree: {exc}")
                continue
            for mode, child in entries:
                if mode != b"160000":  # a submodule's commit is not in the workspace's objects
                    self._reach(child, follow=mode == b"40000")


async def walk_trees(walk: TreeWalk, read: Callable[[Sequence[str]], Any]) -> TreeWalk:
    """Run ``walk`` to its end, reading objects with ``read`` (ids -> awaitable of id -> bytes).

    Args:
        walk: The walk, with its roots.
        read: A sink's ``get_objects``.

    Returns:
        ``walk``, done.
    """
    while batch := walk.wanted():
        walk.add(await read(batch))
    return walk
