"""The inputs and outputs of ``AgentRun``'s activities, and their stable names.

Compatibility rule: fields may be added with defaults; a field is never renamed
or removed while histories that carry it may replay.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, Literal, TypeVar

from pydantic import Field

from durable_agent.core.capability_binding import CapabilityBinding
from durable_agent.core.context import ContextLedger
from durable_agent.core.events import EventRecord, TodoItem
from durable_agent.core.export import ExportDescriptor, ResumedFrom, RunRecord, RunStatus
from durable_agent.core.hooks import HookDocument, HookEventName, HookInput, HookOutcome, HookRef
from durable_agent.core.models import (
    Frozen,
    ImageBlock,
    Message,
    ModelResponse,
    TokenUsage,
    ToolDefinition,
    ToolUseBlock,
    WorkspaceChange,
    WorkspaceRestore,
    WorkspaceState,
)
from durable_agent.core.permissions import PermissionPolicy
from durable_agent.core.plan import RunPlan, Timeouts
from durable_agent.core.run_api import AgentRunInput, RunSettings
from durable_agent.core.run_log import ExportFacts, ExportSeed, LogDelta, LogEntry, LogRef, RunHeader, Staged
from durable_agent.core.run_workspace import WorkspaceOrigin

InT = TypeVar("InT")
OutT = TypeVar("OutT")


class ResolveInput(Frozen):
    """Check a run's settings against the worker's config; the plan comes back without the
    prompt, which the workflow already holds."""

    session_id: str
    run_id: str
    settings: RunSettings | None = None
    resumed_from: ResumedFrom | None = None
    resume_permissions: PermissionPolicy | None = None
    # A resumed run's checkpoint recorded the workspace as this git tree: the run is refused
    # where the workspace's files differ (None: no tree, or a resume with ``force_resume``).
    workspace_tree: str | None = None
    # A resumed or rewound run made from a git source: where its checkpoint's run's workspace came
    # from, so that its change is committed on the same commit and pushed (``[workspaces] commit``).
    resume_origin: WorkspaceOrigin | None = None
    # A rewound run whose workspace follows it: the worker makes its copy hold ``workspace_tree``
    # (the run asked for those files) instead of refusing a copy that differs.
    restore_workspace: bool = False
    # A resumed run's tools, as its checkpoint bound them: it is offered those of them this
    # worker has, so a release that adds tools still resumes the exports made before it.
    resume_tools: tuple[str, ...] | None = None
    # Sent by workflows before 0.2 (the whole input, prompt included, without ``resume_from``).
    run: AgentRunInput | None = None

    def run_settings(self) -> RunSettings:
        if self.settings is not None:
            return self.settings
        return self.run.settings() if self.run is not None else RunSettings()


class ModelCallInput(Frozen):
    """One model request as a provider sees it (never an activity input): the conversation as
    the model sees it, which after a compaction is not the whole transcript."""

    run_id: str
    model: str
    system_prompt: str
    messages: tuple[Message, ...]
    tools: tuple[ToolDefinition, ...]
    # The run's model step (0-based: assistant messages in the whole transcript); None: count them.
    step: int | None = None
    # "summary": the request asks for a summary of older turns (``agent.compact``).
    purpose: Literal["step", "summary"] = "step"
    # The run's session: the key of the provider's prompt cache (OpenAI's ``prompt_cache_key``),
    # so that the runs of one session share their cached prefix.
    session_id: str | None = None


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
    # The run's export sink: a call to a tool that may change files records the workspace as a
    # git tree, whose new objects go to this sink (None: a workflow before this records none).
    sink: str | None = None
    # A call run as a local activity: the newest log entry the store had acknowledged when the
    # call was made. A workflow task that runs again after its worker died may find, after it,
    # the boundary its lost attempt already exported; the call then returns the output recorded
    # there, so the boundary is exported once, with the same bytes (``recorded_output``).
    recorded_after: LogRef | None = None
    # A run whose workspace follows it (docs/workspaces.md): the tree the workspace must be at
    # when the call starts, which the worker restores its copy to first (None: not followed).
    expect_tree: str | None = None
    # The run's host, the worker whose copy is at ``expect_tree`` (None: none yet). Another
    # worker whose copy is not there answers ``elsewhere`` instead of restoring it...
    host: str | None = None
    # ...unless the host did not take the call in time: then any worker restores and runs it.
    take_over: bool = False


class ToolOutput(Frozen):
    content: str
    is_error: bool = False
    # Images besides the text, as references: the tool activity kept their data in the session
    # store (the history holds their digests, not megabytes).
    images: tuple[ImageBlock, ...] = ()
    # the tool activity kept ``content`` in the session store too, under its digest
    staged: bool = False
    # The call did not run: the path it resolves to (``resolved_target``) is denied by the rules,
    # or needs a person's decision first.
    permission: Literal["denied", "ask"] | None = None
    resolved_target: str | None = None
    # When the activity returned (epoch ms): the workflow stamps the call's end and its boundary
    # with it, not with its own clock, so that a workflow task that runs again after its worker
    # died builds the same checkpoint, byte for byte (its local activity's input is not recorded).
    completed_at_ms: int | None = None
    # The workspace after the call (a tool that may change files, on a worker that records it),
    # its objects already in the run's sink; the workflow puts it in the call's ``tool_end`` event.
    workspace: WorkspaceState | None = None
    # The worker that ran the call with the run's workspace at ``expect_tree``: the run's host.
    host: str | None = None
    # It restored its copy to ``expect_tree`` first (the run moved there, or its copy diverged).
    restored: WorkspaceRestore | None = None
    # The call did not run: this worker's copy is not at ``expect_tree`` and the run's host is
    # another worker, to which the workflow sends the call (``content`` says so).
    elsewhere: bool = False
    # A ``task`` call's child that worked on a copy of its own: the tree it started from (its
    # parent's at the call); ``workspace`` is the tree it ended at. The parent merges the child's
    # change into its own tree when it records the call (``workflows/child_merge.py``).
    merge_base: str | None = None


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
    # the file's conversation measured, with the source run's newest view (context management)
    context: ContextLedger | None = None
    # the workspace's git tree at the checkpoint (its last ``tool_end`` that recorded one)
    workspace_tree: str | None = None
    # where the run's workspace came from, when a git source made it (its ``run_start`` event)
    workspace_origin: WorkspaceOrigin | None = None
    # the model's plan at the checkpoint (``todo_list.plan_at_checkpoint``); none in a point
    # recorded before it was sent
    todos: tuple[TodoItem, ...] = ()


class CompactInput(Frozen):
    """Summarize ``messages[1:upto]`` of the run's conversation (the log at ``log``, plus
    ``pending``) as the model sees it now, with ``model`` ("provider/model")."""

    run_id: str
    model: str
    log: LogRef
    pending: LogDelta = LogDelta()
    upto: int = Field(ge=2)
    max_summary_tokens: int = Field(ge=1)
    budget_tokens: int = Field(ge=1)  # how much of the conversation the summarizing request holds


class CompactOutput(Frozen):
    summary: str
    usage: TokenUsage = TokenUsage()


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
    # The run's session: an attempt that finds the log gone looks there for the record an earlier
    # attempt kept (it finished, then timed out), and is done (None: a workflow before this).
    session_id: str | None = None


class ExportInput(Frozen):
    """Build the boundary's export from the run's log at ``log`` and hand it to ``sink``."""

    sink: str
    log: LogRef
    facts: ExportFacts


class CheckpointInput(Frozen):
    """A tool boundary in one call: append ``save``'s entries to the run's log (when there
    are any), then build the export of the log at ``export.log`` and hand it to the sink.
    The store holds the state before the sink is asked for it."""

    save: SaveCheckpointInput | None = None
    export: ExportInput


class RestoreWorkspaceInput(Frozen):
    """A ``rewind``: make ``workspace`` hold the files of the tree that the run's export of
    ``turn`` (``content_digest``, in the sink ``sink``) recorded."""

    workspace: str
    sink: str
    session_id: str
    run_id: str
    turn: int
    content_digest: str


class WorkspaceRestored(Frozen):
    """The workspace restored: the export's file on the worker (the resumed run reads it), and
    the tree (None: the export recorded none, the files were left as they were)."""

    export_path: str
    tree: str | None = None


# --- the activities, each declared once -------------------------------------------


@dataclass(frozen=True)
class ActivityOptions:
    """How long one activity may run and how often Temporal tries it (seconds)."""

    start_to_close_seconds: float
    maximum_attempts: int
    heartbeat_seconds: float | None = None
    # a retry after a lost worker's heartbeat timeout waits this long first
    initial_interval_seconds: float = 0.5
    maximum_interval_seconds: float | None = None


class RequestCancelInput(Frozen):
    """Ask Temporal to cancel this execution of a run (``workflow_id``, ``run_id``): a run that
    the ``cancel`` signal ended asks so that it can end Canceled, as a cancel request's does."""

    workflow_id: str
    run_id: str
    reason: str | None = None


