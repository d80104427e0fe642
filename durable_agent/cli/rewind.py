"""``durable-agent rewind`` and ``resume --restore-workspace``: a workspace's files rebuilt from
the git tree an export recorded (``activities/workspace_tree.py``), read from the filesystem
or PostgreSQL sink of this machine's config.

The parser (``cli/commands.py``) imports this module only when one of these runs. The files
are written on this machine: run them where the worker's workspace is.
"""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path
from typing import Any

from temporalio.client import WorkflowExecutionStatus

from durable_agent.cli.common import err, network, one_line, workspace_arg
from durable_agent.config import ConfigError, FilesystemSinkConfig, PostgresSinkConfig, load_config
from durable_agent.core.errors import DurableAgentError
from durable_agent.core.export import SessionCheckpointExportV1, workspace_tree_of


class RewindError(DurableAgentError):
    """The files cannot be rebuilt, or the run cannot be rewound (the message says why)."""


def export_tree(export: SessionCheckpointExportV1) -> str:
    """The workspace's tree the export's run recorded last.

    Raises:
        RewindError: The export recorded none (its run changed no file, or its worker did not record).
    """
    tree = workspace_tree_of(export.open().source_run().events)
    if tree is None:
        d = export.descriptor
        raise RewindError(f"the export of run {d.run_id} at turn {d.turn} recorded no workspace tree")
    return tree


def sink_of(name: str | None) -> tuple[str, Any, Path]:
    """The sink ``name`` (default: the config's), a filesystem or PostgreSQL one, and the config's
    shadow folder. A PostgreSQL sink opens its pool on first use: its user closes it (``aclose``).

    Raises:
        RewindError: The sink is neither (only those hold workspace trees).
    """
    from durable_agent.activities.sinks import FilesystemExportSink
    from durable_agent.activities.workspaces.shadow import default_shadow_root

    config = load_config()
    name = name or config.default_sink
    sink = config.sinks.get(name or "")
    held: Any
    if isinstance(sink, FilesystemSinkConfig):
        held = FilesystemExportSink(sink.path)
    elif isinstance(sink, PostgresSinkConfig):
        from durable_agent.activities.pg_sink import PostgresExportSink
        from durable_agent.config import dsn_from_environment

        held = PostgresExportSink(dsn_from_environment(f"[sinks.{name}]", sink.dsn_env), name=name or "")
    else:
        raise RewindError(
            f"sink {name!r} is not a filesystem or PostgreSQL sink of this config: only those hold "
            "workspace trees"
        )
    return name or "", held, config.workspace_checkpoints.path or default_shadow_root()


async def _restore(repo: Any, tree: str, sink: Any) -> None:
    from durable_agent.activities.workspaces.fetching import restore_tree

    try:
        await restore_tree(repo, tree, sink)
    finally:
        close = getattr(sink, "aclose", None)  # a PostgreSQL sink's pool
        if close is not None:
            await close()


def restore_workspace(export: SessionCheckpointExportV1, folder: Path, sink_name: str | None) -> str:
    """Make ``folder`` hold the files of the export's last workspace tree (files recorded there
    and not in the tree are removed; ignored files and files never recorded stay).

    Args:
        export: The export (validated here).
        folder: The workspace to rebuild (made when it is not there).
        sink_name: The filesystem or PostgreSQL sink that holds the tree's objects (default: the
            config's).

    Returns:
        The tree's id.

    Raises:
        RewindError: No tree, no such sink, the sink lacks an object or cannot be read;
            ``ExportError`` when the export does not validate.
    """
    from durable_agent.activities.workspaces.shadow import ShadowRepo

    tree = export_tree(export)
    _, sink, shadow = sink_of(sink_name)
    try:
        asyncio.run(_restore(ShadowRepo(shadow, folder), tree, sink))
    except DurableAgentError as exc:  # a tree it lacks, a database that refused (``SinkError``, …)
        raise RewindError(str(exc)) from None
    return tree


async def locate(args: argparse.Namespace) -> tuple[str, str]:
    """The run's export at ``--turn`` in the sink (its file, or ``pg:SESSION/RUN/TURN``), and its
    workspace; refused while it runs."""
    from temporalio.api.common.v1 import Payload

    from durable_agent.activities.sinks import FilesystemExportSink
    from durable_agent.activities.workspace_restore import export_file
    from durable_agent.client import connect, run_result

    client = await connect()
    handle = client.get_workflow_handle(args.workflow_id)
    described = await handle.describe()
    if described.status == WorkflowExecutionStatus.RUNNING:
        raise RewindError(
            f"run {args.workflow_id} is still running: end it (`durable-agent end`) or cancel it first"
        )
    result = await run_result(client, args.workflow_id)
    digests = [e.content_digest for e in result.exports if e.turn == args.turn]
    if not digests:
        turns = sorted({e.turn for e in result.exports})
        raise RewindError(f"run {args.workflow_id} has no export at turn {args.turn} (turns: {turns})")
    _, sink, _ = sink_of(args.sink)
    if not isinstance(sink, FilesystemExportSink):  # a PostgreSQL sink (its pool not opened here)
        from durable_agent.cli.exports import PG_PREFIX

        path = f"{PG_PREFIX}{result.session_id}/{result.run_id}/{args.turn}"
    else:
        path = str(export_file(sink, result.session_id, result.run_id, args.turn, digests[-1]))
    workspace = args.workspace
    if workspace is None:  # the folder the run was started with, else the worker's default
        first = client.get_workflow_handle(args.workflow_id, run_id=result.run_id)
        async for event in first.fetch_history_events():
            payloads: list[Payload] = list(event.workflow_execution_started_event_attributes.input.payloads)
            [data] = await client.data_converter.decode(payloads, [dict])
            workspace = data.get("workspace") if isinstance(data, dict) else None
            break
    return path, str(Path(workspace or load_config().default_workspace).expanduser().resolve())


