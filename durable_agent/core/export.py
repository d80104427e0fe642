"""Checkpoint export, version 1 (``docs/checkpoint-export-v1.md``).

Compatibility rule: a v1 reader accepts exactly the v1 schema strings below.
Any change to the shape of the payload or descriptor is a new version with new
schema strings; v1 exports stay readable by ``open_export`` forever.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final, Literal

from pydantic import ConfigDict, Field, ValidationError

from durable_agent.core.canonical import CanonicalJsonError, canonical_bytes, digest_of, sha256_digest
from durable_agent.core.capability_binding import CapabilityBinding
from durable_agent.core.errors import DurableAgentError, validation_message
from durable_agent.core.events import EventRecord, RunStartEvent, ToolEndEvent
from durable_agent.core.json_limits import DOCUMENT_MAX_DEPTH, JsonLimitError
from durable_agent.core.json_limits import loads as bounded_loads
from durable_agent.core.models import Frozen, ImageBlock, Message, TokenUsage
from durable_agent.core.run_workspace import WorkspaceOrigin

EXPORT_SCHEMA: Final = "durable-agent.session-checkpoint-export.v1"
PAYLOAD_SCHEMA: Final = "durable-agent.session-checkpoint-payload.v1"
MEDIA_TYPE = "application/vnd.durable-agent.checkpoint.v1+json"
LOOP_CHECKPOINT_SCHEMA_VERSION = 1
SESSION_SNAPSHOT_SCHEMA_VERSION = 1

RunStatus = Literal["created", "executing", "completed", "failed", "cancelled"]
TERMINAL_STATUSES: frozenset[str] = frozenset({"completed", "failed", "cancelled"})


# ``schema`` is a BaseModel attribute, so the field is ``schema_`` on the model
# and ``schema`` on the wire.
_SCHEMA_ALIASED = ConfigDict(
    frozen=True,
    extra="forbid",
    validate_by_name=True,
    validate_by_alias=True,
    serialize_by_alias=True,
)


class ResumedFrom(Frozen):
    """Where a resumed run came from: the export it was started from."""

    session_id: str
    run_id: str
    turn: int
    content_digest: str


class LoopCheckpoint(Frozen):
    """The logical resume point of a run: everything needed to continue its loop."""

    schema_version: int = LOOP_CHECKPOINT_SCHEMA_VERSION
    session_id: str
    run_id: str
    turn: int
    messages: tuple[Message, ...]
    capability_binding: CapabilityBinding
    total_usage: TokenUsage
    tool_calls_count: int
    checkpoint_ms: int


class RunSnapshot(Frozen):
    """One run of the session as an export shows it (``docs/checkpoint-export-v1.md``)."""

    id: str
    """The run's id (the workflow's ``run_id`` of its input, not Temporal's)."""
    session_id: str
    status: RunStatus
    """``running``, or how it ended (``TERMINAL_STATUSES``)."""
    prompt: str
    capability_binding: CapabilityBinding
    """The tools, rules and instruction files it was bound to, with their digest."""
    created_at_ms: int
    updated_at_ms: int
    """Workflow time (epoch ms) of its start and of its newest event."""
    event_count: int
    result_text: str | None = None
    error: str | None = None
    resumed_from: ResumedFrom | None = None
    """The export it went on from, for a resumed run."""

    @property
    def is_terminal(self) -> bool:
        return self.status in TERMINAL_STATUSES


class RunRecord(Frozen):
    snapshot: RunSnapshot
    events: tuple[EventRecord, ...]


class SessionSnapshot(Frozen):
    session_id: str
    schema_version: int = SESSION_SNAPSHOT_SCHEMA_VERSION
    run_records: tuple[RunRecord, ...]


class CheckpointPayload(Frozen):
    model_config = _SCHEMA_ALIASED
    schema_: Literal["durable-agent.session-checkpoint-payload.v1"] = Field(
        default=PAYLOAD_SCHEMA, alias="schema"
    )
    logical_resume: LoopCheckpoint
    snapshot: SessionSnapshot

    def source_run(self) -> RunRecord:
        """The run record the logical resume was taken from (it is in the same snapshot)."""
        for record in self.snapshot.run_records:
            if record.snapshot.id == self.logical_resume.run_id:
                return record
        raise InvalidPayload(f"run {self.logical_resume.run_id!r} is not in the snapshot")


