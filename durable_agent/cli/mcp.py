"""``durable-agent mcp list``: the config's MCP servers, their tools, and whether each is allowed.

It reaches every ``[mcp.NAME]`` server itself (from this machine, with the variables of this
shell), as a worker does at its start, and judges each tool by the config's permission rules
(the worker's defaults; a run may bring its own).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import sys
from typing import TYPE_CHECKING, Any

from durable_agent.cli.common import err
from durable_agent.config import ConfigError, McpServerConfig, load_config
from durable_agent.core.permissions import PermissionPolicy

if TYPE_CHECKING:
    from durable_agent.activities.tools.tool import Tool


def permission_of(policy: PermissionPolicy, name: str, target_arg: str | None) -> str:
    """How the rules treat calls of ``name``: ``denied`` (not offered), ``allowed``, ``asks``,
    or, for a tool judged by an argument, what rules on that argument decide."""
    if policy.denies_outright(name):
        return "denied (not offered)"
    if target_arg is not None:
        return f"by its {target_arg!r} argument (default {policy.default})"
    return {"allow": "allowed", "ask": "asks a person", "deny": "denied"}[policy.decide(name, None)]


def transport(config: McpServerConfig) -> str:
    if config.url is not None:
        return f"http {config.url}"
    return "stdio " + " ".join([config.command or "", *config.args])


async def listing() -> list[dict[str, Any]]:
    """Each server: how it is reached, whether it answered, and its tools with their permission."""
    from durable_agent.activities.mcp.catalog import McpCatalog

    config = load_config()
    tools: dict[str, Tool] = {}
    catalog = McpCatalog(config.mcp, tools)
    try:
        await catalog.refresh()
        out = []
        for name, server in catalog.servers.items():
            entries = []
            for offered in catalog.tool_names(name):
                spec = tools[offered].spec
                entries.append(
                    {
                        "name": offered,
                        "description": spec.description,
                        "permission": permission_of(config.permissions, offered, spec.target_arg),
                    }
                )
            out.append(
                {
                    "server": name,
                    "transport": transport(config.mcp[name]),
                    "retry": config.mcp[name].retry,
                    "available": server.available and name in catalog.listed,
                    "problem": server.problem,
                    "tools": entries,
                }
            )
        return out
    finally:
        await catalog.aclose()


def cmd_mcp_list(args: argparse.Namespace) -> int:
    """Print the servers and their tools; exit 1 when a server did not answer."""
    # what a server that did not answer said is in the listing: no log lines besides it
    logging.getLogger("durable_agent.mcp").setLevel(logging.CRITICAL)
    try:
        servers = asyncio.run(listing())
    except ConfigError as exc:
        err(f"mcp list: {exc}")
        return 2
    if args.json:
        print(json.dumps(servers, indent=2))
    elif not servers:
        print("no MCP servers: add [mcp.NAME] sections to the config (AGENT_CONFIG)")
    for server in servers if not args.json else ():
        state = "available" if server["available"] else f"unavailable: {server['problem']}"
        print(f"{server['server']}  ({server['transport']}; retry {server['retry']})  {state}")
        width = max((len(t["name"]) for t in server["tools"]), default=0)
        for tool in server["tools"]:
            print(f"  {tool['name']:<{width}}  {tool['permission']}")
    sys.stdout.flush()
    return 0 if all(s["available"] for s in servers) else 1
