"""The ``durable-agent`` command line, run the way a user runs it: as a separate process.

Every command talks to the session's real Temporal dev server (``TEMPORAL_ADDRESS``
points the subprocess at it). Runs that need a worker get one in this process,
so each subprocess is awaited without blocking the event loop that worker needs.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import subprocess
import sys
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from temporalio.client import Client
from temporalio.service import RPCError, RPCStatusCode

from durable_agent.activities import AgentActivities
from durable_agent.client import follow_events, run_result
from durable_agent.core.events import CheckpointExportedEvent, EndEvent, EventRecord
from durable_agent.core.run_api import AgentRunResult, RunStatusView
from tests.helpers import final, read_call, running_worker, scripted_config, start, until, workspace_with

DEMO_FINAL_TEXT = "does not guard against a zero divisor"


@dataclass
class Completed:
    code: int
    out: str
    err: str


def cli_env(client: Client, queue: str | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "AGENT_CONFIG"}
    env["TEMPORAL_ADDRESS"] = client.service_client.config.target_host
    env["TEMPORAL_NAMESPACE"] = client.namespace
    env["AGENT_TASK_QUEUE"] = queue or f"cli-test-{uuid.uuid4().hex[:10]}"
    env["PYTHONIOENCODING"] = "utf-8"
    return env


async def cli(
    *args: str, client: Client, cwd: Path, queue: str | None = None, timeout: float = 60
) -> Completed:
    """Run ``durable-agent ARGS`` in a subprocess and collect what it printed."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "durable_agent.cli",
        *args,
        cwd=cwd,
        env=cli_env(client, queue),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        out, err = await asyncio.wait_for(proc.communicate(), timeout)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        raise
    assert proc.returncode is not None
    return Completed(proc.returncode, out.decode(), err.decode())


@dataclass
class DemoRun:
    folder: Path
    done: Completed


@pytest.fixture(scope="module")
async def demo(temporal_client: Client, tmp_path_factory: pytest.TempPathFactory) -> DemoRun:
    """``durable-agent demo --exit`` once, in a fresh folder, with the built-in config."""
    folder = tmp_path_factory.mktemp("demo")
    done = await cli("demo", "--exit", client=temporal_client, cwd=folder)
    return DemoRun(folder, done)


def export_files(folder: Path) -> list[Path]:
    return sorted((folder / ".agent" / "exports").rglob("turn-*.json"))


async def test_demo_runs_end_to_end_and_its_exports_verify(demo: DemoRun, client: Client) -> None:
    done = demo.done
    assert done.code == 0, done.out + done.err
    # The server was already reachable, so the demo must not start one of its own.
    assert "starting the Temporal dev server" not in done.out
    assert "Result: completed" in done.out
    assert DEMO_FINAL_TEXT in done.out
    for turn in (1, 2, 3):
        assert re.search(rf"✓ export turn {turn} acknowledged sha256:[0-9a-f]{{16}}…", done.out), done.out
    assert "→ read README.md" in done.out
    assert "→ read src/calc.py" in done.out
    assert "← ok (" in done.out
    assert (demo.folder / ".agent" / "demo-workspace" / "src" / "calc.py").is_file()

    files = export_files(demo.folder)
    assert len(files) == 3
    assert f"exports:  {files[0].parent}" in done.out
    # Each acknowledged digest printed in the result is the digest of a file on disk.
    for file in files:
        digest = json.loads(file.read_text())["descriptor"]["content_digest"]
        assert digest in done.out

    workflow_id = re.search(r"durable-agent status (\S+)", done.out)
    assert workflow_id is not None
    handle = client.get_workflow_handle(workflow_id.group(1), result_type=AgentRunResult)
    result = await handle.result()
    assert result.status == "completed"
    assert len(result.exports) == 3

    verified = await cli("verify", *map(str, files), client=client, cwd=demo.folder)
    assert verified.code == 0, verified.out + verified.err
    assert verified.out.count("OK ") == 3
    assert "turn 3" in verified.out


