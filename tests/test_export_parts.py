"""An export built a boundary at a time is byte for byte the export built whole."""

from __future__ import annotations

import random

import pytest

from durable_agent.core.events import ErrorEvent, EventRecord, TextDeltaEvent, ToolStartEvent
from durable_agent.core.export import CheckpointPayload, InvalidPayload, RunRecord, SessionCheckpointExportV1
from durable_agent.core.export_parts import (
    CHAIN_START,
    ExportEncoder,
    PartedExport,
    build_parted,
    chain_of,
)
from durable_agent.core.models import (
    ImageBlock,
    Message,
    TextBlock,
    TokenUsage,
    ToolResultBlock,
    ToolUseBlock,
)
from durable_agent.core.run_log import (
    ExportFacts,
    LogDelta,
    LogEntry,
    RunLog,
    build_export,
    export_payload,
    run_snapshot,
)
from tests.test_run_log import RUN, START, header

TEXTS = [
    "",
    "plain",
    'quote " and \\ slash',
    "line\nbreak\ttab",
    "é ü 漢字 🎉",
    "\u2028\u2029",
    "x" * 3000,
    "\x00\x1f",
]


def random_message(rng: random.Random, index: int) -> Message:
    kind = rng.randrange(3)
    if kind == 0:
        return Message(role="user", content=(TextBlock(text=rng.choice(TEXTS)),))
    if kind == 1:
        call = ToolUseBlock(
            id=f"c{index}", name="read", input={"file_path": rng.choice(TEXTS), "n": index, "f": 1.5}
        )
        return Message(role="assistant", content=(TextBlock(text=rng.choice(TEXTS)), call))
    return Message(
        role="user",
        content=(
            ToolResultBlock(tool_use_id=f"c{index}", content=rng.choice(TEXTS), is_error=rng.random() < 0.2),
        ),
    )


def random_event(rng: random.Random, sequence: int) -> EventRecord:
    event = rng.choice(
        [
            TextDeltaEvent(text=rng.choice(TEXTS)),
            ToolStartEvent(id=f"t{sequence}", name="bash", input={"command": rng.choice(TEXTS)}),
            ErrorEvent(message=rng.choice(TEXTS)),
        ]
    )
    return EventRecord(sequence=sequence, timestamp_ms=1_000 + sequence, event=event)


def ended(run_id: str, events: int) -> RunRecord:
    rng = random.Random(run_id)
    recorded = tuple(random_event(rng, i + 1) for i in range(events))
    return RunRecord(snapshot=run_snapshot(header(run_id, 500), recorded, "completed", 900), events=recorded)


def assert_same(parted: PartedExport, whole: SessionCheckpointExportV1) -> None:
    assert parted.descriptor == whole.descriptor
    assert parted.content() == whole.content.encode("utf-8")
    assert parted.whole() == whole
    assert parted.message_chain == chain_of(parted.messages)
    assert parted.event_chain == chain_of(parted.events)
    assert len(parted.message_chains) == len(parted.messages)


@pytest.mark.parametrize("seed", range(12))
@pytest.mark.parametrize("prior_runs", [0, 1, 3])
def test_a_run_s_exports_built_a_boundary_at_a_time_are_the_exports_built_whole(
    seed: int, prior_runs: int
) -> None:
    rng = random.Random(seed)
    prior = [ended(f"r-{i}", rng.randrange(4)) for i in range(prior_runs)]
    head = header(prior=tuple(r.snapshot.id for r in prior))
    encoder = ExportEncoder()
    log = RunLog(RUN)
    ref, sequence = START, 0
    for turn in range(1, 25):
        roll = rng.random()
        if roll < 0.1 and log.messages:  # a resumed or restored log starts again
            messages = tuple(random_message(rng, i) for i in range(rng.randrange(1, 4)))
            delta = LogDelta(replace=True, messages=messages)
            sequence = 0
        elif roll < 0.25 and log.messages and log.messages[-1].role == "user":
            delta = LogDelta(extend_last=(ToolResultBlock(tool_use_id="x", content=rng.choice(TEXTS)),))
        else:
            new = tuple(random_message(rng, turn * 10 + i) for i in range(rng.randrange(0, 3)))
            events = tuple(random_event(rng, sequence + i + 1) for i in range(rng.randrange(0, 4)))
            sequence += len(events)
            delta = LogDelta(messages=new, events=events)
        entry = LogEntry.after(ref, delta)
        log.apply(entry)
        ref = entry.ref(RUN)
        if not log.messages:
            continue
        facts = ExportFacts(
            turn=turn,
            checkpoint_ms=10_000 + turn,
            updated_at_ms=10_000 + turn,
            usage=TokenUsage(total_tokens=turn),
        )
        whole = build_export(head, log, prior, facts)
        parted = build_parted(encoder, export_payload(head, log, prior, facts))
        assert_same(parted, whole)
        parted.whole().open()


