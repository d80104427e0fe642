"""The session store on PostgreSQL: what workers on several machines share.

One row a run header, log entry, staged text and ended run's record
(``pg_schema.py``). Every write is one transaction, committed before the
method returns, and safe to repeat. Appends to one run's log are serialized
by an advisory lock on the run, so two attempts of one save cannot interleave.

The connection string comes from the environment variable the config names
(``dsn_env``), never from a file. ``connect()`` opens the pool and migrates
the schema; a worker calls it at start so that bad credentials or a database
it cannot reach fail the start with a clear message. Later, a database that is
down or restarting makes the activity fail and Temporal retry it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import asyncpg

from durable_agent.activities.store.base import not_following
from durable_agent.activities.store.pg_schema import migrate
from durable_agent.core.canonical import canonical_bytes
from durable_agent.core.export import RunRecord
from durable_agent.core.run_log import GENESIS, LogEntry, LogRef, RunHeader

# asyncpg's errors that retrying cannot mend: credentials, permissions, a database that is not there
PERMANENT_ERRORS: tuple[type[BaseException], ...] = (
    asyncpg.InvalidAuthorizationSpecificationError,
    asyncpg.InvalidPasswordError,
    asyncpg.InsufficientPrivilegeError,
    asyncpg.InvalidCatalogNameError,
)


class PostgresConnectError(RuntimeError):
    """The database refused this worker for good (credentials, permissions, no such database)."""


class PgPool:
    """An ``asyncpg`` pool opened on first use, the schema migrated when it opens."""

    def __init__(self, dsn: str, *, max_size: int = 10) -> None:
        self.dsn = dsn
        self.max_size = max_size
        self._pool: Any = None

    async def pool(self) -> Any:
        if self._pool is None:
            try:
                pool = await asyncpg.create_pool(self.dsn, min_size=1, max_size=self.max_size, timeout=10)
            except PERMANENT_ERRORS as exc:
                raise PostgresConnectError(f"PostgreSQL refused the connection: {exc}") from exc
            async with pool.acquire() as conn:
                await migrate(conn)
            self._pool = pool
        return self._pool

    async def aclose(self) -> None:
        if self._pool is not None:
            await self._pool.close()
            self._pool = None


def _text(value: object) -> str:
    return canonical_bytes(value).decode("utf-8")


class PostgresSessionStore:
    """A ``SessionStore`` on PostgreSQL (see the module's docstring)."""

    def __init__(self, dsn: str) -> None:
        self.db = PgPool(dsn)

    async def connect(self) -> None:
        """Open the pool and migrate the schema now (a worker's start), not at the first activity."""
        await self.db.pool()

    async def aclose(self) -> None:
        await self.db.aclose()

    async def save_header(self, header: RunHeader) -> None:
        pool = await self.db.pool()
        await pool.execute(
            "INSERT INTO agent_run_header (run_id, header) VALUES ($1, $2) "
            "ON CONFLICT (run_id) DO UPDATE SET header = excluded.header",
            header.run_id,
            _text(header),
        )

    async def load_header(self, run_id: str) -> RunHeader | None:
        pool = await self.db.pool()
        text = await pool.fetchval("SELECT header FROM agent_run_header WHERE run_id = $1", run_id)
        return RunHeader.model_validate_json(text) if text is not None else None

    async def append_log(self, run_id: str, entries: Sequence[LogEntry]) -> None:
        if not entries:
            return
        first, last = entries[0], entries[-1]
        pool = await self.db.pool()
        async with pool.acquire() as conn, conn.transaction():
            await conn.execute("SELECT pg_advisory_xact_lock(hashtext($1))", run_id)
            if not first.delta.replace:
                before = GENESIS
                if first.version > 1:
                    before = await conn.fetchval(
                        "SELECT digest FROM agent_log_entry WHERE run_id = $1 AND version = $2",
                        run_id,
                        first.version - 1,
                    )
                if first.parent != before:
                    raise not_following(run_id, first, await self._head(conn, run_id))
            await conn.executemany(
                "INSERT INTO agent_log_entry (run_id, version, digest, entry) VALUES ($1, $2, $3, $4) "
                "ON CONFLICT (run_id, version) "
                "DO UPDATE SET digest = excluded.digest, entry = excluded.entry",
                [(run_id, e.version, e.digest, _text(e)) for e in entries],
            )
            await conn.execute(
                "DELETE FROM agent_log_entry WHERE run_id = $1 AND version > $2", run_id, last.version
            )

    async def read_log(self, run_id: str, after: int, upto: int) -> list[LogEntry]:
        pool = await self.db.pool()
        rows = await pool.fetch(
            "SELECT entry FROM agent_log_entry WHERE run_id = $1 AND version > $2 AND version <= $3 "
            "ORDER BY version",
            run_id,
            after,
            upto,
        )
        return [LogEntry.model_validate_json(row["entry"]) for row in rows]

    async def _head(self, conn: Any, run_id: str) -> LogRef | None:
        row = await conn.fetchrow(
            "SELECT version, digest FROM agent_log_entry WHERE run_id = $1 ORDER BY version DESC LIMIT 1",
            run_id,
        )
        return LogRef(run_id=run_id, version=row["version"], digest=row["digest"]) if row else None

    async def log_head(self, run_id: str) -> LogRef | None:
        pool = await self.db.pool()
        async with pool.acquire() as conn:
            return await self._head(conn, run_id)

    async def stage_text(self, run_id: str, digest: str, text: str) -> None:
        pool = await self.db.pool()
        await pool.execute(
            "INSERT INTO agent_staged_text (run_id, digest, body) VALUES ($1, $2, $3) "
            "ON CONFLICT (run_id, digest) DO NOTHING",
            run_id,
            digest,
            text,
        )

    async def staged_text(self, run_id: str, digest: str) -> str | None:
        pool = await self.db.pool()
        body = await pool.fetchval(
            "SELECT body FROM agent_staged_text WHERE run_id = $1 AND digest = $2", run_id, digest
        )
        return str(body) if body is not None else None

    async def drop_run(self, run_id: str) -> None:
        pool = await self.db.pool()
        async with pool.acquire() as conn, conn.transaction():
            for table in ("agent_run_header", "agent_log_entry", "agent_staged_text"):
                await conn.execute(f"DELETE FROM {table} WHERE run_id = $1", run_id)

    async def save_run_record(self, record: RunRecord) -> None:
        pool = await self.db.pool()
        run = record.snapshot
        await pool.execute(
            "INSERT INTO agent_run_record (session_id, run_id, created_at_ms, record) "
            "VALUES ($1, $2, $3, $4) "
            "ON CONFLICT (session_id, run_id) DO UPDATE SET record = excluded.record, "
            "created_at_ms = excluded.created_at_ms",
            run.session_id,
            run.id,
            run.created_at_ms,
            _text(record),
        )

    async def load_run_records(self, session_id: str) -> list[RunRecord]:
        pool = await self.db.pool()
        rows = await pool.fetch(
            "SELECT record FROM agent_run_record WHERE session_id = $1 ORDER BY created_at_ms, run_id",
            session_id,
        )
        return [RunRecord.model_validate_json(row["record"]) for row in rows]
