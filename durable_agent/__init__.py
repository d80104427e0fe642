"""Durable agent runtime on Temporal.

The public API is the names in ``__all__`` below: import them from ``durable_agent``
(``from durable_agent import connect, start_run``). Every other module is internal: it may
change between releases without notice (the rule, and the few documented extension points
besides, are in ``docs/architecture.md``, "The public API").

Layers, bottom up (``tests/test_layers.py`` enforces them):

- ``durable_agent.core``: the pure contracts (models, the export contract, the loop, the
  permission judge): no I/O and no Temporal, safe inside the workflow sandbox.
- ``durable_agent.workflows``: the ``AgentRun`` workflow (core + Temporal).
- ``durable_agent.config`` (the TOML config), ``durable_agent.client`` and
  ``durable_agent.devserver`` (reaching Temporal).
- ``durable_agent.activities``: the I/O (models, tools, stores, sinks).
- ``durable_agent.worker``: a worker for all of the above (``python worker.py``).
- ``durable_agent.cli``: the ``durable-agent`` command, on top.

This file imports nothing at run time, so importing the core never pulls in the rest: each
public name is imported from its module when it is first used (``__getattr__``); the
``TYPE_CHECKING`` block only tells type checkers where each name lives.
"""

from __future__ import annotations

#: True for type checkers only (``typing`` is not imported, to keep this import light).
TYPE_CHECKING = False

if TYPE_CHECKING:
    from durable_agent.activities.agent import AgentActivities
    from durable_agent.activities.sinks import (
        ExportSink,
        FetchingSink,
        PartedSink,
        SinkError,
        read_export_file,
    )
    from durable_agent.activities.store.session_store import Closable, Connectable, SessionStore
    from durable_agent.activities.tools.custom import ToolContext, ToolDefinitionError, tool
    from durable_agent.activities.tools.tool import ToolContent, ToolFailure
    from durable_agent.client import (
        cancel_run,
        connect,
        end_conversation,
        follow_run,
        resume_run,
        run_result,
        send_prompt,
        start_run,
        steer_run,
    )
    from durable_agent.config import AgentConfig, ConfigError, load_config
    from durable_agent.core.errors import DurableAgentError
    from durable_agent.core.export import SessionCheckpointExportV1
    from durable_agent.core.run_api import AgentRunInput, AgentRunResult
    from durable_agent.plugin import DurableAgentPlugin
    from durable_agent.worker import build_worker

__version__ = "0.1.0"

#: Each public name and the module that defines it.
_WHERE: dict[str, str] = {
    # starting and following runs (a Temporal client)
    "connect": "durable_agent.client",
    "start_run": "durable_agent.client",
    "resume_run": "durable_agent.client",
    "run_result": "durable_agent.client",
    "follow_run": "durable_agent.client",
    "send_prompt": "durable_agent.client",
    "steer_run": "durable_agent.client",
    "end_conversation": "durable_agent.client",
    "cancel_run": "durable_agent.client",
    # the run's contract
    "AgentRunInput": "durable_agent.core.run_api",
    "AgentRunResult": "durable_agent.core.run_api",
    # running workers
    "AgentActivities": "durable_agent.activities.agent",
    "build_worker": "durable_agent.worker",
    "DurableAgentPlugin": "durable_agent.plugin",
    # tools of your own, from typed functions
    "tool": "durable_agent.activities.tools.custom",
    "ToolContext": "durable_agent.activities.tools.custom",
    "ToolDefinitionError": "durable_agent.activities.tools.custom",
    "ToolContent": "durable_agent.activities.tools.tool",
    "ToolFailure": "durable_agent.activities.tools.tool",
    # the config
    "AgentConfig": "durable_agent.config",
    "load_config": "durable_agent.config",
    "ConfigError": "durable_agent.config",
    # exports
    "SessionCheckpointExportV1": "durable_agent.core.export",
    "read_export_file": "durable_agent.activities.sinks",
    # the protocols a store or a sink of your own implements
    "SessionStore": "durable_agent.activities.store.session_store",
    "Connectable": "durable_agent.activities.store.session_store",
    "Closable": "durable_agent.activities.store.session_store",
    "ExportSink": "durable_agent.activities.sinks",
    "PartedSink": "durable_agent.activities.sinks",
    "FetchingSink": "durable_agent.activities.sinks",
    "SinkError": "durable_agent.activities.sinks",
    # the root of the errors a host sees
    "DurableAgentError": "durable_agent.core.errors",
}

__all__ = [
    "AgentActivities",
    "AgentConfig",
    "AgentRunInput",
    "AgentRunResult",
    "Closable",
    "ConfigError",
    "Connectable",
    "DurableAgentError",
    "DurableAgentPlugin",
    "ExportSink",
    "FetchingSink",
    "PartedSink",
    "SessionCheckpointExportV1",
    "SessionStore",
    "SinkError",
    "ToolContent",
    "ToolContext",
    "ToolDefinitionError",
    "ToolFailure",
    "__version__",
    "build_worker",
    "cancel_run",
    "connect",
    "end_conversation",
    "follow_run",
    "load_config",
    "read_export_file",
    "resume_run",
    "run_result",
    "send_prompt",
    "start_run",
    "steer_run",
    "tool",
]


def __getattr__(name: str) -> object:
    """Import a public name from its module the first time it is asked for."""
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from importlib import import_module

    value = getattr(import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