@dataclass(frozen=True)
class ActivityDecl(Generic[InT, OutT]):
    """One activity: its stable name (recorded histories refer to it), its input and result
    types, and its options, taken from the run's ``[timeouts]``.

    The workflow calls activities only through their declarations, so mypy checks every
    call's input and result; ``tests/test_activity_table.py`` checks that the worker's
    activities take and return what their declarations say.
    """

    name: str
    input_type: type[InT]
    # The result's type as Temporal's converter needs it (a type, or a union such as
    # ``ExportDescriptor | None``); ``OutT`` is the same type for mypy.
    result_type: Any
    options: Callable[[Timeouts], ActivityOptions]


def _heartbeating(
    seconds: Callable[[Timeouts], float], attempts: Callable[[Timeouts], int]
) -> Callable[[Timeouts], ActivityOptions]:
    """The options of an activity that heartbeats: its time limit and attempts from the run's
    timeouts, a lost worker noticed after ``heartbeat_seconds``."""
    return lambda t: ActivityOptions(
        start_to_close_seconds=seconds(t),
        maximum_attempts=attempts(t),
        heartbeat_seconds=t.heartbeat_seconds,
    )


def _checkpoint(attempts: Callable[[Timeouts], int]) -> Callable[[Timeouts], ActivityOptions]:
    return _heartbeating(lambda t: t.checkpoint_seconds, attempts)


