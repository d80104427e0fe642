"""A run started without a trace context (``temporal workflow execute``, the UI, a schedule) is one
trace too: its workflow spans, activities and calls share a trace made from the run's ids, the
same after the run is replayed on another worker."""

from __future__ import annotations

import asyncio
import json
import subprocess
from pathlib import Path

from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from temporalio.client import Client

from durable_agent.activities import AgentActivities
from durable_agent.core.activity_api import MODEL_CALL, TOOL_CALL
from durable_agent.core.run_api import WORKFLOW_TYPE, AgentRunInput, AgentRunResult
from durable_agent.devserver import temporal_binary
from durable_agent.telemetry import run_trace_context
from durable_agent.worker import build_worker
from tests.helpers import (
    RecordingSink,
    awaiting_approval,
    final,
    read_call,
    scripted_config,
    start,
    tool_call,
    workspace_with,
)
from tests.test_approvals import decide
from tests.test_telemetry import named, one, traced_client

PERMISSIONS = {"allow": ["read(a.txt)"], "ask": ["ls"], "default": "deny"}


def spans_provider() -> tuple[TracerProvider, InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider, exporter


def assert_one_trace(spans: list[ReadableSpan], workflow_id: str, first_run_id: str) -> None:
    trace_id, parent_span_id = run_trace_context(workflow_id, first_run_id)
    assert not named(spans, "StartWorkflow:AgentRun")  # nobody traced the start
    workflow = one(spans, "RunWorkflow:AgentRun")
    assert workflow.parent is not None and workflow.parent.span_id == parent_span_id
    for span in spans:
        assert span.context.trace_id == trace_id, (span.name, f"{span.context.trace_id:032x}")


async def test_a_run_started_by_an_untraced_client_is_one_trace_across_a_replay(
    client: Client, tmp_path: Path
) -> None:
    provider, exporter = spans_provider()
    traced = traced_client(client, provider)  # the worker's client traces; the starter does not
    config = scripted_config(
        tmp_path,
        [read_call("r1", "a.txt"), tool_call("l1", "ls", path="."), final("done")],
        permissions=PERMISSIONS,
    )
    ws = workspace_with(tmp_path, {"a.txt": "alpha\n"})
    queue = f"untraced-{tmp_path.name[-12:]}"

    def activities() -> AgentActivities:
        return AgentActivities(config, sinks={"local": RecordingSink()}, tracer_provider=provider)

    async with build_worker(traced, activities(), queue):
        handle = await start(client, queue, ws)
        await awaiting_approval(handle)
    # a new worker (an empty cache): the run is replayed from its history, then goes on
    async with build_worker(traced, activities(), queue):
        await decide(handle, "l1", True)
        result = await handle.result()
    assert result.status == "completed", result.error
    provider.shutdown()
    spans = list(exporter.get_finished_spans())
    description = await handle.describe()
    assert_one_trace(spans, handle.id, description.run_id)
    # the calls on either side of the replay are in it
    assert len(named(spans, f"RunActivity:{MODEL_CALL.name}")) == 3
    assert len(named(spans, f"RunActivity:{TOOL_CALL.name}")) == 2
    assert {s.name for s in spans} >= {"chat static", "execute_tool read", "execute_tool ls"}
    assert len(named(spans, "RunWorkflow:AgentRun")) == 1  # made once, not again on replay


async def test_a_run_started_with_the_temporal_cli_is_one_trace(client: Client, tmp_path: Path) -> None:
    """``temporal workflow execute``, as from a shell or the UI: no trace context at all."""
    provider, exporter = spans_provider()
    traced = traced_client(client, provider)
    config = scripted_config(tmp_path, [read_call("r1", "a.txt"), final("done")])
    ws = workspace_with(tmp_path, {"a.txt": "alpha\n"})
    queue = f"cli-{tmp_path.name[-12:]}"
    workflow_id = f"cli-traced-{tmp_path.name[-12:]}"
    run = AgentRunInput(prompt="read a.txt", workspace=str(ws))
    async with build_worker(traced, AgentActivities(config, tracer_provider=provider), queue):
        done = await asyncio.to_thread(
            subprocess.run,
            [
                temporal_binary(),
                *("workflow", "execute", "--address", client.service_client.config.target_host),
                *("--namespace", client.namespace, "--task-queue", queue, "--type", WORKFLOW_TYPE),
                *("--workflow-id", workflow_id, "--input", json.dumps(run.model_dump(mode="json"))),
            ],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, done.stdout + done.stderr
        handle = client.get_workflow_handle(workflow_id, result_type=AgentRunResult)
        result = await handle.result()
    assert result.status == "completed", result.error
    provider.shutdown()
    description = await handle.describe()
    assert_one_trace(list(exporter.get_finished_spans()), workflow_id, description.run_id)
