"""What the history holds: no credentials, and a run that reads like a story in the UI."""

from __future__ import annotations

import base64
import contextlib
import json
from pathlib import Path
from typing import Any

import pytest
from google.protobuf.duration_pb2 import Duration
from temporalio.api.sdk.v1 import WorkflowMetadata
from temporalio.api.workflowservice.v1 import RegisterNamespaceRequest
from temporalio.client import Client, WorkflowHandle
from temporalio.service import RPCError

from durable_agent.activities import AgentActivities
from durable_agent.client import ensure_search_attributes, start_run
from durable_agent.config import ConfigError
from durable_agent.core.run_api import SA_RUN_STATUS, SA_SESSION_ID, WORKFLOW_TYPE, AgentRunInput
from durable_agent.worker import build_worker
from tests.helpers import (
    awaiting_approval,
    final,
    read_call,
    running_worker,
    scripted_config,
    start,
    until,
)

SECRET = "sk-test-7f3a9c1e-do-not-leak-4b2d"


async def test_no_credential_enters_the_history(
    client: Client, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AGENT_TEST_API_KEY", SECRET)
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "a.txt").write_text("a\n")
    config = scripted_config(tmp_path, [read_call("r1", "a.txt"), final()], api_key_env="AGENT_TEST_API_KEY")
    activities = AgentActivities(config)
    assert activities.providers["scripted"]._api_key == SECRET  # type: ignore[attr-defined]
    async with running_worker(client, activities) as queue:
        handle = await start(client, queue, ws)
        result = await handle.result()
        history = await handle.fetch_history()
    assert result.status == "completed"
    dumped = history.to_json()
    assert SECRET not in dumped
    assert "AGENT_TEST_API_KEY" not in dumped  # not even the variable's name travels
    exports = list((tmp_path / "exports").rglob("*.json"))
    assert exports and all(SECRET not in p.read_text() for p in exports)


def test_a_missing_credential_is_a_clear_error_at_worker_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("AGENT_MISSING_KEY", raising=False)
    config = scripted_config(tmp_path, [final()], api_key_env="AGENT_MISSING_KEY")
    with pytest.raises(ConfigError, match="AGENT_MISSING_KEY"):
        AgentActivities(config)


def _summaries(history_json: str) -> list[str]:
    out = []
    for event in json.loads(history_json)["events"]:
        summary = event.get("userMetadata", {}).get("summary")
        if summary:
            out.append(json.loads(base64.b64decode(summary["data"])))
    return out


async def test_the_run_reads_like_a_story_in_the_ui(client: Client, tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "evidence.txt").write_text("e\n")
    config = scripted_config(tmp_path, [read_call("r1", "evidence.txt"), final()])
    async with running_worker(client, AgentActivities(config)) as queue:
        handle = await start(
            client, queue, ws, "Read the evidence and tell me what it says", session_id="story-session"
        )
        result = await handle.result()
        history = await handle.fetch_history()
        desc = await handle.describe()
        metadata = await handle.query("__temporal_workflow_metadata", result_type=WorkflowMetadata)
        details = metadata.current_details
    summaries = _summaries(history.to_json())
    assert "model scripted/static (step 1)" in summaries
    assert "read evidence.txt" in summaries
    assert "open run log in session story-session" in summaries
    assert "checkpoint turn 1" in summaries  # the save and the export, one local activity
    digest = result.exports[0].content_digest
    assert await desc.static_summary() == "Read the evidence and tell me what it says"
    static = await desc.static_details() or ""
    assert f"**workspace:** `{ws}`" in static
    assert "worker default" not in static  # the model is the worker's choice: said below
    assert "model: scripted/static" in details
    # the UI's "current details": status, counters and the last export
    assert "**completed**" in details
    assert f"last export: `{digest}`" in details
    assert "exports 1 (failed 0)" in details
    # the session id and run status are searchable
    query = 'AgentSessionId = "story-session" AND AgentRunStatus = "completed"'

    async def listed() -> list[str]:
        return [w.id async for w in client.list_workflows(query)]

    assert await until("the visibility listing of the completed run", listed, 15, interval=0.3) == [handle.id]


async def test_the_details_say_awaiting_approval_while_a_call_waits(client: Client, tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "evidence.txt").write_text("e\n")
    config = scripted_config(
        tmp_path, [read_call("r1", "evidence.txt"), final()], permissions={"allow": [], "ask": ["read"]}
    )
    async with running_worker(client, AgentActivities(config)) as queue:
        handle = await start(client, queue, ws)
        await awaiting_approval(handle)
        waiting = await handle.query("__temporal_workflow_metadata", result_type=WorkflowMetadata)
        await handle.execute_update("approve", {"call_id": "r1", "approved": True})
        result = await handle.result()
        done = await handle.query("__temporal_workflow_metadata", result_type=WorkflowMetadata)
    assert result.status == "completed"
    assert "status: awaiting_approval" in waiting.current_details
    assert "waiting for approval of `read evidence.txt`" in waiting.current_details
    assert "status: awaiting_approval" not in done.current_details


