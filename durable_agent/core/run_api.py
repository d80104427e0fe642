"""What a host sends an ``AgentRun`` and gets back: its input, result, status,
approvals, and the names of its workflow type, signal, queries and update.

Compatibility rule for these models: fields may be added with defaults; a
field is never renamed or removed while histories that carry it may replay.
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal, NewType

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    field_validator,
    model_validator,
)

from durable_agent.core.context import ContextLedger
from durable_agent.core.events import EventRecord, TodoItem, UserMessageEvent
from durable_agent.core.export import (
    CheckpointPayload,
    ExportError,
    RunRecord,
    SessionCheckpointExportV1,
    open_export,
)

# The types of a rejected update's failure (``WorkflowUpdateFailedError.cause.type``) and of a
# run refused at its start, as a host imported them from here: ``core.failures`` says each.
from durable_agent.core.failures import HISTORY_FULL as HISTORY_FULL
from durable_agent.core.failures import INPUT_TOO_LARGE as INPUT_TOO_LARGE
from durable_agent.core.failures import INVALID_RUN_INPUT as INVALID_RUN_INPUT
from durable_agent.core.failures import PAYLOAD_REFUSED as PAYLOAD_REFUSED
from durable_agent.core.failures import QUEUE_FULL as QUEUE_FULL
from durable_agent.core.models import (
    Frozen,
    Message,
    NonBlank,
    QualifiedModel,
    Sparse,
    TokenUsage,
    ToolUseBlock,
    WorkspaceChange,
)
from durable_agent.core.output_schema import check_output_schema
from durable_agent.core.permissions import PermissionPolicy
from durable_agent.core.plan import RunPlan
from durable_agent.core.run_log import ExportSeed, LogRef
from durable_agent.core.run_workspace import GitSource, RunWorkspace, TreeSource
from durable_agent.core.subagents import ChildRun, SubagentOrigin

WORKFLOW_TYPE = "AgentRun"
SIGNAL_CANCEL = "cancel"
QUERY_STATUS = "status"
QUERY_EVENTS = "events"
# The ended run's result (None before its end): a cancelled run ends in Temporal's Canceled
# state, which carries no result, so its final record is read with this query.
QUERY_RESULT = "result"
UPDATE_APPROVE = "approve"
UPDATE_PROMPT = "prompt"  # a follow-up prompt to a run that waits for one
UPDATE_STEER = "steer"  # a user message the model sees at its next request
SIGNAL_END = "end"  # close a conversation that waits for a prompt
# a run that waits for a prompt goes back to one of its exported turns: files and conversation
UPDATE_REWIND = "rewind"
# wake a waiting run so that it looks whether its worker deployment has a new current build, and
# moves to it (docs/deploys.md): a run that waits creates no workflow task of its own to notice
SIGNAL_UPGRADE = "upgrade"

# Search attributes the worker registers (Keyword) and the workflow keeps current.
SA_SESSION_ID = "AgentSessionId"
SA_RUN_STATUS = "AgentRunStatus"
# What ``AgentRunStatus`` says of a run under way (set at its start: ``client.start_run``).
EXECUTING = "executing"
# What ``AgentRunStatus`` and the ``status`` query say of a run that waits for a person: to
# decide on a call, or (a run with follow-ups, after its answer) to give the next prompt.
AWAITING_APPROVAL = "awaiting_approval"
AWAITING_PROMPT = "awaiting_prompt"

FinalStatus = Literal["completed", "failed", "cancelled", "budget_exhausted"]

# The most a run's ``instructions`` may be, as JSON: they join the system prompt, which the
# run's header and its continue-as-new input carry beside the inputs ``Limits`` bounds (with the
# project files, ``activities/instructions.py``, well within what ``INPUT_BUDGET_BYTES`` leaves).
MAX_INSTRUCTIONS_BYTES = 65_536


class RunSettings(BaseModel):
    """What a run asks of the worker: resolved against its config into the run's plan."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    workspace: Annotated[str, Field(min_length=1)] | GitSource | TreeSource | None = Field(
        None,
        union_mode="left_to_right",
        description="A folder on the worker's machine; or a source the worker makes the run's own "
        'folder from: {"git": URL or path, "ref": "main"}, or {"tree": a tree id of an earlier run}.',
    )
    model: QualifiedModel | None = Field(
        None, description='"provider/model"; default from the worker config.'
    )
    permissions: PermissionPolicy | None = None
    export_sink: str | None = Field(None, min_length=1)
    max_tool_rounds: int | None = Field(None, ge=1, le=10_000)
    approval_timeout_seconds: float | None = Field(
        None, gt=0, description="How long a call that needs approval waits before it is denied."
    )
    idle_timeout_seconds: float | None = Field(
        None, gt=0, description="With follow_ups: how long the run waits for the next prompt."
    )
    max_total_tokens: int | None = Field(None, ge=1, description="The run's token budget.")
    max_cost_usd: float | None = Field(
        None, gt=0, description="The run's cost budget, from the model's prices in the worker config."
    )
    instructions: NonBlank | None = Field(
        None,
        min_length=1,
        description="Text added to the end of the run's system prompt, for this run only (at most "
        f"{MAX_INSTRUCTIONS_BYTES:,} bytes as JSON).",
    )

    output_schema: dict[str, Any] | None = Field(
        None,
        description="A JSON Schema (an object's) the run's answer must match: the model is offered a "
        "`final_result` tool with it, and the run's `output` is the answer (docs/inputs.md).",
    )
    max_output_retries: int | None = Field(
        None,
        ge=0,
        le=20,
        description="With output_schema: how many times the model may try again after an answer "
        "that is not a valid final result (default 3).",
    )

    subagent: SubagentOrigin | None = Field(
        None,
        description="Set by a run for the child a `task` call starts (docs/subagents.md): its parent, "
        "its depth and the tools it may be offered; not for callers.",
    )

    @field_validator("output_schema")
    @classmethod
    def _output_schema_usable(cls, value: dict[str, Any] | None) -> dict[str, Any] | None:
        # refused with the run's input: a schema the run could not check answers with
        return check_output_schema(value) if value is not None else None

    @field_validator("instructions")
    @classmethod
    def _instructions_bounded(cls, value: str | None) -> str | None:
        if value is None:
            return value
        # as JSON, as a prompt is measured: the system prompt travels in the run's payloads
        size = len(json.dumps(value, ensure_ascii=False).encode("utf-8", "surrogatepass"))
        if size > MAX_INSTRUCTIONS_BYTES:
            raise ValueError(
                f"instructions are {size} bytes as JSON, over {MAX_INSTRUCTIONS_BYTES}: put the text in "
                "a file in the workspace and ask the model to read it"
            )
        return value

    def settings(self) -> RunSettings:
        """These settings alone (of an ``AgentRunInput``: without its prompt and export)."""
        return RunSettings.model_validate(self.model_dump(include=set(RunSettings.model_fields)))


