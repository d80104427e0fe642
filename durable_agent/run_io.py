"""Inputs and outputs of the ``AgentRun`` workflow and its activities.

Compatibility rule for these models: fields may be added with defaults; a
field is never renamed or removed while histories that carry it may replay.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from durable_agent.checkpoint import (
    CapabilityBinding,
    CheckpointPayload,
    ExportError,
    LoopCheckpoint,
    ResumedFrom,
    RunRecord,
    SessionCheckpointExportV1,
    open_export,
)
from durable_agent.models import EventRecord, Frozen, Message, TokenUsage, ToolDefinition
from durable_agent.permissions import PermissionPolicy
from durable_agent.tool_specs import ToolOffer

WORKFLOW_TYPE = "AgentRun"
SIGNAL_CANCEL = "cancel"
QUERY_STATUS = "status"
QUERY_EVENTS = "events"
UPDATE_APPROVE = "approve"

# Search attributes the worker registers (Keyword) and the workflow keeps current.
SA_SESSION_ID = "AgentSessionId"
SA_RUN_STATUS = "AgentRunStatus"

FinalStatus = Literal["completed", "failed", "cancelled"]


class AgentRunInput(BaseModel):
    """The one JSON object that starts an ``AgentRun``. Unknown fields are refused."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    prompt: str | None = Field(None, min_length=1, description="Required, unless resume_from is given.")
    workspace: str | None = Field(None, min_length=1, description="A folder on the worker's machine.")
    session_id: str | None = Field(None, min_length=1, max_length=200)
    model: str | None = Field(None, description='"provider/model"; default from the worker config.')
    permissions: PermissionPolicy | None = None
    export_sink: str | None = Field(None, min_length=1)
    max_tool_rounds: int | None = Field(None, ge=1, le=10_000)
    approval_timeout_seconds: float | None = Field(
        None, gt=0, description="How long a call that needs approval waits before it is denied."
    )
    resume_from: SessionCheckpointExportV1 | None = Field(
        None, description="An export to go on from: the model sees its conversation."
    )
    force_resume: bool = Field(
        False, description="Resume even where the worker's tools or permissions differ from the export's."
    )
    continued: CarriedState | None = Field(
        None, description="Set by the run itself when it continues as new; not for callers."
    )

    @field_validator("model")
    @classmethod
    def _provider_slash_model(cls, value: str | None) -> str | None:
        if value is not None:
            provider, _, name = value.partition("/")
            if not provider or not name:
                raise ValueError(f'model must look like "provider/model", got {value!r}')
        return value

    @field_validator("prompt")
    @classmethod
    def _prompt_not_blank(cls, value: str | None) -> str | None:
        if value is not None and not value.strip():
            raise ValueError("prompt must not be blank")
        return value

    @model_validator(mode="after")
    def _prompt_or_resume(self) -> AgentRunInput:
        if self.prompt is None and self.resume_from is None:
            raise ValueError("prompt is required (unless the run resumes from an export)")
        if self.resume_from is not None:
            try:
                open_export(self.resume_from)
            except ExportError as exc:
                raise ValueError(f"resume_from is refused: {type(exc).__name__}: {exc}") from None
        return self

    def resume_payload(self) -> CheckpointPayload | None:
        """The opened export this run resumes from, if any (validated when the input was)."""
        return open_export(self.resume_from) if self.resume_from is not None else None


class Timeouts(Frozen):
    """Activity timeouts and export retries, in seconds (from the worker config)."""

    model_seconds: float = 600
    tool_seconds: float = 300
    heartbeat_seconds: float = 10
    checkpoint_seconds: float = 60
    export_max_attempts: int = 5


class Limits(Frozen):
    """Where a run stops cleanly instead of jamming on a Temporal limit.

    A payload over the server's blob limit (2 MB by default) fails the workflow
    task again and again; a history past 50 MB is terminated. Until histories
    grow linearly with the run, a run that nears either ends ``failed`` with a
    clear reason, its exports so far delivered.
    """

    max_checkpoint_bytes: int = Field(1_500_000, ge=10_000)
    max_history_bytes: int = Field(40_000_000, ge=10_000)
    max_history_events: int = Field(40_000, ge=100)
    # At a tool boundary, once its export is acknowledged, the run continues as new
    # (a fresh history, the same run) when Temporal suggests it or past either of these.
    continue_as_new_events: int = Field(10_000, ge=50)
    continue_as_new_bytes: int = Field(10_000_000, ge=10_000)


