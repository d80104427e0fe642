"""A tool boundary on the PostgreSQL store and sink, beside the filesystem ones, in one run.

Run it from the repository root:

    python bench/pg_cost.py                  # N = 200 boundaries, each a read of 20,000 bytes
    python bench/pg_cost.py --boundaries 50

It starts a Temporal dev server (unless ``TEMPORAL_ADDRESS`` is set) and a
PostgreSQL server from the distribution's programs (``tests/pg_server.py``;
``AGENT_TEST_PG_DSN`` names one instead), then runs the scripted run of
``bench/step_cost.py`` (N ``read`` calls of one 20,000-byte file, no context
window) once with the filesystem store and sink and once with the PostgreSQL
ones, on one in-process worker each. Per backend it prints:

* ``ms/b``: wall time from start to result over the boundaries;
* ``sink B/b``: what the sink holds after the run over the boundaries: the
  folder's bytes, or the PostgreSQL tables' (``pg_total_relation_size`` of
  ``agent_export`` and ``agent_export_part``: rows, indexes and TOAST);
* ``store B``: what the store holds after the run (the run's log is dropped
  when it ends; its record stays).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout

import asyncpg
from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter

from bench.reader_setup import SINK, prepare, reader_activities, reader_config, workspace_of
from bench.runs import settle
from durable_agent.client import connect, ensure_search_attributes, exit_process, start_run
from durable_agent.config import AgentConfig, PostgresSinkConfig, PostgresStoreConfig
from durable_agent.core.run_api import AgentRunInput
from durable_agent.devserver import start_dev_server, stop_dev_server
from durable_agent.worker import build_worker, connect_storage
from tests.pg_server import PG_DSN_ENV, LocalPostgres

DSN_ENV = "BENCH_PG_DSN"
SINK_TABLES = ("agent_export", "agent_export_part")
STORE_TABLES = ("agent_run_header", "agent_log_entry", "agent_staged_text", "agent_run_record")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def folder_bytes(root: Path) -> int:
    return sum(p.stat().st_size for p in root.rglob("*") if p.is_file()) if root.exists() else 0


async def table_bytes(dsn: str, tables: tuple[str, ...]) -> int:
    conn = await asyncpg.connect(dsn)
    try:
        total = 0
        for table in tables:
            total += int(await conn.fetchval("SELECT pg_total_relation_size($1::regclass)", table))
        return total
    finally:
        await conn.close()


def on_postgres(config: AgentConfig) -> AgentConfig:
    return config.model_copy(
        update={
            "store": PostgresStoreConfig(kind="postgres", dsn_env=DSN_ENV),
            "sinks": {SINK: PostgresSinkConfig(kind="postgres", dsn_env=DSN_ENV)},
        }
    )


async def measure(client: Client, base: Path, backend: str, n: int, dsn: str) -> dict[str, Any]:
    config = reader_config(base)
    if backend == "postgres":
        config = on_postgres(config)
    acts, _model = reader_activities(config)
    await connect_storage(acts)
    queue = f"pg-cost-{backend}-{uuid.uuid4().hex[:6]}"
    try:
        async with build_worker(client, acts, queue):
            run = AgentRunInput(prompt="warm up", workspace=str(workspace_of(base)), model="reader/n1")
            await settle(await start_run(client, run, queue=queue), 120)
            run = AgentRunInput(
                prompt=f"read data.txt {n} times",
                workspace=str(workspace_of(base)),
                model=f"reader/n{n}",
                max_tool_rounds=n + 1,
            )
            started = time.perf_counter()
            problem = await settle(await start_run(client, run, queue=queue), 120 + 2 * n)
            wall = time.perf_counter() - started
    finally:
        await acts.aclose()
    if backend == "postgres":
        sink, store = await table_bytes(dsn, SINK_TABLES), await table_bytes(dsn, STORE_TABLES)
    else:
        sink, store = folder_bytes(base / "exports"), folder_bytes(base / "store")
    return {
        "backend": backend,
        "outcome": problem or "ok",
        "ms_per_boundary": round(wall * 1000 / n),
        "sink_bytes_per_boundary": sink // n,
        "store_bytes": store,
    }


async def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--boundaries", type=int, default=200)
    parser.add_argument("--file-bytes", type=int, default=20_000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="pg-cost-") as tmp_name:
        tmp = Path(tmp_name)
        pg = None if os.environ.get(PG_DSN_ENV) else LocalPostgres()
        dsn = os.environ.get(PG_DSN_ENV) or (pg.dsn if pg else "")
        os.environ[DSN_ENV] = dsn
        server = None
        try:
            if os.environ.get("TEMPORAL_ADDRESS"):
                client = await connect()
            else:
                port = free_port()
                server = start_dev_server(port=port, ui_port=free_port(), log_file=tmp / "server.log")
                client = await Client.connect(f"127.0.0.1:{port}", data_converter=pydantic_data_converter)
            await ensure_search_attributes(client)
            rows = []
            for backend in ("filesystem", "postgres"):
                base = tmp / backend
                prepare(base, args.file_bytes)
                rows.append(await measure(client, base, backend, args.boundaries, dsn))
        finally:
            if server is not None:
                stop_dev_server(server)
            if pg is not None:
                pg.close()
    print(f"\nstore and sink: {args.boundaries} boundaries, a read of {args.file_bytes:,} bytes each")
    print(f"{'backend':<11} {'ms/b':>5} {'sink B/b':>9} {'store B':>9}  outcome")
    for r in rows:
        print(
            f"{r['backend']:<11} {r['ms_per_boundary']:>5} {r['sink_bytes_per_boundary']:>9,} "
            f"{r['store_bytes']:>9,}  {r['outcome']}"
        )
    return 0


if __name__ == "__main__":
    exit_process(asyncio.run(main()))
