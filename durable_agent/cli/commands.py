"""``durable-agent``: run the demo, a worker, or start and inspect agent runs.

Network commands connect like Temporal's own tools (``TEMPORAL_ADDRESS``,
``TEMPORAL_NAMESPACE`` and config profiles); the task queue comes from
``AGENT_TASK_QUEUE`` and the worker config from ``AGENT_CONFIG``.
"""

from __future__ import annotations

import argparse
import asyncio
import io
import os
import sys
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

from pydantic import ValidationError
from temporalio.client import WorkflowFailureError, WorkflowQueryFailedError
from temporalio.exceptions import WorkflowAlreadyStartedError
from temporalio.service import RPCError

from durable_agent.cli.approvals import add_commands as add_approval_commands
from durable_agent.cli.codec_server import add_commands as add_codec_commands
from durable_agent.cli.common import (
    budget_fields,
    budget_options,
    build_run_input,
    err,
    follow_and_report,
    policy_arg,
    workspace_arg,
)
from durable_agent.cli.conversation import add_commands as add_conversation_commands
from durable_agent.cli.exports import PG_PREFIX, cmd_exports, read_export_ref
from durable_agent.cli.mcp import add_commands as add_mcp_commands
from durable_agent.cli.render import print_status
from durable_agent.client import (
    connect,
    exit_process,
    follow_events,
    run_result,
    start_run,
)
from durable_agent.client import task_queue as default_task_queue
from durable_agent.codec import ENCODING, CodecError
from durable_agent.config import ConfigError
from durable_agent.core.errors import validation_message
from durable_agent.core.failures import failure_message
from durable_agent.core.models import EventRecord
from durable_agent.core.run_api import (
    QUERY_EVENTS,
    QUERY_STATUS,
    SIGNAL_CANCEL,
    AgentRunInput,
    RunStatusView,
)

# Larger exports are resumed by path: a workflow input may hold 2 MB, and the export's
# JSON file is a little larger than the export itself.
RESUME_BY_VALUE_BYTES = 1_500_000


def _one_line(exc: Exception) -> str:
    """``Type: message`` on one line, whatever the message holds (a reader's error quotes input)."""
    message = validation_message(exc) if isinstance(exc, ValidationError) else str(exc)
    return f"{type(exc).__name__}: {' '.join(message.split())}"


# --- the commands ---------------------------------------------------------------


def cmd_demo(args: argparse.Namespace) -> int:
    """Run the built-in demo end to end, starting a local dev server when none is running."""
    from durable_agent.cli.demo import run_demo

    return run_demo(args)


def cmd_worker(args: argparse.Namespace) -> int:
    """Run a worker, exactly as ``python worker.py`` does."""
    from durable_agent import worker

    return asyncio.run(worker.main())


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


def cmd_run(args: argparse.Namespace) -> int:
    """Start an ``AgentRun`` (``run``, or ``resume`` from an export); follow it unless ``--no-follow``."""
    fields: dict[str, Any] = {
        "prompt": getattr(args, "prompt", None),
        "workspace": workspace_arg(args.workspace),
        "model": args.model,
        "session_id": args.session_id,
        "export_sink": args.sink,
        "max_tool_rounds": args.max_tool_rounds,
        "approval_timeout_seconds": args.approval_timeout,
        "permissions": policy_arg(args),
        **budget_fields(args),
    }
    if args.command == "resume":
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
            err(f"resume: cannot read {args.export}: {_one_line(exc)}")
            return 2
        if by_path and not args.on_worker:
            print(f"the export is {size:,} bytes: the worker reads it from {path}")
        fields["force_resume"] = args.force or None
    try:
        run = build_run_input(fields)
    except ValidationError as exc:
        err(f"{args.command}: invalid run input: {validation_message(exc)}")
        return 2
    return _network(lambda a: _run(a, run))(args)


async def _status(args: argparse.Namespace) -> int:
    handle = (await connect()).get_workflow_handle(args.workflow_id)
    view = await handle.query(QUERY_STATUS, result_type=RunStatusView)
    if args.json:
        print(view.model_dump_json(indent=2))
    else:
        print_status(view)
    return 0


async def _cancel(args: argparse.Namespace) -> int:
    handle = (await connect()).get_workflow_handle(args.workflow_id)
    await handle.signal(SIGNAL_CANCEL, args=[args.reason] if args.reason else [])
    print(f"cancel requested for {args.workflow_id}")
    return 0