def _model_options(t: Timeouts) -> ActivityOptions:
    """A model request (a step or a summary): 429s and 5xx back off from 1 s to 60 s (a
    ``Retry-After`` sets the delay itself)."""
    return ActivityOptions(
        start_to_close_seconds=t.model_seconds,
        maximum_attempts=t.model_max_attempts,
        heartbeat_seconds=t.heartbeat_seconds,
        initial_interval_seconds=1,
        maximum_interval_seconds=60,
    )


# Before the plan exists (resolving it, reading an export to resume from) the worker's
# timeouts are not known yet: these two use fixed options.
RESOLVE_RUN = ActivityDecl[ResolveInput, RunPlan](
    "agent.resolve_run",
    ResolveInput,
    RunPlan,
    # reads config and stats a folder: a short timeout retries a crashed worker's attempt fast
    lambda _: ActivityOptions(start_to_close_seconds=10, maximum_attempts=3),
)
READ_RESUME = ActivityDecl[ResumeFileInput, ResumePoint](
    "agent.read_resume",
    ResumeFileInput,
    ResumePoint,
    lambda _: ActivityOptions(start_to_close_seconds=60, maximum_attempts=3, heartbeat_seconds=20),
)
OPEN_RUN = ActivityDecl[OpenRunInput, RunOpened](
    "agent.open_run", OpenRunInput, RunOpened, _checkpoint(lambda t: t.checkpoint_max_attempts)
)
MODEL_CALL = ActivityDecl[ModelStepInput, ModelResponse](
    "agent.model_call", ModelStepInput, ModelResponse, _model_options
)
COMPACT = ActivityDecl[CompactInput, CompactOutput](
    "agent.compact", CompactInput, CompactOutput, _model_options
)
TOOL_CALL = ActivityDecl[ToolCallInput, ToolOutput](
    "agent.tool_call",
    ToolCallInput,
    ToolOutput,
    _heartbeating(lambda t: t.tool_seconds, lambda t: t.tool_max_attempts),
)
SAVE_CHECKPOINT = ActivityDecl[SaveCheckpointInput, None](
    "agent.save_checkpoint", SaveCheckpointInput, None, _checkpoint(lambda t: t.checkpoint_max_attempts)
)
EXPORT_CHECKPOINT = ActivityDecl[ExportInput, ExportDescriptor | None](
    "agent.export_checkpoint",
    ExportInput,
    # None: recorded before exports were built from the log (``durable_agent.core.legacy_shapes``)
    ExportDescriptor | None,
    _checkpoint(lambda t: t.export_max_attempts),
)
# Both halves in one local activity: a boundary costs one workflow task, not three.
CHECKPOINT = ActivityDecl[CheckpointInput, ExportDescriptor](
    "agent.checkpoint",
    CheckpointInput,
    ExportDescriptor,
    _checkpoint(lambda t: min(t.checkpoint_max_attempts, t.export_max_attempts)),
)
FINISH_RUN = ActivityDecl[FinishRunInput, None](
    "agent.finish_run", FinishRunInput, None, _checkpoint(lambda t: t.checkpoint_max_attempts)
)
# A workflow cannot request its own cancel (the server refuses one aimed at the caller): a
# run cancelled by the signal asks through an activity, on the worker's client.
REQUEST_CANCEL = ActivityDecl[RequestCancelInput, None](
    "agent.request_cancel",
    RequestCancelInput,
    None,
    lambda _: ActivityOptions(start_to_close_seconds=10, maximum_attempts=5),
)
# A hook's time limit, and the margin its activity keeps above it: to start the sandbox, stop
# the command at its limit and report, rather than time out and run it again.
HOOK_MARGIN_SECONDS = 15.0
HOOK = ActivityDecl[HookInput, HookOutcome](
    "agent.hook",
    HookInput,
    HookOutcome,
    _heartbeating(lambda t: t.hook_seconds + HOOK_MARGIN_SECONDS, lambda t: t.hook_max_attempts),
)


