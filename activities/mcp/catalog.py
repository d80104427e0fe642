"""The worker's MCP servers and the tools they offer the model, as ``mcp__SERVER__TOOL``.

The worker lists each ``[mcp.NAME]`` server's tools when it starts (``McpCatalog.refresh``)
and again when a run starts (``for_run``: a server's tool list may change); a server that
is down is tried again when a model step would offer its tools (at once after a crash, at
most every ``RELIST_SECONDS`` while it cannot be reached). Its tools join the worker's tool table, where the
run planner offers them (permission rules apply, and a tool denied outright is not offered)
and ``agent.tool_call`` runs them like the built-in ones. Their definitions are part of the
run's capability binding, so a resume on a worker whose servers offer other tools is refused
(or forced).

A server that is down while a run goes on: its tools stay in the step's request, and the system
prompt stays as it was (a catalog that changed mid-run would cost the provider's prompt cache
for every step after it); a call of one of them is a tool error saying the server is
unavailable, the run records a ``tools_unavailable`` event, and the worker logs it.
A call cut short by the server's crash runs again (a Temporal retry, on a fresh connection)
only where ``retry = "safe"``; with ``"never"`` it comes back to the model as failed.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Iterable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from durable_agent.activities.tools.tool import Tool, ToolContent, ToolFailure
from durable_agent.config import McpServerConfig
from durable_agent.core.canonical import canonical_bytes
from durable_agent.core.json_limits import JsonLimitError, check_value
from durable_agent.core.models import ToolsUnavailable
from durable_agent.core.tool_specs import JsonArgs, ToolSpec, mcp_tool_name

if TYPE_CHECKING:
    from durable_agent.activities.mcp.connection import McpServer, McpToolInfo

log = logging.getLogger("durable_agent.mcp")

# A server found down is tried again at most this often (a run's start, a model step).
RELIST_SECONDS = 10.0
# How long a run's start or a model step waits for the servers' listings (a hanging server's
# goes on in the background): well within ``agent.resolve_run``'s 10 s timeout.
STEP_WAIT_SECONDS = 4.0
# What a server may put in front of the model and into every run's plan (Temporal's history):
# a result longer than this is cut, with a note; a tool past these bounds is not offered.
OUTPUT_MAX_BYTES = 100_000
DESCRIPTION_MAX_CHARS = 4_000
SCHEMA_MAX_BYTES = 32 * 1024
SCHEMA_MAX_DEPTH = 32
TOOLS_MAX = 128


class McpCallLost(Exception):
    """The server stopped during a call whose tools may be repeated: Temporal runs it again."""


def bounded(text: str) -> str:
    """A result of at most ``OUTPUT_MAX_BYTES``, saying where it was cut."""
    data = text.encode()
    if len(data) <= OUTPUT_MAX_BYTES:
        return text
    head = data[:OUTPUT_MAX_BYTES].decode(errors="ignore")
    return f"{head}\n[output cut at {OUTPUT_MAX_BYTES} of {len(data)} bytes]"


def admitted(server: str, infos: list[McpToolInfo]) -> list[McpToolInfo]:
    """The tools a server may offer: its first ``TOOLS_MAX``, each with a schema of at most
    ``SCHEMA_MAX_BYTES`` (the rest are logged and left out) and a description cut to
    ``DESCRIPTION_MAX_CHARS``; they ride in every run's plan."""
    out = []
    for info in infos[:TOOLS_MAX]:
        try:
            check_value(info.input_schema, max_depth=SCHEMA_MAX_DEPTH)
            size = len(canonical_bytes(info.input_schema))
        except (JsonLimitError, ValueError) as exc:
            log.warning("MCP server %s: tool %s left out: its schema is unusable: %s", server, info.name, exc)
            continue
        if size > SCHEMA_MAX_BYTES:
            log.warning("MCP server %s: tool %s left out: its schema is %d bytes", server, info.name, size)
            continue
        if len(info.description) > DESCRIPTION_MAX_CHARS:
            info = replace(info, description=info.description[:DESCRIPTION_MAX_CHARS] + "…")
        out.append(info)
    if len(infos) > TOOLS_MAX:
        log.warning("MCP server %s offers %d tools: the first %d are offered", server, len(infos), TOOLS_MAX)
    return out


