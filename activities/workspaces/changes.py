"""``agent.workspace_change``: what a run did to its workspace, for its result (its base and
final trees and their diff, bounded: ``diff.py``); ``durable-agent diff`` gives it whole."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

from temporalio import activity

from durable_agent.activities.support import heartbeating
from durable_agent.activities.workspace_tree import WorkspaceTrees
from durable_agent.activities.workspaces.diff import workspace_change
from durable_agent.activities.workspaces.errors import WorkspaceTreeError
from durable_agent.core.activity_api import WORKSPACE_CHANGE, WorkspaceChangeInput
from durable_agent.core.errors import DurableAgentError
from durable_agent.core.models import WorkspaceChange

__all__ = ["WorkspaceChanges"]

log = logging.getLogger(__name__)


@dataclass(eq=False)
class WorkspaceChanges:
    """The worker's side of a run's change set: its shadow repositories and sinks."""

    trees: WorkspaceTrees

    @activity.defn(name=WORKSPACE_CHANGE.name)
    async def workspace_change(self, inp: WorkspaceChangeInput) -> WorkspaceChange:
        """The diff from the run's base to its final tree, bounded (``DIFF_SHOWN_BYTES``); only
        the trees when the diff cannot be made (logged: the run's result stands without it)."""
        trees = WorkspaceChange(base=inp.base, final=inp.final)
        sink = self.trees.object_sink(inp.sink)
        if sink is None:
            return trees
        repo = self.trees.repo(Path(inp.workspace))
        try:
            return await heartbeating(workspace_change(repo, sink, inp.base, inp.final))
        except (WorkspaceTreeError, DurableAgentError, OSError) as exc:
            log.warning("run's change from %s to %s not diffed: %s", inp.base, inp.final, exc)
            return trees
