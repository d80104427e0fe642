"""The run log without a server: the digest chain, the fold, staging, both stores, the
per-worker cache of folded logs, and how ``LoopState`` journals, carries and restores a run."""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest
from temporalio.testing import ActivityEnvironment

from durable_agent.activities import AgentActivities
from durable_agent.activities.store import FilesystemSessionStore, MemorySessionStore
from durable_agent.activities.store.run_log_cache import RunLogCache
from durable_agent.core import models
from durable_agent.core.activity_api import CheckpointInput, ExportInput, OpenRunInput, SaveCheckpointInput
from durable_agent.core.canonical import canonical_bytes, digest_of
from durable_agent.core.events import ErrorEvent, TextDeltaEvent, ToolStartEvent
from durable_agent.core.export import RunRecord
from durable_agent.core.journal import CARRIED_EVENTS
from durable_agent.core.loop import LoopState
from durable_agent.core.models import Message, ModelResponse, TextBlock, ToolResultBlock, ToolUseBlock
from durable_agent.core.run_api import CarriedState
from durable_agent.core.run_log import (
    GENESIS,
    STAGE_MIN_BYTES,
    LogDelta,
    LogEntry,
    LogRef,
    RunHeader,
    RunLog,
    Staged,
    StateMissing,
    build_export,
    run_snapshot,
    text_digest,
)
from tests.helpers import RecordingSink, final, scripted_config
from tests.test_checkpoint_contract import plan

RUN = plan().run_id
START = LogRef(run_id=RUN, version=0)
UNKNOWN = "sha256:" + "d" * 64
CALL_A = ToolUseBlock(id="a", name="read", input={"file_path": "x"})
CALL_B = ToolUseBlock(id="b", name="ls", input={})
STEP = Message(role="assistant", content=(TextBlock(text="look"), CALL_A, CALL_B))
STEP_USAGE = models.TokenUsage(total_tokens=5)  # what the provider reports for STEP
FINAL = Message(role="assistant", content=(TextBlock(text="done"),))


def msg(text: str) -> Message:
    return Message(role="user", content=(TextBlock(text=text),))


def result(call_id: str, content: str, is_error: bool = False) -> ToolResultBlock:
    return ToolResultBlock(tool_use_id=call_id, content=content, is_error=is_error)


RES_A, RES_B = result("a", "out-a"), result("b", "out-b")
BOTH = Message(role="user", content=(RES_A, RES_B))


def ref(version: int, digest: str = UNKNOWN) -> LogRef:
    return LogRef(run_id=RUN, version=version, digest=digest)


def chain(texts: Sequence[str], head: LogRef = START) -> list[LogEntry]:
    entries = []
    for text in texts:
        entries.append(LogEntry.after(head, LogDelta(messages=(msg(text),))))
        head = entries[-1].ref(RUN)
    return entries


def header(run_id: str = RUN, created_at_ms: int = 1_000, prior: tuple[str, ...] = ()) -> RunHeader:
    update = {"run_id": run_id, "created_at_ms": created_at_ms, "prior_run_ids": prior}
    return LoopState(plan(), now_ms=1_000).journal.header().model_copy(update=update)


def record(run_id: str, created_at_ms: int, session_id: str = "s1") -> RunRecord:
    ended = header(run_id, created_at_ms).model_copy(update={"session_id": session_id})
    return RunRecord(snapshot=run_snapshot(ended, (), "completed", created_at_ms + 5), events=())


def folded(entries: Sequence[LogEntry]) -> RunLog:
    log = RunLog(RUN)
    log.apply_all(entries)
    return log


def step_with_first_result() -> LoopState:
    """A run whose model asked for calls a and b; a's result is in the journal, b is still due."""
    state = LoopState(plan(), now_ms=1_000)
    state.journal.take_entry()
    calls = state.add_model_response(ModelResponse(message=STEP, usage=STEP_USAGE), 2_000)
    assert calls == [CALL_A, CALL_B]
    state.add_tool_result(CALL_A, "out-a", False, 3_000)
    state.journal.take_entry()
    return state


