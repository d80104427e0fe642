"""The export sink on PostgreSQL: every export of every run, for workers on any machine.

An export is a row in ``agent_export`` (sink, session, run, turn, digest): the
manifest of ``activities/sink_files.py`` for an export delivered as parts, or
the whole ``{"descriptor", "content"}`` document for one delivered whole. A
run's parts are rows in ``agent_export_part``, content-addressed (a second
delivery of the same part or export is a no-op), so the database grows with
what each boundary adds. ``fetch`` gives any export back whole; ``series``
lists a run's (or a session's) exports in order. One database may hold several
sinks: ``name`` keeps their rows apart.
"""

from __future__ import annotations

import json
from typing import Any

from durable_agent.activities.sink_files import (
    ManifestError,
    join_manifest,
    plan_parted,
    whole_document,
)
from durable_agent.activities.sinks import SinkError
from durable_agent.activities.store.postgres import PERMANENT_ERRORS, PgPool
from durable_agent.core.export import ExportDescriptor, SessionCheckpointExportV1, load_export
from durable_agent.core.export_parts import PartedExport


class PostgresExportSink:
    """An ``ExportSink`` (and ``PartedSink``) on PostgreSQL (see the module's docstring)."""

    def __init__(self, dsn: str, name: str = "postgres") -> None:
        self.db = PgPool(dsn)
        self.name = name

    async def connect(self) -> None:
        await self.db.pool()

    async def aclose(self) -> None:
        await self.db.aclose()

    async def deliver(self, export: SessionCheckpointExportV1) -> None:
        d = export.descriptor
        await self._write(d, [], whole_document(export).decode("utf-8"))

    async def deliver_parts(self, export: PartedExport) -> None:
        d = export.descriptor
        try:
            pool = await self.db.pool()
            async with pool.acquire() as conn:
                if await self._holds(conn, d):
                    return
                parent = await self._parent(conn, d)
        except Exception as exc:
            raise self._sink_error(exc) from exc
        planned = plan_parted(export, parent)
        await self._write(d, list(planned.parts), planned.manifest_bytes.decode("utf-8"))

    async def _write(self, d: ExportDescriptor, parts: list[tuple[str, bytes]], manifest: str) -> None:
        run = (self.name, d.session_id, d.run_id)
        try:
            pool = await self.db.pool()
            async with pool.acquire() as conn, conn.transaction():
                await conn.executemany(
                    "INSERT INTO agent_export_part (sink, session_id, run_id, name, body) "
                    "VALUES ($1, $2, $3, $4, $5) ON CONFLICT DO NOTHING",
                    [(*run, name, data) for name, data in parts],
                )
                await conn.execute(
                    "INSERT INTO agent_export (sink, session_id, run_id, turn, content_digest, manifest) "
                    "VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT DO NOTHING",
                    *run,
                    d.turn,
                    d.content_digest,
                    manifest,
                )
        except Exception as exc:
            raise self._sink_error(exc) from exc

    def _sink_error(self, exc: BaseException) -> SinkError:
        retryable = not isinstance(exc, PERMANENT_ERRORS)
        return SinkError(f"PostgreSQL sink {self.name!r}: {type(exc).__name__}: {exc}", retryable=retryable)

    async def _manifest(self, conn: Any, d: ExportDescriptor) -> str | None:
        """The stored row of the export ``d`` names: its manifest or whole document."""
        text: str | None = await conn.fetchval(
            "SELECT manifest FROM agent_export WHERE sink = $1 AND session_id = $2 AND run_id = $3 "
            "AND turn = $4 AND content_digest = $5",
            self.name,
            d.session_id,
            d.run_id,
            d.turn,
            d.content_digest,
        )
        return text

    async def _holds(self, conn: Any, d: ExportDescriptor) -> bool:
        return await self._manifest(conn, d) is not None

    async def _parent(self, conn: Any, d: ExportDescriptor) -> dict[str, Any] | None:
        """The manifest of the run's newest export before this one here, if it is a manifest."""
        text = await conn.fetchval(
            "SELECT manifest FROM agent_export WHERE sink = $1 AND session_id = $2 AND run_id = $3 "
            "AND turn < $4 ORDER BY turn DESC LIMIT 1",
            self.name,
            d.session_id,
            d.run_id,
            d.turn,
        )
        if text is None:
            return None
        manifest = json.loads(text)
        return manifest if "descriptor" in manifest and "content" not in manifest else None

    async def fetch(self, descriptor: ExportDescriptor) -> SessionCheckpointExportV1 | None:
        """The export this sink holds for ``descriptor``, whole (not yet validated)."""
        d = descriptor
        try:
            pool = await self.db.pool()
            async with pool.acquire() as conn:
                text = await self._manifest(conn, d)
                if text is None:
                    return None
                rows = await conn.fetch(
                    "SELECT name, body FROM agent_export_part "
                    "WHERE sink = $1 AND session_id = $2 AND run_id = $3",
                    self.name,
                    d.session_id,
                    d.run_id,
                )
        except Exception as exc:
            raise self._sink_error(exc) from exc
        return self._whole(text, {row["name"]: bytes(row["body"]) for row in rows})

    @staticmethod
    def _whole(text: str, parts: dict[str, bytes]) -> SessionCheckpointExportV1:
        manifest = json.loads(text)
        if "content" in manifest:
            return load_export(text)
        if not isinstance(manifest, dict):
            raise ManifestError("the stored manifest is not an object")
        return join_manifest(manifest, parts.get)

    async def series(self, session_id: str, run_id: str | None = None) -> list[ExportDescriptor]:
        """The session's (or one run's) exports here, by run and turn."""
        pool = await self.db.pool()
        rows = await pool.fetch(
            "SELECT manifest FROM agent_export WHERE sink = $1 AND session_id = $2 "
            "AND ($3::text IS NULL OR run_id = $3) ORDER BY run_id, turn, content_digest",
            self.name,
            session_id,
            run_id,
        )
        return [ExportDescriptor.model_validate(json.loads(row["manifest"])["descriptor"]) for row in rows]
