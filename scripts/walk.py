"""Count the files a run crosses: the two walks of docs/architecture.md ("Follow a prompt").

    python scripts/walk.py              # starts a Temporal dev server of its own
    TEMPORAL_ADDRESS=host:port python scripts/walk.py
    python scripts/walk.py --all        # every function first called in each file, not the first few

A worker and ``durable-agent run`` each run in a process of their own under a profiler
(``sys.setprofile`` and ``threading.setprofile``) that records every call into this tree's
files. The run is the one the walk describes: the scripted model asks for one ``read`` of
``README.md``, then answers; a filesystem store and sink, the default config otherwise (the
store and the exports in a temporary folder), a temporary workspace without ``AGENTS.md``.

What is counted (the rule docs/architecture.md states): a file counts once in a walk, where a
function of it (a method, a validator, a serializer) is first called. Not counted: code run while
a module is imported (its classes defined, a default value validated), and a coroutine that only
resumes on the way: the profiler reports each resumption as a call, and when the innermost
coroutine wakes, each one awaiting it is resumed too; one that only passes the resumption on (its
coroutine suspends again, and it with it) does nothing of its own. A resumption that runs code
(a coroutine that goes on after an ``await``, or returns) counts. The worker's answers to the
CLI's ``events`` queries (the command following the run) are not the run's path, and are left
out too.

The walks:

- from ``durable-agent run`` to the model request: in the CLI's process, from ``run_cli`` until
  ``start_run`` returns; on the worker, from ``AgentRun.run`` to the provider's ``complete``;
- from a tool's output to the export file: on the worker, from the return of the tool's function
  (``read`` in ``activities/tools/fs.py``) to the return of the sink's ``deliver_parts`` for the
  boundary after it; the tool's own file is named apart.
"""

from __future__ import annotations

import argparse
import dis
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from types import CodeType, FrameType
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

PROMPT = "What does the README say?"
SCRIPT: dict[str, Any] = {
    "responses": [
        {"tool_calls": [{"id": "call-read-1", "name": "read", "input": {"file_path": "README.md"}}]},
        {"text": "The README says the workspace holds one file."},
    ]
}
TOOL_FILE = "activities/tools/fs.py"
TOOL_FUNCTION = "read"
SINK = ("activities/sinks.py", "FilesystemExportSink.deliver_parts")
CLI_END = ("durable_agent/client.py", "start_run")
WORKFLOW_START = ("workflows/agent_run.py", "AgentRun.run")
SHOWN = 6  # functions named per file without --all

# One recorded event: thread, file (from the tree's root), qualified name, kind ("c" a call,
# "r" a coroutine or generator resumed, "y" one suspended, "x" a return), and whether the code is a
# module's or a class's body rather than a function.
Event = tuple[int, str, str, str, bool]

_SUSPENDABLE = 0x20 | 0x80 | 0x100 | 0x200  # generator, coroutine, iterable coroutine, async generator
_YIELD_VALUE = dis.opmap["YIELD_VALUE"]
_OPTIMIZED = 0x1  # a function's code; a module's or a class's body lacks it


class Recorder:
    """The profiler: every call into the tree's own files (not the virtualenv's), in order."""

    def __init__(self) -> None:
        self.events: list[Event] = []
        self._files: dict[str, str | None] = {}
        self._resume_at: dict[CodeType, int] = {}

    def _file(self, code: CodeType) -> str | None:
        name = code.co_filename
        if name not in self._files:
            path = os.path.realpath(name)
            inside = path.startswith(f"{ROOT}/") and not path.startswith(f"{ROOT}/.venv/")
            self._files[name] = path[len(str(ROOT)) + 1 :] if inside else None
        return self._files[name]

    def _resumed(self, frame: FrameType) -> bool:
        """A suspendable frame past its first ``RESUME``: it was started before, and goes on."""
        code = frame.f_code
        if not code.co_flags & _SUSPENDABLE:
            return False
        if code not in self._resume_at:
            self._resume_at[code] = next(i.offset for i in dis.get_instructions(code) if i.opname == "RESUME")
        return frame.f_lasti > self._resume_at[code]

    @staticmethod
    def _yields(frame: FrameType) -> bool:
        """A suspendable frame that leaves at a ``yield`` or an ``await``: it will be resumed."""
        code = frame.f_code
        return bool(code.co_flags & _SUSPENDABLE) and code.co_code[frame.f_lasti] == _YIELD_VALUE

    def __call__(self, frame: FrameType, event: str, arg: object) -> None:
        if event != "call" and event != "return":
            return
        code = frame.f_code
        file = self._file(code)
        if file is None:
            return
        if event == "call":
            kind = "r" if self._resumed(frame) else "c"
        else:
            kind = "y" if self._yields(frame) else "x"
        body = not code.co_flags & _OPTIMIZED
        self.events.append((threading.get_ident(), file, code.co_qualname, kind, body))

    def install(self) -> None:
        threading.setprofile(self)
        sys.setprofile(self)

    def dump(self, out: Path) -> None:
        sys.setprofile(None)
        threading.setprofile(None)
        out.write_text(json.dumps(self.events))