class ExportDescriptor(Frozen):
    model_config = _SCHEMA_ALIASED
    schema_: Literal["durable-agent.session-checkpoint-export.v1"] = Field(
        default=EXPORT_SCHEMA, alias="schema"
    )
    media_type: str = MEDIA_TYPE
    session_id: str
    run_id: str
    turn: int
    size_bytes: int
    content_digest: str
    snapshot_digest: str
    logical_resume_digest: str
    descriptor_digest: str

    def computed_digest(self) -> str:
        return digest_of(self.model_dump(mode="json", exclude={"descriptor_digest"}))


# --- errors -----------------------------------------------------------------


class ExportError(DurableAgentError, ValueError):
    """Base of the typed errors ``open_export`` raises; never a partial result."""


class InvalidDescriptor(ExportError):
    pass


class InvalidPayload(ExportError):
    pass


class ContentDrift(ExportError):
    """The content does not match a digest or size in the descriptor."""


class EncodingError(ExportError):
    """The file or its content is not JSON within limits, or the content is not canonical JSON.

    The limits (``json_limits``): at most ``DOCUMENT_MAX_DEPTH`` levels of nesting,
    no NaN or Infinity, no number out of a double's range, no integer longer than
    ``MAX_INT_DIGITS`` digits, no key twice in one object, UTF-8 only.
    """


def _text(data: str | bytes, what: str) -> str:
    if isinstance(data, str):
        return data
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        bad = exc.object[exc.start : exc.start + 1].hex()
        raise EncodingError(f"{what} is not UTF-8: byte 0x{bad} at offset {exc.start}") from None


def _parse(text: str, what: str) -> Any:
    """``text`` parsed within the limits; ``EncodingError`` naming ``what`` for a refused shape
    or a cut-off document, ``json.JSONDecodeError`` for anything else that is not JSON."""
    try:
        return bounded_loads(text, max_depth=DOCUMENT_MAX_DEPTH)
    except JsonLimitError as exc:
        raise EncodingError(f"{what} is refused: {exc}") from None
    except json.JSONDecodeError as exc:
        if exc.msg.startswith("Unterminated string") or not text[exc.pos :].strip():
            raise EncodingError(f"{what} ends early (truncated?): {exc}") from None
        raise


# --- building and opening ---------------------------------------------------


class SessionCheckpointExportV1(Frozen):
    """A portable checkpoint: a descriptor plus the canonical JSON content.

    Attributes:
        descriptor: What the export is (session, run, turn, size) and the digests that hold
            its content to it.
        content: The canonical JSON of the checkpoint's payload (its ``schema``, ``snapshot``
            and ``logical_resume``).
    """

    descriptor: ExportDescriptor
    content: str

    @classmethod
    def build(cls, payload: CheckpointPayload) -> SessionCheckpointExportV1:
        """The export of ``payload``: its canonical JSON and the descriptor that digests it.

        Args:
            payload: The checkpoint's payload.

        Returns:
            The export, its descriptor's digests computed from the content.

        Raises:
            InvalidPayload: The payload breaks the contract's self-consistency.
        """
        check_self_consistent(payload)
        logical = payload.logical_resume
        # The content is the canonical JSON of the payload; encoding its two parts once each
        # and joining them gives the same bytes (its keys sort as written here) at half the cost.
        logical_bytes, snapshot_bytes = canonical_bytes(logical), canonical_bytes(payload.snapshot)
        content = b"".join(
            (
                b'{"logical_resume":',
                logical_bytes,
                b',"schema":',
                canonical_bytes(payload.schema_),
                b',"snapshot":',
                snapshot_bytes,
                b"}",
            )
        )
        fields = {
            "schema": EXPORT_SCHEMA,
            "media_type": MEDIA_TYPE,
            "session_id": logical.session_id,
            "run_id": logical.run_id,
            "turn": logical.turn,
            "size_bytes": len(content),
            "content_digest": sha256_digest(content),
            "snapshot_digest": sha256_digest(snapshot_bytes),
            "logical_resume_digest": sha256_digest(logical_bytes),
        }
        descriptor = ExportDescriptor(**fields, descriptor_digest=digest_of(fields))
        return cls(descriptor=descriptor, content=content.decode("utf-8"))

    def open(self) -> CheckpointPayload:
        """Check the export whole and give its payload (``open_export``).

        Returns:
            The payload the content holds, once every digest, the size, the canonical
                encoding and the schema are checked.

        Raises:
            ExportError: The export does not hold together; a subclass says how
                (``InvalidDescriptor``, ``ContentDrift``, ``EncodingError``,
                ``InvalidPayload``). Never a partial result.
        """
        return open_export(self)


