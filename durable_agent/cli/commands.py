"""``durable-agent``: run the demo, a worker, or start and inspect agent runs.

Network commands connect like Temporal's own tools (``TEMPORAL_ADDRESS``,
``TEMPORAL_NAMESPACE`` and config profiles); the task queue comes from
``AGENT_TASK_QUEUE`` and the worker config from ``AGENT_CONFIG``.

Every command and option is declared here, in ``build_parser``. A command's handler is
named by its module and function (``Handler``) and imported only when that command runs,
so ``durable-agent run`` (or any ``--help``) loads neither the other commands' code nor
Temporal before it is needed. This module imports nothing of the package.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import sys
from importlib import import_module
from typing import Any

# Larger exports are resumed by path: a workflow input may hold 2 MB, and the export's
# JSON file is a little larger than the export itself.
RESUME_BY_VALUE_BYTES = 1_500_000

DEFAULT_BIND = "127.0.0.1:8081"  # where codec-server listens
DEFAULT_ORIGIN = "http://localhost:8233"  # the dev server's Web UI, which codec-server allows


class Handler:
    """A command's handler: ``function`` of ``durable_agent.cli.<module>``, imported when it runs.

    Args:
        module: The module's name in ``durable_agent.cli`` (``"run_commands"``).
        function: The function there that takes the parsed arguments and returns the exit code.
    """

    __slots__ = ("function", "module")

    def __init__(self, module: str, function: str) -> None:
        self.module = f"durable_agent.cli.{module}"
        self.function = function

    def __call__(self, args: argparse.Namespace) -> int:
        code: int = getattr(import_module(self.module), self.function)(args)
        return code

    def __repr__(self) -> str:
        return f"Handler({self.module}:{self.function})"


def cmd_worker(args: argparse.Namespace) -> int:
    """Run a worker, exactly as ``python worker.py`` does."""
    import asyncio

    from durable_agent import worker

    return asyncio.run(worker.main())


def parse_bind(value: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[::1]:8081`` for IPv6) as an address to bind.

    Args:
        value: ``HOST:PORT``; an empty host is every interface.

    Returns:
        The host (``0.0.0.0`` when empty) and the port.

    Raises:
        argparse.ArgumentTypeError: ``value`` is not ``HOST:PORT`` with a port up to 65535.
    """
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit() or int(port) > 65535:
        raise argparse.ArgumentTypeError(f"{value!r} is not HOST:PORT")
    return host.strip("[]") or "0.0.0.0", int(port)


# --- the options two commands share -------------------------------------------------


def budget_options(run: argparse.ArgumentParser) -> None:
    """Add ``--max-total-tokens``, ``--max-cost-usd`` and ``--idle-timeout``.

    Args:
        run: The parser of a command that starts a run (``run``, ``resume``, ``chat``).
    """
    run.add_argument("--max-total-tokens", type=int, metavar="N", help="the run's token budget")
    run.add_argument("--max-cost-usd", type=float, metavar="USD", help="the run's cost budget")
    run.add_argument(
        "--idle-timeout", type=float, metavar="SECONDS", help="with follow-ups: close after this long idle"
    )


def instruction_options(run: argparse.ArgumentParser) -> None:
    """Add ``--instructions`` and ``--instructions-file`` (one or the other).

    Args:
        run: The parser of a command that starts a run (``run``, ``resume``, ``chat``).
    """
    given = run.add_mutually_exclusive_group()
    given.add_argument("--instructions", metavar="TEXT", help="text added to the run's system prompt")
    given.add_argument(
        "--instructions-file", dest="instructions", type=_text_file, metavar="FILE", help="... read from FILE"
    )


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
    instruction_options(run)
    run.add_argument(
        "--output-schema",
        type=_json_object_file,
        metavar="FILE.json",
        help="a JSON Schema (an object's) the run's answer must match: its output (docs/inputs.md)",
    )
    run.add_argument(
        "--max-output-retries", type=int, metavar="N", help="with --output-schema: tries after a bad answer"
    )
    run.add_argument("--id", help="the workflow id (default: agent-run-<random>)")
    run.add_argument("--no-follow", action="store_true", help="print the workflow id and return")
    run.set_defaults(func=Handler("run_commands", "cmd_run"))