def child(role: str, out: Path, argv: list[str]) -> None:
    """One profiled process: the worker (until SIGTERM stops it) or the CLI's command."""
    recorder = Recorder()
    recorder.install()
    code = 1
    try:
        if role == "worker":
            import asyncio

            from durable_agent import worker

            code = asyncio.run(worker.main())
        else:
            from durable_agent.cli.commands import run_cli

            code = run_cli(argv)
    finally:
        recorder.dump(out)
        sys.stdout.flush()
        sys.stderr.flush()
    # as the console script leaves: the Temporal client's threads can crash the interpreter's shutdown
    os._exit(code)


# -- the analysis -----------------------------------------------------------------------------


@dataclass
class _Frame:
    """A frame on a thread's rebuilt stack: where it was called or resumed, and what its direct
    callees did (``forwards``: the one thing it did was resume a coroutine that suspended again)."""

    index: int
    file: str
    name: str
    resumed: bool
    body: bool  # a module's or a class's body: not a function
    aside: bool  # a module's body (being imported) or a query handler: what runs under it is not counted
    children: int = 0
    forwards: bool = False


def counted_calls(events: list[Event], queries: set[str]) -> list[tuple[int, str, str]]:
    """The calls the rule counts, with their index in ``events``, in order.

    A call counts unless it is a module's or a class's body, or runs under a module being
    imported or a query handler (each thread's stack is rebuilt from the events). A resumption
    counts as a call unless the frame only passed it on: it resumed the one coroutine it awaits,
    which suspended again, and suspended with it (``AgentRun.run`` awaiting ``_loop`` awaiting
    ``_run_calls``… when a tool's output wakes the innermost).
    """
    stacks: dict[int, list[_Frame]] = defaultdict(list)
    out: list[tuple[int, str, str]] = []
    for index, (thread, file, name, kind, body) in enumerate(events):
        stack = stacks[thread]
        if kind in "xy":
            if not stack:
                continue
            frame = stack.pop()
            parent = stack[-1] if stack else None
            if parent is not None:
                parent.children += 1
                parent.forwards = parent.children == 1 and frame.resumed and kind == "y"
            passed_on = frame.resumed and kind == "y" and frame.forwards
            under = frame.aside or frame.body or any(f.aside for f in stack)
            if not under and not passed_on:
                out.append((frame.index, frame.file, frame.name))
            continue
        aside = (not body and name in queries) or name == "<module>"
        stack.append(_Frame(index, file, name, resumed=kind == "r", body=body, aside=aside))
    out.sort()
    return out


def index_of(events: list[Event], file: str, name: str, kind: str, after: int = -1) -> int:
    """The first event of ``name`` in ``file`` of this kind after ``after``."""
    for index in range(after + 1, len(events)):
        _, f, n, k, _ = events[index]
        if f == file and n == name and k == kind:
            return index
    raise SystemExit(f"walk: {file} {name} ({kind}) not found in the profile")


def walk(calls: Iterable[tuple[int, str, str]], start: int, end: int) -> dict[str, list[str]]:
    """Each file first called within events ``start``..``end``, in that order, with its functions."""
    files: dict[str, list[str]] = {}
    for index, file, name in calls:
        if start <= index <= end and name not in files.setdefault(file, []):
            files[file].append(name)
    return files


@dataclass
class Walks:
    cli: dict[str, list[str]]
    worker: dict[str, list[str]]
    output: dict[str, list[str]]
    cli_imported: list[str]  # files the CLI imported on its way and called nothing of


def analyse(cli_events: list[Event], worker_events: list[Event], queries: set[str]) -> Walks:
    cli_calls = counted_calls(cli_events, queries)
    cli_end = index_of(cli_events, *CLI_END, "x")
    calls = counted_calls(worker_events, queries)
    start = next(i for i, f, n in calls if (f, n) == WORKFLOW_START)
    request = next(
        i
        for i, f, n in calls
        if i > start and f.startswith("activities/providers/") and n.endswith(".complete")
    )
    output = index_of(worker_events, TOOL_FILE, TOOL_FUNCTION, "x", request)
    exported = index_of(worker_events, *SINK, "x", output)
    second = walk(calls, output + 1, exported)
    second.pop(TOOL_FILE, None)
    first = walk(cli_calls, 0, cli_end)
    imported = {f: None for _, f, n, k, _ in cli_events[: cli_end + 1] if n == "<module>" and k == "c"}
    return Walks(first, walk(calls, start, request), second, [f for f in imported if f not in first])