def test_a_fresh_encoder_and_a_kept_one_agree() -> None:
    rng = random.Random(7)
    log = RunLog(RUN)
    kept = ExportEncoder()
    ref = START
    for turn in range(1, 6):
        entry = LogEntry.after(ref, LogDelta(messages=(random_message(rng, turn),)))
        log.apply(entry)
        ref = entry.ref(RUN)
        facts = ExportFacts(turn=turn, checkpoint_ms=turn, updated_at_ms=turn, usage=TokenUsage())
        payload = export_payload(header(), log, [], facts)
        assert build_parted(kept, payload) == build_parted(ExportEncoder(), payload)


def _with_message(payload: CheckpointPayload, message: Message) -> CheckpointPayload:
    logical = payload.logical_resume
    return payload.model_copy(
        update={"logical_resume": logical.model_copy(update={"messages": (*logical.messages, message)})}
    )


def _with_event(payload: CheckpointPayload, event: EventRecord) -> CheckpointPayload:
    record = payload.source_run()
    snapshot = record.snapshot.model_copy(update={"event_count": record.snapshot.event_count + 1})
    grown = RunRecord(snapshot=snapshot, events=(*record.events, event))
    records = tuple(grown if r is record else r for r in payload.snapshot.run_records)
    return payload.model_copy(
        update={"snapshot": payload.snapshot.model_copy(update={"run_records": records})}
    )


@pytest.mark.parametrize("prior_runs", [0, 2])
def test_a_kept_encoder_checks_only_what_a_boundary_adds_and_refuses_what_a_fresh_one_refuses(
    prior_runs: int,
) -> None:
    rng = random.Random(11)
    prior = [ended(f"r-{i}", 3) for i in range(prior_runs)]
    head = header(prior=tuple(r.snapshot.id for r in prior))
    log, ref = RunLog(RUN), START
    for turn in range(1, 5):
        events = (random_event(rng, turn),)
        entry = LogEntry.after(ref, LogDelta(messages=(random_message(rng, turn),), events=events))
        log.apply(entry)
        ref = entry.ref(RUN)
    facts = ExportFacts(turn=4, checkpoint_ms=4, updated_at_ms=4, usage=TokenUsage())
    payload = export_payload(head, log, prior, facts)
    kept = ExportEncoder()
    build_parted(kept, payload)

    no_data = ImageBlock(media_type="image/png", digest="sha256:" + "a" * 64, size=3)
    image = Message(role="user", content=(ToolResultBlock(tool_use_id="c", content="", images=(no_data,)),))
    last = payload.source_run().events[-1]
    again = EventRecord(sequence=last.sequence, timestamp_ms=last.timestamp_ms, event=ErrorEvent(message="x"))
    for bad, refusal in [
        (_with_message(payload, image), "has no data"),
        (_with_event(payload, again), "do not strictly increase"),
    ]:
        for encoder in (kept, ExportEncoder(), kept):  # the kept one twice: a refusal changes nothing
            with pytest.raises(InvalidPayload, match=refusal):
                encoder.draft(bad)

    # after the refusals the kept encoder builds the next good boundary as a fresh one does
    good = _with_message(payload, Message(role="user", content=(TextBlock(text="next"),)))
    assert build_parted(kept, good) == build_parted(ExportEncoder(), good)


def test_the_chain_of_nothing_is_the_start() -> None:
    assert chain_of([]) == CHAIN_START
    assert chain_of([b"a"]) != chain_of([b"b"]) != chain_of([b"a", b"b"])
