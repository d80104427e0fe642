"""``bench/actions.py``'s ``count_actions``: Temporal Cloud's billable actions read from histories
(each count checked against the recorded history's own events, counted here one by one); and
the server counters ``bench/server_metrics.py`` reads.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
from temporalio.api.enums.v1 import EventType
from temporalio.api.history.v1 import HistoryEvent
from temporalio.client import WorkflowHistory

from bench.actions import CATEGORIES, count_actions
from bench.runs import completed_calls
from bench.server_metrics import counters

HISTORIES = Path(__file__).parent / "histories"
E = EventType


def load(name: str) -> WorkflowHistory:
    return WorkflowHistory.from_json("recorded", (HISTORIES / name).read_text())


def by_hand(history: WorkflowHistory) -> Counter[str]:
    """The events of each billable kind, counted in a plain loop over the history."""
    seen: Counter[str] = Counter()
    last_completed = None
    marked: set[int | None] = set()
    for e in history.events:
        seen[EventType.Name(e.event_type)] += 1
        if e.event_type == E.EVENT_TYPE_WORKFLOW_TASK_COMPLETED:
            last_completed = e.event_id
        elif e.event_type == E.EVENT_TYPE_MARKER_RECORDED:
            marked.add(last_completed)  # a task's commands come right after its completion
        elif e.event_type == E.EVENT_TYPE_UPSERT_WORKFLOW_SEARCH_ATTRIBUTES:
            fields = e.upsert_workflow_search_attributes_event_attributes.search_attributes.indexed_fields
            seen["version_upserts"] += list(fields) == ["TemporalChangeVersion"]
    seen["marked_tasks"] = len(marked)
    return seen


@pytest.mark.parametrize(
    "name", ["agent_run_conversation_v5.json", "agent_run_parallel_v8.json", "agent_run_cancelled_v6.json"]
)
def test_each_category_counts_its_events(name: str) -> None:
    history = load(name)
    seen = by_hand(history)
    counts = count_actions([history])
    assert counts["workflow_started"] == seen["EVENT_TYPE_WORKFLOW_EXECUTION_STARTED"] == 1
    assert counts["activities"] == seen["EVENT_TYPE_ACTIVITY_TASK_SCHEDULED"]
    assert counts["activity_retries"] == 0  # every activity of these runs ran once
    assert counts["markers"] == seen["marked_tasks"] < seen["EVENT_TYPE_MARKER_RECORDED"]
    assert counts["timers"] == seen["EVENT_TYPE_TIMER_STARTED"]
    assert counts["signals"] == seen["EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED"]
    assert counts["updates"] == seen["EVENT_TYPE_WORKFLOW_EXECUTION_UPDATE_ACCEPTED"]
    upserts = seen["EVENT_TYPE_UPSERT_WORKFLOW_SEARCH_ATTRIBUTES"]
    assert counts["search_attribute_upserts"] == upserts - seen["version_upserts"]
    assert seen["version_upserts"] > 0  # the patches' upserts, which Cloud does not bill
    assert counts["workflow_task_heartbeats"] == counts["local_activity_retries"] == 0
    assert counts["total"] == sum(counts[c] for c in CATEGORIES)


def test_a_conversation_counted_by_hand() -> None:
    """agent_run_conversation_v5.json, read event by event: 11 activities scheduled; markers in
    3 workflow tasks (a patch; a patch and a local activity; a local activity); 2 timers; 1
    signal; 1 update; 7 upserts, 2 of them TemporalChangeVersion alone."""
    counts = count_actions([load("agent_run_conversation_v5.json")])
    assert {c: n for c, n in counts.items() if n} == {
        "workflow_started": 1,
        "activities": 11,
        "markers": 3,
        "timers": 2,
        "signals": 1,
        "updates": 1,
        "search_attribute_upserts": 5,
        "total": 24,
    }


def test_each_execution_of_a_continued_run_is_a_start() -> None:
    first, last = load("agent_run_continued_v5.json"), load("agent_run_continued_v5-last.json")
    both = count_actions([last, first])
    assert both["workflow_started"] == 2
    assert both["total"] == count_actions([first])["total"] + count_actions([last])["total"]


def test_retries_are_attempts_after_the_first() -> None:
    history = load("agent_run_conversation_v5.json")
    events = [HistoryEvent.FromString(e.SerializeToString()) for e in history.events]
    started = [e for e in events if e.event_type == E.EVENT_TYPE_ACTIVITY_TASK_STARTED]
    started[0].activity_task_started_event_attributes.attempt = 3
    completed = [e for e in events if e.event_type == E.EVENT_TYPE_WORKFLOW_TASK_COMPLETED]
    metering = completed[-1].workflow_task_completed_event_attributes.metering_metadata
    metering.nonfirst_local_activity_execution_attempts = 4
    counts = count_actions([WorkflowHistory(history.workflow_id, events)])
    assert counts["activity_retries"] == 2
    assert counts["local_activity_retries"] == 4
    assert counts["total"] == count_actions([history])["total"] + 6


def test_a_workflow_task_heartbeat_is_an_action() -> None:
    """A task completed while a local activity runs asks for the next at once: no event between."""
    kinds = [
        E.EVENT_TYPE_WORKFLOW_EXECUTION_STARTED,
        E.EVENT_TYPE_WORKFLOW_TASK_SCHEDULED,
        E.EVENT_TYPE_WORKFLOW_TASK_STARTED,
        E.EVENT_TYPE_WORKFLOW_TASK_COMPLETED,  # the heartbeat
        E.EVENT_TYPE_WORKFLOW_TASK_SCHEDULED,
        E.EVENT_TYPE_WORKFLOW_TASK_STARTED,
        E.EVENT_TYPE_WORKFLOW_TASK_COMPLETED,
        E.EVENT_TYPE_MARKER_RECORDED,
        E.EVENT_TYPE_MARKER_RECORDED,
        E.EVENT_TYPE_WORKFLOW_EXECUTION_COMPLETED,
    ]
    events = [HistoryEvent(event_id=i, event_type=kind) for i, kind in enumerate(kinds, start=1)]
    for marker in events[7:9]:
        marker.marker_recorded_event_attributes.workflow_task_completed_event_id = 7
    counts = count_actions([WorkflowHistory("synthetic", events)])
    assert {c: n for c, n in counts.items() if n} == {
        "workflow_started": 1,
        "workflow_task_heartbeats": 1,
        "markers": 1,
        "total": 3,
    }


def test_the_boundaries_are_the_completed_tool_calls() -> None:
    history = load("agent_run_parallel_v8.json")
    tools = {
        e.event_id
        for e in history.events
        if e.event_type == E.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
        and e.activity_task_scheduled_event_attributes.activity_type.name == "agent.tool_call"
    }
    done = [
        e
        for e in history.events
        if e.event_type == E.EVENT_TYPE_ACTIVITY_TASK_COMPLETED
        and e.activity_task_completed_event_attributes.scheduled_event_id in tools
    ]
    assert completed_calls([history], "agent.tool_call") == len(done) == 7


def test_a_tool_call_run_as_a_local_activity_is_a_boundary() -> None:
    """Its marker names ``agent.tool_call``: the recorded checkpoints' markers, renamed."""
    history = load("agent_run_parallel_v8.json")
    events = [HistoryEvent.FromString(e.SerializeToString()) for e in history.events]
    markers = [
        e
        for e in events
        if e.event_type == E.EVENT_TYPE_MARKER_RECORDED
        and e.marker_recorded_event_attributes.marker_name == "core_local_activity"
    ]
    for marker in markers:
        [data] = marker.marker_recorded_event_attributes.details["data"].payloads
        data.data = data.data.replace(b'"agent.checkpoint"', b'"agent.tool_call"')
    renamed = completed_calls([WorkflowHistory(history.workflow_id, events)], "agent.tool_call")
    assert markers
    assert renamed == completed_calls([history], "agent.tool_call") + len(markers)