def report(walks: Walks, every: bool) -> None:
    def listing(files: dict[str, list[str]]) -> None:
        for number, (file, names) in enumerate(files.items(), 1):
            shown = names if every or len(names) <= SHOWN else [*names[:SHOWN], "…"]
            print(f"  {number:2d}. {file}: {', '.join(shown)}")

    shared = [f for f in walks.worker if f in walks.cli]
    first = {**walks.cli, **walks.worker}
    print(f"From `durable-agent run` to the model request: {len(first)} files")
    print(f"\nIn the CLI's process, until the workflow is started: {len(walks.cli)}")
    listing(walks.cli)
    print(f"(and {len(walks.cli_imported)} files imported on the way, none of their functions called)")
    if every:
        print(f"    {', '.join(walks.cli_imported)}")
    print(f"\nOn the worker, from the workflow's first task to the request: {len(walks.worker)}")
    print(f"({len(shared)} also in the CLI's: {', '.join(shared) or 'none'})")
    listing(walks.worker)
    print(f"\nFrom a tool's output to the export file: {len(walks.output)} files (after {TOOL_FILE})")
    listing(walks.output)
    new = [f for f in walks.output if f not in first]
    print(
        f"\nIn all: {len(first) + len(new) + 1} files: the first walk's {len(first)}, "
        f"{len(new)} new on the second ({', '.join(new) or 'none'}), and {TOOL_FILE}"
    )


# -- the run ----------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def wait_for(check: Callable[[], bool], what: str, seconds: float = 60.0) -> None:
    deadline = time.monotonic() + seconds
    while not check():
        if time.monotonic() > deadline:
            raise SystemExit(f"walk: {what} did not happen in {seconds:.0f} s")
        time.sleep(0.1)


def profile_run(tmp: Path, address: str) -> tuple[list[Event], list[Event]]:
    """The worker and ``durable-agent run`` profiled, each in its own process, on ``address``."""
    workspace = tmp / "workspace"
    workspace.mkdir(exist_ok=True)
    (workspace / "README.md").write_text("# A workspace\n\nIt holds one file.\n")
    script = tmp / "script.json"
    script.write_text(json.dumps(SCRIPT))
    config = tmp / "agent.toml"
    config.write_text(f'[providers.scripted]\nkind = "scripted"\nscript = {json.dumps(str(script))}\n')
    env = {
        **os.environ,
        "TEMPORAL_ADDRESS": address,
        "AGENT_CONFIG": str(config),
        "AGENT_TASK_QUEUE": f"walk-{uuid.uuid4().hex[:8]}",
    }
    me = [sys.executable, str(Path(__file__).resolve()), "--child"]
    log = tmp / "worker.log"
    with open(log, "wb") as out:
        worker = subprocess.Popen(
            [*me, "worker", str(tmp / "worker.json")], cwd=tmp, env=env, stdout=out, stderr=out
        )
    try:
        wait_for(
            lambda: worker.poll() is not None or b"worker polling task queue" in log.read_bytes(),
            "the worker's start",
        )
        if worker.poll() is not None:
            raise SystemExit(f"walk: the worker exited:\n{log.read_text()}")
        cli = subprocess.run(
            [*me, "cli", str(tmp / "cli.json"), "run", "--prompt", PROMPT, "--workspace", str(workspace)],
            cwd=tmp,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        if cli.returncode != 0:
            raise SystemExit(f"walk: the run failed ({cli.returncode}):\n{cli.stdout}{cli.stderr}")
    finally:
        worker.send_signal(signal.SIGTERM)
        try:
            worker.wait(60)
        except subprocess.TimeoutExpired:
            worker.kill()
            worker.wait()
    events = [json.loads((tmp / f"{role}.json").read_text()) for role in ("cli", "worker")]
    return [tuple(e) for e in events[0]], [tuple(e) for e in events[1]]


def query_handlers() -> set[str]:
    """The qualified names of ``AgentRun``'s query handlers."""
    from temporalio import workflow

    from durable_agent.workflows import AgentRun

    definition = workflow._Definition.from_class(AgentRun)
    assert definition is not None
    return {q.fn.__qualname__ for q in definition.queries.values() if q.fn is not None}


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--all", action="store_true", help="name every function first called in a file")
    parser.add_argument("--keep", metavar="DIR", help="run in DIR (kept: the profiles, logs, store)")
    parser.add_argument("--child", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        role, out, *rest = args.child
        child(role, Path(out), rest)
    with tempfile.TemporaryDirectory(prefix="walk-") as scratch:
        tmp = Path(args.keep).resolve() if args.keep else Path(scratch)
        tmp.mkdir(parents=True, exist_ok=True)
        address = os.environ.get("TEMPORAL_ADDRESS")
        server = None
        if not address:
            from durable_agent.devserver import start_dev_server

            port = free_port()
            server = start_dev_server(port=port, ui_port=free_port(), log_file=tmp / "devserver.log")
            address = f"127.0.0.1:{port}"
        try:
            cli_events, worker_events = profile_run(tmp, address)
        finally:
            if server is not None:
                from durable_agent.devserver import stop_dev_server

                stop_dev_server(server)
    report(analyse(cli_events, worker_events, query_handlers()), args.all)
    return 0


if __name__ == "__main__":
    sys.exit(main())
