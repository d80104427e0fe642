"""Conformance checks for a ``SessionStore`` (``durable_agent.activities.store.session_store``).

Each check in ``STORE_CHECKS`` takes a fresh, empty store and exercises one part of
the contract the workflow and activities rely on:

- a run's log is a chain of entries by version, each naming its parent's digest;
  ``append_log`` refuses, with ``StateMissing`` (whose ``head`` is what the store
  holds instead), an entry that does not follow what is stored;
- an entry written at a version that is stored replaces it and drops every entry
  after it (a run that went back overwrites its abandoned branch); an entry with
  ``delta.replace`` is a whole state and is taken at any version;
- ``read_log(run, after, upto)`` gives the stored entries with
  ``after < version <= upto`` in order, equal to what was appended;
  ``log_head`` the newest, ``None`` for a run with no log;
- staged texts are kept by run and digest; headers by run; run records by session,
  ordered by creation time then run id;
- ``drop_run`` forgets a run's header, log and staged texts, but not its record;
- every operation is safe to repeat (activities run at least once).
"""

from __future__ import annotations

from collections.abc import Awaitable, Sequence

from durable_agent.activities.store.session_store import SessionStore
from durable_agent.conformance.checks import Check, Factory, registry, run_checks
from durable_agent.core.capability_binding import CapabilityBinding
from durable_agent.core.events import ErrorEvent, EventRecord
from durable_agent.core.export import RunRecord
from durable_agent.core.models import Message, TextBlock, ToolDefinition, ToolResultBlock, ToolUseBlock
from durable_agent.core.run_log import (
    LogDelta,
    LogEntry,
    LogRef,
    RunHeader,
    RunLog,
    StateMissing,
    run_snapshot,
    text_digest,
)

RUN = "conformance-run"
OTHER_RUN = "conformance-other-run"
SESSION = "conformance-session"
UNKNOWN_DIGEST = "sha256:" + "d" * 64


# --- sample data ------------------------------------------------------------------------


def message(text: str) -> Message:
    return Message(role="user", content=(TextBlock(text=text),))


def chain(texts: Sequence[str], head: LogRef | None = None, run_id: str = RUN) -> list[LogEntry]:
    """Entries adding one user message each, chained after ``head`` (the start of the log)."""
    head = head or LogRef(run_id=run_id, version=0)
    entries: list[LogEntry] = []
    for text in texts:
        entries.append(LogEntry.after(head, LogDelta(messages=(message(text),))))
        head = entries[-1].ref(run_id)
    return entries


def rich_chain(run_id: str = RUN) -> list[LogEntry]:
    """Three entries with every kind of part: text, tool calls, results appended later, events."""
    call = ToolUseBlock(id="call-1", name="read", input={"file_path": "src/ünï €.py", "n": [1, None]})
    entries = chain(["Read it, please ☃"], run_id=run_id)
    step = LogDelta(
        messages=(
            Message(role="assistant", content=(TextBlock(text="Reading."), call)),
            Message(role="user", content=(ToolResultBlock(tool_use_id="call-1", content="line 1\n"),)),
        ),
        events=(EventRecord(sequence=1, timestamp_ms=2_000, event=ErrorEvent(message='a "quoted"\nline')),),
    )
    entries.append(LogEntry.after(entries[-1].ref(run_id), step))
    more = LogDelta(extend_last=(ToolResultBlock(tool_use_id="call-2", content="", is_error=True),))
    entries.append(LogEntry.after(entries[-1].ref(run_id), more))
    return entries


def header(run_id: str = RUN, session_id: str = SESSION, created_at_ms: int = 1_000) -> RunHeader:
    tool = ToolDefinition(
        name="read",
        description="Read a file.",
        input_schema={"type": "object", "properties": {"file_path": {"type": "string"}}},
    )
    return RunHeader(
        session_id=session_id,
        run_id=run_id,
        prompt="Read the evidence ☃",
        created_at_ms=created_at_ms,
        capability_binding=CapabilityBinding(catalog_digest="sha256:" + "c" * 64, tools=("read",)),
        system_prompt="Be brief.",
        tools=(tool,),
        prior_run_ids=("conformance-earlier-run",),
    )


def record(run_id: str, created_at_ms: int, session_id: str = SESSION) -> RunRecord:
    ended = header(run_id, session_id, created_at_ms)
    return RunRecord(snapshot=run_snapshot(ended, (), "completed", created_at_ms + 5, "done"), events=())


