"""A small server-sent events parser over an ``httpx`` response.

Follows the WHATWG event-stream rules that the model vendors rely on:
``event:`` and ``data:`` fields, several ``data:`` lines joined by newlines,
comment lines (``:``) skipped, an event dispatched at a blank line, and a
last event without its blank line dropped (the connection broke mid-event).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass

import httpx


@dataclass(frozen=True)
class SseEvent:
    """One dispatched event: its type (``message`` unless named) and its data."""

    event: str
    data: str


async def aiter_sse(response: httpx.Response) -> AsyncIterator[SseEvent]:
    """Yield the events of a ``text/event-stream`` response as they arrive."""
    event = ""
    data: list[str] = []
    async for line in response.aiter_lines():
        if not line:
            if data:
                yield SseEvent(event or "message", "\n".join(data))
            event, data = "", []
            continue
        if line.startswith(":"):
            continue
        field, _, value = line.partition(":")
        if value.startswith(" "):
            value = value[1:]
        if field == "data":
            data.append(value)
        elif field == "event":
            event = value
        # ``id`` and ``retry`` matter only to a client that reconnects; this one never does.


def is_event_stream(response: httpx.Response) -> bool:
    """True when the server answered with an event stream, as asked."""
    content_type: str = response.headers.get("content-type", "")
    return content_type.split(";")[0].strip().lower() == "text/event-stream"
