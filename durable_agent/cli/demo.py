"""``durable-agent demo``: the main job, end to end on the embedded default.

Starts the real Temporal dev server when none is reachable at a local address,
a worker in this process, and an agent run on a fresh copy of the sample
workspace; prints the live log, the result and where to look.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import shlex
import shutil
import signal
import subprocess
import sys
from collections.abc import Coroutine
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

from durable_agent.cli.common import build_run_input, err, follow_and_report
from durable_agent.cli.render import print_where_to_look
from durable_agent.client import connect, connect_options, ensure_search_attributes, start_run
from durable_agent.config import DATA_DIR, AgentConfig, ConfigError, FilesystemSinkConfig, load_config
from durable_agent.core.errors import validation_message
from durable_agent.core.run_api import AgentRunInput, AgentRunResult
from durable_agent.devserver import (
    DevServerError,
    is_reachable,
    split_address,
    start_dev_server,
    stop_dev_server,
    temporal_binary,
)

if TYPE_CHECKING:
    from durable_agent.activities import AgentActivities
    from durable_agent.activities.tools.tool import Tool

DEMO_PROMPT = "Review the calculator module in this workspace and point out any bug."
# Its own queue, so a worker already polling ``agent`` (compose, another shell)
# with another config and file system cannot take the demo's tasks.
DEMO_TASK_QUEUE = "agent-demo"
AGENT_DIR = Path(".agent")
LOCAL_HOSTS = frozenset({"localhost", "127.0.0.1", "::1"})
DEFAULT_LOCAL_PORT = 7233


class _Outcome:
    """The exit code, kept outside the event loop so a Ctrl-C while waiting keeps it."""

    code = 130


def _run_async(coro: Coroutine[Any, Any, int], outcome: _Outcome) -> int:
    try:
        return asyncio.run(coro)
    except (KeyboardInterrupt, asyncio.CancelledError):
        return outcome.code


def _cancel_on_sigterm() -> None:
    # asyncio.run already turns Ctrl-C into a cancel of the main task; SIGTERM
    # should unwind the same way, so the worker and the dev server stop cleanly.
    task = asyncio.current_task()
    if task is not None:
        with contextlib.suppress(NotImplementedError, RuntimeError):
            asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, task.cancel)


def program(name: str) -> str:
    """How to call ``name`` (``durable-agent``, ``temporal``) from the shell that ran the demo:
    the bare name when PATH finds this installation's, else its path (a venv not activated)."""
    beside = Path(sys.executable).parent / name
    found = shutil.which(name)
    if not beside.exists():
        return name if found else temporal_binary() if name == "temporal" else name
    if found and Path(found).resolve() == beside.resolve():
        return name
    try:
        path = str(beside.relative_to(Path.cwd()))
    except ValueError:
        path = str(beside)
    return shlex.quote(path)


def _prepare_workspace(given: str | None) -> Path:
    if given is not None:
        return Path(given).expanduser().resolve()
    target = (AGENT_DIR / "demo-workspace").resolve()
    if target.exists():
        shutil.rmtree(target)
    shutil.copytree(DATA_DIR / "sample_workspace", target)
    return target


def _exports_folder(config: AgentConfig, sink: str | None, result: AgentRunResult) -> Path | None:
    # the sink's own naming, so the path is the real one
    from durable_agent.activities.store.session_store import name_under

    sink_config = config.sinks.get(sink or "") if sink else None
    if not isinstance(sink_config, FilesystemSinkConfig):
        return None
    root = sink_config.path
    return (root / name_under(root, result.session_id) / name_under(root, result.run_id)).resolve()