# ``_rewind_waiting``'s answer for a run that does not wait for a prompt: rewound as an ended run
_NOT_WAITING = -1


async def _rewind_waiting(args: argparse.Namespace) -> int:
    """A run that waits for its next prompt is rewound by the run itself (update ``rewind``): its
    worker restores the workspace and the run goes on, same workflow id, from the turn's export."""
    from pydantic import ValidationError
    from temporalio.client import WorkflowUpdateFailedError

    from durable_agent.client import connect
    from durable_agent.core.run_api import (
        AWAITING_PROMPT,
        QUERY_STATUS,
        UPDATE_REWIND,
        RewindAccepted,
        RewindRequest,
        RunStatusView,
    )

    client = await connect()
    handle = client.get_workflow_handle(args.workflow_id)
    if (await handle.describe()).status != WorkflowExecutionStatus.RUNNING:
        return _NOT_WAITING
    status = await handle.query(QUERY_STATUS, result_type=RunStatusView)
    if status.status != AWAITING_PROMPT:
        return _NOT_WAITING
    try:
        request = RewindRequest(turn=args.turn, prompt=args.prompt)
        accepted = await handle.execute_update(UPDATE_REWIND, request, result_type=RewindAccepted)
    except ValidationError as exc:
        err(f"rewind: {one_line(exc)}")
        return 2
    except WorkflowUpdateFailedError as exc:
        err(f"rewind: refused: {exc.cause}")
        return 2
    files = f"workspace restored (tree {accepted.tree})" if accepted.tree else "files left as they were"
    print(f"run {args.workflow_id} rewound to turn {accepted.turn}: {files}; it goes on from that export")
    print(args.workflow_id)
    return 0


def cmd_rewind(args: argparse.Namespace) -> int:
    """Rewind a run to ``--turn``. A run that waits for its next prompt does it itself (update
    ``rewind``); an ended run's workspace is rebuilt here, then a new run starts resumed from its
    export of that turn (as ``resume`` does)."""
    from durable_agent.cli.commands import Handler

    waiting = network(_rewind_waiting)(args)
    if waiting != _NOT_WAITING:
        return waiting
    from durable_agent.cli.exports import read_export_ref

    located = network(_locate_code)(args)
    if located != 0:
        return located
    path, workspace = args.located
    try:
        export = read_export_ref(path, args.sink)
        tree = restore_workspace(export, Path(workspace), args.sink)
    except (OSError, ValueError, DurableAgentError) as exc:  # a database that refused too
        err(f"rewind: {one_line(exc) if not isinstance(exc, RewindError) else exc}")
        return 2
    print(f"workspace {workspace} restored to turn {args.turn} (tree {tree})")
    args.command, args.export, args.workspace = "resume", path, workspace
    args.on_worker, args.restore_workspace = False, None
    # ``resume``'s own handler, by name: ``run_commands`` imports this module for ``--restore-workspace``
    return Handler("run_commands", "cmd_run")(args)


async def _locate_code(args: argparse.Namespace) -> int:
    try:
        args.located = await locate(args)
    except (RewindError, ConfigError) as exc:
        err(f"rewind: {exc}")
        return 2
    return 0


def restore_for_resume(args: argparse.Namespace, export: SessionCheckpointExportV1 | None) -> str | None:
    """``resume --restore-workspace DIR``: rebuild DIR from the export before the run starts.

    Returns:
        DIR as the run's workspace, or None when the files could not be rebuilt (said on stderr).
    """
    from durable_agent.cli.exports import read_export_ref

    folder = Path(args.restore_workspace).expanduser().absolute()
    try:
        export = export or read_export_ref(args.export, args.sink)
        tree = restore_workspace(export, folder, args.sink)
    except (OSError, ValueError, DurableAgentError) as exc:  # ConfigError, RewindError, SinkError
        err(f"resume: --restore-workspace: {exc if isinstance(exc, RewindError) else one_line(exc)}")
        return None
    print(f"workspace {folder} rebuilt from tree {tree}")
    return workspace_arg(str(folder))
