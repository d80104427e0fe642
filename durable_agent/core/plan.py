"""A run's plan: its input resolved against the worker's config (what the loop will do),
with the timeouts and limits it runs under.

Compatibility rule: fields may be added with defaults, never renamed or removed.
"""

from __future__ import annotations

from pydantic import Field

from durable_agent.core.context import ContextPolicy
from durable_agent.core.export import CapabilityBinding, ResumedFrom
from durable_agent.core.models import Frozen, ToolDefinition
from durable_agent.core.permissions import PermissionPolicy
from durable_agent.core.tool_specs import ToolOffer

# A workflow task a worker died in is given to another after this long: a run's takeover
# after ``kill -9`` waits for it (or for the sticky queue's 2 s, or a heartbeat's timeout).
# A task's local activity (the checkpoint) may take longer: the SDK extends the task. A
# task that replays a whole history may not: ``continue_as_new_events`` keeps that short.
WORKFLOW_TASK_SECONDS = 3


class Timeouts(Frozen):
    """Activity timeouts (seconds) and how many times Temporal tries each (the worker's
    ``[timeouts]``); ``durable_agent.core.activity_api`` maps them onto each activity."""

    model_seconds: float = Field(600, gt=0)
    tool_seconds: float = Field(300, gt=0)
    # a worker lost mid-call is noticed this long after its last heartbeat (two a second)
    heartbeat_seconds: float = Field(2, gt=0)
    checkpoint_seconds: float = Field(60, gt=0)  # open, save, export and finish the run's log
    # the run's workflow task timeout from its next execution on (``start_run`` sets the first)
    workflow_task_seconds: float = Field(WORKFLOW_TASK_SECONDS, gt=0, le=120)
    model_max_attempts: int = Field(8, ge=1)  # 429s and 5xx: retried with backoff, 1 s to 60 s
    tool_max_attempts: int = Field(3, ge=1)  # a worker lost mid-call; a tool error is not retried
    checkpoint_max_attempts: int = Field(5, ge=1)
    export_max_attempts: int = Field(5, ge=1)  # then the failure is recorded and the run goes on


class Limits(Frozen):
    """When a run continues as new, and where it stops cleanly instead of being terminated.

    A run's history grows with what is new at each step (its conversation
    enters the history once), and it continues as new at a tool boundary, so
    a run of any length stays far below Temporal's 50 MB / 51,200-event
    limits. The ``max_history_*`` limits are the safety net for one step that
    alone would pass them: the run ends ``failed`` with the reason, its
    exports so far delivered.
    """

    max_history_bytes: int = Field(40_000_000, ge=10_000)
    max_history_events: int = Field(40_000, ge=100)
    # At a tool boundary, once its export is acknowledged, the run continues as new
    # (a fresh history, the same run) when Temporal suggests it or past either of these.
    # 2,000 events: about 150 steps, a whole replay in under a second, well within the 3 s
    # a workflow task may take (a worker that takes over a run replays it whole)
    continue_as_new_events: int = Field(2_000, ge=50)
    continue_as_new_bytes: int = Field(10_000_000, ge=10_000)
    # No longer used (an export no longer passes through Temporal); accepted so that
    # runs recorded with it replay and old configs load.
    max_checkpoint_bytes: int | None = Field(None, deprecated="exports no longer pass through Temporal")


class RunPlan(Frozen):
    """The run's input resolved against the worker's config: what the loop will do."""

    session_id: str
    run_id: str
    prompt: str = ""  # the workflow's own; the resolve activity leaves it empty
    workspace: str
    model: str
    system_prompt: str
    tools: tuple[ToolOffer, ...]
    permissions: PermissionPolicy
    capability_binding: CapabilityBinding
    export_sink: str
    max_tool_rounds: int
    approval_timeout_seconds: float | None = None
    # Conversations and budgets (``durable_agent.core.loop``): how long a run with follow-ups
    # waits for the next prompt (None: for ever); the run's token and cost budgets (None: none);
    # the model's prices in USD per million prompt and completion tokens (None: unknown).
    idle_timeout_seconds: float | None = None
    max_total_tokens: int | None = None
    max_cost_usd: float | None = None
    input_usd_per_mtok: float | None = None
    output_usd_per_mtok: float | None = None
    # prompt tokens read from / written to the provider's cache (None: priced as input)
    cache_read_usd_per_mtok: float | None = None
    cache_write_usd_per_mtok: float | None = None
    resumed_from: ResumedFrom | None = None
    timeouts: Timeouts = Timeouts()
    limits: Limits = Limits()
    # None: no context management (what replays of runs recorded before it see)
    context: ContextPolicy | None = None

    def definitions(self) -> list[ToolDefinition]:
        return [t.definition for t in self.tools]
