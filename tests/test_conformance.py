"""The store and sink conformance checks (``durable_agent.conformance``) on the built-in
implementations, and proof that the checks fail an implementation that breaks the contract."""

from __future__ import annotations

import socket
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import pytest

from durable_agent.activities.pg_sink import PostgresExportSink
from durable_agent.activities.sinks import ExportSink, FilesystemExportSink
from durable_agent.activities.store import FilesystemSessionStore, MemorySessionStore, SessionStore
from durable_agent.activities.store.postgres import PostgresSessionStore
from durable_agent.conformance import (
    SINK_CHECKS,
    STORE_CHECKS,
    Check,
    CheckSkipped,
    ConformanceError,
    check_failing_sink,
    check_sink,
    check_store,
    sample_export,
)
from durable_agent.core.export import ExportDescriptor, SessionCheckpointExportV1
from durable_agent.core.export_parts import PartedExport
from durable_agent.core.run_log import LogEntry

STORES: dict[str, Callable[[Path], SessionStore]] = {
    "memory": lambda _: MemorySessionStore(),
    "filesystem": lambda tmp: FilesystemSessionStore(tmp / "store"),
}


@pytest.mark.parametrize("kind", STORES)
@pytest.mark.parametrize("check", STORE_CHECKS.values(), ids=STORE_CHECKS.keys())
async def test_the_built_in_stores_pass_each_check(
    check: Check[SessionStore], kind: str, tmp_path: Path
) -> None:
    await check(STORES[kind](tmp_path))


@pytest.mark.parametrize("check", STORE_CHECKS.values(), ids=STORE_CHECKS.keys())
async def test_the_postgres_store_passes_each_check(check: Check[SessionStore], pg_dsn: str) -> None:
    store = PostgresSessionStore(pg_dsn)
    try:
        await check(store)
    finally:
        await store.aclose()


@pytest.mark.parametrize("check", SINK_CHECKS.values(), ids=SINK_CHECKS.keys())
async def test_the_postgres_sink_passes_each_check(check: Check[ExportSink], pg_dsn: str) -> None:
    sink = PostgresExportSink(pg_dsn)
    try:
        await check(sink)
    finally:
        await sink.aclose()


async def test_a_postgres_sink_that_cannot_reach_its_database_raises_sink_error(pg_dsn: str) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # nothing listens there once closed
    sink = PostgresExportSink(f"postgresql://agent@127.0.0.1:{port}/nowhere")
    await check_failing_sink(sink)
    # and one whose database has none of this sink's exports gives nothing back
    other = PostgresExportSink(pg_dsn, name="other")
    try:
        assert await other.fetch(sample_export(1).descriptor) is None
    finally:
        await other.aclose()


@pytest.mark.parametrize("check", SINK_CHECKS.values(), ids=SINK_CHECKS.keys())
async def test_the_filesystem_sink_passes_each_check(check: Check[ExportSink], tmp_path: Path) -> None:
    await check(FilesystemExportSink(tmp_path / "exports"))


async def test_a_filesystem_sink_that_cannot_write_raises_sink_error(tmp_path: Path) -> None:
    (blocked := tmp_path / "a-file").write_text("not a folder")
    await check_failing_sink(FilesystemExportSink(blocked))


async def test_the_runners_take_plain_and_async_factories(tmp_path: Path) -> None:
    await check_store(MemorySessionStore)
    roots = iter(range(100))

    async def fresh_store() -> SessionStore:
        return FilesystemSessionStore(tmp_path / f"store-{next(roots)}")

    await check_store(fresh_store)
    (blocked := tmp_path / "a-file").write_text("not a folder")
    sinks = iter(range(100))
    skipped = await check_sink(
        lambda: FilesystemExportSink(tmp_path / f"exports-{next(sinks)}"),
        lambda: FilesystemExportSink(blocked),
    )
    assert skipped == []


# --- the checks can fail --------------------------------------------------------------


class AcceptsAnyOrder(MemorySessionStore):
    """Broken: stores whatever it is given, following or not."""

    async def append_log(self, run_id: str, entries: Sequence[LogEntry]) -> None:
        log = self.logs.setdefault(run_id, {})
        for entry in entries:
            log[entry.version] = entry


class KeepsAbandonedBranches(MemorySessionStore):
    """Broken: a rewritten version does not drop the entries after it."""

    async def append_log(self, run_id: str, entries: Sequence[LogEntry]) -> None:
        kept = dict(self.logs.get(run_id, {}))
        await super().append_log(run_id, entries)
        self.logs[run_id] = {**kept, **self.logs[run_id]}