async def _demo(
    args: argparse.Namespace,
    config: AgentConfig,
    activities: AgentActivities,
    run: AgentRunInput,
    ui_base: str | None,
    started_server: bool,
    outcome: _Outcome,
    server_ports: tuple[int, int] | None = None,
) -> int:
    from durable_agent.worker import build_worker

    _cancel_on_sigterm()
    # The live log already shows every failure the run sees; the SDK's per-attempt
    # warnings (with tracebacks) would bury it.
    logging.getLogger("temporalio.activity").setLevel(logging.ERROR)
    try:
        client = await connect(config)
    except RuntimeError as exc:  # what Client.connect raises when nothing answers
        err(f"demo: cannot connect to Temporal: {exc}")
        return 2
    await ensure_search_attributes(client)
    queue = os.environ.get("AGENT_TASK_QUEUE") or DEMO_TASK_QUEUE
    workspace = _prepare_workspace(args.workspace)
    print(f"Workspace: {workspace}" + ("" if args.workspace else " (a fresh copy of the sample workspace)"))
    print(f"Model:     {run.model or config.default_model}")
    print(f"Prompt:    {run.prompt}")
    async with build_worker(client, activities, queue):
        print(f"Worker:    in this process, task queue {queue!r}, namespace {client.namespace!r}")
        handle = await start_run(client, run, queue=queue)
        print(f"Started:   workflow {handle.id}\n")
        result = await follow_and_report(client, handle)
        outcome.code = 0 if result is not None and result.status == "completed" else 1
        exports = _exports_folder(config, config.default_sink, result) if result else None
        run_id = result.run_id if result else (handle.first_execution_run_id or "")
        print_where_to_look(
            client.namespace,
            handle.id,
            run_id,
            ui_base,
            exports,
            restart_hint=args.exit and started_server,
            task_queue=queue,
            programs=(program("durable-agent"), program("temporal")),
            db_file=(AGENT_DIR / "temporal.db").resolve(),
            server_ports=server_ports,
        )
        if started_server and not args.exit:
            print(
                f"\nThe Temporal dev server and its Web UI keep running at {ui_base} — press Ctrl-C to stop.",
                flush=True,
            )
            # The worker stays up meanwhile, so `durable-agent status` and the UI's queries answer.
            await asyncio.Event().wait()
    return outcome.code


def _demo_tools(config: AgentConfig) -> dict[str, Tool] | None:
    """The worker's tools: the built-in ones, less ``bash`` when its sandbox cannot start here.

    The demo is the first command on a fresh machine, which may lack bubblewrap;
    it says so and runs without ``bash`` (a worker refuses to start instead).
    """
    from durable_agent.activities.tools.builtin import builtin_tools
    from durable_agent.activities.tools.sandbox import sandbox_problem

    problem = sandbox_problem(config.sandbox)
    if problem is None:
        return None
    print(
        f"Bash:      unavailable, its sandbox cannot start: {problem}\n"
        '           (install bubblewrap, or set [sandbox] kind = "none" in AGENT_CONFIG to run bash'
        " unsandboxed); the demo runs without the bash tool\n"
    )
    tools = builtin_tools(config.sandbox)
    del tools["bash"]
    return tools


def run_demo(args: argparse.Namespace) -> int:
    """Run the built-in demo end to end, starting a local dev server when none is running."""
    from durable_agent.activities import AgentActivities

    try:
        config = load_config()
        # Built now, so a bad provider or credential is reported before any server starts.
        activities = AgentActivities(config, tools=_demo_tools(config))
    except ConfigError as exc:
        err(f"demo: {exc}")
        return 2
    workspace = str(Path(args.workspace or AGENT_DIR / "demo-workspace").expanduser().resolve())
    try:
        prompt = args.prompt or DEMO_PROMPT
        run = build_run_input({"prompt": prompt, "workspace": workspace, "model": args.model})
    except ValidationError as exc:
        err(f"demo: invalid run input: {validation_message(exc)}")
        return 2
    if args.workspace and not Path(workspace).is_dir():
        err(f"demo: workspace {args.workspace!r} is not a folder")
        return 2
    address = str(connect_options()["target_host"])
    host, port = split_address(address)
    server: subprocess.Popen[bytes] | None = None
    local_default = host in LOCAL_HOSTS and port == DEFAULT_LOCAL_PORT
    ui_base = "http://localhost:8233" if local_default else None
    outcome = _Outcome()
    try:
        if not is_reachable(address):
            if host not in LOCAL_HOSTS:
                err(f"demo: no Temporal server answers at {address}; start one or set TEMPORAL_ADDRESS")
                return 2
            ui_port = port + 1000  # the dev server's own convention (7233 → 8233)
            db, log = AGENT_DIR / "temporal.db", AGENT_DIR / "temporal-dev-server.log"
            print(f"No Temporal server at {address}: starting the Temporal dev server")
            print(f"  (history kept in {db}, log in {log}) …", flush=True)
            try:
                server = start_dev_server(port=port, ui_port=ui_port, db_file=db, log_file=log)
            except DevServerError as exc:
                err(f"demo: {exc} (see {log})")
                return 2
            ui_base = f"http://localhost:{ui_port}"
            print(f"Temporal dev server running at {address}, Web UI {ui_base}\n")
        else:
            print(f"Using the Temporal server at {address}\n")
        started = server is not None
        # the restart hint names the ports the demo's server used, when not the defaults
        ports = (port, port + 1000) if started and port != DEFAULT_LOCAL_PORT else None
        return _run_async(_demo(args, config, activities, run, ui_base, started, outcome, ports), outcome)
    finally:
        if server is not None:
            stop_dev_server(server)
            print("Stopped the Temporal dev server.", flush=True)
