"""Exports built a boundary at a time: each message and event is encoded once per run.

An export's content is the canonical JSON of its payload. Almost all of it is
two arrays that only grow while a run runs: the conversation
(``logical_resume.messages``) and the run's events (its record's ``events`` in
the snapshot). ``ExportEncoder`` keeps the canonical bytes of every item it
has encoded, so a boundary encodes what is new and splices it between the
small parts around the arrays, which it encodes afresh (the turn, the time,
the counters). ``PartedExport`` is the result: the same bytes
``SessionCheckpointExportV1.build`` gives (tests compare them), held as parts,
so a sink can store what is new only and the digests can be taken without
joining the parts into one string.

The content's digests still cover all of it (the contract: ``content_digest``
is the sha256 of the whole content), so a boundary hashes the whole content:
at about 1.8 GB/s, 2 ms a megabyte of conversation. Everything else a
boundary does costs what it adds.

Each array also has a chain of digests, one per item: ``chain[i]`` covers the
first ``i + 1`` items. A sink compares one chain digest to know that an
export's first items are those of an export it already holds.
"""

from __future__ import annotations

import hashlib
import operator
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from pydantic import BaseModel

from durable_agent.core.canonical import canonical_bytes, digest_of, sha256_digest
from durable_agent.core.export import (
    EXPORT_SCHEMA,
    MEDIA_TYPE,
    PAYLOAD_SCHEMA,
    CheckedBefore,
    CheckpointPayload,
    ExportDescriptor,
    LoopCheckpoint,
    RunRecord,
    SessionCheckpointExportV1,
    SessionSnapshot,
    check_self_consistent,
)

# the chain digest of no items
CHAIN_START = "sha256:" + "0" * 64


def chain_next(previous: str, item: bytes) -> str:
    """The chain digest after ``item``: ``sha256(previous + " " + sha256(item))``."""
    return sha256_digest(f"{previous} {sha256_digest(item)}".encode("ascii"))


def chain_of(items: Iterable[bytes]) -> str:
    """The chain digest of ``items`` from the start."""
    chain = CHAIN_START
    for item in items:
        chain = chain_next(chain, item)
    return chain


def around(fields: dict[str, Any], key: str) -> tuple[bytes, bytes]:
    """The canonical JSON of the object ``fields`` with the array ``key``, cut around the
    array's items: ``(head, tail)``, the head ending in ``[`` and the tail starting with ``]``.

    ``head + b",".join(items) + tail`` is the canonical JSON of the object whose
    ``key`` holds those items (canonical JSON sorts keys, so the pairs before
    the key and after it are fixed by ``fields``).
    """
    pairs = {k: v for k, v in fields.items() if k != key}
    before = [_pair(k, pairs[k]) for k in sorted(pairs) if k < key]
    after = [_pair(k, pairs[k]) for k in sorted(pairs) if k > key]
    head = b"{" + b"".join(p + b"," for p in before) + canonical_bytes(key) + b":["
    tail = b"]" + b"".join(b"," + p for p in after) + b"}"
    return head, tail


def _pair(key: str, value: Any) -> bytes:
    return canonical_bytes(key) + b":" + canonical_bytes(value)


def joined(items: Sequence[bytes]) -> Iterator[bytes]:
    """``items`` with a comma between each two, as pieces (nothing is copied)."""
    for index, item in enumerate(items):
        if index:
            yield b","
        yield item


@dataclass
class _Series:
    """One growing array: the canonical bytes of its items and their chain digests."""

    sources: list[object] = field(default_factory=list)
    items: list[bytes] = field(default_factory=list)
    chains: list[str] = field(default_factory=list)
    size: int = 0  # bytes of the items

    def kept(self, values: Sequence[BaseModel]) -> int:
        """How many of the first values are the objects encoded last, at their places."""
        keep = 0
        for old, new in zip(self.sources, values, strict=False):
            if old is not new:
                break
            keep += 1
        return keep

    def sync(self, values: Sequence[BaseModel], keep: int) -> None:
        """Encode the values not encoded yet, the first ``keep`` (``kept``) being encoded.
        Values are frozen: the same object encodes the same."""
        self.size -= sum(map(len, self.items[keep:]))
        del self.sources[keep:], self.items[keep:], self.chains[keep:]
        chain = self.chains[-1] if self.chains else CHAIN_START
        for value in values[keep:]:
            item = canonical_bytes(value)
            chain = chain_next(chain, item)
            self.sources.append(value)
            self.items.append(item)
            self.chains.append(chain)
            self.size += len(item)


