"""Images in the conversation, pure: what counts as one, and how a request or an export gets
their data back.

A tool's image (``read`` of a PNG, an MCP server's image content) travels as an
``ImageBlock`` in its tool result. The tool activity keeps the image's base64 text in
the session store under its digest and returns the block without its data, so the
workflow history and the run's log hold a reference of about a hundred bytes. Two
readers fill the data back in from the store: the model call, for a model that takes
images (``attachment = true``; any other sees a note instead), and the export, which is
portable and so holds every image whole.
"""

from __future__ import annotations

import base64
from collections.abc import Iterable, Mapping, Sequence
from typing import Final, Literal

from durable_agent.core.models import ImageBlock, Message, ToolResultBlock
from durable_agent.core.run_log import text_digest

MediaType = Literal["image/png", "image/jpeg", "image/gif", "image/webp"]

# The largest image a tool passes on, in bytes: within every vendor's limit on one image
# (Anthropic's 5 MB of base64 is about 3.75 MB of image; OpenAI takes 20 MB).
IMAGE_MAX_BYTES: Final = 3_750_000

# What a file starts with, by format; the name's extension is not trusted.
_SIGNATURES: Final[tuple[tuple[bytes, MediaType], ...]] = (
    (b"\x89PNG\r\n\x1a\n", "image/png"),
    (b"\xff\xd8\xff", "image/jpeg"),
    (b"GIF87a", "image/gif"),
    (b"GIF89a", "image/gif"),
)
IMAGE_EXTENSIONS: Final = frozenset({".png", ".jpg", ".jpeg", ".gif", ".webp"})


def sniff_media_type(head: bytes) -> MediaType | None:
    """The image format of a file that starts with ``head`` (its first 16 bytes suffice)."""
    for signature, media_type in _SIGNATURES:
        if head.startswith(signature):
            return media_type
    if head[:4] == b"RIFF" and head[8:12] == b"WEBP":
        return "image/webp"
    return None


def image_block(raw: bytes, media_type: MediaType) -> ImageBlock:
    """An image with its data, as base64, and the digest it is stored under."""
    data = base64.b64encode(raw).decode("ascii")
    return ImageBlock(media_type=media_type, data=data, digest=text_digest(data), size=len(raw))


def describe(image: ImageBlock) -> str:
    return f"{image.media_type}, {image.size} bytes"


def referenced_digests(messages: Iterable[Message]) -> set[str]:
    """The digests of the images in ``messages`` whose data is left out."""
    return {i.digest for m in messages for i in m.images() if i.is_reference}


def _with_images(
    messages: Sequence[Message], image: Mapping[str, ImageBlock | None], note: Mapping[str, str]
) -> list[Message]:
    """``messages`` with each image replaced by ``image[digest]`` (None: left out, and
    ``note[digest]`` added to its tool result's text)."""
    out = []
    for message in messages:
        if not message.images():
            out.append(message)
            continue
        blocks = []
        for block in message.content:
            if isinstance(block, ToolResultBlock) and block.images:
                kept = [image[i.digest] for i in block.images if image.get(i.digest) is not None]
                notes = [note[i.digest] for i in block.images if image.get(i.digest) is None]
                content = "\n".join([block.content, *notes]) if notes else block.content
                block = block.model_copy(update={"content": content, "images": tuple(i for i in kept if i)})
            blocks.append(block)
        out.append(message.model_copy(update={"content": tuple(blocks)}))
    return out


def with_image_data(messages: Sequence[Message], found: Mapping[str, str]) -> list[Message]:
    """``messages`` with the data of referenced images put back from ``found`` (digest to
    base64 text). An image the store no longer holds is left out, and its tool result says so,
    rather than failing every later step of the run."""
    image: dict[str, ImageBlock | None] = {}
    note: dict[str, str] = {}
    for m in messages:
        for i in m.images():
            data = i.data or found.get(i.digest)
            image[i.digest] = i.model_copy(update={"data": data}) if data else None
            note[i.digest] = f"[an image ({describe(i)}) is no longer available to show]"
    return _with_images(messages, image, note)


def without_images(messages: Sequence[Message], model: str) -> list[Message]:
    """``messages`` for a model that takes no images: each image becomes a note saying so."""
    note = {
        i.digest: (
            f"[an image ({describe(i)}) is not shown: model {model} is not configured to take images "
            "(attachment = true in its config)]"
        )
        for m in messages
        for i in m.images()
    }
    return _with_images(messages, {}, note)
