"""Traces and metrics from real runs: the spans an in-memory exporter holds, and the worker's
Prometheus endpoint scraped over HTTP (``durable_agent.telemetry``)."""

from __future__ import annotations

import importlib.util
import json
import re
import socket
import subprocess
import sys
import textwrap
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from typing import Any, ClassVar

import httpx
import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind
from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter

from durable_agent.activities import AgentActivities
from durable_agent.config import ConfigError, TelemetryConfig
from durable_agent.core import metrics as m
from durable_agent.core.activity_api import MODEL_CALL, TOOL_CALL
from durable_agent.telemetry import (
    GRPC_EXPORTER,
    approvals_waiting_reporter,
    configure_tracing,
    metrics_runtime,
    span_exporter,
    tracing_interceptors,
    tracing_wanted,
)
from tests.helpers import (
    RecordingSink,
    awaiting_approval,
    final,
    read_call,
    running_worker,
    scripted_config,
    start,
    tool_call,
    until,
    workspace_with,
)
from tests.test_approvals import decide

SECRET_FILE_TEXT = "TOP-SECRET-FILE-TEXT 4711"
PROMPT = "PROMPT-MARKER: read the evidence"
ANSWER = "ANSWER-MARKER: the evidence is read"


# --- traces ---------------------------------------------------------------------------------


def traced_client(client: Client, provider: TracerProvider) -> Client:
    """The session's client (same connection) with the tracing interceptors, as ``connect`` will."""
    config = client.config()
    config["interceptors"] = tracing_interceptors(provider)
    return Client(**config)


