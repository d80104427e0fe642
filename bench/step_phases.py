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

``phases(histories, steps)`` sums each phase over the run and divides by its steps.
``LocalActivityClock``, a worker interceptor, times each kind of local activity
(``local agent.tool_call``, ``local agent.checkpoint``), which is part of ``task work``: the
history cannot tell, since a local activity's marker holds no time the worker's clock and the
server's agree on (its ``original_schedule_time`` is often later than its ``complete_time``).
"""

from __future__ import annotations

import itertools
import time
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

from temporalio import activity
from temporalio.api.enums.v1 import EventType
from temporalio.client import Interceptor as ClientInterceptor
from temporalio.client import WorkflowHistory
from temporalio.worker import ActivityInboundInterceptor, ExecuteActivityInput
from temporalio.worker import Interceptor as WorkerInterceptor

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
    return out


class LocalActivityClock(ClientInterceptor, WorkerInterceptor):
    """Times the local activities a worker runs, by workflow id and activity type.

    Given to a client's ``interceptors``, it also intercepts the workers built on that client
    (temporalio applies a client's interceptors that are worker interceptors too).
    """

    def __init__(self) -> None:
        self._spent: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))

    def intercept_activity(self, next: ActivityInboundInterceptor) -> ActivityInboundInterceptor:
        return _TimedActivity(next, self)

    def add(self, workflow_id: str, activity_type: str, ms: float) -> None:
        self._spent[workflow_id][activity_type] += ms

    def take(self, workflow_id: str, steps: int) -> dict[str, float]:
        """The local activities' ms/step of one run (every execution of its workflow id), by
        ``local <type>``; forgotten once taken."""
        spent = self._spent.pop(workflow_id, {})
        return {f"local {name}": round(ms / max(steps, 1), 1) for name, ms in sorted(spent.items())}


class _TimedActivity(ActivityInboundInterceptor):
    def __init__(self, next: ActivityInboundInterceptor, clock: LocalActivityClock) -> None:
        super().__init__(next)
        self._clock = clock

    async def execute_activity(self, input: ExecuteActivityInput) -> Any:
        info = activity.info()
        if not info.is_local or info.workflow_id is None:
            return await super().execute_activity(input)
        started = time.perf_counter()
        try:
            return await super().execute_activity(input)
        finally:
            self._clock.add(info.workflow_id, info.activity_type, (time.perf_counter() - started) * 1000)
