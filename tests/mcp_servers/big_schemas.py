"""An MCP server whose tools have large input schemas, over stdio, on the official SDK.

    python big_schemas.py [--tools N] [--schema-bytes B]

Offers ``tool_000`` … (``N`` tools, 128 by default), each taking one ``spec`` argument whose
schema description is ``B`` bytes (31,000 by default): the catalog of a server that generates
its tools from a large API description. A call answers ``ok <name>``.
"""

# no ``from __future__ import annotations``: each tool's schema is built from its annotation
import argparse
from collections.abc import Callable
from typing import Annotated

from mcp.server.mcpserver import MCPServer
from pydantic import Field


def operation(name: str, description: str) -> Callable[..., str]:
    def call(spec: Annotated[str, Field(description=description)] = "") -> str:
        return f"ok {name}"

    return call


def build(tools: int, schema_bytes: int) -> MCPServer:
    server = MCPServer("big-schemas")
    for index in range(tools):
        name = f"tool_{index:03d}"
        words = f"field {index} of the generated API, described at length. "
        description = (words * (schema_bytes // len(words) + 1))[:schema_bytes]
        server.add_tool(operation(name, description), name=name, description=f"Generated operation {index}.")
    return server


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tools", type=int, default=128)
    parser.add_argument("--schema-bytes", type=int, default=31_000)
    args = parser.parse_args()
    build(args.tools, args.schema_bytes).run()


if __name__ == "__main__":
    main()