async def traced_run(client: Client, tmp_path: Path, **extra: Any) -> tuple[list[ReadableSpan], str]:
    """One run (a read, then an answer) on a worker of a traced client; its spans and workflow id."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    traced = traced_client(client, provider)
    config = scripted_config(tmp_path, [read_call("r1", "evidence.txt"), final(ANSWER)], **extra)
    ws = workspace_with(tmp_path, {"evidence.txt": SECRET_FILE_TEXT + "\n"})
    activities = AgentActivities(config, sinks={"local": RecordingSink()}, tracer_provider=provider)
    async with running_worker(traced, activities) as queue:
        handle = await start(traced, queue, ws, PROMPT)
        result = await handle.result()
    assert result.status == "completed", result.error
    provider.shutdown()
    return list(exporter.get_finished_spans()), handle.id


def one(spans: list[ReadableSpan], name: str) -> ReadableSpan:
    found = [s for s in spans if s.name == name]
    assert len(found) == 1, f"{len(found)} spans named {name!r} in {sorted({s.name for s in spans})}"
    return found[0]


def named(spans: list[ReadableSpan], name: str) -> list[ReadableSpan]:
    return [s for s in spans if s.name == name]


def texts(spans: list[ReadableSpan]) -> list[str]:
    """Every string an attribute, an event or a status of the spans holds."""
    found: list[str] = []
    for span in spans:
        values = [*(span.attributes or {}).values()]
        for event in span.events:
            values += [*(event.attributes or {}).values()]
        values.append(span.status.description or "")
        for value in values:
            found += [str(v) for v in value] if isinstance(value, tuple) else [str(value)]
    return found


async def test_one_trace_from_the_client_through_workflow_activities_and_calls(
    client: Client, tmp_path: Path
) -> None:
    spans, workflow_id = await traced_run(client, tmp_path)
    started = one(spans, "StartWorkflow:AgentRun")
    assert started.attributes is not None and started.attributes["temporalWorkflowID"] == workflow_id
    trace_id = started.context.trace_id
    assert one(spans, "RunWorkflow:AgentRun").context.trace_id == trace_id
    model_activities = named(spans, f"RunActivity:{MODEL_CALL.name}")
    tool_activity = one(spans, f"RunActivity:{TOOL_CALL.name}")
    assert len(model_activities) == 2
    for span in spans:  # the workflow, every activity and every call: the client's one trace
        assert span.context.trace_id == trace_id, span.name

    chats = named(spans, "chat static")
    assert len(chats) == 2
    for chat in chats:
        assert chat.kind == SpanKind.CLIENT
        assert chat.parent is not None and chat.parent.span_id in {
            a.context.span_id for a in model_activities
        }
        attrs = chat.attributes or {}
        assert attrs["gen_ai.operation.name"] == "chat"
        assert attrs["gen_ai.provider.name"] == "scripted"
        assert attrs["gen_ai.request.model"] == "static"
        assert attrs["gen_ai.usage.input_tokens"] == 1 and attrs["gen_ai.usage.output_tokens"] == 1
        assert attrs["durable_agent.run.id"] and attrs["gen_ai.conversation.id"]
    reasons = sorted(str((c.attributes or {})["gen_ai.response.finish_reasons"]) for c in chats)
    assert reasons == ["('end_turn',)", "('tool_use',)"]

    tool = one(spans, "execute_tool read")
    assert tool.parent is not None and tool.parent.span_id == tool_activity.context.span_id
    attrs = tool.attributes or {}
    assert attrs["gen_ai.operation.name"] == "execute_tool"
    assert (attrs["gen_ai.tool.name"], attrs["gen_ai.tool.call.id"]) == ("read", "r1")
    assert attrs["durable_agent.tool.outcome"] == "ok" and "error.type" not in attrs

    # by default no prompt, answer or file text in any span
    everything = "\n".join(texts(spans))
    for marker in (SECRET_FILE_TEXT, "PROMPT-MARKER", "ANSWER-MARKER"):
        assert marker not in everything


async def test_capture_content_puts_the_text_in_the_spans(client: Client, tmp_path: Path) -> None:
    spans, _ = await traced_run(client, tmp_path, telemetry={"capture_content": True})
    last = max(named(spans, "chat static"), key=lambda s: s.start_time or 0)
    attrs = last.attributes or {}
    asked = json.loads(str(attrs["gen_ai.input.messages"]))
    assert asked[0] == {"role": "user", "parts": [{"type": "text", "content": PROMPT}]}
    assert SECRET_FILE_TEXT in str(attrs["gen_ai.input.messages"])
    answered = json.loads(str(attrs["gen_ai.output.messages"]))
    assert answered == [
        {"role": "assistant", "parts": [{"type": "text", "content": ANSWER}], "finish_reason": "end_turn"}
    ]
    assert "careful coding agent" in str(attrs["gen_ai.system_instructions"])
    tool = (one(spans, "execute_tool read").attributes) or {}
    assert json.loads(str(tool["gen_ai.tool.call.arguments"])) == {"file_path": "evidence.txt"}
    assert SECRET_FILE_TEXT in str(tool["gen_ai.tool.call.result"])


async def test_failed_calls_carry_their_error_type_and_no_text_by_default(
    client: Client, tmp_path: Path
) -> None:
    # the script has one answer for two steps: the second model call fails, not retried
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    traced = traced_client(client, provider)
    config = scripted_config(tmp_path, [tool_call("x1", "nope")])
    activities = AgentActivities(config, sinks={"local": RecordingSink()}, tracer_provider=provider)
    async with running_worker(traced, activities) as queue:
        result = await (await start(traced, queue, workspace_with(tmp_path, {}), PROMPT)).result()
    assert result.status == "failed"
    spans = list(exporter.get_finished_spans())
    failed = [s for s in named(spans, "chat static") if (s.attributes or {}).get("error.type")]
    assert [(s.attributes or {})["error.type"] for s in failed] == ["ProviderError"]
    assert failed[0].status.description == "ProviderError"  # the message could quote content
    # (Temporal's own activity span holds the failure's message, as the run's history does)
    ours = [s for s in spans if s.name.startswith(("chat ", "execute_tool "))]
    assert "scripted model" not in "\n".join(texts(ours))


# --- configure_tracing's rules ----------------------------------------------------------------


OTEL_VARIABLES = (
    "OTEL_EXPORTER_OTLP_ENDPOINT",
    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
    "OTEL_SDK_DISABLED",
    "OTEL_TRACES_EXPORTER",
    "OTEL_EXPORTER_OTLP_PROTOCOL",
    "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
    "OTEL_SERVICE_NAME",
    "OTEL_RESOURCE_ATTRIBUTES",
)


def test_traces_are_off_unless_an_endpoint_is_named() -> None:
    endpoint = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"}
    assert not tracing_wanted({})
    assert tracing_wanted(endpoint)
    assert tracing_wanted({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://collector:4318/v1/traces"})
    assert not tracing_wanted({**endpoint, "OTEL_SDK_DISABLED": "TRUE"})
    assert not tracing_wanted({**endpoint, "OTEL_TRACES_EXPORTER": "none"})
    assert tracing_wanted({**endpoint, "OTEL_TRACES_EXPORTER": "otlp"})
    with pytest.raises(ConfigError, match="OTLP only"):
        tracing_wanted({**endpoint, "OTEL_TRACES_EXPORTER": "zipkin"})


def test_configure_tracing_without_the_variables_installs_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    from opentelemetry import trace

    for variable in OTEL_VARIABLES:
        monkeypatch.delenv(variable, raising=False)
    assert configure_tracing(TelemetryConfig()) is False
    assert isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider)


def test_grpc_without_its_exporter_is_a_clear_error() -> None:
    if importlib.util.find_spec("opentelemetry.exporter.otlp.proto.grpc") is not None:
        pytest.skip(f"{GRPC_EXPORTER} is installed here")
    for variable in ("OTEL_EXPORTER_OTLP_PROTOCOL", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"):
        with pytest.raises(ConfigError, match="pip install opentelemetry-exporter-otlp-proto-grpc"):
            span_exporter({variable: "grpc"})
    with pytest.raises(ConfigError, match="http/json"):
        span_exporter({"OTEL_EXPORTER_OTLP_PROTOCOL": "http/json"})
    # the traces variable wins over the general one
    assert (
        type(
            span_exporter(
                {"OTEL_EXPORTER_OTLP_PROTOCOL": "grpc", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/protobuf"}
            )
        ).__name__
        == "OTLPSpanExporter"
    )


class Collector(BaseHTTPRequestHandler):
    """An OTLP/HTTP endpoint that keeps what it is sent."""

    received: ClassVar[list[tuple[str, bytes]]] = []

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        Collector.received.append((self.path, body))
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def collector() -> Iterator[str]:
    Collector.received = []
    server = HTTPServer(("127.0.0.1", 0), Collector)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


EXPORTING_PROCESS = """
from opentelemetry import trace
from durable_agent.config import TelemetryConfig
from durable_agent.telemetry import configure_tracing, shutdown_tracing

