"""The agent's own metrics: names, kinds, units, labels and the values of their outcome labels.

One table, read by the activities' and the worker's recording (``durable_agent.telemetry``),
by the workflow's (``durable_agent.workflows.workflow_metrics``), by the README and by the dashboard's
test. They are recorded through Temporal's ``MetricMeter``, so they share the worker's one
Prometheus endpoint with the Temporal SDK's own metrics (``temporal_*``); the runtime's
``metric_prefix`` applies to those only, ours keep these names. Every series also carries the
labels the meter adds: ``service_name``, ``namespace`` and ``task_queue``, and
``activity_type`` or ``workflow_type`` where an activity or the workflow records it.

Label values are a closed set where they are not names from the config: a tool a worker
does not have is counted as the tool ``_unknown``, so a model that invents tool names cannot
create series without end.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

MetricKind = Literal["counter", "histogram", "gauge"]

# outcomes of a model call
MODEL_OK = "ok"
MODEL_ERROR = "error"  # the provider failed, or its answer was refused (``error.type`` on the span says why)
MODEL_CONTEXT_OVERFLOW = "context_overflow"  # the request was larger than the model's window
MODEL_CANCELLED = "cancelled"
MODEL_OUTCOMES = (MODEL_OK, MODEL_ERROR, MODEL_CONTEXT_OVERFLOW, MODEL_CANCELLED)

# outcomes of a tool call
TOOL_OK = "ok"  # the tool ran and answered
TOOL_ERROR = "error"  # the model sees a tool error: bad arguments, or the tool refused
TOOL_FAILED = "failed"  # the activity raised (one an attempt: Temporal retries repeatable tools)
TOOL_UNKNOWN = "unknown_tool"  # no such tool is offered to the run, or on the worker
TOOL_DENIED = "denied"  # the run's permissions deny it (the rule, or the path a link leads to)
TOOL_NOT_APPROVED = "not_approved"  # a person denied it, or no decision came in time
TOOL_CANCELLED = "cancelled"
TOOL_OUTCOMES = (
    TOOL_OK,
    TOOL_ERROR,
    TOOL_FAILED,
    TOOL_UNKNOWN,
    TOOL_DENIED,
    TOOL_NOT_APPROVED,
    TOOL_CANCELLED,
)
# the ``tool`` label of a call to a tool the run or the worker does not have
UNKNOWN_TOOL_LABEL = "_unknown"

# how an approval was decided
APPROVED = "approved"
DENIED = "denied"
TIMED_OUT = "timed_out"
CANCELLED = "cancelled"  # the run was cancelled while the call waited
APPROVAL_OUTCOMES = (APPROVED, DENIED, TIMED_OUT, CANCELLED)

# why an export failed (Temporal retries the retryable ones)
RETRYABLE = "retryable"
NON_RETRYABLE = "non_retryable"
EXPORT_FAILURE_REASONS = (RETRYABLE, NON_RETRYABLE)

COMPACTION_OUTCOMES = ("ok", "error")


@dataclass(frozen=True)
class Metric:
    """One metric as Prometheus shows it (besides the meter's own labels)."""

    name: str
    kind: MetricKind
    unit: str
    labels: tuple[str, ...]
    description: str
    recorded_by: Literal["activity", "workflow", "worker"]


MODEL_CALLS = Metric(
    "durable_agent_model_calls",
    "counter",
    "{call}",
    ("provider", "model", "purpose", "outcome"),
    "Model calls (purpose: step or summary), by outcome",
    "activity",
)
MODEL_TOKENS = Metric(
    "durable_agent_model_tokens",
    "counter",
    "{token}",
    ("provider", "model", "type"),
    "Tokens the providers reported, type input, output or reasoning (a share of output)",
    "activity",
)
MODEL_CALL_DURATION = Metric(
    "durable_agent_model_call_duration_seconds",
    "histogram",
    "s",
    ("provider", "model", "outcome"),
    "How long a model call took, streaming included",
    "activity",
)
TOOL_CALLS = Metric(
    "durable_agent_tool_calls",
    "counter",
    "{call}",
    ("tool", "outcome"),
    "Tool calls by tool and outcome (denied and not_approved ones are counted by the workflow)",
    "activity",
)
APPROVALS_REQUESTED = Metric(
    "durable_agent_approvals_requested",
    "counter",
    "{request}",
    ("tool",),
    "Calls that waited for a person's approval",
    "workflow",
)
APPROVALS_DECIDED = Metric(
    "durable_agent_approvals_decided",
    "counter",
    "{decision}",
    ("tool", "outcome"),
    "Approvals decided: approved, denied, timed_out or cancelled",
    "workflow",
)
APPROVALS_WAITING = Metric(
    "durable_agent_approvals_waiting",
    "gauge",
    "{run}",
    ("task_queue",),
    "Runs on the task queue waiting for approval now (from Temporal's visibility)",
    "worker",
)
EXPORT_DURATION = Metric(
    "durable_agent_export_duration_seconds",
    "histogram",
    "s",
    ("sink",),
    "How long a checkpoint export took to build and hand to its sink, when it was delivered",
    "activity",
)
EXPORT_FAILURES = Metric(
    "durable_agent_export_failures",
    "counter",
    "{failure}",
    ("sink", "reason"),
    "Export attempts that failed, reason retryable or non_retryable",
    "activity",
)
COMPACTIONS = Metric(
    "durable_agent_compactions",
    "counter",
    "{compaction}",
    ("model", "outcome"),
    "Summaries of older turns written to fit the model's window, outcome ok or error",
    "activity",
)
WORKSPACE_RESTORES = Metric(
    "durable_agent_workspace_restores",
    "counter",
    "{restore}",
    ("reason",),
    "Copies of a run's workspace restored to its tree before a call, reason moved or diverged",
    "activity",
)
WORKSPACE_RESTORE_BYTES = Metric(
    "durable_agent_workspace_restore_bytes",
    "counter",
    "By",
    ("reason",),
    "Bytes of git objects the restores fetched from the sinks (as the sinks hold them)",
    "activity",
)
WORKSPACE_RESTORE_DURATION = Metric(
    "durable_agent_workspace_restore_duration_seconds",
    "histogram",
    "s",
    ("reason",),
    "How long a restore of a run's workspace took, its objects fetched and its files written",
    "activity",
)

METRICS = (
    MODEL_CALLS,
    MODEL_TOKENS,
    MODEL_CALL_DURATION,
    TOOL_CALLS,
    APPROVALS_REQUESTED,
    APPROVALS_DECIDED,
    APPROVALS_WAITING,
    EXPORT_DURATION,
    EXPORT_FAILURES,
    COMPACTIONS,
    WORKSPACE_RESTORES,
    WORKSPACE_RESTORE_BYTES,
    WORKSPACE_RESTORE_DURATION,
)

# Histogram buckets, in seconds: a model call takes seconds to minutes, an export milliseconds.
MODEL_CALL_BUCKETS = (0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 80.0, 160.0, 320.0)
EXPORT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
