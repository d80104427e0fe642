"""The agent's activities, bound to one worker's config, providers, tools, store and sinks.

``AgentActivities`` builds the shared pieces and composes the parts that hold
the activities, each in a module named for what it does:

- ``planner`` (``activities/resolve_run.py``): ``agent.resolve_run``;
- ``model_calls`` (``activities/model_call.py``): ``agent.model_call``, the model step;
- ``compactions`` (``activities/compaction.py``): ``agent.compact``, a summary of older turns;
- ``tool_calls`` (``activities/tool_call.py``): ``agent.tool_call``;
- ``hook_calls`` (``activities/hook_call.py``): ``agent.hook``, one ``[hooks]`` command;
- ``restores`` (``activities/workspace_restore.py``): ``agent.restore_workspace``, a ``rewind``'s files;
- ``changes`` (``activities/workspaces/changes.py``): ``agent.workspace_change``, a run's change set;
- ``run_logs`` (``activities/checkpointing.py``): ``agent.open_run``, ``agent.read_resume``,
  ``agent.checkpoint``, ``agent.save_checkpoint``, ``agent.export_checkpoint`` and
  ``agent.finish_run``;
- ``legacy`` (``activities/legacy_sessions.py``): ``agent.load_session``, for runs started before
  linear history. (``agent.model_call``, ``agent.save_checkpoint``,
  ``agent.export_checkpoint`` and ``agent.finish_run`` also take the inputs of that time,
  each in its live method; that module lists them.)
"""

from __future__ import annotations

import types
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

from temporalio import activity

from durable_agent.activities.checkpointing import RunLogs
from durable_agent.activities.compaction import Compactions
from durable_agent.activities.hook_call import HookCalls
from durable_agent.activities.legacy_sessions import LegacySessions
from durable_agent.activities.mcp.catalog import McpCatalog
from durable_agent.activities.model_call import ModelCalls
from durable_agent.activities.providers.from_config import build_providers
from durable_agent.activities.providers.model_provider import ModelProvider
from durable_agent.activities.redact import Redactor
from durable_agent.activities.resolve_run import RunPlanner
from durable_agent.activities.run_control import request_cancel
from durable_agent.activities.sinks import ExportSink, FilesystemExportSink
from durable_agent.activities.store.filesystem import FilesystemSessionStore
from durable_agent.activities.store.run_log_cache import RunLogCache
from durable_agent.activities.store.session_store import Closable, Connectable, SessionStore
from durable_agent.activities.tool_call import ToolCalls
from durable_agent.activities.tools.builtin import builtin_tools
from durable_agent.activities.tools.custom import with_tools
from durable_agent.activities.tools.sandbox import sandbox_settings
from durable_agent.activities.tools.tool import Tool
from durable_agent.activities.workspace_restore import WorkspaceRestores
from durable_agent.activities.workspace_tree import WorkspaceTrees, own_folders
from durable_agent.activities.workspaces.changes import WorkspaceChanges
from durable_agent.activities.workspaces.commits import WorkspaceCommits
from durable_agent.activities.workspaces.copies import WorkspaceCopies, new_host_id
from durable_agent.activities.workspaces.merges import WorkspaceMerges
from durable_agent.activities.workspaces.setup import WorkspaceSetup
from durable_agent.config import (
    AgentConfig,
    PostgresSinkConfig,
    PostgresStoreConfig,
    SinkConfig,
    dsn_from_environment,
    takes_images,
)
from durable_agent.core.activity_api import ACTIVITIES, ActivityDecl
from durable_agent.telemetry_spans import ActivityTelemetry

if TYPE_CHECKING:
    from opentelemetry.trace import TracerProvider


def build_store(config: AgentConfig) -> SessionStore:
    """The session store the config names (a PostgreSQL one reads its DSN from the environment)."""
    if isinstance(config.store, PostgresStoreConfig):
        from durable_agent.activities.store.postgres import PostgresSessionStore

        return PostgresSessionStore(dsn_from_environment("[store]", config.store.dsn_env))
    return FilesystemSessionStore(config.store.path)


def build_sink(name: str, config: SinkConfig) -> ExportSink:
    """The export sink ``[sinks.NAME]`` names."""
    if isinstance(config, PostgresSinkConfig):
        from durable_agent.activities.pg_sink import PostgresExportSink

        return PostgresExportSink(dsn_from_environment(f"[sinks.{name}]", config.dsn_env), name=name)
    return FilesystemExportSink(config.path)


