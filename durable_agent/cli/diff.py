"""``durable-agent diff``: what a run changed in its workspace, as the unified diff between two
of the git trees its events recorded, read from the sink that holds their objects
(``activities/workspaces/diff.py``).

The run is named by its workflow id (Temporal names its session and run), by its run id with
``--session`` (the sink alone), or by an export (a file the filesystem sink wrote, or
``pg:SESSION/RUN/TURN``); its newest export in the sink holds its events, and with them its
trees. The diff is read in a shadow repository of this machine (the config's
``[workspace_checkpoints] path``), never in a workspace: it runs anywhere the sink can be read.

The parser (``cli/commands.py``) imports this module only when ``diff`` runs.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path
from typing import Any

from durable_agent.cli.common import err, network, one_line
from durable_agent.core.errors import DurableAgentError
from durable_agent.core.export import SessionCheckpointExportV1


class DiffError(Exception):
    """The run's change cannot be shown (the message says why); ``code`` is the exit code."""

    def __init__(self, message: str, code: int = 2) -> None:
        super().__init__(message)
        self.code = code


# the exit code of a run or an export with nothing to compare: no export, no tree recorded
_NOTHING = 1


async def _locate(args: argparse.Namespace) -> int:
    """The session and run of the workflow ``args.run`` (its latest run), from Temporal: its
    status while it runs, else its result. Sets ``args.session`` and ``args.run``."""
    from temporalio.client import WorkflowExecutionStatus, WorkflowFailureError

    from durable_agent.client import connect, run_result
    from durable_agent.core.failures import failure_message
    from durable_agent.core.run_api import QUERY_STATUS, AgentRunResult, RunStatusView

    client = await connect()
    handle = client.get_workflow_handle(args.run)
    ids: RunStatusView | AgentRunResult
    if (await handle.describe()).status == WorkflowExecutionStatus.RUNNING:
        ids = await handle.query(QUERY_STATUS, result_type=RunStatusView)
    else:
        try:
            ids = await run_result(client, args.run)
        except WorkflowFailureError as exc:
            err(f"diff: run {args.run} ended without a result: {failure_message(exc)}")
            return 2
    args.session, args.run = ids.session_id, ids.run_id
    return 0


def newest_export(sink: str | None, session_id: str, run_id: str) -> str:
    """The reference of the run's newest export in the sink (a file, or ``pg:``)."""
    from durable_agent.cli.exports import session_exports

    name, rows = session_exports(sink, session_id)
    turns = sorted((d.turn, where) for where, d in rows if d.run_id == run_id)
    if not turns:
        raise DiffError(
            f"sink {name!r} holds no export of run {run_id!r} of session {session_id!r}: it made no tool "
            "call yet, or its exports went to another sink (--sink)",
            _NOTHING,
        )
    return turns[-1][1]


def object_sink(ref: str, sink_name: str | None) -> tuple[str, Any]:
    """The sink that holds the trees' objects: the filesystem sink whose folder holds the export
    file ``ref`` (without ``--sink``), else the config's filesystem or PostgreSQL sink."""
    from durable_agent.activities.sinks import OBJECTS_FOLDER, FilesystemExportSink
    from durable_agent.cli.rewind import RewindError, sink_of

    file = Path(ref)
    if sink_name is None and file.is_file():
        root = file.resolve().parent.parent.parent  # <root>/<session>/<run>/turn-….json
        if (root / OBJECTS_FOLDER).is_dir():
            return str(root), FilesystemExportSink(root)
    try:
        name, sink, _ = sink_of(sink_name)
    except RewindError as exc:  # neither a filesystem nor a PostgreSQL sink
        raise DiffError(str(exc)) from None
    if isinstance(sink, FilesystemExportSink) and not (sink.root / OBJECTS_FOLDER).is_dir():
        raise DiffError(
            f"sink {name!r} ({sink.root}) holds no workspace objects: no worker recorded a workspace "
            "there (is it the run's sink? --sink)"
        )
    return name, sink


