"""The built-in tools, by name: what a worker offers unless the host passes its own."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from durable_agent.activities.tools.bash import bash
from durable_agent.activities.tools.edits import edit, multi_edit
from durable_agent.activities.tools.fs import ls, read, write
from durable_agent.activities.tools.patch import apply_patch
from durable_agent.activities.tools.search import glob, grep
from durable_agent.activities.tools.tool import Tool, ToolImpl, stoppable, threaded
from durable_agent.activities.tools.web_fetch import Fetcher
from durable_agent.config import SandboxConfig, WebFetchConfig
from durable_agent.core.builtin_catalog import BUILTIN_TOOLS
from durable_agent.core.todo_list import answer_todo_write


async def todo_write(args: Any, workspace: Path) -> str:
    """``todo_write`` as a tool call: the workflow answers it itself (``ToolSpec.in_workflow``),
    so this runs only for a plan that did not mark it so; it answers as the workflow would."""
    return answer_todo_write(args.model_dump(exclude_none=True)).text


def builtin_tools(
    sandbox: SandboxConfig | None = None, web_fetch: WebFetchConfig | None = None
) -> dict[str, Tool]:
    """The tools every worker has; tests and embedders may add their own.

    ``sandbox`` is where ``bash`` runs its commands (default: ``SandboxConfig()``, bubblewrap);
    ``web_fetch`` what ``web_fetch`` may read and where it may connect (``[tools.web_fetch]``).
    """

    async def run_bash(args: Any, workspace: Path) -> str:
        return await bash(args, workspace, sandbox)

    impls: dict[str, ToolImpl] = {
        "read": threaded(read),
        "write": threaded(write),
        "edit": threaded(edit),
        "multi_edit": threaded(multi_edit),
        "apply_patch": threaded(apply_patch),
        "ls": threaded(ls),
        "glob": stoppable(glob),
        "grep": stoppable(grep),
        "bash": run_bash,
        "web_fetch": Fetcher(web_fetch),
        "todo_write": todo_write,
    }
    return {name: Tool(BUILTIN_TOOLS[name], impl) for name, impl in impls.items()}
