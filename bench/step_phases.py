"""Where a step's time goes, read from a run's history: the server's time of each event.

A step of either design is activities (model call, tool call) and the workflow tasks that
follow each. Every interval between two events of the history is put in one phase:

* ``activity dispatch``: an activity scheduled, until a worker started it (eager activities:
  about 0; a local activity has no such events, its time is in ``workflow task work``);
* ``activity run``: started until completed (the worker running it, and its completion RPC);
* ``task dispatch``: a workflow task scheduled, until a worker started it (history's transfer
  queue, matching, the sticky poll);
* ``task work``: a workflow task started, until the worker completed it (the workflow code,
  local activities (our tools and checkpoints), payload conversion, the completion RPC);
* ``between``: the rest (an activity's completion until the next task was scheduled, ...).

``phases(histories, steps)`` sums each phase over the run and divides by its steps, and adds
the time of each kind of local activity (``local agent.tool_call``, ``local agent.checkpoint``),
which is part of ``task work``.
"""

from __future__ import annotations

import itertools
import json
from collections import defaultdict
from collections.abc import Sequence

from temporalio.api.enums.v1 import EventType
from temporalio.client import WorkflowHistory

PHASES = ("activity dispatch", "activity run", "task dispatch", "task work", "between")

_AFTER: dict[int, str] = {
    EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED: "activity dispatch",
    EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED: "activity run",
    EventType.EVENT_TYPE_WORKFLOW_TASK_SCHEDULED: "task dispatch",
    EventType.EVENT_TYPE_WORKFLOW_TASK_STARTED: "task work",
}


def phases(histories: Sequence[WorkflowHistory], steps: int) -> dict[str, float]:
    """Milliseconds a step in each phase (see the module docstring), over ``steps`` steps.

    An interval is put in the phase of the event that opens it: from an activity's
    scheduling to the next event is its dispatch, and so on. Two activities in flight at
    once (parallel calls) are not in this bench's workload.

    Args:
        histories: the run's histories, every execution.
        steps: the steps the run completed.

    Returns:
        ms/step by phase, and ``total`` (first event to last).
    """
    spent: dict[str, float] = defaultdict(float)
    total = 0.0
    for history in histories:
        events = list(history.events)
        for before, after in itertools.pairwise(events):
            gap = after.event_time.ToMilliseconds() - before.event_time.ToMilliseconds()
            spent[_AFTER.get(before.event_type, "between")] += gap
        if events:
            total += events[-1].event_time.ToMilliseconds() - events[0].event_time.ToMilliseconds()
    per = max(steps, 1)
    out = {phase: round(spent[phase] / per, 1) for phase in PHASES}
    out["total"] = round(total / per, 1)
    for name, ms in local_activity_ms(histories).items():
        out[f"local {name}"] = round(ms / per, 1)
    return out


def local_activity_ms(histories: Sequence[WorkflowHistory]) -> dict[str, float]:
    """Milliseconds spent in local activities (inside ``task work``), by activity type: from
    each marker's scheduling time to its completion time, as the worker recorded them."""
    spent: dict[str, float] = defaultdict(float)
    for history in histories:
        for event in history.events:
            marker = event.marker_recorded_event_attributes
            if event.event_type != EventType.EVENT_TYPE_MARKER_RECORDED or "data" not in marker.details:
                continue
            data = json.loads(marker.details["data"].payloads[0].data)
            if not isinstance(data, dict) or "complete_time" not in data:
                continue
            done, scheduled = (
                data["complete_time"],
                data.get("original_schedule_time") or data["complete_time"],
            )
            ms = (done["seconds"] - scheduled["seconds"]) * 1000 + (done["nanos"] - scheduled["nanos"]) / 1e6
            spent[str(data.get("activity_type"))] += max(ms, 0.0)
    return dict(spent)
