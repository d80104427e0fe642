"""The worker's side of one MCP server: list its tools and call them, over one persistent
session (a stdio process it starts, or a streamable HTTP endpoint), on the official ``mcp`` SDK.

A ``McpServer`` connects on first use and keeps that session for every call, from any task and
several at once (``session``). When the session dies (the process exits, the HTTP transport
fails) the server is marked unavailable, the calls in flight raise ``McpCrashed``, and the next
list or call connects afresh (a new process). Nothing here repeats a call that may have run:
Temporal does. (A call an HTTP server refused because it forgot the session, after a restart,
never ran: that one is sent again at once, on a new session.)
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import anyio
from mcp import Client, types
from mcp.shared.exceptions import MCPError
from pydantic import ValidationError

from durable_agent.activities.mcp.model_text import McpToolInfo, render_result, result_images, tool_info
from durable_agent.activities.mcp.session import ConnectFailed, McpSession
from durable_agent.config import ConfigError, McpServerConfig
from durable_agent.core.models import ImageBlock

__all__ = ["McpCallResult", "McpCrashed", "McpServer", "McpToolInfo", "McpUnavailable"]

# A tools/list that pages on past this is cut short there (a server that never stops paging).
MAX_LIST_PAGES = 100
# How long a call that saw the connection close waits for the session's end, for the reason.
LOST_REASON_WAIT_SECONDS = 2.0
# Secret values shorter than this are not looked for in messages (they would match anything).
_MIN_REDACTED = 4


@dataclass(frozen=True)
class McpCallResult:
    """A tool call's outcome as the model sees it."""

    text: str  # the result rendered as text (``render.render_result``), or the error's message
    is_error: bool  # the server said isError, or answered the request with a JSON-RPC error
    images: tuple[ImageBlock, ...] = ()  # its images a model can be shown (``render.result_images``)


class McpUnavailable(Exception):
    """The server could not be started, reached or initialized; the message says why (never a
    secret) and does not name the server (the caller does)."""


class McpCrashed(Exception):
    """The connection was lost while the call was in flight: it may or may not have run."""


