"""Resume anywhere: a new run from an export's logical resume, on another server."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError
from temporalio.api.history.v1 import History
from temporalio.client import Client, WorkflowFailureError
from temporalio.service import RPCError

from durable_agent.activities import AgentActivities
from durable_agent.activities.providers import build_providers
from durable_agent.activities.sinks import read_export_file
from durable_agent.activities.tools import builtin_tools
from durable_agent.client import ensure_search_attributes, resume_run
from durable_agent.core.events import RunStartEvent, ToolEndEvent
from durable_agent.core.export import SessionCheckpointExportV1
from durable_agent.core.run_api import WORKFLOW_TYPE, AgentRunInput, AgentRunResult
from durable_agent.devserver import start_ephemeral_server
from tests.helpers import (
    RecordingProvider,
    RecordingSink,
    final,
    read_call,
    read_cap_text,
    running_worker,
    scripted_config,
    start,
    workspace_with,
)

RESPONSES: list[dict[str, Any]] = [read_call("r1", "a.txt"), read_call("r2", "b.txt"), final("both read")]


async def first_export(
    client: Client, tmp_path: Path, responses: list[dict[str, Any]]
) -> SessionCheckpointExportV1:
    ws = workspace_with(tmp_path, {"a.txt": "alpha\n", "b.txt": "beta\n"})
    config = scripted_config(tmp_path, responses)
    sink = RecordingSink()
    async with running_worker(client, AgentActivities(config, sinks={"local": sink})) as queue:
        result = await (await start(client, queue, ws, "read a.txt and b.txt", session_id="origin")).result()
    assert result.status == "completed"
    return sink.exports[0]


async def test_an_export_from_one_server_resumes_on_another(client: Client, tmp_path: Path) -> None:
    export = await first_export(client, tmp_path, RESPONSES)
    source = export.open()
    # a second, separate Temporal server: another cluster as far as the run can tell
    other = await start_ephemeral_server()
    try:
        await ensure_search_attributes(other.client)
        config = scripted_config(tmp_path, RESPONSES)
        model = RecordingProvider(build_providers(config)["scripted"])
        sink = RecordingSink()
        acts = AgentActivities(config, providers={"scripted": model}, sinks={"local": sink})
        async with running_worker(other.client, acts) as queue:
            handle = await resume_run(
                other.client, export, queue=queue, workspace=str(tmp_path / "workspace")
            )
            result = await handle.result()
    finally:
        await other.shutdown()
    assert result.status == "completed" and result.text == "both read"
    assert model.seen[0] == source.logical_resume.messages  # the model sees the same conversation
    assert result.run_id != source.logical_resume.run_id and result.session_id != "origin"
    assert result.tool_calls_count == 1 and [e.turn for e in result.exports] == [1]  # a new series
    resumed = sink.exports[0].open()
    run = resumed.source_run()
    lineage = run.snapshot.resumed_from
    assert lineage is not None
    assert (lineage.run_id, lineage.turn) == (source.logical_resume.run_id, 1)
    assert lineage.content_digest == export.descriptor.content_digest
    start_event = run.events[0].event
    assert isinstance(start_event, RunStartEvent) and export.descriptor.content_digest in (
        start_event.resumed_from or ""
    )
    assert run.snapshot.prompt == "read a.txt and b.txt"
    # the conversation goes on: the old tool result, then the new one
    results = [
        b.tool_use_id for m in resumed.logical_resume.messages for b in m.content if b.type == "tool_result"
    ]
    assert results == ["r1", "r2"]


async def test_a_resume_between_two_calls_of_one_step_makes_the_remaining_call_first(
    client: Client, tmp_path: Path
) -> None:
    both = {"tool_calls": [*read_call("r1", "a.txt")["tool_calls"], *read_call("r2", "b.txt")["tool_calls"]]}
    export = await first_export(client, tmp_path, [both, final("both read")])
    assert export.descriptor.turn == 1  # after r1, before r2
    config = scripted_config(tmp_path, [both, final("both read")])
    model = RecordingProvider(build_providers(config)["scripted"])
    sink = RecordingSink()
    acts = AgentActivities(config, providers={"scripted": model}, sinks={"local": sink})
    async with running_worker(client, acts) as queue:
        handle = await resume_run(client, export, queue=queue, workspace=str(tmp_path / "workspace"))
        result = await handle.result()
    assert result.status == "completed" and result.text == "both read"
    assert len(model.seen) == 1  # no model call before r2 ran
    assert sink.exports, result
    events = [r.event for r in sink.exports[0].open().source_run().events]
    assert [e.id for e in events if isinstance(e, ToolEndEvent)] == ["r2"]
    [last_tool_results] = [m for m in model.seen[0] if m.role == "user"][-1:]
    assert [b.tool_use_id for b in last_tool_results.content] == ["r1", "r2"]  # type: ignore[union-attr]


async def test_a_resume_where_tools_or_rules_differ_is_refused_unless_forced(
    client: Client, tmp_path: Path
) -> None:
    export = await first_export(client, tmp_path, RESPONSES)
    config = scripted_config(tmp_path, RESPONSES)
    wider = {"allow": ["read(*)", "ls(*)"], "default": "deny"}
    async with running_worker(client, AgentActivities(config)) as queue:
        handle = await resume_run(
            client, export, queue=queue, workspace=str(tmp_path / "workspace"), permissions=wider
        )
        with pytest.raises(WorkflowFailureError) as refused:
            await handle.result()
        forced = await resume_run(
            client,
            export,
            queue=queue,
            workspace=str(tmp_path / "workspace"),
            permissions=wider,
            force_resume=True,
        )
        result = await forced.result()
    message = str(refused.value.cause)
    assert "capability binding differs" in message
    assert "permissions.allow was ('read(*)',), here ('read(*)', 'ls(*)')" in message
    assert result.status == "completed"


async def test_a_resume_on_a_worker_with_more_tools_keeps_the_checkpoints_tools(
    client: Client, tmp_path: Path
) -> None:
    # the export of a worker that had only `read` (a release before the newer built-in tools)
    ws = workspace_with(tmp_path, {"a.txt": "alpha\n", "b.txt": "beta\n"})
    config = scripted_config(tmp_path, RESPONSES)
    sink = RecordingSink()
    only_read = {"read": builtin_tools()["read"]}
    async with running_worker(
        client, AgentActivities(config, tools=only_read, sinks={"local": sink})
    ) as queue:
        await (await start(client, queue, ws, "read a.txt and b.txt", session_id="older")).result()
    export = sink.exports[0]
    assert export.open().logical_resume.capability_binding.tools == ("read",)

    resumed, forced = RecordingSink(), RecordingSink()
    async with running_worker(client, AgentActivities(config, sinks={"local": resumed})) as queue:
        # not refused: the resumed run is offered the checkpoint's tools, not those added since
        result = await (await resume_run(client, export, queue=queue, workspace=str(ws))).result()
    assert result.status == "completed", result.error
    assert resumed.exports[0].open().logical_resume.capability_binding.tools == ("read",)
    config = scripted_config(tmp_path, RESPONSES)
    async with running_worker(client, AgentActivities(config, sinks={"local": forced})) as queue:
        handle = await resume_run(client, export, queue=queue, workspace=str(ws), force_resume=True)
        assert (await handle.result()).status == "completed"
    # a forced resume takes this worker's whole catalog
    assert "todo_write" in forced.exports[0].open().logical_resume.capability_binding.tools


async def test_a_tampered_export_is_refused_with_its_typed_error(client: Client, tmp_path: Path) -> None:
    export = await first_export(client, tmp_path, RESPONSES)
    tampered = SessionCheckpointExportV1.model_construct(
        descriptor=export.descriptor, content=export.content.replace("alpha", "ALPHA")
    )
    with pytest.raises(ValidationError, match="ContentDrift"):
        AgentRunInput(resume_from=tampered)
    truncated = {"descriptor": export.descriptor.model_dump(mode="json"), "content": export.content[:-40]}
    config = scripted_config(tmp_path, RESPONSES)
    async with running_worker(client, AgentActivities(config)) as queue:
        handle = await client.start_workflow(
            WORKFLOW_TYPE, {"resume_from": truncated}, id=f"tampered-{queue}", task_queue=queue,
            result_type=AgentRunResult,
        )  # fmt: skip
        with pytest.raises(WorkflowFailureError) as refused:
            await handle.result()
    assert "ContentDrift" in str(refused.value.cause)
    assert getattr(refused.value.cause, "type", None) == "InvalidRunInput"


async def test_an_export_too_large_for_an_input_resumes_from_a_file_on_the_worker(
    client: Client, tmp_path: Path
) -> None:
    # 25 reads of 100 KB: an export of 2.6 MB, more than a workflow input may hold
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "big.txt").write_text(read_cap_text())
    responses = [*(read_call(f"r{i}", "big.txt") for i in range(25)), final("read it all")]
    source_config = scripted_config(tmp_path, responses)
    async with running_worker(client, AgentActivities(source_config)) as queue:
        source = await (await start(client, queue, ws, "read big.txt", max_tool_rounds=30)).result()
    path = sorted((tmp_path / "exports").rglob("turn-000025-*.json"))[0]
    assert read_export_file(path).descriptor.size_bytes > 2_500_000
    assert path.stat().st_size < 10_000  # the sink keeps a manifest; the parts hold the rest
    exported = read_export_file(path).open()
    with pytest.raises(RPCError, match="size"):  # by value, it cannot even start
        await resume_run(client, read_export_file(path), queue="nobody", workspace=str(ws))
    config = scripted_config(tmp_path, responses)
    model = RecordingProvider(build_providers(config)["scripted"])
    sink = RecordingSink()
    acts = AgentActivities(config, providers={"scripted": model}, sinks={"local": sink})
    async with running_worker(client, acts) as queue:
        handle = await resume_run(client, path, queue=queue, workspace=str(ws))
        result = await handle.result()
    assert result.status == "completed" and result.text == "read it all", result
    assert result.run_id != source.run_id and result.tool_calls_count == 0 and result.exports == ()
    assert model.seen == [exported.logical_resume.messages]  # the model sees the same conversation
    history = await handle.fetch_history()
    assert History(events=history.events).ByteSize() < 100_000  # the conversation went file -> store
    # a run resumed from a file that goes on to a boundary exports the whole conversation
    more = [*responses[:25], read_call("r25", "big.txt"), final("one more")]
    config = scripted_config(tmp_path, more)
    async with running_worker(client, AgentActivities(config, sinks={"local": sink})) as queue:
        again = await (await resume_run(client, path, queue=queue, workspace=str(ws))).result()
    assert again.status == "completed" and again.text == "one more", again
    payload = sink.exports[-1].open()
    assert payload.logical_resume.messages[:-2] == exported.logical_resume.messages
    lineage = payload.source_run().snapshot.resumed_from
    assert lineage is not None and lineage.content_digest == exported_digest(path)


def exported_digest(path: Path) -> str:
    return read_export_file(path).descriptor.content_digest


async def test_a_missing_or_tampered_export_file_is_refused(client: Client, tmp_path: Path) -> None:
    export = await first_export(client, tmp_path, RESPONSES)
    tampered = tmp_path / "tampered.json"
    document: dict[str, Any] = {
        "descriptor": export.descriptor.model_dump(mode="json"),
        "content": export.content,
    }
    document["content"] = document["content"].replace("alpha", "ALPHA")
    tampered.write_text(json.dumps(document))
    config = scripted_config(tmp_path, RESPONSES)
    async with running_worker(client, AgentActivities(config)) as queue:
        for path, expected in [(tmp_path / "nowhere.json", "No such file"), (tampered, "ContentDrift")]:
            handle = await resume_run(client, path, queue=queue, workspace=str(tmp_path / "workspace"))
            with pytest.raises(WorkflowFailureError) as refused:
                await handle.result()
            assert expected in str(refused.value.cause)
            assert getattr(refused.value.cause, "type", None) == "InvalidRunInput"
