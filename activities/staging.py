"""Staging: a long tool output or model message kept in the session store by the activity that
made it, so that the save after it names the text by digest instead of carrying it again."""

from __future__ import annotations

import logging

from durable_agent.activities.store.base import SessionStore
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
