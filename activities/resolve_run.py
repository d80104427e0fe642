"""The ``agent.resolve_run`` activity: a run's settings checked against this worker's config."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from temporalio import activity
from temporalio.exceptions import ApplicationError

from durable_agent.activities.compaction import context_policy
from durable_agent.activities.instructions import ProjectInstructions, read_project_files, system_prompt
from durable_agent.activities.mcp.catalog import McpCatalog
from durable_agent.activities.offer_cache import OfferCache
from durable_agent.activities.providers.model_provider import ModelProvider
from durable_agent.activities.sinks import ExportSink
from durable_agent.activities.support import heartbeating, usage_error
from durable_agent.activities.tools.tool import Tool
from durable_agent.activities.workspace_tree import WorkspaceTrees
from durable_agent.activities.workspaces.copies import WorkspaceCopies
from durable_agent.activities.workspaces.errors import WorkspaceTreeError
from durable_agent.activities.workspaces.fetching import restore_tree
from durable_agent.activities.workspaces.sources import (
    branch_name,
    checkout_ref,
    default_root,
    fetched,
    run_folder,
)
from durable_agent.config import AgentConfig, ModelPrices, model_prices
from durable_agent.core.activity_api import RESOLVE_RUN, ResolveInput
from durable_agent.core.canonical import canonical_bytes
from durable_agent.core.failures import WORKSPACE_NOT_RECORDED
from durable_agent.core.models import ToolsUnavailable, WorkspaceState
from durable_agent.core.output_schema import DEFAULT_OUTPUT_RETRIES, FINAL_RESULT_TOOL, final_result_offer
from durable_agent.core.permissions import PermissionPolicy
from durable_agent.core.plan import RunPlan
from durable_agent.core.run_api import RunSettings
from durable_agent.core.run_workspace import GitSource, TreeSource, WorkspaceOrigin
from durable_agent.core.subagents import TASK_SPEC, SubagentOrigin, SubagentPlan, task_description
from durable_agent.core.tool_specs import (
    MCP_PREFIX,
    ToolOffer,
    in_workflow_policy,
    offered_tools,
)


def mcp_server_of(name: str) -> str | None:
    """The MCP server of an offered tool's name (``mcp__SERVER__TOOL``); None for the worker's own."""
    if not name.startswith(MCP_PREFIX):
        return None
    return name[len(MCP_PREFIX) :].partition("__")[0]


def within_catalog_budget(
    offers: Sequence[ToolOffer], budget: int, *, size: Callable[[ToolOffer], int] | None = None
) -> tuple[list[ToolOffer], list[ToolsUnavailable]]:
    """The offers a plan can carry within ``budget`` bytes of definitions (canonical JSON), and
    the MCP servers left out.

    The plan travels in Temporal payloads (2 MiB at most): a server with large schemas would
    make every run fail at its start. The worker's own tools count first; then each MCP
    server, in name order, joins whole or not at all.

    Args:
        offers: The tools offered, by name.
        budget: ``[limits] max_tool_catalog_bytes``.
        size: An offer's bytes (default: its definition's canonical JSON measured now).

    Returns:
        The offers kept (in their order), and one ``ToolsUnavailable`` per server left out.
    """
    measure = size or (lambda o: len(canonical_bytes(o.definition)))
    sizes = {o.definition.name: measure(o) for o in offers}
    used = 0
    by_server: dict[str, list[str]] = {}
    for offer in offers:
        name = offer.definition.name
        server = mcp_server_of(name)
        if server is None:
            used += sizes[name]
        else:
            by_server.setdefault(server, []).append(name)
    left_out: list[ToolsUnavailable] = []
    for server, names in sorted(by_server.items()):
        bytes_ = sum(sizes[n] for n in names)
        if used + bytes_ > budget:
            reason = (
                f"the definitions of its {len(names)} tools are {bytes_} bytes, and with the run's other "
                f"tools ({used} bytes) they would pass [limits] max_tool_catalog_bytes={budget}: the server "
                "is left out of this run (raise the limit, or offer fewer of its tools with a deny rule)"
            )
            left_out.append(ToolsUnavailable(server=server, tools=tuple(names), reason=reason))
        else:
            used += bytes_
    gone = {name for gap in left_out for name in gap.tools}
    return [o for o in offers if o.definition.name not in gone], left_out


@dataclasses.dataclass(eq=False)
class RunPlanner:
    """Resolves a run's input against the config, the providers, tools and sinks of this worker."""

    config: AgentConfig
    providers: Mapping[str, ModelProvider]
    tools: Mapping[str, Tool]
    sinks: Mapping[str, ExportSink]
    mcp: McpCatalog | None = None
    # compares a resumed run's workspace with its checkpoint's tree (None: no check)
    workspace_trees: WorkspaceTrees | None = dataclasses.field(default=None, kw_only=True)
    # records the base of a run whose workspace follows it (None: no run's does)
    copies: WorkspaceCopies | None = dataclasses.field(default=None, kw_only=True)
    # the tools' offers and bindings, built once a worker, not for each run
    offers: OfferCache = dataclasses.field(default_factory=OfferCache, kw_only=True)

    @activity.defn(name=RESOLVE_RUN.name)
    async def resolve_run(self, inp: ResolveInput) -> RunPlan:
        """Check the run's input against this worker's config and fill in the defaults."""
        run, config = inp.run_settings(), self.config
        model = run.model or config.default_model
        provider = model.partition("/")[0]
        if provider not in self.providers:
            known = ", ".join(sorted(self.providers)) or "none"
            raise usage_error(
                f"model {model!r}: provider {provider!r} is not configured (configured: {known})"
            )
        sink = run.export_sink or config.default_sink
        if sink is None:
            raise usage_error("no export sink: set export_sink or default_sink in the worker config")
        if sink not in self.sinks:
            known = ", ".join(sorted(self.sinks)) or "none"
            raise usage_error(f"export sink {sink!r} is not configured (configured: {known})")
        origin: WorkspaceOrigin | None = None
        if isinstance(run.workspace, (GitSource, TreeSource)):
            # the run's own folder, made from its source (or, resumed, from its checkpoint's tree)
            workspace, origin = await self._made(run.workspace, sink, inp)
        else:
            workspace = Path(run.workspace) if run.workspace else config.default_workspace
            workspace = workspace.expanduser().resolve()
            if not workspace.is_dir():
                raise usage_error(f"workspace {str(workspace)!r} is not a folder on this worker")
        if (
            inp.workspace_tree is not None
            and self.workspace_trees is not None
            and not isinstance(run.workspace, (GitSource, TreeSource))
        ):
            if inp.restore_workspace and self.copies is not None and not self.copies.shared:
                await self._restore_workspace(workspace, inp.workspace_tree, sink)
            else:
                await self._check_workspace(workspace, inp.workspace_tree, sink)
        permissions = run.permissions or inp.resume_permissions or config.permissions
        budgets = self._budgets(run, model)
        if self.mcp:
            # what the MCP servers offer now: a run is offered their current tools
            await self.mcp.for_run()
        together = config.tools.runs_together
        specs = [t.spec for t in self.tools.values()]
        if inp.resume_tools is not None:
            specs = [s for s in specs if s.name in inp.resume_tools]
        local = config.tools.local_calls
        offered = [
            self.offers.offer(t, parallel=together(t.name, t.read_only), local=local)
            for t in offered_tools(specs, permissions)
        ]
        subagents = self._subagent_plan(run.subagent)
        if subagents is not None and subagents.may_start():
            offered = self._with_task(offered, subagents, permissions)
        if run.subagent is not None:  # a child: at most the tools its parent named
            named = set(run.subagent.tools)
            offered = [o for o in offered if o.definition.name in named]
        if run.output_schema is not None:
            offered.append(self._final_result_offer(run.output_schema, offered))
        kept, left_out = within_catalog_budget(
            offered, config.limits.max_tool_catalog_bytes, size=self.offers.size
        )
        if left_out:
            activity.logger.warning(
                "run %s: MCP server(s) %s left out: %s",
                inp.run_id,
                ", ".join(gap.server for gap in left_out),
                left_out[0].reason,
            )
        offers = tuple(kept)
        project = await self._project_files(inp.run_id, workspace)
        made = isinstance(run.workspace, (GitSource, TreeSource))
        base, host = await self._base(workspace, sink, run.subagent, made=made)
        return RunPlan(
            session_id=inp.session_id,
            run_id=inp.run_id,
            # a workflow before 0.2 sends its prompt and takes it from the plan
            prompt=inp.run.prompt or "" if inp.run is not None else "",
            workspace=str(workspace),
            model=model,
            system_prompt=system_prompt(
                self._system_prompt(run.subagent),
                project,
                run.instructions,
            ),
            tools=offers,
            permissions=permissions,
            capability_binding=self.offers.binding(offers, permissions, project.records),
            export_sink=sink,
            max_tool_rounds=run.max_tool_rounds or config.max_tool_rounds,
            approval_timeout_seconds=run.approval_timeout_seconds or config.approval_timeout_seconds,
            resumed_from=inp.resumed_from,
            **budgets,
            timeouts=config.timeouts,
            limits=config.limits,
            context=context_policy(config, model),
            tools_refused=tuple(left_out),
            instruction_files=project.records,
            hooks=config.hooks,
            output_schema=run.output_schema,
            max_output_retries=DEFAULT_OUTPUT_RETRIES
            if run.max_output_retries is None
            else run.max_output_retries,
            subagents=subagents,
            workspace_base=base,
            workspace_host=host,
            host_wait_seconds=config.workspaces.host_wait_seconds,
            workspace_origin=origin,
            sealed_signals=bool(config.codec.keys) and not config.codec.accept_plaintext,
        )

    async def _base(
        self, workspace: Path, sink: str, subagent: SubagentOrigin | None, *, made: bool
    ) -> tuple[WorkspaceState | None, str | None]:
        """A run whose workspace follows it: its workspace's tree now, its objects in the sink,
        this machine's copy marked as at it (``activities/workspaces/copies.py``); and its host,
        this worker. None: it does not follow (no ``[workspaces] follow``, a sink that holds no
        trees). A child in its parent's folder (``workflows/child_runs.py``) follows its parent's
        tree on the parent's host when its parent's does, and not otherwise; a child made from
        its parent's tree has a copy of its own, as any run made from a source."""
        copies, trees = self.copies, self.workspace_trees
        if copies is None or trees is None or copies.shared or trees.object_sink(sink) is None:
            return None, None
        if subagent is not None and not made:
            if subagent.tree is None:
                return None, None
            return WorkspaceState(tree=subagent.tree), subagent.host
        try:
            base = await heartbeating(trees.record(workspace, sink, strict=True))
        except WorkspaceTreeError as exc:
            # retried: a sink that was down may take the objects at the next attempt
            raise ApplicationError(
                f"workspace {str(workspace)!r} could not be recorded: {exc}", type=WORKSPACE_NOT_RECORDED
            ) from None
        if base is None:
            return None, None
        await copies.adopt(workspace, base.tree)
        return base, copies.host

    def _system_prompt(self, origin: SubagentOrigin | None) -> str:
        """The worker's system prompt, or a child's agent type's (``[agents.NAME] system_prompt``),
        read from this worker's config: a run's input cannot set it."""
        kind = self.config.agents.types.get(origin.agent_type or "") if origin is not None else None
        return (kind.system_prompt if kind is not None else None) or self.config.system_prompt

    def _subagent_plan(self, origin: SubagentOrigin | None) -> SubagentPlan | None:
        """What the run's plan says of subagents: None on a worker without ``[agents]`` enabled,
        unless the run is a child (its status then names its parent)."""
        agents = self.config.agents
        if not agents.enabled and origin is None:
            return None
        return SubagentPlan(
            depth=origin.depth if origin is not None else 0,
            max_depth=agents.max_depth,
            max_children=agents.max_children,
            max_answer_chars=agents.max_answer_chars,
            types=agents.types if agents.enabled else {},
            parent=origin,
        )

    def _with_task(
        self, offered: list[ToolOffer], subagents: SubagentPlan, permissions: PermissionPolicy
    ) -> list[ToolOffer]:
        """The offers with ``task`` among them (in name order, as the others are), unless a deny
        rule turns it off (only deny rules apply to a tool the workflow answers itself). A host's
        own tool of that name keeps it: the run then has no subagents."""
        name = TASK_SPEC.name
        if not self.config.agents.enabled or in_workflow_policy(permissions).denies_outright(name):
            return offered
        if any(o.definition.name == name for o in offered):
            return offered
        description, parallel = task_description(subagents.types), self.config.tools.parallel_calls
        task = self.offers.keyed(
            (name, description, parallel),
            lambda: dataclasses.replace(TASK_SPEC, description=description).offer(parallel=parallel),
        )
        return sorted([*offered, task], key=lambda o: o.definition.name)

    @staticmethod
    def _final_result_offer(schema: dict[str, Any], offered: Sequence[ToolOffer]) -> ToolOffer:
        """The ``final_result`` tool of a run with an output schema (outside the permission rules,
        which decide on the worker's tools only); a worker tool of that name would be hidden by it."""
        if any(o.definition.name == FINAL_RESULT_TOOL for o in offered):
            raise usage_error(
                f"output_schema: this worker has a tool named {FINAL_RESULT_TOOL!r}, the name of the "
                "tool a typed run ends with: rename that tool, or deny it to this run"
            )
        return final_result_offer(schema)

    async def _check_workspace(self, workspace: Path, tree: str, sink: str) -> None:
        """Refuse a resumed run whose workspace's files are not those its checkpoint recorded."""
        assert self.workspace_trees is not None
        try:
            differ = await self.workspace_trees.differences(workspace, tree, sink)
        except WorkspaceTreeError as exc:
            raise usage_error(f"the workspace cannot be compared with the checkpoint's: {exc}") from None
        if differ:
            shown = "; ".join(differ[:20]) + (f"; and {len(differ) - 20} more" if len(differ) > 20 else "")
            raise usage_error(
                f"the workspace's files differ from the checkpoint's (tree {tree}): {shown} (restore "
                "them with `durable-agent resume --restore-workspace`, or resume with force_resume to go on)"
            )

    async def _made(
        self, source: GitSource | TreeSource, sink: str, inp: ResolveInput
    ) -> tuple[Path, WorkspaceOrigin | None]:
        """A run's own folder under ``[workspaces] root``, made from its source: a git ref's
        files, or a tree restored from the sink; a resumed or rewound run's from its checkpoint's
        tree (``activities/workspaces/sources.py``)."""
        copies, trees = self.copies, self.workspace_trees
        if copies is None or trees is None or copies.shared or trees.object_sink(sink) is None:
            raise usage_error(
                "a workspace made from a source follows its run: it needs [workspaces] follow = true, "
                "shared = false, [workspace_checkpoints] on and an export sink that holds trees"
            )
        root = default_root(self.config.workspaces)
        folder = await asyncio.to_thread(run_folder, root, inp.session_id, inp.run_id)
        tree = inp.workspace_tree or (source.tree if isinstance(source, TreeSource) else None)
        origin = None
        wanted = self.config.workspaces
        branch = branch_name(wanted.branch, inp.session_id) if wanted.commit else None
        try:
            if tree is not None:
                await self._restore_workspace(folder, tree, sink)
                was = inp.resume_origin
                if isinstance(source, GitSource) and was is not None and was.git == source.git:
                    # resumed or rewound: its change still goes on the commit its first run began at
                    origin = was.model_copy(update={"branch": branch})
            else:
                assert isinstance(source, GitSource)
                cache = await heartbeating(asyncio.to_thread(fetched, root, source))
                commit, tree = await asyncio.to_thread(checkout_ref, cache, source.ref, folder)
                origin = WorkspaceOrigin(git=source.git, commit=commit, tree=tree, branch=branch)
        except WorkspaceTreeError as exc:
            raise usage_error(f"the run's workspace could not be made from {source!r}: {exc}") from None
        return folder.resolve(), origin

    async def _restore_workspace(self, workspace: Path, tree: str, sink: str) -> None:
        """A rewound run's copy on this machine made the turn's tree (the rewind restored it on
        the worker that ran it, which may be another machine: docs/workspaces.md)."""
        assert self.workspace_trees is not None and self.copies is not None
        held = self.workspace_trees.object_sink(sink)
        if held is None:
            raise usage_error(f"sink {sink!r} holds no workspace trees to restore tree {tree} from")
        try:
            await heartbeating(restore_tree(self.workspace_trees.repo(workspace), tree, held))
        except WorkspaceTreeError as exc:
            raise usage_error(f"the workspace could not be restored to tree {tree}: {exc}") from None
        await self.copies.adopt(workspace, tree)

    async def _project_files(self, run_id: str, workspace: Path) -> ProjectInstructions:
        """The project instruction files of a run in ``workspace`` (none when the config turns
        them off); a file found and not read is logged, and the run goes on without it."""
        settings = self.config.instructions
        if not settings.project_files:
            return ProjectInstructions()
        # a few small reads, each bounded, off the event loop
        project = await asyncio.to_thread(read_project_files, workspace, settings.file_names)
        for reason in project.skipped:
            activity.logger.warning("run %s: instruction file not read: %s", run_id, reason)
        return project

    def _budgets(self, run: RunSettings, model: str) -> dict[str, Any]:
        """The run's idle timeout, budgets and the model's prices; a cost budget needs prices."""
        config = self.config
        provider_name, _, name = model.partition("/")
        provider = config.providers.get(provider_name)
        prices = model_prices(provider, name) if provider is not None else ModelPrices()
        max_cost = run.max_cost_usd or config.budgets.max_cost_usd
        if max_cost is not None and (prices.input is None or prices.output is None):
            raise usage_error(
                f"max_cost_usd is set but model {model!r} has no prices: set input_usd_per_mtok and "
                f"output_usd_per_mtok on [providers.{provider_name}] or "
                f'[providers.{provider_name}.models."{name}"]'
            )
        return {
            "idle_timeout_seconds": run.idle_timeout_seconds or config.conversation.idle_timeout_seconds,
            "max_total_tokens": run.max_total_tokens or config.budgets.max_total_tokens,
            "max_cost_usd": max_cost,
            "input_usd_per_mtok": prices.input,
            "output_usd_per_mtok": prices.output,
            "cache_read_usd_per_mtok": prices.cache_read,
            "cache_write_usd_per_mtok": prices.cache_write,
        }
