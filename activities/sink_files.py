"""The filesystem sink's files: a small manifest a boundary, and content-addressed parts.

A run's folder holds ``turn-000001-<digest>.json`` for each export and a
``parts/`` folder. An export's file is a manifest
(``durable-agent.export-manifest.v1``): its descriptor, the small parts of
its content around the two arrays that grow (the conversation and the run's
events), and, for each array, how many items it has, their chain digest
(``durable_agent.core.export_parts``) and the newest part that holds some
of them. A part (``parts/<sha256 of its bytes>``) holds the items one
boundary added, one canonical JSON text a line after a one-line header
naming the part that holds the items before them. A boundary writes one part
with what it added and one manifest: what a sink stores grows with what the
run adds, not with its length.

Reading an export's file gives the whole export back (``read_export_file``),
the same bytes the descriptor's digests cover; files written whole (one
``{"descriptor", "content"}`` document, as before this layout) are read as
they are. ``durable-agent pack`` writes an export out as such a document,
one portable file.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from pydantic import ValidationError

from durable_agent.activities.files import write_atomic
from durable_agent.activities.sink_manifest import (
    HEADER_MAX_BYTES,
    HeaderCache,
    ManifestError,
    missing_part,
    parse_json,
    part_header,
    part_name,
    series_of,
    shown,
)
from durable_agent.core.canonical import canonical_bytes, sha256_digest
from durable_agent.core.export import (
    PAYLOAD_SCHEMA,
    EncodingError,
    ExportDescriptor,
    SessionCheckpointExportV1,
    load_export,
)
from durable_agent.core.export_parts import CHAIN_START, PartedExport, joined

__all__ = [
    "MANIFEST_SCHEMA",
    "ManifestError",
    "PartReader",
    "PartedWrite",
    "folder_headers",
    "folder_reader",
    "join_manifest",
    "newest_manifest",
    "parts_present",
    "plan_parted",
    "read_export_file",
    "read_manifest",
    "whole_document",
    "whole_export",
    "write_parted",
]

MANIFEST_SCHEMA: Final = "durable-agent.export-manifest.v1"
PARTS = "parts"
_TEXT_PARTS = ("logical_head", "logical_tail", "snapshot_head", "record_head", "record_tail", "snapshot_tail")


def _series(head: str | None, count: int, chain: str) -> dict[str, Any]:
    return {"chain": chain, "count": count, "part": head}


@dataclass(frozen=True)
class PartedWrite:
    """What delivering one export as parts writes: new parts (name, bytes), then the manifest."""

    parts: tuple[tuple[str, bytes], ...]
    manifest: dict[str, Any]

    @property
    def manifest_bytes(self) -> bytes:
        return json.dumps(self.manifest, indent=1, ensure_ascii=False).encode("utf-8") + b"\n"


def plan_parted(export: PartedExport, parent: dict[str, Any] | None) -> PartedWrite:
    """The parts and the manifest of ``export``; ``parent`` is the manifest of an earlier export
    of the run in the same place (its items are not written again where they are the first
    items of this one). Writes nothing: the filesystem and PostgreSQL sinks store the result."""
    m_keep, m_prev = _kept(parent, "messages", export.message_chains)
    e_keep, e_prev = _kept(parent, "events", export.event_chains)
    new_messages, new_events = export.messages[m_keep:], export.events[e_keep:]
    m_head, e_head = m_prev, e_prev
    parts: list[tuple[str, bytes]] = []
    if new_messages or new_events:
        header = {
            "events": {"new": len(new_events), "prev": e_prev},
            "kind": "turn",
            "messages": {"new": len(new_messages), "prev": m_prev},
        }
        name, data = _part(header, (*new_messages, *new_events))
        parts.append((name, data))
        m_head = name if new_messages else m_prev
        e_head = name if new_events else e_prev
    prior = None
    if export.prior:
        prior, data = _part({"kind": "records", "new": len(export.prior)}, export.prior)
        parts.append((prior, data))
    manifest = {
        "schema": MANIFEST_SCHEMA,
        "descriptor": export.descriptor.model_dump(mode="json"),
        "messages": _series(m_head, len(export.messages), export.message_chain),
        "events": _series(e_head, len(export.events), export.event_chain),
        "prior": prior,
        **{key: getattr(export, key).decode("utf-8") for key in _TEXT_PARTS},
    }
    return PartedWrite(tuple(parts), manifest)


def write_parted(path: Path, export: PartedExport, parent: dict[str, Any] | None) -> dict[str, Any]:
    """Write ``export``'s new parts, then its manifest at ``path`` (``plan_parted``), each fsynced."""
    planned = plan_parted(export, parent)
    for name, data in planned.parts:
        part = path.parent / PARTS / name
        try:
            intact = part.stat().st_size == len(data)
        except FileNotFoundError:
            intact = False
        if not intact:  # not there, or cut short: its name says what it must hold
            write_atomic(part, data)
    write_atomic(path, planned.manifest_bytes)
    return planned.manifest


