"""The workspace's git objects in the PostgreSQL sink (``agent_object``), on a real PostgreSQL
server: a run records its trees there, each boundary adds only the objects that changed, and
``rewind`` and ``resume --restore-workspace`` rebuild the files from the database alone."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import uuid
from pathlib import Path

import asyncpg
import pytest
from temporalio.client import Client, WorkflowExecutionStatus

from durable_agent.activities import AgentActivities
from durable_agent.activities.pg_sink import PostgresExportSink
from durable_agent.activities.sinks import ObjectSink
from durable_agent.activities.store.pg_schema import MIGRATIONS, SCHEMA_VERSION, migrate
from durable_agent.activities.workspace_tree import WorkspaceTrees
from durable_agent.activities.workspaces.fetching import restore_tree
from durable_agent.activities.workspaces.objects import object_id
from durable_agent.activities.workspaces.shadow import ShadowRepo
from durable_agent.config import (
    AgentConfig,
    PostgresSinkConfig,
    PostgresStoreConfig,
    WorkspaceCheckpointsConfig,
)
from durable_agent.conformance.sink_checks import sample_object
from durable_agent.core.events import RunStartEvent, ToolEndEvent
from durable_agent.core.export import workspace_tree_of
from durable_agent.worker import connect_storage
from tests.helpers import running_worker, start
from tests.test_workspace_checkpoints import files_of, run_config

DSN_ENV = "AGENT_TEST_OBJECTS_PG_DSN"


async def held_objects(dsn: str, sink: str = "local") -> set[str]:
    conn = await asyncpg.connect(dsn)
    try:
        rows = await conn.fetch("SELECT id FROM agent_object WHERE sink = $1", sink)
    finally:
        await conn.close()
    return {row["id"] for row in rows}


async def test_a_boundary_sends_only_what_changed_and_the_database_alone_rebuilds_it(
    tmp_path: Path, pg_dsn: str
) -> None:
    ws = tmp_path / "ws"
    (ws / "sub").mkdir(parents=True)
    (ws / "a.txt").write_text("a\n")
    (ws / "sub" / "run.sh").write_text("#!/bin/sh\n")
    (ws / "sub" / "run.sh").chmod(0o755)
    (ws / "data.bin").write_bytes(bytes(range(256)) * 300)
    (ws / "link").symlink_to("a.txt")
    sink = PostgresExportSink(pg_dsn, name="local")
    assert isinstance(sink, ObjectSink)
    try:
        await sink.connect()
        trees = WorkspaceTrees(WorkspaceCheckpointsConfig(path=tmp_path / "shadow"), {"local": sink})
        first = await trees.record(ws, "local")
        assert first is not None
        held = await held_objects(pg_dsn)
        # the root tree, sub, a.txt, run.sh, data.bin, link
        assert len(held) == 6
        assert held == set(trees.repo(ws).objects_since(first.tree, None))
        stored = await sink.get_objects(sorted(held))
        assert all(object_id(data) == oid for oid, data in stored.items())

        (ws / "a.txt").write_text("a2\n")
        second = await trees.record(ws, "local")
        assert second is not None and second.tree != first.tree
        grown = await held_objects(pg_dsn) - held
        assert len(grown) == 2 and second.tree in grown  # a.txt's new blob and the root tree
        again = await trees.record(ws, "local")  # nothing changed: nothing sent
        assert again is not None and again.tree == second.tree
        assert len(await held_objects(pg_dsn)) == 8
        assert await held_objects(pg_dsn, "another-sink") == set()  # one sink's objects are its own

        # another machine: a shadow of its own, an empty folder, the database alone
        empty = tmp_path / "elsewhere"
        await restore_tree(ShadowRepo(tmp_path / "other-shadow", empty), first.tree, sink)
        assert files_of(empty) == {**files_of(ws), "a.txt": (b"a\n", 0o644)}
        await restore_tree(ShadowRepo(tmp_path / "other-shadow", empty), second.tree, sink)
        assert files_of(empty) == files_of(ws)
    finally:
        await sink.aclose()


def pg_run_config(tmp: Path) -> AgentConfig:
    config: AgentConfig = run_config(tmp)
    return config.model_copy(
        update={
            "store": PostgresStoreConfig(kind="postgres", dsn_env=DSN_ENV),
            "sinks": {"local": PostgresSinkConfig(kind="postgres", dsn_env=DSN_ENV)},
        }
    )


async def cli(client: Client, tmp: Path, dsn: str, *args: str) -> subprocess.CompletedProcess[str]:
    """The CLI on "another machine": the same database, a shadow of its own."""
    config = tmp / "cli.toml"
    config.write_text(
        f'[sinks.local]\nkind = "postgres"\ndsn_env = "{DSN_ENV}"\n'
        f'[workspace_checkpoints]\npath = "{tmp / "cli-shadow"}"\n'
    )
    env = {**os.environ, "AGENT_CONFIG": str(config), DSN_ENV: dsn}
    env["TEMPORAL_ADDRESS"] = client.service_client.config.target_host
    env["TEMPORAL_NAMESPACE"] = client.namespace
    env["AGENT_TASK_QUEUE"] = f"nobody-{uuid.uuid4().hex[:8]}"  # the new run waits: files stay as rebuilt
    command = [sys.executable, "-m", "durable_agent.cli", *args]
    return await asyncio.to_thread(subprocess.run, command, env=env, cwd=tmp, capture_output=True, text=True)


async def test_a_run_on_postgres_records_its_trees_and_rewind_and_resume_rebuild_them(
    client: Client, tmp_path: Path, pg_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(DSN_ENV, pg_dsn)
    ws = tmp_path / "workspace"
    ws.mkdir()
    (ws / "a.txt").write_text("one\n")
    (ws / "keep.txt").write_text("kept\n")
    (ws / ".gitignore").write_text("*.log\n")
    start_files = files_of(ws)
    config = pg_run_config(tmp_path)
    acts = AgentActivities(config)
    sink = acts.sinks["local"]
    assert isinstance(sink, PostgresExportSink)
    try:
        await connect_storage(acts)
        async with running_worker(client, acts) as queue:
            handle = await start(client, queue, ws, prompt="edit, build, edit")
            result = await handle.result()
        assert result.status == "completed", result.error
        end_files = files_of(ws)
        series = await sink.series(result.session_id, result.run_id)
        last_export = await sink.fetch(series[-1])
        assert last_export is not None
        last = last_export.open()
    finally:
        await acts.aclose()

    # every boundary of the three calls carries its tree, and the export carries them
    ends = [r.event for r in last.source_run().events if isinstance(r.event, ToolEndEvent)]
    trees = [e.workspace.tree for e in ends if e.workspace is not None]
    assert [e.id for e in ends] == ["e1", "b1", "e2"] and len(set(trees)) == 3, [
        (e.id, e.output[:200], e.workspace) for e in ends
    ]
    assert workspace_tree_of(last.source_run().events) == trees[2]

    # the run's base, recorded at its start (its workspace follows it: docs/workspaces.md)
    [start_event] = [r.event for r in last.source_run().events if isinstance(r.event, RunStartEvent)]
    assert start_event.workspace is not None
    base = start_event.workspace.tree
    # the database holds the base's objects and those each boundary changed, no more
    shadow = WorkspaceTrees(config.workspace_checkpoints, {}).repo(ws)
    steps = [
        set(shadow.objects_since(base, None)),
        set(shadow.objects_since(trees[0], base)),
        set(shadow.objects_since(trees[1], trees[0])),
        set(shadow.objects_since(trees[2], trees[1])),
    ]
    assert await held_objects(pg_dsn) == set().union(*steps)
    assert len(steps[3]) == 2  # a.txt and the root tree

    # resume on an empty folder with --restore-workspace, from the database alone
    empty = tmp_path / "empty"
    ref = f"pg:{result.session_id}/{result.run_id}/{series[-1].turn}"
    done = await cli(
        client, tmp_path, pg_dsn, "resume", ref, "--restore-workspace", str(empty), "--no-follow"
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert files_of(empty) == {k: v for k, v in end_files.items() if k != "build.log"}
    resumed = client.get_workflow_handle(done.stdout.strip().splitlines()[-1])
    await resumed.terminate("test over")

    # rewind to turn 1 (before the bash command), the export read from the database
    done = await cli(client, tmp_path, pg_dsn, "rewind", handle.id, "--turn", "1", "--no-follow")
    assert done.returncode == 0, done.stdout + done.stderr
    at_turn_1 = {**start_files, "a.txt": (b"two\n", 0o644)}
    assert files_of(ws) == {**at_turn_1, "build.log": (b"l\n", 0o644)}
    new_run = client.get_workflow_handle(done.stdout.strip().splitlines()[-1])
    assert (await new_run.describe()).status == WorkflowExecutionStatus.RUNNING
    await new_run.terminate("test over")


async def test_the_objects_migration_applies_to_a_database_at_the_previous_version(pg_dsn: str) -> None:
    assert SCHEMA_VERSION == 2
    conn = await asyncpg.connect(pg_dsn)
    try:
        # a database as the previous release left it: version 1, an export in it
        await conn.execute("CREATE TABLE agent_schema (version integer PRIMARY KEY, applied_at timestamptz)")
        await conn.execute(MIGRATIONS[0])
        await conn.execute("INSERT INTO agent_schema (version, applied_at) VALUES (1, now())")
        await conn.execute(
            "INSERT INTO agent_export VALUES ('local', 's', 'r', 1, 'sha256:00', '{\"descriptor\": {}}')"
        )
        assert await conn.fetchval("SELECT to_regclass('agent_object') IS NULL")
        assert await migrate(conn) == 1
        assert await migrate(conn) == SCHEMA_VERSION  # done once
        versions = [row["version"] for row in await conn.fetch("SELECT version FROM agent_schema ORDER BY 1")]
        assert versions == [1, 2]
        assert await conn.fetchval("SELECT count(*) FROM agent_export") == 1  # kept
    finally:
        await conn.close()
    sink = PostgresExportSink(pg_dsn, name="local")
    try:
        await sink.connect()
        oid, data = sample_object(b"")
        assert oid == "e69de29bb2d1d6434b8b29ae775ad8c2e48c5391"  # git's empty blob
        await sink.put_objects({oid: data})
        assert await sink.missing_objects([oid]) == []
        assert await sink.get_objects([oid]) == {oid: data}
    finally:
        await sink.aclose()