def hook_call(
    plan: RunPlan, ref: HookRef, event: HookEventName, document: HookDocument
) -> tuple[HookInput, Timeouts]:
    """What the workflow runs ``HOOK`` with for one hook: its input, and the timeouts that give
    its activity the hook's own time limit.

    Args:
        plan: The run's plan.
        ref: The hook (one of ``hooks_for(plan.hooks, ...)``).
        event: The moment it runs at.
        document: What it reads on stdin (``hook_document``).

    Returns:
        ``HOOK``'s input, and the ``timeouts`` to run it under (``CallRunner.run``).
    """
    seconds = ref.hook.timeout_seconds or plan.timeouts.hook_seconds
    inp = HookInput(
        run_id=plan.run_id,
        workspace=plan.workspace,
        event=event,
        index=ref.index,
        hook=ref.hook,
        document=document,
        timeout_seconds=seconds,
    )
    return inp, plan.timeouts.model_copy(update={"hook_seconds": seconds})


# A ``rewind`` update's one side effect: the workspace's files as a turn's export recorded them.
RESTORE_WORKSPACE = ActivityDecl[RestoreWorkspaceInput, WorkspaceRestored](
    "agent.restore_workspace",
    RestoreWorkspaceInput,
    WorkspaceRestored,
    _heartbeating(lambda t: t.tool_seconds, lambda _: 3),
)