def hand_chained(parent: str, delta: LogDelta) -> str:
    body = hashlib.sha256(canonical_bytes(delta.model_dump(mode="json", exclude_defaults=True))).hexdigest()
    return "sha256:" + hashlib.sha256(f"{parent}\n{body}".encode()).hexdigest()


class LaterDelta(LogDelta):
    """``LogDelta`` as a later version might extend it, with fields that default to nothing."""

    note: str | None = None
    tags: tuple[str, ...] = ()


def test_a_digest_chains_its_parent_and_its_delta() -> None:
    delta = LogDelta(messages=(msg("hi"),))
    first = LogEntry.after(START, delta)
    assert (first.version, first.parent, first.digest) == (1, GENESIS, hand_chained(GENESIS, delta))
    second = LogEntry.after(first.ref(RUN), delta)
    assert (second.version, second.parent) == (2, first.digest)
    assert second.digest == hand_chained(first.digest, delta) != first.digest
    assert LogEntry.after(first.ref(RUN), LogDelta(messages=(msg("hi!"),))).digest != second.digest
    assert LogDelta(replace=True, messages=delta.messages).chained(GENESIS) != first.digest
    # defaults, nested ones included, are left out of the chained JSON
    chained_json = canonical_bytes(delta.model_dump(mode="json", exclude_defaults=True))
    assert chained_json == b'{"messages":[{"content":[{"text":"hi"}],"role":"user"}]}'
    assert LogDelta(replace=False, extend_last=(), messages=delta.messages).chained(GENESIS) == first.digest
    # a field added with a default does not change the chain of an existing log
    assert LaterDelta(messages=delta.messages).chained(GENESIS) == first.digest
    assert LaterDelta(messages=delta.messages, note="n").chained(GENESIS) != first.digest


def test_the_fold_reproduces_the_loop_s_conversation_and_refuses_an_entry_that_does_not_follow() -> None:
    state = step_with_first_result()
    state.add_tool_result(CALL_B, "out-b", False, 4_000)
    # what the model would see before the save: the saved log plus what is pending
    assert folded(state.journal.entries).with_pending(state.journal.pending()) == [
        msg("read it"),
        STEP,
        BOTH,
    ]
    third = state.journal.take_entry()
    assert third is not None and third.delta.messages == () and third.delta.extend_last == (RES_B,)
    assert state.add_model_response(ModelResponse(message=FINAL), 5_000) == []
    state.journal.take_entry()
    log = folded(state.journal.entries)
    assert (log.messages, log.events) == ([msg("read it"), STEP, BOTH, FINAL], state.journal.events)
    assert log.ref == state.journal.head and log.version == 4
    one, two = state.journal.entries[:2]
    for stranger in (third, LogEntry.after(ref(1), two.delta)):
        with pytest.raises(StateMissing) as info:
            folded([one]).apply(stranger)
        assert info.value.head == one.ref(RUN)
    with pytest.raises(StateMissing):  # results for a message that is not one of tool results
        log.apply(LogEntry.after(log.ref, LogDelta(extend_last=(RES_A,))))
    whole = LogEntry.after(ref(9), LogDelta(replace=True, messages=(msg("w"),)))
    log.apply(whole)
    assert (log.messages, log.events, log.ref) == ([msg("w")], [], whole.ref(RUN))


def test_staging_empties_the_named_outputs_and_the_restored_delta_keeps_its_digest() -> None:
    long_a, long_c, short_b = "a" * STAGE_MIN_BYTES, "ä ☃" * STAGE_MIN_BYTES, "b" * 10
    results = Message(role="user", content=(result("a", long_a), result("b", short_b)))
    delta = LogDelta(extend_last=(result("c", long_c),), messages=(STEP, results))
    entry = LogEntry.after(ref(3), delta)
    wire, staged = delta.staged({"a", "c", "z"})  # z: an output in an earlier entry
    named = [(s.kind, s.key, s.digest) for s in staged]
    assert named == [("tool_result", "c", text_digest(long_c)), ("tool_result", "a", text_digest(long_a))]
    assert wire.extend_last == (result("c", ""),)
    assert wire.messages == (STEP, Message(role="user", content=(result("a", ""), result("b", short_b))))
    assert wire.chained(entry.parent) != entry.digest
    restored = wire.unstaged({staged[0]: long_c, staged[1]: long_a})
    assert restored == delta and restored.chained(entry.parent) == entry.digest
    assert delta.staged(set()) == delta.staged({"z"}) == (delta, ())