assert configure_tracing(TelemetryConfig()) is True
assert configure_tracing(TelemetryConfig()) is True  # idempotent
with trace.get_tracer("check").start_as_current_span("a-span"):
    pass
shutdown_tracing()
print("exported")
"""


def test_an_endpoint_in_the_environment_exports_spans_over_otlp_http(collector: str) -> None:
    """In a process of its own: the global provider can be set once a process."""
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    env = {k: v for k, v in __import__("os").environ.items() if k not in OTEL_VARIABLES}
    env["OTEL_EXPORTER_OTLP_ENDPOINT"] = collector
    env["OTEL_RESOURCE_ATTRIBUTES"] = "deployment.environment=test"
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(EXPORTING_PROCESS)],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0 and "exported" in done.stdout, done.stderr
    [(path, body)] = Collector.received
    assert path == "/v1/traces"
    request = ExportTraceServiceRequest.FromString(body)
    [resource_spans] = request.resource_spans
    resource = {a.key: a.value.string_value for a in resource_spans.resource.attributes}
    assert resource["service.name"] == "durable-agent"
    assert resource["deployment.environment"] == "test"
    assert [s.name for ss in resource_spans.scope_spans for s in ss.spans] == ["a-span"]


# --- metrics --------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


SAMPLE = re.compile(r"^([A-Za-z_:][A-Za-z0-9_:]*)(?:\{(.*)\})?\s+(\S+)$")
LABEL = re.compile(r'([A-Za-z_][A-Za-z0-9_]*)="((?:[^"\\]|\\.)*)"')


def parse_metrics(text: str) -> list[tuple[str, dict[str, str], float]]:
    """Prometheus's text format: (name, labels, value) a sample."""
    samples = []
    for line in text.splitlines():
        if line and not line.startswith("#"):
            match = SAMPLE.match(line)
            assert match, line
            name, labels, value = match.groups()
            samples.append((name, dict(LABEL.findall(labels or "")), float(value)))
    return samples


class Scrape:
    """The worker's endpoint, read over HTTP."""

    def __init__(self, port: int) -> None:
        self.url = f"http://127.0.0.1:{port}/metrics"
        self.samples: list[tuple[str, dict[str, str], float]] = []

    async def read(self) -> Scrape:
        async with httpx.AsyncClient() as http:
            response = await http.get(self.url, timeout=10)
        response.raise_for_status()
        self.samples = parse_metrics(response.text)
        return self

    def value(self, name: str, **labels: str) -> float:
        """The sum of the samples named ``name`` with these labels (0: none)."""
        return sum(v for n, ls, v in self.samples if n == name and labels.items() <= ls.items())

    def names(self) -> set[str]:
        return {n for n, _, _ in self.samples}


