"""The activities' instrumentation: a GenAI span per model call and per tool call, and the
agent's metrics the activities record (``durable_agent.core.metrics``).

The spans follow OpenTelemetry's GenAI semantic conventions: ``chat {model}`` (kind CLIENT;
``gen_ai.provider.name``, ``gen_ai.request.model``, ``gen_ai.usage.input_tokens`` and
``output_tokens``, ``gen_ai.response.finish_reasons``) and ``execute_tool {name}``
(``gen_ai.tool.name``, ``gen_ai.tool.call.id``, ``durable_agent.tool.outcome``), ``error.type``
when the call failed, and the run (``durable_agent.run.id``) and, for model calls, the session
(``gen_ai.conversation.id``). They are children of the span Temporal's tracing interceptor
makes for the activity (the current context). Prompt, answer, arguments and tool output text
(``gen_ai.input.messages``, ``gen_ai.output.messages``, ``gen_ai.tool.call.arguments``,
``gen_ai.tool.call.result``) and exception messages are recorded only with ``[telemetry]
capture_content = true``, cut at ``CONTENT_MAX_CHARS``. Without a tracer provider the spans
are the API's no-op ones; without a metrics endpoint the meter is Temporal's no-op one.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from opentelemetry import trace
from opentelemetry.trace import Span, SpanKind, Status, StatusCode, TracerProvider
from temporalio import activity
from temporalio.common import MetricMeter
from temporalio.exceptions import ApplicationError

from durable_agent.config import TelemetryConfig
from durable_agent.core import metrics as m
from durable_agent.core.activity_api import ModelCallInput, ToolCallInput, ToolOutput
from durable_agent.core.failures import CONTEXT_OVERFLOW
from durable_agent.core.models import (
    Message,
    ModelResponse,
    TextBlock,
    ThinkingBlock,
    ToolResultBlock,
    ToolUseBlock,
)
from durable_agent.telemetry import AgentMetrics

TRACER_NAME = "durable_agent"
CONTENT_MAX_CHARS = 16 * 1024


def activity_metrics() -> AgentMetrics:
    """The agent's metrics on the current activity's meter (no-op outside an activity)."""
    try:
        return AgentMetrics(activity.metric_meter())
    except RuntimeError:
        return AgentMetrics(MetricMeter.noop)


def error_type(exc: BaseException) -> str:
    """``error.type``: an activity failure's type, else the exception's class."""
    if isinstance(exc, ApplicationError) and exc.type:
        return exc.type
    return type(exc).__name__


def clipped(text: str) -> str:
    return text if len(text) <= CONTENT_MAX_CHARS else text[:CONTENT_MAX_CHARS] + "…[truncated]"


def messages_json(messages: tuple[Message, ...] | list[Message], finish_reason: str | None = None) -> str:
    """Messages in the GenAI conventions' shape (role and parts), as JSON, cut short."""
    shown = []
    for message in messages:
        parts: list[dict[str, Any]] = []
        for block in message.content:
            if isinstance(block, TextBlock):
                parts.append({"type": "text", "content": block.text})
            elif isinstance(block, ToolUseBlock):
                parts.append(
                    {"type": "tool_call", "id": block.id, "name": block.name, "arguments": block.input}
                )
            elif isinstance(block, ToolResultBlock):
                parts.append(
                    {"type": "tool_call_response", "id": block.tool_use_id, "response": block.content}
                )
            elif isinstance(block, ThinkingBlock):
                parts.append({"type": "reasoning", "content": block.thinking})
        entry: dict[str, Any] = {"role": message.role, "parts": parts}
        if finish_reason is not None:
            entry["finish_reason"] = finish_reason
        shown.append(entry)
    return clipped(json.dumps(shown, ensure_ascii=False))


def _failed(span: Span, exc: BaseException, capture: bool) -> str:
    """Mark the span failed; the message only with content capture (it may quote content)."""
    kind = error_type(exc)
    span.set_attribute("error.type", kind)
    span.set_status(Status(StatusCode.ERROR, f"{kind}: {clipped(str(exc))}" if capture else kind))
    if capture:
        span.record_exception(exc)
    return kind


class ModelCallSpan:
    """The span of one model call, for the activity to report the answer on."""

    def __init__(self, span: Span, capture: bool) -> None:
        self.span = span
        self.capture = capture
        self.tokens: tuple[int, ...] = (0, 0, 0)

    def answered(self, response: ModelResponse) -> None:
        """The provider's answer (redacted): usage, finish reason and, with capture, its text."""
        usage = response.usage
        self.tokens = (usage.prompt_tokens, usage.completion_tokens, usage.reasoning_tokens)
        if not self.span.is_recording():
            return
        self.span.set_attribute("gen_ai.usage.input_tokens", usage.prompt_tokens)
        self.span.set_attribute("gen_ai.usage.output_tokens", usage.completion_tokens)
        if response.stop_reason:
            self.span.set_attribute("gen_ai.response.finish_reasons", (response.stop_reason,))
        if self.capture:
            self.span.set_attribute(
                "gen_ai.output.messages", messages_json([response.message], response.stop_reason)
            )


