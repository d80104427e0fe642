"""A run's plan: its input resolved against the worker's config (what the loop will do),
with the timeouts and limits it runs under.

Compatibility rule: fields may be added with defaults, never renamed or removed.
"""

from __future__ import annotations

from typing import Any

from pydantic import Field, model_validator

from durable_agent.core.capability_binding import CapabilityBinding
from durable_agent.core.context import ContextPolicy
from durable_agent.core.export import ResumedFrom
from durable_agent.core.hooks import HooksConfig
from durable_agent.core.models import (
    Frozen,
    InstructionFile,
    ToolDefinition,
    ToolsUnavailable,
    WorkspaceState,
)
from durable_agent.core.permissions import PermissionPolicy
from durable_agent.core.run_workspace import WorkspaceOrigin
from durable_agent.core.subagents import SubagentPlan
from durable_agent.core.tool_specs import ToolOffer

# A workflow task a worker died in is given to another after this long: a run's takeover
# after ``kill -9`` waits for it (or for the sticky queue's 2 s, or a heartbeat's timeout).
# A task's local activity (the checkpoint) may take longer: the SDK extends the task. A
# task that replays a whole history may not: ``continue_as_new_events`` keeps that short.
WORKFLOW_TASK_SECONDS = 3
# What a run's inputs may take together of Temporal's 2 MiB payload limit (``Limits``): the rest is
# for the system prompt, the permissions and the newest events a payload carries with them.
INPUT_BUDGET_BYTES = 1_572_864
# The largest ``max_message_bytes`` a worker may set, and what the client refuses to send at all.
# The SDK's answer to an update (accepted or rejected) echoes its whole input, and Temporal
# receives at most 4 MiB from a worker at once: with the 10 updates it lets wait on a run
# (``history.maxInFlightUpdates``) in one workflow task, more than this each would pass it, and
# Temporal would terminate the run.
MESSAGE_BYTES_CEILING = 393_216


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
    # A ``[hooks]`` command's time limit when it sets none (its activity's: this and a margin).
    hook_seconds: float = Field(60, gt=0, le=3600)
    hook_max_attempts: int = Field(3, ge=1)  # a worker lost mid-hook; a hook's own failure is not retried


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
    # 1,000 events: about 125 tool steps. A worker that takes over a run replays its history
    # whole within one workflow task (3 s): 1,371 events took the SDK 1.2 to 2.5 s of CPU on
    # 2 cores, so 2,000 could not be taken over in time (docs/costs.md, Takeover).
    continue_as_new_events: int = Field(1_000, ge=50)
    continue_as_new_bytes: int = Field(10_000_000, ge=10_000)
    # No longer used (an export no longer passes through Temporal); accepted so that
    # runs recorded with it replay and old configs load.
    max_checkpoint_bytes: int | None = Field(None, deprecated="exports no longer pass through Temporal")
    # What a run takes in (``durable_agent.workflows.admission``), as the JSON its payloads carry:
    # each is bounded so that no input can make a payload pass Temporal's 2 MiB, and together
    # (``INPUT_BUDGET_BYTES``) they leave room for the rest of the largest payload they share
    # (the run's header, its continue-as-new input). One person's message: the start prompt, a
    # ``prompt`` or a ``steer`` update; past it the update is rejected (``InputTooLarge``).
    max_message_bytes: int = Field(262_144, ge=1_024, le=MESSAGE_BYTES_CEILING)
    # The steers that wait for the model's next request, by count and by size; past either, a
    # ``steer`` is rejected (``SteerQueueFull``) until the model's next request takes them.
    max_queued_messages: int = Field(32, ge=1, le=1_000)
    max_queued_bytes: int = Field(524_288, ge=1_024, le=1_048_576)
    # The definitions of the tools a run is offered: MCP servers are added in name order, and a
    # server whose tools would pass this is left out of the run whole (a ``tools_unavailable`` event
    # says so); the worker's own tools always count first.
    max_tool_catalog_bytes: int = Field(524_288, ge=16_384, le=1_048_576)

    @model_validator(mode="after")
    def _within_input_budget(self) -> Limits:
        total = self.max_message_bytes + self.max_queued_bytes + self.max_tool_catalog_bytes
        if total > INPUT_BUDGET_BYTES:
            raise ValueError(
                f"max_message_bytes + max_queued_bytes + max_tool_catalog_bytes is {total}, over "
                f"{INPUT_BUDGET_BYTES}: a run's header and its continue-as-new input carry them "
                "together, within Temporal's 2 MiB payload limit"
            )
        return self


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
    # MCP servers left out of the run: their tools would pass ``limits.max_tool_catalog_bytes``
    tools_refused: tuple[ToolsUnavailable, ...] = ()
    # The worker's ``[hooks]`` when the run started (``durable_agent.core.hooks``): a replay runs
    # the hooks its run started with (a plan recorded before hooks has none).
    hooks: HooksConfig = HooksConfig()
    # The project instruction files ``system_prompt`` took in (``activities/instructions.py``);
    # the run's ``run_start`` event and its capability binding name them too.
    instruction_files: tuple[InstructionFile, ...] = ()
    # Typed results (``durable_agent.core.output_schema``): the JSON Schema the run's answer must
    # match (None: a text answer, what plans recorded before typed results replay as), and how many
    # times the model may try again after an answer that does not.
    output_schema: dict[str, Any] | None = None
    max_output_retries: int = Field(3, ge=0)
    # Subagents (``durable_agent.core.subagents``): the run's depth, its bounds and the agent types
    # a ``task`` call may start; None: a worker without ``[agents]`` enabled, and a plan from before.
    subagents: SubagentPlan | None = None
    # A run whose workspace follows it (docs/workspaces.md): the workspace's tree when the run
    # started, recorded by the worker that resolved it, its first host (``workspace_host``);
    # None: not followed (a worker without ``[workspaces] follow``, a child run, a plan from before).
    workspace_base: WorkspaceState | None = None
    workspace_host: str | None = None
    # how long a call waits on its host's own task queue before any worker takes the run over
    host_wait_seconds: float = 5.0
    # A workspace made from a git source: its repository and commit, and the branch its change
    # goes to at the run's end (``core/run_workspace.py``); None: not from a git source.
    workspace_origin: WorkspaceOrigin | None = None
    # The worker's ``[codec]`` takes only encrypted input (keys, no ``accept_plaintext``): the
    # ``cancel`` and ``end`` signals count only with an encrypted ``RunControl``, not bare, as a
    # client without the keys sends them (False: a plan from before, or a worker without keys).
    sealed_signals: bool = False

    def definitions(self) -> list[ToolDefinition]:
        return [t.definition for t in self.tools]
