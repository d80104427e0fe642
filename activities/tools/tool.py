"""The tool seam: what a tool is, how its paths are confined, and how tools run off the event loop.

The built-in tools live in ``fs`` (read, write, edit, ls),
``search`` (glob, grep) and ``bash`` (bash); ``builtin`` names them. Every one is
confined to the run's workspace: a path that leads outside it, by ``..``, by
being absolute or through a symbolic link, is refused before anything is read
or written.

The activity runs each tool under ``heartbeating``, so a cancel reaches the
tool's coroutine as ``asyncio.CancelledError``. Tools that block run in a
thread; the long ones (glob, grep) watch a stop flag so that a cancelled
search ends instead of running on in its thread, and run in threads of their
own so that searches never hold up the other tools.

Temporal runs activities at least once, so any tool call may run again after
a worker crash; ``durable_agent.core.builtin_catalog`` documents what each repeat does.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import threading
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from durable_agent.core.activity_api import ToolCallInput
from durable_agent.core.errors import DurableAgentError
from durable_agent.core.models import ImageBlock
from durable_agent.core.tool_specs import ToolSpec


class ToolFailure(DurableAgentError):
    """An expected failure (a missing file, a path outside the workspace): shown to the model."""


@dataclass(frozen=True)
class ToolContent:
    """A tool's result with images besides its text (``read`` of a PNG, an MCP image).

    The images carry their data here; the tool activity keeps it in the session store and
    passes the images on as references (``activities/staging.py``).

    Attributes:
        text: The result's text, what the model reads.
        images: The images, each with its media type and base64 data.
    """

    text: str
    images: tuple[ImageBlock, ...] = ()


ToolImpl = Callable[[Any, Path], Awaitable[str | ToolContent]]


# Set by the tool activity for the call it runs, so that a tool of the host's (``custom.py``) can
# tell its function which run and call it serves without changing every tool's signature. A
# context variable: each activity runs in a context of its own, and a tool's thread gets a copy.
CURRENT_CALL: contextvars.ContextVar[ToolCallInput | None] = contextvars.ContextVar(
    "current_call", default=None
)


def text_of(result: str | ToolContent) -> str:
    """A tool's result as text (its images left out)."""
    return result.text if isinstance(result, ToolContent) else result


@dataclass(frozen=True)
class Tool:
    """A tool a worker can run: its spec and its coroutine ``run(args, workspace)``."""

    spec: ToolSpec
    run: ToolImpl


def confine(workspace: Path, path: str) -> Path:
    """Resolve ``path`` inside ``workspace``, following links; refuse anything outside.

    Links are resolved as far as the path exists, so a link to an outside file,
    a linked folder on the way and a link dangling towards the outside are all
    refused, as are ``..`` and absolute paths that leave the workspace.

    This judges a path; it does not open one. A link may change before the path
    is opened, so the file tools open theirs with ``beneath.walk`` (no link
    followed by the kernel, and the path opened judged again).
    """
    root = workspace.resolve()
    try:
        candidate = (root / path).resolve()
    except (OSError, RuntimeError, ValueError) as exc:  # a link loop, a NUL byte
        raise ToolFailure(f"path {path!r} cannot be resolved: {exc}") from None
    if candidate != root and not candidate.is_relative_to(root):
        raise ToolFailure(f"path {path!r} is outside the workspace")
    return candidate


def threaded(fn: Callable[[Any, Path], str | ToolContent]) -> ToolImpl:
    """Run a blocking tool in a thread, off the worker's event loop."""

    async def run(args: Any, workspace: Path) -> str | ToolContent:
        return await asyncio.to_thread(fn, args, workspace)

    return run


# Searches run in threads of their own, so a few long ones (each bounded, see ``search``)
# never keep the quick tools of other runs waiting for a thread of the shared default pool.
SEARCH_THREADS = 4
_search_pool: ThreadPoolExecutor | None = None


def _searches() -> ThreadPoolExecutor:
    global _search_pool
    if _search_pool is None:
        _search_pool = ThreadPoolExecutor(SEARCH_THREADS, thread_name_prefix="tool-search")
    return _search_pool


def stoppable(fn: Callable[[Any, Path, threading.Event], str]) -> ToolImpl:
    """Like ``threaded``, for a long tool that checks ``stop`` and returns early once it is set.

    A thread cannot be interrupted, so on cancel the flag is set and the
    cancellation goes on at once; the search notices the flag between entries
    and between lines, and no single step of it (one regular-expression call
    included) takes more than a fraction of a second, so the thread ends soon
    after. Searches have their own threads (``SEARCH_THREADS``): one that
    waits for a thread and is cancelled never starts.
    """

    async def run(args: Any, workspace: Path) -> str:
        stop = threading.Event()
        loop = asyncio.get_running_loop()
        try:
            return await loop.run_in_executor(
                _searches(), functools.partial(contextvars.copy_context().run, fn, args, workspace, stop)
            )
        except asyncio.CancelledError:
            stop.set()
            raise

    return run
