"""The agent's activities, bound to one worker's config, providers, tools, store and sinks."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

from temporalio import activity
from temporalio.exceptions import ApplicationError

from activities.providers import ModelProvider, ProviderError, build_providers
from activities.run_state import RunStates
from activities.sinks import ExportSink, FilesystemExportSink, SinkError
from activities.store import FilesystemSessionStore, SessionStore
from activities.tools import Tool, ToolFailure, builtin_tools
from durable_agent.canonical import canonical_bytes
from durable_agent.checkpoint import ExportDescriptor, ExportError, RunRecord
from durable_agent.config import AgentConfig
from durable_agent.models import LiveText, Message, ModelResponse
from durable_agent.run_io import (
    ACTIVITY_EXPORT,
    ACTIVITY_FINISH_RUN,
    ACTIVITY_LOAD_SESSION,
    ACTIVITY_MODEL,
    ACTIVITY_OPEN_RUN,
    ACTIVITY_RESOLVE,
    ACTIVITY_SAVE_CHECKPOINT,
    ACTIVITY_TOOL,
    ExportInput,
    ExportSeed,
    FinishRunInput,
    LoadSessionInput,
    ModelCallInput,
    ModelStepInput,
    OpenRunInput,
    ResolveInput,
    RunOpened,
    RunPlan,
    SaveCheckpointInput,
    SessionRuns,
    ToolCallInput,
    ToolOutput,
)
from durable_agent.run_log import (
    STAGE_MIN_BYTES,
    STATE_LOST,
    STATE_MISSING,
    LogDelta,
    LogEntry,
    Staged,
    StateMissing,
    build_export,
    run_snapshot,
    text_digest,
)
from durable_agent.tool_specs import (
    ToolCallError,
    capability_binding,
    offered_tools,
    validate_args,
)

T = TypeVar("T")
log = logging.getLogger(__name__)

INVALID_RUN_INPUT = "InvalidRunInput"
LIVE_TEXT_INTERVAL_SECONDS = 0.25


def state_missing(exc: StateMissing) -> ApplicationError:
    """Not retried: the workflow sends the missing entries again from its history, then retries."""
    head = exc.head.model_dump(mode="json") if exc.head is not None else None
    return ApplicationError(str(exc), head, type=STATE_MISSING, non_retryable=True)


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
    async def model_call(self, inp: ModelStepInput) -> ModelResponse:
        """Ask the model for its next step, on the conversation in the run's log."""
        provider_name, _, model = inp.model.partition("/")
        provider = self.providers.get(provider_name)
        if provider is None:
            raise usage_error(f"model provider {provider_name!r} is not configured on this worker")
        try:
            header = await self.states.header(inp.run_id)
            conversation = (await self.states.read(inp.log)).with_pending(inp.pending)
        except StateMissing as exc:
            raise state_missing(exc) from None
        call = ModelCallInput(
            run_id=inp.run_id,
            model=inp.model,
            system_prompt=header.system_prompt,
            messages=tuple(conversation),
            tools=header.tools,
        )
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

    @activity.defn(name=ACTIVITY_OPEN_RUN)
    async def open_run(self, inp: OpenRunInput) -> RunOpened:
        """Start the run's log: its header, with the session's ended runs, and its first entry."""
        header = inp.header
        stored = await self.store.load_header(header.run_id)
        if stored is not None:  # a repeat: the first attempt already chose the prior runs
            prior = stored.prior_run_ids
        else:
            records = await heartbeating(self.store.load_run_records(header.session_id))
            prior = tuple(r.snapshot.id for r in records if r.snapshot.id != header.run_id)
        await self.states.save_header(header.model_copy(update={"prior_run_ids": prior}))
        try:
            await heartbeating(self.states.append(header.run_id, [inp.seed]))
        except StateMissing as exc:
            raise state_missing(exc) from None
        return RunOpened(prior_run_ids=prior)

    @activity.defn(name=ACTIVITY_SAVE_CHECKPOINT)
    async def save_checkpoint(self, inp: SaveCheckpointInput) -> None:
        """Append entries to the run's logical checkpoint in the session store, durably."""
        try:
            if inp.header is not None:
                await self.states.save_header(inp.header)
            entries = [await self._unstage(inp, e) for e in inp.entries]
            if inp.seed is not None:
                entries.insert(0, await self._seed_from_export(inp.run_id, inp.seed))
            await heartbeating(self.states.append(inp.run_id, entries))
        except StateMissing as exc:
            raise state_missing(exc) from None

    async def _unstage(self, inp: SaveCheckpointInput, entry: LogEntry) -> LogEntry:
        """The entry with what the tool and model activities staged put back, checked against its digest."""
        if inp.staged:
            texts: dict[Staged, str] = {}
            for part in inp.staged:
                text = await self.store.staged_text(inp.run_id, part.digest)
                if text is None or text_digest(text) != part.digest:
                    head = await self.store.log_head(inp.run_id)
                    raise StateMissing(f"the store does not hold the staged {part.kind} {part.key}", head)
                texts[part] = text
            entry = entry.model_copy(update={"delta": entry.delta.unstaged(texts)})
        if entry.delta.chained(entry.parent) != entry.digest:
            raise ApplicationError(
                f"log entry {entry.version} of run {inp.run_id!r} does not match its digest",
                type="InvalidLogEntry",
                non_retryable=True,
            )
        return entry

    async def _seed_from_export(self, run_id: str, seed: ExportSeed) -> LogEntry:
        """The state a continued run started from, read back from its last export."""
        sink = self.sinks.get(seed.sink)
        fetch = getattr(sink, "fetch", None)
        export = await fetch(seed.descriptor) if fetch is not None else None
        if export is None:
            raise ApplicationError(
                f"run {run_id!r}: its state at turn {seed.descriptor.turn} is in neither the session "
                f"store nor sink {seed.sink!r} (export {seed.descriptor.content_digest}); "
                "resume from that export with `durable-agent resume`",
                type=STATE_LOST,
                non_retryable=True,
            )
        if export.descriptor.content_digest != seed.descriptor.content_digest:
            raise StateMissing(
                f"sink {seed.sink!r} gave another export than {seed.descriptor.content_digest}"
            )
        payload = export.open()
        whole = LogDelta(
            replace=True, messages=payload.logical_resume.messages, events=payload.source_run().events
        )
        return LogEntry(version=seed.log.version, parent="", digest=seed.log.digest, delta=whole)

    @activity.defn(name=ACTIVITY_LOAD_SESSION)
    async def load_session(self, inp: LoadSessionInput) -> SessionRuns:
        """The session's ended runs (other than this one), oldest first.

        Called by runs recorded before ``agent.open_run`` existed; kept for them.
        """
        records = await heartbeating(self.store.load_run_records(inp.session_id))
        return SessionRuns(records=tuple(r for r in records if r.snapshot.id != inp.run_id))

    @activity.defn(name=ACTIVITY_FINISH_RUN)
    async def finish_run(self, inp: FinishRunInput) -> None:
        """Keep the ended run's record in its session, then drop its log."""
        try:
            header = await self.states.header(inp.log.run_id)
            run_log = await self.states.read(inp.log)
        except StateMissing as exc:
            raise state_missing(exc) from None
        events = (*run_log.events, *inp.events)
        snapshot = run_snapshot(header, events, inp.status, inp.updated_at_ms, inp.result_text, inp.error)
        await heartbeating(self.store.save_run_record(RunRecord(snapshot=snapshot, events=events)))
        await heartbeating(self.states.drop(inp.log.run_id))

    @activity.defn(name=ACTIVITY_EXPORT)
    async def export_checkpoint(self, inp: ExportInput) -> ExportDescriptor:
        """Build the boundary's export from the run's log and hand it to the sink; return only
        once the sink holds it."""
        sink = self.sinks.get(inp.sink)
        if sink is None:
            raise ApplicationError(f"export sink {inp.sink!r} is not configured", non_retryable=True)
        try:
            header = await self.states.header(inp.log.run_id)
            run_log = await self.states.read(inp.log)
        except StateMissing as exc:
            raise state_missing(exc) from None
        try:
            export = build_export(header, run_log, await self.states.prior_runs(header), inp.facts)
        except ExportError as exc:
            raise ApplicationError(
                f"export failed its own validation: {exc}", type=type(exc).__name__, non_retryable=True
            ) from exc
        try:
            await heartbeating(sink.deliver(export))
        except SinkError as exc:
            raise ApplicationError(
                f"sink {inp.sink!r}: {exc}", type="SinkError", non_retryable=not exc.retryable
            ) from exc
        return export.descriptor