def open_export(export: SessionCheckpointExportV1) -> CheckpointPayload:
    """Re-validate an export and return its payload, or raise a typed ``ExportError``."""
    d = export.descriptor
    if d.schema_ != EXPORT_SCHEMA or d.media_type != MEDIA_TYPE:
        raise InvalidDescriptor(f"unsupported export schema {d.schema_!r} / {d.media_type!r}")
    try:
        computed = d.computed_digest()
    except CanonicalJsonError as exc:  # a descriptor that came in by another road than load_export
        raise InvalidDescriptor(f"the descriptor cannot be encoded: {exc}") from None
    if computed != d.descriptor_digest:
        raise InvalidDescriptor("descriptor_digest does not match the descriptor")
    try:
        content = export.content.encode("utf-8")
    except UnicodeEncodeError as exc:  # a lone surrogate, written as an escape in the file
        raise EncodingError(f"content is not valid Unicode at character {exc.start}") from None
    if len(content) != d.size_bytes:
        raise ContentDrift(f"content is {len(content)} bytes, descriptor says {d.size_bytes}")
    if sha256_digest(content) != d.content_digest:
        raise ContentDrift("content_digest does not match the content")
    try:
        raw = _parse(export.content, "content")
    except json.JSONDecodeError as exc:
        raise EncodingError(f"content is not JSON: {exc}") from None
    try:
        if canonical_bytes(raw) != content:
            raise EncodingError("content is not canonical JSON")
        try:
            payload = CheckpointPayload.model_validate(raw)
        except ValidationError as exc:
            raise InvalidPayload(f"payload does not match schema: {validation_message(exc)}") from None
        # Every field the content holds must survive the schema. A field added to v1 since
        # (with its default) is not in an older export: it is left out of the comparison.
        if canonical_bytes(payload.model_dump(mode="json", by_alias=True, exclude_unset=True)) != content:
            raise InvalidPayload("payload has fields or values the v1 schema does not round-trip")
    except CanonicalJsonError as exc:  # the parse's limits make this unexpected; typed all the same
        raise EncodingError(f"content cannot be re-encoded: {exc}") from None
    # the part digests are of the content's own parts, as the export was built
    if digest_of(raw["snapshot"]) != d.snapshot_digest:
        raise ContentDrift("snapshot_digest does not match the snapshot")
    if digest_of(raw["logical_resume"]) != d.logical_resume_digest:
        raise ContentDrift("logical_resume_digest does not match the logical resume")
    logical = payload.logical_resume
    if (d.session_id, d.run_id, d.turn) != (logical.session_id, logical.run_id, logical.turn):
        raise InvalidDescriptor("descriptor session/run/turn differ from the payload")
    check_self_consistent(payload)
    for message in logical.messages:
        for image in message.images():
            _check_image(image)
    return payload


def load_export(data: str | bytes) -> SessionCheckpointExportV1:
    """An export from the JSON document the filesystem sink writes (not yet opened: ``open()``).

    Text outside the limits, not UTF-8 or cut short raises ``EncodingError``; a
    document of another shape raises pydantic's ``ValidationError``, as before.
    """
    text = _text(data, "the export file")
    try:
        raw = _parse(text, "the export file")
    except json.JSONDecodeError:
        # Not JSON at all: pydantic's own message, which callers have always been shown.
        return SessionCheckpointExportV1.model_validate_json(text)
    return SessionCheckpointExportV1.model_validate(raw)


@dataclass(frozen=True)
class CheckedBefore:
    """What the check of an earlier export of the same run covered, which the next check may
    take as checked: items are frozen, so the same object checks the same
    (``ExportEncoder`` counts the items still at their places, by identity)."""

    messages: int = 0  # the logical resume's first messages
    events: int = 0  # the source run's first events
    prior: bool = False  # the records of the session's other runs, all of them


