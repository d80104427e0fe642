"""A running run's log: how its conversation and events reach the session store
once each, so that its Temporal history grows linearly with the run.

The workflow never hands an activity the whole conversation. At each save it
appends one ``LogEntry`` (what is new since the last one) to the run's log in
the session store, and every other activity names the log state it needs with
a ``LogRef``: a version and a chain digest over every entry so far. An
activity that cannot find that state (a fresh store, another machine, a store
that lags) raises ``StateMissing``, and the workflow sends the entries again
from its own history before it retries.

Compatibility rule: entries are stored and chained by their canonical JSON, so
a field added to ``LogDelta`` must default to a value that is left out of its
JSON (``None`` or empty, with ``exclude_defaults``); the chain of an existing
log must never change.
"""

from __future__ import annotations

import hashlib
from collections.abc import Collection, Iterable, Sequence
from typing import Final, Literal

from pydantic import Field

from durable_agent.core.canonical import canonical_bytes, digest_of, sha256_digest
from durable_agent.core.capability_binding import CapabilityBinding
from durable_agent.core.errors import DurableAgentError
from durable_agent.core.events import ContextCompactedEvent, EventRecord, PermissionDeniedEvent, ToolEndEvent
from durable_agent.core.export import (
    CheckpointPayload,
    ExportDescriptor,
    LoopCheckpoint,
    ResumedFrom,
    RunRecord,
    RunSnapshot,
    SessionCheckpointExportV1,
    SessionSnapshot,
)
from durable_agent.core.models import (
    ContextView,
    Frozen,
    Message,
    TextBlock,
    TokenUsage,
    ToolDefinition,
    ToolResultBlock,
    ToolUseBlock,
)

GENESIS: Final = "sha256:" + "0" * 64
# A tool output or model message at least this long is staged in the store by its
# activity (which says so), and the save that follows names it by digest instead of
# carrying it through the history a second time.
STAGE_MIN_BYTES: Final = 1024


class LogRef(Frozen):
    """A state of a run's log: ``version`` entries applied, ending in ``digest``."""

    run_id: str
    version: int = Field(ge=0)
    digest: str = GENESIS


class Staged(Frozen):
    """A part of a saved entry that an activity already put in the store: empty in the entry,
    named here by its digest (a tool's output, or a model's whole message)."""

    kind: Literal["tool_result", "message"]
    key: str  # the tool result's ``tool_use_id``, or the message's index in the entry's messages
    digest: str


class LogDelta(Frozen):
    """What one log entry adds, applied in this order: ``replace``, ``extend_last``,
    ``messages``, ``events``.

    ``extend_last`` holds tool results for the last message already in the log
    (the results of one model step share one user message), and a person's text
    that joins them (a steer, a follow-up). With ``replace``,
    the entry is a whole state, not an addition (a run's seed from elsewhere).
    """

    replace: bool = False
    extend_last: tuple[ToolResultBlock | TextBlock, ...] = ()
    messages: tuple[Message, ...] = ()
    events: tuple[EventRecord, ...] = ()

    def is_empty(self) -> bool:
        return not (self.replace or self.extend_last or self.messages or self.events)

    def chained(self, parent: str) -> str:
        """The digest of the log after this delta, on top of ``parent``."""
        body = hashlib.sha256(canonical_bytes(self.model_dump(mode="json", exclude_defaults=True)))
        return sha256_digest(f"{parent}\n{body.hexdigest()}".encode())

    def results(self) -> Iterable[ToolResultBlock]:
        yield from (b for b in self.extend_last if isinstance(b, ToolResultBlock))
        for message in self.messages:
            yield from (b for b in message.content if isinstance(b, ToolResultBlock))

    def staged(
        self, result_ids: Collection[str], message_digests: Collection[str] = ()
    ) -> tuple[LogDelta, tuple[Staged, ...]]:
        """This delta with the named tool results and messages emptied, and what names them."""
        parts: list[Staged] = []
        messages = list(self.messages)
        for index, message in enumerate(messages if message_digests else ()):
            digest = digest_of(message)
            if digest in message_digests:
                parts.append(Staged(kind="message", key=str(index), digest=digest))
                messages[index] = Message(role=message.role, content=())
        delta = self.model_copy(update={"messages": tuple(messages)}) if parts else self
        results = [b for b in delta.results() if b.tool_use_id in result_ids]
        parts += [
            Staged(kind="tool_result", key=b.tool_use_id, digest=text_digest(b.content)) for b in results
        ]
        if results:
            delta = delta.with_results({b.tool_use_id: "" for b in results})
        return delta, tuple(parts)

    def unstaged(self, texts: dict[Staged, str]) -> LogDelta:
        """This delta with what ``staged`` emptied put back, from the texts the store kept."""
        messages = list(self.messages)
        results: dict[str, str] = {}
        for part, text in texts.items():
            if part.kind == "message":
                messages[int(part.key)] = Message.model_validate_json(text)
            else:
                results[part.key] = text
        return self.model_copy(update={"messages": tuple(messages)}).with_results(results)

    def with_results(self, contents: dict[str, str]) -> LogDelta:
        """This delta with the content of the named tool results replaced."""

        def put(block: ToolResultBlock | TextBlock) -> ToolResultBlock | TextBlock:
            if not isinstance(block, ToolResultBlock):
                return block
            content = contents.get(block.tool_use_id)
            return block if content is None else block.model_copy(update={"content": content})

        messages = tuple(
            m.model_copy(
                update={"content": tuple(put(b) if isinstance(b, ToolResultBlock) else b for b in m.content)}
            )
            for m in self.messages
        )
        return self.model_copy(
            update={"messages": messages, "extend_last": tuple(map(put, self.extend_last))}
        )


