"""An MCP server for the agent's MCP tests, on the official SDK: stdio, or streamable HTTP.

    python agent_tools.py [--http PORT] [--down-if FILE] [--extra-tool]

Tools: ``echo``, ``picture`` (a PNG), ``query`` (judged by its ``sql`` argument in the tests),
``slow`` (writes this process's pid to ``pid_file``, then sleeps: a test kills it mid-call),
``count`` (how many calls this process has had). ``--down-if FILE``: exit at once while FILE
exists (a server that stays down). ``--extra-tool``: also offer ``extra`` (a catalog that changed).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from pathlib import Path

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.utilities.types import Image

# A 1x1 PNG, as the ``picture`` tool returns it.
TINY_PNG = bytes.fromhex(
    "89504e470d0a1a0a0000000d4948445200000001000000010806000000"
    "1f15c4890000000d49444154789c6360f8cfc0f01f0005000201e5273e1e0000000049454e44ae426082"
)

CALLS = {"n": 0}


def build(extra: bool) -> MCPServer:
    server = MCPServer("agent-tools")

    @server.tool(description="Echo the text back.")
    def echo(text: str) -> str:
        CALLS["n"] += 1
        return f"echo: {text}"

    @server.tool(description="Run a read-only SQL query (a pretend database).")
    def query(sql: str) -> str:
        CALLS["n"] += 1
        return f"rows for {sql!r}: 1"

    @server.tool(description="Sleep a while, having written this server's pid to pid_file.")
    async def slow(seconds: float, pid_file: str) -> str:
        CALLS["n"] += 1
        Path(pid_file).write_text(str(os.getpid()))
        await asyncio.sleep(seconds)
        return f"slept {seconds} s in process {os.getpid()}"

    @server.tool(description="A small PNG image (a plot, a screenshot).")
    def picture() -> Image:
        CALLS["n"] += 1
        return Image(data=TINY_PNG, format="png")

    @server.tool(description="How many calls this server process has answered.")
    def count() -> str:
        CALLS["n"] += 1
        return str(CALLS["n"])

    if extra:

        @server.tool(description="A tool that was added later.")
        def extra_tool() -> str:
            return "extra"

    return server


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--http", type=int)
    parser.add_argument("--down-if")
    parser.add_argument("--extra-tool", action="store_true")
    args = parser.parse_args()
    if args.down_if and Path(args.down_if).exists():
        print("down on purpose", file=sys.stderr)
        sys.exit(3)
    server = build(args.extra_tool)
    if args.http:
        server.run("streamable-http", host="127.0.0.1", port=args.http)
    else:
        server.run()


if __name__ == "__main__":
    main()
