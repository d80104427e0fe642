"""A small MCP server for the connection tests, built on the SDK's ``MCPServer``.

Over stdio by default; with ``--port N`` over streamable HTTP on 127.0.0.1:N (``0``: a free
port), printing ``listening PORT`` on stdout once it accepts connections. Its tools expose what a
test needs to see from the server's side: its pid, calls started and cancelled, a barrier that
only opens when several calls are in it at once, the ``Authorization`` header it was sent.
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
from typing import Any

import anyio
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.types import ToolAnnotations

server = MCPServer("probe")
stats = {"started": 0, "cancelled": 0}
barrier_waiting = 0
barrier_open = anyio.Event()


@server.tool(annotations=ToolAnnotations(read_only_hint=True, idempotent_hint=True))
def echo(text: str) -> str:
    """Answers with the text it was given."""
    return text


@server.tool()
def pid() -> int:
    """The server process's id."""
    return os.getpid()


@server.tool()
async def sleep(seconds: float) -> str:
    """Sleeps, counting the calls that start and those cancelled before they end."""
    stats["started"] += 1
    # stderr, so a test sees it arrive in the client's log
    print(f"sleep started ({stats['started']})", file=sys.stderr, flush=True)
    try:
        await anyio.sleep(seconds)
    except anyio.get_cancelled_exc_class():
        stats["cancelled"] += 1
        raise
    return f"slept {seconds} s"


@server.tool()
def counts() -> dict[str, int]:
    """How many ``sleep`` calls started and how many were cancelled."""
    return dict(stats)


@server.tool()
async def barrier(parties: int) -> str:
    """Returns once ``parties`` calls are waiting here at the same time (never, if calls run one by
    one)."""
    global barrier_waiting
    barrier_waiting += 1
    if barrier_waiting >= parties:
        barrier_open.set()
    with anyio.fail_after(20):
        await barrier_open.wait()
    return "through"


@server.tool()
def fail(message: str) -> str:
    """Always fails, with the message given."""
    raise ToolError(message)


@server.tool()
def whoami(ctx: Context) -> str:
    """The ``Authorization`` header of the HTTP request that carried the call."""
    headers: Any = ctx.headers or {}
    return str(headers.get("authorization", "(none)"))


@server.tool()
def env(name: str) -> str:
    """The server's own environment variable ``name`` (``(unset)`` when it has none)."""
    return os.environ.get(name, "(unset)")


@server.tool()
def die() -> str:
    """Ends the server process at once, mid-call."""
    os._exit(3)


def _serve_http(port: int) -> None:
    import uvicorn

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", port))
    sock.listen(64)
    # the socket accepts from here on, before uvicorn runs
    print(f"listening {sock.getsockname()[1]}", flush=True)
    app = server.streamable_http_app()
    config = uvicorn.Config(app, log_level="warning", lifespan="on")
    uvicorn.Server(config).run(sockets=[sock])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, default=None)
    args = parser.parse_args()
    if args.port is None:
        server.run("stdio")
    else:
        _serve_http(args.port)


if __name__ == "__main__":
    main()
