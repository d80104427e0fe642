"""Every failure type a workflow or a client reads, and the innermost message of a failure.

A failure type is the ``type`` of a Temporal ``ApplicationError``: an activity raises it and
the workflow compares ``.type`` against it to decide (compact, restore, give up); the workflow
or the codec raises it and a client compares it to tell why an update or a run was refused.
The values are in recorded histories and in hosts' code: none of them ever changes.
``tests/test_failures.py`` fails on a ``type="..."`` literal written anywhere else.

Two kinds of failure carry a class's name instead of a constant here: a tool's unexpected
exception (``agent.tool_call``; nothing reads it but telemetry's ``error.type``) and an export
that fails its own validation (the ``ExportError`` subclass's name, one of
``EXPORT_FAILURE_TYPES``).

Pure (no Temporal): the workflow, the activities, the client and the CLI all import it.
"""

from __future__ import annotations

from typing import Final

# --- raised by activities, read by the workflow ---------------------------------------

# agent.model_call, agent.compact: the request is larger than the model's window; the workflow
# compacts and asks again (``workflows/context_keeper.py``), never retried as it stands.
CONTEXT_OVERFLOW: Final = "ContextOverflow"
# agent.model_call, agent.compact: the provider failed or its answer was refused; retried when
# the provider says it may be.
PROVIDER_ERROR: Final = "ProviderError"
# agent.model_call: the model's answer is larger than one step keeps; the run fails, not retried.
MODEL_ANSWER_TOO_LARGE: Final = "ModelAnswerTooLarge"
# agent.compact: the model wrote an empty summary; the compaction fails, not retried.
EMPTY_SUMMARY: Final = "EmptySummary"
# Any activity that reads the run's log: the store does not hold the state asked for (its first
# detail is the head it holds); the workflow sends the missing entries again, then retries.
STATE_MISSING: Final = "StateMissing"
# agent.open_run: not even the run's last export holds its state; the run fails, naming the
# export to resume from.
STATE_LOST: Final = "StateLost"
# The save and checkpoint activities: a log entry does not match its digest; not retried.
INVALID_LOG_ENTRY: Final = "InvalidLogEntry"
# The export and checkpoint activities: the sink did not take the export (its first detail is
# the export's content digest); retried when the sink says it may be.
SINK_ERROR: Final = "SinkError"
# agent.tool_call, agent.resolve_run, of a run whose workspace follows it (docs/workspaces.md):
# the copy could not be made the run's tree (objects the sink lacks, a sink that is down, git
# failed), or the tree a call left could not be recorded and its objects put in the sink; retried
# (a retry of the call starts again from the tree before it, on whatever worker runs it).
WORKSPACE_NOT_RESTORED: Final = "WorkspaceNotRestored"
WORKSPACE_NOT_RECORDED: Final = "WorkspaceNotRecorded"
# The failure types of a checkpoint's export half: the save before it was done. The sink's, and
# the names of the ``core.export`` errors: an export that fails its own validation is typed by
# its error's class name (not retried); nothing reads one of them alone, so none has a constant.
EXPORT_FAILURE_TYPES: frozenset[str] = frozenset(
    {SINK_ERROR, "ExportError", "InvalidDescriptor", "InvalidPayload", "ContentDrift", "EncodingError"}
)

# --- raised by the workflow or the codec, read by clients -------------------------------
# (a rejected update's ``WorkflowUpdateFailedError.cause.type``, or a run refused at its start;
# the run goes on untouched)

# The workflow's update validators, the client before sending: a message past
# ``[limits] max_message_bytes`` (at a run's start too).
INPUT_TOO_LARGE: Final = "InputTooLarge"
# The ``steer`` validator: ``max_queued_messages`` or ``max_queued_bytes`` steers wait already.
QUEUE_FULL: Final = "SteerQueueFull"
# The update validators: the update would take the history past ``max_history_*``.
HISTORY_FULL: Final = "HistoryLimit"
# The worker's codec (``durable_agent.codec``): the payload is not encrypted, or not with a key
# of the worker's ``[codec]``.
PAYLOAD_REFUSED: Final = "PayloadRefused"
# The workflow at its start, and the activities that resolve its input or config: a run's
# start input or config that cannot be used; the run is refused at once.
INVALID_RUN_INPUT: Final = "InvalidRunInput"

# --- the innermost message --------------------------------------------------------------

# Temporal's failures that only wrap another: an activity's, a child workflow's, a Nexus
# operation's, and the client's for a failed workflow or update. Named, not imported: the core
# has no Temporal (``tests/test_failures.py`` checks that each still exists).
WRAPPING_FAILURES: Final = frozenset(
    {
        "ActivityError",
        "ChildWorkflowError",
        "NexusOperationError",
        "WorkflowFailureError",
        "WorkflowUpdateFailedError",
    }
)


def _wraps(exc: BaseException) -> bool:
    return any(
        cls.__name__ in WRAPPING_FAILURES and cls.__module__.startswith("temporalio.")
        for cls in type(exc).__mro__
    )


def failure_message(exc: BaseException) -> str:
    """The innermost message of a Temporal failure chain: what actually went wrong.

    Past the failures that only wrap another (an activity's, a workflow's, an update's) to the
    first that says something; its message without the type prefix ``str()`` of a Temporal
    failure adds. Deterministic: the workflow records what it returns.
    """
    while _wraps(exc) and exc.__cause__ is not None:
        exc = exc.__cause__
    message = getattr(exc, "message", None)  # a Temporal failure's own text
    if isinstance(message, str) and message:
        return message
    return str(exc) or type(exc).__name__