def _span(args: argparse.Namespace, export: SessionCheckpointExportV1) -> tuple[str | None, str]:
    """The two trees to compare, said on stderr: the run's base (or its first recorded tree) and
    its last; with ``--turn N``, the trees before and after turn N's call."""
    from durable_agent.activities.workspaces.diff import run_trees

    d = export.descriptor
    trees = run_trees(export.open().source_run().events)
    if args.turn is not None:
        if not 1 <= args.turn <= trees.turns:
            raise DiffError(f"run {d.run_id} has no turn {args.turn} (its turns: 1 to {trees.turns})")
        before, after = trees.at(args.turn - 1), trees.at(args.turn)
        call = trees.boundaries[args.turn - 1]
        print(f"turn {call.turn}: call {call.call_id} ({call.tool}): {before} -> {after}", file=sys.stderr)
        if after is None:
            raise DiffError(f"run {d.run_id} recorded no workspace tree by turn {args.turn}", _NOTHING)
        if before is None:
            raise DiffError(
                f"run {d.run_id}: turn {args.turn}'s call recorded the run's first tree and its base "
                "was not recorded: there is no tree before it to compare with",
                _NOTHING,
            )
        return before, after
    final, first = trees.final, trees.first_recorded()
    if final is None:
        raise DiffError(
            f"run {d.run_id} recorded no workspace tree (by turn {d.turn}): its calls changed no file, "
            "or its worker records none",
            _NOTHING,
        )
    base = trees.base
    if base is None and first is not None:
        base = first.recorded
        print(
            f"base: not recorded; from turn {first.turn}'s tree (after call {first.call_id}, "
            f"{first.tool}: that call's own changes are not shown)",
            file=sys.stderr,
        )
    print(f"run {d.run_id}: {base} -> {final} (turn {d.turn})", file=sys.stderr)
    return base, final


async def _show(args: argparse.Namespace, base: str | None, final: str, sink: Any, repo: Any) -> None:
    """Print the diff (or, with ``--stat``, its paths and line counts) on stdout."""
    from durable_agent.activities.workspaces.diff import diff_stat, write_diff

    try:
        if not args.stat:
            sys.stdout.flush()  # what was printed before goes first
            if await write_diff(repo, sink, base, final, sys.stdout.buffer) == 0:
                print("no change", file=sys.stderr)
            return
        rows = await diff_stat(repo, sink, base, final)
    finally:
        close = getattr(sink, "aclose", None)  # a PostgreSQL sink's pool
        if close is not None:
            await close()
    counts = [("-", "-") if r.added is None else (f"+{r.added}", f"-{r.deleted}") for r in rows]
    wide = [max((len(c[i]) for c in counts), default=0) for i in (0, 1)]
    for (added, deleted), row in zip(counts, rows, strict=True):
        print(f"{added:>{wide[0]}} {deleted:>{wide[1]}}  {row.path}")
    added_all = sum(r.added or 0 for r in rows)
    deleted_all = sum(r.deleted or 0 for r in rows)
    print(
        f"{_count(len(rows), 'file')} changed, {_count(added_all, 'insertion')}(+), "
        f"{_count(deleted_all, 'deletion')}(-)"
    )


def _count(n: int, what: str) -> str:
    """``1 file``, ``2 files``: git's summary line's words."""
    return f"{n} {what}{'' if n == 1 else 's'}"


def cmd_diff(args: argparse.Namespace) -> int:
    """Print what a run changed in its workspace: the whole unified diff from its base tree to its
    last, or with ``--turn N`` that turn's call's change; ``--stat``: the paths and line counts."""
    from durable_agent.activities.workspaces.diff import reading_repo
    from durable_agent.activities.workspaces.shadow import default_shadow_root
    from durable_agent.cli.exports import PG_PREFIX, read_export_ref
    from durable_agent.config import load_config

    is_export = args.session is None and (args.run.startswith(PG_PREFIX) or Path(args.run).is_file())
    if args.session is None and not is_export:
        if args.run.endswith(".json"):
            err(f"diff: no export file {args.run}")
            return 2
        located = network(_locate)(args)
        if located != 0:
            return located
    try:
        ref = args.run if is_export else newest_export(args.sink, args.session, args.run)
        export = read_export_ref(ref, args.sink)
        base, final = _span(args, export)
        name, sink = object_sink(ref, args.sink)
        config = load_config()
        repo = reading_repo(config.workspace_checkpoints.path or default_shadow_root())
        try:
            asyncio.run(_show(args, base, final, sink, repo))
        except DurableAgentError as exc:  # a tree or a file the sink lacks, a sink that failed
            raise DiffError(f"sink {name!r}: {exc}") from None
    except DiffError as exc:
        err(f"diff: {exc}")
        return exc.code
    except DurableAgentError as exc:  # ExportError, ConfigError, ExportRefError, SinkError
        err(f"diff: {exc}")
        return 2
    except (OSError, ValueError) as exc:  # a file that cannot be read, JSON that is not an export's
        err(f"diff: {one_line(exc)}")
        return 2
    return 0