class WorkspaceChangeInput(Frozen):
    """What a run did to its workspace, for its result: the diff from ``base`` to ``final``,
    read from the run's sink where the worker's shadow lacks their objects."""

    workspace: str
    sink: str
    base: str | None = None
    final: str | None = None


# At the end of a run whose workspace follows it, before its log is finished (local).
WORKSPACE_CHANGE = ActivityDecl[WorkspaceChangeInput, WorkspaceChange](
    "agent.workspace_change",
    WorkspaceChangeInput,
    WorkspaceChange,
    _checkpoint(lambda t: t.checkpoint_max_attempts),
)


class WorkspaceCommitInput(Frozen):
    """A run's change committed on the commit its workspace was made from, and pushed to
    ``origin.branch`` of its repository (``[workspaces] commit``)."""

    workspace: str
    sink: str
    origin: WorkspaceOrigin
    tree: str
    message: str
    at_ms: int  # the commit's time: the run's, so that an attempt again makes the same commit


class WorkspaceCommitted(Frozen):
    """The commit pushed, and the branch it went to."""

    commit: str
    branch: str


# At the end of a run whose workspace came from a git source, once its rules (or a person) let it
# push: an ordinary activity, retried as a tool call is (a push that reached the repository is
# found there again: the same commit, since its time is the run's).
WORKSPACE_COMMIT = ActivityDecl[WorkspaceCommitInput, WorkspaceCommitted](
    "agent.workspace_commit",
    WorkspaceCommitInput,
    WorkspaceCommitted,
    _heartbeating(lambda t: t.tool_seconds, lambda t: t.tool_max_attempts),
)


class WorkspaceMergeInput(Frozen):
    """A child run's change merged into its parent's workspace: git's three-way merge of
    ``theirs`` (the child's final tree) into ``ours`` (the parent's tree now), from ``base`` (the
    parent's tree when the child started). Every tree's objects are in the run's sink."""

    workspace: str  # the parent's workspace: the merge uses its shadow repository's objects
    sink: str
    base: str = Field(pattern=r"^[0-9a-f]{40}$")
    ours: str = Field(pattern=r"^[0-9a-f]{40}$")
    theirs: str = Field(pattern=r"^[0-9a-f]{40}$")


class WorkspaceMerge(Frozen):
    """The merge's outcome: the merged tree (its new objects already in the sink), or the files
    whose changes conflict (then ``tree`` is None and the parent's tree stays as it was)."""

    tree: str | None = None
    conflicts: tuple[str, ...] = ()


# When a parent records a ``task`` call whose child changed files while the parent's tree moved
# on too (a sibling merged first): an ordinary activity, on any worker, retried as a tool call is
# (the same three trees merge to the same tree).
WORKSPACE_MERGE = ActivityDecl[WorkspaceMergeInput, WorkspaceMerge](
    "agent.workspace_merge",
    WorkspaceMergeInput,
    WorkspaceMerge,
    _heartbeating(lambda t: t.tool_seconds, lambda t: t.tool_max_attempts),
)

# Only runs started before linear history load their session (``durable_agent.core.legacy_shapes``).
LOAD_SESSION = ActivityDecl[LoadSessionInput, SessionRuns](
    "agent.load_session", LoadSessionInput, SessionRuns, _checkpoint(lambda _: 3)
)

ACTIVITIES: tuple[ActivityDecl[Any, Any], ...] = (
    RESOLVE_RUN,
    READ_RESUME,
    OPEN_RUN,
    MODEL_CALL,
    COMPACT,
    TOOL_CALL,
    SAVE_CHECKPOINT,
    EXPORT_CHECKPOINT,
    CHECKPOINT,
    FINISH_RUN,
    LOAD_SESSION,
    REQUEST_CANCEL,
    HOOK,
    RESTORE_WORKSPACE,
    WORKSPACE_CHANGE,
    WORKSPACE_COMMIT,
    WORKSPACE_MERGE,
)


ResolveInput.model_rebuild()