class ToolCallSpan:
    """The span of one tool call, for the activity to report the arguments and the output on."""

    def __init__(self, span: Span, capture: bool) -> None:
        self.span = span
        self.capture = capture
        self.outcome: str | None = None

    def arguments(self, arguments: Mapping[str, Any]) -> None:
        if self.capture and self.span.is_recording():
            self.span.set_attribute(
                "gen_ai.tool.call.arguments", clipped(json.dumps(arguments, ensure_ascii=False))
            )

    def finished(self, output: ToolOutput, *, known: bool) -> None:
        """The tool's output: its outcome (``needs_approval``: the workflow asks, then calls again)."""
        if not known:
            self.outcome = m.TOOL_UNKNOWN
        elif output.permission == "denied":
            self.outcome = m.TOOL_DENIED
        elif output.permission == "ask":
            self.outcome = "needs_approval"
        else:
            self.outcome = m.TOOL_ERROR if output.is_error else m.TOOL_OK
        if self.outcome in (m.TOOL_ERROR, m.TOOL_DENIED, m.TOOL_UNKNOWN):
            self.span.set_attribute("error.type", self.outcome)
        if self.capture and self.span.is_recording():
            self.span.set_attribute("gen_ai.tool.call.result", clipped(output.content))


class ActivityTelemetry:
    """What the activities record, for one worker: ``[telemetry]``, the kind of each configured
    provider (``gen_ai.provider.name``) and the tracer provider (the global one by default)."""

    def __init__(
        self,
        config: TelemetryConfig | None = None,
        *,
        provider_kinds: Mapping[str, str] | None = None,
        tracer_provider: TracerProvider | None = None,
    ) -> None:
        self.capture_content = config.capture_content if config is not None else False
        self.provider_kinds = dict(provider_kinds or {})
        self.tracer = trace.get_tracer(TRACER_NAME, tracer_provider=tracer_provider)

    @contextmanager
    def model_call(
        self, provider: str, model: str, call: ModelCallInput, *, session_id: str | None = None
    ) -> Iterator[ModelCallSpan]:
        """Span and metrics of one provider call; the block reports the answer on what it gets."""
        kind = self.provider_kinds.get(provider, provider)
        attributes: dict[str, Any] = {
            "gen_ai.operation.name": "chat",
            "gen_ai.provider.name": kind,
            "gen_ai.request.model": model,
            "durable_agent.run.id": call.run_id,
            "durable_agent.model.purpose": call.purpose,
        }
        if session_id:
            attributes["gen_ai.conversation.id"] = session_id
        metrics = activity_metrics()
        started = time.monotonic()
        outcome = m.MODEL_OK
        with self.tracer.start_as_current_span(
            f"chat {model}", kind=SpanKind.CLIENT, attributes=attributes,
            record_exception=False, set_status_on_exception=False,
        ) as span:  # fmt: skip
            if self.capture_content and span.is_recording():
                span.set_attribute("gen_ai.system_instructions", clipped(call.system_prompt))
                span.set_attribute("gen_ai.input.messages", messages_json(call.messages))
            observed = ModelCallSpan(span, self.capture_content)
            try:
                yield observed
            except BaseException as exc:
                kind_of_error = _failed(span, exc, self.capture_content)
                if isinstance(exc, asyncio.CancelledError):
                    outcome = m.MODEL_CANCELLED
                else:
                    outcome = m.MODEL_CONTEXT_OVERFLOW if kind_of_error == CONTEXT_OVERFLOW else m.MODEL_ERROR
                raise
            finally:
                seconds = time.monotonic() - started
                metrics.model_call(kind, model, call.purpose, outcome, seconds, observed.tokens)

    @contextmanager
    def tool_call(self, inp: ToolCallInput, *, known: bool) -> Iterator[ToolCallSpan]:
        """Span and metric of one tool call (``known``: the worker has the tool)."""
        attributes = {
            "gen_ai.operation.name": "execute_tool",
            "gen_ai.tool.name": inp.name,
            "gen_ai.tool.call.id": inp.call_id,
            "durable_agent.run.id": inp.run_id,
        }
        metrics = activity_metrics()
        with self.tracer.start_as_current_span(
            f"execute_tool {inp.name}", kind=SpanKind.INTERNAL, attributes=attributes,
            record_exception=False, set_status_on_exception=False,
        ) as span:  # fmt: skip
            observed = ToolCallSpan(span, self.capture_content)
            if inp.arguments_in is None:
                observed.arguments(inp.arguments)
            try:
                yield observed
            except BaseException as exc:
                _failed(span, exc, self.capture_content)
                observed.outcome = (
                    m.TOOL_CANCELLED if isinstance(exc, asyncio.CancelledError) else m.TOOL_FAILED
                )
                raise
            finally:
                outcome = observed.outcome or m.TOOL_FAILED
                span.set_attribute("durable_agent.tool.outcome", outcome)
                if outcome in m.TOOL_OUTCOMES:  # a call that needs approval is counted when decided
                    metrics.tool_call(inp.name if known else m.UNKNOWN_TOOL_LABEL, outcome)

    @contextmanager
    def export(self, sink: str) -> Iterator[None]:
        """The metrics of one export handed to ``sink``: its duration, or why it failed."""
        metrics = activity_metrics()
        started = time.monotonic()
        try:
            yield
        except BaseException as exc:
            if not isinstance(exc, asyncio.CancelledError):
                retryable = not (isinstance(exc, ApplicationError) and exc.non_retryable)
                metrics.export_failed(sink, m.RETRYABLE if retryable else m.NON_RETRYABLE)
            raise
        metrics.export_delivered(sink, time.monotonic() - started)

    @contextmanager
    def compaction(self, model: str) -> Iterator[None]:
        """The metric of one compaction (its model call has its own span and metrics)."""
        metrics = activity_metrics()
        try:
            yield
        except Exception:
            metrics.compaction(model, "error")
            raise
        metrics.compaction(model, "ok")
