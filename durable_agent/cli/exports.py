"""Export references on the command line, and ``durable-agent exports``.

An export is named by a file the filesystem sink wrote (a manifest, joined with
its parts), a portable file (``durable-agent pack``), or ``pg:SESSION/RUN/TURN``:
the export of that turn in a PostgreSQL sink of the worker's config (``--sink``,
default its ``default_sink``), reached with the DSN in the variable the sink's
``dsn_env`` names, as the worker does.
"""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path
from typing import Any

from durable_agent.cli.common import err
from durable_agent.config import ConfigError, FilesystemSinkConfig, PostgresSinkConfig, load_config
from durable_agent.core.errors import DurableAgentError
from durable_agent.core.export import ExportDescriptor, SessionCheckpointExportV1

PG_PREFIX = "pg:"


class ExportRefError(DurableAgentError, ValueError):
    """The reference names no export this command can read."""


def _sink(sink: str | None) -> tuple[str, Any]:
    config = load_config()
    name = sink or config.default_sink
    if name is None or name not in config.sinks:
        known = ", ".join(sorted(config.sinks)) or "none"
        raise ExportRefError(f"no sink {name!r} in the worker's config (sinks: {known})")
    return name, config.sinks[name]


def _pg_sink(sink: str | None) -> Any:
    from durable_agent.activities.pg_sink import PostgresExportSink
    from durable_agent.config import dsn_from_environment

    name, config = _sink(sink)
    if not isinstance(config, PostgresSinkConfig):
        raise ExportRefError(f"sink {name!r} is not a PostgreSQL sink (kind = {config.kind!r})")
    return PostgresExportSink(dsn_from_environment(f"[sinks.{name}]", config.dsn_env), name=name)


async def _fetch_pg(ref: str, sink: str | None) -> SessionCheckpointExportV1:
    session, _, rest = ref.removeprefix(PG_PREFIX).partition("/")
    run, _, turn = rest.partition("/")
    if not session or not run or not turn.isdigit():
        raise ExportRefError(f"{ref!r} is not pg:SESSION/RUN/TURN")
    db = _pg_sink(sink)
    try:
        found = [d for d in await db.series(session, run) if d.turn == int(turn)]
        if not found:
            raise ExportRefError(f"sink {db.name!r} holds no export of turn {turn} of run {run!r}")
        export = await db.fetch(found[-1])
        if export is None:
            raise ExportRefError(f"the export {found[-1].content_digest} went away while read")
        return export  # type: ignore[no-any-return]
    finally:
        await db.aclose()


def read_export_ref(ref: str, sink: str | None = None) -> SessionCheckpointExportV1:
    """The export ``ref`` names, whole (not yet validated: ``open()`` checks every digest)."""
    if ref.startswith(PG_PREFIX):
        try:
            return asyncio.run(_fetch_pg(ref, sink))
        except ConfigError as exc:
            raise ExportRefError(str(exc)) from None
    from durable_agent.activities.sink_files import read_export_file

    return read_export_file(Path(ref))


def cmd_exports(args: argparse.Namespace) -> int:
    """List a session's exports in a sink: ``pg:`` references, or the filesystem sink's files."""
    try:
        name, config = _sink(args.sink)
        if isinstance(config, FilesystemSinkConfig):
            rows = _files(config.path, args.session_id)
        else:
            rows = asyncio.run(_pg_rows(args.sink, args.session_id))
    except (ExportRefError, ConfigError, OSError) as exc:
        err(f"exports: {exc}")
        return 2
    if not rows:
        print(f"sink {name!r} holds no export of session {args.session_id!r}")
        return 1
    for where, d in rows:
        print(f"{where}  turn {d.turn}  {d.size_bytes:,} bytes  {d.content_digest}")
    return 0


def _files(root: Path, session_id: str) -> list[tuple[str, ExportDescriptor]]:
    import json

    from durable_agent.activities.store.session_store import safe_name

    rows = []
    for path in sorted((root / safe_name(session_id)).glob("*/turn-*.json")):
        descriptor = ExportDescriptor.model_validate(json.loads(path.read_text())["descriptor"])
        rows.append((str(path), descriptor))
    return rows


async def _pg_rows(sink: str | None, session_id: str) -> list[tuple[str, ExportDescriptor]]:
    db = _pg_sink(sink)
    try:
        series: list[ExportDescriptor] = await db.series(session_id)
    finally:
        await db.aclose()
    return [(f"{PG_PREFIX}{d.session_id}/{d.run_id}/{d.turn}", d) for d in series]
