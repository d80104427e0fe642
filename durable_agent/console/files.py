"""What a run did to its files, for the console: the diff of one boundary or of the whole run, an
export as a file, and the rewind of an ended run.

The same as ``durable-agent diff``, ``pack`` and ``rewind`` (``cli/diff.py``, ``cli/exports.py``,
``cli/rewind.py``), whose functions these call: the trees come from the run's newest export in
the sink of this machine's config (``AGENT_CONFIG``), the files' objects from that sink, and the
diff is read in a shadow repository of this machine, never in a workspace. The sinks' readers
are synchronous (a PostgreSQL one runs its own event loop), so callers run these in a thread.
"""

from __future__ import annotations

import asyncio
import io
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict

from durable_agent.core.errors import DurableAgentError

# The most of a diff the console sends a page; the rest is said to be left out (`durable-agent diff`).
MAX_DIFF_BYTES = 2_000_000


class FilesError(Exception):
    """The files cannot be shown or rewound; ``status`` is the HTTP status to answer with."""

    def __init__(self, message: str, status: int = 404) -> None:
        super().__init__(message)
        self.status = status


class FileRow(BaseModel):
    """One changed file: its path, and its lines added and deleted (None: a binary file)."""

    model_config = ConfigDict(frozen=True)

    path: str
    added: int | None
    deleted: int | None


class DiffView(BaseModel):
    """A boundary's change (``turn``), or the whole run's (``turn`` None)."""

    model_config = ConfigDict(frozen=True)

    run_id: str
    turn: int | None
    turns: int
    call_id: str | None = None
    tool: str | None = None
    before: str | None = None
    after: str | None = None
    files: tuple[FileRow, ...] = ()
    diff: str = ""
    truncated: bool = False
    note: str | None = None  # why there is nothing to show, or where the base came from


def _span(trees: Any, turn: int | None) -> tuple[str | None, str | None, str | None]:
    """The trees to compare (before, after) and a note, as ``durable-agent diff`` picks them."""
    if turn is not None:
        if not 1 <= turn <= trees.turns:
            raise FilesError(f"the run has no turn {turn} (its turns: 1 to {trees.turns})")
        before, after = trees.at(turn - 1), trees.at(turn)
        if after is None:
            return None, None, f"no workspace tree was recorded by turn {turn}"
        if before is None:
            return None, None, f"turn {turn}'s call recorded the run's first tree; there is none before it"
        return before, after, None
    final, first = trees.final, trees.first_recorded()
    if final is None:
        return None, None, "the run recorded no workspace tree: its calls changed no file"
    if trees.base is None and first is not None:
        note = f"base not recorded: from turn {first.turn}'s tree (that call's own changes are not shown)"
        return first.recorded, final, note
    return trees.base, final, None


def run_diff(session_id: str, run_id: str, turn: int | None, sink_name: str | None = None) -> DiffView:
    """A boundary's diff against the boundary before it, or the run's whole change.

    Args:
        session_id: The run's session.
        run_id: The run (its exports' run id).
        turn: The boundary (None: the whole run, from its base to its last tree).
        sink_name: The sink (None: the config's default).

    Returns:
        The diff, its files' line counts, and a note when there is nothing to compare.

    Raises:
        FilesError: No export of the run, no such turn, or the sink cannot be read.
    """
    from durable_agent.activities.workspace_tree import default_shadow_root
    from durable_agent.activities.workspaces.diff import diff_stat, reading_repo, run_trees, write_diff
    from durable_agent.cli.diff import DiffError, _newest_export, _object_sink
    from durable_agent.cli.exports import read_export_ref
    from durable_agent.config import load_config

    try:
        ref = _newest_export(sink_name, session_id, run_id)
        trees = run_trees(read_export_ref(ref, sink_name).open().source_run().events)
        before, after, note = _span(trees, turn)
        call = trees.boundaries[turn - 1] if turn is not None else None
        view: dict[str, Any] = {
            "run_id": run_id,
            "turn": turn,
            "turns": trees.turns,
            "call_id": call.call_id if call else None,
            "tool": call.tool if call else None,
            "before": before,
            "after": after,
            "note": note,
        }
        if after is None:
            return DiffView(**view)
        _, sink = _object_sink(ref, sink_name)
        repo = reading_repo(load_config().workspace_checkpoints.path or default_shadow_root())

        async def read() -> tuple[bytes, list[Any]]:
            out = io.BytesIO()
            try:
                await write_diff(repo, sink, before, after, out)
                return out.getvalue(), await diff_stat(repo, sink, before, after)
            finally:
                close = getattr(sink, "aclose", None)  # a PostgreSQL sink's pool
                if close is not None:
                    await close()

        raw, rows = asyncio.run(read())
    except DiffError as exc:
        raise FilesError(str(exc), 404) from None
    except (DurableAgentError, OSError, ValueError) as exc:  # a sink that lacks or refuses
        raise FilesError(f"{type(exc).__name__}: {exc}", 502) from None
    view["files"] = tuple(FileRow(path=r.path, added=r.added, deleted=r.deleted) for r in rows)
    view["diff"] = raw[:MAX_DIFF_BYTES].decode("utf-8", "replace")
    view["truncated"] = len(raw) > MAX_DIFF_BYTES
    if not raw:
        view["note"] = "no change"
    return DiffView(**view)


