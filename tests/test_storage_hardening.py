"""Storage that holds what it acknowledged: one folder a key, parts written again when they are
gone, typed errors for damaged manifests and a clear refusal of a database role that cannot write."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import asyncpg
import pytest
from temporalio.client import Client

from durable_agent.activities import AgentActivities
from durable_agent.activities.pg_sink import PostgresExportSink
from durable_agent.activities.sink_files import ManifestError, read_export_file
from durable_agent.activities.sinks import OBJECTS_FOLDER, FilesystemExportSink
from durable_agent.activities.store import session_store
from durable_agent.activities.store.filesystem import FilesystemSessionStore
from durable_agent.activities.store.pg_schema import migrate
from durable_agent.activities.store.session_store import NAME_MAX, safe_name
from durable_agent.activities.workspaces.sources import run_folder
from durable_agent.config import PostgresStoreConfig
from durable_agent.core.export import EncodingError
from durable_agent.worker import StorageUnusable, connect_storage
from tests.helpers import final, read_call, running_worker, scripted_config, start, workspace_with
from tests.test_sink_files import Run

ROOT = Path(__file__).resolve().parent.parent

# --- one folder a key ---------------------------------------------------------------------------

TRICKY_IDS = [
    "team/alpha",
    "team_alpha",
    "team\\alpha",
    "team alpha",
    "team~alpha",
    "team~2Falpha",
    "",
    ".",
    "..",
    "...",
    "_.",
    "~",
    "~2E",
    "é",
    "e\u0301",
    "\ud800",
    "a" * 255,
    "a" * 256,
    "a/" * 100,
    "a_" * 100,
    "../../etc/passwd",
    "x" * 199 + "/",
    "x" * 199 + "_",
]


def test_every_key_gets_a_file_name_of_its_own_that_stays_in_its_folder() -> None:
    for suffix in ("", ".run.json"):
        names = [safe_name(key, suffix) for key in TRICKY_IDS]
        assert len(set(names)) == len(TRICKY_IDS), sorted(names)
        for key, name in zip(TRICKY_IDS, names, strict=True):
            assert name and "/" not in name and "\\" not in name and "\0" not in name, key
            assert name.strip("."), key
            assert len((name + suffix).encode("utf-8")) <= NAME_MAX, key


CASED_IDS = [
    "Team",
    "team",
    "TEAM",
    "tEAM",
    "~54eam",
    "team~54",
    "Équipe",
    "équipe",
    "Team/Alpha",
    "team/alpha",
]


def test_on_a_file_system_that_does_not_tell_case_apart_keys_that_differ_in_case_do_not_meet() -> None:
    keys = TRICKY_IDS + CASED_IDS + ["A" * 300, "a" * 300, "Ab" * 150]
    for suffix in ("", ".run.json"):
        names = [safe_name(key, suffix, caseless=True) for key in keys]
        # as such a file system sees them: one name a key still
        assert len({name.casefold() for name in names}) == len(set(keys)), sorted(names)
        for key, name in zip(keys, names, strict=True):
            assert name and "/" not in name and len((name + suffix).encode("utf-8")) <= NAME_MAX, key
    # a key with no upper case keeps its name there too
    assert safe_name("agent-run-0123456789ab", caseless=True) == "agent-run-0123456789ab"


def test_the_store_and_the_sink_ask_the_file_system_and_escape_case_where_it_is_not_told_apart(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert not session_store.caseless(tmp_path / "not" / "made" / "yet")  # this machine's tells case apart
    assert FilesystemSessionStore(tmp_path)._run_dir("Team") == tmp_path / "runs" / "Team"
    monkeypatch.setattr(session_store, "caseless", lambda folder: True)  # as on macOS's APFS
    store = FilesystemSessionStore(tmp_path)
    assert store._run_dir("Team") == tmp_path / "runs" / "~54eam"
    assert store._run_dir("team") == tmp_path / "runs" / "team"
    assert run_folder(tmp_path / "ws", "Team", "r") == tmp_path / "ws" / "~54eam" / "r"


@pytest.mark.parametrize("key", ["agent-run-0123456789ab", "team_alpha", "run.1-A_b", "a" * 255])
def test_a_key_that_never_needed_escaping_keeps_the_name_it_always_had(key: str, tmp_path: Path) -> None:
    assert safe_name(key) == key
    assert FilesystemSessionStore(tmp_path)._run_dir(key) == tmp_path / "runs" / key


async def test_two_runs_whose_ids_differ_in_a_slash_both_export_and_read_back(
    client: Client, tmp_path: Path
) -> None:
    """``team/alpha`` and ``team_alpha`` once shared a folder; the second run's export failed."""
    ws = workspace_with(tmp_path, {"a.txt": "alpha\n"})
    results = []
    for key in ("team/alpha", "team_alpha"):
        config = scripted_config(tmp_path, [read_call("r1", "a.txt"), final(f"done {key}")])
        acts = AgentActivities(config)
        async with running_worker(client, acts) as queue:
            run = await start(client, queue, ws, f"read for {key}", session_id=key)
            results.append(await run.result())
    for key, result in zip(("team/alpha", "team_alpha"), results, strict=True):
        assert result.status == "completed", result
        assert result.session_id == key and result.text == f"done {key}"
        assert not result.export_failures and result.exports
        folder = tmp_path / "exports" / safe_name(key) / safe_name(result.run_id)
        for ref in result.exports:
            digest = ref.content_digest.removeprefix("sha256:")[:16]
            export = read_export_file(folder / f"turn-{ref.turn:06d}-{digest}.json")
            assert export.descriptor.content_digest == ref.content_digest
            assert export.open().source_run().snapshot.session_id == key
    # the sessions' folders, beside the workspace's objects (``~objects``, never a session's name)
    folders = sorted(p.name for p in (tmp_path / "exports").iterdir() if p.name != OBJECTS_FOLDER)
    assert folders == sorted({safe_name("team/alpha"), "team_alpha"})


