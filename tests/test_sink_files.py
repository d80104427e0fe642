"""The filesystem sink stores what each boundary adds, and gives every export back whole."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from durable_agent.activities.sink_files import MANIFEST_SCHEMA, ManifestError, read_export_file
from durable_agent.activities.sinks import FilesystemExportSink
from durable_agent.core.events import EventRecord, ToolStartEvent
from durable_agent.core.export import ContentDrift, SessionCheckpointExportV1
from durable_agent.core.export_parts import ExportEncoder, PartedExport, build_parted
from durable_agent.core.models import Message, TextBlock, TokenUsage, ToolResultBlock
from durable_agent.core.run_log import ExportFacts, LogDelta, LogEntry, RunLog, build_export, export_payload
from tests.test_export_parts import ended
from tests.test_run_log import RUN, START, header


class Run:
    """A run that grows by one tool output a boundary, exported as parts."""

    def __init__(self, output_bytes: int = 5_000, prior: int = 0) -> None:
        self.output = output_bytes
        self.prior = [ended(f"r-{i}", 3) for i in range(prior)]
        self.header = header(prior=tuple(r.snapshot.id for r in self.prior))
        self.log = RunLog(RUN)
        self.ref = START
        self.turn = 0
        self.encoder = ExportEncoder()

    def grow(self, delta: LogDelta | None = None) -> tuple[PartedExport, SessionCheckpointExportV1]:
        self.turn += 1
        n = self.turn
        if delta is None:
            text = f"{n:06d}" + "é\n" * (self.output // 3)
            event = EventRecord(sequence=n, timestamp_ms=n, event=ToolStartEvent(id=f"c{n}", name="read"))
            delta = LogDelta(
                messages=(
                    Message(role="user", content=(ToolResultBlock(tool_use_id=f"c{n}", content=text),)),
                ),
                events=(event,),
            )
        entry = LogEntry.after(self.ref, delta)
        self.log.apply(entry)
        self.ref = entry.ref(RUN)
        facts = ExportFacts(turn=n, checkpoint_ms=n, updated_at_ms=n, usage=TokenUsage(total_tokens=n))
        parted = build_parted(self.encoder, export_payload(self.header, self.log, self.prior, facts))
        return parted, build_export(self.header, self.log, self.prior, facts)


def sink_bytes(root: Path) -> int:
    return sum(p.stat().st_size for p in root.rglob("*") if p.is_file())


async def test_every_export_comes_back_whole_and_the_sink_grows_with_what_is_new(tmp_path: Path) -> None:
    sink = FilesystemExportSink(tmp_path)
    run = Run(prior=2)
    delivered = []
    for _ in range(120):
        parted, whole = run.grow()
        await sink.deliver_parts(parted)
        await sink.deliver_parts(parted)  # a repeat is a no-op
        delivered.append(whole)
    for whole in delivered[::7] + delivered[-1:]:
        fetched = await sink.fetch(whole.descriptor)
        assert fetched == whole
        fetched.open()
        [path] = tmp_path.rglob(f"turn-{whole.descriptor.turn:06d}-*.json")
        assert read_export_file(path) == whole
        assert json.loads(path.read_text())["schema"] == MANIFEST_SCHEMA
    final = delivered[-1].descriptor.size_bytes
    # the sum of all 120 exports is about 60 times the last one; the sink holds each item once
    assert sum(e.descriptor.size_bytes for e in delivered) > 50 * final
    assert sink_bytes(tmp_path) < 1.5 * final


async def test_a_new_sink_continues_from_the_newest_manifest_on_disk(tmp_path: Path) -> None:
    run = Run()
    for _ in range(30):
        await FilesystemExportSink(tmp_path).deliver_parts(run.grow()[0])
    before = sink_bytes(tmp_path)
    parted, whole = run.grow()
    await FilesystemExportSink(tmp_path).deliver_parts(parted)  # a worker that never saw this run
    assert sink_bytes(tmp_path) - before < 3 * (run.output + 2_000)
    assert await FilesystemExportSink(tmp_path).fetch(whole.descriptor) == whole


async def test_a_conversation_that_starts_again_is_written_whole_once(tmp_path: Path) -> None:
    sink = FilesystemExportSink(tmp_path)
    run = Run()
    for _ in range(5):
        await sink.deliver_parts(run.grow()[0])
    restart = LogDelta(replace=True, messages=(Message(role="user", content=(TextBlock(text="again"),)),))
    exports = [run.grow(restart), run.grow(), run.grow()]
    for parted, whole in exports:
        await sink.deliver_parts(parted)
        assert await sink.fetch(whole.descriptor) == whole


async def test_a_damaged_or_missing_part_is_a_typed_error_never_a_wrong_export(tmp_path: Path) -> None:
    sink = FilesystemExportSink(tmp_path)
    run = Run()
    wholes = []
    for _ in range(3):
        parted, whole = run.grow()
        await sink.deliver_parts(parted)
        wholes.append(whole)
    parts = sorted((p for p in tmp_path.rglob("parts/*")), key=lambda p: p.stat().st_mtime_ns)
    first = parts[0]
    data = first.read_bytes()
    first.write_bytes(data.replace(b"000001", b"000009"))
    with pytest.raises(ManifestError, match="damaged"):
        await sink.fetch(wholes[-1].descriptor)
    first.unlink()
    with pytest.raises(ManifestError, match="missing"):
        await sink.fetch(wholes[-1].descriptor)
    # a manifest edited to name other counts does not add up, or its content fails the digest
    [path] = tmp_path.rglob("turn-000002-*.json")
    manifest = json.loads(path.read_text())
    manifest["logical_tail"] = manifest["logical_tail"].replace('"turn":2', '"turn":3')
    path.write_text(json.dumps(manifest))
    [later] = tmp_path.rglob("turn-000003-*.json")
    assert later.exists()
    with pytest.raises((ManifestError, ContentDrift)):
        read_export_file(path).open()


async def test_an_export_written_whole_by_an_earlier_version_is_still_read(tmp_path: Path) -> None:
    sink = FilesystemExportSink(tmp_path)
    run = Run()
    _, whole = run.grow()
    await sink.deliver(whole)  # the one-document file every earlier version wrote
    [path] = tmp_path.rglob("turn-*.json")
    assert set(json.loads(path.read_text())) == {"descriptor", "content"}
    assert read_export_file(path) == whole == await sink.fetch(whole.descriptor)
    parted, whole2 = run.grow()  # the next boundary, as parts, after a whole file
    await sink.deliver_parts(parted)
    assert await sink.fetch(whole2.descriptor) == whole2


async def test_a_manifest_whose_part_was_lost_is_written_again_on_redelivery(tmp_path: Path) -> None:
    """A machine that crashed after the manifest's rename may have lost its part's."""
    run = Run()
    sink = FilesystemExportSink(tmp_path)
    for _ in range(3):
        parted, whole = run.grow()
        await sink.deliver_parts(parted)
    [path] = tmp_path.rglob("turn-000003-*.json")
    head = json.loads(path.read_text())["messages"]["part"]
    (path.parent / "parts" / head).unlink()
    with pytest.raises(ManifestError, match="missing"):
        read_export_file(path)
    await FilesystemExportSink(tmp_path).deliver_parts(parted)  # the activity's retry, or another worker's
    assert read_export_file(path) == whole