class AgentRunInput(RunSettings):
    """The one JSON object that starts an ``AgentRun``. Unknown fields are refused."""

    prompt: NonBlank | None = Field(None, min_length=1, description="Required, unless resume_from is given.")
    session_id: str | None = Field(None, min_length=1, max_length=200)
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
    follow_ups: bool = Field(
        False, description="After the final answer, wait for the next prompt (update `prompt`) or `end`."
    )
    continued: CarriedState | None = Field(
        None, description="Set by the run itself when it continues as new; not for callers."
    )
    rewind: RewindOrigin | None = Field(
        None,
        description="Set by a run that the `rewind` update sent back to one of its turns, for the new "
        "run it continues as (resumed from that turn's export); not for callers.",
    )

    @model_validator(mode="after")
    def _prompt_or_resume(self) -> AgentRunInput:
        if self.resume_from is not None and self.resume_from_file is not None:
            raise ValueError("give resume_from or resume_from_file, not both")
        # a run that continues as new carries its prompt in its plan
        resumed = self.resume_from is not None or self.resume_from_file is not None
        if self.prompt is None and not resumed and self.continued is None:
            raise ValueError("prompt is required (unless the run resumes from an export)")
        if self.resume_from is not None:
            try:
                open_export(self.resume_from)
            except ExportError as exc:
                raise ValueError(f"resume_from is refused: {type(exc).__name__}: {exc}") from None
        return self

    def resume_payload(self) -> CheckpointPayload | None:
        """The opened export this run resumes from, if any (validated when the input was).

        Returns:
            The payload of ``resume_from``, or ``None`` when the run resumes from no export
                given by value.
        """
        return open_export(self.resume_from) if self.resume_from is not None else None


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


class UserText(Frozen):
    """A person's message to a run: not blank."""

    text: NonBlank = Field(min_length=1)


class FollowUpPrompt(UserText):
    """The ``prompt`` update's input: the next user message of a run that waits for one."""


class PromptAccepted(Frozen):
    """What the ``prompt`` update returns: the turn starts; its events follow ``after_sequence``."""

    after_sequence: int


class SteerMessage(UserText):
    """The ``steer`` update's input: a user message the model sees at its next request."""


class RewindRequest(Frozen):
    """The ``rewind`` update's input: go back to one of the run's exported turns (docs/exports.md)."""

    turn: int = Field(ge=1, description="A turn the run exported (its tool boundary).")
    prompt: NonBlank | None = Field(
        None, min_length=1, description="A user message the resumed run adds before its first request."
    )


