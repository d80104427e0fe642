"""``agent.restore_workspace``: the ``rewind`` update's side effect. A run that waits for its
next prompt goes back to one of its turns: its workspace gets the files of the git tree that
turn's export recorded (``activities/workspace_tree.py``), read from the run's sink, and the run
then goes on resumed from that export's file (``workflows/rewinding.py``).

The export is read from the filesystem sink, where the resumed run reads it again
(``agent.read_resume``): a sink that keeps no files on the worker cannot be rewound to.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from pydantic import ValidationError
from temporalio import activity

from durable_agent.activities.sinks import ExportSink, FilesystemExportSink, read_export_file
from durable_agent.activities.store.session_store import name_under
from durable_agent.activities.support import heartbeating, usage_error
from durable_agent.activities.workspace_tree import WorkspaceTrees
from durable_agent.activities.workspaces.errors import WorkspaceTreeError
from durable_agent.activities.workspaces.fetching import restore_tree
from durable_agent.core.activity_api import RESTORE_WORKSPACE, RestoreWorkspaceInput, WorkspaceRestored
from durable_agent.core.export import ExportError, workspace_tree_of

__all__ = ["WorkspaceRestores", "export_file"]


def export_file(sink: FilesystemExportSink, session_id: str, run_id: str, turn: int, digest: str) -> Path:
    """Where the filesystem sink keeps a run's export of ``turn`` (``FilesystemExportSink``'s naming).

    Args:
        sink: The run's sink.
        session_id: The run's session.
        run_id: The run.
        turn: The export's turn.
        digest: Its ``sha256:`` content digest.

    Returns:
        ``<root>/<session>/<run>/turn-<turn>-<16 hex of the digest>.json``.
    """
    short = digest.removeprefix("sha256:")[:16]
    folder = sink.root / name_under(sink.root, session_id) / name_under(sink.root, run_id)
    return folder / f"turn-{turn:06d}-{short}.json"


@dataclass(eq=False)
class WorkspaceRestores:
    """The worker's side of a ``rewind``: the sinks by name, and the shadow repositories."""

    sinks: Mapping[str, ExportSink]
    trees: WorkspaceTrees

    @activity.defn(name=RESTORE_WORKSPACE.name)
    async def restore_workspace(self, inp: RestoreWorkspaceInput) -> WorkspaceRestored:
        """Make the run's workspace hold the files its export of ``inp.turn`` recorded (files
        recorded since and not in that tree are removed; ignored files stay). An export that
        recorded no tree leaves the files as they are: only the conversation goes back."""
        sink = self.sinks.get(inp.sink)
        if not isinstance(sink, FilesystemExportSink):
            raise usage_error(
                f"rewind: the run's sink {inp.sink!r} is not a filesystem sink on this worker: "
                "a run goes back only to an export file it can resume from"
            )
        path = export_file(sink, inp.session_id, inp.run_id, inp.turn, inp.content_digest)
        try:
            export = await asyncio.to_thread(read_export_file, path)
            payload = await heartbeating(asyncio.to_thread(export.open))
        except (OSError, ValidationError, ExportError) as exc:
            raise usage_error(
                f"rewind: the export of turn {inp.turn} ({path}) cannot be read: {exc}"
            ) from None
        d = export.descriptor
        if (d.run_id, d.turn, d.content_digest) != (inp.run_id, inp.turn, inp.content_digest):
            raise usage_error(f"rewind: {path} is not the export {inp.content_digest} of turn {inp.turn}")
        tree = workspace_tree_of(payload.source_run().events)
        if tree is not None:
            try:
                await heartbeating(restore_tree(self.trees.repo(Path(inp.workspace)), tree, sink))
            except WorkspaceTreeError as exc:
                # the objects are missing or git cannot write the files: trying again would not help
                raise usage_error(
                    f"rewind: workspace {inp.workspace} not restored to {tree}: {exc}"
                ) from None
        return WorkspaceRestored(export_path=str(path), tree=tree)
