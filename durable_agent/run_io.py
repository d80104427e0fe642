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
    ExportDescriptor,
    ExportError,
    LoopCheckpoint,
    ResumedFrom,
    RunRecord,
    RunStatus,
    SessionCheckpointExportV1,
    open_export,
)
from durable_agent.models import EventRecord, Frozen, Message, TokenUsage, ToolDefinition, ToolUseBlock
from durable_agent.permissions import PermissionPolicy
from durable_agent.run_log import ExportFacts, LogDelta, LogEntry, LogRef, RunHeader, Staged
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
    resume_from_file: str | None = Field(
        None,
        min_length=1,
        description="An export file on the worker's machine to go on from: for an export too large to "
        "pass as input (a workflow input may hold 2 MB).",
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
        if self.resume_from is not None and self.resume_from_file is not None:
            raise ValueError("give resume_from or resume_from_file, not both")
        if self.prompt is None and self.resume_from is None and self.resume_from_file is None:
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
    continue_as_new_events: int = Field(10_000, ge=50)
    continue_as_new_bytes: int = Field(10_000_000, ge=10_000)
    # No longer used (an export no longer passes through Temporal); accepted so that
    # runs recorded with it replay and old configs load.
    max_checkpoint_bytes: int | None = Field(None, deprecated="exports no longer pass through Temporal")


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
    """One model step as a provider sees it: the whole conversation (never an activity input)."""

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
    arguments: dict[str, Any] = Field(default_factory=dict)
    # or: the digest of the model message the model activity staged, whose call ``call_id`` has them
    arguments_in: str | None = None
    # The rules in force, for the activity to judge the path a call resolves to (through links);
    # None (a workflow before this check) skips that check.
    permissions: PermissionPolicy | None = None
    # A resolved path a person approved for this call: an ``ask`` on it no longer stops the call.
    approved_target: str | None = None


class ToolOutput(Frozen):
    content: str
    is_error: bool = False
    # the tool activity kept ``content`` in the session store too, under its digest
    staged: bool = False
    # The call did not run: the path it resolves to (``resolved_target``) is denied by the rules,
    # or needs a person's decision first.
    permission: Literal["denied", "ask"] | None = None
    resolved_target: str | None = None


class ModelStepInput(Frozen):
    """The model activity's input: the conversation is the run's log at ``log``, plus ``pending``."""

    run_id: str
    model: str
    log: LogRef
    pending: LogDelta = LogDelta()


class OpenRunInput(Frozen):
    """Start a run's log: its header (the store adds the session's ended runs) and first entry
    (after the conversation in ``resumed``, for a run resumed from an export file)."""

    header: RunHeader
    seed: LogEntry
    resumed: ExportSeed | None = None


class RunOpened(Frozen):
    prior_run_ids: tuple[str, ...] = ()


class ExportSeed(Frozen):
    """An export that holds a run's log at ``log``: where its starting state is, should
    the store have lost it. A continued run's last export, from its ``sink``; or the export
    file (``path`` on the worker) a run was resumed from (``resumed``: its conversation only)."""

    sink: str | None = None
    path: str | None = None
    descriptor: ExportDescriptor
    log: LogRef
    resumed: bool = False


class ResumeFileInput(Frozen):
    path: str
    run_id: str


class ResumePoint(Frozen):
    """What a run resumed from an export file needs to know of it. The conversation goes
    from the file to the store (``agent.open_run``), not through the history."""

    seed: ExportSeed  # the conversation, as log version 1 of the new run
    resumed_from: ResumedFrom
    capability_binding: CapabilityBinding
    prompt: str
    usage: TokenUsage
    due_calls: tuple[ToolUseBlock, ...] = ()
    open_results: bool = False


class SaveCheckpointInput(Frozen):
    """Append ``entries`` to the run's log.

    A long tool output or model message in the last entry is left empty there
    and named in ``staged``: its activity put it in the store. ``header`` and
    ``seed`` come with a restore, when the store had lost the run.
    """

    run_id: str
    entries: tuple[LogEntry, ...]
    staged: tuple[Staged, ...] = ()
    header: RunHeader | None = None
    seed: ExportSeed | None = None


class LoadSessionInput(Frozen):
    session_id: str
    run_id: str


class SessionRuns(Frozen):
    """The session's other runs, as they ended; part of every export's snapshot."""

    records: tuple[RunRecord, ...] = ()


class FinishRunInput(Frozen):
    """The run's end: the store keeps its record (its log's events plus ``events``) and drops its log."""

    log: LogRef
    events: tuple[EventRecord, ...]
    status: RunStatus
    updated_at_ms: int
    result_text: str | None = None
    error: str | None = None
    # The result text is the last ``text_delta`` event's text in ``events``: sent once, not twice,
    # so that a long final answer fits the payload limit.
    result_is_last_text: bool = False


class ExportInput(Frozen):
    """Build the boundary's export from the run's log at ``log`` and hand it to ``sink``."""

    sink: str
    log: LogRef
    facts: ExportFacts


class ExportRef(Frozen):
    turn: int
    content_digest: str


class ExportFailure(Frozen):
    turn: int
    content_digest: str
    reason: str


class ApprovalDecision(Frozen):
    """The ``approve`` update's input: a person's decision on one waiting call.

    A decision belongs to one request: the call id, in the model step that
    made the call, with those arguments. It is used once: a later call that
    reuses the id (in the same step or a later one) waits for a decision of
    its own. ``step`` and ``arguments_digest``, when given (the CLI always
    gives them, from the request it showed), must be the waiting request's,
    so a decision made on what a person saw cannot approve anything else.
    """

    call_id: str = Field(min_length=1)
    approved: bool
    reason: str | None = Field(None, max_length=2000)
    step: int | None = Field(None, ge=0, description="The model step of the call decided on.")
    arguments_digest: str | None = Field(
        None, description="``sha256:`` digest of the canonical JSON of the call's arguments."
    )


class ApprovalAnswer(Frozen):
    """What the ``approve`` update returns to the person who decided."""

    call_id: str
    tool: str
    approved: bool


class PendingApproval(Frozen):
    """One call waiting for a person's decision, as ``approvals`` and the status query show it."""

    call_id: str
    tool: str
    target: str | None = None
    arguments: str
    since_ms: int
    timeout_seconds: float | None = None
    # The model step that made the call, and the digest of its full arguments (``arguments``
    # is a summary): what a decision is bound to.
    step: int = 0
    arguments_digest: str = ""


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
ACTIVITY_OPEN_RUN = "agent.open_run"
ACTIVITY_READ_RESUME = "agent.read_resume"


# The inputs that workers before linear history scheduled. An activity task an old worker
# queued may be taken by a new one during a deploy; the activities accept these too.


class LegacySaveCheckpointInput(Frozen):
    checkpoint: LoopCheckpoint


class LegacyExportInput(Frozen):
    sink: str
    export: SessionCheckpointExportV1


class LegacyFinishRunInput(Frozen):
    record: RunRecord


class CarriedState(Frozen):
    """What a run hands to its next execution when it continues as new.

    A reference to the state it just saved and exported (``log``, ``seed``),
    never the state itself, plus the run's own counters: the next execution
    keeps the run id, the turn numbers, the event sequence and the export
    series. ``events`` is the newest events only, for followers that lag.
    """

    plan: RunPlan
    created_at_ms: int
    turn: int
    tool_rounds: int
    usage: TokenUsage
    events: tuple[EventRecord, ...]
    exports: tuple[ExportRef, ...]
    export_failures: tuple[ExportFailure, ...]
    persistence_failures: tuple[str, ...]
    executions: int  # how many times the run has continued as new, this one included
    log: LogRef | None = None
    seed: ExportSeed | None = None
    event_count: int | None = None  # None: ``events`` is every event
    pending_events: tuple[EventRecord, ...] = ()  # emitted after the last save
    open_results: bool = False  # the last message holds tool results that more may join
    due_calls: tuple[ToolUseBlock, ...] = ()  # the step's calls still to make
    step_message: str | None = None  # the digest of their message, when its activity staged it
    prior_run_ids: tuple[str, ...] = ()
    # Carried whole by runs recorded before linear history; replayed, never written.
    messages: tuple[Message, ...] = ()
    prior_runs: tuple[RunRecord, ...] = ()


AgentRunInput.model_rebuild()
ResolveInput.model_rebuild()
