"""The built-in tools, by name: what a worker offers unless the host passes its own."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from durable_agent.activities.tools.bash import bash
from durable_agent.activities.tools.fs import edit, ls, read, write
from durable_agent.activities.tools.search import glob, grep
from durable_agent.activities.tools.tool import Tool, ToolImpl, stoppable, threaded
from durable_agent.config import SandboxConfig
from durable_agent.core.tool_specs import BUILTIN_TOOLS


def builtin_tools(sandbox: SandboxConfig | None = None) -> dict[str, Tool]:
    """The tools every worker has; tests and embedders may add their own.

    ``sandbox`` is where ``bash`` runs its commands (default: ``SandboxConfig()``, bubblewrap).
    """

    async def run_bash(args: Any, workspace: Path) -> str:
        return await bash(args, workspace, sandbox)

    impls: dict[str, ToolImpl] = {
        "read": threaded(read),
        "write": threaded(write),
        "edit": threaded(edit),
        "ls": threaded(ls),
        "glob": stoppable(glob),
        "grep": stoppable(grep),
        "bash": run_bash,
    }
    return {name: Tool(BUILTIN_TOOLS[name], impl) for name, impl in impls.items()}
