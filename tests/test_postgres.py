"""Runs on the PostgreSQL session store and export sink, on a real PostgreSQL server."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from temporalio.client import Client

from durable_agent.activities import AgentActivities
from durable_agent.activities.pg_sink import PostgresExportSink
from durable_agent.activities.store.postgres import PostgresSessionStore
from durable_agent.config import AgentConfig, ConfigError, PostgresSinkConfig, PostgresStoreConfig
from durable_agent.core.run_api import RunStatusView
from durable_agent.worker import StorageUnusable, connect_storage
from tests.helpers import (
    final,
    read_call,
    running_worker,
    scripted_config,
    start,
    tool_result_ids,
    until,
    workspace_with,
)
from tests.pg_server import LocalPostgres, database_dsn

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
            # a run resumed from the database's export of turn 1 makes the second read again
            config_file = tmp_path / "cli.toml"
            config_file.write_text(f'[sinks.local]\nkind = "postgres"\ndsn_env = "{DSN_ENV}"\n')
            target = client.service_client.config.target_host
            resumed = await asyncio.to_thread(
                run_cli,
                *("resume", f"pg:{result.session_id}/{result.run_id}/1", "--workspace", str(ws)),
                cwd=tmp_path,
                config=config_file,
                dsn=pg_dsn,
                extra={
                    "TEMPORAL_ADDRESS": target,
                    "TEMPORAL_NAMESPACE": client.namespace,
                    "AGENT_TASK_QUEUE": queue,
                },
            )
            assert resumed.returncode == 0, resumed.stdout + resumed.stderr
            assert "read b.txt" in resumed.stdout and "both read" in resumed.stdout, resumed.stdout
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
        await check_the_cli_reads_the_database(tmp_path, pg_dsn, result.session_id, result.run_id)
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


def run_cli(
    *args: str, cwd: Path, config: Path, dsn: str, extra: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "AGENT_CONFIG": str(config),
        DSN_ENV: dsn,
        "PYTHONIOENCODING": "utf-8",
        **(extra or {}),
    }
    return subprocess.run(
        [sys.executable, "-m", "durable_agent.cli", *args], cwd=cwd, env=env, capture_output=True, text=True
    )


async def check_the_cli_reads_the_database(tmp_path: Path, dsn: str, session: str, run: str) -> None:
    config = tmp_path / "cli.toml"
    config.write_text(f'[sinks.local]\nkind = "postgres"\ndsn_env = "{DSN_ENV}"\n')

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return run_cli(*args, cwd=tmp_path, config=config, dsn=dsn)

    listed = await asyncio.to_thread(cli, "exports", session)
    assert listed.returncode == 0, listed.stderr
    refs = [line.split()[0] for line in listed.stdout.splitlines()]
    assert refs == [f"pg:{session}/{run}/1", f"pg:{session}/{run}/2"]
    verified = await asyncio.to_thread(cli, "verify", *refs, f"pg:{session}/{run}/9", "pg:nonsense")
    assert verified.returncode == 1
    assert f"OK {refs[0]}: session {session} run {run} turn 1" in verified.stdout
    assert f"OK {refs[1]}" in verified.stdout
    assert (
        f"FAILED pg:{session}/{run}/9: ExportRefError: sink 'local' holds no export of turn 9"
        in verified.stdout
    )
    assert "FAILED pg:nonsense: ExportRefError: 'pg:nonsense' is not pg:SESSION/RUN/TURN" in verified.stdout
    packed = await asyncio.to_thread(cli, "pack", refs[1], "-o", str(tmp_path / "turn2.json"))
    assert packed.returncode == 0, packed.stderr
    again = await asyncio.to_thread(cli, "verify", str(tmp_path / "turn2.json"))
    assert again.returncode == 0 and "turn 2" in again.stdout, again.stdout + again.stderr


async def test_a_database_down_for_20_s_mid_run_costs_retries_not_the_run(
    client: Client, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    server = await asyncio.to_thread(LocalPostgres)  # its own, to stop and start
    try:
        monkeypatch.setenv(DSN_ENV, server.dsn)
        ws = workspace_with(tmp_path, {f"f{i}.txt": f"file {i}\n" * 300 for i in range(6)})
        responses = [{**read_call(f"r{i}", f"f{i}.txt"), "delay_ms": 300} for i in range(6)]
        acts = AgentActivities(pg_config(tmp_path, [*responses, final("all read")]))
        sink = acts.sinks["local"]
        assert isinstance(sink, PostgresExportSink)
        try:
            await connect_storage(acts)
            async with running_worker(client, acts) as queue:
                handle = await start(client, queue, ws, "read them all", max_tool_rounds=10)

                async def two_exports() -> bool:
                    status = await handle.query("status", result_type=RunStatusView)
                    return bool(status.exports_delivered >= 2)

                await until("two exports", two_exports, 30)
                await asyncio.to_thread(server.stop)
                await asyncio.sleep(20)
                await asyncio.to_thread(server.start)
                result = await asyncio.wait_for(handle.result(), 180)
            assert result.status == "completed" and result.text == "all read", result
            # the outage is on the run's record: a boundary whose save and export it stopped
            assert result.export_failures and result.persistence_failures, result
            events = {
                r.event.type for r in last_record_events(await acts.store.load_run_records(result.session_id))
            }
            assert {"checkpoint_export_failed", "persistence_failed"} <= events, events
            # nothing lost: the last export holds every tool result, in order
            series = await sink.series(result.session_id, result.run_id)
            last = await sink.fetch(series[-1])
            assert last is not None
            ids = tool_result_ids(last)
            assert ids == [f"r{i}" for i in range(6)]
            assert [d.turn for d in series] == sorted({d.turn for d in series})  # no turn twice
        finally:
            await acts.aclose()
    finally:
        await asyncio.to_thread(server.close)


def last_record_events(records: list[Any]) -> list[Any]:
    return list(records[-1].events) if records else []


async def test_workers_starting_together_migrate_the_schema_once(pg_dsn: str) -> None:
    import asyncpg

    from durable_agent.activities.store.pg_schema import SCHEMA_VERSION, SchemaTooNew, migrate

    async def one_worker() -> int:
        conn = await asyncpg.connect(pg_dsn)
        try:
            return await migrate(conn)
        finally:
            await conn.close()

    had = await asyncio.gather(*(one_worker() for _ in range(6)))
    assert sorted(had) == [0] + [SCHEMA_VERSION] * 5  # one migrated, the others found it done
    conn = await asyncpg.connect(pg_dsn)
    try:
        assert await conn.fetchval("SELECT count(*) FROM agent_schema") == SCHEMA_VERSION
        await conn.execute("INSERT INTO agent_schema (version) VALUES ($1)", SCHEMA_VERSION + 1)
        with pytest.raises(SchemaTooNew, match="upgrade this worker"):
            await migrate(conn)
    finally:
        await conn.close()