async def _events(args: argparse.Namespace) -> int:
    handle = (await connect()).get_workflow_handle(args.workflow_id)
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


def _network(command: Callable[[argparse.Namespace], Coroutine[Any, Any, int]]) -> Callable[..., int]:
    """Run an async command; Temporal's errors become a one-line message and exit code 1."""

    def run(args: argparse.Namespace) -> int:
        try:
            return asyncio.run(command(args))
        # RuntimeError is what Client.connect raises when nothing answers.
        except (RPCError, WorkflowQueryFailedError, WorkflowAlreadyStartedError, RuntimeError) as exc:
            err(f"{args.command}: {exc}")
            return 1
        except ConfigError as exc:  # the config the client reads its codec keys from
            err(f"{args.command}: {exc}")
            return 2
        except CodecError as exc:  # encrypted with a key this config does not hold
            err(f"{args.command}: {exc}: give this command the config and key variables the workers use")
            return 2
        except KeyError as exc:
            if ENCODING.decode() not in str(exc):
                raise
            # the run's payloads are encrypted and this client has no [codec] keys at all
            err(
                f"{args.command}: the run's payloads are encrypted ([codec] on the workers): set "
                "AGENT_CONFIG to a config with the same [codec] keys, and their variables"
            )
            return 2
        except KeyboardInterrupt:
            return 130  # a run being followed goes on without us

    return run


def cmd_verify(args: argparse.Namespace) -> int:
    """Check export files the filesystem sink wrote: every digest, the schema and the contract."""
    failed = 0
    for name in args.files:
        try:
            export = read_export_ref(name, args.sink)
            export.open()
        except (OSError, ValueError) as exc:  # ExportError and pydantic's ValidationError are ValueErrors
            failed += 1
            print(f"FAILED {name}: {_one_line(exc)}")
            continue
        d = export.descriptor
        print(f"OK {name}: session {d.session_id} run {d.run_id} turn {d.turn} {d.content_digest}")
    return 1 if failed else 0


def cmd_pack(args: argparse.Namespace) -> int:
    """Write an export the filesystem sink holds (a manifest and its parts) as one portable file."""
    from durable_agent.activities.sink_files import whole_document

    try:
        export = read_export_ref(args.file, args.sink)
        export.open()
    except (OSError, ValueError) as exc:  # ExportError and pydantic's ValidationError are ValueErrors
        err(f"pack: {args.file}: {_one_line(exc)}")
        return 1
    d = export.descriptor
    out = Path(args.out) if args.out else Path(f"{d.run_id}-turn-{d.turn:06d}.json")
    try:
        out.write_bytes(whole_document(export))
    except OSError as exc:
        err(f"pack: cannot write {out}: {exc}")
        return 1
    print(
        f"wrote {out}: session {d.session_id} run {d.run_id} turn {d.turn}, {d.size_bytes:,} bytes of content"
    )
    return 0


# --- argument parsing -----------------------------------------------------------


def _run_options(run: argparse.ArgumentParser) -> None:
    """The options of a new run, shared by ``run`` and ``resume``."""
    run.add_argument("--workspace", help="a folder on the worker's machine (default: the worker's)")
    run.add_argument("--model", help='"provider/model"')
    run.add_argument("--session-id")
    run.add_argument("--sink", help="the export sink's name in the worker config")
    run.add_argument("--max-tool-rounds", type=int)
    run.add_argument(
        "--approval-timeout", type=float, metavar="SECONDS", help="deny a waiting call after this"
    )
    for kind in ("allow", "deny", "ask"):
        run.add_argument(f"--{kind}", action="append", metavar="RULE", help=f"{kind} rule, e.g. 'read(**)'")
    run.add_argument("--default", choices=("allow", "deny", "ask"), help="decision when no rule matches")
    budget_options(run)
    run.add_argument("--id", help="the workflow id (default: agent-run-<random>)")
    run.add_argument("--no-follow", action="store_true", help="print the workflow id and return")
    run.set_defaults(func=cmd_run)