@dataclass(frozen=True)
class PartedExport:
    """An export held as parts (see the module's docstring); ``whole()`` joins them.

    The content is ``{"logical_resume":`` + the logical resume + ``,"schema":``
    + the payload schema + ``,"snapshot":`` + the snapshot + ``}``, where the
    logical resume is ``logical_head`` + the messages + ``logical_tail`` and
    the snapshot is ``snapshot_head`` + the prior runs' records, then this
    run's (``record_head`` + the events + ``record_tail``) + ``snapshot_tail``.
    Arrays are comma-separated; ``record_head`` starts with a comma when there
    are prior records.
    """

    descriptor: ExportDescriptor
    logical_head: bytes
    messages: tuple[bytes, ...]
    message_chains: tuple[str, ...]
    logical_tail: bytes
    snapshot_head: bytes
    prior: tuple[bytes, ...]
    record_head: bytes
    events: tuple[bytes, ...]
    event_chains: tuple[str, ...]
    record_tail: bytes
    snapshot_tail: bytes

    @property
    def message_chain(self) -> str:
        return self.message_chains[-1] if self.message_chains else CHAIN_START

    @property
    def event_chain(self) -> str:
        return self.event_chains[-1] if self.event_chains else CHAIN_START

    def logical_pieces(self) -> Iterator[bytes]:
        yield self.logical_head
        yield from joined(self.messages)
        yield self.logical_tail

    def snapshot_pieces(self) -> Iterator[bytes]:
        yield self.snapshot_head
        yield from joined(self.prior)
        yield self.record_head
        yield from joined(self.events)
        yield self.record_tail
        yield self.snapshot_tail

    def content_pieces(self) -> Iterator[bytes]:
        yield b'{"logical_resume":'
        yield from self.logical_pieces()
        yield b',"schema":' + canonical_bytes(PAYLOAD_SCHEMA) + b',"snapshot":'
        yield from self.snapshot_pieces()
        yield b"}"

    def content(self) -> bytes:
        return b"".join(self.content_pieces())

    def whole(self) -> SessionCheckpointExportV1:
        """The export as one descriptor and one content string, for any sink."""
        return SessionCheckpointExportV1(descriptor=self.descriptor, content=self.content().decode("utf-8"))


@dataclass(frozen=True)
class PartedDraft:
    """A parted export before its digests: ``digests`` needs ``sha256`` of three streams,
    which the caller may take on other threads (``hashlib`` lets go of the GIL)."""

    parts: PartedExport  # with a placeholder descriptor

    def streams(self) -> tuple[Iterator[bytes], Iterator[bytes], Iterator[bytes]]:
        """The content's, the logical resume's and the snapshot's pieces, in that order."""
        p = self.parts
        return p.content_pieces(), p.logical_pieces(), p.snapshot_pieces()

    def finish(self, content: tuple[str, int], logical: str, snapshot: str) -> PartedExport:
        """The export, given ``(sha256, size)`` of the content and sha256 of its two parts."""
        p = self.parts.descriptor
        fields = {
            "schema": EXPORT_SCHEMA,
            "media_type": MEDIA_TYPE,
            "session_id": p.session_id,
            "run_id": p.run_id,
            "turn": p.turn,
            "size_bytes": content[1],
            "content_digest": content[0],
            "snapshot_digest": snapshot,
            "logical_resume_digest": logical,
        }
        descriptor = ExportDescriptor(**fields, descriptor_digest=digest_of(fields))
        return replace(self.parts, descriptor=descriptor)


