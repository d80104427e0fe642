"""Runs started, signalled and queried with Temporal's own ``temporal`` CLI, as users do."""

from __future__ import annotations

import asyncio
import json
import subprocess
import uuid
from pathlib import Path
from typing import Any

from temporalio.client import Client

from activities import AgentActivities
from durable_agent.devserver import temporal_binary
from durable_agent.run_io import AgentRunResult
from tests.helpers import final, read_call, running_worker, scripted_config


async def temporal(client: Client, *args: str) -> str:
    """Run ``temporal <args>`` against the test server; return its stdout."""
    address = client.service_client.config.target_host
    proc = await asyncio.create_subprocess_exec(
        temporal_binary(),
        *args,
        "--address",
        address,
        "--namespace",
        client.namespace,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    out, err = await proc.communicate()
    assert proc.returncode == 0, f"temporal {' '.join(args)}: {err.decode()}"
    return out.decode()


async def test_start_signal_and_query_with_the_temporal_cli(client: Client, tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "a.txt").write_text("alpha\n")
    config = scripted_config(tmp_path, [read_call("r1", "a.txt"), {"text": "slow", "delay_ms": 60_000}])
    wid = f"from-cli-{uuid.uuid4().hex[:8]}"
    run: dict[str, Any] = {"prompt": "read a.txt", "workspace": str(ws), "session_id": "cli-session"}
    async with running_worker(client, AgentActivities(config)) as queue:
        await temporal(
            client,
            "workflow", "start", "--type", "AgentRun", "--task-queue", queue, "--workflow-id", wid,
            "--static-summary", "read a.txt", "--input", json.dumps(run),
        )  # fmt: skip
        handle = client.get_workflow_handle(wid, result_type=AgentRunResult)
        for _ in range(100):
            status = json.loads(
                await temporal(client, "workflow", "query", "-w", wid, "--name", "status", "-o", "json")
            )
            if status["queryResult"][0]["exports_delivered"] == 1:
                break
            await asyncio.sleep(0.1)
        assert status["queryResult"][0]["session_id"] == "cli-session"
        await temporal(
            client, "workflow", "signal", "-w", wid, "--name", "cancel", "--input", '"from the CLI"'
        )
        result = await handle.result()
    assert result.status == "cancelled" and result.error == "from the CLI"
    assert [e.turn for e in result.exports] == [1]


async def test_a_raw_json_start_with_an_unknown_field_is_refused(client: Client, tmp_path: Path) -> None:
    config = scripted_config(tmp_path, [final()])
    wid = f"cli-bad-{uuid.uuid4().hex[:8]}"
    async with running_worker(client, AgentActivities(config)) as queue:
        await temporal(
            client,
            "workflow", "start", "--type", "AgentRun", "--task-queue", queue, "--workflow-id", wid,
            "--input", json.dumps({"prompt": "hi", "temperature": 2}),
        )  # fmt: skip
        out = await temporal(client, "workflow", "describe", "-w", wid, "-o", "json")
        for _ in range(200):
            if json.loads(out)["workflowExecutionInfo"]["status"] != "WORKFLOW_EXECUTION_STATUS_RUNNING":
                break
            await asyncio.sleep(0.1)
            out = await temporal(client, "workflow", "describe", "-w", wid, "-o", "json")
        shown = await temporal(client, "workflow", "show", "-w", wid)
    assert json.loads(out)["workflowExecutionInfo"]["status"] == "WORKFLOW_EXECUTION_STATUS_FAILED"
    assert "temperature: Extra inputs are not permitted" in shown