def ref(version: int, digest: str) -> LogRef:
    return LogRef(run_id=RUN, version=version, digest=digest)


def folded(entries: Sequence[LogEntry], run_id: str = RUN) -> RunLog:
    log = RunLog(run_id)
    log.apply_all(entries)
    return log


async def refused(append: Awaitable[None], head: LogRef | None, what: str) -> None:
    """``append`` must raise ``StateMissing`` whose ``head`` is ``head``."""
    try:
        await append
    except StateMissing as missing:
        assert missing.head == head, (
            f"{what}: StateMissing.head should be what the store holds, {head!r}, not {missing.head!r}"
        )
    else:
        raise AssertionError(f"{what}: append_log stored it instead of raising StateMissing")


async def holds(store: SessionStore, entries: Sequence[LogEntry], what: str, run_id: str = RUN) -> None:
    """The store's whole log of ``run_id`` is ``entries`` and its head their last."""
    stored = await store.read_log(run_id, 0, 1_000_000)
    assert stored == list(entries), (
        f"{what}: read_log gives versions {[e.version for e in stored]}, expected "
        f"{[e.version for e in entries]} (or an entry came back changed)"
    )
    head = await store.log_head(run_id)
    expected = entries[-1].ref(run_id) if entries else None
    assert head == expected, f"{what}: log_head is {head!r}, expected {expected!r}"


# --- the checks -------------------------------------------------------------------------

#: Every store check, by name, in the order defined: ``await STORE_CHECKS[name](fresh_store)``.
STORE_CHECKS: dict[str, Check[SessionStore]] = {}
_store_check = registry(STORE_CHECKS)


@_store_check
async def appends_follow_the_chain(store: SessionStore) -> None:
    """Entries appended one or several at a time come back equal, in order, with the newest as head."""
    v1, v2, v3 = rich_chain()
    await store.append_log(RUN, [v1])
    await holds(store, [v1], "after appending version 1")
    await store.append_log(RUN, [v2, v3])
    await holds(store, [v1, v2, v3], "after appending versions 2 and 3 together")
    log = folded(await store.read_log(RUN, 0, 3))
    assert log.ref == v3.ref(RUN), "the stored entries do not fold to the digest they were appended with"


@_store_check
async def an_append_out_of_order_is_refused(store: SessionStore) -> None:
    """An entry that does not follow the stored one is refused with ``StateMissing`` and not stored."""
    v1, v2, v3 = chain(["m1", "m2", "m3"])
    await refused(store.append_log(RUN, [v2]), None, "version 2 on an empty log")
    await holds(store, [], "after refusing version 2 on an empty log")
    delta = LogDelta(messages=(message("x"),))
    not_on_genesis = LogEntry(version=1, parent=v1.digest, digest=delta.chained(v1.digest), delta=delta)
    await refused(store.append_log(RUN, [not_on_genesis]), None, "version 1 whose parent is not GENESIS")
    await store.append_log(RUN, [v1, v2, v3])
    strangers = {
        "version 2 on an unknown parent": LogEntry.after(ref(1, UNKNOWN_DIGEST), delta),
        "version 5 while version 4 is missing": LogEntry.after(ref(4, v3.digest), delta),
        "version 4 on the digest of version 2": LogEntry(
            version=4, parent=v2.digest, digest=delta.chained(v2.digest), delta=delta
        ),
        "version 1 not on GENESIS": not_on_genesis,
    }
    for what, stranger in strangers.items():
        await refused(store.append_log(RUN, [stranger]), v3.ref(RUN), what)
    await holds(store, [v1, v2, v3], "after refusing entries that do not follow")


@_store_check
async def a_repeated_append_is_harmless(store: SessionStore) -> None:
    """An activity's retry appends what is already stored again: nothing changes, nothing fails."""
    v1, v2, v3 = chain(["m1", "m2", "m3"])
    await store.append_log(RUN, [v1, v2, v3])
    for again in ([v3], [v2, v3], [v1, v2, v3]):
        await store.append_log(RUN, again)
        await holds(store, [v1, v2, v3], f"after appending versions {[e.version for e in again]} again")


