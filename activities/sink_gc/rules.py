"""Collecting an export sink (``durable-agent gc``): its options, its report, and the steps both
sinks share. What an export needs is read in ``sink_gc/refs.py``; the filesystem sink's side is
``sink_gc/filesystem.py``, PostgreSQL's ``sink_gc/postgres.py``; ``collect_sink`` (the
package's) picks one.

The rules (docs/exports.md, "Collecting old exports"):

- An export older than ``retain_days``, by its own time (the logical resume's
  ``checkpoint_ms``: the boundary's workflow time, the same in every copy of the export), is
  removed; the newest export of each run is always kept, and so is an export that cannot be
  read (with every part and object, since what it needs is unknown).
- A part stays while a kept export's chain needs it.
- An object stays while a kept export's trees reach it: the trees an export needs are those a
  rewind to it, a resume from it or the diff of its run restore (the run's last recorded tree,
  and its base: the trees of its ``run_start`` and ``rewind`` events). Objects a recent object
  reaches stay too, and every object younger than the grace period (by the sink's own record of
  when it was written, which a boundary renews for each object it finds there and counts on), or
  written after the collection started: a running boundary puts its objects before its export
  names them.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Iterable, Sequence
from typing import Any, Final, Literal

from pydantic import Field

from durable_agent.activities.sink_files import PartReader
from durable_agent.activities.sink_gc.refs import StoredExport, TreeWalk, export_needs, walk_trees
from durable_agent.activities.sink_manifest import ManifestError
from durable_agent.core.models import Frozen

__all__ = ["DEFAULT_GRACE_SECONDS", "GcError", "GcOptions", "GcReport", "Tally"]

DAY_MS: Final = 86_400_000
# Longer than any boundary takes from putting its objects (or finding them there) to the export
# that names them, by far.
DEFAULT_GRACE_SECONDS: Final = 3600.0


class GcError(ValueError):
    """A sink that cannot be collected (its kind, its name), or options that do not fit."""


class GcOptions(Frozen):
    """How a collection runs.

    Attributes:
        retain_days: An export older than this many days is removed (the newest of its run stays).
        grace_seconds: Objects (and, on the filesystem, parts) younger than this stay whatever
            refers to them.
        dry_run: Count what would go, remove nothing.
        now_ms: The time ages are taken at (ms since the epoch; None: now). What was written
            after the collection started stays whatever this says.
    """

    retain_days: float = Field(gt=0)
    grace_seconds: float = Field(DEFAULT_GRACE_SECONDS, ge=0)
    dry_run: bool = False
    now_ms: int | None = None

    def started(self) -> tuple[float, float, float]:
        """(the wall clock now, the export cutoff, the object cutoff), in seconds since the
        epoch: an export whose time is before the export cutoff is old; an object written at or
        after the object cutoff is young (the grace period, and never later than now)."""
        wall = time.time()
        now = wall if self.now_ms is None else self.now_ms / 1000
        return wall, now - self.retain_days * DAY_MS / 1000, min(wall, now - self.grace_seconds)


class GcReport(Frozen):
    """What a collection removed and kept (``dry_run``: what it would remove).

    Attributes:
        problems: Exports that could not be read (kept, with everything in their run) and
            objects that could not be followed (no object was removed then), one line each.
    """

    sink: str
    kind: Literal["filesystem", "postgres"]
    dry_run: bool
    retain_days: float
    exports_removed: int = 0
    exports_kept: int = 0
    parts_removed: int = 0
    parts_kept: int = 0
    objects_removed: int = 0
    objects_kept: int = 0
    bytes_freed: int = 0
    removed: tuple[str, ...] = ()
    problems: tuple[str, ...] = ()

    def line(self) -> str:
        """The report in one line, for a person."""
        verb = "would remove" if self.dry_run else "removed"
        return (
            f"sink {self.sink!r} ({self.kind}, exports older than {self.retain_days:g} days): {verb} "
            f"{self.exports_removed} exports (kept {self.exports_kept}), {self.parts_removed} parts "
            f"(kept {self.parts_kept}), {self.objects_removed} objects (kept {self.objects_kept}); "
            f"{self.bytes_freed:,} bytes {'to free' if self.dry_run else 'freed'}"
        )


class Tally:
    """One collection's counts and problems, and the steps both sinks' collections share.

    Args:
        name: The sink's name (for the report).
        kind: The sink's kind.
        options: The collection's options.
    """

    def __init__(self, name: str, kind: Literal["filesystem", "postgres"], options: GcOptions) -> None:
        self.name = name
        self.kind: Literal["filesystem", "postgres"] = kind
        self.options = options
        self.counts = dict.fromkeys(
            ("exports_removed", "exports_kept", "parts_removed", "parts_kept", "bytes_freed"), 0
        )
        self.removed: list[str] = []
        self.problems: list[str] = []
        # an export that cannot be read may need any object: then none is removed
        self.objects_blocked = False

    def run_needs(
        self, exports: Sequence[StoredExport], keep: list[bool], parts: PartReader
    ) -> tuple[list[bool], set[str], set[str] | None]:
        """What one run's kept exports need.

        Args:
            exports: The run's exports.
            keep: Which of them stay (``kept_exports``).
            parts: The run's parts.

        Returns:
            Which exports stay (every one, when one that stays cannot be read), the trees they
            need, and the parts they need (None: every part stays, for the same reason).
        """
        trees: set[str] = set()
        needed: set[str] = set()
        readable = True
        for export, kept in zip(exports, keep, strict=True):
            if not kept:
                continue
            try:
                if export.document is None:
                    raise ManifestError(export.problem or "it cannot be read")
                needs = export_needs(export.document, parts)
            except ManifestError as exc:
                self.problems.append(f"{export.name} is kept with its run: {exc}")
                readable = False
                continue
            trees |= needs.trees
            needed |= needs.parts
        if readable:
            return keep, trees, needed
        self.objects_blocked = True  # what it needs is unknown: nothing of its run goes, and no object
        return [True] * len(exports), trees, None

    async def unreached(
        self,
        held: Collection[str],
        young: Iterable[str],
        trees: set[str],
        read: Callable[[Sequence[str]], Any],
    ) -> list[str]:
        """The objects of ``held`` to remove: those neither the trees kept exports need nor the
        young objects reach (none when an export or a tree could not be read).

        Args:
            held: The sink's objects.
            young: Those written within the grace period or since the collection started.
            trees: The trees the kept exports need.
            read: The sink's ``get_objects``.

        Returns:
            The ids, sorted.
        """
        if self.objects_blocked:
            return []
        walk = await walk_trees(TreeWalk(held, [*sorted(trees), *young]), read)
        if walk.problems:
            self.problems += [f"{problem}: no object removed" for problem in walk.problems]
            return []
        return sorted(set(held) - walk.reached)

    def report(self, objects_removed: int, objects_kept: int) -> GcReport:
        """The report, with the objects' counts."""
        return GcReport(
            sink=self.name,
            kind=self.kind,
            dry_run=self.options.dry_run,
            retain_days=self.options.retain_days,
            objects_removed=objects_removed,
            objects_kept=objects_kept,
            removed=tuple(self.removed),
            problems=tuple(self.problems),
            **self.counts,
        )
