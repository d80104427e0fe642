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

import asyncio
from collections.abc import Mapping, Sequence
from typing import Any

import asyncpg

from durable_agent.activities.store.pg_schema import migrate
from durable_agent.activities.store.session_store import not_following
from durable_agent.core.canonical import canonical_bytes
from durable_agent.core.errors import DurableAgentError
from durable_agent.core.export import RunRecord
from durable_agent.core.run_log import GENESIS, LogEntry, LogRef, RunHeader

# asyncpg's errors that retrying cannot mend: credentials, permissions, a database that is not there
PERMANENT_ERRORS: tuple[type[BaseException], ...] = (
    asyncpg.InvalidAuthorizationSpecificationError,
    asyncpg.InvalidPasswordError,
    asyncpg.InsufficientPrivilegeError,
    asyncpg.InvalidCatalogNameError,
)
# What the store writes, and the sink: a worker's start checks its role holds these privileges.
STORE_TABLES: Mapping[str, tuple[str, ...]] = {
    table: ("SELECT", "INSERT", "UPDATE", "DELETE")
    for table in ("agent_run_header", "agent_log_entry", "agent_staged_text", "agent_run_record")
}
SINK_TABLES: Mapping[str, tuple[str, ...]] = {
    table: ("SELECT", "INSERT", "UPDATE") for table in ("agent_export", "agent_export_part")
}


class PostgresConnectError(DurableAgentError, RuntimeError):
    """The database refused this worker for good (credentials, permissions, no such database,
    no writes); the message is one line, fit to print as it is."""


class PgPool:
    """An ``asyncpg`` pool opened on first use, the schema migrated when it opens."""

    def __init__(self, dsn: str, *, max_size: int = 10) -> None:
        self.dsn = dsn
        self.max_size = max_size
        self._pool: Any = None
        self._opening = asyncio.Lock()

    async def pool(self) -> Any:
        """The pool, opened (and the schema migrated) by the first caller."""
        async with self._opening:
            if self._pool is None:
                self._pool = await self._open()
        return self._pool

    async def _open(self) -> Any:
        try:
            pool = await asyncpg.create_pool(self.dsn, min_size=1, max_size=self.max_size, timeout=10)
        except PERMANENT_ERRORS as exc:
            raise PostgresConnectError(f"PostgreSQL refused the connection: {exc}") from exc
        except (ValueError, asyncpg.ClientConfigurationError) as exc:
            # asyncpg's message names the part it cannot read (a port, a scheme), not the password
            raise PostgresConnectError(f"the PostgreSQL DSN cannot be used: {exc}") from exc
        try:
            async with pool.acquire() as conn:
                try:
                    await migrate(conn)
                except asyncpg.InsufficientPrivilegeError as exc:
                    made = await conn.fetchval("SELECT to_regclass('agent_schema') IS NOT NULL")
                    role = await conn.fetchval("SELECT current_user")
                    raise PostgresConnectError(_refused(role, made, exc)) from exc
                except asyncpg.ReadOnlySQLTransactionError as exc:
                    raise PostgresConnectError(_read_only(exc)) from exc
        except BaseException:
            pool.terminate()
            raise
        return pool

    async def check_writable(self, tables: Mapping[str, tuple[str, ...]]) -> None:
        """Refuse, with ``PostgresConnectError``, a database that takes no writes or a role
        without the privileges ``tables`` name: at a worker's start, not at a run's first save
        (where Temporal would retry it for ever). Opens the pool first."""
        pool = await self.pool()
        async with pool.acquire() as conn:
            if await conn.fetchval("SELECT current_setting('transaction_read_only') = 'on'"):
                raise PostgresConnectError(_read_only("transaction_read_only is on"))
            pairs = [(table, privilege) for table, privileges in tables.items() for privilege in privileges]
            rows = await conn.fetch(
                "SELECT t, p FROM unnest($1::text[], $2::text[]) AS x(t, p) "
                "WHERE NOT has_table_privilege(t, p)",
                [t for t, _ in pairs],
                [p for _, p in pairs],
            )
            if rows:
                role = await conn.fetchval("SELECT current_user")
                missing = ", ".join(f"{row['p']} on {row['t']}" for row in rows)
                raise PostgresConnectError(
                    f"PostgreSQL role {role!r} may not write what this worker writes: it lacks {missing} "
                    f"(GRANT SELECT, INSERT, UPDATE, DELETE ON those tables TO {role})"
                )

    async def aclose(self) -> None:
        if self._pool is not None:
            await self._pool.close()
            self._pool = None


def _refused(role: str, made: bool, exc: BaseException) -> str:
    grant = f"GRANT SELECT, INSERT, UPDATE, DELETE ON the agent_* tables TO {role}"
    if made:
        return f"PostgreSQL role {role!r} may not use the agent's tables ({exc}): {grant}"
    return (
        f"PostgreSQL role {role!r} may not create the agent's tables ({exc}): start one worker once "
        f"as a role that may (the schema is made once), then {grant}"
    )


def _read_only(why: object) -> str:
    return (
        f"PostgreSQL takes no writes here ({why}): a standby, or default_transaction_read_only is on; "
        "point the DSN at the primary, as a role that may write"
    )


def _text(value: object) -> str:
    return canonical_bytes(value).decode("utf-8")


class PostgresSessionStore:
    """A ``SessionStore`` on PostgreSQL (see the module's docstring)."""

    def __init__(self, dsn: str) -> None:
        self.db = PgPool(dsn)

    async def connect(self) -> None:
        """Open the pool, migrate the schema and check this role may write the store's tables
        now (a worker's start), not at the first activity."""
        await self.db.check_writable(STORE_TABLES)

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