def mcp_tool(server: McpServer, config: McpServerConfig, info: McpToolInfo) -> Tool:
    """One MCP tool as a worker tool: offered by its JSON schema, judged by the argument
    ``permission_args`` names for it, repeatable when the server's ``retry`` is ``"safe"``."""
    from durable_agent.activities.mcp.connection import McpCrashed, McpUnavailable  # see McpCatalog

    schema = dict(info.input_schema) or {"type": "object"}
    schema.setdefault("type", "object")
    spec = ToolSpec(
        mcp_tool_name(server.name, info.name),
        f"(MCP server {server.name}) {info.description}".strip(),
        JsonArgs,
        config.permission_args.get(info.name),
        target_is_path=False,
        repeatable=config.retry == "safe",
        schema=schema,
        # the server says the tool changes nothing (its annotations' readOnlyHint): its calls
        # of one answer may run together
        read_only=info.read_only is True,
    )

    async def run(args: JsonArgs, workspace: Path) -> str | ToolContent:
        try:
            result = await server.call_tool(info.name, args.given())
        except McpUnavailable as exc:
            raise ToolFailure(f"MCP server {server.name!r} is unavailable: {exc}") from None
        except McpCrashed as exc:
            if config.retry == "safe":
                raise McpCallLost(f"MCP server {server.name!r} stopped during the call: {exc}") from None
            raise ToolFailure(
                f"MCP server {server.name!r} stopped during the call ({exc}); the call may or may not "
                'have taken effect, and is not run again (the server\'s retry = "never")'
            ) from None
        if result.is_error:
            raise ToolFailure(bounded(result.text) or f"{info.name} failed (the MCP server gave no reason)")
        if result.images:
            return ToolContent(bounded(result.text), result.images)
        return bounded(result.text)

    return Tool(spec, run)