async def test_verify_names_the_typed_error_of_a_tampered_export(
    demo: DemoRun, client: Client, tmp_path: Path
) -> None:
    manifest = export_files(demo.folder)[0]
    # the sink holds a manifest and parts; `pack` writes the export as one portable file
    original = tmp_path / "portable.json"
    packed = await cli("pack", str(manifest), "-o", str(original), client=client, cwd=tmp_path)
    assert packed.code == 0, packed.out + packed.err
    assert f"wrote {original}" in packed.out
    document: dict[str, Any] = json.loads(original.read_text())
    assert set(document) == {"descriptor", "content"}
    assert document["descriptor"] == json.loads(manifest.read_text())["descriptor"]

    drifted = tmp_path / "content-drift.json"
    changed = {**document, "content": document["content"].replace("calc", "calx", 1)}
    assert changed["content"] != document["content"]
    drifted.write_text(json.dumps(changed))

    relabelled = tmp_path / "descriptor.json"
    descriptor = {**document["descriptor"], "turn": document["descriptor"]["turn"] + 1}
    relabelled.write_text(json.dumps({**document, "descriptor": descriptor}))

    garbage = tmp_path / "garbage.json"
    garbage.write_text("not an export")

    # a part of the sink's copy damaged on disk
    damaged = tmp_path / "sink"
    shutil.copytree(manifest.parent, damaged)
    for part in (damaged / "parts").iterdir():
        part.write_bytes(part.read_bytes().replace(b"calc", b"calx"))
    broken = damaged / export_files(demo.folder)[-1].name

    done = await cli(
        "verify",
        *(str(f) for f in (manifest, original, drifted, relabelled, garbage, broken)),
        client=client,
        cwd=tmp_path,
    )
    assert done.code == 1
    assert f"OK {manifest}" in done.out
    assert f"OK {original}" in done.out
    assert f"FAILED {broken}: ManifestError: part" in done.out, done.out
    assert f"FAILED {drifted}: ContentDrift:" in done.out
    assert f"FAILED {relabelled}: InvalidDescriptor:" in done.out
    assert f"FAILED {garbage}: EncodingError:" in done.out


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--max-tool-rounds", "0"], "max_tool_rounds: Input should be greater than or equal to 1"),
        (["--model", "no-slash"], 'model must look like "provider/model"'),
        (["--allow", "read("], "invalid permission rule 'read('"),
    ],
)
async def test_run_refuses_invalid_input_before_starting_anything(
    client: Client, tmp_path: Path, args: list[str], message: str
) -> None:
    workflow_id = f"cli-invalid-{uuid.uuid4().hex[:10]}"
    done = await cli("run", "--prompt", "hello", "--id", workflow_id, *args, client=client, cwd=tmp_path)
    assert done.code == 2, done.out + done.err
    assert "invalid run input" in done.err
    assert message in done.err
    with pytest.raises(RPCError) as raised:
        await client.get_workflow_handle(workflow_id).describe()
    assert raised.value.status == RPCStatusCode.NOT_FOUND


async def test_status_and_cancel_of_a_run_in_flight(client: Client, tmp_path: Path) -> None:
    ws = workspace_with(tmp_path, {"a.txt": "evidence\n"})
    # the slow step is cancelled long before it ends: a loaded machine still finds the run in it
    slow = {"text": "still thinking", "delay_ms": 60000}
    config = scripted_config(tmp_path, [read_call("c1", "a.txt"), slow, final()])
    async with running_worker(client, AgentActivities(config)) as queue:
        handle = await start(client, queue, ws)
        # Wait for the first boundary, so the run is in its slow model call.
        async for record in follow_events(handle):
            if isinstance(record.event, CheckpointExportedEvent):
                break

        as_json = await cli("status", handle.id, "--json", client=client, cwd=tmp_path)
        assert as_json.code == 0, as_json.err
        view = RunStatusView.model_validate_json(as_json.out)
        assert (view.status, view.turn, view.exports_delivered) == ("executing", 1, 1)
        assert not view.cancel_requested

        readable = await cli("status", handle.id, client=client, cwd=tmp_path)
        assert readable.code == 0, readable.err
        assert re.search(r"^status:\s+executing$", readable.out, re.MULTILINE)
        assert re.search(r"^exports delivered:\s+1$", readable.out, re.MULTILINE)

        cancelled = await cli(
            "cancel", handle.id, "--reason", "stopped from the CLI", client=client, cwd=tmp_path
        )
        assert cancelled.code == 0, cancelled.err
        result = await asyncio.wait_for(run_result(client, handle.id), 20)
        assert result.status == "cancelled"
        assert result.error == "stopped from the CLI"

        printed = await cli("result", handle.id, client=client, cwd=tmp_path)
        assert printed.code == 1
        assert AgentRunResult.model_validate_json(printed.out).status == "cancelled"

        events = await cli("events", handle.id, client=client, cwd=tmp_path)
        assert events.code == 0, events.err
        records = [EventRecord.model_validate_json(line) for line in events.out.splitlines()]
        assert [r.sequence for r in records] == list(range(1, len(records) + 1))
        assert isinstance(records[-1].event, EndEvent)
        assert records[-1].event.status == "cancelled"


async def test_run_follows_a_run_with_its_own_permission_rules(client: Client, tmp_path: Path) -> None:
    ws = workspace_with(tmp_path, {"a.txt": "evidence\n", "secret.txt": "do not read\n"})
    config = scripted_config(
        tmp_path, [read_call("c1", "a.txt"), read_call("c2", "secret.txt"), final("done reading")]
    )
    async with running_worker(client, AgentActivities(config)) as queue:
        done = await cli(
            "run",
            "--prompt",
            "read what you may",
            "--workspace",
            str(ws),
            "--session-id",
            "cli-session",
            "--allow",
            "read(*)",
            "--deny",
            "read(secret*)",
            client=client,
            cwd=tmp_path,
            queue=queue,
        )
    assert done.code == 0, done.out + done.err
    assert "→ read a.txt" in done.out
    assert "← ok (1 line)" in done.out
    assert "⊘ read: permission denied: read secret.txt" in done.out
    assert "✓ export turn 2 acknowledged" in done.out
    assert "Result: completed" in done.out
    assert "session: cli-session" in done.out
    assert "done reading" in done.out