async def test_run_ids_that_differ_in_a_slash_keep_separate_logs(tmp_path: Path) -> None:
    from tests.test_run_log import header

    store = FilesystemSessionStore(tmp_path)
    one, two = header().model_copy(update={"run_id": "r/1"}), header().model_copy(update={"run_id": "r_1"})
    await store.save_header(one)
    await store.save_header(two)
    assert await store.load_header("r/1") == one
    assert await store.load_header("r_1") == two


async def test_records_an_earlier_version_kept_under_a_shared_folder_are_read_by_their_session(
    tmp_path: Path,
) -> None:
    from durable_agent.core.canonical import canonical_bytes
    from tests.test_run_log import record

    shared = tmp_path / "sessions" / "team_alpha"  # where both sessions' records once went
    shared.mkdir(parents=True)
    mine, theirs = record("r-1", 10, session_id="team/alpha"), record("r-2", 20, session_id="team_alpha")
    for rec in (mine, theirs):
        (shared / f"{rec.snapshot.id}.run.json").write_bytes(canonical_bytes(rec))
    store = FilesystemSessionStore(tmp_path)
    newer = record("r-3", 30, session_id="team/alpha")
    await store.save_run_record(newer)  # this version's folder for the escaped id
    assert [r.snapshot.id for r in await store.load_run_records("team/alpha")] == ["r-1", "r-3"]
    assert [r.snapshot.id for r in await store.load_run_records("team_alpha")] == ["r-2"]


async def test_an_export_an_earlier_version_wrote_under_a_shared_folder_is_fetched_by_its_own(
    tmp_path: Path,
) -> None:
    sink = FilesystemExportSink(tmp_path)
    run = Run()
    parted, whole = run.grow()
    await sink.deliver_parts(parted)
    d = whole.descriptor
    escaped = d.session_id + "/x"  # an id that needs escaping, whose export sits where it once did
    moved = whole.model_copy(update={"descriptor": d.model_copy(update={"session_id": escaped})})
    legacy = tmp_path / (d.session_id + "_x") / safe_name(d.run_id)
    legacy.parent.mkdir()
    (tmp_path / safe_name(d.session_id) / safe_name(d.run_id)).rename(legacy)
    [manifest] = legacy.glob("turn-*.json")
    document = json.loads(manifest.read_text())
    document["descriptor"]["session_id"] = escaped
    manifest.write_text(json.dumps(document))
    assert await sink.fetch(moved.descriptor) == moved
    # the id that shares the old name does not get it
    other = moved.descriptor.model_copy(update={"session_id": d.session_id + "?x"})
    assert await sink.fetch(other) is None


# --- nothing acknowledged that cannot be given back --------------------------------------------


async def test_the_filesystem_sink_writes_again_a_part_deleted_in_the_middle_of_a_chain(
    tmp_path: Path,
) -> None:
    sink = FilesystemExportSink(tmp_path)
    run = Run()
    for _ in range(3):
        await sink.deliver_parts(run.grow()[0])
    oldest = min(tmp_path.rglob("parts/*"), key=lambda p: p.stat().st_mtime_ns)
    oldest.unlink()  # not the newest part: the one the first export wrote
    for _ in range(2):
        parted, whole = run.grow()
        await sink.deliver_parts(parted)
        assert await FilesystemExportSink(tmp_path).fetch(whole.descriptor) == whole


async def delete_parts(dsn: str, *, only_oldest: bool = False) -> int:
    conn = await asyncpg.connect(dsn)
    try:
        if only_oldest:
            status = await conn.execute(
                "DELETE FROM agent_export_part WHERE ctid = (SELECT min(ctid) FROM agent_export_part)"
            )
        else:
            status = await conn.execute("DELETE FROM agent_export_part")
    finally:
        await conn.close()
    return int(status.split()[-1])


