"""The export sink on PostgreSQL: every export of every run, for workers on any machine.

An export is a row in ``agent_export`` (sink, session, run, turn, digest): the
manifest of ``activities/sink_files.py`` for an export delivered as parts, or
the whole ``{"descriptor", "content"}`` document for one delivered whole. A
run's parts are rows in ``agent_export_part``, content-addressed, so the
database grows with what each boundary adds. ``fetch`` gives any export back
whole; ``series`` lists a run's (or a session's) exports in order. One database
may hold several sinks: ``name`` keeps their rows apart.

Nothing is acknowledged that cannot be given back: a delivery reads the headers
of the run's parts (a few hundred bytes each) and writes again what the chain
of the export, or of the export it builds on, no longer holds (rows deleted by
hand, a restore that missed some), as the filesystem sink does. A repeat of an
export that is whole here writes nothing.

It is an ``ObjectSink`` too: the workspace's git objects (``activities/workspace_tree.py``) are
rows in ``agent_object`` (sink, id), each kept once a sink whatever session or run sent it, the
bytes those the filesystem sink writes under ``~objects/`` (git's loose object), so the same code
rebuilds the files from either. ``put_objects`` returns once the transaction that holds them all
has committed.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final, Literal

import asyncpg
from pydantic import ValidationError

from durable_agent.activities.sink_files import (
    MANIFEST_SCHEMA,
    join_manifest,
    plan_parted,
    whole_document,
    whole_export,
)
from durable_agent.activities.sink_manifest import (
    HEADER_MAX_BYTES,
    Header,
    HeaderCache,
    ManifestError,
    missing_part,
    parse_json,
    part_header,
)
from durable_agent.activities.sinks import SinkError, object_id_checked
from durable_agent.activities.store.postgres import PERMANENT_ERRORS, SINK_TABLES, PgPool
from durable_agent.core.export import ExportDescriptor, SessionCheckpointExportV1
from durable_agent.core.export_parts import PartedExport

log = logging.getLogger(__name__)

# What the sink writes: its exports and its workspace objects (never updated: content-addressed).
OBJECT_TABLES: Final[Mapping[str, tuple[str, ...]]] = {"agent_object": ("SELECT", "INSERT")}
# One statement's share of a ``put_objects`` (all of them in one transaction): a boundary that
# adds a large file sends it alone, many small ones go together.
_PUT_BATCH_BYTES: Final = 8 << 20
_PUT_BATCH_ROWS: Final = 1000
# ids a lookup sends in one array
_ID_BATCH: Final = 5000


class PostgresExportSink:
    """An ``ExportSink`` (and ``PartedSink``, ``FetchingSink``, ``ObjectSink``) on PostgreSQL (see
    the module's docstring)."""

    def __init__(self, dsn: str, name: str = "postgres") -> None:
        self.db = PgPool(dsn)
        self.name = name
        # the parts' headers read so far: a boundary checks its chain without reading them again
        self._cache = HeaderCache()
        # whether ``missing_objects`` renews what it finds (off once the role may not)
        self._renews = True

    async def connect(self) -> None:
        """Open the pool, migrate the schema and check this role may write the sink's tables."""
        await self.db.check_writable({**SINK_TABLES, **OBJECT_TABLES})

    async def aclose(self) -> None:
        await self.db.aclose()

    async def missing_objects(self, ids: Sequence[str]) -> list[str]:
        """Those of ``ids`` this sink does not hold, in their order (one query a few thousand ids).

        The ``created_at`` of those it holds is renewed first, where this role may update the
        table: the boundary asking counts on them until its export names them, and
        ``durable-agent gc`` keeps an object that young (``sink_gc/postgres.py``)."""
        wanted = [object_id_checked(oid) for oid in ids]
        if self._renews:
            await self._renew(wanted)
        held = {row["id"] for row in await self._held_objects(wanted, "id")}
        return [oid for oid in wanted if oid not in held]

    async def _renew(self, ids: list[str]) -> None:
        try:
            pool = await self.db.pool()
            for start in range(0, len(ids), _ID_BATCH):
                # only rows past a few minutes: a boundary's own objects are not written twice
                await pool.execute(
                    "UPDATE agent_object SET created_at = now() WHERE sink = $1 AND id = ANY($2::text[]) "
                    "AND created_at < now() - interval '5 minutes'",
                    self.name,
                    ids[start : start + _ID_BATCH],
                )
        except asyncpg.InsufficientPrivilegeError:
            self._renews = False  # a role granted SELECT, INSERT only (docs/operations.md)
            log.warning("PostgreSQL sink %r: no UPDATE on agent_object: objects are not renewed", self.name)
        except Exception as exc:
            raise self._sink_error(exc) from exc

    async def put_objects(self, objects: Mapping[str, bytes]) -> None:
        """Hold ``objects`` (id -> loose object), all in one transaction; returns once it committed.

        An id already held is done: its row stays (an object's bytes are its zlib, which another
        zlib may write differently for the same object)."""
        rows = [(object_id_checked(oid), bytes(data)) for oid, data in objects.items()]
        if not rows:
            return
        try:
            pool = await self.db.pool()
            async with pool.acquire() as conn, conn.transaction():
                for batch in _batches(rows):
                    await conn.execute(
                        "INSERT INTO agent_object (sink, id, body) "
                        "SELECT $1, id, body FROM unnest($2::text[], $3::bytea[]) AS o(id, body) "
                        "ON CONFLICT (sink, id) DO NOTHING",
                        self.name,
                        [oid for oid, _ in batch],
                        [data for _, data in batch],
                    )
        except Exception as exc:
            raise self._sink_error(exc) from exc

    async def get_objects(self, ids: Sequence[str]) -> dict[str, bytes]:
        """The objects of ``ids`` this sink holds (id -> loose object); those it lacks are not in it."""
        wanted = [object_id_checked(oid) for oid in ids]
        return {row["id"]: bytes(row["body"]) for row in await self._held_objects(wanted, "id, body")}

    async def _held_objects(self, ids: list[str], columns: Literal["id", "id, body"]) -> list[Any]:
        """The rows of ``agent_object`` this sink holds of ``ids`` (checked), with ``columns``;
        one query a few thousand ids."""
        rows: list[Any] = []
        try:
            pool = await self.db.pool()
            for start in range(0, len(ids), _ID_BATCH):
                rows += await pool.fetch(
                    f"SELECT {columns} FROM agent_object WHERE sink = $1 AND id = ANY($2::text[])",
                    self.name,
                    ids[start : start + _ID_BATCH],
                )
        except Exception as exc:
            raise self._sink_error(exc) from exc
        return rows

    async def deliver(self, export: SessionCheckpointExportV1) -> None:
        d = export.descriptor
        try:
            pool = await self.db.pool()
            async with pool.acquire() as conn, conn.transaction():
                await self._write(conn, d, [], whole_document(export).decode("utf-8"))
        except Exception as exc:
            raise self._sink_error(exc) from exc

    async def deliver_parts(self, export: PartedExport) -> None:
        d = export.descriptor
        try:
            pool = await self.db.pool()
            async with pool.acquire() as conn, conn.transaction():
                # one delivery of a run at a time: two attempts of one boundary must not both
                # decide what is missing and write half each
                await conn.execute(
                    "SELECT pg_advisory_xact_lock(hashtext('agent_export'), hashtext($1))",
                    f"{self.name}/{d.session_id}/{d.run_id}",
                )
                headers = await self._headers(conn, d)
                held = await self._manifest(conn, d)
                if held is not None and _whole_here(held, headers):
                    return
                parent = await self._parent(conn, d)
                if parent is not None and missing_part(parent, headers) is not None:
                    parent = None  # its chain lost a part: this export holds every item again
                planned = plan_parted(export, parent)
                await self._write(conn, d, list(planned.parts), planned.manifest_bytes.decode("utf-8"))
        except Exception as exc:
            raise self._sink_error(exc) from exc

    async def _write(
        self, conn: Any, d: ExportDescriptor, parts: list[tuple[str, bytes]], manifest: str
    ) -> None:
        run = (self.name, d.session_id, d.run_id)
        # A part's name is its digest, so a row already there holds the same bytes, unless it was
        # damaged: written again either way (only parts this delivery needs are in ``parts``).
        await conn.executemany(
            "INSERT INTO agent_export_part (sink, session_id, run_id, name, body) "
            "VALUES ($1, $2, $3, $4, $5) ON CONFLICT (sink, session_id, run_id, name) "
            "DO UPDATE SET body = excluded.body WHERE agent_export_part.body <> excluded.body",
            [(*run, name, data) for name, data in parts],
        )
        # A row there for this export names parts that are gone (else nothing would be written):
        # this manifest, whose parts are all there now, replaces it.
        await conn.execute(
            "INSERT INTO agent_export (sink, session_id, run_id, turn, content_digest, manifest) "
            "VALUES ($1, $2, $3, $4, $5, $6) "
            "ON CONFLICT (sink, session_id, run_id, turn, content_digest) "
            "DO UPDATE SET manifest = excluded.manifest",
            *run,
            d.turn,
            d.content_digest,
            manifest,
        )

    def _sink_error(self, exc: BaseException) -> SinkError:
        if isinstance(exc, SinkError):
            return exc
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

    async def _headers(self, conn: Any, d: ExportDescriptor) -> Callable[[str], Header | None]:
        """The headers of the run's parts here, by name: the names listed, the headers of parts
        not seen before read (their first bytes). A part whose header is not one counts as not
        there: it is written again when a chain needs it."""
        run = (self.name, d.session_id, d.run_id)
        rows = await conn.fetch(
            "SELECT name FROM agent_export_part WHERE sink = $1 AND session_id = $2 AND run_id = $3", *run
        )
        present = {row["name"] for row in rows}
        unknown = present - self._cache.known(present)
        read: dict[str, Header] = {}
        if unknown:
            heads = await conn.fetch(
                "SELECT name, substring(body from 1 for $5) AS head FROM agent_export_part "
                "WHERE sink = $1 AND session_id = $2 AND run_id = $3 AND name = ANY($4::text[])",
                *run,
                sorted(unknown),
                HEADER_MAX_BYTES,
            )
            for row in heads:
                try:
                    read[row["name"]] = part_header(bytes(row["head"]))
                except ManifestError:
                    continue
        return self._cache.reader(present, read.get)

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
        return None if text is None else _manifest_of(text)

    async def fetch(self, descriptor: ExportDescriptor) -> SessionCheckpointExportV1 | None:
        """The export this sink holds for ``descriptor``, whole (not yet validated); a
        ``ManifestError`` (an ``EncodingError``) when what is stored does not add up."""
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
        manifest = _manifest_of(text)
        if manifest is None:
            return whole_export(text, "the stored export")
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
        out = []
        for row in rows:
            document = parse_json(row["manifest"].encode("utf-8"), "a stored export")
            try:
                out.append(ExportDescriptor.model_validate(document["descriptor"]))
            except (TypeError, KeyError, ValidationError) as exc:
                raise ManifestError(f"a stored export has no descriptor: {exc}") from None
        return out


def _batches(rows: list[tuple[str, bytes]]) -> list[list[tuple[str, bytes]]]:
    """``rows`` in runs of at most ``_PUT_BATCH_ROWS`` rows and about ``_PUT_BATCH_BYTES`` bytes."""
    out: list[list[tuple[str, bytes]]] = [[]]
    size = 0
    for row in rows:
        if out[-1] and (len(out[-1]) >= _PUT_BATCH_ROWS or size + len(row[1]) > _PUT_BATCH_BYTES):
            out.append([])
            size = 0
        out[-1].append(row)
        size += len(row[1])
    return out


def _manifest_of(text: str) -> dict[str, Any] | None:
    """The manifest a stored row holds; ``None`` for a whole document (or one that is neither)."""
    try:
        document = parse_json(text.encode("utf-8"), "a stored export")
    except ManifestError:
        return None
    if isinstance(document, dict) and document.get("schema") == MANIFEST_SCHEMA:
        return document
    return None


def _whole_here(text: str, headers: Callable[[str], Header | None]) -> bool:
    """Whether a stored row gives its export back: a whole document, or a manifest whose parts
    are all here (a row that is neither is written again)."""
    try:
        document = parse_json(text.encode("utf-8"), "a stored export")
    except ManifestError:
        return False
    if not isinstance(document, dict):
        return False
    if document.get("schema") == MANIFEST_SCHEMA:
        return missing_part(document, headers) is None
    return isinstance(document.get("content"), str) and isinstance(document.get("descriptor"), dict)