def text_digest(text: str) -> str:
    return sha256_digest(text.encode("utf-8"))


class LogEntry(Frozen):
    """One save: ``delta`` on top of the entry ``version - 1`` whose digest is ``parent``."""

    version: int = Field(ge=1)
    parent: str
    digest: str
    delta: LogDelta

    @classmethod
    def after(cls, head: LogRef, delta: LogDelta) -> LogEntry:
        return cls(
            version=head.version + 1, parent=head.digest, digest=delta.chained(head.digest), delta=delta
        )

    def ref(self, run_id: str) -> LogRef:
        return LogRef(run_id=run_id, version=self.version, digest=self.digest)


class RunHeader(Frozen):
    """What does not change while a run runs: written once, next to its log."""

    session_id: str
    run_id: str
    prompt: str
    created_at_ms: int
    capability_binding: CapabilityBinding
    system_prompt: str
    tools: tuple[ToolDefinition, ...]
    resumed_from: ResumedFrom | None = None
    # the session's runs that had ended when this one started: its exports' snapshot
    prior_run_ids: tuple[str, ...] = ()


class ExportSeed(Frozen):
    """An export that holds a run's log at ``log``: where its starting state is, should
    the store have lost it. A continued run's last export, from its ``sink``; or the export
    file (``path`` on the worker) a run was resumed from (``resumed``: its conversation only)."""

    sink: str | None = None
    path: str | None = None
    descriptor: ExportDescriptor
    log: LogRef
    resumed: bool = False


class StateMissing(DurableAgentError):
    """The store does not hold the log state an activity was sent to read or extend.

    ``head`` is what it holds instead (``None``: nothing for this run), so the
    workflow can send just the entries after it.
    """

    def __init__(self, message: str, head: LogRef | None = None) -> None:
        super().__init__(message)
        self.head = head


class RunLog:
    """A run's log folded into its conversation and events (what the activities read)."""

    def __init__(self, run_id: str) -> None:
        self.run_id = run_id
        self.version = 0
        self.digest = GENESIS
        self.messages: list[Message] = []
        self.events: list[EventRecord] = []
        # the newest context_compacted event's view, kept as entries fold in: the model step
        # reads it each time, and the events grow with the run
        self.view: ContextView | None = None

    @property
    def ref(self) -> LogRef:
        return LogRef(run_id=self.run_id, version=self.version, digest=self.digest)

    def apply(self, entry: LogEntry) -> None:
        """Fold in the next entry; ``StateMissing`` if it does not follow this state."""
        delta = entry.delta
        if not delta.replace and (entry.version != self.version + 1 or entry.parent != self.digest):
            raise StateMissing(
                f"log entry {entry.version} of run {self.run_id!r} does not follow version {self.version}",
                self.ref,
            )
        if delta.replace:
            self.messages, self.events, self.view = [], [], None
        if delta.extend_last:
            last = self.messages[-1] if self.messages else None
            if last is None or last.role != "user":
                raise StateMissing(f"log entry {entry.version} extends no tool-result message", self.ref)
            self.messages[-1] = last.model_copy(update={"content": (*last.content, *delta.extend_last)})
        self.messages.extend(delta.messages)
        self.events.extend(delta.events)
        for record in delta.events:
            if isinstance(record.event, ContextCompactedEvent):
                self.view = record.event.view
        self.version, self.digest = entry.version, entry.digest

    def apply_all(self, entries: Sequence[LogEntry]) -> None:
        for entry in entries:
            self.apply(entry)

    def with_pending(self, pending: LogDelta) -> list[Message]:
        """The conversation with the messages not yet saved added (what the model sees)."""
        messages = list(self.messages)
        if pending.extend_last:
            if not messages:
                raise StateMissing(f"run {self.run_id!r}: no message for the pending tool results", self.ref)
            messages[-1] = messages[-1].model_copy(
                update={"content": (*messages[-1].content, *pending.extend_last)}
            )
        messages.extend(pending.messages)
        return messages