async def test_the_postgres_sink_never_acknowledges_an_export_it_cannot_give_back(pg_dsn: str) -> None:
    """Failure 10: part rows deleted after two exports; every later export must read back."""
    sink = PostgresExportSink(pg_dsn)
    run = Run()
    try:
        await sink.connect()
        delivered = []
        for _ in range(2):
            parted, whole = run.grow()
            await sink.deliver_parts(parted)
            delivered.append((parted, whole))
        assert await delete_parts(pg_dsn) == 2
        for _ in range(3):
            parted, whole = run.grow()
            await sink.deliver_parts(parted)  # acknowledged ...
            assert await sink.fetch(whole.descriptor) == whole  # ... so it is readable back
        # a part gone from the middle of the chain (the oldest one left)
        assert await delete_parts(pg_dsn, only_oldest=True) == 1
        parted, whole = run.grow()
        await sink.deliver_parts(parted)
        assert await sink.fetch(whole.descriptor) == whole
        # a repeat of an acknowledged export whose parts were deleted since writes them again
        await delete_parts(pg_dsn)
        with pytest.raises(ManifestError, match="missing"):
            await sink.fetch(whole.descriptor)
        await sink.deliver_parts(parted)
        assert await sink.fetch(whole.descriptor) == whole
        # and a repeat of one that is whole writes nothing
        before = await part_rows(pg_dsn)
        await sink.deliver_parts(parted)
        assert await part_rows(pg_dsn) == before
        # the earlier exports whose parts were deleted are not given back as anything else
        with pytest.raises(ManifestError):
            await sink.fetch(delivered[0][1].descriptor)
    finally:
        await sink.aclose()


async def part_rows(dsn: str) -> list[tuple[str, bytes]]:
    conn = await asyncpg.connect(dsn)
    try:
        rows = await conn.fetch("SELECT name, body, xmin::text AS x FROM agent_export_part ORDER BY name")
    finally:
        await conn.close()
    return [(row["name"], bytes(row["body"]) + row["x"].encode()) for row in rows]


async def test_a_damaged_stored_manifest_row_is_written_again_not_acknowledged(pg_dsn: str) -> None:
    sink = PostgresExportSink(pg_dsn)
    run = Run()
    try:
        parted, whole = run.grow()
        await sink.deliver_parts(parted)
        conn = await asyncpg.connect(pg_dsn)
        try:
            await conn.execute("UPDATE agent_export SET manifest = '{\"schema\": 5'")
        finally:
            await conn.close()
        with pytest.raises(EncodingError):
            await sink.fetch(whole.descriptor)
        await sink.deliver_parts(parted)
        assert await sink.fetch(whole.descriptor) == whole
    finally:
        await sink.aclose()


# --- typed errors ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "count",
    ['"abc"', '"' + "9" * 5000 + '"', "9" * 5000, "true", "1.5", "-1", "null", "[]", "1e400"],
    ids=["text", "5000-digit-text", "5000-digit-number", "bool", "float", "negative", "null", "list", "inf"],
)
async def test_a_manifest_whose_count_is_not_a_count_is_a_manifest_error(count: str, tmp_path: Path) -> None:
    sink = FilesystemExportSink(tmp_path)
    run = Run()
    for _ in range(2):
        await sink.deliver_parts(run.grow()[0])
    [path] = tmp_path.rglob("turn-000002-*.json")
    text = path.read_text()
    manifest = json.loads(text)
    old = json.dumps({"count": manifest["messages"]["count"]})[1:-1]
    assert text.count(old) >= 1
    path.write_text(text.replace(old, f'"count": {count}', 1))
    with pytest.raises(ManifestError) as caught:
        read_export_file(path)
    assert "\n" not in str(caught.value) and len(str(caught.value)) < 300


@pytest.mark.parametrize(
    "document",
    [b'{"descriptor": 5, "content": "x"}', b"[1, 2]", b'{"content": 5}', b"\xff\xfe", b"{" * 5000],
)
def test_a_file_that_is_no_export_is_an_encoding_error(document: bytes, tmp_path: Path) -> None:
    path = tmp_path / "turn-000001-x.json"
    path.write_bytes(document)
    with pytest.raises(EncodingError):
        read_export_file(path)


# --- a database role that cannot write ---------------------------------------------------------


async def limited_role(dsn: str, role: str, *, grants: str, read_only: bool = False) -> str:
    """A login role on ``dsn``'s database (its schema migrated) with only ``grants``; its DSN."""
    conn = await asyncpg.connect(dsn)
    try:
        await migrate(conn)
        await conn.execute(f"DROP ROLE IF EXISTS {role}")
        await conn.execute(f"CREATE ROLE {role} LOGIN")
        if grants:
            await conn.execute(f"GRANT {grants} ON ALL TABLES IN SCHEMA public TO {role}")
        if read_only:
            await conn.execute(f"ALTER ROLE {role} SET default_transaction_read_only = on")
    finally:
        await conn.close()
    return dsn.replace("agent@", f"{role}@", 1)