def export_events(session_id: str, run_id: str, sink_name: str | None = None) -> list[Any]:
    """The run's events as its newest export in the sink holds them: every event up to that
    boundary (a run that continued as new holds only its newest events itself).

    Returns:
        The ``EventRecord``s, in order.

    Raises:
        FilesError: The sink holds no export of the run, or it cannot be read.
    """
    from durable_agent.cli.diff import DiffError, _newest_export
    from durable_agent.cli.exports import read_export_ref

    try:
        ref = _newest_export(sink_name, session_id, run_id)
        return list(read_export_ref(ref, sink_name).open().source_run().events)
    except DiffError as exc:
        raise FilesError(str(exc), 404) from None
    except (DurableAgentError, OSError, ValueError) as exc:
        raise FilesError(f"{type(exc).__name__}: {exc}", 502) from None


def export_ref(session_id: str, run_id: str, turn: int, sink_name: str | None = None) -> str:
    """The reference of the run's export of ``turn`` in the sink (a file, or ``pg:``).

    Raises:
        FilesError: The sink holds no such export, or cannot be read.
    """
    from durable_agent.cli.exports import session_exports

    try:
        name, rows = session_exports(sink_name, session_id)
    except (DurableAgentError, OSError) as exc:
        raise FilesError(f"{type(exc).__name__}: {exc}", 502) from None
    found = [where for where, d in rows if d.run_id == run_id and d.turn == turn]
    if not found:
        raise FilesError(f"sink {name!r} holds no export of turn {turn} of run {run_id!r}")
    return found[-1]


def export_file(session_id: str, run_id: str, turn: int, sink_name: str | None = None) -> tuple[str, bytes]:
    """The run's export of ``turn`` as one portable file (as ``durable-agent pack`` writes it).

    Returns:
        The file's name and its bytes.

    Raises:
        FilesError: No such export, or it does not validate.
    """
    from durable_agent.activities.sink_files import whole_document
    from durable_agent.cli.exports import read_export_ref

    ref = export_ref(session_id, run_id, turn, sink_name)
    try:
        export = read_export_ref(ref, sink_name)
        export.open()  # every digest checked: a file handed out is one that resumes
    except (DurableAgentError, OSError, ValueError) as exc:
        raise FilesError(f"{type(exc).__name__}: {exc}", 502) from None
    return f"{run_id}-turn-{turn:06d}.json", whole_document(export)


def restore_ended(workflow_id: str, turn: int) -> tuple[Any, str, str]:
    """An ended run's workspace rebuilt here from its export of ``turn`` (``durable-agent rewind``).

    Returns:
        The export, the workspace folder, and the tree restored.

    Raises:
        FilesError: The run is running, has no export of that turn, or the files cannot be rebuilt.
    """
    import argparse

    from durable_agent.cli.exports import read_export_ref
    from durable_agent.cli.rewind import RewindError, _locate, restore_workspace

    args = argparse.Namespace(workflow_id=workflow_id, turn=turn, sink=None, workspace=None)
    try:
        path, workspace = asyncio.run(_locate(args))
        export = read_export_ref(path, None)
        tree = restore_workspace(export, Path(workspace), None)
    except RewindError as exc:
        raise FilesError(str(exc), 409) from None
    except (DurableAgentError, OSError, ValueError) as exc:
        raise FilesError(f"{type(exc).__name__}: {exc}", 502) from None
    return export, workspace, tree
