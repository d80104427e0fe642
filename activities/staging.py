"""Staging: a long tool output or model message kept in the session store by the activity that
made it, so that the save after it names the text by digest instead of carrying it again; and a
tool's images, kept there so that history holds only their digests (``core/images.py``)."""

from __future__ import annotations

import logging
from collections.abc import Sequence

from durable_agent.activities.store.session_store import SessionStore
from durable_agent.core.images import referenced_digests, with_image_data
from durable_agent.core.models import ImageBlock, Message
from durable_agent.core.run_log import STAGE_MIN_BYTES, text_digest

log = logging.getLogger(__name__)


async def stage(store: SessionStore, run_id: str, content: str) -> bool:
    """Keep a long output (or model message) in the store, so the save after this call can
    name it by digest.

    Only a cache: it is this activity's result all the same, and a save
    that does not find it here is sent it whole. So a store that fails
    here costs history bytes, never the call.
    """
    if len(content.encode()) < STAGE_MIN_BYTES:
        return False
    try:
        await store.stage_text(run_id, text_digest(content), content)
    except Exception as exc:
        log.warning("could not stage a tool output of run %s: %s", run_id, exc)
        return False
    return True


async def staged_text(store: SessionStore, run_id: str, digest: str) -> str | None:
    """The text staged under ``digest``, if the store holds it whole (checked against the digest)."""
    text = await store.staged_text(run_id, digest)
    return text if text is not None and text_digest(text) == digest else None


async def stage_images(
    store: SessionStore, run_id: str, images: Sequence[ImageBlock]
) -> tuple[ImageBlock, ...]:
    """Keep each image's data in the store; the images as references (what history holds).

    Unlike a long text, an image is not also in the activity's result, so a store that
    fails here fails the call (Temporal retries it) rather than lose the image.
    """
    for image in images:
        if not image.is_reference:
            await store.stage_text(run_id, image.digest, image.data)
    return tuple(i.reference() for i in images)


async def filled_images(
    store: SessionStore,
    run_id: str,
    messages: Sequence[Message],
    memo: dict[int, tuple[Message, Message]] | None = None,
    *,
    whole_log: bool = False,
) -> list[Message]:
    """``messages`` with the data of their referenced images read back from the store.

    Args:
        store: the session store the tool activities kept the images in.
        run_id: the run whose images they are.
        messages: the conversation, images by reference.
        memo: ``id(message)`` to ``(message, filled)`` from earlier calls: a message filled
            before comes back as the same object (an export's encoder then knows it and does
            not encode it again), and its images are not read again.
        whole_log: ``messages`` are the run's whole log, the objects its cache keeps: those
            without images go in the memo too, as themselves (a long run's boundary then
            looks each message up instead of searching all their blocks again), and the memo
            forgets the messages no longer in the log (a rewind's). Not for a model's view of
            the log, whose messages may be new objects at every call.

    Returns:
        The messages; those with images are other objects, holding the images' data.
    """
    memo = {} if memo is None else memo
    if whole_log and len(memo) > 2 * len(messages) + 64:
        current = {id(m) for m in messages}
        for key in [k for k in memo if k not in current]:
            del memo[key]
    out = list(messages)
    todo: list[int] = []
    for index, message in enumerate(messages):
        hit = memo.get(id(message))
        if hit is not None and hit[0] is message:
            out[index] = hit[1]
        elif message.images():
            todo.append(index)
        elif whole_log:
            memo[id(message)] = (message, message)
    if not todo:
        return out
    found = {}
    for digest in referenced_digests(messages[i] for i in todo):
        data = await staged_text(store, run_id, digest)
        if data is not None:
            found[digest] = data
        else:
            log.warning("run %s: the store no longer holds image %s", run_id, digest)
    filled = with_image_data([messages[i] for i in todo], found)
    for index, shown in zip(todo, filled, strict=True):
        out[index] = shown
        memo[id(messages[index])] = (messages[index], shown)
    return out