def run_worker(tmp_path: Path, dsn: str) -> subprocess.CompletedProcess[str]:
    config = tmp_path / "worker.toml"
    config.write_text(
        '[store]\nkind = "postgres"\ndsn_env = "AGENT_TEST_RO_DSN"\n'
        '[sinks.local]\nkind = "postgres"\ndsn_env = "AGENT_TEST_RO_DSN"\n'
        '[sandbox]\nkind = "none"\n'
    )
    env = {**os.environ, "AGENT_CONFIG": str(config), "AGENT_TEST_RO_DSN": dsn, "PYTHONIOENCODING": "utf-8"}
    env["TEMPORAL_ADDRESS"] = "127.0.0.1:1"  # never reached: the database refuses first
    return subprocess.run(
        [sys.executable, str(ROOT / "worker.py")],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.parametrize(
    ("grants", "read_only", "said"),
    [
        ("SELECT", False, "lacks INSERT on"),
        ("SELECT, INSERT, UPDATE, DELETE", True, "takes no writes"),
        ("", False, "may not use the agent's tables"),
    ],
    ids=["select-only", "read-only-transactions", "no-grants"],
)
async def test_a_role_that_cannot_write_stops_python_worker_py_with_one_line(
    tmp_path: Path, pg_dsn: str, grants: str, read_only: bool, said: str
) -> None:
    role = f"ro_{os.urandom(4).hex()}"
    dsn = await limited_role(pg_dsn, role, grants=grants, read_only=read_only)
    done = await asyncio.to_thread(run_worker, tmp_path, dsn)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    lines = [line for line in done.stderr.splitlines() if line.startswith("worker:")]
    assert len(lines) == 1 and said in lines[0], done.stderr
    assert "password" not in lines[0].lower()


async def test_a_role_that_may_not_create_the_tables_is_a_clear_refusal(
    tmp_path: Path, pg_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    conn = await asyncpg.connect(pg_dsn)  # a fresh database: no tables yet
    try:
        await conn.execute("DROP ROLE IF EXISTS fresh_ro; CREATE ROLE fresh_ro LOGIN")
    finally:
        await conn.close()
    monkeypatch.setenv("AGENT_TEST_RO_DSN", pg_dsn.replace("agent@", "fresh_ro@", 1))
    store = PostgresStoreConfig(kind="postgres", dsn_env="AGENT_TEST_RO_DSN")
    acts = AgentActivities(scripted_config(tmp_path, [final()]).model_copy(update={"store": store}))
    try:
        with pytest.raises(StorageUnusable, match="may not create the agent's tables") as caught:
            await connect_storage(acts, wait_seconds=0)
        assert "\n" not in str(caught.value)
    finally:
        await acts.aclose()


async def test_a_read_only_role_can_still_read_the_exports(pg_dsn: str) -> None:
    """The CLI reads exports with a role that may only read: the schema check only reads."""
    writer = PostgresExportSink(pg_dsn)
    run = Run()
    parted, whole = run.grow()
    try:
        await writer.connect()
        await writer.deliver_parts(parted)
    finally:
        await writer.aclose()
    reader = PostgresExportSink(await limited_role(pg_dsn, "reader_ro", grants="SELECT", read_only=True))
    try:
        assert await reader.fetch(whole.descriptor) == whole
        assert await reader.series(whole.descriptor.session_id) == [whole.descriptor]
    finally:
        await reader.aclose()


def test_a_dsn_that_cannot_be_read_stops_the_worker_with_one_line(tmp_path: Path) -> None:
    done = run_worker(tmp_path, "postgresql://agent:hunter2hunter2@127.0.0.1:notaport/db")
    assert done.returncode == 2, done.stdout + done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    [line] = [line for line in done.stderr.splitlines() if line.startswith("worker:")]
    assert "DSN cannot be used" in line and "hunter2" not in line


def test_an_unreachable_temporal_service_stops_the_worker_with_one_line(tmp_path: Path) -> None:
    config = tmp_path / "worker.toml"
    config.write_text(f'[store]\npath = "{tmp_path / "store"}"\n[sandbox]\nkind = "none"\n')
    env = {**os.environ, "AGENT_CONFIG": str(config), "TEMPORAL_ADDRESS": "127.0.0.1:1"}
    done = subprocess.run(
        [sys.executable, str(ROOT / "worker.py")],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2, done.stdout + done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    [line] = [line for line in done.stderr.splitlines() if line.startswith("worker:")]
    assert "cannot use the Temporal service" in line