def _text_file(path: str) -> str:
    """A text file's content, for an option that takes one (bytes not UTF-8 as U+FFFD)."""
    try:
        with open(os.path.expanduser(path), encoding="utf-8", errors="replace") as f:
            return f.read()
    except OSError as exc:
        raise argparse.ArgumentTypeError(f"cannot read {path}: {exc.strerror or exc}") from None


def _json_object_file(path: str) -> dict[str, Any]:
    """A JSON file's object, for an option that takes one (``--output-schema``)."""
    try:
        with open(os.path.expanduser(path), encoding="utf-8") as f:
            value = json.load(f)
    except OSError as exc:
        raise argparse.ArgumentTypeError(f"cannot read {path}: {exc.strerror or exc}") from None
    except ValueError as exc:  # not UTF-8, or not JSON
        raise argparse.ArgumentTypeError(f"{path} is not JSON: {exc}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"{path} holds a JSON {type(value).__name__}, not an object")
    return value


# --- the commands, in the order ``--help`` lists them --------------------------------


def _add_demo_and_worker(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    demo = sub.add_parser("demo", help="run the built-in demo (starts a local dev server if needed)")
    demo.add_argument("--prompt", default=None)
    demo.add_argument("--model", help='"provider/model" (default: the config\'s default model)')
    demo.add_argument("--workspace", help="use this folder instead of a copy of the sample workspace")
    demo.add_argument("--exit", action="store_true", help="stop a dev server the demo started, at once")
    demo.set_defaults(func=Handler("demo", "run_demo"))

    work = sub.add_parser("worker", help="run a worker (same as `python worker.py`)")
    work.set_defaults(func=cmd_worker)


def _add_run_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """``run``, ``resume`` and the commands on one run (``cli/run_commands.py``)."""
    run = sub.add_parser("run", help="start a run on a running worker")
    run.add_argument("--prompt", required=True)
    _run_options(run)
    # a workspace the worker makes the run's own (docs/workspaces.md), instead of --workspace
    source = run.add_mutually_exclusive_group()
    source.add_argument(
        "--git", metavar="URL", help="a repository (a URL, or a path on the worker's machine)"
    )
    source.add_argument("--from-tree", metavar="TREE", help="a tree id an earlier run recorded (a fork)")
    source.add_argument("--from-export", metavar="EXPORT", help="the workspace tree an export file recorded")
    run.add_argument("--ref", default="HEAD", help="with --git: a branch, a tag or a commit (default: HEAD)")
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
    resume.add_argument(
        "--restore-workspace",
        metavar="DIR",
        help="first rebuild DIR (on this machine) from the workspace tree the export recorded; "
        "DIR is the run's workspace unless --workspace says otherwise",
    )
    _run_options(resume)
    rewind = sub.add_parser(
        "rewind",
        help="restore a run's workspace to a turn and go on from its export of that turn (an ended run, "
        "or one waiting for a prompt: then the run does it, under the same workflow id)",
    )
    rewind.add_argument("workflow_id")
    rewind.add_argument("--turn", type=int, required=True, metavar="N", help="the turn to go back to")
    rewind.add_argument("--force", action="store_true", help="even where the worker's tools or rules differ")
    rewind.add_argument("--prompt", help="a user message the new run adds before its first request")
    _run_options(rewind)
    rewind.set_defaults(func=Handler("rewind", "cmd_rewind"))

    by_id = {
        "status": "a run's status (query)",
        "cancel": "ask a run to stop (signal)",
        "events": "a run's events, one JSON a line",
        "result": "wait for a run's result and print it as JSON",
    }
    for name, text in by_id.items():
        sub.add_parser(name, help=text).set_defaults(func=Handler("run_commands", f"cmd_{name}"))
        sub.choices[name].add_argument("workflow_id")
    sub.choices["status"].add_argument("--json", action="store_true", help="print the view as JSON")
    sub.choices["cancel"].add_argument("--reason", help="recorded as the run's error")
    sub.choices["events"].add_argument("--follow", action="store_true", help="print until the run ends")
    sub.choices["events"].add_argument(
        "--tree", action="store_true", help="as a readable log, each subagent's events under its task call"
    )


def _add_conversation_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """``chat``, ``prompt``, ``steer`` and ``end`` (``cli/conversation.py``)."""
    chat = sub.add_parser("chat", help="a conversation in the terminal: start one, or attach to a run")
    chat.add_argument("workflow_id", nargs="?", help="a run with follow-ups to attach to")
    chat.add_argument("--prompt", help="the first prompt (default: the first line read)")
    chat.add_argument("--workspace", help="a folder on the worker's machine (default: the worker's)")
    chat.add_argument("--model", help='"provider/model"')
    chat.add_argument("--session-id")
    chat.add_argument("--id", help="the workflow id (default: agent-run-<random>)")
    for kind in ("allow", "deny", "ask"):
        chat.add_argument(f"--{kind}", action="append", metavar="RULE", help=f"{kind} rule")
    chat.add_argument("--default", choices=("allow", "deny", "ask"), help="decision when no rule matches")
    budget_options(chat)
    instruction_options(chat)
    chat.set_defaults(func=Handler("conversation", "cmd_chat"))
    for name, text in (
        ("prompt", "the next prompt of a run that waits for one (update)"),
        ("steer", "a message the run's model sees at its next request (update)"),
    ):
        texted = sub.add_parser(name, help=text)
        texted.add_argument("workflow_id")
        texted.add_argument("text")
        texted.set_defaults(func=Handler("conversation", f"cmd_{name}"))
    end = sub.add_parser("end", help="close a run with follow-ups: it completes with its last answer")
    end.add_argument("workflow_id")
    end.set_defaults(func=Handler("conversation", "cmd_end"))


def _add_approval_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """``approvals``, ``approve`` and ``deny`` (``cli/approvals.py``)."""
    approvals = sub.add_parser("approvals", help="list the calls waiting for a person's decision")
    approvals.add_argument("workflow_id", nargs="?", help="one run (default: every run that waits)")
    approvals.set_defaults(func=Handler("approvals", "cmd_approvals"))
    for name, text in (("approve", "let a waiting call run"), ("deny", "refuse a waiting call")):
        p = sub.add_parser(name, help=text)
        p.add_argument("workflow_id")
        p.add_argument("call_id")
        p.add_argument("--reason", help="shown to the model (with a denial) and kept in the run's events")
        p.add_argument(
            "--digest",
            metavar="SHA256",
            help="the arguments digest that `approvals` showed: decide only if the call still has it",
        )
        p.set_defaults(func=Handler("approvals", "cmd_decide"))


def _add_export_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """``verify``, ``pack`` and ``exports`` (``cli/exports.py``), and ``diff`` (``cli/diff.py``)."""
    verify = sub.add_parser("verify", help="check export files written by the filesystem sink")
    verify.add_argument("files", nargs="+", metavar="EXPORT", help="a file, or pg:SESSION/RUN/TURN")
    verify.add_argument("--sink", help="the PostgreSQL sink of pg: references (default: the config's)")
    verify.set_defaults(func=Handler("exports", "cmd_verify"))
    pack = sub.add_parser("pack", help="write an export the filesystem sink holds as one portable file")
    pack.add_argument(
        "file", help="the export's turn-*.json file in the sink's folder, or pg:SESSION/RUN/TURN"
    )
    pack.add_argument("--sink", help="the PostgreSQL sink of a pg: reference (default: the config's)")
    pack.add_argument("-o", "--out", help="where to write it (default: <run>-turn-<turn>.json here)")
    pack.set_defaults(func=Handler("exports", "cmd_pack"))

    exports = sub.add_parser("exports", help="list a session's exports in a sink (files, or pg: references)")
    exports.add_argument("session_id")
    exports.add_argument("--sink", help="the sink (default: the config's default_sink)")
    exports.set_defaults(func=Handler("exports", "cmd_exports"))

    diff = sub.add_parser(
        "diff", help="what a run changed in its workspace, as a unified diff (from its sink)"
    )
    diff.add_argument(
        "run",
        metavar="RUN",
        help="a workflow id, an export (a file, or pg:SESSION/RUN/TURN), or with --session a run id",
    )
    diff.add_argument(
        "--turn", type=int, metavar="N", help="only turn N's call: its tree against the one before"
    )
    diff.add_argument(
        "--stat", action="store_true", help="only the paths changed, with lines added and deleted"
    )
    diff.add_argument(
        "--sink", help="the sink that holds the run's exports and objects (default: the config's)"
    )
    diff.add_argument(
        "--session", metavar="ID", help="RUN is a run id of this session, found in the sink alone"
    )
    diff.set_defaults(func=Handler("diff", "cmd_diff"))


def _add_gc_command(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """``gc`` (``cli/gc.py``)."""
    gc = sub.add_parser(
        "gc", help="remove a sink's exports older than its retain_days, and what only they need"
    )
    gc.add_argument("--sink", metavar="NAME", help="only this sink (default: every sink with retain_days)")
    gc.add_argument("--dry-run", action="store_true", help="count what would be removed, remove nothing")
    gc.add_argument(
        "--retain-days",
        type=_positive_days,
        metavar="N",
        help="keep exports N days (instead of the config's)",
    )
    gc.add_argument("--json", action="store_true", help="the reports as JSON")
    gc.set_defaults(func=Handler("gc", "cmd_gc"))


def _positive_days(value: str) -> float:
    try:
        days = float(value)
    except ValueError:
        days = float("nan")
    if not days > 0 or days == float("inf"):
        raise argparse.ArgumentTypeError(f"{value!r} is not a positive number of days")
    return days


def _add_codec_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """``codec-server`` and ``codec-key`` (``cli/codec_server.py``)."""
    server = sub.add_parser(
        "codec-server", help="serve the Temporal UI's remote codec endpoint (decrypts payloads)"
    )
    server.add_argument(
        "--bind",
        type=parse_bind,
        default=parse_bind(DEFAULT_BIND),
        metavar="HOST:PORT",
        help=f"where to listen (default {DEFAULT_BIND})",
    )
    server.add_argument(
        "--origin",
        action="append",
        metavar="URL",
        help=f"a Web UI origin allowed to call it (repeatable; default {DEFAULT_ORIGIN})",
    )
    server.add_argument(
        "--auth-env",
        metavar="VAR",
        help="require an Authorization header equal to this environment variable's value",
    )
    server.set_defaults(func=Handler("codec_server", "cmd_codec_server"))
    key = sub.add_parser("codec-key", help="print a new random key for the config's [codec.keys]")
    key.set_defaults(func=Handler("codec_server", "cmd_codec_key"))


def _add_mcp_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """``mcp list`` (``cli/mcp.py``)."""
    mcp = sub.add_parser("mcp", help="the MCP servers of the config (AGENT_CONFIG)")
    actions = mcp.add_subparsers(dest="mcp_command", metavar="ACTION", required=True)
    listed = actions.add_parser("list", help="the servers, their tools, and whether each is allowed")
    listed.add_argument("--json", action="store_true", help="as JSON")
    listed.set_defaults(func=Handler("mcp", "cmd_mcp_list"))


def _add_upgrade_command(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """``upgrade`` (``cli/upgrade.py``)."""
    upgrade = sub.add_parser(
        "upgrade", help="wake a task queue's runs that wait, to move each to its deployment's new build"
    )
    upgrade.add_argument("--task-queue", required=True, metavar="QUEUE", help="the queue the runs started on")
    upgrade.add_argument("--dry-run", action="store_true", help="list the runs, wake none")
    upgrade.add_argument(
        "--wait",
        type=float,
        default=30.0,
        metavar="SECONDS",
        help="first wait this long at most for a new current build to reach the task queues (default 30)",
    )
    upgrade.set_defaults(func=Handler("upgrade", "cmd_upgrade"))


def _add_console_command(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """``console`` (``cli/console.py``)."""
    console = sub.add_parser("console", help="a web page to watch, approve, steer and rewind runs")
    console.add_argument(
        "--bind",
        type=parse_bind,
        default=parse_bind("127.0.0.1:8765"),
        metavar="HOST:PORT",
        help="where to listen (default 127.0.0.1:8765; beyond loopback only with AGENT_CONSOLE_TOKEN set)",
    )
    console.add_argument("--task-queue", metavar="QUEUE", help="the runs' queue (default AGENT_TASK_QUEUE)")
    console.add_argument(
        "--temporal-ui", default=DEFAULT_ORIGIN, metavar="URL", help=f"the Temporal UI ({DEFAULT_ORIGIN})"
    )
    console.add_argument("--sink", help="the sink of diffs and exports (default: the config's)")
    console.set_defaults(func=Handler("console", "cmd_console"))


def _add_deploy_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """``deploy status``, ``promote``, ``ramp`` and ``rollback`` (``cli/deploy.py``)."""
    deploy = sub.add_parser("deploy", help="a worker deployment's builds, and which one new runs go to")
    actions = deploy.add_subparsers(dest="deploy_command", metavar="ACTION", required=True)
    named = argparse.ArgumentParser(add_help=False)
    named.add_argument(
        "--deployment",
        metavar="NAME",
        help="default: AGENT_DEPLOYMENT, else the config's [worker] deployment",
    )
    forced = argparse.ArgumentParser(add_help=False)
    forced.add_argument("--force", action="store_true", help="even when no worker of the build polls now")
    status = actions.add_parser(
        "status", parents=[named], help="each build: current, ramping, draining or drained; runs; pollers"
    )
    status.add_argument("--json", action="store_true", help="as JSON")
    promote = actions.add_parser(
        "promote", parents=[named, forced], help="make a build current: new runs go to it"
    )
    ramp = actions.add_parser("ramp", parents=[named, forced], help="send a share of new runs to a build")
    for action in (promote, ramp):
        action.add_argument("build", metavar="BUILD", help="a build id (deploy status lists them)")
    ramp.add_argument("percent", metavar="PERCENT", type=_percent, help="0 to 100")
    actions.add_parser(
        "rollback",
        parents=[named, forced],
        help="end a ramp in progress, else make the build current before this one current again",
    )
    for name, action in actions.choices.items():
        action.set_defaults(func=Handler("deploy", f"cmd_deploy_{name}"))


def _percent(value: str) -> float:
    try:
        percent = float(value)
    except ValueError:
        percent = float("nan")
    if not 0 <= percent <= 100:
        raise argparse.ArgumentTypeError(f"{value!r} is not a percentage from 0 to 100")
    return percent


def build_parser() -> argparse.ArgumentParser:
    """The ``durable-agent`` argument parser.

    Returns:
        The parser of every command; each command's ``func`` default is its ``Handler``.
    """
    about = "Run the demo or a worker; start, follow and inspect durable agent runs."
    parser = argparse.ArgumentParser(prog="durable-agent", description=about)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    _add_demo_and_worker(sub)
    _add_run_commands(sub)
    _add_conversation_commands(sub)
    _add_approval_commands(sub)
    _add_export_commands(sub)
    _add_gc_command(sub)
    _add_codec_commands(sub)
    _add_mcp_commands(sub)
    _add_upgrade_command(sub)
    _add_console_command(sub)
    _add_deploy_commands(sub)
    return parser


def run_cli(argv: list[str] | None = None) -> int:
    """Parse the arguments, run the command and return its exit code (for in-process callers).

    Args:
        argv: The arguments after the program's name (default: ``sys.argv[1:]``).

    Returns:
        The command's exit code.

    Raises:
        SystemExit: From argparse, for ``--help`` and for arguments it refuses.
    """
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
    # imported once the command is done, so that a command without Temporal starts without it
    from durable_agent.client import exit_process

    exit_process(code)


if __name__ == "__main__":
    sys.exit(main())
