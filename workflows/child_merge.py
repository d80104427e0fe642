"""A child's change merged into its parent's workspace when the parent records the ``task`` call
(docs/workspaces.md, Subagents).

A child that may change files works on a copy of its own, made from its parent's tree at the
call (``child_runs.py``); its output carries the tree it started from (``merge_base``) and the
tree it ended at. The parent records its calls in the answer's order (``call_batch.py``), so the
children of one answer are merged in call order, each into the tree the ones before it left:

- the child changed nothing: the parent's tree stays;
- the parent's tree did not move since the child started: the child's tree is the parent's;
- else ``agent.workspace_merge`` (git's three-way merge, on the objects in the sink) gives the
  merged tree; a conflict is a tool error naming the files and the child's tree (which the sink
  keeps: nothing is lost), and the parent's tree stays.
"""

from __future__ import annotations

from temporalio import workflow
from temporalio.exceptions import ActivityError

with workflow.unsafe.imports_passed_through():
    from durable_agent.core.activity_api import WORKSPACE_MERGE, ToolOutput, WorkspaceMergeInput
    from durable_agent.core.failures import failure_message
    from durable_agent.core.loop import LoopState
    from durable_agent.core.models import WorkspaceState

from durable_agent.workflows.calls import CallRunner

# The files a conflict's tool error names at most.
CONFLICTS_SHOWN = 20


async def merged(calls: CallRunner, state: LoopState, output: ToolOutput) -> ToolOutput:
    """The ``task`` call's output with the child's change merged into the parent's tree.

    Args:
        calls: The parent's ``CallRunner``.
        state: The parent's state: its workspace's tree now.
        output: The call's output, as ``SubagentRunner`` gave it.

    Returns:
        ``output`` with ``workspace`` the parent's tree from now on (None: it stays), or the
        tool error of a conflict or a merge that could not be made.
    """
    base, ours = output.merge_base, state.workspace.tree
    theirs = output.workspace.tree if output.workspace is not None else None
    if base is None or theirs is None:  # a child in the parent's folder: its tree is the parent's
        return output
    if theirs == base:  # it changed no files
        return output.model_copy(update={"workspace": None})
    if ours is None or ours == base:
        return output
    plan = state.plan
    try:
        done = await calls.run(
            WORKSPACE_MERGE,
            WorkspaceMergeInput(
                workspace=plan.workspace, sink=plan.export_sink, base=base, ours=ours, theirs=theirs
            ),
            summary="merge the subagent's change into the workspace",
            timeouts=plan.timeouts,
            cancellable=False,  # a few git commands on objects: the run's cancel waits for them
        )
    except ActivityError as exc:
        return _not_merged(output, theirs, f"could not be merged: {failure_message(exc)}")
    if done.tree is not None:
        return output.model_copy(update={"workspace": WorkspaceState(tree=done.tree)})
    shown = ", ".join(done.conflicts[:CONFLICTS_SHOWN])
    more = (
        f" and {len(done.conflicts) - CONFLICTS_SHOWN} more" if len(done.conflicts) > CONFLICTS_SHOWN else ""
    )
    return _not_merged(
        output, theirs, f"conflict with the workspace's changes since it started, in: {shown}{more}"
    )


def _not_merged(output: ToolOutput, theirs: str, why: str) -> ToolOutput:
    """The call's tool error: the child's answer, and why its files did not come into the
    workspace, which stays as it was."""
    note = (
        f"[the subagent's file changes were not merged into the workspace: they {why}. Its files are "
        f"kept as workspace tree {theirs}; the workspace is as it was before the subagent's changes. "
        "Redo them here where they are still wanted.]"
    )
    content = f"{output.content}\n\n{note}" if output.content else note
    return output.model_copy(update={"content": content, "is_error": True, "workspace": None})
