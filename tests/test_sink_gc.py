"""``durable-agent gc``: a sink's exports older than its retention go, with the parts and objects
only they needed; the newest export of each run, what the kept ones need, and what a running
boundary may count on stay. Real runs on the dev server, on the filesystem and PostgreSQL sinks."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import asyncpg
import pytest
from temporalio.client import Client

from durable_agent.activities import AgentActivities
from durable_agent.activities.pg_sink import PostgresExportSink
from durable_agent.activities.sink_files import read_export_file
from durable_agent.activities.sink_gc import GcError, GcOptions, collect_sink
from durable_agent.activities.sink_gc.refs import trees_needed
from durable_agent.activities.sinks import FilesystemExportSink
from durable_agent.activities.workspace_tree import WorkspaceTrees
from durable_agent.activities.workspaces.fetching import restore_tree
from durable_agent.activities.workspaces.shadow import ShadowRepo
from durable_agent.config import AgentConfig, parse_config
from durable_agent.conformance.sink_checks import sample_object
from durable_agent.core.export import SessionCheckpointExportV1
from durable_agent.worker import connect_storage
from tests.helpers import RecordingSink, running_worker, start
from tests.test_postgres_objects import DSN_ENV, held_objects, pg_run_config
from tests.test_workspace_checkpoints import cli_config, files_of, run_config, sink_objects

LATER_MS = int((time.time() + 10 * 86_400) * 1000)  # ten days on: every export of the run is old


def workspace(tmp: Path) -> Path:
    ws = tmp / "workspace"
    ws.mkdir()
    (ws / "a.txt").write_text("one\n")
    (ws / "keep.txt").write_text("kept\n")
    (ws / ".gitignore").write_text("*.log\n")
    return ws


def kept_objects(config: AgentConfig, ws: Path, last: SessionCheckpointExportV1) -> set[str]:
    """Every object under the trees the newest export needs (its last tree, and its base)."""
    events = [r.model_dump(mode="json") for r in last.open().source_run().events]
    shadow = WorkspaceTrees(config.workspace_checkpoints, {}).repo(ws)
    return {oid for tree in trees_needed(events) for oid in shadow.objects_since(tree, None)}


async def run_three_boundaries(client: Client, acts: AgentActivities, ws: Path) -> Any:
    """A run that edits, runs a command, edits again: three exports, three trees."""
    await connect_storage(acts)
    async with running_worker(client, acts) as queue:
        handle = await start(client, queue, ws, prompt="edit, build, edit")
        result = await handle.result()
    assert result.status == "completed", result.error
    return result


async def test_old_exports_go_and_the_kept_ones_still_verify_and_rebuild(
    client: Client, tmp_path: Path
) -> None:
    ws = workspace(tmp_path)
    config = run_config(tmp_path)
    await run_three_boundaries(client, AgentActivities(config), ws)
    end_files = files_of(ws)
    root = tmp_path / "exports"
    exports = sorted(root.rglob("turn-*.json"))
    assert len(exports) == 3
    newest = read_export_file(exports[-1])
    held = sink_objects(root)
    kept = kept_objects(config, ws, newest)
    assert kept < held
    parts = sorted(root.rglob("parts/*"))
    sink = FilesystemExportSink(root)

    # a dry run counts what would go and removes nothing
    listing = sorted(p for p in root.rglob("*"))
    before = sum(p.stat().st_size for p in listing if p.is_file())
    dry = await collect_sink("local", sink, GcOptions(retain_days=1, now_ms=LATER_MS, dry_run=True))
    assert sorted(p for p in root.rglob("*")) == listing

    report = await collect_sink("local", sink, GcOptions(retain_days=1, now_ms=LATER_MS))
    assert dry.model_dump(exclude={"dry_run"}) == report.model_dump(exclude={"dry_run"})
    # the newest export of the run stays, old as it is; the others go
    assert (report.exports_removed, report.exports_kept) == (2, 1), report
    assert report.removed == tuple(str(p) for p in exports[:2])
    assert sorted(root.rglob("turn-*.json")) == exports[-1:]
    # the newest manifest's chain needs every part the run wrote
    assert (report.parts_removed, report.parts_kept) == (0, len(parts))
    # objects only the removed exports' trees reached are gone (turn 1's and 2's roots, "two")
    assert sink_objects(root) == kept
    assert (report.objects_removed, report.objects_kept) == (len(held - kept), len(kept))
    after = sum(p.stat().st_size for p in root.rglob("*") if p.is_file())
    assert report.bytes_freed == before - after and report.problems == ()

    # the kept export verifies, and its tree rebuilds the run's files in an empty folder
    done = subprocess.run(
        [sys.executable, "-m", "durable_agent.cli", "verify", str(exports[-1])],
        env={**os.environ, "AGENT_CONFIG": str(cli_config(tmp_path))},
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0 and done.stdout.startswith("OK "), done.stdout + done.stderr
    empty = tmp_path / "empty"
    needed = trees_needed([r.model_dump(mode="json") for r in newest.open().source_run().events])
    await restore_tree(ShadowRepo(tmp_path / "other-shadow", empty), last_tree(newest), sink)
    assert files_of(empty) == {k: v for k, v in end_files.items() if k != "build.log"}
    assert needed <= sink_objects(root)

    # a second collection finds nothing more to do
    again = await collect_sink("local", sink, GcOptions(retain_days=1, now_ms=LATER_MS))
    assert (again.exports_removed, again.parts_removed, again.objects_removed) == (0, 0, 0)


def last_tree(export: SessionCheckpointExportV1) -> str:
    from durable_agent.core.export import workspace_tree_of

    tree = workspace_tree_of(export.open().source_run().events)
    assert tree is not None
    return tree


async def test_young_objects_and_objects_a_boundary_counts_on_stay(tmp_path: Path) -> None:
    sink = FilesystemExportSink(tmp_path / "exports")
    oid, data = sample_object(b"just put, no export names it yet\n")
    await sink.put_objects({oid: data})
    options = GcOptions(retain_days=1)
    report = await collect_sink("local", sink, options)
    assert (report.objects_removed, report.objects_kept) == (0, 1)  # younger than the grace period
    old = time.time() - 2 * 3600
    os.utime(sink.object_path(oid), (old, old))
    # a boundary that finds it there renews it: it counts on it until its export names it
    assert await sink.missing_objects([oid]) == []
    assert (await collect_sink("local", sink, options)).objects_kept == 1
    os.utime(sink.object_path(oid), (old, old))
    report = await collect_sink("local", sink, options)
    assert (report.objects_removed, report.bytes_freed) == (1, len(data))
    assert await sink.missing_objects([oid]) == [oid]


async def test_an_export_that_cannot_be_read_keeps_its_run_and_every_object(tmp_path: Path) -> None:
    root = tmp_path / "exports"
    sink = FilesystemExportSink(root)
    run = root / "s" / "r"
    run.mkdir(parents=True)
    (run / "turn-000001-0000000000000000.json").write_text("not json")
    (run / "turn-000002-0000000000000000.json").write_text("{}")
    oid, data = sample_object(b"an object\n")
    await sink.put_objects({oid: data})
    old = time.time() - 2 * 3600
    os.utime(sink.object_path(oid), (old, old))
    report = await collect_sink("local", sink, GcOptions(retain_days=1, now_ms=LATER_MS))
    assert (report.exports_removed, report.exports_kept, report.objects_removed) == (0, 2, 0)
    assert len(report.problems) == 2 and "turn-000001" in report.problems[0]


async def test_a_sink_of_another_kind_is_refused() -> None:
    with pytest.raises(GcError, match="gc collects filesystem and PostgreSQL sinks only"):
        await collect_sink("mine", RecordingSink(), GcOptions(retain_days=1))


def gc_cli(tmp: Path, toml: str, *args: str) -> subprocess.CompletedProcess[str]:
    config = tmp / "gc.toml"
    config.write_text(toml)
    env = {**os.environ, "AGENT_CONFIG": str(config)}
    command = [sys.executable, "-m", "durable_agent.cli", "gc", *args]
    return subprocess.run(command, env=env, cwd=tmp, capture_output=True, text=True)


async def test_the_cli_reads_the_retention_from_the_config(client: Client, tmp_path: Path) -> None:
    ws = workspace(tmp_path)
    await run_three_boundaries(client, AgentActivities(run_config(tmp_path)), ws)
    root = tmp_path / "exports"
    exports = sorted(root.rglob("turn-*.json"))
    held = sink_objects(root)
    toml = f'[sinks.local]\nkind = "filesystem"\npath = "{root}"\nretain_days = 0.00001\n'
    await asyncio.sleep(1)  # older than 0.864 s: every export but the newest

    dry = gc_cli(tmp_path, toml, "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert "would remove 2 exports (kept 1)" in dry.stdout and "0 objects" in dry.stdout, dry.stdout
    assert sorted(root.rglob("turn-*.json")) == exports

    done = gc_cli(tmp_path, toml, "--json")
    assert done.returncode == 0, done.stderr
    [report] = json.loads(done.stdout)
    assert (report["exports_removed"], report["exports_kept"]) == (2, 1)
    # every object is younger than the grace period (an hour): none goes yet
    assert (report["objects_removed"], report["objects_kept"]) == (0, len(held))
    assert sorted(root.rglob("turn-*.json")) == exports[-1:]

    unknown = gc_cli(tmp_path, toml, "--sink", "nope")
    assert unknown.returncode == 2 and "no sink 'nope'" in unknown.stderr and "local" in unknown.stderr
    keeping = f'[sinks.local]\nkind = "filesystem"\npath = "{root}"\n'
    refused = gc_cli(tmp_path, keeping, "--sink", "local")
    assert refused.returncode == 2 and "give --retain-days N" in refused.stderr
    skipped = gc_cli(tmp_path, keeping)
    assert skipped.returncode == 0 and "no retain_days, every export kept" in skipped.stdout
    bad = gc_cli(tmp_path, keeping, "--retain-days", "0")
    assert bad.returncode == 2 and "not a positive number of days" in bad.stderr


def test_retain_days_is_a_positive_number() -> None:
    sink = {"kind": "filesystem", "path": "x", "retain_days": 7}
    assert parse_config({"sinks": {"local": sink}}, Path(".")).sinks["local"].retain_days == 7
    with pytest.raises(ValueError, match="retain_days"):
        parse_config({"sinks": {"local": {**sink, "retain_days": 0}}}, Path("."))


async def test_postgres_old_exports_and_their_objects_go(
    client: Client, tmp_path: Path, pg_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(DSN_ENV, pg_dsn)
    ws = workspace(tmp_path)
    config = pg_run_config(tmp_path)
    acts = AgentActivities(config)
    sink = acts.sinks["local"]
    assert isinstance(sink, PostgresExportSink)
    try:
        result = await run_three_boundaries(client, acts, ws)
        end_files = files_of(ws)
        series = await sink.series(result.session_id, result.run_id)
        assert len(series) == 3
        newest = await sink.fetch(series[-1])
        assert newest is not None
        held = await held_objects(pg_dsn)
        kept = kept_objects(config, ws, newest)
        assert kept < held
        # objects no export names: one just put, one old, one old that a boundary just found there
        (fresh, fresh_data), (old, old_data), (found, found_data) = (
            sample_object(f"{what}\n".encode()) for what in ("fresh", "old", "found")
        )
        await sink.put_objects({old: old_data, found: found_data})
        conn = await asyncpg.connect(pg_dsn)
        try:
            await conn.execute("UPDATE agent_object SET created_at = now() - interval '2 days'")
            await sink.put_objects({fresh: fresh_data})
            assert await sink.missing_objects([found]) == []
            parts = await conn.fetchval("SELECT count(*) FROM agent_export_part")
        finally:
            await conn.close()
        report = await collect_sink("local", sink, GcOptions(retain_days=1))
        assert (report.exports_removed, report.exports_kept) == (0, 3), report
        assert (report.objects_removed, report.bytes_freed) == (1, len(old_data))
        assert await held_objects(pg_dsn) == held | {fresh, found}

        dry = await collect_sink("local", sink, GcOptions(retain_days=1, now_ms=LATER_MS, dry_run=True))
        assert len(await sink.series(result.session_id)) == 3
        report = await collect_sink("local", sink, GcOptions(retain_days=1, now_ms=LATER_MS))
        assert dry.model_dump(exclude={"dry_run"}) == report.model_dump(exclude={"dry_run"})
        assert (report.exports_removed, report.exports_kept) == (2, 1), report
        assert [d.turn for d in await sink.series(result.session_id)] == [series[-1].turn]
        assert (report.parts_removed, report.parts_kept) == (0, parts)
        # ten days on, only what the newest export needs is left
        assert await held_objects(pg_dsn) == kept
        assert (report.objects_removed, report.objects_kept) == (len(held - kept) + 2, len(kept))
        assert report.bytes_freed > 0 and report.problems == ()

        # the kept export verifies and rebuilds the run's files from the database alone
        again = await sink.fetch(series[-1])
        assert again is not None
        again.open()
        empty = tmp_path / "empty"
        await restore_tree(ShadowRepo(tmp_path / "other-shadow", empty), last_tree(again), sink)
        assert files_of(empty) == {k: v for k, v in end_files.items() if k != "build.log"}
    finally:
        await acts.aclose()
