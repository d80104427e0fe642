"""The ``agent.resolve_run`` activity: a run's settings checked against this worker's config."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from temporalio import activity

from durable_agent.activities.compaction import context_policy
from durable_agent.activities.mcp.catalog import McpCatalog
from durable_agent.activities.providers.base import ModelProvider
from durable_agent.activities.sinks import ExportSink
from durable_agent.activities.support import usage_error
from durable_agent.activities.tools.base import Tool
from durable_agent.config import AgentConfig, ModelPrices, model_prices
from durable_agent.core.activity_api import RESOLVE_RUN, ResolveInput
from durable_agent.core.plan import RunPlan
from durable_agent.core.run_api import RunSettings
from durable_agent.core.tool_specs import capability_binding, offered_tools


class RunPlanner:
    """Resolves a run's input against the config, the providers, tools and sinks of this worker."""

    def __init__(
        self,
        config: AgentConfig,
        providers: Mapping[str, ModelProvider],
        tools: Mapping[str, Tool],
        sinks: Mapping[str, ExportSink],
        mcp: McpCatalog | None = None,
    ) -> None:
        self.config = config
        self.providers = providers
        self.tools = tools
        self.sinks = sinks
        self.mcp = mcp

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
        workspace = Path(run.workspace) if run.workspace else config.default_workspace
        workspace = workspace.expanduser().resolve()
        if not workspace.is_dir():
            raise usage_error(f"workspace {str(workspace)!r} is not a folder on this worker")
        sink = run.export_sink or config.default_sink
        if sink is None:
            raise usage_error("no export sink: set export_sink or default_sink in the worker config")
        if sink not in self.sinks:
            known = ", ".join(sorted(self.sinks)) or "none"
            raise usage_error(f"export sink {sink!r} is not configured (configured: {known})")
        permissions = run.permissions or inp.resume_permissions or config.permissions
        budgets = self._budgets(run, model)
        if self.mcp:
            # what the MCP servers offer now: a run is offered their current tools
            await self.mcp.for_run()
        offers = tuple(t.offer() for t in offered_tools((t.spec for t in self.tools.values()), permissions))
        return RunPlan(
            session_id=inp.session_id,
            run_id=inp.run_id,
            # a workflow before 0.2 sends its prompt and takes it from the plan
            prompt=inp.run.prompt or "" if inp.run is not None else "",
            workspace=str(workspace),
            model=model,
            system_prompt=config.system_prompt,
            tools=offers,
            permissions=permissions,
            capability_binding=capability_binding((o.definition for o in offers), permissions),
            export_sink=sink,
            max_tool_rounds=run.max_tool_rounds or config.max_tool_rounds,
            approval_timeout_seconds=run.approval_timeout_seconds or config.approval_timeout_seconds,
            resumed_from=inp.resumed_from,
            **budgets,
            timeouts=config.timeouts,
            limits=config.limits,
            context=context_policy(config, model),
        )

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