def _kept(parent: dict[str, Any] | None, key: str, chains: tuple[str, ...]) -> tuple[int, str | None]:
    """How many of the first items the parent's parts hold already, and its newest part."""
    if parent is None:
        return 0, None
    try:
        count, part, chain = series_of(parent, key)
    except ManifestError:
        return 0, None  # a parent that does not add up is no parent: everything is written
    if count == 0 or count > len(chains) or chains[count - 1] != chain:
        return 0, None
    return count, part


def _part(header: dict[str, Any], items: tuple[bytes, ...]) -> tuple[str, bytes]:
    data = b"".join((canonical_bytes(header), b"\n", *(item + b"\n" for item in items)))
    return sha256_digest(data).removeprefix("sha256:"), data


def whole_document(export: SessionCheckpointExportV1) -> bytes:
    """The export as one portable document: its descriptor and its content as a string."""
    document = {"descriptor": export.descriptor.model_dump(mode="json"), "content": export.content}
    return json.dumps(document, indent=2, ensure_ascii=False).encode("utf-8") + b"\n"


def parts_present(folder: Path, manifest: dict[str, Any], cache: HeaderCache | None = None) -> bool:
    """Whether every part a manifest needs is in ``folder``'s parts: the whole chain, so a part
    deleted anywhere in it, not only the newest, makes it ``False``. The parts' headers are
    read (or taken from ``cache``); the folder is listed once."""
    parts = folder / PARTS
    try:
        present = set(os.listdir(parts))
    except FileNotFoundError:
        present = set()
    return missing_part(manifest, (cache or HeaderCache()).reader(present, folder_headers(parts))) is None


def folder_headers(folder: Path) -> Callable[[str], dict[str, Any] | None]:
    """Parts' headers read from ``folder`` (``None`` for a part that is not there or not whole)."""

    def header(name: str) -> dict[str, Any] | None:
        try:
            with open(folder / name, "rb") as f:
                return part_header(f.read(HEADER_MAX_BYTES))
        except (OSError, ManifestError):
            return None

    return header


def read_manifest(path: Path) -> dict[str, Any] | None:
    """The manifest in ``path``; ``None`` for a file written whole."""
    raw = parse_json(path.read_bytes(), path.name)
    return raw if isinstance(raw, dict) and raw.get("schema") == MANIFEST_SCHEMA else None


def newest_manifest(folder: Path, before: Path) -> dict[str, Any] | None:
    """The manifest of the run's newest export in ``folder`` other than ``before``, if it is one."""
    names = sorted(p.name for p in folder.glob("turn-*.json") if p.name != before.name)
    for name in reversed(names):
        if name < before.name:
            try:
                return read_manifest(folder / name)
            except (OSError, EncodingError):
                return None
    return None


# --- reading ---------------------------------------------------------------------------------


def read_export_file(path: Path) -> SessionCheckpointExportV1:
    """The export in a file the filesystem sink wrote (a manifest, joined with its parts) or in
    a portable file; not yet validated (``open()`` checks every digest).

    Args:
        path: A file the filesystem sink wrote (a manifest, joined with the parts in its
            folder's ``parts/``) or a portable export file (``durable-agent pack``).

    Returns:
        The export, not yet validated: ``open()`` checks every digest.

    Raises:
        OSError: The file cannot be read (``FileNotFoundError``: it is not there).
        EncodingError: The file is not an export; ``ManifestError``, an ``EncodingError``,
            when a manifest does not add up, or a part it names is missing, damaged or
            cannot be read.
    """
    data = path.read_bytes()
    if b'"' + MANIFEST_SCHEMA.encode() + b'"' not in data[:200]:
        return whole_export(data, path.name)
    raw = parse_json(data, path.name)
    if not isinstance(raw, dict) or raw.get("schema") != MANIFEST_SCHEMA:
        return whole_export(data, path.name)
    return join_manifest(raw, folder_reader(path.parent / PARTS))