def test_a_staged_model_message_is_named_by_its_index_and_digest() -> None:
    long_step = Message(role="assistant", content=(TextBlock(text="x" * STAGE_MIN_BYTES), CALL_A))
    delta = LogDelta(messages=(msg("hi"), long_step))
    entry = LogEntry.after(ref(1), delta)
    wire, staged = delta.staged(set(), {digest_of(long_step), "sha256:other"})
    assert staged == (Staged(kind="message", key="1", digest=digest_of(long_step)),)
    assert wire.messages == (msg("hi"), Message(role="assistant", content=()))
    restored = wire.unstaged({staged[0]: canonical_bytes(long_step).decode()})
    assert restored == delta and restored.chained(entry.parent) == entry.digest


def test_the_loop_names_staged_outputs_until_a_save_is_acknowledged() -> None:
    state = LoopState(plan(), now_ms=1_000)
    state.journal.take_entry()
    state.journal.mark_stored()
    state.add_model_response(ModelResponse(message=STEP), 2_000)
    state.add_tool_result(CALL_A, "a" * STAGE_MIN_BYTES, False, 3_000, staged=True)
    first = state.journal.take_entry()
    state.add_tool_result(CALL_B, "out-b", False, 4_000)
    second = state.journal.take_entry()
    assert first is not None and second is not None
    assert state.journal.staged_ids == {"a"}  # a failed save: the next one still names it
    assert first.delta.staged(state.journal.staged_ids)[1][0].key == "a"
    assert second.delta.staged(state.journal.staged_ids) == (second.delta, ())
    state.journal.mark_stored()
    assert (
        state.journal.staged_ids == set()
        and state.journal.stored == state.journal.head
        and state.journal.unstored() == []
    )


# The store contract (appends, branches, replaces, headers, staged texts, records, drop_run) is
# checked on both stores by tests/test_conformance.py, from durable_agent.conformance.


async def test_a_new_filesystem_store_on_the_same_folder_sees_the_same_state(tmp_path: Path) -> None:
    root = tmp_path / "store"
    first = FilesystemSessionStore(root)
    v1, v2, v3 = chain(["m1", "m2", "m3"])
    await first.save_header(header())
    await first.append_log(RUN, [v1, v2])
    [v1_file] = root.rglob("0000000001.json")
    inode = v1_file.stat().st_ino
    await first.append_log(RUN, [v3])
    assert v1_file.stat().st_ino == inode  # appending does not rewrite the entries there
    await first.stage_text(RUN, text_digest("big"), "big")
    await first.save_run_record(record("r-0", 10))
    second = FilesystemSessionStore(root)  # another worker process
    assert await second.load_header(RUN) == header()
    assert await second.read_log(RUN, 0, 9) == [v1, v2, v3] and await second.log_head(RUN) == v3.ref(RUN)
    assert await second.staged_text(RUN, text_digest("big")) == "big"
    assert await second.load_run_records("s1") == [record("r-0", 10)]
    (b2,) = chain(["branch"], v1.ref(RUN))
    await second.append_log(RUN, [b2])
    assert await first.read_log(RUN, 0, 9) == [v1, b2]
    assert not list(tmp_path.rglob("*.tmp"))


class CountingStore(MemorySessionStore):
    def __init__(self) -> None:
        super().__init__()
        self.reads = 0

    async def read_log(self, run_id: str, after: int, upto: int) -> list[LogEntry]:
        self.reads += 1
        return await super().read_log(run_id, after, upto)


def texts(log: RunLog) -> list[str]:
    return [m.text() for m in log.messages]