async def test_status_of_an_unknown_workflow_is_a_clear_error(client: Client, tmp_path: Path) -> None:
    done = await cli("status", f"no-such-run-{uuid.uuid4().hex[:8]}", client=client, cwd=tmp_path)
    assert done.code == 1
    assert done.err.startswith("durable-agent: status:")
    assert "Traceback" not in done.err


async def test_approvals_are_listed_approved_and_denied_from_the_cli(client: Client, tmp_path: Path) -> None:
    ws = workspace_with(tmp_path, {"a.txt": "alpha\n"})
    config = scripted_config(
        tmp_path,
        [
            {"tool_calls": [{"id": "l1", "name": "ls", "input": {"path": "."}}]},
            {"tool_calls": [{"id": "l2", "name": "ls", "input": {"path": "."}}]},
            final("both decided"),
        ],
        permissions={"ask": ["ls"], "default": "deny"},
    )

    async def listed(*args: str, call_id: str) -> str:
        outs: list[str] = []

        async def listing() -> str | None:  # the listing of every run goes through visibility, which may lag
            done = await cli("approvals", *args, client=client, cwd=tmp_path)
            outs.append(done.out + done.err)
            return outs[-1] if call_id in outs[-1] else None

        return await until(lambda: f"{call_id} to be listed: {outs[-1:]}", listing, 30, interval=0.1)

    async with running_worker(client, AgentActivities(config)) as queue:
        handle = await start(client, queue, ws, "list twice")
        for call_id, verb in (("l1", "approve"), ("l2", "deny")):
            assert f'{handle.id}  {call_id}  ls .  {{"path": "."}}' in await listed(
                handle.id, call_id=call_id
            )
            assert f"{handle.id}  {call_id}" in await listed(call_id=call_id)  # every waiting run
            decided = await cli(verb, handle.id, call_id, "--reason", "by cli", client=client, cwd=tmp_path)
            assert decided.code == 0, decided.err
            assert decided.out.startswith("approved" if verb == "approve" else "denied")
            if call_id == "l1":
                await listed(handle.id, call_id="l2")
                again = await cli("approve", handle.id, "l1", client=client, cwd=tmp_path)
                assert again.code == 1 and "already been decided" in again.out
        result = await handle.result()
        events = [r.event for r in await handle.query("events", 0, result_type=list[EventRecord])]
    assert result.status == "completed" and result.text == "both decided"
    decisions = [(e.id, e.approved, e.reason) for e in events if e.type == "confirmation_received"]
    assert decisions == [("l1", True, "by cli"), ("l2", False, "by cli")]


async def test_resume_an_export_file_from_the_cli(client: Client, tmp_path: Path) -> None:
    ws = workspace_with(tmp_path, {"a.txt": "alpha\n", "b.txt": "beta\n"})
    responses = [read_call("r1", "a.txt"), read_call("r2", "b.txt"), final("both read")]
    config = scripted_config(tmp_path, responses)
    async with running_worker(client, AgentActivities(config)) as queue:
        first = await (await start(client, queue, ws, "read both")).result()
        [turn1, _] = sorted((tmp_path / "exports").rglob("turn-*.json"))
        resumed = await cli(
            "resume", str(turn1), "--workspace", str(ws), client=client, cwd=tmp_path, queue=queue
        )
        portable = tmp_path / "portable.json"
        assert (await cli("pack", str(turn1), "-o", str(portable), client=client, cwd=tmp_path)).code == 0
        tampered = tmp_path / "tampered.json"
        tampered.write_text(portable.read_text().replace("alpha", "ALPHA"))
        refused = await cli("resume", str(tampered), client=client, cwd=tmp_path, queue=queue)
    assert first.status == "completed"
    assert resumed.code == 0, resumed.err
    assert "→ read b.txt" in resumed.out and "both read" in resumed.out
    assert refused.code == 2 and "ContentDrift" in refused.err


def test_a_reader_that_stops_reading_ends_the_command_quietly(tmp_path: Path) -> None:
    """``durable-agent … | head``: no traceback when the pipe closes."""
    from durable_agent.activities.sink_files import whole_document
    from durable_agent.conformance import sample_export

    export = tmp_path / "export.json"
    export.write_bytes(whole_document(sample_export(1)))
    proc = subprocess.Popen(
        [sys.executable, "-m", "durable_agent.cli", "verify", *[str(export)] * 3000],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=tmp_path,
    )
    assert proc.stdout is not None and proc.stderr is not None
    first = proc.stdout.readline()
    proc.stdout.close()  # as `head -1` does
    errors = proc.stderr.read()
    assert proc.wait(60) == 0
    assert first.startswith(b"OK ")
    assert errors == b"", errors.decode(errors="replace")
