"""Following a bench run to its end, and what its history and the server's log say about it."""

from __future__ import annotations

import asyncio
import json
import logging
import re
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

from temporalio.api.enums.v1 import EventType
from temporalio.api.history.v1 import HistoryEvent
from temporalio.client import Client, WorkflowFailureError, WorkflowHandle, WorkflowHistory
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.runtime import LogForwardingConfig, LoggingConfig, Runtime, TelemetryConfig, TelemetryFilter

from durable_agent.core.activity_api import ModelCallInput
from durable_agent.core.models import Message

# The marker a local activity's result is recorded by (sdk-core's name).
LOCAL_ACTIVITY_MARKER = "core_local_activity"

# What Temporal's history service logs (``service/history/workflow/context.go`` and
# ``common/util.go``, server 1.2x): "history size exceeds warn limit." (10 MB),
# "history count exceeds warn limit." (10,240 events), "mutable state size exceeds
# warn limit.", the same with "error limit" where it terminates the run, and
# "Blob data size exceeds the warning limit." (one payload over 512 KB).
WARNING = re.compile(r'msg="?([^"=]*(?:exceeds (?:warn|error) limit|blob data size exceeds)[^"]*)', re.I)


async def settle(handle: WorkflowHandle[Any, Any], limit_s: float) -> str | None:
    """Wait for the run to close: None when it completed, else why not. Never longer than ``limit_s``.

    A workflow task that fails again and again (a payload over the blob limit)
    would keep the run open for ever: after three attempts the run is terminated.
    """
    task = asyncio.ensure_future(handle.result())
    deadline = time.monotonic() + limit_s
    while True:
        done, _ = await asyncio.wait({task}, timeout=2)
        if done:
            try:
                task.result()
                return None
            except WorkflowFailureError as exc:
                return f"{type(exc.cause).__name__}: {exc.cause}"
        raw = (await handle.describe()).raw_description
        attempt = raw.pending_workflow_task.attempt if raw.HasField("pending_workflow_task") else 0
        if attempt >= 3 or time.monotonic() > deadline:
            task.cancel()
            why = f"workflow task attempt {attempt}" if attempt >= 3 else f"no result in {limit_s:.0f} s"
            await handle.terminate(f"boundary_cost: {why}")
            return f"stuck ({why}), terminated by the bench"


async def fetch_chain(client: Client, workflow_id: str) -> list[WorkflowHistory]:
    """Every execution of the run, latest first: walk back along ``continued_execution_run_id``."""
    histories, run_id = [], None
    while True:
        history = await client.get_workflow_handle(workflow_id, run_id=run_id).fetch_history()
        histories.append(history)
        run_id = history.events[0].workflow_execution_started_event_attributes.continued_execution_run_id
        if not run_id:
            return histories


def completions(history: WorkflowHistory, activity_type: str) -> list[tuple[float, bool]]:
    """The server time (epoch s) of each completion of ``activity_type`` in one execution, in
    history order, and whether it ran as a local activity: an ordinary one's
    ``ActivityTaskCompleted``, or a local one's marker holding a result (a failed local run's
    has none), whose time is the workflow task completion that recorded it."""
    scheduled = {
        e.event_id: e.activity_task_scheduled_event_attributes.activity_type.name
        for e in history.events
        if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
    }
    out: list[tuple[float, bool]] = []
    for e in history.events:
        if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED:
            if scheduled.get(e.activity_task_completed_event_attributes.scheduled_event_id) == activity_type:
                out.append((e.event_time.ToDatetime().timestamp(), False))
        elif (
            e.event_type == EventType.EVENT_TYPE_MARKER_RECORDED
            and "result" in e.marker_recorded_event_attributes.details
            and local_activity_type(e) == activity_type
        ):
            out.append((e.event_time.ToDatetime().timestamp(), True))
    return out


def call_times(history: WorkflowHistory, activity_type: str) -> list[float]:
    """The server time of each completion of ``activity_type`` (``completions``), in order."""
    return [t for t, _local in completions(history, activity_type)]