@_store_check
async def a_rewritten_version_replaces_and_drops_later_entries(store: SessionStore) -> None:
    """An entry at a stored version replaces it and drops the entries after it (an abandoned branch)."""
    v1, v2, v3 = chain(["m1", "m2", "m3"])
    await store.append_log(RUN, [v1, v2, v3])
    (b2,) = chain(["branch"], v1.ref(RUN))
    await store.append_log(RUN, [b2])
    await holds(store, [v1, b2], "after writing another version 2 on version 1")
    assert await store.read_log(RUN, 1, 3) == [b2], "read_log(1, 3) should give the new version 2 only"
    (b3,) = chain(["branch goes on"], b2.ref(RUN))
    await store.append_log(RUN, [b3])
    await holds(store, [v1, b2, b3], "after extending the new branch")
    await refused(store.append_log(RUN, chain(["old"], v2.ref(RUN))), b3.ref(RUN), "on the dropped version 2")


@_store_check
async def a_replace_entry_is_taken_at_any_version(store: SessionStore) -> None:
    """An entry with ``delta.replace`` is a whole state: stored past a gap, below the head, or first."""
    whole = LogDelta(replace=True, messages=(message("whole"),))
    first = LogEntry.after(ref(2, UNKNOWN_DIGEST), whole)
    await store.append_log(RUN, [first])
    assert await store.log_head(RUN) == first.ref(RUN), "a replace at version 3 of an empty log was not taken"
    await store.drop_run(RUN)
    v1, v2, v3 = chain(["m1", "m2", "m3"])
    await store.append_log(RUN, [v1, v2, v3])
    far = LogEntry.after(ref(6, UNKNOWN_DIGEST), whole)
    await store.append_log(RUN, [far])
    assert await store.log_head(RUN) == far.ref(RUN), "a replace at version 7 was not the head"
    log = folded(await store.read_log(RUN, 0, 7))
    assert log.messages == [message("whole")], "the log after a replace does not fold to the replace"
    assert log.ref == far.ref(RUN), "the log after a replace does not end in its digest"
    low = LogEntry.after(v1.ref(RUN), whole)
    await store.append_log(RUN, [low])
    await holds(store, [v1, low], "after a replace at version 2")


@_store_check
async def read_log_gives_the_asked_range(store: SessionStore) -> None:
    """``read_log(run, after, upto)`` gives ``after < version <= upto``; nothing for another run."""
    v1, v2, v3 = chain(["m1", "m2", "m3"])
    assert await store.log_head(RUN) is None, "log_head of a run with no log should be None"
    assert await store.read_log(RUN, 0, 9) == [], "read_log of a run with no log should be empty"
    await store.append_log(RUN, [v1, v2, v3])
    cases = {(0, 3): [v1, v2, v3], (0, 99): [v1, v2, v3], (1, 2): [v2], (0, 1): [v1], (2, 3): [v3]}
    cases |= {(3, 9): [], (0, 0): [], (2, 2): []}
    for (after, upto), expected in cases.items():
        got = await store.read_log(RUN, after, upto)
        assert got == expected, (
            f"read_log({after}, {upto}) gives versions {[e.version for e in got]}, "
            f"expected {[e.version for e in expected]}"
        )
    assert await store.read_log(OTHER_RUN, 0, 9) == [], "read_log of another run should be empty"
    assert await store.log_head(OTHER_RUN) is None, "log_head of another run should be None"


@_store_check
async def headers_are_kept_by_run(store: SessionStore) -> None:
    """``load_header`` gives back the header saved for that run, ``None`` for another."""
    assert await store.load_header(RUN) is None, "load_header of an unknown run should be None"
    await store.save_header(header())
    await store.save_header(header())  # a repeat is harmless
    await store.save_header(header(OTHER_RUN, created_at_ms=2_000))
    assert await store.load_header(RUN) == header(), "load_header gives another header than was saved"
    assert await store.load_header(OTHER_RUN) == header(OTHER_RUN, created_at_ms=2_000), "headers are mixed"
    assert await store.load_header("conformance-no-such-run") is None, "a header for a run never saved"


