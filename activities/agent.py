"""The agent's activities, bound to one worker's config, providers, tools, store and sinks."""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

from temporalio import activity
from temporalio.exceptions import ApplicationError

from activities.path_guard import READ_DENIED, check_resolved, read_denier
from activities.providers import ModelProvider, ProviderError, build_providers
from activities.redact import Redactor
from activities.run_log_activities import RunLogActivities
from activities.run_state import RunStates
from activities.sinks import ExportSink, FilesystemExportSink
from activities.store import FilesystemSessionStore, SessionStore
from activities.support import heartbeating, state_missing, usage_error
from activities.tools import Tool, ToolFailure, builtin_tools
from durable_agent.canonical import canonical_bytes
from durable_agent.config import AgentConfig
from durable_agent.json_limits import TOOL_ARGUMENTS_MAX_DEPTH, JsonLimitError, check_value
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

# The longest model answer (its message as canonical JSON) a step keeps. Temporal refuses a
# workflow task's payloads past 2 MiB, and the run's end carries a final answer's text twice (its
# ``text_delta`` and ``end`` events), next to whatever the last boundary did not save: past this,
# the run fails at once with a clear error instead of a workflow task that fails for ever (or
# eight paid retries of an answer that will never fit).
MODEL_ANSWER_MAX_BYTES = 960 * 1024
# A streaming answer's heartbeats carry at most this much of its text: followers show the rest
# from the step's durable ``text_delta`` event.
LIVE_TEXT_MAX_CHARS = 256 * 1024
MODEL_ANSWER_TOO_LARGE = "ModelAnswerTooLarge"


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
        self.tools = tools if tools is not None else builtin_tools(config.sandbox)
        self.store = store if store is not None else FilesystemSessionStore(config.store.path)
        self.states = RunStates(self.store)
        # read once: the credentials this worker holds, kept out of every result
        self.redact = Redactor.from_environment(config)
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
                details=lambda: LiveText(attempt=attempt, text=self._live_text(text)),
            )
        except ProviderError as exc:
            raise ApplicationError(
                self.redact(str(exc)),
                type="ProviderError",
                non_retryable=not exc.retryable,
                next_retry_delay=exc.retry_after,
            ) from None  # its cause's text would reach the history unredacted
        for use in response.message.tool_uses():
            # a host's own provider may not bound what it parses: deep input stops here, once
            try:
                check_value(use.input, max_depth=TOOL_ARGUMENTS_MAX_DEPTH)
            except JsonLimitError as exc:
                raise ApplicationError(
                    f"model {inp.model}: the model's arguments for tool {use.name!r} are refused "
                    f"(not retried): {exc}",
                    type="ProviderError",
                    non_retryable=True,
                ) from None
        if self.redact:
            clean = self.redact.json_text(response.message.model_dump_json())
            response = response.model_copy(update={"message": Message.model_validate_json(clean)})
        message = canonical_bytes(response.message).decode()
        size = len(message.encode())
        if size > MODEL_ANSWER_MAX_BYTES:
            raise ApplicationError(
                f"the model's answer is {size} bytes, over the {MODEL_ANSWER_MAX_BYTES} bytes one step "
                "can keep; ask for shorter steps (a long file written in parts)",
                type=MODEL_ANSWER_TOO_LARGE,
                non_retryable=True,  # the same request would bring the same answer, billed again
            )
        return response.model_copy(update={"staged": await self._stage(inp.run_id, message)})

    def _live_text(self, parts: list[str]) -> str:
        """The heartbeat's text so far: redacted, and bounded so that a heartbeat always fits."""
        text = "".join(parts)
        if len(text) > LIVE_TEXT_MAX_CHARS:
            # a little past the cut, so that a credential across it is still seen whole
            return self.redact(text[: LIVE_TEXT_MAX_CHARS + 1024])[:LIVE_TEXT_MAX_CHARS]
        return self.redact(text)

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
            if (refused := check_resolved(inp, tool.spec, arguments)) is not None:
                return refused
            if inp.permissions is not None:
                READ_DENIED.set(read_denier(inp.permissions, Path(inp.workspace).resolve()))
            content = await heartbeating(tool.run(args, Path(inp.workspace)))
        except (ToolCallError, ToolFailure) as exc:
            return ToolOutput(content=self.redact(str(exc)), is_error=True)
        except Exception as exc:
            log.exception("tool %s of run %s failed", inp.name, inp.run_id)
            # Temporal retries it, unless the tool is not safe to repeat: a bug of ours, not the
            # command's, is no reason to run the command again. Without the cause chain, whose
            # text would reach the history unredacted.
            raise ApplicationError(
                self.redact(f"{inp.name} failed: {exc}"),
                type=type(exc).__name__,
                non_retryable=not tool.spec.repeatable,
            ) from None
        content = self.redact(content)
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