def local_activity_type(event: HistoryEvent) -> str | None:
    """The activity type of a local activity's marker (None: another marker)."""
    marker = event.marker_recorded_event_attributes
    if marker.marker_name != LOCAL_ACTIVITY_MARKER or "data" not in marker.details:
        return None
    data = json.loads(marker.details["data"].payloads[0].data)
    return str(data.get("activity_type")) if isinstance(data, dict) else None


def completed_calls(histories: list[WorkflowHistory], activity_type: str) -> int:
    """How many activities of ``activity_type`` completed over ``histories``, ordinary or local."""
    return sum(len(call_times(h, activity_type)) for h in histories)


def ending(history: WorkflowHistory) -> str:
    """How the latest execution closed, in the server's words, with its last workflow task failure."""
    last = history.events[-1]
    if last.HasField("workflow_execution_terminated_event_attributes"):
        text = f"terminated: {last.workflow_execution_terminated_event_attributes.reason}"
    elif last.HasField("workflow_execution_failed_event_attributes"):
        text = f"failed: {last.workflow_execution_failed_event_attributes.failure.message}"
    else:
        text = EventType.Name(last.event_type).removeprefix("EVENT_TYPE_").lower()
    task_failures = [e for e in history.events if e.HasField("workflow_task_failed_event_attributes")]
    if task_failures:
        failure = task_failures[-1].workflow_task_failed_event_attributes.failure
        text += f" (last workflow task failure: {failure.message})"
    return text


def last_model_input(histories: list[WorkflowHistory], activity_type: str) -> tuple[Message, ...]:
    """The messages of the run's last model call (``activity_type``): its conversation then."""
    for e in reversed(histories[0].events):
        attrs = e.activity_task_scheduled_event_attributes
        if (
            e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
            and attrs.activity_type.name == activity_type
        ):
            [call] = pydantic_data_converter.payload_converter.from_payloads(
                attrs.input.payloads, [ModelCallInput]
            )
            return tuple(call.messages)
    return ()


def scan_warnings(log: Path, rows: list[dict[str, Any]]) -> int:
    """Count each run's limit warnings in the server log; return those naming no workflow id."""
    found: dict[str, Counter[str]] = {row["workflow_id"]: Counter() for row in rows}
    unattributed = 0
    for line in log.read_text(errors="replace").splitlines():
        match = WARNING.search(line)
        if not match:
            continue
        owners = [wid for wid in found if wid in line]
        for wid in owners:
            found[wid][match.group(1).strip()] += 1
        unattributed += "wf-id=" not in line and not owners
    for row in rows:
        row["server_warning_messages"] = dict(found[row["workflow_id"]])
        row["server_warnings"] = sum(found[row["workflow_id"]].values())
    return unattributed


class CoreLog(logging.Handler):
    """The SDK core's log: when it warned of a payload over 512 KB (``TMPRL1103``); the rest to stderr."""

    def __init__(self) -> None:
        super().__init__()
        self.payload_warnings: list[float] = []  # when, as time.time()

    def emit(self, record: logging.LogRecord) -> None:
        if "TMPRL1103" in record.getMessage():
            self.payload_warnings.append(record.created)
        else:
            print(record.getMessage(), file=sys.stderr)

    def runtime(self) -> Runtime:
        """A runtime whose core log comes here rather than to stdout."""
        logger = logging.getLogger("bench.sdk_core")
        logger.propagate = False
        logger.setLevel(logging.WARNING)
        logger.addHandler(self)
        forward = LogForwardingConfig(logger=logger)
        filters = TelemetryFilter(core_level="WARN", other_level="ERROR")
        return Runtime(telemetry=TelemetryConfig(logging=LoggingConfig(filter=filters, forwarding=forward)))

    def count(self, rows: list[dict[str, Any]]) -> None:
        """Each run's payload warnings: those logged while it ran (runs go one at a time)."""
        for row in rows:
            start, end = row.pop("window")
            row["sdk_payload_warnings"] = sum(start <= t <= end for t in self.payload_warnings)