async def test_empty_lists_in_results_are_empty_lists_not_null(client: Client, tmp_path: Path) -> None:
    """What the UI shows of a run that exported nothing: ``[]`` where a list is empty."""
    ws = tmp_path / "ws"
    ws.mkdir()
    config = scripted_config(tmp_path, [final("nothing to do")])
    async with running_worker(client, AgentActivities(config)) as queue:
        handle = await start(client, queue, ws)
        await handle.result()
        history = await handle.fetch_history()
        status = await handle.query("status")
    [completed] = [
        e.workflow_execution_completed_event_attributes
        for e in history.events
        if e.HasField("workflow_execution_completed_event_attributes")
    ]
    result = json.loads(completed.result.payloads[0].data)
    assert (result["exports"], result["export_failures"], result["persistence_failures"]) == ([], [], [])
    assert (status["pending_approvals"], status["budgets"]) == ([], [])


async def test_a_run_is_listed_as_executing_from_its_start_however_it_was_started(
    client: Client, tmp_path: Path
) -> None:
    """``start_run`` sets the search attributes at the start, and the run does not upsert them
    again (a billed action); a run started without them (``temporal workflow start``) sets them."""
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "evidence.txt").write_text("e\n")
    config = scripted_config(tmp_path, [read_call("r1", "evidence.txt"), final()])
    async with running_worker(client, AgentActivities(config)) as queue:
        ours = await start(client, queue, ws, session_id="listed-session")
        raw = await client.start_workflow(
            WORKFLOW_TYPE,
            AgentRunInput(prompt="read", workspace=str(ws)).model_dump(mode="json", exclude_none=True),
            id=f"raw-{tmp_path.name[-20:]}",
            task_queue=queue,
        )
        for handle in (ours, raw):
            await handle.result()
    session = {ours.id: "listed-session", raw.id: raw.id}
    for handle in (ours, raw):
        upserts = [
            set(e.upsert_workflow_search_attributes_event_attributes.search_attributes.indexed_fields)
            async for e in handle.fetch_history_events()
            if e.HasField("upsert_workflow_search_attributes_event_attributes")
        ]
        runs = [u for u in upserts if u != {"TemporalChangeVersion"}]
        # the start's values, then the end's status
        assert runs == (
            [{SA_RUN_STATUS}] if handle is ours else [{SA_SESSION_ID, SA_RUN_STATUS}, {SA_RUN_STATUS}]
        )
        desc = await handle.describe()
        assert desc.search_attributes.get(SA_SESSION_ID) == [session[handle.id]]
        assert desc.search_attributes.get(SA_RUN_STATUS) == ["completed"]


async def test_a_run_starts_in_a_namespace_that_does_not_know_its_search_attributes_yet(
    client: Client, tmp_path: Path
) -> None:
    """A run started before any worker registered the search attributes (a worker does as it
    starts) is started without them, and sets them itself once a worker takes it."""
    namespace = f"fresh-{tmp_path.name[-12:]}".lower().replace("_", "-")
    await client.workflow_service.register_namespace(
        RegisterNamespaceRequest(
            namespace=namespace, workflow_execution_retention_period=Duration(seconds=86400)
        )
    )
    fresh = Client(client.service_client, namespace=namespace, data_converter=client.data_converter)
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "evidence.txt").write_text("e\n")
    config = scripted_config(tmp_path, [read_call("r1", "evidence.txt"), final()])
    queue = f"fresh-{tmp_path.name[-12:]}"

    async def started() -> WorkflowHandle[Any, Any] | None:
        with contextlib.suppress(RPCError):  # the new namespace reaches every service in a moment
            return await start_run(fresh, AgentRunInput(prompt="read", workspace=str(ws)), queue=queue)
        return None

    handle = await until("the start in the new namespace", started, 30, interval=0.5)
    await ensure_search_attributes(fresh)
    async with build_worker(fresh, AgentActivities(config), queue):
        result = await handle.result()
    assert result.status == "completed", result.error
    desc = await handle.describe()
    assert desc.search_attributes.get(SA_RUN_STATUS) == ["completed"]
    assert desc.search_attributes.get(SA_SESSION_ID) == [handle.id]
