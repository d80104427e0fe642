"""``bench/step_history.py``: a tool call's completion read from a history, as an activity or as a
local activity's marker, and the step figures made of them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from google.protobuf.timestamp_pb2 import Timestamp
from temporalio.api.common.v1 import ActivityType, Payload, Payloads
from temporalio.api.enums.v1 import EventType
from temporalio.api.history.v1 import (
    ActivityTaskCompletedEventAttributes,
    ActivityTaskScheduledEventAttributes,
    HistoryEvent,
    MarkerRecordedEventAttributes,
)
from temporalio.client import WorkflowHistory

from bench.runs import completed_calls
from bench.step_history import LA_MARKER, percentile, step_figures, tool_call_times
from durable_agent.core.activity_api import TOOL_CALL

HISTORIES = Path(__file__).parent / "histories"
E = EventType
CHECKPOINT = "agent.checkpoint"


def at(seconds: float) -> Timestamp:
    return Timestamp(seconds=int(seconds), nanos=round((seconds % 1) * 1e9))


def activity(event_id: int, name: str, done_at: float) -> list[HistoryEvent]:
    scheduled = HistoryEvent(
        event_id=event_id,
        event_type=E.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED,
        event_time=at(done_at - 0.01),
        activity_task_scheduled_event_attributes=ActivityTaskScheduledEventAttributes(
            activity_type=ActivityType(name=name)
        ),
    )
    completed = HistoryEvent(
        event_id=event_id + 1,
        event_type=E.EVENT_TYPE_ACTIVITY_TASK_COMPLETED,
        event_time=at(done_at),
        activity_task_completed_event_attributes=ActivityTaskCompletedEventAttributes(
            scheduled_event_id=event_id
        ),
    )
    return [scheduled, completed]


def marker(event_id: int, name: str, done_at: float, *, result: bool = True) -> HistoryEvent:
    data = json.dumps({"seq": event_id, "attempt": 1, "activity_type": name}).encode()
    details = {"data": Payloads(payloads=[Payload(metadata={"encoding": b"json/plain"}, data=data)])}
    if result:
        details["result"] = Payloads(payloads=[Payload(metadata={"encoding": b"json/plain"}, data=b"{}")])
    return HistoryEvent(
        event_id=event_id,
        event_type=E.EVENT_TYPE_MARKER_RECORDED,
        event_time=at(done_at),
        marker_recorded_event_attributes=MarkerRecordedEventAttributes(
            marker_name=LA_MARKER, details=details
        ),
    )


def test_both_kinds_of_completion_count_and_nothing_else() -> None:
    events = [
        *activity(1, TOOL_CALL.name, 100.0),
        *activity(3, "agent.model_call", 100.05),
        marker(5, TOOL_CALL.name, 100.2),
        marker(6, CHECKPOINT, 100.21),
        marker(7, TOOL_CALL.name, 100.3, result=False),  # a failed local run: no result
        *activity(8, TOOL_CALL.name, 100.5),
    ]
    history = WorkflowHistory("wf", events)
    assert tool_call_times(history) == pytest.approx([100.0, 100.2, 100.5])
    assert tool_call_times(history, CHECKPOINT) == pytest.approx([100.21])
    figures = step_figures([[history]], wall=2.0)
    assert figures["steps"] == 3 and figures["local_steps"] == 1 and figures["steps_per_s"] == 1.5
    assert figures["p50_ms"] == pytest.approx(250.0) and figures["p99_ms"] == pytest.approx(299.0)


@pytest.mark.parametrize("name", ["agent_run_conversation_v5.json", "agent_run_parallel_v8.json"])
def test_recorded_runs_agree_with_the_activity_count(name: str) -> None:
    history = WorkflowHistory.from_json("recorded", (HISTORIES / name).read_text())
    assert len(tool_call_times(history)) == completed_calls([history], TOOL_CALL.name) > 0
    local_checkpoints = [
        e
        for e in history.events
        if e.marker_recorded_event_attributes.marker_name == LA_MARKER
        and CHECKPOINT.encode() in e.marker_recorded_event_attributes.details["data"].payloads[0].data
    ]
    assert len(tool_call_times(history, CHECKPOINT)) == len(local_checkpoints)


def test_percentile_of_few_values() -> None:
    assert percentile([], 50) is None
    assert percentile([7.0], 99) == 7.0
    assert percentile([1.0, 2.0, 3.0], 50) == 2.0