async def metrics_client(client: Client) -> tuple[Client, Scrape]:
    port = free_port()
    runtime = metrics_runtime(f"127.0.0.1:{port}")
    connected = await Client.connect(
        client.service_client.config.target_host,
        namespace=client.namespace,
        data_converter=pydantic_data_converter,
        runtime=runtime,
    )
    return connected, Scrape(port)


PERMISSIONS = {"allow": ["read(a.txt)"], "ask": ["ls"], "default": "deny"}


async def test_the_endpoint_serves_the_agents_metrics_and_temporals(client: Client, tmp_path: Path) -> None:
    metered, scrape = await metrics_client(client)
    config = scripted_config(
        tmp_path,
        [
            read_call("r1", "a.txt"),  # allowed
            read_call("r2", ".env"),  # denied by the default
            tool_call("x1", "nope"),  # no such tool
            tool_call("l1", "ls", path="."),  # asks, and is approved
            final("done"),
        ],
        permissions=PERMISSIONS,
    )
    ws = workspace_with(tmp_path, {"a.txt": "alpha\n", ".env": "TOKEN=x\n"})
    async with (
        running_worker(metered, AgentActivities(config)) as queue,
        approvals_waiting_reporter(metered, task_queue=queue, interval=0.2),
    ):
        handle = await start(metered, queue, ws)
        await awaiting_approval(handle)
        waiting = m.APPROVALS_WAITING.name

        async def gauge(expected: float) -> bool:
            return (await scrape.read()).value(waiting, task_queue=queue) == expected and any(
                n == waiting and ls.get("task_queue") == queue for n, ls, _ in scrape.samples
            )

        await until("the approvals-waiting gauge to show the run", lambda: gauge(1), 30, interval=0.2)
        await decide(handle, "l1", True)
        result = await handle.result()
        assert result.status == "completed", result.error
        await until("the approvals-waiting gauge to drop to 0", lambda: gauge(0), 30, interval=0.2)

    await until(
        "the worker's metrics of the run",
        lambda: _has_run_metrics(scrape, queue),
        20,
        interval=0.2,
    )
    on = {"task_queue": queue}
    model = {"provider": "scripted", "model": "static"}
    assert scrape.value(m.MODEL_CALLS.name, **on, **model, purpose="step", outcome="ok") == 5
    assert scrape.value(m.MODEL_TOKENS.name, **on, **model, type="input") == 5
    assert scrape.value(m.MODEL_TOKENS.name, **on, **model, type="output") == 5
    assert scrape.value(f"{m.MODEL_CALL_DURATION.name}_count", **on, **model, outcome="ok") == 5
    tools = m.TOOL_CALLS.name
    assert scrape.value(tools, **on, tool="read", outcome="ok") == 1
    assert scrape.value(tools, **on, tool="read", outcome="denied") == 1
    assert scrape.value(tools, **on, tool=m.UNKNOWN_TOOL_LABEL, outcome="unknown_tool") == 1
    assert scrape.value(tools, **on, tool="ls", outcome="ok") == 1
    assert scrape.value(tools, **on) == 4
    assert scrape.value(m.APPROVALS_REQUESTED.name, **on, tool="ls") == 1
    assert scrape.value(m.APPROVALS_DECIDED.name, **on, tool="ls", outcome="approved") == 1
    exports = f"{m.EXPORT_DURATION.name}_count"
    assert scrape.value(exports, **on, sink="local") == len(result.exports) == 4
    # the buckets this runtime gives an export (milliseconds), not the SDK's default
    buckets = {ls["le"] for n, ls, _ in scrape.samples if n == f"{m.EXPORT_DURATION.name}_bucket"}
    assert "0.005" in buckets
    # Temporal's own metrics share the endpoint, prefixed temporal_ (ours are not)
    assert scrape.value("temporal_workflow_completed", **on) >= 1
    assert scrape.value("temporal_workflow_task_execution_latency_count", **on) >= 1
    assert not any(n.startswith("temporal_durable_agent") for n in scrape.names())


async def _has_run_metrics(scrape: Scrape, queue: str) -> bool:
    await scrape.read()
    return scrape.value("temporal_workflow_completed", task_queue=queue) >= 1


