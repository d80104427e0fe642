"""What the operating features cost, a few seconds on one machine; run from the repository root:

    python bench/ops_cost.py

It prints:

* ``codec``: encrypting and decrypting one payload (AES-256-GCM, ``durable_agent/codec.py``)
  of 1 KB, 100 KB and 1 MB, and the bytes a payload grows by;
* ``span``: one ``execute_tool`` span of the activities' instrumentation, with no tracer
  provider (the default) and with an SDK provider exporting to memory;
* ``metrics``: recording one model call's metrics on a runtime with a Prometheus endpoint;
* ``mcp``: starting a stdio MCP server and listing its tools, then one call's median and
  95th percentile, and 20 calls at once, on the worker's one session (the SDK test server
  ``tests/mcp_servers/agent_tools.py``, and ``mcp-server-time`` when installed).
"""

from __future__ import annotations

import asyncio
import base64
import os
import socket
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from temporalio.api.common.v1 import Payload

from durable_agent.activities.mcp.connection import McpServer
from durable_agent.codec import codec_for
from durable_agent.config import CodecConfig, McpServerConfig, TelemetryConfig
from durable_agent.core.activity_api import ToolCallInput, ToolOutput
from durable_agent.telemetry import AgentMetrics, metrics_runtime
from durable_agent.telemetry_spans import ActivityTelemetry

ROOT = Path(__file__).resolve().parent.parent


def per_call_us(fn: Callable[[], object], n: int = 2000) -> float:
    started = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - started) / n * 1e6


async def codec_cost() -> None:
    os.environ["BENCH_CODEC_KEY"] = base64.b64encode(os.urandom(32)).decode()
    codec = codec_for(CodecConfig(keys={"k1": "BENCH_CODEC_KEY"}, encrypt_with="k1"))
    for size in (1_000, 100_000, 1_000_000):
        payload = Payload(metadata={"encoding": b"json/plain"}, data=os.urandom(size))
        n = 50 if size >= 1_000_000 else 500
        started = time.perf_counter()
        for _ in range(n):
            [sealed] = await codec.encode([payload])
            await codec.decode([sealed])
        ms = (time.perf_counter() - started) / n * 1000
        grown = sealed.ByteSize() - payload.ByteSize()
        print(f"codec   {size:>9,} B payload: encrypt+decrypt {ms:.3f} ms, +{grown} B")


def span_cost() -> None:
    call = ToolCallInput(run_id="r", workspace="/w", call_id="c", name="read", arguments={"file_path": "a"})
    done = ToolOutput(content="x")

    def one(telemetry: ActivityTelemetry) -> Callable[[], None]:
        def run() -> None:
            with telemetry.tool_call(call, known=True) as observed:
                observed.finished(done, known=True)

        return run

    off = ActivityTelemetry(TelemetryConfig())
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(InMemorySpanExporter()))
    on = ActivityTelemetry(TelemetryConfig(), tracer_provider=provider)
    print(f"span    execute_tool: {per_call_us(one(off)):.1f} µs without a provider, "
          f"{per_call_us(one(on)):.1f} µs exported to memory")  # fmt: skip


def metrics_cost() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    metrics = AgentMetrics(metrics_runtime(f"127.0.0.1:{port}").metric_meter)
    us = per_call_us(lambda: metrics.model_call("scripted", "m", "step", "ok", 0.5, (1000, 200)))
    print(f"metrics one model call's metrics on a Prometheus runtime: {us:.1f} µs")


async def mcp_cost(label: str, config: McpServerConfig, tool: str, arguments: dict[str, object]) -> None:
    server = McpServer("bench", config)
    try:
        started = time.perf_counter()
        await server.list_tools()
        connect = time.perf_counter() - started
        times = []
        for _ in range(100):
            started = time.perf_counter()
            await server.call_tool(tool, dict(arguments))
            times.append(time.perf_counter() - started)
        started = time.perf_counter()
        await asyncio.gather(*(server.call_tool(tool, dict(arguments)) for _ in range(20)))
        together = time.perf_counter() - started
    finally:
        await server.aclose()
    times.sort()
    print(f"mcp     {label}: start+list {connect * 1000:.0f} ms, call median "
          f"{statistics.median(times) * 1000:.2f} ms, p95 {times[94] * 1000:.2f} ms, "
          f"20 at once {together * 1000:.0f} ms")  # fmt: skip


async def main() -> None:
    await codec_cost()
    span_cost()
    metrics_cost()
    tools = McpServerConfig(command=sys.executable, args=(str(ROOT / "tests/mcp_servers/agent_tools.py"),))
    await mcp_cost("stdio agent_tools echo", tools, "echo", {"text": "x"})
    time_server = Path(sys.executable).parent / "mcp-server-time"
    if time_server.exists():
        config = McpServerConfig(command=str(time_server))
        await mcp_cost("stdio mcp-server-time", config, "get_current_time", {"timezone": "UTC"})


if __name__ == "__main__":
    asyncio.run(main())
