"""``durable-agent run | resume | status | cancel | events | result``: start a run, or
resume one from an export, and look at one run by its workflow id.

The parser (``cli/commands.py``) imports this module only when one of these commands runs.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from pydantic import ValidationError
from temporalio.client import WorkflowFailureError

from durable_agent.cli.commands import RESUME_BY_VALUE_BYTES
from durable_agent.cli.common import (
    budget_fields,
    build_run_input,
    err,
    follow_and_report,
    network,
    one_line,
    policy_arg,
    workspace_arg,
)
from durable_agent.cli.render import EventPrinter, print_status
from durable_agent.client import cancel_run, connect, follow_events, run_result, start_run
from durable_agent.client import task_queue as default_task_queue
from durable_agent.core.errors import validation_message
from durable_agent.core.events import EventRecord, SubagentStartEvent
from durable_agent.core.failures import failure_message
from durable_agent.core.run_api import (
    QUERY_EVENTS,
    QUERY_STATUS,
    AgentRunInput,
    RunStatusView,
)


async def _run(args: argparse.Namespace, run: AgentRunInput) -> int:
    client = await connect()
    queue = default_task_queue()
    handle = await start_run(client, run, workflow_id=args.id, queue=queue)
    if args.no_follow:
        print(handle.id)
        return 0
    print(f"Started workflow {handle.id} on task queue {queue!r} (a worker must be running there)\n")
    result = await follow_and_report(client, handle)
    print(f"\nworkflow: {handle.id}")
    return 0 if result is not None and result.status == "completed" else 1


def workspace_source(args: argparse.Namespace) -> dict[str, str] | None:
    """``run``'s ``--git``/``--ref``, ``--from-tree`` or ``--from-export`` as the input's workspace
    source (None: none given).

    Raises:
        ValueError: ``--workspace`` given too, or the export recorded no tree (or cannot be read:
            ``ExportError``, ``OSError``).
    """
    git, tree, export = (getattr(args, name, None) for name in ("git", "from_tree", "from_export"))
    if git is None and tree is None and export is None:
        return None
    if args.workspace:
        raise ValueError(
            "--workspace names a folder: it does not go with --git, --from-tree or --from-export"
        )
    if git is not None:
        return {"git": git, "ref": args.ref}
    if export is not None:
        from durable_agent.cli.exports import read_export_ref
        from durable_agent.core.export import workspace_tree_of

        tree = workspace_tree_of(read_export_ref(export, args.sink).open().source_run().events)
        if tree is None:
            raise ValueError(f"{export} recorded no workspace tree")
    assert tree is not None
    return {"tree": tree}


def cmd_run(args: argparse.Namespace) -> int:
    """Start an ``AgentRun`` (``run``, or ``resume`` from an export); follow it unless ``--no-follow``."""
    try:
        source = workspace_source(args)
    except (OSError, ValueError) as exc:  # ExportError and pydantic's ValidationError are ValueErrors
        err(f"{args.command}: {one_line(exc)}")
        return 2
    fields: dict[str, Any] = {
        "prompt": getattr(args, "prompt", None),
        "workspace": source or workspace_arg(args.workspace),
        "model": args.model,
        "session_id": args.session_id,
        "export_sink": args.sink,
        "max_tool_rounds": args.max_tool_rounds,
        "approval_timeout_seconds": args.approval_timeout,
        "permissions": policy_arg(args),
        "instructions": args.instructions,
        "output_schema": args.output_schema,
        "max_output_retries": args.max_output_retries,
        **budget_fields(args),
    }
    if args.command == "resume":
        # only resume reads exports: `run` does without that module
        from durable_agent.cli.exports import PG_PREFIX, read_export_ref

        if args.on_worker and args.export.startswith(PG_PREFIX):
            err("resume: --on-worker takes a file on the worker's machine, not a pg: reference")
            return 2
        path = Path(args.export).expanduser().absolute()
        size = 0
        try:
            by_path = args.on_worker
            if not by_path:
                # a sink's manifest is joined with its parts; pg:SESSION/RUN/TURN is read from the database
                export = read_export_ref(args.export, args.sink)
                size = export.descriptor.size_bytes
                by_path = size > RESUME_BY_VALUE_BYTES
            if by_path and args.export.startswith(PG_PREFIX):
                err(
                    f"resume: {args.export} is {size:,} bytes, more than a run's input may hold: "
                    "write it to a file on the worker's machine with `durable-agent pack`, then "
                    "resume that file with --on-worker"
                )
                return 2
            if by_path:
                # too large for a workflow input: the worker reads it (a path on its machine)
                fields["resume_from_file"] = str(path)
            else:
                export.open()  # refused here, with its typed error, rather than as a run input
                fields["resume_from"] = export
        except (OSError, ValueError) as exc:  # ExportError and pydantic's ValidationError are ValueErrors
            err(f"resume: cannot read {args.export}: {one_line(exc)}")
            return 2
        if by_path and not args.on_worker:
            print(f"the export is {size:,} bytes: the worker reads it from {path}")
        fields["force_resume"] = args.force or None
        if getattr(args, "restore_workspace", None):
            from durable_agent.cli.rewind import restore_for_resume

            restored = restore_for_resume(args, fields.get("resume_from"))
            if restored is None:
                return 2
            fields["workspace"] = fields["workspace"] or restored
    try:
        run = build_run_input(fields)
    except ValidationError as exc:
        err(f"{args.command}: invalid run input: {validation_message(exc)}")
        return 2
    return network(lambda a: _run(a, run))(args)


async def _status(args: argparse.Namespace) -> int:
    from durable_agent.cli.approvals import waiting_in_tree

    client = await connect()
    view = await client.get_workflow_handle(args.workflow_id).query(QUERY_STATUS, result_type=RunStatusView)
    if args.json:
        print(view.model_dump_json(indent=2))
    else:
        # the calls its children wait on too: approve them with ``approve <this id> CALL``
        below = [w for w in await waiting_in_tree(client, args.workflow_id, view) if w[0] != args.workflow_id]
        print_status(view, children_waiting=below)
    return 0


async def _cancel(args: argparse.Namespace) -> int:
    handle = (await connect()).get_workflow_handle(args.workflow_id)
    await cancel_run(handle, args.reason)
    print(f"cancel requested for {args.workflow_id}")
    return 0


async def _print_tree(client: Any, workflow_id: str, indent: str) -> None:
    """A run's events as a readable log, each subagent's under its ``subagent_start`` line."""
    handle = client.get_workflow_handle(workflow_id)
    printer = EventPrinter(indent=indent)
    for record in await handle.query(QUERY_EVENTS, 0, result_type=list[EventRecord]):
        printer.show(record)
        if isinstance(record.event, SubagentStartEvent):
            printer.finish()
            await _print_tree(client, record.event.workflow_id, indent + "    ")
    printer.finish()


async def _events(args: argparse.Namespace) -> int:
    client = await connect()
    handle = client.get_workflow_handle(args.workflow_id)
    if getattr(args, "tree", False):
        print(args.workflow_id)
        await _print_tree(client, args.workflow_id, "  ")
        return 0
    if args.follow:
        async for record in follow_events(handle):
            print(record.model_dump_json())
    else:
        for record in await handle.query(QUERY_EVENTS, 0, result_type=list[EventRecord]):
            print(record.model_dump_json())
    return 0


async def _result(args: argparse.Namespace) -> int:
    try:
        result = await run_result(await connect(), args.workflow_id)
    except WorkflowFailureError as exc:
        err(f"workflow {args.workflow_id} failed: {failure_message(exc)}")
        return 1
    print(result.model_dump_json(indent=2))
    return 0 if result.status == "completed" else 1


cmd_status = network(_status)
cmd_cancel = network(_cancel)
cmd_events = network(_events)
cmd_result = network(_result)