class AgentActivities:
    """Holds what a worker's activities use. Pass your own parts to embed or test.

    Args:
        config: The worker's config (``load_config()``).
        providers: The model providers by name; default: built from ``[providers.*]``
            (reading their credentials from the environment now).
        tools: Tools of your own to add to the built-in ones, as a list of ``@tool``
            functions (or plain functions, made tools with ``tool``'s defaults); or, as a dict,
            the whole table by name, in place of the built-in ones. Default: the built-in
            tools, with ``[sandbox]``'s settings. The ``[mcp.*]`` servers' tools are added to
            it once listed.
        store: The session store; default: ``[store]``'s (a PostgreSQL one reads its DSN from
            the environment now).
        sinks: The export sinks by name; default: ``[sinks.*]``'s.
        tracer_provider: The OpenTelemetry tracer provider for the activities' spans;
            default: the global one.

    Raises:
        ConfigError: A variable the config names is unset: a provider's credential (or it
            holds what an HTTP header cannot carry), the store's or a sink's DSN, or an
            ``[mcp.*]`` server's ``env`` or ``headers`` variable; or a scripted provider's
            file is missing or invalid. Only for the parts built here, not those passed in.
        ToolDefinitionError: A function in ``tools`` cannot be a tool, or a tool's name is
            taken (by a built-in tool, another one given, or the ``mcp__`` names).
    """

    def __init__(
        self,
        config: AgentConfig,
        *,
        providers: dict[str, ModelProvider] | None = None,
        tools: dict[str, Tool] | Sequence[Tool | Callable[..., Any]] | None = None,
        store: SessionStore | None = None,
        sinks: dict[str, ExportSink] | None = None,
        tracer_provider: TracerProvider | None = None,
    ) -> None:
        self.config = config
        self.providers = providers if providers is not None else build_providers(config)
        if isinstance(tools, dict):
            self.tools = tools
        else:
            self.tools = with_tools(
                builtin_tools(sandbox_settings(config), config.tools.web_fetch), tools or ()
            )
        self.store = store if store is not None else build_store(config)
        self.log_cache = RunLogCache(self.store)
        # read once: the credentials this worker holds, kept out of every result
        self.redact = Redactor.from_environment(config)
        self.sinks: dict[str, ExportSink] = (
            sinks if sinks is not None else {name: build_sink(name, s) for name, s in config.sinks.items()}
        )
        # spans and metrics ([telemetry]); the global tracer provider unless one is given
        self.telemetry = ActivityTelemetry(
            config.telemetry,
            provider_kinds={name: p.kind for name, p in config.providers.items()},
            tracer_provider=tracer_provider,
        )
        # the workspace's files recorded at each boundary of a tool that may change them
        self.workspace_trees = WorkspaceTrees(config.workspace_checkpoints, self.sinks, own_folders(config))
        # a run's workspace kept at the run's tree on this machine, whatever machine it was on
        # (docs/workspaces.md): this worker's id as a run's host, and its own task queue
        self.copies = (
            WorkspaceCopies(
                self.workspace_trees,
                new_host_id(),
                shared=config.workspaces.shared,
                max_bytes=config.workspaces.max_bytes,
                setup=WorkspaceSetup(config.workspaces, sandbox_settings(config), self.redact)
                if config.workspaces.setup is not None
                else None,
            )
            if config.workspaces.follow and config.workspace_checkpoints.enabled
            else None
        )
        # the [mcp.*] servers: their tools join ``self.tools`` once listed
        self.mcp = McpCatalog(config.mcp, self.tools)
        # the parts, sharing the pieces above (the same dicts: a tool added later is seen)
        # a run's plan and its model steps ask the catalog only when there are servers
        mcp = self.mcp if config.mcp else None
        self.planner = RunPlanner(
            config,
            self.providers,
            self.tools,
            self.sinks,
            mcp,
            workspace_trees=self.workspace_trees,
            copies=self.copies,
        )
        self.model_calls = ModelCalls(
            self.providers,
            self.log_cache,
            self.store,
            self.redact,
            self.telemetry,
            mcp,
            takes_images=lambda model: takes_images(config, model),
        )
        self.tool_calls = ToolCalls(
            self.tools, self.store, self.redact, self.telemetry, self.workspace_trees, self.copies
        )
        self.run_logs = RunLogs(self.store, self.log_cache, self.sinks, self.telemetry)
        self.legacy = LegacySessions(self.store)
        # the [hooks] commands, in the sandbox the bash tool's commands run in
        self.hook_calls = HookCalls(sandbox_settings(config), self.redact, self.copies)
        self.compactions = Compactions(self.model_calls)
        # a ``rewind``: the workspace's files as one of the run's turns recorded them
        self.restores = WorkspaceRestores(self.sinks, self.workspace_trees)
        # what a run did to its workspace, for its result
        self.changes = WorkspaceChanges(self.workspace_trees)
        # a run's change from a git source, committed and pushed to its branch
        self.commits = WorkspaceCommits(self.workspace_trees, config.workspaces)
        # a child run's change merged into its parent's workspace
        self.merges = WorkspaceMerges(self.workspace_trees)
        # where the activities are: each method under ``@activity.defn`` is one (``all()``)
        self.parts: tuple[object, ...] = (
            self.planner,
            self.model_calls,
            self.compactions,
            self.tool_calls,
            self.run_logs,
            self.legacy,
            self.hook_calls,
            self.restores,
            self.changes,
            self.commits,
            self.merges,
        )

    async def connect(self) -> None:
        """Open the store's and the sinks' connections now (a worker's start), where they have
        any: bad credentials or a missing database fail here, not at a run's first step. Then
        list the ``[mcp.*]`` servers' tools: a server that is down is logged and tried again
        later, never raised.

        Raises:
            PostgresConnectError: The database refused the worker for good (credentials,
                privileges, no such database, a standby that takes no writes, a DSN that
                cannot be used); the message says why.
            SchemaTooNew: A newer worker migrated the database further.
            OSError: The database is not reachable (yet), or did not answer in time
                (``TimeoutError``).
            asyncpg.PostgresError: The server refused otherwise (still starting, too many
                connections, …).
        """
        for part in (self.store, *self.sinks.values()):
            if isinstance(part, Connectable):
                await part.connect()
        # and list the MCP servers' tools (one that is down is logged and tried again later):
        # after an ``aclose`` too (a plugin's worker that runs again), which stopped them
        self.mcp.reopen()
        await self.mcp.refresh()

    async def aclose(self) -> None:
        """Release what the parts hold (the HTTP providers' connection pools, the database's)
        and stop the ``[mcp.*]`` servers.

        Call it once the worker has stopped: the activities are not meant to run after it
        (the MCP servers stay closed, their tools unavailable, until ``connect`` again).
        """
        parts: tuple[object, ...] = (*self.providers.values(), self.store, *self.sinks.values(), self.mcp)
        for part in parts:
            if isinstance(part, Closable):
                await part.aclose()

    def all(self) -> list[Callable[..., Any]]:
        """Every activity, for ``Worker(activities=...)``: the parts' ``@activity.defn``
        methods (and ``agent.request_cancel``), in the order of ``ACTIVITIES``.

        Returns:
            Every activity, each registered under its ``agent.*`` name.
        """
        return registered(ACTIVITIES, [*defined_activities(self.parts), request_cancel])

    def host_activities(self) -> list[Callable[..., Any]]:
        """The activities this worker takes on its own task queue as a run's host
        (``activities/workspaces/hosting.py``): those that use the run's workspace.

        Returns:
            ``agent.tool_call`` and ``agent.hook``.
        """
        return [self.tool_calls.tool_call, self.hook_calls.hook]


