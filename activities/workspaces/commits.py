"""``agent.workspace_commit``: a run's change, made from a git source, committed on the commit its
workspace came from and pushed to its branch of that repository (``[workspaces] commit``)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from pathlib import Path

from temporalio import activity

from durable_agent.activities.support import heartbeating, usage_error
from durable_agent.activities.workspace_tree import WorkspaceTrees
from durable_agent.activities.workspaces.errors import WorkspaceTreeError
from durable_agent.activities.workspaces.fetching import fetch_tree
from durable_agent.activities.workspaces.sources import commit_and_push, default_root, fetched
from durable_agent.config import WorkspacesConfig
from durable_agent.core.activity_api import WORKSPACE_COMMIT, WorkspaceCommitInput, WorkspaceCommitted
from durable_agent.core.run_workspace import GitSource

__all__ = ["WorkspaceCommits"]


@dataclass(eq=False)
class WorkspaceCommits:
    """The worker's side of ``[workspaces] commit``: its shadow repositories, sinks and mirrors."""

    trees: WorkspaceTrees
    config: WorkspacesConfig

    @activity.defn(name=WORKSPACE_COMMIT.name)
    async def workspace_commit(self, inp: WorkspaceCommitInput) -> WorkspaceCommitted:
        """Commit the run's final tree on its origin's commit and push it to its branch.

        Raises:
            ApplicationError: The tree's objects are not in the sink, or git refused (a branch
                that moved meanwhile, credentials): not retried, the run's result says why.
        """
        origin = inp.origin
        assert origin.branch is not None
        sink = self.trees.object_sink(inp.sink)
        if sink is None:
            raise usage_error(f"the run's sink {inp.sink!r} holds no workspace trees")
        repo = self.trees.repo(Path(inp.workspace))
        root = default_root(self.config)
        try:
            await heartbeating(fetch_tree(repo, inp.tree, sink))
            cache = await heartbeating(asyncio.to_thread(fetched, root, GitSource(git=origin.git)))
            commit = await heartbeating(
                asyncio.to_thread(
                    commit_and_push,
                    repo.git_dir,
                    cache,
                    origin.git,
                    origin.commit,
                    inp.tree,
                    origin.branch,
                    inp.message,
                    inp.at_ms // 1000,
                )
            )
        except WorkspaceTreeError as exc:
            raise usage_error(f"the change was not pushed to {origin.branch}: {exc}") from None
        return WorkspaceCommitted(commit=commit, branch=origin.branch)