async def test_run_log_cache_folds_once_and_follows_appends() -> None:
    store = CountingStore()
    v1, v2, v3, v4 = chain(["m1", "m2", "m3", "m4"])
    await store.append_log(RUN, [v1, v2, v3])
    log_cache = RunLogCache(store)
    log = await log_cache.read(v3.ref(RUN))
    assert texts(log) == ["m1", "m2", "m3"] and log.ref == v3.ref(RUN) and store.reads == 1
    assert await log_cache.read(v3.ref(RUN)) is log and store.reads == 1
    await log_cache.append(RUN, [v4])
    assert await store.log_head(RUN) == v4.ref(RUN)
    assert texts(await log_cache.read(v4.ref(RUN))) == ["m1", "m2", "m3", "m4"] and store.reads == 1
    (b3,) = chain(["b3"], v2.ref(RUN))  # the run went back: a branch after v2
    await log_cache.append(RUN, [b3])
    assert texts(await log_cache.read(b3.ref(RUN))) == ["m1", "m2", "b3"] and store.reads == 2
    assert texts(await log_cache.read(v2.ref(RUN))) == ["m1", "m2"] and store.reads == 3


async def test_run_log_cache_reports_what_the_store_holds_instead() -> None:
    store = MemorySessionStore()
    v1, v2 = chain(["m1", "m2"])
    await store.append_log(RUN, [v1, v2])
    log_cache = RunLogCache(store)
    for _ in ("before v2 is cached", "after"):
        for wanted in (ref(3, v2.digest), ref(2, v1.digest)):
            with pytest.raises(StateMissing) as info:
                await log_cache.read(wanted)
            assert info.value.head == v2.ref(RUN)
        assert (await log_cache.read(v2.ref(RUN))).ref == v2.ref(RUN)
    with pytest.raises(StateMissing) as lost:  # a fresh store: it lost the run
        await RunLogCache(MemorySessionStore()).read(v2.ref(RUN))
    assert lost.value.head is None


