"""The model step: the conversation read from the run's log, one provider call, and the
answer checked, redacted, bounded and staged.

``ModelCalls.model_call`` is ``agent.model_call``. It also takes the whole-conversation input
(``ModelCallInput``) that workers before linear history queued, and hands it to the legacy
adapter beside it, ``answer`` (``activities/legacy_sessions.py`` lists the legacy inputs and when they go).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from temporalio import activity
from temporalio.exceptions import ApplicationError

from durable_agent.activities.mcp.catalog import McpCatalog
from durable_agent.activities.providers.model_provider import LiveParts, ModelProvider, ProviderError
from durable_agent.activities.redact import Redactor
from durable_agent.activities.staging import filled_images, stage
from durable_agent.activities.store.run_log_cache import RunLogCache
from durable_agent.activities.store.session_store import SessionStore
from durable_agent.activities.support import heartbeating, state_missing, usage_error
from durable_agent.core.activity_api import MODEL_CALL, ModelCallInput, ModelStepInput
from durable_agent.core.canonical import canonical_bytes
from durable_agent.core.context import last_view, model_messages
from durable_agent.core.failures import CONTEXT_OVERFLOW, MODEL_ANSWER_TOO_LARGE, PROVIDER_ERROR
from durable_agent.core.images import without_images
from durable_agent.core.json_limits import TOOL_ARGUMENTS_MAX_DEPTH, JsonLimitError, check_value
from durable_agent.core.models import (
    ContextView,
    LiveText,
    Message,
    ModelResponse,
    ThinkingBlock,
)
from durable_agent.core.run_log import LogDelta, LogRef, StateMissing
from durable_agent.core.surrogates import model_without_lone_surrogates, text_without_lone_surrogates
from durable_agent.telemetry_spans import ActivityTelemetry, ModelCallSpan

# The longest model answer (its message as canonical JSON) a step keeps. Temporal refuses a
# workflow task's payloads past 2 MiB, and the run's end carries a final answer's text twice (its
# ``text_delta`` and ``end`` events), next to whatever the last boundary did not save: past this,
# the run fails at once with a clear error instead of a workflow task that fails for ever (or
# eight paid retries of an answer that will never fit).
MODEL_ANSWER_MAX_BYTES = 960 * 1024
# A streaming answer's heartbeats carry at most this much of its thinking and text together:
# followers show the rest from the step's durable ``thinking`` and ``text_delta`` events.
LIVE_TEXT_MAX_CHARS = 256 * 1024
# Of which the thinking takes at most this much, so that the answer's text still shows live
# after a long reasoning.
LIVE_THINKING_MAX_CHARS = 64 * 1024


def provider_failure(exc: ProviderError, redact: Redactor) -> ApplicationError:
    """A provider's failure as the activity's: a context overflow is never retried as it stands."""
    if getattr(exc, "context_overflow", False):
        return ApplicationError(redact(str(exc)), type=CONTEXT_OVERFLOW, non_retryable=True)
    return ApplicationError(
        redact(str(exc)),
        type=PROVIDER_ERROR,
        non_retryable=not exc.retryable,
        next_retry_delay=exc.retry_after,
    )


def unsigned_where_changed(original: Message, redacted: Message) -> Message:
    """``redacted`` with the signature dropped from each thinking block that redaction changed.

    A signature vouches for the exact thinking text: sent back with other text, the provider
    refuses the whole conversation. Without it, the block is kept (readable, redacted) but not
    sent back, and the provider is asked without thinking where it would need it.
    """
    blocks = []
    for before, after in zip(original.content, redacted.content, strict=True):
        if isinstance(after, ThinkingBlock) and after.signature is not None and after != before:
            after = after.model_copy(update={"signature": None})
        blocks.append(after)
    return redacted.model_copy(update={"content": tuple(blocks)})


@dataclass(eq=False)
class ModelCalls:
    """Asks the configured providers for a run's next step."""

    providers: Mapping[str, ModelProvider]
    log_cache: RunLogCache
    store: SessionStore
    redact: Redactor
    telemetry: ActivityTelemetry = field(default_factory=ActivityTelemetry)
    mcp: McpCatalog | None = None
    # whether "provider/model" takes images (its ``attachment`` setting)
    takes_images: Callable[[str], bool] = lambda model: False

    @activity.defn(name=MODEL_CALL.name)
    async def model_call(self, inp: ModelStepInput | ModelCallInput) -> ModelResponse:
        """``agent.model_call``: ask the model for its next step, on the conversation in the
        run's log. (A ``ModelCallInput``, queued by a worker before linear history, goes to
        ``answer``.)"""
        if isinstance(inp, ModelCallInput):  # legacy: goes in 0.3
            return await self.answer(inp)
        provider, model = self._provider(inp.model)
        call = await self._conversation(inp)
        session = (await self.log_cache.header(inp.run_id)).session_id  # cached by the conversation's read
        call = call.model_copy(update={"session_id": session})
        # A server that is down keeps its tools in the request, and the system prompt stays as it
        # is: the prompt cache survives the outage. A call of such a tool is a tool error that says
        # the server is unavailable (``McpCatalog``); the run records the gap as an event.
        gaps = await self.mcp.unavailable(t.name for t in call.tools) if self.mcp else []
        response = await self._answer(provider, model, call, session)
        # the workflow stamps what it records of the answer with this time (``StepClock``)
        done = {"completed_at_ms": int(time.time() * 1000)}
        return response.model_copy(update={"unavailable": tuple(gaps), **done} if gaps else done)

    async def answer(self, call: ModelCallInput) -> ModelResponse:
        """Ask the model for its next step, on the conversation given whole: the legacy adapter
        of ``agent.model_call``, for a task a worker before linear history queued."""
        provider, model = self._provider(call.model)
        return await self._answer(provider, model, call)

    def provider(self, qualified: str) -> tuple[ModelProvider, str]:
        """The provider and model name of ``"provider/model"``."""
        return self._provider(qualified)

    def _provider(self, qualified: str) -> tuple[ModelProvider, str]:
        provider_name, _, model = qualified.partition("/")
        provider = self.providers.get(provider_name)
        if provider is None:
            raise usage_error(f"model provider {provider_name!r} is not configured on this worker")
        return provider, model

    async def _conversation(self, inp: ModelStepInput) -> ModelCallInput:
        """The request: the transcript (log and pending) as the newest context view shows it,
        with its images' data (or, for a model that takes none, a note in their place)."""
        call, view = await self.transcript(inp.run_id, inp.model, inp.log, inp.pending)
        steps = sum(1 for m in call.messages if m.role == "assistant")
        messages = await self.shown_images(call.run_id, call.model, model_messages(call.messages, view))
        return call.model_copy(update={"messages": tuple(messages), "step": steps})

    async def shown_images(self, run_id: str, model: str, messages: list[Message]) -> list[Message]:
        """``messages`` with their images' data read back from the store for a model that
        takes images (``attachment``), and with a note in their place for any other."""
        if not any(m.images() for m in messages):
            return messages
        if not self.takes_images(model):
            return without_images(messages, model)
        # the run's memo: an image is read from the store once, not at every step
        return await filled_images(self.store, run_id, messages, self.log_cache.filled(run_id))

    async def transcript(
        self, run_id: str, model: str, log: LogRef, pending: LogDelta
    ) -> tuple[ModelCallInput, ContextView | None]:
        """The whole transcript, and the newest view (the last ``context_compacted`` event of
        the log and the pending events; ``None``: the model sees it all)."""
        try:
            header = await self.log_cache.header(run_id)
            run_log = await self.log_cache.read(log)
            conversation = run_log.with_pending(pending)
        except StateMissing as exc:
            raise state_missing(exc) from None
        view = last_view(pending.events) or run_log.view
        call = ModelCallInput(
            run_id=run_id,
            model=model,
            system_prompt=header.system_prompt,
            messages=tuple(conversation),
            tools=header.tools,
        )
        return call, view

    async def _answer(
        self, provider: ModelProvider, model: str, call: ModelCallInput, session_id: str | None = None
    ) -> ModelResponse:
        name = call.model.partition("/")[0]
        with self.telemetry.model_call(name, model, call, session_id=session_id) as observed:
            return await self._observed_answer(provider, model, call, observed)

    async def _observed_answer(
        self, provider: ModelProvider, model: str, call: ModelCallInput, observed: ModelCallSpan
    ) -> ModelResponse:
        attempt = activity.info().attempt
        # the answer's text and its thinking as they stream, kept apart (``thinking_sink``)
        parts = LiveParts()
        try:
            response = await heartbeating(
                provider.complete(call, model, parts), details=lambda: self._live(attempt, parts)
            )
        except ProviderError as exc:
            # its cause's text would reach the history unredacted
            raise provider_failure(exc, self.redact) from None
        # JSON's lone surrogates ("\ud800" in a tool's arguments) cannot be encoded as UTF-8: as
        # they stood, the activity's result failed to serialize, and was retried (and billed) to
        # the last attempt. They become U+FFFD here, once (``core/surrogates.py``).
        clean, replaced = model_without_lone_surrogates(response.message)
        if replaced:
            activity.logger.warning(
                "model %s: %d lone surrogate(s) in the answer replaced with U+FFFD", call.model, replaced
            )
            response = response.model_copy(
                update={"message": unsigned_where_changed(response.message, clean)}
            )
        for use in response.message.tool_uses():
            # a host's own provider may not bound what it parses: deep input stops here, once
            try:
                check_value(use.input, max_depth=TOOL_ARGUMENTS_MAX_DEPTH)
            except JsonLimitError as exc:
                raise ApplicationError(
                    f"model {call.model}: the model's arguments for tool {use.name!r} are refused "
                    f"(not retried): {exc}",
                    type=PROVIDER_ERROR,
                    non_retryable=True,
                ) from None
        if self.redact:
            clean = Message.model_validate_json(self.redact.json_text(response.message.model_dump_json()))
            response = response.model_copy(
                update={"message": unsigned_where_changed(response.message, clean)}
            )
        observed.answered(response)
        message = canonical_bytes(response.message).decode()
        size = len(message.encode())
        if size > MODEL_ANSWER_MAX_BYTES:
            raise ApplicationError(
                f"the model's answer is {size} bytes, over the {MODEL_ANSWER_MAX_BYTES} bytes one step "
                "can keep; ask for shorter steps (a long file written in parts)",
                type=MODEL_ANSWER_TOO_LARGE,
                non_retryable=True,  # the same request would bring the same answer, billed again
            )
        return response.model_copy(update={"staged": await stage(self.store, call.run_id, message)})

    def _live(self, attempt: int, parts: LiveParts) -> LiveText:
        """The heartbeat's details: the thinking and the text so far, each redacted, and together
        bounded (``LIVE_TEXT_MAX_CHARS``) so that a heartbeat always fits."""
        thinking = self._live_text(parts.thought, LIVE_THINKING_MAX_CHARS)
        text = self._live_text(parts.text, LIVE_TEXT_MAX_CHARS - len(thinking))
        return LiveText(attempt=attempt, text=text, thinking=thinking)

    def _live_text(self, parts: list[str], limit: int) -> str:
        """``parts`` joined, redacted and cut to at most ``limit`` characters."""
        text = text_without_lone_surrogates("".join(parts))  # a heartbeat is encoded too
        if len(text) > limit:
            # a little past the cut, so that a credential across it is still seen whole
            return self.redact(text[: limit + 1024])[:limit]
        return self.redact(text)
