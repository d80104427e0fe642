"""Tool steps in recorded histories: when each tool call completed, remote or local, and the gaps.

A tool call's completion is an ``ActivityTaskCompleted`` of ``agent.tool_call``
or, once it runs as a local activity, the ``MarkerRecorded`` event whose
local-activity marker names ``agent.tool_call``: ``tool_call_times`` counts
both, with the server's event times.
"""

from __future__ import annotations

import itertools
import statistics
from collections import Counter
from typing import Any

from temporalio.api.enums.v1 import EventType
from temporalio.client import WorkflowHistory

from bench.runs import LOCAL_ACTIVITY_MARKER, call_times, completions
from durable_agent.core.activity_api import TOOL_CALL

LA_MARKER = LOCAL_ACTIVITY_MARKER  # the SDK core's marker of a local activity's result


def tool_call_times(history: WorkflowHistory, activity_type: str = TOOL_CALL.name) -> list[float]:
    """The server time of each completion of ``activity_type`` in one execution (``completions``)."""
    return call_times(history, activity_type)


def percentile(values: list[float], q: int) -> float | None:
    """The ``q``-th percentile (1-99) of ``values``, rounded to 0.1; None for no values."""
    if len(values) < 2:
        return round(values[0], 1) if values else None
    return round(statistics.quantiles(values, n=100, method="inclusive")[q - 1], 1)


def step_figures(chains: list[list[WorkflowHistory]], wall: float) -> dict[str, Any]:
    """Steps (``local_steps`` of them local activities), steps/s and the p50/p99 step latency
    of the runs' histories (each run's chain)."""
    gaps: list[float] = []
    steps = local = 0
    for chain in chains:
        done = [c for h in chain for c in completions(h, TOOL_CALL.name)]
        times = sorted(t for t, _ in done)
        steps += len(times)
        local += sum(is_local for _, is_local in done)
        gaps += [(b - a) * 1000 for a, b in itertools.pairwise(times)]
    return {
        "steps": steps,
        "local_steps": local,
        "wall_s": round(wall, 2),
        "steps_per_s": round(steps / wall, 2),
        "p50_ms": percentile(gaps, 50),
        "p99_ms": percentile(gaps, 99),
    }


def wft_by_worker(chains: list[list[WorkflowHistory]]) -> dict[str, int]:
    """Workflow tasks completed, by the identity of the worker that completed them."""
    done: Counter[str] = Counter()
    for h in itertools.chain.from_iterable(chains):
        for e in h.events:
            if e.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED:
                done[e.workflow_task_completed_event_attributes.identity] += 1
    return dict(sorted(done.items()))


TROUBLE = {
    EventType.EVENT_TYPE_WORKFLOW_TASK_TIMED_OUT: "wft_timed_out",
    EventType.EVENT_TYPE_WORKFLOW_TASK_FAILED: "wft_failed",
    EventType.EVENT_TYPE_ACTIVITY_TASK_TIMED_OUT: "activity_timed_out",
    EventType.EVENT_TYPE_ACTIVITY_TASK_FAILED: "activity_failed",
}


def trouble(chains: list[list[WorkflowHistory]]) -> dict[str, Any]:
    """Workflow tasks and activities that timed out or failed, by kind (a timed-out workflow task
    is replayed elsewhere or again: slow steps and extra CPU), and under ``why`` the distinct
    activity types and failure messages of the failed activities (the first 3)."""
    seen: Counter[str] = Counter()
    why: Counter[str] = Counter()
    for h in itertools.chain.from_iterable(chains):
        kinds = {e.event_id: e.activity_task_scheduled_event_attributes.activity_type.name for e in h.events}
        for e in h.events:
            if e.event_type in TROUBLE:
                seen[TROUBLE[e.event_type]] += 1
            if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_FAILED:
                failed = e.activity_task_failed_event_attributes
                why[f"{kinds.get(failed.scheduled_event_id, '?')}: {failed.failure.message[:160]}"] += 1
    out: dict[str, Any] = dict(sorted(seen.items()))
    if why:
        out["why"] = dict(why.most_common(3))
    return out
