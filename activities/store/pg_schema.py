"""The PostgreSQL schema of the session store and the export sink, and how it is migrated.

Migrations are numbered and applied in order, each once, in one transaction
under an advisory lock, so several workers starting at once migrate the
database once between them. Compatibility rule: a migration only adds; a
worker refuses a database migrated past what it knows (an older worker next
to a newer one must not write what the newer one cannot read). A new migration
is appended to ``MIGRATIONS`` (never an old one edited: databases ran it), and
its number is its place there.
"""

from __future__ import annotations

from typing import Any, Final

from durable_agent.core.errors import DurableAgentError

# ``pg_advisory_xact_lock`` key: "agent" in ASCII, so other applications' locks do not collide.
MIGRATION_LOCK: Final = 0x6167656E74

MIGRATIONS: Final[tuple[str, ...]] = (
    # 1: the session store and the export sink
    """
    CREATE TABLE agent_run_header (
        run_id text PRIMARY KEY,
        header text NOT NULL
    );
    CREATE TABLE agent_log_entry (
        run_id text NOT NULL,
        version integer NOT NULL,
        digest text NOT NULL,
        entry text NOT NULL,
        PRIMARY KEY (run_id, version)
    );
    CREATE TABLE agent_staged_text (
        run_id text NOT NULL,
        digest text NOT NULL,
        body text NOT NULL,
        PRIMARY KEY (run_id, digest)
    );
    CREATE TABLE agent_run_record (
        session_id text NOT NULL,
        run_id text NOT NULL,
        created_at_ms bigint NOT NULL,
        record text NOT NULL,
        PRIMARY KEY (session_id, run_id)
    );
    CREATE TABLE agent_export_part (
        sink text NOT NULL,
        session_id text NOT NULL,
        run_id text NOT NULL,
        name text NOT NULL,
        body bytea NOT NULL,
        PRIMARY KEY (sink, session_id, run_id, name)
    );
    CREATE TABLE agent_export (
        sink text NOT NULL,
        session_id text NOT NULL,
        run_id text NOT NULL,
        turn integer NOT NULL,
        content_digest text NOT NULL,
        manifest text NOT NULL,
        PRIMARY KEY (sink, session_id, run_id, turn, content_digest)
    );
    """,
    # 2: the export sink's workspace objects (``activities/workspace_tree.py``): git's loose
    # objects, named by their SHA-1, each kept once a sink whatever session or run sent it (as the
    # filesystem sink keeps them once under its root); the sink in the key, as in the tables above,
    # so that removing one sink's rows never takes another's objects.
    """
    CREATE TABLE agent_object (
        sink text NOT NULL,
        id text NOT NULL CHECK (id ~ '^[0-9a-f]{40}$'),
        body bytea NOT NULL,
        created_at timestamptz NOT NULL DEFAULT now(),
        PRIMARY KEY (sink, id)
    );
    """,
)

SCHEMA_VERSION: Final = len(MIGRATIONS)


class SchemaTooNew(DurableAgentError, RuntimeError):
    """The database was migrated by a newer worker than this one."""


async def migrate(conn: Any) -> int:
    """Bring the database to ``SCHEMA_VERSION``; return the version it had. ``conn`` is an
    ``asyncpg`` connection."""
    # Up to date already (every start but the first): only read, so that a role that may read
    # and write the tables but not create any, or a read-only one (the CLI's), gets through.
    if await conn.fetchval("SELECT to_regclass('agent_schema') IS NOT NULL"):
        had = int(await conn.fetchval("SELECT coalesce(max(version), 0) FROM agent_schema"))
        if had > SCHEMA_VERSION:
            raise SchemaTooNew(
                f"the database's schema is at version {had}, this worker knows up to {SCHEMA_VERSION}: "
                "upgrade this worker"
            )
        if had == SCHEMA_VERSION:
            return had
    async with conn.transaction():
        await conn.execute("SELECT pg_advisory_xact_lock($1)", MIGRATION_LOCK)
        await conn.execute(
            "CREATE TABLE IF NOT EXISTS agent_schema (version integer PRIMARY KEY, "
            "applied_at timestamptz NOT NULL DEFAULT now())"
        )
        had = int(await conn.fetchval("SELECT coalesce(max(version), 0) FROM agent_schema"))
        if had > SCHEMA_VERSION:
            raise SchemaTooNew(
                f"the database's schema is at version {had}, this worker knows up to {SCHEMA_VERSION}: "
                "upgrade this worker"
            )
        for number in range(had + 1, SCHEMA_VERSION + 1):
            await conn.execute(MIGRATIONS[number - 1])
            await conn.execute("INSERT INTO agent_schema (version) VALUES ($1)", number)
    return had