@_store_check
async def staged_texts_are_kept_by_run_and_digest(store: SessionStore) -> None:
    """A staged text comes back whole by its digest, for its run only."""
    text = 'ä ☃ output\r\n\ttabbed \\ "quoted" ' * 200
    digest = text_digest(text)
    await store.stage_text(RUN, digest, text)
    await store.stage_text(RUN, digest, text)  # a repeat is harmless
    assert await store.staged_text(RUN, digest) == text, "staged_text does not give back the staged text"
    assert await store.staged_text(RUN, text_digest("other")) is None, "a text for a digest never staged"
    assert await store.staged_text(OTHER_RUN, digest) is None, "a staged text leaked to another run"
    small = "x"
    await store.stage_text(RUN, text_digest(small), small)
    assert await store.staged_text(RUN, text_digest(small)) == small, "a second staged text was not kept"
    assert await store.staged_text(RUN, digest) == text, "staging a second text lost the first"


@_store_check
async def run_records_are_listed_by_session(store: SessionStore) -> None:
    """A session's records come back whole, by creation time then run id; a repeat save replaces."""
    assert await store.load_run_records(SESSION) == [], "an unknown session should have no records"
    for run_id, created in [("r-c", 30), ("r-b", 10), ("r-a", 10), ("r-z", 20), ("r-a", 10)]:
        await store.save_run_record(record(run_id, created))
    await store.save_run_record(record("r-x", 5, session_id="conformance-session-2"))
    got = await store.load_run_records(SESSION)
    assert [r.snapshot.id for r in got] == ["r-a", "r-b", "r-z", "r-c"], (
        f"records should be ordered by creation time then id, once each: {[r.snapshot.id for r in got]}"
    )
    assert got == [record("r-a", 10), record("r-b", 10), record("r-z", 20), record("r-c", 30)], (
        "a record came back changed"
    )
    other = await store.load_run_records("conformance-session-2")
    assert other == [record("r-x", 5, session_id="conformance-session-2")], "records of sessions are mixed"


@_store_check
async def drop_run_forgets_the_run_but_keeps_its_record(store: SessionStore) -> None:
    """``drop_run`` forgets the run's header, log and staged texts, keeps its record and other runs."""
    text = "big output " * 300
    await store.save_header(header())
    await store.stage_text(RUN, text_digest(text), text)
    await store.append_log(RUN, chain(["m1", "m2"]))
    await store.save_header(header(OTHER_RUN))
    other = chain(["n1"], run_id=OTHER_RUN)
    await store.append_log(OTHER_RUN, other)
    await store.stage_text(OTHER_RUN, text_digest(text), text)
    await store.save_run_record(ended := record(RUN, 1_000))
    await store.drop_run(RUN)
    await store.drop_run(RUN)  # a repeat is harmless
    await store.drop_run("conformance-no-such-run")  # so is dropping a run the store never held
    assert await store.load_header(RUN) is None, "the dropped run's header is still there"
    await holds(store, [], "the dropped run's log")
    assert await store.staged_text(RUN, text_digest(text)) is None, "the dropped run's staged text is there"
    assert await store.load_run_records(SESSION) == [ended], "drop_run must keep the run's record"
    assert await store.load_header(OTHER_RUN) == header(OTHER_RUN), "drop_run took another run's header"
    await holds(store, other, "another run's log after drop_run", OTHER_RUN)
    assert await store.staged_text(OTHER_RUN, text_digest(text)) == text, "drop_run took another run's text"
    await store.append_log(RUN, (fresh := chain(["again"])))
    await holds(store, fresh, "a dropped run's log started again")


@_store_check
async def runs_keep_separate_logs(store: SessionStore) -> None:
    """Two runs with entries of the same digests keep their own logs."""
    mine, theirs = chain(["m1", "m2", "m3"]), chain(["m1", "m2"], run_id=OTHER_RUN)
    await store.append_log(RUN, mine)
    await store.append_log(OTHER_RUN, theirs)
    (branch,) = chain(["branch"], theirs[0].ref(OTHER_RUN), OTHER_RUN)
    await store.append_log(OTHER_RUN, [branch])
    await holds(store, mine, "a run's log after another run branched")
    await holds(store, [theirs[0], branch], "the other run's log", OTHER_RUN)


async def check_store(make_store: Factory[SessionStore]) -> None:
    """Run every check in ``STORE_CHECKS``, each on a fresh store from ``make_store``.

    Args:
        make_store: Gives a fresh, empty store, one per check: a plain callable, or one
            whose result is awaited (an async function).

    Raises:
        ConformanceError: Naming each check that failed (an ``AssertionError``); every check
            runs first. A ``make_store`` that raises fails the check it was called for.
    """
    await run_checks("the session store", STORE_CHECKS, make_store)


__all__ = ["STORE_CHECKS", "check_store"]
