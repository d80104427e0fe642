"""Export references on the command line, and ``durable-agent verify | pack | exports``.

An export is named by a file the filesystem sink wrote (a manifest, joined with
its parts), a portable file (``durable-agent pack``), or ``pg:SESSION/RUN/TURN``:
the export of that turn in a PostgreSQL sink of the worker's config (``--sink``,
default its ``default_sink``), reached with the DSN in the variable the sink's
``dsn_env`` names, as the worker does.

The commands' options are declared with the parser (``cli/commands.py``), which imports this
module only when one of them (or ``resume``) runs.
"""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path
from typing import Any

from durable_agent.cli.common import err, one_line
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


def session_exports(sink: str | None, session_id: str) -> tuple[str, list[tuple[str, ExportDescriptor]]]:
    """A session's exports in a sink of the worker's config.

    Args:
        sink: The sink's name (None: the config's ``default_sink``).
        session_id: The session.

    Returns:
        The sink's name, and each export's reference (the filesystem sink's file, or
            ``pg:SESSION/RUN/TURN``) with its descriptor, each run's in turn order.

    Raises:
        ExportRefError: No such sink; ``ConfigError``, ``OSError``: it cannot be read.
    """
    name, config = _sink(sink)
    if isinstance(config, FilesystemSinkConfig):
        return name, _files(config.path, session_id)
    return name, asyncio.run(_pg_rows(sink, session_id))


def cmd_exports(args: argparse.Namespace) -> int:
    """List a session's exports in a sink: ``pg:`` references, or the filesystem sink's files."""
    try:
        name, rows = session_exports(args.sink, args.session_id)
    except (ExportRefError, ConfigError, OSError) as exc:
        err(f"exports: {exc}")
        return 2
    if not rows:
        print(f"sink {name!r} holds no export of session {args.session_id!r}")
        return 1
    for where, d in rows:
        print(f"{where}  turn {d.turn}  {d.size_bytes:,} bytes  {d.content_digest}")
    return 0


def cmd_verify(args: argparse.Namespace) -> int:
    """Check export files the filesystem sink wrote: every digest, the schema and the contract."""
    failed = 0
    for name in args.files:
        try:
            export = read_export_ref(name, args.sink)
            export.open()
        except (OSError, ValueError) as exc:  # ExportError and pydantic's ValidationError are ValueErrors
            failed += 1
            print(f"FAILED {name}: {one_line(exc)}")
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
        err(f"pack: {args.file}: {one_line(exc)}")
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


def _files(root: Path, session_id: str) -> list[tuple[str, ExportDescriptor]]:
    import json

    from durable_agent.activities.store.session_store import name_under

    rows = []
    for path in sorted((root / name_under(root, session_id)).glob("*/turn-*.json")):
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
