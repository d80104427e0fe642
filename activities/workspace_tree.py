"""The workspace's files as git trees: recorded after a tool call that may change them, their
objects put in the run's export sink, and rebuilt from there (a rewind, a resume elsewhere).

The shadow repository that records a workspace is ``workspaces/shadow.py``; the objects go to the
sink as git's loose objects (``workspaces/objects.py``), the sink keeping each once
(``ObjectSink``): a boundary sends the objects of its tree that the last tree sent from this
shadow to that sink did not hold, less those the sink already has. A tree is rebuilt from the
sink by ``workspaces/fetching.py``.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping, Sequence
from pathlib import Path

from durable_agent.activities.sinks import ExportSink, ObjectSink
from durable_agent.activities.workspaces.errors import WorkspaceTreeError
from durable_agent.activities.workspaces.fetching import fetch_tree
from durable_agent.activities.workspaces.shadow import Recorded, ShadowRepo, default_shadow_root
from durable_agent.config import (
    AgentConfig,
    FilesystemSinkConfig,
    FilesystemStoreConfig,
    WorkspaceCheckpointsConfig,
)
from durable_agent.core.errors import DurableAgentError
from durable_agent.core.models import WorkspaceState

__all__ = ["WorkspaceTooLarge", "WorkspaceTrees", "own_folders"]

log = logging.getLogger(__name__)

_LEFT_OUT_SHOWN = 100  # the most paths an event names as left out


class WorkspaceTooLarge(Exception):
    """A call left the workspace larger than ``[workspaces] max_bytes``: nothing was recorded (the
    call's answer says so: ``tool_call.py``, ``hook_call.py``)."""

    def __init__(self, size: int, limit: int) -> None:
        super().__init__(
            f"the workspace's files would be {size:,} bytes, over [workspaces] max_bytes={limit:,}"
        )
        self.size = size
        self.limit = limit


def own_folders(config: AgentConfig) -> list[Path]:
    """The worker's folders a workspace may hold, never recorded: its store's and its sinks'."""
    own = [config.store.path] if isinstance(config.store, FilesystemStoreConfig) else []
    return own + [sink.path for sink in config.sinks.values() if isinstance(sink, FilesystemSinkConfig)]


def _record_in(repo: ShadowRepo, sink_name: str, sized: bool) -> tuple[Recorded, int, str | None, list[str]]:
    """``WorkspaceTrees.record``'s part in the shadow: the tree, its files' size (with ``sized``),
    the tree last sent to ``sink_name`` and the objects that may have to go since."""
    recorded = repo.record()
    size = repo.tree_bytes(recorded.tree) if sized else 0
    since = repo.pushed_to(sink_name)
    return recorded, size, since, repo.objects_since(recorded.tree, since)


class WorkspaceTrees:
    """The worker's side: a workspace recorded after a tool call, its objects sent to the run's
    sink; a resumed run's workspace compared with its checkpoint's tree.

    Args:
        config: ``[workspace_checkpoints]``.
        sinks: The worker's export sinks by name (those that are ``ObjectSink`` hold trees).
        exclude: The worker's own folders, left out where they are inside a workspace.
    """

    def __init__(
        self,
        config: WorkspaceCheckpointsConfig,
        sinks: Mapping[str, ExportSink],
        exclude: Sequence[Path] = (),
    ) -> None:
        self.config = config
        self.sinks = sinks
        self.root = config.path or default_shadow_root()
        self.exclude = tuple(exclude)
        self._warned: set[str] = set()

    def repo(self, workspace: Path) -> ShadowRepo:
        """The shadow repository of ``workspace``."""
        c = self.config
        return ShadowRepo(
            self.root,
            workspace,
            max_file_bytes=c.max_file_bytes,
            max_total_bytes=c.max_total_bytes,
            exclude=self.exclude,
        )

    def object_sink(self, sink_name: str | None) -> ObjectSink | None:
        sink = self.sinks.get(sink_name or "")
        return sink if isinstance(sink, ObjectSink) else None

    async def record(
        self, workspace: Path, sink_name: str | None, *, strict: bool = False, max_bytes: int | None = None
    ) -> WorkspaceState | None:
        """Record ``workspace`` and send its new objects to the sink ``sink_name``.

        Args:
            workspace: The run's workspace.
            sink_name: The run's export sink (None: a workflow that does not say; nothing is recorded).
            strict: A run whose workspace follows it: a failure raises instead, since the run
                could not find the files again on another machine.
            max_bytes: The most the workspace's files may hold; past it nothing is sent.

        Returns:
            The tree (and the files left out of it), or None: recording is off, the sink holds no
            trees, or it failed (logged; the call's result stands without it).

        Raises:
            WorkspaceTreeError: With ``strict``: the workspace was not recorded, or the sink did
                not take its objects.
            WorkspaceTooLarge: Past ``max_bytes``.
        """
        sink = self.object_sink(sink_name) if self.config.enabled else None
        if sink is None or sink_name is None:
            if self.config.enabled and sink_name is not None and sink_name not in self._warned:
                self._warned.add(sink_name)
                log.warning(
                    "export sink %r cannot hold workspace trees: workspaces are not recorded", sink_name
                )
            return None
        repo = self.repo(workspace)
        try:
            # one thread for the shadow's part: a boundary's hops between threads add up
            recorded, size, since, candidates = await asyncio.to_thread(
                _record_in, repo, sink_name, max_bytes is not None
            )
            if max_bytes is not None and size > max_bytes:
                raise WorkspaceTooLarge(size, max_bytes)
            if candidates:
                # one question to the sink: which candidates it lacks, and whether it still holds
                # ``since`` (one round trip, to a PostgreSQL sink too)
                missing = await sink.missing_objects(
                    [*candidates, since] if since is not None else candidates
                )
                if since is not None and since in missing:
                    # gone from the sink (``durable-agent gc`` took a tree no export kept): send again
                    # what the sink lacks of the whole tree, not only what changed since
                    since = None
                    candidates = await asyncio.to_thread(repo.objects_since, recorded.tree, None)
                    missing = await sink.missing_objects(candidates)
                if missing:
                    await sink.put_objects(await asyncio.to_thread(repo.loose, missing))
            if since != recorded.tree:
                await asyncio.to_thread(repo.mark_pushed, sink_name, recorded.tree)
        except (WorkspaceTreeError, OSError) as exc:
            if strict:
                raise WorkspaceTreeError(f"workspace {workspace} was not recorded: {exc}") from None
            log.warning("workspace %s was not recorded: %s", workspace, exc)
            return None
        except DurableAgentError as exc:  # the sink refused (``SinkError``)
            if strict:
                raise WorkspaceTreeError(
                    f"workspace {workspace}: sink {sink_name!r} did not take its objects: {exc}"
                ) from None
            log.warning("workspace %s: sink %r did not take its objects: %s", workspace, sink_name, exc)
            return None
        if recorded.left_out:
            log.warning(
                "workspace %s: %d files left out of its tree for their size",
                workspace,
                len(recorded.left_out),
            )
        return WorkspaceState(tree=recorded.tree, left_out=recorded.left_out[:_LEFT_OUT_SHOWN])

    async def differences(self, workspace: Path, tree: str, sink_name: str) -> list[str]:
        """What differs between ``workspace``'s files and the tree a checkpoint recorded.

        Args:
            workspace: The workspace of a resumed run.
            tree: The checkpoint's tree.
            sink_name: The sink that may hold the tree's objects (to name the paths that differ).

        Returns:
            ``path: changed``, ``path: missing``, ``path: not in the checkpoint`` (empty: the
            same files; see ``ShadowRepo.differences``); one line saying
            so when they differ and the tree's objects are nowhere to compare with.

        Raises:
            WorkspaceTreeError: The workspace cannot be recorded.
        """
        repo = self.repo(workspace)
        now = (await asyncio.to_thread(repo.record)).tree
        if now == tree:
            return []
        sink = self.object_sink(sink_name)
        try:
            if sink is not None:
                await fetch_tree(repo, tree, sink, blobs=False)
            return await asyncio.to_thread(repo.differences, tree, now)
        except WorkspaceTreeError:
            return [f"the files are not those of tree {tree}, whose objects sink {sink_name!r} does not hold"]
