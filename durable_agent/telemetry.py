"""Traces and metrics: what the client and the worker set up, and the agent's metrics.

**Traces.** ``configure_tracing`` installs an OpenTelemetry ``TracerProvider`` exporting over
OTLP when the standard variables ask for it (``OTEL_EXPORTER_OTLP_ENDPOINT`` or
``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``; ``OTEL_SDK_DISABLED=true`` or
``OTEL_TRACES_EXPORTER=none`` keep it off); the exporter, the batch processor, the sampler and
the resource read the other ``OTEL_*`` variables themselves. ``tracing_interceptors`` are
Temporal's ``TracingInterceptor``: on the client, they trace its calls and every worker built
from it (workflow spans are made once, never again on replay). The activities add a span per
model and tool call (``durable_agent.telemetry_spans``).

**Metrics.** ``metrics_runtime`` is a Temporal ``Runtime`` whose Prometheus endpoint serves the
SDK's metrics (``temporal_*``, durations in seconds) and the agent's, recorded through the
same runtime's ``MetricMeter`` (``AgentMetrics``); their names, units and labels are the table
in ``durable_agent.core.metrics``. ``approvals_waiting_reporter`` keeps the
``durable_agent_approvals_waiting`` gauge from Temporal's visibility.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import importlib
import ipaddress
import logging
import os
import socket
from collections.abc import AsyncIterator, Mapping
from typing import TYPE_CHECKING, Any

from temporalio.common import MetricCounter, MetricGauge, MetricHistogramFloat, MetricMeter
from temporalio.runtime import PrometheusConfig, Runtime
from temporalio.runtime import TelemetryConfig as RuntimeTelemetry

from durable_agent.config import ConfigError, TelemetryConfig
from durable_agent.core import metrics as m
from durable_agent.core.run_api import AWAITING_APPROVAL, SA_RUN_STATUS

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider as SdkTracerProvider
    from opentelemetry.trace import TracerProvider
    from temporalio.client import Client, Interceptor
    from temporalio.contrib.opentelemetry import TracingInterceptor

log = logging.getLogger(__name__)

APPROVALS_WAITING_QUERY = f'ExecutionStatus = "Running" AND {SA_RUN_STATUS} = "{AWAITING_APPROVAL}"'
GRPC_EXPORTER = "opentelemetry.exporter.otlp.proto.grpc.trace_exporter"

_installed: SdkTracerProvider | None = None  # the provider configure_tracing installed, once


# --- traces ---------------------------------------------------------------------------------


def tracing_wanted(env: Mapping[str, str] | None = None) -> bool:
    """Whether the standard ``OTEL_*`` variables ask for traces: an OTLP endpoint is named,
    the SDK is not disabled and the traces exporter is not ``none``."""
    env = os.environ if env is None else env
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    exporters = {e.strip().lower() for e in env.get("OTEL_TRACES_EXPORTER", "otlp").split(",")}
    if "none" in exporters:
        return False
    if exporters - {"otlp", ""}:
        raise ConfigError(
            f"OTEL_TRACES_EXPORTER={env['OTEL_TRACES_EXPORTER']!r}: this worker exports traces over "
            "OTLP only (set it to otlp, or none)"
        )
    return any(
        env.get(v, "").strip() for v in ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
    )


def span_exporter(env: Mapping[str, str] | None = None) -> Any:
    """The OTLP span exporter the protocol variables name (``http/protobuf`` by default, as the
    specification says); it reads its endpoint, headers, timeout and TLS files itself."""
    env = os.environ if env is None else env
    protocol = (
        env.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") or env.get("OTEL_EXPORTER_OTLP_PROTOCOL") or ""
    ).strip() or "http/protobuf"
    if protocol == "http/protobuf":
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        return OTLPSpanExporter()
    if protocol == "grpc":
        try:
            grpc = importlib.import_module(GRPC_EXPORTER)
        except ImportError:
            raise ConfigError(
                "OTLP protocol grpc needs the gRPC exporter: pip install "
                "opentelemetry-exporter-otlp-proto-grpc (or set OTEL_EXPORTER_OTLP_PROTOCOL=http/protobuf)"
            ) from None
        return grpc.OTLPSpanExporter()
    raise ConfigError(f"OTLP protocol {protocol!r} is not supported here: use http/protobuf or grpc")


def configure_tracing(config: TelemetryConfig, *, service_name: str = "durable-agent") -> bool:
    """Install the global ``TracerProvider`` when the ``OTEL_*`` variables ask for traces;
    whether tracing is on. Idempotent. ``service_name`` is the default of ``OTEL_SERVICE_NAME``.

    A provider the host installed itself is kept (and tracing is on). What spans hold is
    ``config``'s business (``capture_content``): the activities read it, and without it the
    installed exporter drops exception messages and stack traces (``telemetry_export``). Raises
    ``ConfigError`` when the variables ask for what cannot be done here.
    """
    global _installed
    from opentelemetry import trace

    if _installed is not None:
        return True
    if not tracing_wanted():
        return False
    if not isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider):
        return True  # the host's own provider: the interceptors and activities use it
    from opentelemetry.sdk.resources import SERVICE_NAME, Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    resource = Resource.create()  # OTEL_RESOURCE_ATTRIBUTES and OTEL_SERVICE_NAME
    if str(resource.attributes.get(SERVICE_NAME, "")).startswith("unknown_service"):
        resource = resource.merge(Resource({SERVICE_NAME: service_name}))
    provider = TracerProvider(resource=resource)
    exporter = span_exporter()
    if not config.capture_content:
        from durable_agent.telemetry_export import ContentFreeExporter

        exporter = ContentFreeExporter(exporter)
    provider.add_span_processor(BatchSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    _installed = provider
    return True


def shutdown_tracing() -> None:
    """Export the spans still batched and stop the provider ``configure_tracing`` installed."""
    global _installed
    provider, _installed = _installed, None
    if provider is not None:
        provider.shutdown()


def tracing_interceptors(tracer_provider: TracerProvider | None = None) -> list[Interceptor]:
    """Temporal's tracing interceptor, for ``Client.connect(interceptors=...)``: it traces the
    client's calls and, through the client, every worker's workflows and activities; a run
    started without a trace context is one trace too (``run_tracing_interceptor``).
    ``tracer_provider``: the global one by default (none installed: spans cost nothing)."""
    from opentelemetry import trace

    interceptor = run_tracing_interceptor()
    return [interceptor(trace.get_tracer("durable_agent", tracer_provider=tracer_provider))]


def run_trace_context(workflow_id: str, first_run_id: str) -> tuple[int, int]:
    """The trace id and parent span id of a run that arrived without a trace context: derived
    from its workflow id and first run id, so every replay, on any worker, finds the same."""
    digest = hashlib.sha256(f"durable-agent.trace\0{workflow_id}\0{first_run_id}".encode()).digest()
    return int.from_bytes(digest[:16], "big") or 1, int.from_bytes(digest[16:24], "big") or 1


@functools.cache
def run_tracing_interceptor() -> type[TracingInterceptor]:
    """Temporal's ``TracingInterceptor``, for runs that arrive without a parent span too.

    The SDK makes a workflow's spans only under the context its start carried (the client's
    ``StartWorkflow`` span). A run started where nobody traces (``temporal workflow execute``,
    the UI, a schedule) would get none, and its activities' spans would each begin a trace of
    their own; the SDK's ``always_create_workflow_spans`` makes the workflow's spans, but each
    of them a root, since the workflow keeps no context between its tasks. Here such a run
    gets a context of its own instead, made from its ids (``run_trace_context``): its workflow
    spans, its activities and their model and tool calls are one trace, the same after a
    replay on any worker and across ``continue_as_new`` (which carries the context on). The
    parent span it names is never exported: a trace viewer shows the run's ``RunWorkflow``
    span under a root it did not receive. Queries without a context still make no span.
    """
    from opentelemetry import trace
    from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags
    from temporalio import workflow
    from temporalio.contrib.opentelemetry import TracingInterceptor, TracingWorkflowInboundInterceptor
    from temporalio.worker import WorkflowInterceptorClassInput

    class RunTracingInbound(TracingWorkflowInboundInterceptor):
        def _load_workflow_context_carrier(self) -> Any:
            carrier = super()._load_workflow_context_carrier()
            if carrier:
                return carrier
            info = workflow.info()
            trace_id, span_id = run_trace_context(info.workflow_id, info.first_execution_run_id)
            parent = SpanContext(
                trace_id, span_id, is_remote=True, trace_flags=TraceFlags(TraceFlags.SAMPLED)
            )
            made: dict[str, list[str] | str] = {}
            self.text_map_propagator.inject(made, trace.set_span_in_context(NonRecordingSpan(parent)))
            self._workflow_context_carrier = made
            return made

    class RunTracingInterceptor(TracingInterceptor):
        def workflow_interceptor_class(
            self, input: WorkflowInterceptorClassInput
        ) -> type[TracingWorkflowInboundInterceptor]:
            super().workflow_interceptor_class(input)  # registers the span-making extern function
            return RunTracingInbound

    return RunTracingInterceptor


# --- metrics --------------------------------------------------------------------------------


def prometheus_address(bind: str) -> str:
    """``host:port`` as the runtime takes it: an IP address (an empty host is every interface)."""
    host, _, port = bind.rpartition(":")
    host = host.strip("[]") or "0.0.0.0"
    try:
        ipaddress.ip_address(host)
    except ValueError:
        try:
            host = socket.gethostbyname(host)
        except OSError as exc:
            raise ConfigError(f"[metrics] bind = {bind!r}: cannot resolve {host!r}: {exc}") from None
    return f"{host}:{port}"


def metrics_runtime(bind: str) -> Runtime:
    """A Temporal ``Runtime`` whose Prometheus endpoint (``http://BIND/metrics``) serves the
    SDK's metrics and the agent's. Pass it to ``Client.connect(runtime=...)``: workers built
    from that client record there. ``ConfigError`` when ``bind`` cannot be listened on."""
    buckets = {
        m.MODEL_CALL_DURATION.name: m.MODEL_CALL_BUCKETS,
        m.EXPORT_DURATION.name: m.EXPORT_BUCKETS,
        # a restore takes what an export takes, up to a whole repository's objects
        m.WORKSPACE_RESTORE_DURATION.name: m.EXPORT_BUCKETS,
    }
    prometheus = PrometheusConfig(
        bind_address=prometheus_address(bind),
        durations_as_seconds=True,
        histogram_bucket_overrides={name: list(b) for name, b in buckets.items()},
    )
    try:
        return Runtime(telemetry=RuntimeTelemetry(metrics=prometheus))
    except ValueError as exc:  # the address is taken, or not one
        raise ConfigError(f"[metrics] bind = {bind!r}: the Prometheus endpoint cannot start: {exc}") from None


class AgentMetrics:
    """Records the agent's metrics (``durable_agent.core.metrics``) on one ``MetricMeter``;
    on the no-op meter of a runtime without metrics, records nothing at no cost."""

    def __init__(self, meter: MetricMeter) -> None:
        self.meter = meter
        self.enabled = meter is not MetricMeter.noop
        self._made: dict[str, Any] = {}

    def _counter(self, metric: m.Metric) -> MetricCounter:
        made = self._made.get(metric.name)
        if made is None:
            made = self._made[metric.name] = self.meter.create_counter(
                metric.name, metric.description, metric.unit
            )
        counter: MetricCounter = made
        return counter

    def _histogram(self, metric: m.Metric) -> MetricHistogramFloat:
        made = self._made.get(metric.name)
        if made is None:
            made = self.meter.create_histogram_float(metric.name, metric.description, metric.unit)
            self._made[metric.name] = made
        histogram: MetricHistogramFloat = made
        return histogram

    def model_call(
        self, provider: str, model: str, purpose: str, outcome: str, seconds: float, tokens: tuple[int, ...]
    ) -> None:
        """One model call: its outcome, duration and (input, output, reasoning) tokens.

        Args:
            provider: the provider's name in the worker's config.
            model: the model's name at the provider.
            purpose: ``step`` or ``summary``.
            outcome: ``ok``, ``error``, ``context_overflow`` or ``cancelled``.
            seconds: how long the call took, streaming included.
            tokens: input, output and reasoning tokens (the reasoning's are a share of the
                output's, counted apart where the provider reports them); a count left out is 0.
        """
        if not self.enabled:
            return
        self._counter(m.MODEL_CALLS).add(
            1, {"provider": provider, "model": model, "purpose": purpose, "outcome": outcome}
        )
        self._histogram(m.MODEL_CALL_DURATION).record(
            seconds, {"provider": provider, "model": model, "outcome": outcome}
        )
        for kind, count in zip(("input", "output", "reasoning"), tokens, strict=False):
            if count:
                self._counter(m.MODEL_TOKENS).add(count, {"provider": provider, "model": model, "type": kind})

    def tool_call(self, tool: str, outcome: str) -> None:
        if self.enabled:
            self._counter(m.TOOL_CALLS).add(1, {"tool": tool, "outcome": outcome})

    def export_delivered(self, sink: str, seconds: float) -> None:
        if self.enabled:
            self._histogram(m.EXPORT_DURATION).record(seconds, {"sink": sink})

    def export_failed(self, sink: str, reason: str) -> None:
        if self.enabled:
            self._counter(m.EXPORT_FAILURES).add(1, {"sink": sink, "reason": reason})

    def compaction(self, model: str, outcome: str) -> None:
        if self.enabled:
            self._counter(m.COMPACTIONS).add(1, {"model": model, "outcome": outcome})

    def workspace_restored(self, reason: str, size: int, seconds: float) -> None:
        if self.enabled:
            labels = {"reason": reason}
            self._counter(m.WORKSPACE_RESTORES).add(1, labels)
            self._counter(m.WORKSPACE_RESTORE_BYTES).add(size, labels)
            self._histogram(m.WORKSPACE_RESTORE_DURATION).record(seconds, labels)

    def approvals_waiting(self, task_queue: str, count: int) -> None:
        if self.enabled:
            made = self._made.get(m.APPROVALS_WAITING.name)
            if made is None:
                w = m.APPROVALS_WAITING
                made = self._made[w.name] = self.meter.create_gauge(w.name, w.description, w.unit)
            gauge: MetricGauge = made
            gauge.set(count, {"task_queue": task_queue})


def client_meter(client: Client) -> MetricMeter:
    """The metric meter of the runtime ``client`` runs on (the no-op one without metrics)."""
    runtime = client.service_client.config.runtime or Runtime.default()
    return runtime.metric_meter


async def report_approvals_waiting(
    client: Client, meter: MetricMeter | None = None, *, task_queue: str, interval: float = 15.0
) -> None:
    """Every ``interval`` seconds, set the approvals-waiting gauge to the number of running runs
    on ``task_queue`` that wait for approval, counted by Temporal's visibility (it lags by a
    second or so). Runs until cancelled; a failed count is logged and tried again."""
    metrics = AgentMetrics(meter if meter is not None else client_meter(client))
    if not metrics.enabled:
        return
    query = f'{APPROVALS_WAITING_QUERY} AND TaskQueue = "{task_queue}"'
    failing = False
    while True:
        try:
            counted = await client.count_workflows(query)
        except Exception as exc:  # the server away for a moment: the gauge keeps its last value
            if not failing:
                log.warning("cannot count the runs waiting for approval: %s", exc)
            failing = True
        else:
            failing = False
            metrics.approvals_waiting(task_queue, counted.count)
        await asyncio.sleep(interval)


@contextlib.asynccontextmanager
async def approvals_waiting_reporter(
    client: Client, meter: MetricMeter | None = None, *, task_queue: str, interval: float = 15.0
) -> AsyncIterator[None]:
    """``report_approvals_waiting`` in the background while the block runs (a worker's life)."""
    task = asyncio.create_task(
        report_approvals_waiting(client, meter, task_queue=task_queue, interval=interval),
        name="approvals-waiting-reporter",
    )
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
