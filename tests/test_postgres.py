"""Runs on the PostgreSQL session store and export sink, on a real PostgreSQL server."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from temporalio.client import Client

from durable_agent.activities import AgentActivities
from durable_agent.activities.pg_sink import PostgresExportSink
from durable_agent.activities.store.postgres import PostgresSessionStore
from durable_agent.config import AgentConfig, ConfigError, PostgresSinkConfig, PostgresStoreConfig
from durable_agent.worker import StorageUnusable, connect_storage
from tests.helpers import final, read_call, running_worker, scripted_config, start, workspace_with
from tests.pg_server import database_dsn

DSN_ENV = "AGENT_TEST_RUN_PG_DSN"


def pg_config(tmp_path: Path, responses: list[dict[str, Any]]) -> AgentConfig:
    """The scripted config, its store and its ``local`` sink on PostgreSQL (the DSN in ``DSN_ENV``)."""
    return scripted_config(tmp_path, responses).model_copy(
        update={
            "store": PostgresStoreConfig(kind="postgres", dsn_env=DSN_ENV),
            "sinks": {"local": PostgresSinkConfig(kind="postgres", dsn_env=DSN_ENV)},
        }
    )


async def test_a_run_on_the_postgres_store_and_sink_exports_every_boundary(
    client: Client, tmp_path: Path, pg_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(DSN_ENV, pg_dsn)
    ws = workspace_with(tmp_path, {"a.txt": "alpha\n" * 400, "b.txt": "beta\n"})
    config = pg_config(tmp_path, [read_call("r1", "a.txt"), read_call("r2", "b.txt"), final("both read")])
    acts = AgentActivities(config)
    assert isinstance(acts.store, PostgresSessionStore)
    sink = acts.sinks["local"]
    assert isinstance(sink, PostgresExportSink)
    try:
        await connect_storage(acts)
        async with running_worker(client, acts) as queue:
            result = await (await start(client, queue, ws, "read both")).result()
        assert result.status == "completed" and result.text == "both read", result
        assert [e.turn for e in result.exports] == [1, 2]
        series = await sink.series(result.session_id, result.run_id)
        assert [d.content_digest for d in series] == [e.content_digest for e in result.exports]
        for descriptor in series:
            export = await sink.fetch(descriptor)
            assert export is not None and export.descriptor == descriptor
            export.open()  # every digest checked
        last = await sink.fetch(series[-1])
        assert last is not None
        assert [m.role for m in last.open().logical_resume.messages][-1] == "user"
        # the run ended: its log left the store, its record stayed with its session
        records = await acts.store.load_run_records(result.session_id)
        assert [r.snapshot.status for r in records] == ["completed"]
        assert await acts.store.log_head(result.run_id) is None
    finally:
        await acts.aclose()


async def test_a_worker_refused_by_the_database_fails_at_start_with_the_reason(
    tmp_path: Path, pg_server_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    refused = database_dsn(pg_server_dsn, "postgres").replace("agent@", "nobody@")
    monkeypatch.setenv(DSN_ENV, refused)
    acts = AgentActivities(pg_config(tmp_path, [final()]))
    try:
        with pytest.raises(StorageUnusable, match='role "nobody" does not exist'):
            await connect_storage(acts, wait_seconds=0)
    finally:
        await acts.aclose()


def test_a_postgres_store_without_its_dsn_variable_is_a_config_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(DSN_ENV, raising=False)
    with pytest.raises(ConfigError, match=f"set the environment variable {DSN_ENV}"):
        AgentActivities(pg_config(tmp_path, [final()]))
