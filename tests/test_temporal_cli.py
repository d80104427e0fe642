"""Runs started, signalled and queried with Temporal's own ``temporal`` CLI, as users do."""

from __future__ import annotations

import asyncio
import json
import subprocess
import uuid
from pathlib import Path
from typing import Any

from temporalio.client import Client

from durable_agent.activities import AgentActivities
from durable_agent.client import run_result
from durable_agent.core.run_api import AgentRunResult
from durable_agent.devserver import temporal_binary
from tests.helpers import final, read_call, running_worker, scripted_config, until


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

        async def exported() -> dict[str, Any] | None:
            out = await temporal(client, "workflow", "query", "-w", wid, "--name", "status", "-o", "json")
            status: dict[str, Any] = json.loads(out)["queryResult"][0]
            return status if status["exports_delivered"] == 1 else None

        status = await until(
            "the first export, as the CLI's status query shows it", exported, 30, interval=0.1
        )
        assert status["session_id"] == "cli-session"
        await temporal(
            client, "workflow", "signal", "-w", wid, "--name", "cancel", "--input", '"from the CLI"'
        )
        result = await run_result(client, handle.id)
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

        async def ended() -> str | None:
            out = await temporal(client, "workflow", "describe", "-w", wid, "-o", "json")
            status: str = json.loads(out)["workflowExecutionInfo"]["status"]
            return status if status != "WORKFLOW_EXECUTION_STATUS_RUNNING" else None

        status = await until("the run to end", ended, 30, interval=0.1)
        shown = await temporal(client, "workflow", "show", "-w", wid)
    assert status == "WORKFLOW_EXECUTION_STATUS_FAILED"
    assert "temperature: Extra inputs are not permitted" in shown
