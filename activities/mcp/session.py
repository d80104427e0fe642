"""One connection to an MCP server, held open by a task of its own.

The SDK's transports and ``mcp.Client`` are anyio context managers (task groups inside) that
must be entered and left by the same task, so a ``McpSession`` starts a task that enters them,
publishes the connected ``Client`` and waits until it is told to stop or the connection ends.
Calls from any task go through that ``Client`` at the same time: its dispatcher matches each
answer to its request by id.

The connection ends when the server's message stream ends (a stdio server exited, the HTTP
transport gave up) or the HTTP transport's tasks fail; the SDK then answers every call in
flight with ``CONNECTION_CLOSED``, and the task leaves the context managers, which stop the
process (stdin closed, then SIGTERM, then SIGKILL to its process group) and reap it.

An HTTP server that keeps sessions (the 2025 protocol) and restarts answers our session's id
with 404; the SDK only reports that as the request's error, so the session is marked
``expired`` and the caller sends the request again on a new one (it was refused, never run).
"""

from __future__ import annotations

import asyncio
import math
import os
import shutil
import sys
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, AsyncExitStack, asynccontextmanager
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from types import TracebackType
from typing import Any

import anyio
import httpx2
from mcp import Client, StdioServerParameters, types
from mcp.client.stdio import stdio_client
from mcp.client.streamable_http import MCP_SESSION_ID, streamable_http_client
from mcp.shared.exceptions import MCPError
from mcp.shared.message import SessionMessage

from durable_agent.activities.mcp.stderr_log import Redact, StderrLog
from durable_agent.config import McpServerConfig

# How the protocol version is agreed: the SDK's "auto" (the newest both sides speak, or the
# initialize handshake of 2025-era servers); tests set "legacy" to act as an older client.
CONNECT_MODE = "auto"


class ConnectFailed(Exception):
    """The session never connected; the message says why."""


def executable(command: str) -> str:
    """``command`` as the worker starts it: a bare name not on PATH is looked for beside this
    Python too (a server installed in the worker's virtualenv, which need not be activated)."""
    if os.sep in command or shutil.which(command) is not None:
        return command
    beside = Path(sys.executable).parent / command
    return str(beside) if beside.is_file() and os.access(beside, os.X_OK) else command