class RewindOrigin(Frozen):
    """Where a rewound run goes back to: the run, its export of ``turn``, and the workspace's tree
    that export recorded (None: it recorded none, and the files were left as they were)."""

    run_id: str
    turn: int
    content_digest: str
    tree: str | None = None


class RewindAccepted(Frozen):
    """What the ``rewind`` update returns: the workspace is restored (``tree``; None: the export
    recorded no tree, the files are as they were) and the run goes on, under the same workflow id,
    as a new run resumed from ``content_digest``, the export of ``turn``."""

    turn: int
    content_digest: str
    tree: str | None = None


class SteerAccepted(Frozen):
    """What the ``steer`` update returns: the message waits for the model's next request."""

    queued: int  # how many user messages wait for that request, this one included


class Budget(Frozen):
    """Usage against one budget, as ``status`` shows it."""

    budget: Literal["tokens", "cost"]
    used: float
    limit: float


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


class RunStatusView(Sparse):
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
    budgets: tuple[Budget, ...] = ()  # usage against the run's budgets (this run's own usage)
    # this run's cost at the model's prices (cache reads and writes at theirs); None: no prices
    cost_usd: float | None = None
    event_count: int = 0  # the sequence of the run's newest event
    # context management: compactions so far, the next request's size by the run's estimate
    # (``durable_agent.core.context``), the model's window (0: not managed)
    compactions: int = 0
    context_tokens: int = 0
    context_window: int = 0
    todos: tuple[TodoItem, ...] = ()  # the plan the model wrote last with ``todo_write``
    # a run with an output_schema: its answer once the model gave a valid one (left out when None)
    output: dict[str, Any] | None = None
    # subagents (docs/subagents.md): the children this run started, and a child's parent (its
    # workflow id); left out of the JSON when there are none
    children: tuple[ChildRun, ...] = ()
    parent_workflow_id: str | None = None

    left_out_at_default = ("output", "children", "parent_workflow_id")


class AgentRunResult(Sparse):
    """What an ``AgentRun`` gives when it ends, however it ended (its ``result`` query too).

    Attributes:
        session_id: The run's session.
        run_id: The run's id (the same across its executions when it continues as new).
        status: ``completed``, ``failed``, ``cancelled`` or ``budget_exhausted``.
        text: The model's final answer (empty when there is none).
        error: Why the run did not complete, when it did not.
        tool_calls_count: How many tool calls the run made.
        usage: The run's token usage (its own, not a resumed export's).
        exports: One entry per export delivered (its turn and content digest).
        export_failures: The exports that failed, with their reasons.
        persistence_failures: What the run could not save in the session store.
        output: A run with an ``output_schema``: its answer, the arguments of the model's valid
            ``final_result`` call (None when the run did not complete with one). Left out of the
            JSON when None, so a run without a schema has the result it had before.
        cost_usd: A subagent's cost (its own and its children's) at its models' prices, which
            its parent counts against its budget; None (left out of the JSON) for a run a host
            started, or without prices.
    """

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
    output: dict[str, Any] | None = None
    # A subagent's cost at its model's prices, for its parent's budget (None, left out of the
    # JSON: a run a host started, or a model without prices).
    cost_usd: float | None = None
    # What the run did to its workspace: its base and final trees and their diff, bounded
    # (docs/workspaces.md); None (left out of the JSON): no tree recorded.
    workspace: WorkspaceChange | None = None

    left_out_at_default = ("output", "cost_usd", "workspace")


# The schema of ``CarriedState`` this build writes, and the oldest it reads (docs/deploys.md,
# "The carried state"). 1: the state before the schema was written (no ``schema_version``). A
# build reads the schema it writes and the one before it (a run moving to it from the build
# before); and a newer one whose ``min_reader`` it meets (a rollback moves runs back to it): a
# newer build that only adds top-level fields with defaults keeps ``min_reader`` (the older one
# ignores them); one that changes what a field means, or adds one in a nested model, raises it.
CARRIED_STATE_SCHEMA = 2
CARRIED_STATE_OLDEST = CARRIED_STATE_SCHEMA - 1
# The oldest schema a build must read to take the state this build writes.
CARRIED_STATE_MIN_READER = 1


class CarriedStateUnreadable(RuntimeError):
    """The carried state's schema is one this build cannot read.

    Raised in the workflow (not an ``ApplicationError``), it fails the workflow task, not the run:
    Temporal retries the task, and the run goes on once a build that reads it is current.
    """


