"""The agent's activities, bound to one worker's config, providers, tools, store and sinks."""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

from temporalio import activity
from temporalio.exceptions import ApplicationError

from activities.providers import ModelProvider, ProviderError, build_providers
from activities.run_log_activities import RunLogActivities
from activities.run_state import RunStates
from activities.sinks import ExportSink, FilesystemExportSink
from activities.store import FilesystemSessionStore, SessionStore
from activities.support import heartbeating, state_missing, usage_error
from activities.tools import Tool, ToolFailure, builtin_tools
from durable_agent.canonical import canonical_bytes
from durable_agent.config import AgentConfig
from durable_agent.models import LiveText, Message, ModelResponse
from durable_agent.run_io import (
    ACTIVITY_MODEL,
    ACTIVITY_RESOLVE,
    ACTIVITY_TOOL,
    ModelCallInput,
    ModelStepInput,
    ResolveInput,
    RunPlan,
    ToolCallInput,
    ToolOutput,
)
from durable_agent.run_log import (
    STAGE_MIN_BYTES,
    StateMissing,
    text_digest,
)
from durable_agent.tool_specs import (
    ToolCallError,
    capability_binding,
    offered_tools,
    validate_args,
)

log = logging.getLogger(__name__)


class AgentActivities(RunLogActivities):
    """Holds what a worker's activities use. Pass your own parts to embed or test."""

    def __init__(
        self,
        config: AgentConfig,
        *,
        providers: dict[str, ModelProvider] | None = None,
        tools: dict[str, Tool] | None = None,
        store: SessionStore | None = None,
        sinks: dict[str, ExportSink] | None = None,
    ) -> None:
        self.config = config
        self.providers = providers if providers is not None else build_providers(config)
        self.tools = tools if tools is not None else builtin_tools()
        self.store = store if store is not None else FilesystemSessionStore(config.store.path)
        self.states = RunStates(self.store)
        self.sinks: dict[str, ExportSink] = (
            sinks
            if sinks is not None
            else {name: FilesystemExportSink(s.path) for name, s in config.sinks.items()}
        )

    async def aclose(self) -> None:
        """Release what the parts hold (the HTTP providers' connection pools)."""
        for provider in self.providers.values():
            close = getattr(provider, "aclose", None)
            if close is not None:
                await close()

    def all(self) -> list[Callable[..., Any]]:
        """Every activity, for ``Worker(activities=...)``."""
        return [
            self.resolve_run,
            self.read_resume,
            self.open_run,
            self.model_call,
            self.tool_call,
            self.load_session,
            self.save_checkpoint,
            self.finish_run,
            self.export_checkpoint,
        ]

    @activity.defn(name=ACTIVITY_RESOLVE)
    async def resolve_run(self, inp: ResolveInput) -> RunPlan:
        """Check the run's input against this worker's config and fill in the defaults."""
        run, config = inp.run, self.config
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
        offers = tuple(t.offer() for t in offered_tools((t.spec for t in self.tools.values()), permissions))
        return RunPlan(
            session_id=inp.session_id,
            run_id=inp.run_id,
            prompt=run.prompt or "",
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
            timeouts=config.timeouts,
            limits=config.limits,
        )

    @activity.defn(name=ACTIVITY_MODEL)
    async def model_call(self, inp: ModelStepInput | ModelCallInput) -> ModelResponse:
        """Ask the model for its next step, on the conversation in the run's log (or, from a
        worker before linear history, on the conversation given)."""
        provider_name, _, model = inp.model.partition("/")
        provider = self.providers.get(provider_name)
        if provider is None:
            raise usage_error(f"model provider {provider_name!r} is not configured on this worker")
        call = inp if isinstance(inp, ModelCallInput) else await self._conversation(inp)
        attempt = activity.info().attempt
        text: list[str] = []
        try:
            response = await heartbeating(
                provider.complete(call, model, text.append),
                details=lambda: LiveText(attempt=attempt, text="".join(text)),
            )
        except ProviderError as exc:
            raise ApplicationError(
                str(exc),
                type="ProviderError",
                non_retryable=not exc.retryable,
                next_retry_delay=exc.retry_after,
            ) from exc
        message = canonical_bytes(response.message).decode()
        return response.model_copy(update={"staged": await self._stage(inp.run_id, message)})

    async def _conversation(self, inp: ModelStepInput) -> ModelCallInput:
        try:
            header = await self.states.header(inp.run_id)
            conversation = (await self.states.read(inp.log)).with_pending(inp.pending)
        except StateMissing as exc:
            raise state_missing(exc) from None
        return ModelCallInput(
            run_id=inp.run_id,
            model=inp.model,
            system_prompt=header.system_prompt,
            messages=tuple(conversation),
            tools=header.tools,
        )

    @activity.defn(name=ACTIVITY_TOOL)
    async def tool_call(self, inp: ToolCallInput) -> ToolOutput:
        """Run one tool call in the workspace; expected failures become tool errors."""
        tool = self.tools.get(inp.name)
        if tool is None:
            return ToolOutput(content=f"unknown tool {inp.name!r} on this worker", is_error=True)
        arguments = inp.arguments if inp.arguments_in is None else await self._staged_arguments(inp)
        try:
            args = validate_args(tool.spec, arguments)
            content = await heartbeating(tool.run(args, Path(inp.workspace)))
        except (ToolCallError, ToolFailure) as exc:
            return ToolOutput(content=str(exc), is_error=True)
        except Exception as exc:
            if tool.spec.repeatable:
                raise  # Temporal retries it
            # a bug of ours, not the command's: do not run the command again for it
            raise ApplicationError(
                f"{inp.name} failed: {exc}", type=type(exc).__name__, non_retryable=True
            ) from exc
        return ToolOutput(content=content, staged=await self._stage(inp.run_id, content))

    async def _staged_arguments(self, inp: ToolCallInput) -> dict[str, Any]:
        """The call's arguments, from the model message the model activity staged."""
        assert inp.arguments_in is not None
        text = await self.store.staged_text(inp.run_id, inp.arguments_in)
        if text is not None and text_digest(text) == inp.arguments_in:
            for call in Message.model_validate_json(text).tool_uses():
                if call.id == inp.call_id:
                    return call.input
        missing = StateMissing(f"the store does not hold the model message with call {inp.call_id}")
        raise state_missing(missing)

    async def _stage(self, run_id: str, content: str) -> bool:
        """Keep a long output (or model message) in the store, so the save after this call can
        name it by digest.

        Only a cache: it is this activity's result all the same, and a save
        that does not find it here is sent it whole. So a store that fails
        here costs history bytes, never the call.
        """
        if len(content.encode()) < STAGE_MIN_BYTES:
            return False
        try:
            await self.store.stage_text(run_id, text_digest(content), content)
        except Exception as exc:
            log.warning("could not stage a tool output of run %s: %s", run_id, exc)
            return False
        return True
