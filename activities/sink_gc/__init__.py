"""``durable-agent gc``: old exports removed from a sink with a retention, and the parts and
workspace objects only they needed (docs/exports.md, "Collecting old exports").

``rules.py`` holds the options, the report and the steps both sinks share; ``refs.py`` what an
export needs; ``filesystem.py`` and ``postgres.py`` each sink's side. ``collect_sink`` picks one.

Internal: the public API is ``durable_agent.__all__`` (import its names from ``durable_agent``);
this package may change between releases.
"""

from __future__ import annotations

from durable_agent.activities.sink_gc.rules import GcError, GcOptions, GcReport
from durable_agent.activities.sinks import ExportSink, FilesystemExportSink

__all__ = ["GcError", "GcOptions", "GcReport", "collect_sink"]


async def collect_sink(name: str, sink: ExportSink, options: GcOptions) -> GcReport:
    """Collect ``sink`` (see the module's docstring).

    Args:
        name: The sink's name in the config (for the report).
        sink: A filesystem or PostgreSQL export sink.
        options: The retention, the grace period, whether to remove anything.

    Returns:
        What was removed and kept.

    Raises:
        GcError: The sink is of a kind gc cannot collect.
        SinkError: The sink cannot be read or written (PostgreSQL).
    """
    if isinstance(sink, FilesystemExportSink):
        from durable_agent.activities.sink_gc.filesystem import collect_filesystem

        return await collect_filesystem(name, sink, options)
    from durable_agent.activities.pg_sink import PostgresExportSink

    if isinstance(sink, PostgresExportSink):
        from durable_agent.activities.sink_gc.postgres import collect_postgres

        return await collect_postgres(sink, options)
    raise GcError(
        f"sink {name!r} is a {type(sink).__name__}: gc collects filesystem and PostgreSQL sinks only"
    )