def build_parser() -> argparse.ArgumentParser:
    """The ``durable-agent`` argument parser."""
    about = "Run the demo or a worker; start, follow and inspect durable agent runs."
    parser = argparse.ArgumentParser(prog="durable-agent", description=about)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    demo = sub.add_parser("demo", help="run the built-in demo (starts a local dev server if needed)")
    demo.add_argument("--prompt", default=None)
    demo.add_argument("--model", help='"provider/model" (default: the config\'s default model)')
    demo.add_argument("--workspace", help="use this folder instead of a copy of the sample workspace")
    demo.add_argument("--exit", action="store_true", help="stop a dev server the demo started, at once")
    demo.set_defaults(func=cmd_demo)

    work = sub.add_parser("worker", help="run a worker (same as `python worker.py`)")
    work.set_defaults(func=cmd_worker)

    run = sub.add_parser("run", help="start a run on a running worker")
    run.add_argument("--prompt", required=True)
    _run_options(run)
    resume = sub.add_parser("resume", help="start a new run that goes on from an export file")
    resume.add_argument(
        "export", metavar="EXPORT", help="a file the filesystem sink wrote, or pg:SESSION/RUN/TURN (--sink)"
    )
    resume.add_argument("--force", action="store_true", help="even where the worker's tools or rules differ")
    resume.add_argument("--prompt", help="a user message the resumed run adds before its first request")
    resume.add_argument(
        "--on-worker",
        action="store_true",
        help="the worker reads the file (a path on its machine) instead of this command sending it; "
        f"the default for files over {RESUME_BY_VALUE_BYTES:,} bytes",
    )
    _run_options(resume)

    by_id = {
        "status": ("a run's status (query)", _status),
        "cancel": ("ask a run to stop (signal)", _cancel),
        "events": ("a run's events, one JSON a line", _events),
        "result": ("wait for a run's result and print it as JSON", _result),
    }
    for name, (text, command) in by_id.items():
        sub.add_parser(name, help=text).set_defaults(func=_network(command))
        sub.choices[name].add_argument("workflow_id")
    sub.choices["status"].add_argument("--json", action="store_true", help="print the view as JSON")
    sub.choices["cancel"].add_argument("--reason", help="recorded as the run's error")
    sub.choices["events"].add_argument("--follow", action="store_true", help="print until the run ends")

    add_conversation_commands(sub, _network)
    add_approval_commands(sub, _network)

    verify = sub.add_parser("verify", help="check export files written by the filesystem sink")
    verify.add_argument("files", nargs="+", metavar="EXPORT", help="a file, or pg:SESSION/RUN/TURN")
    verify.add_argument("--sink", help="the PostgreSQL sink of pg: references (default: the config's)")
    verify.set_defaults(func=cmd_verify)
    pack = sub.add_parser("pack", help="write an export the filesystem sink holds as one portable file")
    pack.add_argument(
        "file", help="the export's turn-*.json file in the sink's folder, or pg:SESSION/RUN/TURN"
    )
    pack.add_argument("--sink", help="the PostgreSQL sink of a pg: reference (default: the config's)")
    pack.add_argument("-o", "--out", help="where to write it (default: <run>-turn-<turn>.json here)")
    pack.set_defaults(func=cmd_pack)

    exports = sub.add_parser("exports", help="list a session's exports in a sink (files, or pg: references)")
    exports.add_argument("session_id")
    exports.add_argument("--sink", help="the sink (default: the config's default_sink)")
    exports.set_defaults(func=cmd_exports)
    add_codec_commands(sub)
    add_mcp_commands(sub)
    return parser


def run_cli(argv: list[str] | None = None) -> int:
    """Parse the arguments, run the command and return its exit code (for in-process callers)."""
    for stream in (sys.stdout, sys.stderr):
        # Live logs must show through pipes at once, and never die on a terminal's encoding.
        if isinstance(stream, io.TextIOWrapper):
            stream.reconfigure(line_buffering=True, errors="replace")
    args = build_parser().parse_args(argv)
    code: int = args.func(args)
    return code


def main(argv: list[str] | None = None) -> int:
    """The console script: run the command, then exit the process with its code.

    It leaves with ``os._exit`` once the output is flushed: the Temporal client's
    Rust threads can crash the interpreter's own shutdown (an intermittent
    SIGSEGV, temporalio/sdk-python#300), which would turn a finished command
    into a failed one.
    """
    try:
        code = run_cli(argv)
    except BrokenPipeError:
        # the reader went away (`durable-agent events ID | head`): end quietly, as `cat` does; the
        # rest of the output goes nowhere rather than into a second error at the final flush
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        code = 0
    exit_process(code)


if __name__ == "__main__":
    sys.exit(main())