class GatedStore(MemorySessionStore):
    """A store whose appends wait for ``gate`` and then fail, if ``fail`` says so."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = asyncio.Event()
        self.fail = False

    async def append_log(self, run_id: str, entries: Sequence[LogEntry]) -> None:
        await self.gate.wait()
        if self.fail:
            raise OSError("disk full")
        await super().append_log(run_id, entries)


async def test_run_log_cache_works_on_the_folded_log_while_the_store_writes() -> None:
    store = GatedStore()
    v1, v2, v3 = chain(["m1", "m2", "m3"])
    store.gate.set()
    await store.append_log(RUN, [v1])
    log_cache = RunLogCache(store)
    await log_cache.read(v1.ref(RUN))
    store.gate.clear()
    seen: list[list[str]] = []

    async def work() -> str:
        seen.append(texts(await log_cache.read(v2.ref(RUN))))  # folded ahead: the store still lacks v2
        assert await store.log_head(RUN) == v1.ref(RUN)
        store.gate.set()
        return "built"

    assert await log_cache.append_while(RUN, [v2], work) == "built"
    assert seen == [["m1", "m2"]] and await store.log_head(RUN) == v2.ref(RUN)
    # a write that fails: its error is raised, the work's result dropped, the cache forgets the run
    store.gate.clear()
    store.fail = True

    async def released() -> str:
        store.gate.set()
        return "built"

    with pytest.raises(OSError, match="disk full"):
        await log_cache.append_while(RUN, [v3], released)
    assert await store.log_head(RUN) == v2.ref(RUN)
    with pytest.raises(StateMissing):  # not served from memory: the store does not hold v3
        await log_cache.read(v3.ref(RUN))
    assert texts(await log_cache.read(v2.ref(RUN))) == ["m1", "m2"]
    # a log the cache does not hold: written first, the work after
    store.fail = False
    order: list[str] = []

    async def after_the_write() -> str:
        order.append("work: store at " + str((await store.log_head("other")) is not None))
        return "built"

    (o1,) = chain(["o1"], LogRef(run_id="other", version=0))
    assert await log_cache.append_while("other", [o1], after_the_write) == "built"
    assert order == ["work: store at True"]


async def test_run_log_cache_gives_only_the_prior_runs_the_header_names() -> None:
    store = MemorySessionStore()
    for run_id, created in [("r-1", 10), ("r-2", 20), ("r-3", 30), (RUN, 40)]:
        await store.save_run_record(record(run_id, created))
    log_cache = RunLogCache(store)
    assert await log_cache.prior_runs(header(prior=("r-3", "r-1"))) == [record("r-1", 10), record("r-3", 30)]
    assert await log_cache.prior_runs(header("run-2")) == []


def test_unstored_keeps_every_entry_a_failed_save_left() -> None:
    state = LoopState(plan(), now_ms=1_000)
    seed = state.journal.take_entry()
    state.add_model_response(ModelResponse(message=STEP), 2_000)
    state.add_tool_result(CALL_A, "out-a", False, 3_000)
    second = state.journal.take_entry()
    assert seed is not None and second is not None
    assert state.journal.take_entry() is None  # nothing new
    assert state.journal.unstored() == [seed, second] and not state.journal.can_carry()
    state.journal.stored = seed.ref(RUN)
    assert state.journal.unstored() == [second]
    late = state.journal.emit(ErrorEvent(message="late"), 4_000)
    finish = state.journal.finish_input(state.status, state.final_text, state.error)
    assert finish.log == seed.ref(RUN) and finish.events == (*second.delta.events, late)
    state.journal.mark_stored()
    assert state.journal.unstored() == [] and state.journal.can_carry()


def test_entries_after_names_what_a_store_lacks() -> None:
    state = step_with_first_result()
    state.add_tool_result(CALL_B, "out-b", False, 4_000)
    state.journal.take_entry()
    e1, e2, e3 = state.journal.entries
    assert (
        state.journal.entries_after(state.journal.seed) == state.journal.entries_after(None) == [e1, e2, e3]
    )
    assert state.journal.entries_after(e1.ref(RUN)) == [e2, e3]
    assert state.journal.entries_after(e3.ref(RUN)) == []
    assert state.journal.entries_after(ref(2)) == [e1, e2, e3]  # the seed is version 0: send everything
    state.journal.mark_stored()
    later = LoopState.restore(state.carry(2))
    later.add_model_response(ModelResponse(message=FINAL), 5_000)
    e4 = later.journal.take_entry()
    later.journal.emit(ErrorEvent(message="x"), 6_000)
    e5 = later.journal.take_entry()
    assert e4 is not None and later.journal.seed == e3.ref(RUN)
    assert later.journal.entries_after(e3.ref(RUN)) == [e4, e5]
    assert later.journal.entries_after(e4.ref(RUN)) == [e5]
    for lacking in (ref(2), None, e2.ref(RUN)):  # nothing in this journal can bring it up to date
        assert later.journal.entries_after(lacking) is None


def test_continue_as_new_between_two_calls_keeps_counters_events_and_the_open_step() -> None:
    state = step_with_first_result()
    state.journal.mark_stored()
    pending = state.journal.emit(ToolStartEvent.of(CALL_B.id, CALL_B.name, CALL_B.input), 3_500)
    carried = state.carry(2)
    assert carried.messages == () and carried.log == state.journal.head
    wire = carried.model_dump(mode="json", exclude_none=True)  # as continue_as_new sends it
    restored = LoopState.restore(CarriedState.model_validate(wire))
    assert (restored.turn, restored.tool_rounds, restored.usage) == (1, 1, STEP_USAGE)
    assert (
        restored.journal.event_count == state.journal.event_count
        and restored.journal.events == state.journal.events
    )
    assert restored.journal.events_after(state.journal.event_count - 1) == [pending]
    assert restored.journal.seed == restored.journal.head == restored.journal.stored == state.journal.head
    assert restored.journal.pending().events == (pending,) and restored.open_results
    restored.add_tool_result(CALL_B, "out-b", False, 4_000)
    entry = restored.journal.take_entry()
    assert entry is not None and entry.delta.messages == () and entry.delta.extend_last == (RES_B,)
    sequences = [(e.sequence, e.event.type) for e in entry.delta.events]
    assert sequences == [
        (state.journal.event_count, "tool_start"),
        (state.journal.event_count + 1, "tool_end"),
    ]
    assert folded([*state.journal.entries, entry]).messages == [msg("read it"), STEP, BOTH]


def test_a_carried_state_holds_only_the_newest_events() -> None:
    state = LoopState(plan(), now_ms=1_000)
    for i in range(100):
        state.journal.emit(TextDeltaEvent(text=f"t{i}"), 2_000 + i)
    state.journal.take_entry()
    state.journal.mark_stored()
    carried = state.carry(2)
    assert len(carried.events) == CARRIED_EVENTS and carried.events[-1].sequence == carried.event_count == 101
    restored = LoopState.restore(carried)
    assert restored.journal.event_count == 101 and restored.journal.updated_at_ms == 2_099
    assert [e.sequence for e in restored.journal.events_after(90)] == list(range(91, 102))
    assert [e.sequence for e in restored.journal.events_after(0)] == list(range(102 - CARRIED_EVENTS, 102))
    assert restored.journal.events_after(101) == []
    assert restored.journal.emit(ErrorEvent(message="x"), 9_000).sequence == 102


def continued_between_calls() -> CarriedState:
    state = step_with_first_result()
    state.journal.mark_stored()
    return state.carry(2)


def legacy_carried() -> CarriedState:
    """What a run recorded before linear history carried: its whole conversation and events, no log."""
    state = step_with_first_result()
    messages = (msg("read it"), STEP, Message(role="user", content=(RES_A,)))
    whole = {"messages": messages, "events": state.journal.events}
    old = {"log": None, "event_count": None, "open_results": False, "prior_runs": (record("r-0", 10),)}
    return CarriedState.model_validate({**continued_between_calls().model_dump(), **whole, **old})


def test_a_legacy_carried_state_restores_into_a_replace_seed() -> None:
    carried = legacy_carried()
    state = LoopState.restore(carried)
    [first] = state.journal.entries
    assert (first.version, first.parent) == (1, GENESIS)
    assert first.delta == LogDelta(replace=True, messages=carried.messages, events=carried.events)
    assert state.journal.head == first.ref(RUN) and state.journal.seed == state.journal.stored == START
    assert state.journal.unstored() == [first] and state.journal.entries_after(
        None
    ) == state.journal.entries_after(ref(5)) == [first]
    assert state.journal.event_count == 3 and state.journal.prior_run_ids == ("r-0",) and state.open_results
    state.add_tool_result(CALL_B, "out-b", False, 4_000)
    entry = state.journal.take_entry()
    assert entry is not None and entry.delta.extend_last == (RES_B,) and entry.delta.messages == ()
    assert entry.delta.events[0].sequence == 4
    assert folded(state.journal.entries).messages == [msg("read it"), STEP, BOTH]


@pytest.mark.parametrize("carried", [continued_between_calls, legacy_carried])
def test_a_continued_run_still_makes_the_step_s_second_call(carried: Callable[[], CarriedState]) -> None:
    assert step_with_first_result().pending_calls() == [CALL_B]
    assert LoopState.restore(carried()).pending_calls() == [CALL_B]


def test_an_export_is_the_folded_log_after_the_prior_runs() -> None:
    state = step_with_first_result()
    state.journal.prior_run_ids = ("r-0", "r-1")
    state.add_tool_result(CALL_B, "out-b", False, 4_000)
    state.journal.take_entry()
    log = folded(state.journal.entries)
    prior = [record("r-0", 10), record("r-1", 20)]
    facts = state.export_facts(9_000)
    export = build_export(state.journal.header(), log, prior, facts)
    payload = export.open()
    assert payload.logical_resume.messages == tuple(log.messages) == (msg("read it"), STEP, BOTH)
    assert (payload.logical_resume.turn, payload.logical_resume.total_usage) == (2, state.usage)
    *earlier, run = payload.snapshot.run_records
    assert earlier == prior
    assert (run.snapshot.id, run.snapshot.status, run.events) == (RUN, "executing", tuple(log.events))
    assert run.snapshot.event_count == log.events[-1].sequence == state.journal.event_count
    again = build_export(state.journal.header(), folded(state.journal.entries), prior, facts)
    assert again.content.encode() == export.content.encode() and again.descriptor == export.descriptor
    # a log whose events start later (its run continued as new): the count is the last sequence
    later = LogDelta(replace=True, messages=tuple(log.messages), events=tuple(log.events[3:]))
    last = build_export(state.journal.header(), folded([LogEntry.after(START, later)]), prior, facts)
    (*_, run) = last.open().snapshot.run_records
    assert run.snapshot.event_count == state.journal.event_count > len(run.events)


async def opened_run(env: ActivityEnvironment, acts: AgentActivities) -> LoopState:
    """A run's state whose log the store holds from its first entry (``agent.open_run``)."""
    state = LoopState(plan(), now_ms=1_000)
    seed = state.journal.take_entry()
    assert seed is not None
    await env.run(acts.run_logs.open_run, OpenRunInput(header=state.journal.header(), seed=seed))
    state.journal.mark_stored()
    return state


