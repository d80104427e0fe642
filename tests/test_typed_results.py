"""Typed results: a run started with an ``output_schema`` (or ``output_type``) ends when its model
calls ``final_result`` with arguments that validate; the answer is the run's ``output``.

Real Temporal, a real worker, the scripted model (``tests/helpers.py``).
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel, ValidationError
from temporalio.client import Client, WorkflowFailureError

from durable_agent.activities import AgentActivities
from durable_agent.activities.providers import TextSink, build_providers
from durable_agent.client import end_conversation, run_result, send_prompt, start_run
from durable_agent.core.activity_api import ModelCallInput
from durable_agent.core.events import (
    ErrorEvent,
    EventRecord,
    FinalResultEvent,
    ToolEndEvent,
    UserMessageEvent,
)
from durable_agent.core.models import ModelResponse, TokenUsage, ToolDefinition, ToolResultBlock
from durable_agent.core.output_schema import (
    FINAL_RESULT_TOOL,
    OutputSchemaError,
    RunOutputError,
    check_output_schema,
    output_errors,
    schema_of,
    typed_output,
)
from durable_agent.core.run_api import QUERY_EVENTS, AgentRunInput, AgentRunResult
from tests.helpers import (
    RecordingProvider,
    RecordingSink,
    final,
    read_call,
    running_worker,
    scripted_config,
    status_when,
    tool_call,
    workspace_with,
)
from tests.test_cli import cli
from tests.test_replay import replayer


class Finding(BaseModel):
    file: str
    line: int


class Report(BaseModel):
    summary: str
    findings: list[Finding]


GOOD = {"summary": "one bug", "findings": [{"file": "a.py", "line": 3}]}


def answer(call_id: str, **args: Any) -> dict[str, Any]:
    return tool_call(call_id, FINAL_RESULT_TOOL, **args)


async def events_of(handle: Any) -> list[EventRecord]:
    records: list[EventRecord] = await handle.query(QUERY_EVENTS, 0, result_type=list[EventRecord])
    return records


def tool_ends(records: list[EventRecord]) -> list[ToolEndEvent]:
    return [r.event for r in records if isinstance(r.event, ToolEndEvent)]


class ToolsSeen(RecordingProvider):
    """Keeps the tools offered at the last request, too."""

    tools: tuple[ToolDefinition, ...] = ()

    async def complete(self, call: ModelCallInput, model: str, on_text: TextSink) -> ModelResponse:
        self.tools = call.tools
        return await super().complete(call, model, on_text)


async def typed_run(
    client: Client, tmp_path: Path, responses: list[dict[str, Any]], **fields: Any
) -> tuple[AgentRunResult, list[EventRecord], RecordingSink, ToolsSeen, str]:
    """Run ``responses`` to their end with ``output_type=Report``: the result, events, sink, model
    and workflow id."""
    ws = workspace_with(tmp_path, {"a.py": "print(1 / 0)\n"})
    config = scripted_config(
        tmp_path, responses, **({"limits": fields.pop("limits")} if "limits" in fields else {})
    )
    model = ToolsSeen(build_providers(config)["scripted"])
    sink = RecordingSink()
    acts = AgentActivities(config, providers={"scripted": model}, sinks={"local": sink})
    async with running_worker(client, acts) as queue:
        run = AgentRunInput(prompt="review a.py", workspace=str(ws), **fields)
        handle = await start_run(client, run, queue=queue, output_type=Report)
        result = await run_result(client, handle.id)
        records = await events_of(handle)
    return result, records, sink, model, handle.id


# --- the schema, without a server ------------------------------------------------------------


@pytest.mark.parametrize(
    ("schema", "message"),
    [
        ({"type": "array", "items": {"type": "string"}}, '"type": "object"'),
        ({"type": "object", "properties": {"a": {"type": "strng"}}}, "not valid JSON Schema"),
        (
            {"type": "object", "properties": {"a": {"$ref": "https://example.com/a.json"}}},
            "inside the schema",
        ),
        ({"type": "object", "properties": {"a": {"$ref": "#/$defs/Missing"}}}, "names nothing"),
        ({"type": "object", "properties": {"a": {"type": "string", "pattern": "(?=x)"}}}, "RE2"),
        ({"type": "object", "patternProperties": {"^x": {}}}, "patternProperties"),
        ({"type": "object", "description": "x" * 70_000}, "bytes as JSON"),
    ],
)
def test_a_bad_schema_is_refused_with_its_reason(schema: dict[str, Any], message: str) -> None:
    with pytest.raises(OutputSchemaError, match=message):
        check_output_schema(schema)
    with pytest.raises(ValidationError) as caught:
        AgentRunInput(prompt="p", output_schema=schema)
    assert "output_schema" in str(caught.value) and message in str(caught.value)


def test_errors_are_listed_in_a_fixed_order_and_a_non_object_type_is_wrapped() -> None:
    schema = schema_of(Report)
    assert schema["type"] == "object" and "$defs" in schema
    errors = output_errors(schema, {"findings": [{"file": 1}]})
    assert errors == [
        "(top level): 'summary' is a required property",
        "findings.0.file: 1 is not of type 'string'",
        "findings.0: 'line' is a required property",
    ]
    assert output_errors(schema, GOOD) == []
    wrapped = schema_of(list[int])
    assert wrapped["required"] == ["response"]
    assert typed_output({"response": [1, 2]}, list[int]) == [1, 2]
    with pytest.raises(RunOutputError, match="not a Report"):
        typed_output({"summary": 1}, Report)


def test_runs_without_a_schema_keep_their_result_and_binding_bytes() -> None:
    result = AgentRunResult(
        session_id="s",
        run_id="r",
        status="completed",
        text="t",
        tool_calls_count=0,
        usage=TokenUsage(),
        exports=(),
        export_failures=(),
    )
    assert "output" not in result.model_dump(mode="json")
    typed = result.model_copy(update={"output": GOOD})
    assert AgentRunResult.model_validate_json(typed.model_dump_json()).output == GOOD


# --- runs ------------------------------------------------------------------------------------


async def test_a_valid_final_result_is_the_run_s_typed_answer(client: Client, tmp_path: Path) -> None:
    result, records, sink, model, wid = await typed_run(
        client, tmp_path, [read_call("r1", "a.py"), answer("f1", **GOOD)]
    )
    assert result.status == "completed" and result.output == GOOD
    assert await run_result(client, wid, output_type=Report) == Report.model_validate(GOOD)
    assert model.calls == 2
    [event] = [r.event for r in records if isinstance(r.event, FinalResultEvent)]
    assert (event.id, event.output) == ("f1", GOOD)
    assert [(e.name, e.is_error) for e in tool_ends(records)] == [("read", False), (FINAL_RESULT_TOOL, False)]
    # the final result's boundary was exported like any call's: the last export holds it
    assert [e.descriptor.turn for e in sink.exports] == [1, 2]
    last = sink.exports[-1].open()
    assert [r.event for r in last.source_run().events if isinstance(r.event, FinalResultEvent)] == [event]
    results = [b for m in last.logical_resume.messages for b in m.content if isinstance(b, ToolResultBlock)]
    assert results[-1].tool_use_id == "f1" and not results[-1].is_error
    # the tool is part of what the model was allowed to use, with the type's schema
    assert FINAL_RESULT_TOOL in last.logical_resume.capability_binding.tools
    [offered] = [t for t in model.tools if t.name == FINAL_RESULT_TOOL]
    assert offered.input_schema == schema_of(Report) and "final answer" in offered.description


async def test_invalid_arguments_are_sent_back_and_the_model_tries_again(
    client: Client, tmp_path: Path
) -> None:
    result, records, _, model, _ = await typed_run(
        client, tmp_path, [answer("f1", summary="no findings list"), answer("f2", **GOOD)]
    )
    assert result.status == "completed" and result.output == GOOD
    ends = tool_ends(records)
    assert [(e.id, e.is_error) for e in ends] == [("f1", True), ("f2", False)]
    assert "findings" in ends[0].output and "required property" in ends[0].output
    # the model's second request carried the errors as the call's tool result
    [retry] = [b for b in model.seen[1][-1].content if isinstance(b, ToolResultBlock)]
    assert retry.is_error and "'findings' is a required property" in retry.content
    assert "3 tries left" in retry.content


async def test_a_text_answer_is_told_to_call_final_result(client: Client, tmp_path: Path) -> None:
    result, records, _, model, _ = await typed_run(
        client, tmp_path, [final("here is my review"), answer("f1", **GOOD)]
    )
    assert result.status == "completed" and result.output == GOOD
    [asked] = [r.event for r in records if isinstance(r.event, UserMessageEvent)]
    assert asked.kind == "output_retry" and FINAL_RESULT_TOOL in asked.text
    assert model.seen[1][-1].role == "user" and FINAL_RESULT_TOOL in model.seen[1][-1].text()


async def test_the_run_fails_when_the_retries_are_spent(client: Client, tmp_path: Path) -> None:
    responses = [final("text"), answer("f1", summary=3), answer("f2", summary="never called")]
    result, records, _, model, wid = await typed_run(client, tmp_path, responses, max_output_retries=1)
    assert result.status == "failed" and result.output is None
    assert result.error is not None
    assert "no valid final result after 1 retries (max_output_retries=1)" in result.error
    assert "summary: 3 is not of type 'string'" in result.error
    assert model.calls == 2
    errors = [r.event.message for r in records if isinstance(r.event, ErrorEvent)]
    assert errors == [result.error]
    with pytest.raises(RunOutputError, match="ended failed: no valid final result"):
        await run_result(client, wid, output_type=Report)


async def test_the_retries_spent_count_on_across_a_continue_as_new(client: Client, tmp_path: Path) -> None:
    """A failed answer beside other calls, whose boundaries continue the run as new: the next
    failed answer is the second, past ``max_output_retries=1``, not the first again."""
    bad = answer("f1", summary=3)["tool_calls"]
    responses = [
        read_call("r1", "a.py"),
        read_call("r2", "a.py"),
        # a failed answer beside a read, whose boundary continues the run as new (past 50 events)
        {"tool_calls": [*bad, *read_call("r3", "a.py")["tool_calls"]]},
        answer("f2", summary=4),
        answer("f3", **GOOD),
    ]
    result, _, _, model, wid = await typed_run(
        client, tmp_path, responses, max_output_retries=1, limits={"continue_as_new_events": 50}
    )
    assert result.status == "failed", result
    assert "no valid final result after 1 retries" in (result.error or "")
    assert model.calls == 4
    # it did continue as new in between: the execution that failed is not the first
    first = (await client.get_workflow_handle(wid).fetch_history()).events[0]
    assert first.workflow_execution_started_event_attributes.continued_execution_run_id


async def test_a_conversation_records_each_answer_and_waits(client: Client, tmp_path: Path) -> None:
    second = {"summary": "two bugs", "findings": []}
    ws = workspace_with(tmp_path, {})
    config = scripted_config(tmp_path, [answer("f1", **GOOD), answer("f2", **second)])
    async with running_worker(client, AgentActivities(config)) as queue:
        run = AgentRunInput(prompt="review", workspace=str(ws), follow_ups=True)
        handle = await start_run(client, run, queue=queue, output_type=Report)
        waiting = await status_when(handle, lambda s: s.status == "awaiting_prompt", "the first answer")
        assert waiting.output == GOOD
        await send_prompt(handle, "look again")
        await status_when(handle, lambda s: s.output == second, "the second answer")
        await end_conversation(handle)
        assert await run_result(client, handle.id, output_type=Report) == Report.model_validate(second)


async def test_a_bad_schema_is_refused_at_the_start(client: Client, tmp_path: Path) -> None:
    with pytest.raises(ValidationError, match="output_schema"):
        AgentRunInput(prompt="p", output_schema={"type": "object", "properties": {"a": {"type": 7}}})
    # a host that sends the input as JSON, past the client's check: the run refuses it
    ws = workspace_with(tmp_path, {})
    config = scripted_config(tmp_path, [final()])
    async with running_worker(client, AgentActivities(config)) as queue:
        handle = await client.start_workflow(
            "AgentRun",
            {"prompt": "p", "workspace": str(ws), "output_schema": {"type": "array"}},
            id=f"typed-bad-{uuid.uuid4().hex[:8]}",
            task_queue=queue,
        )
        with pytest.raises(WorkflowFailureError) as caught:
            await handle.result()
    assert 'output_schema must have "type": "object"' in str(caught.value.cause)


async def test_the_cli_takes_a_schema_file_and_prints_the_answer(client: Client, tmp_path: Path) -> None:
    schema = tmp_path / "report.json"
    schema.write_text(json.dumps(Report.model_json_schema()))
    ws = workspace_with(tmp_path, {})
    config = scripted_config(tmp_path, [final("plain"), answer("f1", **GOOD)])
    async with running_worker(client, AgentActivities(config)) as queue:
        done = await cli(
            "run",
            "--prompt",
            "review",
            "--workspace",
            str(ws),
            "--output-schema",
            str(schema),
            client=client,
            cwd=tmp_path,
            queue=queue,
        )
    assert done.code == 0, done.out + done.err
    assert "» asked for final_result:" in done.out
    assert "✓ final result: " in done.out
    assert "Result: completed" in done.out
    printed = done.out.split("  output:\n", 1)[1].split("  tool calls:", 1)[0]
    assert json.loads(printed) == GOOD
    bad = tmp_path / "bad.json"
    bad.write_text('{"type": "string"}')
    refused = await cli("run", "--prompt", "x", "--output-schema", str(bad), client=client, cwd=tmp_path)
    assert refused.code == 2 and "invalid run input" in refused.err and '"type": "object"' in refused.err


async def test_calls_beside_a_valid_final_result_are_not_run(client: Client, tmp_path: Path) -> None:
    step = {
        "tool_calls": [
            {"id": "r1", "name": "read", "input": {"file_path": "a.py"}},
            {"id": "f1", "name": FINAL_RESULT_TOOL, "input": {"summary": 1}},
            {"id": "f2", "name": FINAL_RESULT_TOOL, "input": GOOD},
        ]
    }
    both = {
        "tool_calls": [
            {"id": "r2", "name": "read", "input": {"file_path": "a.py"}},
            {"id": "f3", "name": FINAL_RESULT_TOOL, "input": GOOD},
            {"id": "f4", "name": FINAL_RESULT_TOOL, "input": GOOD},
        ]
    }
    result, records, sink, _, _ = await typed_run(client, tmp_path, [step, both])
    assert result.status == "completed" and result.output == GOOD
    ends = {e.id: e for e in tool_ends(records)}
    # an invalid first final result: the step's other calls run (a second final result counts not)
    assert ends["f1"].is_error and "summary: 1 is not of type 'string'" in ends["f1"].output
    assert ends["f2"].is_error and "more than once" in ends["f2"].output
    assert not ends["r1"].is_error
    # a valid one ends the run: the step's other calls are answered, not run
    assert not ends["f3"].is_error
    assert ends["r2"].is_error and ends["r2"].output.startswith("not run")
    assert ends["f4"].is_error
    [event] = [r.event for r in records if isinstance(r.event, FinalResultEvent)]
    assert event.id == "f3"
    assert [e.descriptor.turn for e in sink.exports] == [1, 2, 3, 4, 5, 6]


async def test_a_typed_run_replays_under_the_sandbox(client: Client, tmp_path: Path) -> None:
    ws = workspace_with(tmp_path, {"a.py": "x\n"})
    responses = [final("text"), answer("f1", summary="x"), read_call("r1", "a.py"), answer("f2", **GOOD)]
    async with running_worker(client, AgentActivities(scripted_config(tmp_path, responses))) as queue:
        run = AgentRunInput(prompt="review", workspace=str(ws))
        handle = await start_run(client, run, queue=queue, output_type=Report)
        assert (await run_result(client, handle.id)).output == GOOD
        history = await handle.fetch_history()
    replay = await replayer().replay_workflow(history, raise_on_replay_failure=False)
    assert replay.replay_failure is None, replay.replay_failure