class McpCatalog:
    """The ``[mcp.*]`` servers of a worker, and their tools in its tool table ``tools``."""

    def __init__(
        self,
        configs: Mapping[str, McpServerConfig],
        tools: dict[str, Tool],
        environ: Mapping[str, str] = os.environ,
    ) -> None:
        self.configs = dict(configs)
        self.servers: dict[str, McpServer] = {}
        if configs:
            # the MCP SDK is a third of a worker's import time: only a worker with servers loads it
            from durable_agent.activities.mcp.connection import McpServer

            self.servers = {name: McpServer(name, config, environ) for name, config in configs.items()}
        self._tools = tools  # the worker's table: MCP tools are added and replaced in it
        self._offered: dict[str, tuple[str, ...]] = {}  # per server, its tools' offered names
        self._tried: set[str] = set()
        self._failed: dict[str, float] = {}  # when a server last failed to answer a listing
        self._locks = {name: asyncio.Lock() for name in configs}
        self._in_flight: dict[str, asyncio.Task[None]] = {}

    def __bool__(self) -> bool:
        return bool(self.servers)

    @property
    def listed(self) -> frozenset[str]:
        """The servers that answered a listing at least once."""
        return frozenset(self._offered)

    def tool_names(self, server: str) -> tuple[str, ...]:
        """The offered names of ``server``'s tools, as last listed."""
        return self._offered.get(server, ())

    async def refresh(self, names: Iterable[str] | None = None, *, wait: float | None = None) -> None:
        """List the servers' tools (all, or ``names``), each within its connect timeout, and
        put them in the tool table; a server that cannot be reached is logged and keeps the
        tools it was last listed with (none, if it never answered).

        ``wait``: return after that many seconds at most; a listing still going on then goes
        on in the background (a hanging server never holds up a run's start or step for long,
        nor makes its activity time out), and one listing a server at a time is enough."""
        listings = {self._listing(name) for name in (names or self.servers)}
        if listings:
            await asyncio.wait(listings, timeout=wait)

    def _listing(self, name: str) -> asyncio.Task[None]:
        """The listing of ``name`` going on now, or a new one."""
        task = self._in_flight.get(name)
        if task is None or task.done():
            task = asyncio.get_running_loop().create_task(self._list(name), name=f"mcp-list-{name}")
            self._in_flight[name] = task
        return task

    async def _list(self, name: str) -> None:
        from durable_agent.activities.mcp.connection import McpUnavailable  # see __init__

        server, config = self.servers[name], self.configs[name]
        async with self._locks[name]:
            self._tried.add(name)
            try:
                infos = await server.list_tools()
            except McpUnavailable as exc:
                self._failed[name] = time.monotonic()
                log.warning("MCP server %s is unavailable: %s", name, exc)
                return
            self._failed.pop(name, None)
            tools = [mcp_tool(server, config, info) for info in admitted(name, infos)]
            for old in self._offered.get(name, ()):
                self._tools.pop(old, None)
            self._tools.update({t.spec.name: t for t in tools})
            self._offered[name] = tuple(t.spec.name for t in tools)
            log.info("MCP server %s offers %d tools", name, len(tools))

    async def for_run(self) -> None:
        """Before a run's plan: list every server again, so a run is offered what its servers
        offer now (a server's tool list may have changed); a server that failed to answer less
        than ``RELIST_SECONDS`` ago is left as it was."""
        due = [name for name in self.servers if not self._failed_lately(name)]
        if due:
            await self.refresh(due, wait=STEP_WAIT_SECONDS)

    async def list_pending(self) -> None:
        """List the servers never tried yet and those that are down: one that stopped is
        started again at once, one that could not be reached is tried again at most every
        ``RELIST_SECONDS``."""
        due = [
            name
            for name, server in self.servers.items()
            if name not in self._tried or (not server.available and not self._failed_lately(name))
        ]
        if due:
            await self.refresh(due, wait=STEP_WAIT_SECONDS)

    def _failed_lately(self, name: str) -> bool:
        """Whether ``name`` failed to answer a listing less than ``RELIST_SECONDS`` ago."""
        failed = self._failed.get(name)
        return failed is not None and time.monotonic() - failed < RELIST_SECONDS

    async def unavailable(self, offered: Iterable[str]) -> list[ToolsUnavailable]:
        """For a model step offering ``offered``: the servers among them that are down (tried
        again first, at most every ``RELIST_SECONDS``), with the tools to leave out."""
        wanted = set(offered)
        involved = [name for name in self.servers if wanted.intersection(self.tool_names(name))]
        if not involved:
            return []
        await self.list_pending()
        gaps = []
        for name in involved:
            server = self.servers[name]
            if server.available:
                continue
            tools = tuple(sorted(wanted.intersection(self.tool_names(name))))
            reason = server.problem or "not reachable"
            log.warning(
                "MCP server %s is down: %d of its tools offered to a model step answer that (%s)",
                name,
                len(tools),
                reason,
            )
            gaps.append(ToolsUnavailable(server=name, tools=tools, reason=reason))
        return gaps

    def reopen(self) -> None:
        """After ``aclose``: the servers take calls again, and are listed anew (``refresh``)."""
        for server in self.servers.values():
            server.reopen()
        self._tried.clear()
        self._failed.clear()

    async def aclose(self) -> None:
        """Stop the servers' processes and close their sessions (``reopen`` undoes it)."""
        for task in self._in_flight.values():
            task.cancel()
        await asyncio.gather(*self._in_flight.values(), return_exceptions=True)
        await asyncio.gather(*(server.aclose() for server in self.servers.values()), return_exceptions=True)