class CarriedState(Frozen):
    """What a run hands to its next execution when it continues as new.

    A reference to the state it just saved and exported (``log``, ``seed``),
    never the state itself, plus the run's own counters: the next execution
    keeps the run id, the turn numbers, the event sequence and the export
    series. ``events`` is the newest events only, for followers that lag.

    A versioned schema (``schema_version``, ``min_reader``; see ``CARRIED_STATE_SCHEMA``): the
    build a run moves to and the build before it both read it, and fields a newer build added at
    this level are ignored (``extra="ignore"``), so that a rollback moves runs back.
    """

    model_config = ConfigDict(frozen=True, extra="ignore")

    # absent in the states written before the schema was: those are schema 1; a run writes
    # this build's (``stamped``)
    schema_version: int = Field(1, ge=1)
    min_reader: int = Field(1, ge=1)  # the oldest schema a build must read to take this state
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
    queued: tuple[UserMessageEvent, ...] = ()  # user messages waiting for the next model request
    run_usage: TokenUsage | None = None  # this run's own usage, for its budgets (None: ``usage``)
    context: ContextLedger | None = None  # the context ledger (None: context not managed)
    todos: tuple[TodoItem, ...] = ()  # the plan the model wrote last (``todo_write``)
    children: tuple[ChildRun, ...] = ()  # the subagents the run started (``core/subagents.py``)
    workspace: RunWorkspace | None = None  # the workspace's tree and host (``core/run_workspace.py``)
    # A run that moved to a new build while it waited for its next prompt: since when it waits (epoch
    # ms), so that its idle timeout goes on from there rather than starting again (docs/deploys.md).
    idle_since_ms: int | None = None
    # A typed run's failed answers since its last valid one (``workflows/final_result.py``): its
    # ``max_output_retries`` count on across the move, not from 0 again. Read as 0 from a state
    # written before it (and ignored by a build before it, as any field it does not know).
    output_failures: int = 0
    # Carried whole by runs recorded before linear history; replayed, never written.
    messages: tuple[Message, ...] = ()
    prior_runs: tuple[RunRecord, ...] = ()

    def stamped(self) -> CarriedState:
        """This state as this build writes it: its schema and the oldest reader it needs.

        Returns:
            A copy with ``schema_version`` ``CARRIED_STATE_SCHEMA`` and ``min_reader``
                ``CARRIED_STATE_MIN_READER``.
        """
        return self.model_copy(
            update={"schema_version": CARRIED_STATE_SCHEMA, "min_reader": CARRIED_STATE_MIN_READER}
        )

    def check_readable(self) -> None:
        """Refuse a state this build cannot read (``CARRIED_STATE_SCHEMA`` says which).

        Raises:
            CarriedStateUnreadable: Its schema is older than ``CARRIED_STATE_OLDEST``, or newer
                and asks for a reader newer than this build.
        """
        if self.schema_version < CARRIED_STATE_OLDEST:
            raise CarriedStateUnreadable(
                f"the run carried state of schema {self.schema_version}; this build reads "
                f"{CARRIED_STATE_OLDEST} to {CARRIED_STATE_SCHEMA}: make current a build that reads it"
            )
        if self.min_reader > CARRIED_STATE_SCHEMA:
            raise CarriedStateUnreadable(
                f"the run carried state of schema {self.schema_version}, which a build of schema "
                f"{self.min_reader} or newer must read; this build is of schema {CARRIED_STATE_SCHEMA}: "
                "make current a build that reads it"
            )


AgentRunInput.model_rebuild()

# The start input as the workflow reads it: a JSON object, checked as ``AgentRunInput`` by the
# run itself, which refuses a bad one with a reason instead of failing its workflow task.
RunInputJson = NewType("RunInputJson", dict[str, Any])


# What a client sends a run: with ``[codec]`` keys on the worker, each of these must come
# encrypted with one of them, or it is refused (``durable_agent.codec``).
class RunControl(Frozen):
    """The payload of the ``cancel`` and ``end`` signals: a client with ``[codec]`` keys sends one,
    encrypted, and a worker with keys takes these signals with no other (``codec.py``), so a
    client without the keys cannot stop anyone's run. A worker without keys takes the signals
    as they always came too: no payload, or ``cancel``'s reason as a plain string."""

    # not bounded here: a reason too long would drop the signal; the run cuts it (``Cancellation``)
    reason: str | None = None

    @model_validator(mode="before")
    @classmethod
    def _as_sent_before(cls, value: Any) -> Any:
        if value is None:
            return {}
        return {"reason": value} if isinstance(value, str) else value


INBOUND_TYPES: frozenset[object] = frozenset(
    {RunInputJson, ApprovalDecision, FollowUpPrompt, SteerMessage, RewindRequest, RunControl}
)


def is_inbound(hint: object) -> bool:
    """Whether ``hint`` is the type of something a client sends a run (``INBOUND_TYPES``)."""
    try:
        return hint in INBOUND_TYPES
    except TypeError:  # an unhashable hint is none of them
        return False
