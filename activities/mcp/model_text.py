"""What the model sees of an MCP server: its tools' descriptions and its results as text."""

from __future__ import annotations

import base64
from dataclasses import dataclass
from typing import Any, cast

from mcp import types

from durable_agent.core.canonical import CanonicalJsonError, canonical_bytes
from durable_agent.core.images import IMAGE_MAX_BYTES, MediaType, image_block
from durable_agent.core.models import ImageBlock


@dataclass(frozen=True)
class McpToolInfo:
    """One tool as its server lists it."""

    name: str  # the server's own tool name
    description: str
    input_schema: dict[str, Any]  # an object schema; ``{"type": "object"}`` if the server gave none
    read_only: bool | None = None  # annotations.readOnlyHint, when the server says
    idempotent: bool | None = None  # annotations.idempotentHint, when the server says


def tool_info(tool: types.Tool) -> McpToolInfo:
    """The ``McpToolInfo`` of a listed tool."""
    schema = dict(tool.input_schema or {})
    # Model APIs take only object schemas; a schema that names no type describes an object here.
    schema.setdefault("type", "object")
    hints = tool.annotations
    return McpToolInfo(
        name=tool.name,
        description=tool.description or "",
        input_schema=schema,
        read_only=hints.read_only_hint if hints is not None else None,
        idempotent=hints.idempotent_hint if hints is not None else None,
    )


def render_result(result: types.CallToolResult) -> str:
    """A tool's result as text for the model.

    Text blocks as they are; an image or audio block as ``[image image/png, 1234 bytes]``; an
    embedded resource as its uri, then its text; a resource link as its uri. Structured content
    counts only when there are no blocks (servers send a text copy of it as a block too),
    as canonical JSON.
    """
    parts = [_block_text(block) for block in result.content]
    if not parts and result.structured_content is not None:
        return canonical_json(result.structured_content)
    return "\n".join(parts)


def result_images(result: types.CallToolResult) -> tuple[ImageBlock, ...]:
    """The result's images that a model can be shown: PNG, JPEG, GIF or WebP whose data is
    base64 and at most ``IMAGE_MAX_BYTES`` (their text mark stays in ``render_result``'s text)."""
    out = []
    for block in result.content:
        if not isinstance(block, types.ImageContent) or block.mime_type not in _IMAGE_TYPES:
            continue
        data = "".join(block.data.split())
        try:
            raw = base64.b64decode(data, validate=True)
        except ValueError:
            continue  # not base64: its text mark says what it was
        if len(raw) <= IMAGE_MAX_BYTES:
            out.append(image_block(raw, cast(MediaType, block.mime_type)))
    return tuple(out)


_IMAGE_TYPES = frozenset({"image/png", "image/jpeg", "image/gif", "image/webp"})


def canonical_json(value: Any) -> str:
    """``value`` as canonical JSON (the contract's), so equal values read the same; a value
    that has none (NaN, too deep) as Python shows it."""
    try:
        return canonical_bytes(value).decode()
    except CanonicalJsonError:
        return repr(value)


def _block_text(block: types.ContentBlock) -> str:
    if isinstance(block, types.TextContent):
        return block.text
    if isinstance(block, types.ImageContent | types.AudioContent):
        return f"[{block.type} {block.mime_type}, {_decoded_size(block.data)} bytes]"
    if isinstance(block, types.EmbeddedResource):
        resource = block.resource
        if isinstance(resource, types.TextResourceContents):
            return f"[resource {resource.uri}]\n{resource.text}"
        mime = resource.mime_type or "application/octet-stream"
        return f"[resource {resource.uri}, {mime}, {_decoded_size(resource.blob)} bytes]"
    # a resource link: the model may ask for it by its uri
    return str(block.uri)


def _decoded_size(data: str) -> int:
    """The byte count of base64 ``data``, without decoding it."""
    data = data.strip()
    return max(0, len(data) * 3 // 4 - data[-2:].count("="))