class RecordedResult(Frozen):
    """A tool call's result as a run's log holds it (``recorded_result``)."""

    block: ToolResultBlock
    ended_at_ms: int  # its ``tool_end`` event's time
    denied: bool = False  # refused by the path it resolves to (a ``permission_denied`` event)


def recorded_result(entries: Sequence[LogEntry], after: LogRef, call_id: str) -> RecordedResult | None:
    """The result of call ``call_id`` in the entries stored after ``after``.

    Entries that follow the newest one a workflow knows the store holds can only come from a
    lost attempt of its current workflow task (a worker that died after the boundary was
    exported, before the task completed). A local tool call run again in that task returns the
    result recorded there, so its boundary is built again with the same bytes
    (``ToolCallInput.recorded_after``).

    Args:
        entries: the run's log entries after ``after``, in order.
        after: the newest entry the workflow knew the store held.
        call_id: the call's id.

    Returns:
        The call's result, or None when the entries do not follow ``after`` or hold no result
        of the call.
    """
    if not entries or entries[0].version != after.version + 1 or entries[0].parent != after.digest:
        return None
    block: ToolResultBlock | None = None
    ended_at: int | None = None
    denied = False
    for entry in entries:
        block = next((b for b in entry.delta.results() if b.tool_use_id == call_id), block)
        for record in entry.delta.events:
            event = record.event
            denied = denied or (isinstance(event, PermissionDeniedEvent) and event.id == call_id)
            if isinstance(event, ToolEndEvent) and event.id == call_id:
                ended_at = record.timestamp_ms
    if block is None or ended_at is None:
        return None
    return RecordedResult(block=block, ended_at_ms=ended_at, denied=denied)


def unanswered_calls(messages: Sequence[Message]) -> list[ToolUseBlock]:
    """The calls of the last assistant message that no later message answers."""
    for index in range(len(messages) - 1, -1, -1):
        message = messages[index]
        if message.role == "assistant":
            answered = {
                block.tool_use_id
                for later in messages[index + 1 :]
                for block in later.content
                if isinstance(block, ToolResultBlock)
            }
            return [call for call in message.tool_uses() if call.id not in answered]
    return []


def ends_in_results(messages: Sequence[Message]) -> bool:
    """Whether the last message holds tool results (that more results of its step may join)."""
    last = messages[-1] if messages else None
    return (
        last is not None and last.role == "user" and all(isinstance(b, ToolResultBlock) for b in last.content)
    )


class ExportFacts(Frozen):
    """What an export needs besides the log and the header: the run's counters now."""

    turn: int
    checkpoint_ms: int
    updated_at_ms: int
    usage: TokenUsage


def build_export(
    header: RunHeader, log: RunLog, prior: Sequence[RunRecord], facts: ExportFacts
) -> SessionCheckpointExportV1:
    """The boundary's export, from the store's copy of the run: the same inputs give the same bytes."""
    return SessionCheckpointExportV1.build(export_payload(header, log, prior, facts))


def export_payload(
    header: RunHeader,
    log: RunLog,
    prior: Sequence[RunRecord],
    facts: ExportFacts,
    messages: Sequence[Message] | None = None,
) -> CheckpointPayload:
    """What the boundary's export holds (``build_export``; ``ExportEncoder`` encodes it a part at a time).

    ``messages``: the log's messages with their images' data filled in (``core/images.py``),
    where the log holds images by reference; unset, the log's own.
    """
    logical = LoopCheckpoint(
        session_id=header.session_id,
        run_id=header.run_id,
        turn=facts.turn,
        messages=tuple(log.messages if messages is None else messages),
        capability_binding=header.capability_binding,
        total_usage=facts.usage,
        tool_calls_count=facts.turn,
        checkpoint_ms=facts.checkpoint_ms,
    )
    events = tuple(log.events)
    run = RunRecord(snapshot=run_snapshot(header, events, "executing", facts.updated_at_ms), events=events)
    snapshot = SessionSnapshot(session_id=header.session_id, run_records=(*prior, run))
    return CheckpointPayload(logical_resume=logical, snapshot=snapshot)


def run_snapshot(
    header: RunHeader,
    events: Sequence[EventRecord],
    status: str,
    updated_at_ms: int,
    result_text: str | None = None,
    error: str | None = None,
) -> RunSnapshot:
    return RunSnapshot.model_validate(
        {
            "id": header.run_id,
            "session_id": header.session_id,
            "status": status,
            "prompt": header.prompt,
            "capability_binding": header.capability_binding,
            "created_at_ms": header.created_at_ms,
            "updated_at_ms": updated_at_ms,
            "event_count": events[-1].sequence if events else 0,
            "result_text": result_text,
            "error": error,
            "resumed_from": header.resumed_from,
        }
    )