def check_self_consistent(payload: CheckpointPayload, before: CheckedBefore = CheckedBefore()) -> None:
    """Raise ``InvalidPayload`` unless the payload meets the contract's self-consistency.

    Args:
        payload: The export's payload.
        before: What an earlier check of the same run's export covered: a boundary checks
            what it adds, not the whole run again (the default checks all of it).
    """
    logical = payload.logical_resume
    snapshot = payload.snapshot
    if logical.turn < 1:
        raise InvalidPayload(f"turn must be >= 1, got {logical.turn}")
    if logical.schema_version != LOOP_CHECKPOINT_SCHEMA_VERSION:
        raise InvalidPayload(f"unsupported loop checkpoint version {logical.schema_version}")
    if snapshot.session_id != logical.session_id:
        raise InvalidPayload("snapshot and logical resume name different sessions")
    seen: set[str] = set()
    for record in snapshot.run_records:
        run = record.snapshot
        if run.session_id != snapshot.session_id:
            raise InvalidPayload(f"run {run.id!r} belongs to session {run.session_id!r}")
        if run.id in seen:
            raise InvalidPayload(f"run id {run.id!r} appears twice")
        seen.add(run.id)
        events = record.events
        if run.id == logical.run_id:
            start = min(before.events, len(events))
        else:
            start = len(events) if before.prior else 0
        previous = events[start - 1].sequence if start else 0
        for index in range(start, len(events)):
            if events[index].sequence <= previous:
                raise InvalidPayload(f"run {run.id!r}: event sequences do not strictly increase")
            previous = events[index].sequence
        if run.event_count < previous:
            raise InvalidPayload(f"run {run.id!r}: event_count does not cover its events")
    for message in logical.messages[before.messages :]:
        for image in message.images():
            # cheap, so at every boundary: an export holds its images whole (``open`` checks
            # each image's digest and size too, once, on what arrives from outside)
            if not image.data:
                raise InvalidPayload(f"image {image.digest} has no data (an export holds its images whole)")
    source = payload.source_run().snapshot
    if source.is_terminal:
        raise InvalidPayload(f"source run {source.id!r} is terminal ({source.status})")
    if source.capability_binding != logical.capability_binding:
        raise InvalidPayload("capability binding differs between logical resume and source run")


def _check_image(image: ImageBlock) -> None:
    """An image of an export read from outside is what it states: its data has its digest and size
    (``check_self_consistent`` has already refused one without data)."""
    if sha256_digest(image.data.encode("ascii", errors="replace")) != image.digest:
        raise InvalidPayload(f"image {image.digest}: its data does not have that digest")
    try:
        size = len(base64.b64decode(image.data, validate=True))
    except ValueError:
        raise InvalidPayload(f"image {image.digest}: its data is not base64") from None
    if size != image.size:
        raise InvalidPayload(f"image {image.digest} is {size} bytes, not the {image.size} it states")


def tool_end_ids(record: RunRecord) -> list[str]:
    """Tool call ids of the run's ``tool_end`` events, in order."""
    return [e.event.id for e in record.events if isinstance(e.event, ToolEndEvent)]


def workspace_origin_of(events: Sequence[EventRecord]) -> WorkspaceOrigin | None:
    """Where the run's workspace came from, as its ``run_start`` event says (a workspace made from
    a git source; None otherwise).

    Args:
        events: A run's events, in order (an export's ``source_run().events``).

    Returns:
        The origin, or None.
    """
    for record in events:
        if isinstance(record.event, RunStartEvent):
            return record.event.origin
    return None


def workspace_tree_of(events: Sequence[EventRecord]) -> str | None:
    """The git tree of the workspace as the run's events last recorded it (the newest
    ``tool_end`` event with a ``workspace``); None when none did.

    Args:
        events: A run's events, in order (an export's ``source_run().events``).

    Returns:
        The tree id, or None.
    """
    for record in reversed(events):
        event = record.event
        if isinstance(event, ToolEndEvent) and event.workspace is not None:
            return event.workspace.tree
    return None