class McpServer:
    """One ``[mcp.NAME]`` server: its tools, and calls to them over one persistent session.

    The ``env`` and ``headers`` variables are read from ``environ`` here: a missing one raises
    ``ConfigError`` (naming the server and the variable, never a value).
    """

    def __init__(self, name: str, config: McpServerConfig, environ: Mapping[str, str] = os.environ) -> None:
        self.name = name
        self.config = config
        self._env = _resolve(name, "env", config.env, environ)
        self._headers = _resolve(name, "headers", config.headers, environ)
        secrets = [*self._env.values(), *self._headers.values()]
        if config.url is not None and (password := urlsplit(config.url).password):
            secrets.append(password)
        # the longest first, so that no part of one is left when a shorter one is inside it
        self._secrets = sorted({s for s in secrets if len(s) >= _MIN_REDACTED}, key=len, reverse=True)
        self._session: McpSession | None = None
        self._lock = asyncio.Lock()
        self._problem: str | None = None
        self._closed = False

    @property
    def available(self) -> bool:
        """False after a failed connect or a lost connection, until a later connect succeeds."""
        return self._problem is None

    @property
    def problem(self) -> str | None:
        """Why the server is unavailable (``None`` while it is not)."""
        return self._problem

    async def list_tools(self) -> list[McpToolInfo]:
        """The server's tools, all pages of them; connects first if need be (within
        ``connect_timeout_seconds``), and the listing takes at most ``timeout_seconds``.

        Raises ``McpUnavailable`` when the server cannot be reached or will not list its tools.
        """
        for attempt in range(2):
            session, client = await self._connect()
            if client.server_capabilities.tools is None:
                return []  # a server without tools, which would answer tools/list with an error
            outcome = await self._list_pages(client)
            if isinstance(outcome, MCPError) and session.expired and attempt == 0:
                continue  # refused on a session the server forgot: list again on a new one
            break
        if isinstance(outcome, list):
            return [tool_info(tool) for tool in outcome]
        if outcome is None:
            failure = f"tools/list got no answer within {self.config.timeout_seconds:g} s"
        elif isinstance(outcome, MCPError) and outcome.code == types.CONNECTION_CLOSED:
            session.lost("connection lost while listing tools")
            failure = await self._loss_reason(session)
        elif isinstance(outcome, MCPError):
            failure = f"tools/list failed ({outcome.code}): {outcome.message}"
        else:
            failure = f"tools/list answered with an invalid result: {outcome}"
        raise McpUnavailable(self._redact(failure))

    async def call_tool(self, tool: str, arguments: dict[str, Any]) -> McpCallResult:
        """Call ``tool`` with ``arguments``, within ``timeout_seconds``.

        A timeout is an error result (the SDK tells the server the call is cancelled), as is a
        JSON-RPC error (its message). Raises ``McpUnavailable`` if the server cannot be
        reached, ``McpCrashed`` if the connection dies during the call. Cancelling the awaiting
        task cancels the call at the server too, and the ``CancelledError`` propagates.
        """
        timeout = self.config.timeout_seconds
        for attempt in range(2):
            session, client = await self._connect()
            outcome = await self._call_once(client, tool, arguments)
            if isinstance(outcome, MCPError) and session.expired and attempt == 0:
                continue  # refused on a session the server forgot (it never ran): call again
            break
        if outcome is None:
            return McpCallResult(f"timed out after {timeout:g} s", is_error=True)
        if isinstance(outcome, types.CallToolResult):
            images = () if outcome.is_error else result_images(outcome)
            return McpCallResult(render_result(outcome), is_error=bool(outcome.is_error), images=images)
        if isinstance(outcome, MCPError) and outcome.code != types.CONNECTION_CLOSED:
            return McpCallResult(self._redact(outcome.message or f"error {outcome.code}"), is_error=True)
        if isinstance(outcome, MCPError) or not session.usable:
            # the SDK answers every call in flight with CONNECTION_CLOSED when the connection ends
            session.lost(f"connection lost during a call to {tool!r}")
            raise McpCrashed(await self._loss_reason(session)) from None
        return McpCallResult(self._redact(f"the server's answer could not be read: {outcome}"), is_error=True)

    async def _call_once(
        self, client: Client, tool: str, arguments: dict[str, Any]
    ) -> types.CallToolResult | Exception | None:
        """The call's result, or the exception it ended with, or ``None`` if it timed out."""
        with anyio.move_on_after(self.config.timeout_seconds):
            try:
                return await client.call_tool(tool, arguments)
            # the SDK's own checks of an answer (its output schema) fail as RuntimeError
            except (MCPError, ValidationError, RuntimeError) as exc:
                return exc
        return None

    async def _list_pages(self, client: Client) -> list[types.Tool] | Exception | None:
        """Every page of tools/list, or the exception it ended with, or ``None`` on a timeout."""
        tools: list[types.Tool] = []
        with anyio.move_on_after(self.config.timeout_seconds):
            cursor: str | None = None
            for _ in range(MAX_LIST_PAGES):
                try:
                    page = await client.list_tools(cursor=cursor)
                except (MCPError, ValidationError) as exc:
                    return exc
                tools.extend(page.tools)
                cursor = page.next_cursor
                if cursor is None:
                    break
            return tools
        return None

    def reopen(self) -> None:
        """Take calls again after ``aclose``: the next one starts the server (a worker that runs
        again on the same activities, as a plugin's second worker run does)."""
        self._closed = False

    async def aclose(self) -> None:
        """Stop the server's process (stdio) or end its HTTP session; later calls raise
        ``McpUnavailable`` until ``reopen``."""
        self._closed = True
        async with self._lock:
            session, self._session = self._session, None
        if session is not None:
            await session.close()

    async def _connect(self) -> tuple[McpSession, Client]:
        """The current session and its client, connecting a new one if there is none usable."""
        async with self._lock:
            if self._closed:
                raise McpUnavailable("closed (the worker is shutting down)")
            session = self._session
            if session is None or not session.usable:
                if session is not None:
                    await session.close()  # a lost one ends by itself; this waits for it
                session = McpSession(
                    self.name,
                    self.config,
                    self._env,
                    self._headers,
                    self._redact,
                    self._session_problem,
                )
                self._session = session
        try:
            client = await session.connected()
        except ConnectFailed as exc:
            self._session_problem(session, str(exc))
            raise McpUnavailable(str(exc)) from None
        if self._session is session and session.usable:
            self._problem = None
        return session, client

    def _session_problem(self, session: McpSession, why: str) -> None:
        if session is self._session:  # an old session's late news is not the server's state
            self._problem = why

    async def _loss_reason(self, session: McpSession) -> str:
        """Why ``session`` was lost, once its task has said (bounded: the reason can wait)."""
        await session.ended(LOST_REASON_WAIT_SECONDS)
        return session.problem or "connection lost"

    def _redact(self, text: str) -> str:
        for secret in self._secrets:
            text = text.replace(secret, "***")
        return text


def _resolve(server: str, field: str, names: Mapping[str, str], environ: Mapping[str, str]) -> dict[str, str]:
    """``{key: value of the worker's variable}`` for ``names`` (``{key: variable name}``)."""
    resolved: dict[str, str] = {}
    for key, variable in names.items():
        value = environ.get(variable)
        if value is None:
            raise ConfigError(
                f"[mcp.{server}] {field}.{key} reads the environment variable {variable}, "
                "which is not set in the worker's environment"
            )
        resolved[key] = value
    return resolved