class ResolveInput(Frozen):
    run: AgentRunInput  # without ``resume_from``: the export is in the history once, as the run's input
    session_id: str
    run_id: str
    resumed_from: ResumedFrom | None = None
    resume_permissions: PermissionPolicy | None = None


class RunPlan(Frozen):
    """The run's input resolved against the worker's config: what the loop will do."""

    session_id: str
    run_id: str
    prompt: str
    workspace: str
    model: str
    system_prompt: str
    tools: tuple[ToolOffer, ...]
    permissions: PermissionPolicy
    capability_binding: CapabilityBinding
    export_sink: str
    max_tool_rounds: int
    approval_timeout_seconds: float | None = None
    resumed_from: ResumedFrom | None = None
    timeouts: Timeouts = Timeouts()
    limits: Limits = Limits()

    def definitions(self) -> list[ToolDefinition]:
        return [t.definition for t in self.tools]


class ModelCallInput(Frozen):
    run_id: str
    model: str
    system_prompt: str
    messages: tuple[Message, ...]
    tools: tuple[ToolDefinition, ...]


class ToolCallInput(Frozen):
    run_id: str
    workspace: str
    call_id: str
    name: str
    arguments: dict[str, Any]


class ToolOutput(Frozen):
    content: str
    is_error: bool = False


class SaveCheckpointInput(Frozen):
    checkpoint: LoopCheckpoint


class LoadSessionInput(Frozen):
    session_id: str
    run_id: str


class SessionRuns(Frozen):
    """The session's other runs, as they ended; part of every export's snapshot."""

    records: tuple[RunRecord, ...] = ()


class FinishRunInput(Frozen):
    """The run's final record; the store keeps it and drops the run's checkpoint."""

    record: RunRecord


class ExportInput(Frozen):
    sink: str
    export: SessionCheckpointExportV1


class ExportRef(Frozen):
    turn: int
    content_digest: str


class ExportFailure(Frozen):
    turn: int
    content_digest: str
    reason: str


class ApprovalDecision(Frozen):
    """The ``approve`` update's input: a person's decision on one waiting call."""

    call_id: str = Field(min_length=1)
    approved: bool
    reason: str | None = Field(None, max_length=2000)


class ApprovalAnswer(Frozen):
    """What the ``approve`` update returns to the person who decided."""

    call_id: str
    tool: str
    approved: bool


class PendingApproval(Frozen):
    call_id: str
    tool: str
    target: str | None = None
    arguments: str
    since_ms: int
    timeout_seconds: float | None = None


class RunStatusView(Frozen):
    """What the ``status`` query returns."""

    session_id: str
    run_id: str
    status: str
    model: str | None = None
    turn: int = 0
    tool_calls: int = 0
    exports_delivered: int = 0
    export_failures: int = 0
    persistence_failures: int = 0
    last_content_digest: str | None = None
    cancel_requested: bool = False
    pending_approvals: tuple[PendingApproval, ...] = ()
    usage: TokenUsage = TokenUsage()
    error: str | None = None


class AgentRunResult(Frozen):
    session_id: str
    run_id: str
    status: FinalStatus
    text: str
    error: str | None = None
    tool_calls_count: int
    usage: TokenUsage
    exports: tuple[ExportRef, ...]
    export_failures: tuple[ExportFailure, ...]
    persistence_failures: tuple[str, ...] = ()


# Activity names: stable, because recorded histories refer to them.
ACTIVITY_RESOLVE = "agent.resolve_run"
ACTIVITY_MODEL = "agent.model_call"
ACTIVITY_TOOL = "agent.tool_call"
ACTIVITY_SAVE_CHECKPOINT = "agent.save_checkpoint"
ACTIVITY_LOAD_SESSION = "agent.load_session"
ACTIVITY_FINISH_RUN = "agent.finish_run"
ACTIVITY_EXPORT = "agent.export_checkpoint"


class CarriedState(Frozen):
    """What a run hands to its next execution when it continues as new.

    The logical checkpoint it just exported plus the run's own counters: the
    next execution keeps the run id, the turn numbers, the event sequence and
    the export series.
    """

    plan: RunPlan
    created_at_ms: int
    turn: int
    tool_rounds: int
    usage: TokenUsage
    messages: tuple[Message, ...]
    events: tuple[EventRecord, ...]
    exports: tuple[ExportRef, ...]
    export_failures: tuple[ExportFailure, ...]
    persistence_failures: tuple[str, ...]
    prior_runs: tuple[RunRecord, ...]
    executions: int  # how many times the run has continued as new, this one included


AgentRunInput.model_rebuild()
ResolveInput.model_rebuild()
