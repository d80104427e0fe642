"""The dev server with its Prometheus metrics, and the counters a bench reads from them.

``durable_agent.devserver.start_dev_server`` takes no metrics port; ``start_metered_server``
starts the same server with one. The frontend counts what it bills in ``action`` (by
``action_type``: ``grpc_StartWorkflowExecution``, ``command_ScheduleActivityTask``,
``command_BatchMarkers``, ``grpc_RecordActivityTaskHeartbeat``, ... one per successful call or
command; server 1.32, ``common/rpc/interceptor/telemetry.go``) and every request it receives in
``service_requests`` (by ``operation``).
"""

from __future__ import annotations

import asyncio
import re
import subprocess
import time
import urllib.request
from collections import Counter
from pathlib import Path

from durable_agent.core.run_api import SA_RUN_STATUS, SA_SESSION_ID
from durable_agent.devserver import (
    DEV_SERVER_SETTINGS,
    DevServerError,
    is_reachable,
    stop_dev_server,
    temporal_binary,
)

# Prometheus text: a sample, its labels, its value
SAMPLE = re.compile(r"^(\w+)\{([^}]*)\} (\S+)$")
LABEL = re.compile(r'(\w+)="([^"]*)"')
HEARTBEAT_OPERATIONS = ("RecordActivityTaskHeartbeat", "RecordActivityTaskHeartbeatById")
HEARTBEAT_ACTIONS = tuple(f"grpc_{op}" for op in HEARTBEAT_OPERATIONS)


def server_counts(url: str | None, namespace: str) -> Counter[str] | None:
    """``counters`` of the server's metrics at ``url`` now (None: no metrics to read)."""
    if url is None:
        return None
    with urllib.request.urlopen(url, timeout=10) as response:
        return counters(response.read().decode(), namespace)


def counters(text: str, namespace: str) -> Counter[str]:
    """The counters a bench reads in the server's Prometheus text, for ``namespace``.

    Args:
        text: The metrics endpoint's page.
        namespace: The Temporal namespace whose counts are wanted.

    Returns:
        ``action:<type>``: the frontend's ``action`` counter by action type; ``heartbeats``:
        the ``RecordActivityTaskHeartbeat`` requests the frontend received
        (``service_requests``, failed ones too).
    """
    counts: Counter[str] = Counter()
    for line in text.splitlines():
        match = SAMPLE.match(line)
        if match is None:
            continue
        name, labels, value = match.group(1), dict(LABEL.findall(match.group(2))), float(match.group(3))
        if labels.get("namespace") != namespace:
            continue
        if name == "action":
            counts[f"action:{labels.get('action_type')}"] += int(value)
        elif (
            name == "service_requests"
            and labels.get("service_name") == "frontend"
            and labels.get("operation") in HEARTBEAT_OPERATIONS
        ):
            counts["heartbeats"] += int(value)
    return counts


async def settled_counts(url: str | None, namespace: str) -> Counter[str] | None:
    """``server_counts`` once two readings 1.5 s apart agree (at most 15 s): the server's
    endpoint shows a count late (readings 0.5 s apart agreed while a run's last actions were
    still missing)."""
    if url is None:
        return None
    last = await asyncio.to_thread(server_counts, url, namespace)
    for _ in range(10):
        await asyncio.sleep(1.5)
        now = await asyncio.to_thread(server_counts, url, namespace)
        if now == last:
            break
        last = now
    return last


def start_metered_server(port: int, metrics_port: int, log_file: Path) -> subprocess.Popen[bytes]:
    """``durable_agent.devserver.start_dev_server``'s server, with its metrics on ``metrics_port``."""
    args = [
        temporal_binary(), "server", "start-dev", "--headless",
        "--ip", "127.0.0.1", "--port", str(port), "--metrics-port", str(metrics_port),
        "--log-level", "warn",
        "--search-attribute", f"{SA_SESSION_ID}=Keyword",
        "--search-attribute", f"{SA_RUN_STATUS}=Keyword",
        *DEV_SERVER_SETTINGS,
    ]  # fmt: skip
    with open(log_file, "ab") as out:
        proc = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.monotonic() + 30
    while not is_reachable(f"127.0.0.1:{port}", timeout=0.5):
        if proc.poll() is not None or time.monotonic() > deadline:
            stop_dev_server(proc)
            raise DevServerError(f"the Temporal dev server did not start; see {log_file}")
        time.sleep(0.2)
    return proc
