"""The tree a run's workspace is at, as the run's workflow holds it (docs/workspaces.md).

A run whose workspace follows it sends the tree with every call that reads or changes files,
and advances it only from the calls' results: the worker that runs a call first makes its copy
equal to the tree (``activities/workspaces/copies.py``). A run that does not follow keeps the
newest tree its calls recorded, for its result's change set.
"""

from __future__ import annotations

from pydantic import Field

from durable_agent.core.models import Frozen, WorkspaceChange, WorkspaceState

__all__ = ["HOST_QUEUE_INFIX", "GitSource", "RunWorkspace", "TreeSource", "WorkspaceOrigin", "host_queue"]

HOST_QUEUE_INFIX = "/host/"


class GitSource(Frozen):
    """A run's workspace made from a git repository: its ``ref``'s files in a folder of the run's
    own under ``[workspaces] root`` (``activities/workspaces/sources.py``)."""

    git: str = Field(min_length=1, description="The repository: a URL, or a path on the worker's machine.")
    ref: str = Field("HEAD", min_length=1, description="A branch, a tag or a commit.")


class TreeSource(Frozen):
    """A run's workspace made from a tree of an earlier run (a fork), read from the run's sink."""

    tree: str = Field(pattern=r"^[0-9a-f]{40}$", description="A tree id an earlier run recorded.")


class WorkspaceOrigin(Frozen):
    """Where a run's workspace made from a git source came from, and where its change goes.

    Attributes:
        git: The repository, as the source named it.
        commit: The commit its ref was at when the run started.
        tree: That commit's tree (None: an origin recorded before it was kept), to which a rewound
            run, whose base is the turn's tree, compares its final tree to know it changed files.
        branch: The branch the run's change is committed to and pushed at its end (None: it is
            not: ``[workspaces] commit`` is off).
    """

    git: str
    commit: str = Field(pattern=r"^[0-9a-f]{40}$")
    tree: str | None = Field(None, pattern=r"^[0-9a-f]{40}$")
    branch: str | None = None


def host_queue(task_queue: str, host: str) -> str:
    """The task queue only the worker ``host`` polls, beside the run's shared ``task_queue``.

    Args:
        task_queue: The run's (its workflow's) task queue.
        host: The worker's host id.

    Returns:
        ``<task_queue>/host/<host>``.
    """
    return f"{task_queue}{HOST_QUEUE_INFIX}{host}"


class RunWorkspace(Frozen):
    """Where a run's workspace is.

    Attributes:
        tree: The tree it is at (None: none recorded yet).
        host: The worker whose copy is at ``tree`` (None: none known).
        follows: Whether every call carries ``tree`` and its worker restores its copy to it.
        base: The tree the run started from (None: not recorded).
    """

    tree: str | None = None
    host: str | None = None
    follows: bool = False
    base: str | None = None

    @classmethod
    def started(cls, base: WorkspaceState | None, host: str | None) -> RunWorkspace:
        """A new run's: at its base when it follows, else nothing recorded yet."""
        if base is None:
            return cls()
        return cls(tree=base.tree, host=host, follows=True, base=base.tree)

    def after(self, recorded: WorkspaceState | None, host: str | None) -> RunWorkspace:
        """After a call whose worker recorded ``recorded`` (None: it changed no files, or a
        worker that records none) and, for a run that follows, held the copy as ``host``."""
        update: dict[str, str] = {}
        if recorded is not None:
            update["tree"] = recorded.tree
        if host is not None and self.follows:
            update["host"] = host
        return self.model_copy(update=update) if update else self

    def change(self) -> WorkspaceChange | None:
        """What the run did to its workspace, for its result: base and final trees (the diff is
        ``durable-agent diff``'s); None when no tree was recorded."""
        if self.tree is None and self.base is None:
            return None
        return WorkspaceChange(base=self.base, final=self.tree)
