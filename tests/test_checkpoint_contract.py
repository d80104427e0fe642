"""The export contract without a server: building, opening, tampering, determinism."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from durable_agent.activities.sinks import FilesystemExportSink, read_export_file
from durable_agent.core.builtin_catalog import BUILTIN_TOOLS
from durable_agent.core.canonical import canonical_bytes, digest_of, sha256_digest
from durable_agent.core.export import (
    CheckpointPayload,
    ContentDrift,
    EncodingError,
    InvalidDescriptor,
    InvalidPayload,
    SessionCheckpointExportV1,
    open_export,
)
from durable_agent.core.loop import LoopState
from durable_agent.core.models import Message, ModelResponse, TextBlock, TokenUsage, ToolUseBlock
from durable_agent.core.permissions import PermissionPolicy
from durable_agent.core.plan import RunPlan
from durable_agent.core.run_log import RunLog, build_export
from durable_agent.core.tool_specs import capability_binding


def plan() -> RunPlan:
    offers = tuple(s.offer() for s in BUILTIN_TOOLS.values())
    policy = PermissionPolicy(allow=("read(*)",))
    return RunPlan(
        session_id="s1",
        run_id="run-1",
        prompt="read it",
        workspace="/w",
        model="scripted/static",
        system_prompt="sys",
        tools=offers,
        permissions=policy,
        capability_binding=capability_binding((o.definition for o in offers), policy),
        export_sink="local",
        max_tool_rounds=5,
    )


def state_at_boundary(turns: int = 1) -> LoopState:
    state = LoopState(plan(), now_ms=1_000)
    for i in range(turns):
        call = ToolUseBlock(id=f"c{i}", name="read", input={"file_path": "a.txt"})
        response = ModelResponse(
            message=Message(role="assistant", content=(call,)), usage=TokenUsage(total_tokens=3)
        )
        state.add_model_response(response, 2_000 + i)
        state.add_tool_result(call, "     1\tä ☃ text", False, 3_000 + i)
    return state


def export_at(state: LoopState, now_ms: int) -> SessionCheckpointExportV1:
    """The export an activity builds from the store's copy of ``state``'s log."""
    state.journal.take_entry()
    log = RunLog(state.plan.run_id)
    log.apply_all(state.journal.entries)
    return build_export(state.journal.header(), log, [], state.export_facts(now_ms))


def test_the_same_boundary_always_gives_the_same_bytes() -> None:
    a = export_at(state_at_boundary(), 5_000)
    b = export_at(state_at_boundary(), 5_000)
    assert a == b
    content = a.content.encode()
    assert a.descriptor.content_digest == "sha256:" + hashlib.sha256(content).hexdigest()
    assert a.descriptor.size_bytes == len(content)
    assert canonical_bytes(json.loads(content)) == content  # canonical: sorted keys, no spaces
    payload = a.open()
    assert payload.logical_resume.turn == 1
    assert payload.logical_resume.total_usage.total_tokens == 3
    # built from its two parts, the content is the payload's canonical JSON all the same
    assert content == canonical_bytes(payload)
    assert a.descriptor.snapshot_digest == digest_of(payload.snapshot)
    assert a.descriptor.logical_resume_digest == digest_of(payload.logical_resume)


def test_successive_boundaries_differ_and_grow() -> None:
    one = export_at(state_at_boundary(1), 5_000)
    two = export_at(state_at_boundary(2), 5_000)
    assert one.descriptor.content_digest != two.descriptor.content_digest
    assert one.descriptor.snapshot_digest != two.descriptor.snapshot_digest
    assert two.open().source_run().snapshot.event_count > one.open().source_run().snapshot.event_count


def _tampered(export: SessionCheckpointExportV1, **changes: object) -> SessionCheckpointExportV1:
    return SessionCheckpointExportV1.model_construct(
        descriptor=changes.pop("descriptor", export.descriptor),  # type: ignore[arg-type]
        content=changes.pop("content", export.content),  # type: ignore[arg-type]
    )


def test_opening_refuses_every_kind_of_tampering() -> None:
    good = export_at(state_at_boundary(), 5_000)
    d = good.descriptor
    # a changed byte of content
    with pytest.raises(ContentDrift):
        open_export(_tampered(good, content=good.content.replace("text", "tExt")))
    # a truncated content
    with pytest.raises(ContentDrift):
        open_export(_tampered(good, content=good.content[:-10]))
    # a descriptor edited without its own digest
    with pytest.raises(InvalidDescriptor):
        open_export(_tampered(good, descriptor=d.model_copy(update={"turn": 7})))
    # re-encoded with white space, digests recomputed: not canonical
    pretty = json.dumps(json.loads(good.content), indent=1, sort_keys=True)
    with pytest.raises(EncodingError):
        open_export(_with_digests(good, pretty))
    # not JSON at all
    with pytest.raises(EncodingError):
        open_export(_with_digests(good, "{not json"))
    # canonical and digested, but not self-consistent: the source run is terminal
    raw = json.loads(good.content)
    raw["snapshot"]["run_records"][0]["snapshot"]["status"] = "completed"
    with pytest.raises(InvalidPayload, match="terminal"):
        open_export(_with_digests(good, canonical_bytes(raw).decode()))
    # the logical resume names a run that is not in the snapshot
    raw = json.loads(good.content)
    raw["logical_resume"]["run_id"] = "elsewhere"
    with pytest.raises(InvalidPayload, match="not in the snapshot"):
        open_export(_with_digests(good, canonical_bytes(raw).decode()))


def _with_digests(good: SessionCheckpointExportV1, content: str) -> SessionCheckpointExportV1:
    """Content with a descriptor whose every digest was recomputed to match (a forger's export)."""
    fields = good.descriptor.model_dump(mode="json", exclude={"descriptor_digest"})
    fields["size_bytes"] = len(content.encode())
    fields["content_digest"] = sha256_digest(content.encode())
    try:
        raw = json.loads(content)
        fields["snapshot_digest"] = digest_of(raw["snapshot"])
        fields["logical_resume_digest"] = digest_of(raw["logical_resume"])
        fields["run_id"] = raw["logical_resume"]["run_id"]
    except json.JSONDecodeError:
        pass
    descriptor = good.descriptor.model_validate({**fields, "descriptor_digest": digest_of(fields)})
    return _tampered(good, descriptor=descriptor, content=content)


def test_building_refuses_an_inconsistent_payload() -> None:
    payload = export_at(state_at_boundary(), 5_000).open()
    bad = CheckpointPayload(
        logical_resume=payload.logical_resume.model_copy(update={"turn": 0}), snapshot=payload.snapshot
    )
    with pytest.raises(InvalidPayload, match="turn"):
        SessionCheckpointExportV1.build(bad)


async def test_filesystem_sink_orders_files_and_dedupes_by_digest(tmp_path: Path) -> None:
    sink = FilesystemExportSink(tmp_path)
    exports = [export_at(state_at_boundary(n), 5_000) for n in (1, 2, 10)]
    for e in [exports[2], exports[0], exports[1], exports[0]]:
        await sink.deliver(e)
    files = sorted(tmp_path.rglob("*.json"))
    assert [read_export_file(f).descriptor.turn for f in files] == [1, 2, 10]
    for f, e in zip(files, exports, strict=True):
        opened = read_export_file(f)
        assert opened == e and opened.open() == e.open()
        doc = json.loads(f.read_text())
        assert (
            "sha256:" + hashlib.sha256(doc["content"].encode()).hexdigest()
            == doc["descriptor"]["content_digest"]
        )
    assert not list(tmp_path.rglob("*.tmp"))


def test_text_and_tool_results_shape_the_conversation() -> None:
    state = LoopState(plan(), now_ms=0)
    calls = (
        ToolUseBlock(id="a", name="read", input={"file_path": "x"}),
        ToolUseBlock(id="b", name="ls", input={}),
    )
    response = ModelResponse(message=Message(role="assistant", content=(TextBlock(text="hi"), *calls)))
    assert state.add_model_response(response, 1) == list(calls)
    state.add_tool_result(calls[0], "x", False, 2)
    state.add_tool_result(calls[1], "boom", True, 3)
    last = state.journal.pending().messages[-1]
    assert last.role == "user" and [b.tool_use_id for b in last.content] == ["a", "b"]  # type: ignore[union-attr]
    assert state.turn == 2 and state.tool_rounds == 1
    assert [e.event.type for e in state.journal.events] == ["run_start", "text_delta", "tool_end", "tool_end"]


def test_events_carry_a_preview_of_long_tool_inputs_and_outputs() -> None:
    from durable_agent.core.events import TOOL_OUTPUT_PREVIEW_CHARS, ToolEndEvent, ToolStartEvent

    big = "x" * (TOOL_OUTPUT_PREVIEW_CHARS + 500)
    start = ToolStartEvent.of("w1", "write", {"file_path": "a.txt", "content": big})
    assert start.input["file_path"] == "a.txt"
    assert start.input["content"].endswith("…[500 more characters]")
    end = ToolEndEvent.of("w1", "read", big, False)
    assert len(end.output) == TOOL_OUTPUT_PREVIEW_CHARS and end.output_chars == len(big)
