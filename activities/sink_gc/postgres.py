"""Collecting the PostgreSQL sink (``sink_gc/rules.py`` has the rules): its runs one transaction each,
then its objects.

A run is collected under the advisory lock its deliveries take (``PostgresExportSink.deliver_parts``):
a boundary of that run waits until its collection commits, then builds on the newest export,
which stays, and never finds a part of its chain gone. A delivery writes its parts and its
manifest in one transaction, so every part the collection sees is either needed by a manifest
it sees or by none: no grace period is needed for parts, and the tables need no time column.

Objects (``agent_object``) have their ``created_at``, which the sink's ``missing_objects`` renews
for every object a boundary finds there (where the role may update the table). An object is
deleted only while its ``created_at`` is still before the grace period, checked in the
``DELETE`` itself, so an object renewed a moment before stays.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from durable_agent.activities.pg_sink import PostgresExportSink
from durable_agent.activities.sink_files import PartReader
from durable_agent.activities.sink_gc.refs import kept_exports, stored_export
from durable_agent.activities.sink_gc.rules import GcOptions, GcReport, Tally

_ID_BATCH = 5000  # ids one DELETE names


async def collect_postgres(sink: PostgresExportSink, options: GcOptions) -> GcReport:
    """Collect a PostgreSQL sink (see the module's docstring and ``sink_gc/rules.py``).

    Args:
        sink: The sink (its ``name`` keeps its rows apart; its pool is opened here).
        options: The retention, the grace period, whether to remove anything.

    Returns:
        What was removed and kept.

    Raises:
        SinkError: The database cannot be read or written (a role without ``DELETE`` on the
            sink's tables, say).
    """
    try:
        return await _Collection(sink, options).run()
    except Exception as exc:
        raise sink._sink_error(exc) from exc


class _Collection(Tally):
    def __init__(self, sink: PostgresExportSink, options: GcOptions) -> None:
        super().__init__(sink.name, "postgres", options)
        self.sink = sink

    async def run(self) -> GcReport:
        pool = await self.sink.db.pool()
        # ``created_at`` is on the database's clock, which the machine running gc may not share
        db_now: datetime = await pool.fetchval("SELECT clock_timestamp()")
        wall, self.cutoff, young_after = self.options.started()
        young = db_now + timedelta(seconds=young_after - wall)
        trees: set[str] = set()
        runs = await pool.fetch(
            "SELECT session_id, run_id FROM agent_export_part WHERE sink = $1 "
            "UNION SELECT session_id, run_id FROM agent_export WHERE sink = $1 ORDER BY 1, 2",
            self.name,
        )
        for row in runs:
            async with pool.acquire() as conn, conn.transaction():
                trees |= await self._run(conn, row["session_id"], row["run_id"])
        objects = await pool.fetch(
            "SELECT id, created_at >= $2 AS young, octet_length(body) AS size FROM agent_object "
            "WHERE sink = $1",
            self.name,
            young,
        )
        held = {row["id"]: row["size"] for row in objects}
        recent = [row["id"] for row in objects if row["young"]]
        gone = await self.unreached(held, recent, trees, self.sink.get_objects)
        removed = 0
        for start in range(0, len(gone), _ID_BATCH):
            batch = gone[start : start + _ID_BATCH]
            if self.options.dry_run:
                removed += len(batch)
                self.counts["bytes_freed"] += sum(held[oid] for oid in batch)
                continue
            # ``created_at`` checked again by the DELETE itself: a boundary may have renewed it since
            rows = await pool.fetch(
                "DELETE FROM agent_object WHERE sink = $1 AND id = ANY($2::text[]) AND created_at < $3 "
                "RETURNING octet_length(body) AS size",
                self.name,
                batch,
                young,
            )
            removed += len(rows)
            self.counts["bytes_freed"] += sum(row["size"] for row in rows)
        return self.report(removed, len(held) - removed)

    async def _run(self, conn: Any, session_id: str, run_id: str) -> set[str]:
        """Collect one run's exports and parts, under its deliveries' lock; the trees it keeps."""
        key = (self.name, session_id, run_id)
        await conn.execute(
            "SELECT pg_advisory_xact_lock(hashtext('agent_export'), hashtext($1))", "/".join(key)
        )
        rows = await conn.fetch(
            "SELECT turn, content_digest, manifest FROM agent_export "
            "WHERE sink = $1 AND session_id = $2 AND run_id = $3 ORDER BY turn, content_digest",
            *key,
        )
        exports = [
            stored_export(
                f"pg:{session_id}/{run_id}/{row['turn']} ({row['content_digest'][:23]})",
                row["turn"],
                row["manifest"].encode("utf-8", "surrogatepass"),
            )
            for row in rows
        ]
        parts = await conn.fetch(
            "SELECT name, body FROM agent_export_part WHERE sink = $1 AND session_id = $2 AND run_id = $3",
            *key,
        )
        bodies = {row["name"]: bytes(row["body"]) for row in parts}
        keep = kept_exports(exports, self.cutoff)
        keep, trees, needed = self.run_needs(exports, keep, PartReader(bodies.get))
        gone = [(row, export) for row, export, kept in zip(rows, exports, keep, strict=True) if not kept]
        unneeded = [] if needed is None else sorted(set(bodies) - needed)
        self.counts["exports_kept"] += len(exports) - len(gone)
        self.counts["exports_removed"] += len(gone)
        self.counts["parts_kept"] += len(bodies) - len(unneeded)
        self.counts["parts_removed"] += len(unneeded)
        self.counts["bytes_freed"] += sum(e.size for _, e in gone) + sum(len(bodies[n]) for n in unneeded)
        self.removed += [export.name for _, export in gone]
        if not self.options.dry_run:
            await conn.execute(
                "DELETE FROM agent_export WHERE sink = $1 AND session_id = $2 AND run_id = $3 "
                "AND (turn, content_digest) IN (SELECT * FROM unnest($4::integer[], $5::text[]))",
                *key,
                [row["turn"] for row, _ in gone],
                [row["content_digest"] for row, _ in gone],
            )
            await conn.execute(
                "DELETE FROM agent_export_part WHERE sink = $1 AND session_id = $2 AND run_id = $3 "
                "AND name = ANY($4::text[])",
                *key,
                unneeded,
            )
        return trees