@dataclass(eq=False, repr=False)  # no repr: ``env`` and ``headers`` hold secrets
class McpSession:
    """A task that connects to one server and keeps the connection until ``close`` or its end.

    ``connected()`` waits for the connection (or raises ``ConnectFailed``); ``problem`` says
    why the session failed or ended by itself; ``on_problem`` is told each time it changes.
    """

    name: str
    config: McpServerConfig
    # ``config``'s ``env`` (a stdio server's) and ``headers`` (an HTTP one's), their values read
    # from the worker's environment
    env: dict[str, str]
    headers: dict[str, str]
    redact: Redact
    on_problem: Callable[[McpSession, str], None]

    def __post_init__(self) -> None:
        self.problem: str | None = None
        self._stop = anyio.Event()
        self._closing = False  # ``close`` was called
        self._lost: str | None = None  # why the connection ended by itself
        # The HTTP server answered 404 to our session id: it forgot the session (a restart).
        # A request it answered so was refused before it ran, so it may be sent again.
        self.expired = False
        self._connect_scope: anyio.CancelScope | None = None
        self._ready: asyncio.Future[Client] = asyncio.get_running_loop().create_future()
        # a failure nobody waits for is not an "exception was never retrieved"
        self._ready.add_done_callback(lambda f: f.cancelled() or f.exception())
        self._task = asyncio.create_task(self._run(), name=f"mcp session {self.name}")

    @property
    def usable(self) -> bool:
        """Connected or connecting, and neither closing, lost nor failed."""
        if self._closing or self._lost is not None or self.expired or self._task.done():
            return False
        return not (self._ready.done() and self._ready.exception() is not None)

    async def connected(self) -> Client:
        """The connected client, once connected; ``ConnectFailed`` if the session never will."""
        # shielded: a caller that gives up leaves the connection to the next one
        return await asyncio.shield(self._ready)

    def lost(self, why: str) -> None:
        """The connection ended (a call saw it close): end the session. Its task says more
        (the server's last stderr lines, the transport's error) once it has ended."""
        if not self._closing and self._lost is None:
            self._lost = why
            self._set_problem(why)
        self._stop.set()

    async def close(self, wait: float | None = None) -> None:
        """Stop the session: leave the SDK's context managers (stopping the server process or
        ending the HTTP session) and wait for the task, at most ``wait`` seconds if given."""
        self._closing = True
        self._stop.set()
        if self._connect_scope is not None and not self._ready.done():
            self._connect_scope.cancel()
        await self.ended(wait)

    async def ended(self, wait: float | None = None) -> None:
        """Wait until the session's task has ended (at most ``wait`` seconds, if given)."""
        await asyncio.wait([self._task], timeout=wait)

    def _set_problem(self, why: str) -> None:
        self.problem = self.redact(why)
        self.on_problem(self, self.problem)

    async def _run(self) -> None:
        stderr = StderrLog(self.name, self.redact) if self.config.command is not None else None
        failure: str | None = None
        try:
            if stderr is not None:
                await stderr.start()
            deadline = anyio.current_time() + self.config.connect_timeout_seconds
            with anyio.CancelScope(deadline=deadline) as scope:
                self._connect_scope = scope
                async with AsyncExitStack() as stack:
                    transport = await self._transport(stack, stderr)
                    client = await stack.enter_async_context(
                        Client(
                            _watched(transport, self._ended),
                            mode=CONNECT_MODE,
                            cache=None,
                            client_info=_CLIENT_INFO,
                        )
                    )
                    if stderr is not None:
                        stderr.close_writer()  # the process has its copy; ours would hide its end
                    scope.deadline = math.inf
                    self._ready.set_result(client)
                    await self._stop.wait()
            if not self._ready.done() and not self._closing:
                failure = f"no answer within {self.config.connect_timeout_seconds:g} s"
        except Exception as exc:
            failure = self._describe(exc)
        finally:
            if stderr is not None:
                await stderr.finish()
            if failure is None and not self._closing:
                failure = self._lost
            if failure is not None and stderr is not None and stderr.tail:
                failure = f"{failure}; its stderr ended with: {' | '.join(stderr.tail)}"
            if not self._ready.done():
                self.problem = self.redact(failure or "closed before it connected")
                self._ready.set_exception(ConnectFailed(self.problem))
            elif failure is not None and not self._closing:
                self._set_problem(failure)

    def _ended(self) -> None:
        """The server's message stream ended: the connection is gone."""
        what = "the server process ended" if self.config.command else "the server ended the stream"
        self.lost(f"connection lost: {what}")

    async def _transport(
        self, stack: AsyncExitStack, stderr: StderrLog | None
    ) -> AbstractAsyncContextManager[tuple[Any, Any]]:
        config = self.config
        if config.command is not None:
            assert stderr is not None and stderr.writer is not None
            params = StdioServerParameters(
                command=executable(config.command),
                args=list(config.args),
                # the SDK adds these to its get_default_environment() (PATH, HOME, USER, ...),
                # never the worker's whole environment, which holds its API keys
                env=self.env,
                cwd=config.cwd,
            )
            return stdio_client(params, errlog=stderr.writer)
        assert config.url is not None
        # Temporal owns retries: httpx2 makes none by default, and none are added here. A read
        # may wait as long as a call does (the answer of a slow tool), and a bit longer, so
        # that the call's own timeout is the one that fires.
        timeout = httpx2.Timeout(
            config.timeout_seconds + config.connect_timeout_seconds, connect=config.connect_timeout_seconds
        )
        http = await stack.enter_async_context(
            httpx2.AsyncClient(headers=self.headers, timeout=timeout, event_hooks={"response": [self._seen]})
        )
        return streamable_http_client(config.url, http_client=http)

    async def _seen(self, response: httpx2.Response) -> None:
        # The SDK's client never starts a new session after a 404, as the spec says a client
        # must; it reports the refusal as the call's error. This marks the session for a new one.
        if response.status_code == 404 and MCP_SESSION_ID in response.request.headers:
            self.expired = True

    def _describe(self, exc: BaseException) -> str:
        """Why the session failed, in one line, from the SDK's or the transport's exception."""
        leaf = _first_leaf(exc)
        connected = self._ready.done()
        if isinstance(leaf, OSError) and not connected and self.config.command is not None:
            return f"could not start {self.config.command!r}: {leaf.strerror or leaf}"
        if isinstance(leaf, MCPError):
            if not connected and leaf.code == types.CONNECTION_CLOSED:
                return "the server closed the connection while starting"
            return f"the server answered with an error ({leaf.code}): {leaf.message}"
        if isinstance(leaf, httpx2.HTTPError):
            return f"HTTP: {type(leaf).__name__}: {leaf}"
        return f"{type(leaf).__name__}: {leaf}"


def _first_leaf(exc: BaseException) -> BaseException:
    """The first exception in ``exc`` that is not a group (anyio's task groups wrap them)."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return exc


def _client_info() -> types.Implementation:
    try:
        version = metadata.version("durable-agent")
    except metadata.PackageNotFoundError:
        version = "0"
    return types.Implementation(name="durable-agent", version=version)


_CLIENT_INFO = _client_info()


@asynccontextmanager
async def _watched(
    transport: AbstractAsyncContextManager[tuple[Any, Any]], on_end: Callable[[], None]
) -> AsyncIterator[tuple[Any, Any]]:
    """``transport``, whose read stream calls ``on_end`` when it ends."""
    async with transport as (read_stream, write_stream):
        yield _WatchedReadStream(read_stream, on_end), write_stream


class _WatchedReadStream:
    """A transport's read stream that tells ``on_end`` when the messages stop.

    The SDK's dispatcher reads until the stream ends and then fails the calls in flight, but
    nothing it offers says so to the task holding the session; this does.
    """

    def __init__(self, inner: Any, on_end: Callable[[], None]) -> None:
        self._inner = inner
        self._on_end = on_end

    @property
    def last_context(self) -> Any:
        # the dispatcher reads the sender's context from the HTTP transport's stream
        return getattr(self._inner, "last_context", None)

    async def receive(self) -> SessionMessage | Exception:
        try:
            item: SessionMessage | Exception = await self._inner.receive()
        except (anyio.EndOfStream, anyio.ClosedResourceError):
            self._on_end()
            raise
        return item

    def __aiter__(self) -> _WatchedReadStream:
        return self

    async def __anext__(self) -> SessionMessage | Exception:
        try:
            return await self.receive()
        except anyio.EndOfStream:
            raise StopAsyncIteration from None

    async def aclose(self) -> None:
        await self._inner.aclose()

    async def __aenter__(self) -> _WatchedReadStream:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()
