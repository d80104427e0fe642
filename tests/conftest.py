"""One real Temporal dev server for the whole session (or ``TEMPORAL_ADDRESS``)."""

from __future__ import annotations

import os
import uuid
from collections.abc import AsyncIterator, Iterator

import pytest
from temporalio.client import Client

from durable_agent.client import connect, ensure_search_attributes
from durable_agent.devserver import start_ephemeral_server
from tests.docker_engine import engine_problem
from tests.pg_server import PG_DSN_ENV, LocalPostgres, database_dsn, pg_bin


@pytest.fixture(scope="session", autouse=True)
def worker_state_home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Workers' own state (the workspaces' shadow repositories) in the session's temporary
    folder, not in the home folder of whoever runs the tests."""
    before = os.environ.get("XDG_STATE_HOME")
    os.environ["XDG_STATE_HOME"] = str(tmp_path_factory.mktemp("state"))
    yield
    if before is None:
        os.environ.pop("XDG_STATE_HOME", None)
    else:
        os.environ["XDG_STATE_HOME"] = before


@pytest.fixture(scope="session")
async def temporal_client() -> AsyncIterator[Client]:
    if os.environ.get("TEMPORAL_ADDRESS"):
        client = await connect()  # TEMPORAL_ADDRESS / TEMPORAL_NAMESPACE, as Temporal's tools read them
        await ensure_search_attributes(client)
        yield client
        return
    env = await start_ephemeral_server()
    try:
        yield env.client
    finally:
        await env.shutdown()


@pytest.fixture
def client(temporal_client: Client) -> Client:
    return temporal_client


@pytest.fixture(scope="session")
def pg_server_dsn() -> Iterator[str]:
    """A real PostgreSQL server: ``AGENT_TEST_PG_DSN``, or one started here (``tests/pg_server.py``)."""
    given = os.environ.get(PG_DSN_ENV)
    if given:
        yield given
        return
    if pg_bin("initdb") is None and docker_reachable():
        # no server programs here, but a Docker engine: PostgreSQL in a container
        from testcontainers.community.postgres import PostgresContainer

        with PostgresContainer("postgres:16", driver=None) as container:
            yield container.get_connection_url()
        return
    server = LocalPostgres()
    try:
        yield server.dsn
    finally:
        server.close()


def docker_reachable() -> bool:
    return engine_problem() is None


@pytest.fixture
async def pg_dsn(pg_server_dsn: str) -> AsyncIterator[str]:
    """A fresh, empty database on that server, for one test; dropped after it."""
    import asyncpg

    name = f"agent_test_{uuid.uuid4().hex[:12]}"
    admin = await asyncpg.connect(pg_server_dsn)
    try:
        await admin.execute(f'CREATE DATABASE "{name}"')
    finally:
        await admin.close()
    yield database_dsn(pg_server_dsn, name)
    admin = await asyncpg.connect(pg_server_dsn)
    try:
        await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    finally:
        await admin.close()