async def test_export_failures_and_compactions_are_counted(client: Client, tmp_path: Path) -> None:
    from tests.test_context import Recorder, config_for, files, reads

    metered, scrape = await metrics_client(client)
    # a sink that refuses every export for good (the run goes on), and a model whose script
    # runs out at the second step (the run fails)
    config = scripted_config(tmp_path, [read_call("r1", "a.txt")])
    activities = AgentActivities(config, sinks={"local": RecordingSink(fail=True)})
    async with running_worker(metered, activities) as queue:
        failed = await (await start(metered, queue, workspace_with(tmp_path, {"a.txt": "a\n"}))).result()
    assert failed.status == "failed" and len(failed.export_failures) == 1
    model = {"task_queue": queue, "provider": "scripted", "model": "static"}
    failures = m.EXPORT_FAILURES.name
    await until(
        "the failed export's metric",
        lambda: _value_at_least(scrape, failures, 1, task_queue=queue, sink="local", reason="non_retryable"),
        20,
        interval=0.2,
    )

    # eight 20 KB reads in a 40,000-token window, summarized by the summarizer model
    summarized = tmp_path / "summarized"
    summarized.mkdir()
    config = config_for(summarized, reads(8), 40_000, summarizer=True, keep_recent=4)
    activities = AgentActivities(config, sinks={"local": RecordingSink()})
    activities.providers["scripted"] = Recorder(activities.providers["scripted"], reads=8)
    async with running_worker(metered, activities) as queue:
        result = await (await start(metered, queue, files(summarized, 8), "read every file")).result()
    assert result.status == "completed", result.error
    compactions = m.COMPACTIONS.name
    await until(
        "the compaction's metric",
        lambda: _value_at_least(scrape, compactions, 1, task_queue=queue, model="summarizer/s", outcome="ok"),
        20,
        interval=0.2,
    )
    summary_calls = scrape.value(m.MODEL_CALLS.name, task_queue=queue, provider="scripted", purpose="summary")
    assert summary_calls == scrape.value(compactions, task_queue=queue)
    assert scrape.value(m.MODEL_CALLS.name, **model, outcome="error") == 1
    assert scrape.value(m.MODEL_CALLS.name, **model, outcome="ok") == 1

    # every SDK metric the dashboard reads is one a real worker serves, under that name
    from tests.test_docker_compose import dashboard_metric_names

    served = {re.sub(r"_(bucket|sum|count)$", "", n) for n in scrape.names()}
    sdk = {n for n in dashboard_metric_names() if n.startswith("temporal_")}
    assert sdk <= served, f"the dashboard reads SDK metrics the worker does not serve: {sorted(sdk - served)}"


async def _value_at_least(scrape: Scrape, name: str, least: float, **labels: str) -> bool:
    return (await scrape.read()).value(name, **labels) >= least


def test_a_bad_or_taken_address_is_a_clear_error() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(ConfigError, match=rf"bind = '127.0.0.1:{port}'.*(in use|Address)"):
            metrics_runtime(f"127.0.0.1:{port}")
    with pytest.raises(ConfigError, match="cannot resolve"):
        metrics_runtime("no-such-host.invalid:9464")


def test_every_metric_is_documented_once() -> None:
    names = [metric.name for metric in m.METRICS]
    assert len(names) == len(set(names)) and all(n.startswith("durable_agent_") for n in names)
    readme = (Path(__file__).resolve().parent.parent / "docs" / "telemetry.md").read_text(encoding="utf-8")
    missing = [n for n in names if f"`{n}`" not in readme]
    assert not missing, f"docs/telemetry.md does not list {missing}"


def test_without_capture_content_no_exception_text_leaves_the_process() -> None:
    """Temporal's interceptor records an activity's failure whole; its text may quote content."""
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
    from opentelemetry.trace import Status, StatusCode

    from durable_agent.telemetry_export import ContentFreeExporter

    kept = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(ContentFreeExporter(kept)))
    with provider.get_tracer("t").start_as_current_span("RunActivity:agent.model_call") as span:
        span.set_attribute("temporalActivityID", "7")
        span.record_exception(ValueError("provider said: SECRET-PROMPT-TEXT"))
        span.set_status(Status(StatusCode.ERROR, "SECRET-PROMPT-TEXT"))
    [exported] = kept.get_finished_spans()
    assert "SECRET-PROMPT-TEXT" not in repr(exported.to_json())
    [event] = exported.events
    assert event.name == "exception" and dict(event.attributes or {})["exception.type"] == "ValueError"
    assert exported.status.status_code == StatusCode.ERROR
    assert dict(exported.attributes or {})["temporalActivityID"] == "7"
