"""``agent.workspace_merge``: a child run's change merged into its parent's workspace
(docs/workspaces.md, Subagents).

A child that may change files works on a copy of its own, made from its parent's tree at the
``task`` call (its base). When the parent records the call, the child's final tree is merged
into the parent's tree of that moment with git's three-way merge (``git merge-tree``), on the
objects alone: no workspace's files are touched here, the parent's next call restores its copy
to the merged tree. Three commits stand for the trees (the base, and a child of it for each
side), made with fixed names and times so that an attempt again makes the same ones.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

from temporalio import activity

from durable_agent.activities.support import heartbeating, usage_error
from durable_agent.activities.workspace_tree import WorkspaceTrees
from durable_agent.activities.workspaces.errors import WorkspaceTreeError
from durable_agent.activities.workspaces.fetching import fetch_tree
from durable_agent.activities.workspaces.shadow import ShadowRepo
from durable_agent.core.activity_api import WORKSPACE_MERGE, WorkspaceMerge, WorkspaceMergeInput

__all__ = ["WorkspaceMerges", "merge_trees"]

# The commits only name the trees for git's merge: the same names and time at every attempt.
_COMMIT_ENV = {
    "GIT_AUTHOR_NAME": "durable-agent",
    "GIT_AUTHOR_EMAIL": "durable-agent@localhost",
    "GIT_COMMITTER_NAME": "durable-agent",
    "GIT_COMMITTER_EMAIL": "durable-agent@localhost",
    "GIT_AUTHOR_DATE": "@0 +0000",
    "GIT_COMMITTER_DATE": "@0 +0000",
}


def merge_trees(repo: ShadowRepo, base: str, ours: str, theirs: str) -> WorkspaceMerge:
    """Merge ``theirs`` into ``ours`` from ``base``, on objects ``repo`` holds.

    Args:
        repo: A shadow repository that holds the three trees' objects.
        base: The tree both sides started from.
        ours: The tree the change goes into.
        theirs: The tree whose change is merged.

    Returns:
        The merged tree (its objects written to ``repo``), or the conflicting files.

    Raises:
        WorkspaceTreeError: git failed otherwise.
    """
    base_commit = _commit(repo, base)
    ours_commit = _commit(repo, ours, base_commit)
    theirs_commit = _commit(repo, theirs, base_commit)
    done = _git(
        repo, "merge-tree", "--write-tree", "--name-only", "--no-messages", "-z", ours_commit, theirs_commit
    )
    fields = [f for f in done.stdout.split(b"\0") if f]
    if done.returncode not in (0, 1) or not fields:
        message = done.stderr.decode("utf-8", "replace").strip()
        raise WorkspaceTreeError(f"git merge-tree failed: {message}")
    tree = fields[0].decode()
    if done.returncode == 0:
        return WorkspaceMerge(tree=tree)
    # a file in conflict is listed once a stage: once each
    files = dict.fromkeys(os.fsdecode(f) for f in fields[1:])
    return WorkspaceMerge(conflicts=tuple(files))


def _commit(repo: ShadowRepo, tree: str, parent: str | None = None) -> str:
    args = ["commit-tree", tree, "-m", "durable-agent merge"]
    if parent is not None:
        args += ["-p", parent]
    done = _git(repo, *args)
    if done.returncode != 0:
        raise WorkspaceTreeError(f"git commit-tree failed: {done.stderr.decode('utf-8', 'replace').strip()}")
    return done.stdout.decode().strip()


def _git(repo: ShadowRepo, *args: str) -> subprocess.CompletedProcess[bytes]:
    """git on the shadow's objects alone (no work tree): ``merge-tree`` answers 1 for a conflict,
    which ``ShadowRepo.git`` would raise for."""
    env = {
        **os.environ,
        "GIT_CONFIG_GLOBAL": os.devnull,
        "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_TERMINAL_PROMPT": "0",
        "LC_ALL": "C",
        **_COMMIT_ENV,
        "GIT_DIR": str(repo.git_dir),
    }
    env.pop("GIT_WORK_TREE", None)
    env.pop("GIT_INDEX_FILE", None)
    try:
        return subprocess.run(
            ["git", *args], capture_output=True, env=env, stdin=subprocess.DEVNULL, check=False
        )
    except OSError as exc:
        raise WorkspaceTreeError(f"cannot run git: {exc}") from None


@dataclass(eq=False)
class WorkspaceMerges:
    """The worker's side of a child's merge: its shadow repositories and sinks."""

    trees: WorkspaceTrees

    @activity.defn(name=WORKSPACE_MERGE.name)
    async def workspace_merge(self, inp: WorkspaceMergeInput) -> WorkspaceMerge:
        """Merge a child's final tree into its parent's tree, the merged tree's objects put in the
        run's sink before this returns.

        Returns:
            The merged tree, or the files in conflict.

        Raises:
            ApplicationError: The sink holds no trees, or lacks one of the three (not retried).
        """
        sink = self.trees.object_sink(inp.sink)
        if sink is None:
            raise usage_error(f"the run's sink {inp.sink!r} holds no workspace trees")
        # the parent's shadow: on the parent's host it holds ``ours`` and ``base`` already
        repo = self.trees.repo(Path(inp.workspace))
        try:
            for tree in (inp.base, inp.ours, inp.theirs):
                await heartbeating(fetch_tree(repo, tree, sink))
            merged = await asyncio.to_thread(merge_trees, repo, inp.base, inp.ours, inp.theirs)
            if merged.tree is not None:
                new = await asyncio.to_thread(repo.objects_since, merged.tree, inp.ours)
                missing = await sink.missing_objects(new) if new else []
                if missing:
                    await sink.put_objects(await asyncio.to_thread(repo.loose, missing))
        except WorkspaceTreeError as exc:  # a sink that refused (``SinkError``) is tried again
            raise usage_error(f"the child's change could not be merged: {exc}") from None
        return merged