async def test_a_save_that_catches_up_unstages_only_its_newest_entry(tmp_path: Path) -> None:
    """After a failed save the next one sends two entries: the older whole, the newest by digest."""
    store = MemorySessionStore()
    acts = AgentActivities(scripted_config(tmp_path, [final()]), store=store)
    env = ActivityEnvironment()
    state = await opened_run(env, acts)
    for step in ("a", "b"):  # two steps, each a long staged message and a long staged output
        call = ToolUseBlock(id=step, name="read", input={"file_path": f"{step}.txt"})
        message = Message(role="assistant", content=(TextBlock(text=step * STAGE_MIN_BYTES), call))
        await store.stage_text(state.plan.run_id, digest_of(message), canonical_bytes(message).decode())
        state.add_model_response(ModelResponse(message=message, staged=True), 2_000)
        output = f"{step} output " * 200
        await store.stage_text(state.plan.run_id, text_digest(output), output)
        state.add_tool_result(call, output, False, 3_000, staged=True)
        state.journal.take_entry()  # the first step's save fails: its entry waits for the next
    older, newest = state.journal.unstored()
    wire, staged = newest.delta.staged(state.journal.staged_ids, state.journal.staged_messages)
    assert {s.kind for s in staged} == {"message", "tool_result"} and staged[0].key == "0"
    entries = (older, newest.model_copy(update={"delta": wire}))
    await env.run(
        acts.run_logs.save_checkpoint,
        SaveCheckpointInput(run_id=state.plan.run_id, entries=entries, staged=staged),
    )
    folded = RunLog(state.plan.run_id)
    folded.apply_all(await store.read_log(state.plan.run_id, 0, 10))
    assert folded.ref == state.journal.head
    assert [m.text()[:1] for m in folded.messages if m.role == "assistant"] == ["a", "b"]


