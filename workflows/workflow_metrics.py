"""The agent's metrics only the workflow sees (``durable_agent.core.metrics``): tool calls the
run's permissions refused before any activity, and approvals asked for and decided.

Replay-safe: ``workflow.metric_meter()`` records nothing while the workflow replays, and a
metric is no command, so recorded histories replay as before.
"""

from __future__ import annotations

from collections.abc import Iterable

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from durable_agent.core import metrics as m
    from durable_agent.core.tool_specs import ToolOffer


def _add(metric: m.Metric, labels: dict[str, str]) -> None:
    workflow.metric_meter().create_counter(metric.name, metric.description, metric.unit).add(1, labels)


def tool_call_refused(tool: str, *, by_person: bool) -> None:
    """A call that never ran: denied by the run's rules, or not approved (by a person, or in time)."""
    _add(m.TOOL_CALLS, {"tool": tool, "outcome": m.TOOL_NOT_APPROVED if by_person else m.TOOL_DENIED})


def invalid_tool_call(offers: Iterable[ToolOffer], tool: str) -> None:
    """A call the workflow could not judge: a tool the run does not offer, or bad arguments."""
    if any(o.definition.name == tool for o in offers):
        _add(m.TOOL_CALLS, {"tool": tool, "outcome": m.TOOL_ERROR})
    else:
        _add(m.TOOL_CALLS, {"tool": m.UNKNOWN_TOOL_LABEL, "outcome": m.TOOL_UNKNOWN})


def approval_requested(tool: str) -> None:
    _add(m.APPROVALS_REQUESTED, {"tool": tool})


def approval_decided(tool: str, approved: bool | None, *, timed_out: bool) -> None:
    """A wait for approval ended: a person's decision (``approved``), the timeout, or else a cancel."""
    if approved is not None:
        outcome = m.APPROVED if approved else m.DENIED
    else:
        outcome = m.TIMED_OUT if timed_out else m.CANCELLED
    _add(m.APPROVALS_DECIDED, {"tool": tool, "outcome": outcome})
