"""What every activity here shares: heartbeating, and the two typed failures the workflow reads."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from typing import TypeVar

from temporalio import activity
from temporalio.exceptions import ApplicationError

from durable_agent.core.failures import INVALID_RUN_INPUT, STATE_MISSING
from durable_agent.core.run_log import StateMissing

T = TypeVar("T")

LIVE_TEXT_INTERVAL_SECONDS = 0.25


def state_missing(exc: StateMissing) -> ApplicationError:
    """Not retried: the workflow sends the missing entries again from its history, then retries."""
    head = exc.head.model_dump(mode="json") if exc.head is not None else None
    return ApplicationError(str(exc), head, type=STATE_MISSING, non_retryable=True)


def usage_error(message: str) -> ApplicationError:
    """A bad run input or config: fails at once, with the message the user sees."""
    return ApplicationError(message, type=INVALID_RUN_INPUT, non_retryable=True)


async def heartbeating(awaitable: Awaitable[T], details: Callable[[], object] | None = None) -> T:
    """Await while heartbeating, so a cancel reaches the activity within seconds.

    With ``details``, each heartbeat carries what it returns (a streaming model
    call's text so far), and heartbeats come often enough for a follower to see
    text appear; the worker's throttle decides how often they reach the server.
    """
    info = activity.info()
    if info.is_local:  # a local activity has no heartbeat; its workflow task times it out
        return await awaitable
    timeout = info.heartbeat_timeout
    # half the heartbeat timeout: a worker that died is still noticed one timeout after its last
    # beat, and an activity of T seconds costs about T / (timeout / 2) billed heartbeats
    interval = timeout.total_seconds() / 2 if timeout else 5.0
    if details is not None:
        interval = min(interval, LIVE_TEXT_INTERVAL_SECONDS)
    task = asyncio.ensure_future(awaitable)
    try:
        while True:
            done, _ = await asyncio.wait({task}, timeout=interval)
            if done:
                return task.result()
            activity.heartbeat(*(() if details is None else (details(),)))
    finally:
        if not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