# lines of a dev server's metrics page (CLI 1.9.1, server 1.32) after one run whose activity
# heartbeated; the frontend's request count made 7 (it was 6), to tell it from the others
METRICS_PAGE = """\
# TYPE action counter
action{action_type="command_ScheduleActivityTask",namespace="default",operation="RespondWorkflowTaskCompleted",service_name="frontend"} 1
action{action_type="grpc_RecordActivityTaskHeartbeat",namespace="default",operation="RecordActivityTaskHeartbeat",service_name="frontend"} 6
action{action_type="grpc_StartWorkflowExecution",namespace="default",operation="StartWorkflowExecution",service_name="frontend"} 1
action{action_type="grpc_StartWorkflowExecution",namespace="temporal_system",operation="StartWorkflowExecution",service_name="frontend"} 2
activity_heartbeat_count{has_details="false",namespace="default",operation="RecordActivityTaskHeartbeat",service_name="history"} 6
service_requests{namespace="default",operation="RecordActivityTaskHeartbeat",service_name="frontend"} 7
service_requests{namespace="default",operation="RecordActivityTaskHeartbeat",service_name="history"} 6
service_requests{namespace="default",operation="RecordWorkerHeartbeat",service_name="frontend"} 1
"""  # noqa: E501


def test_the_server_counters_are_read_for_one_namespace() -> None:
    assert counters(METRICS_PAGE, "default") == {
        "action:command_ScheduleActivityTask": 1,
        "action:grpc_RecordActivityTaskHeartbeat": 6,
        "action:grpc_StartWorkflowExecution": 1,
        "heartbeats": 7,
    }