def hash_pieces(pieces: Iterable[bytes]) -> tuple[str, int]:
    """``sha256:`` digest and length of the pieces joined."""
    h, size = hashlib.sha256(), 0
    for piece in pieces:
        h.update(piece)
        size += len(piece)
    return "sha256:" + h.hexdigest(), size


_PLACEHOLDER = "sha256:" + "0" * 64


class ExportEncoder:
    """One run's exports, a boundary at a time (see the module's docstring).

    ``draft`` takes the payload ``build_export`` would build; the encoder keeps
    the items it encoded for the next boundary of the same run.
    """

    def __init__(self) -> None:
        self._messages = _Series()
        self._events = _Series()
        self._prior: tuple[tuple[RunRecord, ...], tuple[bytes, ...]] | None = None

    @property
    def size(self) -> int:
        """Bytes of the conversation and events it holds encoded."""
        return self._messages.size + self._events.size

    def draft(self, payload: CheckpointPayload) -> PartedDraft:
        logical = payload.logical_resume
        record = payload.source_run()
        prior_records = tuple(r for r in payload.snapshot.run_records if r is not record)
        # what this encoder holds was checked when it was encoded: check what is new only
        kept_messages = self._messages.kept(logical.messages)
        kept_events = self._events.kept(record.events)
        prior_known = self._prior_known(prior_records)
        before = CheckedBefore(kept_messages, kept_events, prior_known)
        check_self_consistent(payload, before)
        if payload.snapshot.run_records[-1] is not record:
            raise ValueError("the source run's record must be the snapshot's last")
        self._messages.sync(logical.messages, kept_messages)
        self._events.sync(record.events, kept_events)
        logical_head, logical_tail = around(_fields(logical, "messages"), "messages")
        snapshot_head, snapshot_tail = around(_fields(payload.snapshot, "run_records"), "run_records")
        record_head, record_tail = around(_fields(record, "events"), "events")
        placeholder = ExportDescriptor(
            session_id=logical.session_id,
            run_id=logical.run_id,
            turn=logical.turn,
            size_bytes=0,
            content_digest=_PLACEHOLDER,
            snapshot_digest=_PLACEHOLDER,
            logical_resume_digest=_PLACEHOLDER,
            descriptor_digest=_PLACEHOLDER,
        )
        prior = self._prior_items(prior_records, prior_known)
        parts = PartedExport(
            descriptor=placeholder,
            logical_head=logical_head,
            messages=tuple(self._messages.items),
            message_chains=tuple(self._messages.chains),
            logical_tail=logical_tail,
            snapshot_head=snapshot_head,
            prior=prior,
            record_head=(b"," if prior else b"") + record_head,
            events=tuple(self._events.items),
            event_chains=tuple(self._events.chains),
            record_tail=record_tail,
            snapshot_tail=snapshot_tail,
        )
        return PartedDraft(parts)

    def _prior_known(self, records: tuple[RunRecord, ...]) -> bool:
        """Whether ``records`` are those this encoder holds encoded (as objects, then by value)."""
        kept = self._prior
        if kept is None or len(kept[0]) != len(records):
            return False
        return all(map(operator.is_, kept[0], records)) or kept[0] == records

    def _prior_items(self, records: tuple[RunRecord, ...], known: bool) -> tuple[bytes, ...]:
        # ended runs do not change: encoded once per run
        if self._prior is not None and known:
            return self._prior[1]
        encoded = tuple(canonical_bytes(r) for r in records)
        self._prior = (records, encoded)
        return encoded


def _fields(model: LoopCheckpoint | SessionSnapshot | RunRecord, key: str) -> dict[str, Any]:
    """The model's JSON fields as the canonical encoding sees them, without the array ``key``."""
    dumped: dict[str, Any] = model.model_dump(mode="json", by_alias=True, exclude={key})
    return dumped


def build_parted(encoder: ExportEncoder, payload: CheckpointPayload) -> PartedExport:
    """The payload's export as parts, its digests taken here (one thread)."""
    draft = encoder.draft(payload)
    content, logical, snapshot = draft.streams()
    return draft.finish(hash_pieces(content), hash_pieces(logical)[0], hash_pieces(snapshot)[0])
