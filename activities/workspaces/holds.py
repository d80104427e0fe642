"""A call's hold on this machine's copy of the run's workspace (``WorkspaceCopies``), from the
call's activity (a tool call's, a hook's): taken and given back heartbeating, their failures
the activity's typed errors, and what the model is told when the copy was restored first.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from temporalio import activity
from temporalio.exceptions import ApplicationError

from durable_agent.activities.support import heartbeating
from durable_agent.activities.workspace_tree import WorkspaceTooLarge
from durable_agent.activities.workspaces.copies import Held, WorkspaceCopies
from durable_agent.activities.workspaces.errors import WorkspaceTreeError
from durable_agent.core.failures import WORKSPACE_NOT_RECORDED, WORKSPACE_NOT_RESTORED
from durable_agent.core.models import WorkspaceRestore, WorkspaceState

__all__ = ["entered", "left", "restore_note"]


async def entered(
    copies: WorkspaceCopies,
    workspace: str,
    tree: str,
    sink: str | None,
    host: str | None,
    take_over: bool,
    *,
    changes: bool = True,
    redact: Callable[[str], str] = str,
) -> Held | None:
    """``WorkspaceCopies.enter`` from an activity (a tool call's, a hook's), heartbeating.

    A retry of an ordinary activity most often follows a host that died mid-call: it restores
    here rather than send the call back to that host. A local activity is retried within its
    workflow task, on this worker, and restores here only as the run's host.

    Args:
        copies: This worker's copies.
        workspace: The run's workspace folder.
        tree: The tree the run expects.
        sink: The run's export sink.
        host: The run's host.
        take_over: The workflow asks any worker to take the run over.
        changes: The call may change files.
        redact: The worker's redaction of credentials, for the error's message.

    Returns:
        The call's hold, or None: the run's host is another worker.

    Raises:
        ApplicationError: The copy could not be restored (``WORKSPACE_NOT_RESTORED``; Temporal
            retries it: a sink that was down may answer the next attempt).
    """
    info = activity.info()
    take_over = take_over or (info.attempt > 1 and not info.is_local)
    try:
        return await heartbeating(
            copies.enter(Path(workspace), tree, sink or "", host=host, take_over=take_over, changes=changes)
        )
    except WorkspaceTreeError as exc:
        raise ApplicationError(
            redact(f"workspace not restored: {exc}"), type=WORKSPACE_NOT_RESTORED
        ) from None


async def left(
    copies: WorkspaceCopies,
    held: Held,
    sink: str | None,
    redact: Callable[[str], str] = str,
    *,
    record: bool = True,
) -> WorkspaceState | None:
    """``WorkspaceCopies.leave`` from an activity, heartbeating.

    Args:
        copies: This worker's copies.
        held: What ``entered`` gave.
        sink: The run's export sink.
        redact: The worker's redaction of credentials, for the error's message.
        record: The call may have changed files.

    Returns:
        The tree the call left (with ``record``).

    Raises:
        ApplicationError: The tree could not be recorded or its objects put in the sink
            (``WORKSPACE_NOT_RECORDED``): the call's changes are nowhere the run could find them on
            another machine, so the next attempt runs it again from the tree before it.
        WorkspaceTooLarge: Past ``[workspaces] max_bytes``: the copy is back at the call's tree.
    """
    try:
        return await heartbeating(copies.leave(held, sink, record=record))
    except WorkspaceTooLarge:
        raise  # the call's answer says so: its changes were undone
    except WorkspaceTreeError as exc:
        raise ApplicationError(redact(str(exc)), type=WORKSPACE_NOT_RECORDED) from None


def restore_note(restored: WorkspaceRestore) -> str:
    """What the model is told, after a call's output, when its workspace was restored first.

    Args:
        restored: The restore.

    Returns:
        One paragraph, starting with a blank line.
    """
    if restored.reason == "moved":
        where = "The run moved to another machine before this call"
    else:
        where = "The workspace on this machine had diverged from the run's files before this call"
    return (
        f"\n\n[{where}: its files were restored to the run's last recorded state (tree "
        f"{restored.tree[:12]}). Processes started in the background earlier and ignored files "
        "(node_modules, build output, caches) did not come along: start or build them again if "
        "you need them.]"
    )
