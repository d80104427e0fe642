"""Activity tasks that a worker before linear history queued run on this one.

During a rolling deploy a new worker may take an activity task an old worker's
workflow scheduled. The inputs here are the ones recorded in
``tests/histories/agent_run_v1.json``, decoded as the worker decodes them:
through the pydantic data converter, to the activity's annotated input type.
"""

from __future__ import annotations

import base64
import json
import typing
from collections.abc import Callable
from pathlib import Path
from typing import Any

from temporalio.api.common.v1 import Payload
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.testing import ActivityEnvironment

from durable_agent.activities import AgentActivities
from durable_agent.activities.store import MemorySessionStore
from durable_agent.core.legacy_shapes import (
    LegacyExportInput,
    LegacyFinishRunInput,
    LegacySaveCheckpointInput,
)
from durable_agent.core.models import ModelResponse
from tests.helpers import RecordingSink, final, scripted_config

HISTORY = Path(__file__).parent / "histories" / "agent_run_v1.json"


def recorded_inputs(activity_type: str) -> list[Payload]:
    out = []
    for event in json.loads(HISTORY.read_text())["events"]:
        scheduled = event.get("activityTaskScheduledEventAttributes")
        if scheduled and scheduled["activityType"]["name"] == activity_type:
            payload = scheduled["input"]["payloads"][0]
            metadata = {k: base64.b64decode(v) for k, v in payload["metadata"].items()}
            out.append(Payload(metadata=metadata, data=base64.b64decode(payload["data"])))
    assert out, f"no {activity_type} in {HISTORY.name}"
    return out


def decoded(method: Callable[..., Any], payload: Payload) -> Any:
    """The input as a worker decodes it for ``method``: to its annotated parameter type."""
    hint = typing.get_type_hints(method)["inp"]
    return pydantic_data_converter.payload_converter.from_payloads([payload], [hint])[0]


async def test_activity_tasks_queued_by_a_pre_linear_worker_run_on_this_one(tmp_path: Path) -> None:
    store, sink = MemorySessionStore(), RecordingSink()
    config = scripted_config(tmp_path, [final(f"answer {i}") for i in range(10)])
    acts = AgentActivities(config, store=store, sinks={"local": sink})
    env = ActivityEnvironment()
    # the model is given the conversation itself, as before
    for payload in recorded_inputs("agent.model_call"):
        response = await env.run(acts.model_calls.model_call, decoded(acts.model_calls.model_call, payload))
        assert isinstance(response, ModelResponse) and response.message.text().startswith("answer")
    # a whole checkpoint: nothing to write; the workflow sends its log when it next reads it
    for payload in recorded_inputs("agent.save_checkpoint"):
        inp = decoded(acts.run_logs.save_checkpoint, payload)
        assert isinstance(inp, LegacySaveCheckpointInput)
        await env.run(acts.run_logs.save_checkpoint, inp)
    # an export the old workflow built: validated and delivered; its descriptor is the result.
    # (These exports predate fields v1 has gained since, with defaults: they must still open.)
    for payload in recorded_inputs("agent.export_checkpoint"):
        inp = decoded(acts.run_logs.export_checkpoint, payload)
        assert isinstance(inp, LegacyExportInput)
        descriptor = await env.run(acts.run_logs.export_checkpoint, inp)
        assert descriptor == inp.export.descriptor == sink.exports[-1].descriptor
    assert len(sink.exports) == 4
    [payload] = recorded_inputs("agent.finish_run")
    inp = decoded(acts.run_logs.finish_run, payload)
    assert isinstance(inp, LegacyFinishRunInput)
    await env.run(acts.run_logs.finish_run, inp)
    assert await store.load_run_records(inp.record.snapshot.session_id) == [inp.record]