def whole_export(data: bytes | str, what: str) -> SessionCheckpointExportV1:
    """An export written whole (``{"descriptor", "content"}``); ``EncodingError`` when it is not."""
    try:
        return load_export(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "the document"
        raise EncodingError(
            f"{what} is not an export: {where}: {first['msg']} ({exc.error_count()} problem(s))"
        ) from None


def folder_reader(folder: Path) -> Callable[[str], bytes | None]:
    """Parts read from ``folder`` (``None`` for one that is not there)."""

    def read(name: str) -> bytes | None:
        try:
            return (folder / name).read_bytes()
        except FileNotFoundError:
            return None

    return read


def join_manifest(
    manifest: dict[str, Any], parts: Callable[[str], bytes | None]
) -> SessionCheckpointExportV1:
    """The whole export a manifest names, its parts read with ``parts`` (name -> bytes)."""
    if not isinstance(manifest, dict):
        raise ManifestError("the manifest is not a JSON object")
    texts: dict[str, bytes] = {}
    for key in _TEXT_PARTS:
        value = manifest.get(key)
        if not isinstance(value, str):
            raise ManifestError(f"the manifest's {key} is {shown(value)}, not a text")
        texts[key] = value.encode("utf-8", "surrogatepass")
    try:
        descriptor = ExportDescriptor.model_validate(manifest.get("descriptor"))
    except ValidationError as exc:
        raise ManifestError(f"the manifest's descriptor is not one: {exc.errors()[0]['msg']}") from None
    reader = PartReader(parts)
    messages = reader.items(manifest, "messages")
    events = reader.items(manifest, "events")
    prior = reader.records(part_name(manifest.get("prior")))
    pieces = (
        b'{"logical_resume":',
        texts["logical_head"],
        *joined(messages),
        texts["logical_tail"],
        b',"schema":' + canonical_bytes(PAYLOAD_SCHEMA) + b',"snapshot":',
        texts["snapshot_head"],
        *joined(prior),
        texts["record_head"],
        *joined(events),
        texts["record_tail"],
        texts["snapshot_tail"],
        b"}",
    )
    content = b"".join(pieces)
    try:
        text = content.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ManifestError(f"the joined content is not UTF-8 at byte {exc.start}") from None
    return SessionCheckpointExportV1(descriptor=descriptor, content=text)


class PartReader:
    """The parts a manifest names, each read once, checked against its name; one reader serves
    every manifest of a run folder (``sink_gc`` reads a run's exports with one)."""

    def __init__(self, read: Callable[[str], bytes | None]) -> None:
        self.read = read
        self._read: dict[str, tuple[dict[str, Any], list[bytes]]] = {}

    def part(self, name: str) -> tuple[dict[str, Any], list[bytes]]:
        if name not in self._read:
            part_name(name)
            try:
                data = self.read(name)
            except OSError as exc:
                raise ManifestError(f"part {name} cannot be read: {exc}") from None
            if data is None:
                raise ManifestError(f"part {name} is missing")
            if sha256_digest(data) != "sha256:" + name:
                raise ManifestError(f"part {name} does not match its name (damaged)")
            try:
                header = part_header(data)
            except ManifestError as exc:
                raise ManifestError(f"part {name}: {exc}") from None
            lines = data.partition(b"\n")[2].split(b"\n")
            if lines[-1] != b"":
                raise ManifestError(f"part {name} does not end with a line break")
            self._read[name] = (header, lines[:-1])
        return self._read[name]

    def items(self, manifest: dict[str, Any], key: str) -> list[bytes]:
        """The ``count`` items of ``key`` the chain of parts from the manifest's newest holds."""
        count, name, chain = series_of(manifest, key)
        chunks: list[list[bytes]] = []
        held, seen = 0, set()
        while held < count:
            if name is None or name in seen:
                raise ManifestError(f"the parts hold {held} of the {count} {key} the manifest names")
            seen.add(name)
            header, lines = self.part(name)
            if header.get("kind") == "records":
                raise ManifestError(f"part {name} holds records, not {key}")
            m, e = header["messages"]["new"], header["events"]["new"]
            if m + e != len(lines):
                raise ManifestError(f"part {name} holds {len(lines)} lines, its header says {m + e}")
            chunk = lines[:m] if key == "messages" else lines[m:]
            chunks.append(chunk)
            held += len(chunk)
            name = header[key]["prev"]
        if held != count:
            raise ManifestError(f"the parts hold {held} {key}, the manifest names {count}")
        out = [item for chunk in reversed(chunks) for item in chunk]
        if count == 0 and chain != CHAIN_START:
            raise ManifestError(f"the manifest's {key} chain is not that of no items")
        return out

    def records(self, name: str | None) -> list[bytes]:
        if name is None:
            return []
        header, lines = self.part(name)
        if header.get("kind") != "records" or header.get("new") != len(lines):
            raise ManifestError(f"part {name} is not the prior runs' records")
        return lines