async def test_a_checkpoint_hands_the_sink_only_what_the_store_holds(tmp_path: Path) -> None:
    """The export is built while the store writes; a write that fails leaves the sink without it."""
    store = GatedStore()
    store.gate.set()
    sink = RecordingSink()
    acts = AgentActivities(scripted_config(tmp_path, [final()]), store=store, sinks={"local": sink})
    env = ActivityEnvironment()
    state = await opened_run(env, acts)

    def boundary(step: str) -> CheckpointInput:
        call = ToolUseBlock(id=step, name="read", input={"file_path": f"{step}.txt"})
        state.add_model_response(ModelResponse(message=Message(role="assistant", content=(call,))), 2_000)
        state.add_tool_result(call, f"{step} output", False, 3_000)
        state.journal.take_entry()
        save = SaveCheckpointInput(run_id=state.plan.run_id, entries=tuple(state.journal.unstored()))
        export = ExportInput(sink="local", log=state.journal.head, facts=state.export_facts(3_000))
        return CheckpointInput(save=save, export=export)

    first = boundary("a")  # not in the worker's cache yet: stored, then built (and folded)
    descriptor = await env.run(acts.run_logs.checkpoint, first)
    assert [e.descriptor for e in sink.exports] == [descriptor]
    assert await store.log_head(state.plan.run_id) == state.journal.head
    state.journal.mark_stored()
    store.fail = True  # now built from the cached log while the store writes, and the write fails
    with pytest.raises(OSError, match="disk full"):
        await env.run(acts.run_logs.checkpoint, boundary("b"))
    assert len(sink.exports) == 1  # the sink never saw the boundary the store did not keep
    store.fail = False  # the workflow sends the same entries again at its next boundary
    second = boundary("c")
    assert second.save is not None and len(second.save.entries) == 2
    descriptor = await env.run(acts.run_logs.checkpoint, second)
    assert sink.exports[-1].descriptor == descriptor and len(sink.exports) == 2
    assert await store.log_head(state.plan.run_id) == state.journal.head