def activity_name(fn: Callable[..., Any]) -> str | None:
    """The name ``fn`` is registered under (its ``@activity.defn``), or ``None``: not an activity."""
    definition = activity._Definition.from_callable(fn)  # what Temporal's worker reads
    return definition.name if definition is not None else None


def defined_activities(parts: Iterable[object]) -> Iterator[Callable[..., Any]]:
    """Each method of ``parts`` under ``@activity.defn``, bound to its part."""
    for part in parts:
        seen: set[str] = set()
        for cls in type(part).__mro__:  # a subclass's method hides its base's
            for name, member in vars(cls).items():
                if name not in seen and callable(member) and activity_name(member) is not None:
                    yield types.MethodType(member, part)
                seen.add(name)


def registered(
    declared: Sequence[ActivityDecl[Any, Any]], defined: Iterable[Callable[..., Any]]
) -> list[Callable[..., Any]]:
    """The activities ``defined``, one for each of ``declared``, in its order.

    Raises:
        ValueError: A declaration has no activity, an activity no declaration, or a name two.
    """
    by_name: dict[str, Callable[..., Any]] = {}
    for fn in defined:
        name = activity_name(fn)
        if name is None or name in by_name:
            raise ValueError(f"{fn.__qualname__}: {'not an activity' if name is None else f'{name} twice'}")
        by_name[name] = fn
    names = [decl.name for decl in declared]
    if missing := sorted(set(names) - by_name.keys()):
        raise ValueError(f"declared, with no activity: {missing}")
    if undeclared := sorted(by_name.keys() - set(names)):
        raise ValueError(f"activities with no declaration: {undeclared}")
    return [by_name[name] for name in names]