async def test_a_store_that_takes_appends_out_of_order_fails(tmp_path: Path) -> None:
    with pytest.raises(AssertionError, match="stored it instead of raising StateMissing"):
        await STORE_CHECKS["an_append_out_of_order_is_refused"](AcceptsAnyOrder())
    with pytest.raises(ConformanceError) as caught:
        await check_store(AcceptsAnyOrder)
    assert "an_append_out_of_order_is_refused" in caught.value.failures
    assert "the session store failed" in str(caught.value)


async def test_a_store_that_keeps_an_abandoned_branch_fails() -> None:
    with pytest.raises(ConformanceError) as caught:
        await check_store(KeepsAbandonedBranches)
    assert "a_rewritten_version_replaces_and_drops_later_entries" in caught.value.failures
    assert "appends_follow_the_chain" not in caught.value.failures


class RefusesRepeats(FilesystemExportSink):
    """Broken: a second delivery of a digest is an error, and ``fetch`` rewrites the content."""

    async def deliver(self, export: SessionCheckpointExportV1) -> None:
        if self.path_for(export).exists():
            raise RuntimeError("already delivered")
        await super().deliver(export)

    async def fetch(self, descriptor: ExportDescriptor) -> SessionCheckpointExportV1 | None:
        export = await super().fetch(descriptor)
        return export and export.model_copy(update={"content": export.content + " "})


class WithoutFetch:
    """A sink that only delivers (allowed), and fails without saying ``SinkError`` (not allowed)."""

    def __init__(self) -> None:
        self.delivered: list[SessionCheckpointExportV1] = []

    async def deliver(self, export: SessionCheckpointExportV1) -> None:
        self.delivered.append(export)


async def test_a_sink_that_refuses_repeats_or_changes_content_fails(tmp_path: Path) -> None:
    with pytest.raises(ConformanceError) as caught:
        await check_sink(lambda: RefusesRepeats(tmp_path / "exports"))
    failed = set(caught.value.failures)
    assert failed >= {"a_repeated_delivery_is_harmless", "delivered_exports_come_back_whole"}
    assert "other content bytes" in str(caught.value.failures["delivered_exports_come_back_whole"])


async def test_a_sink_without_fetch_skips_the_fetch_checks_and_a_silent_failure_fails() -> None:
    skipped = await check_sink(WithoutFetch)
    assert skipped == [
        "delivered_exports_come_back_whole",
        "an_unknown_export_is_not_fetched",
        "exports_delivered_as_parts_come_back_whole",
        "objects_put_come_back_byte_for_byte",
    ]
    with pytest.raises(CheckSkipped):
        await SINK_CHECKS["an_unknown_export_is_not_fetched"](WithoutFetch())
    with pytest.raises(AssertionError, match="deliver returned although"):
        await check_failing_sink(WithoutFetch())


class KeepsOnlyTheFirstPart(FilesystemExportSink):
    """Says it holds every export delivered as parts after the first, but keeps none of them."""

    async def deliver_parts(self, export: PartedExport) -> None:
        if not any(self.root.rglob("turn-*.json")):
            await super().deliver_parts(export)


async def test_a_sink_that_drops_parts_fails_the_parts_check(tmp_path: Path) -> None:
    await SINK_CHECKS["exports_delivered_as_parts_come_back_whole"](FilesystemExportSink(tmp_path / "ok"))
    with pytest.raises(AssertionError, match="turn 2, delivered as parts: fetch gives None"):
        await SINK_CHECKS["exports_delivered_as_parts_come_back_whole"](
            KeepsOnlyTheFirstPart(tmp_path / "bad")
        )


def test_the_sample_exports_are_valid_and_stable() -> None:
    export = sample_export(2)
    assert export == sample_export(2) and export.open().logical_resume.turn == 2
    assert len({sample_export(t).descriptor.content_digest for t in (1, 2, 3)}) == 3


class ForgetsObjects(FilesystemExportSink):
    """Broken: says it holds the objects it is given, keeps none of them."""

    async def put_objects(self, objects: Mapping[str, bytes]) -> None:
        return None


async def test_a_sink_that_forgets_objects_fails_the_objects_check(tmp_path: Path) -> None:
    check = SINK_CHECKS["objects_put_come_back_byte_for_byte"]
    await check(FilesystemExportSink(tmp_path / "ok"))
    with pytest.raises(AssertionError, match="objects put are still named missing"):
        await check(ForgetsObjects(tmp_path / "bad"))
