"""Git's objects as the sink holds them: loose objects (zlib of ``"<type> <size>\\0<body>"``),
named by their SHA-1, each checked against its id, and the entries of a tree object.
"""

from __future__ import annotations

import hashlib
import zlib

from durable_agent.activities.workspaces.errors import WorkspaceTreeError
from durable_agent.activities.workspaces.packs import PACK_TYPES

__all__ = ["object_id"]


def object_id(data: bytes) -> str:
    """The SHA-1 id of a loose object (its zlib-compressed bytes), checked to be one.

    Raises:
        WorkspaceTreeError: ``data`` is not a loose object.
    """
    return _object_parts(data)[0]


def _object_parts(data: bytes) -> tuple[str, bytes, bytes]:
    """A loose object's id, type and body, checked (``object_id``)."""
    try:
        raw = zlib.decompress(data)
    except zlib.error as exc:
        raise WorkspaceTreeError(f"not a git object: {exc}") from None
    head, sep, body = raw.partition(b"\0")
    kind, _, size = head.partition(b" ")
    if not sep or kind not in PACK_TYPES or size != str(len(body)).encode():
        raise WorkspaceTreeError("not a git object: its header does not add up")
    return hashlib.sha1(raw).hexdigest(), kind, body


def _loose(kind: str, body: bytes) -> bytes:
    return zlib.compress(f"{kind} {len(body)}\0".encode() + body, 1)


def _tree_entries(body: bytes) -> list[tuple[bytes, str]]:
    """A tree object's entries: (mode, id)."""
    out, at = [], 0
    while at < len(body):
        space = body.index(b" ", at)
        nul = body.index(b"\0", space)
        out.append((body[at:space], body[nul + 1 : nul + 21].hex()))
        at = nul + 21
    return out
