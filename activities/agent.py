"""The agent's activities, bound to one worker's config, providers, tools, store and sinks."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

from temporalio import activity
from temporalio.exceptions import ApplicationError

from activities.providers import ModelProvider, ProviderError, build_providers
from activities.sinks import ExportSink, FilesystemExportSink, SinkError
from activities.store import FilesystemSessionStore, SessionStore
from activities.tools import Tool, ToolFailure, builtin_tools
from durable_agent.checkpoint import ExportError
from durable_agent.config import AgentConfig
from durable_agent.models import LiveText, ModelResponse
from durable_agent.run_io import (
    ACTIVITY_EXPORT,
    ACTIVITY_FINISH_RUN,
    ACTIVITY_LOAD_SESSION,
    ACTIVITY_MODEL,
    ACTIVITY_RESOLVE,
    ACTIVITY_SAVE_CHECKPOINT,
    ACTIVITY_TOOL,
    ExportInput,
    FinishRunInput,
    LoadSessionInput,
    ModelCallInput,
    ResolveInput,
    RunPlan,
    SaveCheckpointInput,
    SessionRuns,
    ToolCallInput,
    ToolOutput,
)
from durable_agent.tool_specs import (
    ToolCallError,
    capability_binding,
    offered_tools,
    validate_args,
)

T = TypeVar("T")

INVALID_RUN_INPUT = "InvalidRunInput"
LIVE_TEXT_INTERVAL_SECONDS = 0.25


def usage_error(message: str) -> ApplicationError:
    """A bad run input or config: fails at once, with the message the user sees."""
    return ApplicationError(message, type=INVALID_RUN_INPUT, non_retryable=True)


async def heartbeating(awaitable: Awaitable[T], details: Callable[[], object] | None = None) -> T:
    """Await while heartbeating, so a cancel reaches the activity within seconds.

    With ``details``, each heartbeat carries what it returns (a streaming model
    call's text so far), and heartbeats come often enough for a follower to see
    text appear; the worker's throttle decides how often they reach the server.
    """
    timeout = activity.info().heartbeat_timeout
    interval = timeout.total_seconds() / 3 if timeout else 5.0
    if details is not None:
        interval = min(interval, LIVE_TEXT_INTERVAL_SECONDS)
    task = asyncio.ensure_future(awaitable)
    try:
        while True:
            done, _ = await asyncio.wait({task}, timeout=interval)
            if done:
                return task.result()
            activity.heartbeat(*(() if details is None else (details(),)))
    finally:
        if not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task


class AgentActivities:
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
    async def model_call(self, inp: ModelCallInput) -> ModelResponse:
        """Ask the model for its next step."""
        provider_name, _, model = inp.model.partition("/")
        provider = self.providers.get(provider_name)
        if provider is None:
            raise usage_error(f"model provider {provider_name!r} is not configured on this worker")
        attempt = activity.info().attempt
        text: list[str] = []
        try:
            return await heartbeating(
                provider.complete(inp, model, text.append),
                details=lambda: LiveText(attempt=attempt, text="".join(text)),
            )
        except ProviderError as exc:
            raise ApplicationError(
                str(exc),
                type="ProviderError",
                non_retryable=not exc.retryable,
                next_retry_delay=exc.retry_after,
            ) from exc

    @activity.defn(name=ACTIVITY_TOOL)
    async def tool_call(self, inp: ToolCallInput) -> ToolOutput:
        """Run one tool call in the workspace; expected failures become tool errors."""
        tool = self.tools.get(inp.name)
        if tool is None:
            return ToolOutput(content=f"unknown tool {inp.name!r} on this worker", is_error=True)
        try:
            args = validate_args(tool.spec, inp.arguments)
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
        return ToolOutput(content=content)

    @activity.defn(name=ACTIVITY_SAVE_CHECKPOINT)
    async def save_checkpoint(self, inp: SaveCheckpointInput) -> None:
        """Write the run's logical checkpoint to the session store, durably."""
        await heartbeating(self.store.save_loop_checkpoint(inp.checkpoint))

    @activity.defn(name=ACTIVITY_LOAD_SESSION)
    async def load_session(self, inp: LoadSessionInput) -> SessionRuns:
        """The session's ended runs (other than this one), oldest first."""
        records = await heartbeating(self.store.load_run_records(inp.session_id))
        return SessionRuns(records=tuple(r for r in records if r.snapshot.id != inp.run_id))

    @activity.defn(name=ACTIVITY_FINISH_RUN)
    async def finish_run(self, inp: FinishRunInput) -> None:
        """Keep the ended run's record in its session, then drop its logical checkpoint."""
        await heartbeating(self.store.save_run_record(inp.record))
        await heartbeating(self.store.delete_loop_checkpoint(inp.record.snapshot.id))

    @activity.defn(name=ACTIVITY_EXPORT)
    async def export_checkpoint(self, inp: ExportInput) -> None:
        """Hand an export to the sink; return only once the sink holds it."""
        sink = self.sinks.get(inp.sink)
        if sink is None:
            raise ApplicationError(f"export sink {inp.sink!r} is not configured", non_retryable=True)
        try:
            inp.export.open()
        except ExportError as exc:
            raise ApplicationError(
                f"export failed its own validation: {exc}", type=type(exc).__name__, non_retryable=True
            ) from exc
        try:
            await heartbeating(sink.deliver(inp.export))
        except SinkError as exc:
            raise ApplicationError(
                f"sink {inp.sink!r}: {exc}", type="SinkError", non_retryable=not exc.retryable
            ) from exc
