"""``durable-agent gc``: remove a sink's exports older than its ``retain_days``, and the parts and
workspace objects only they needed (``activities/sink_gc/`` has the rules).

It reads the sinks of the worker's config (``AGENT_CONFIG``) and collects them from this machine:
a filesystem sink's folder must be here, a PostgreSQL sink is reached with the DSN in the
variable its ``dsn_env`` names, as the worker does. Workers may run meanwhile.
"""

from __future__ import annotations

import argparse
import asyncio
import json
from typing import TYPE_CHECKING

from durable_agent.cli.common import err, one_line
from durable_agent.config import AgentConfig, ConfigError, SinkConfig, load_config
from durable_agent.core.errors import DurableAgentError

if TYPE_CHECKING:
    from durable_agent.activities.sink_gc import GcReport


def _chosen(config: AgentConfig, name: str | None, days: float | None) -> list[tuple[str, SinkConfig, float]]:
    """The sinks to collect, each with its retention; a sink named that does not fit is an error.

    Raises:
        ConfigError: No such sink, or the sink named has no ``retain_days`` and none was given.
    """
    if name is not None:
        if name not in config.sinks:
            known = ", ".join(sorted(config.sinks)) or "none"
            raise ConfigError(f"no sink {name!r} in the worker's config (sinks: {known})")
        retain = days or config.sinks[name].retain_days
        if retain is None:
            raise ConfigError(
                f"sink {name!r} has no retain_days in the config (it keeps every export): "
                "give --retain-days N"
            )
        return [(name, config.sinks[name], retain)]
    chosen = []
    for sink_name, sink in sorted(config.sinks.items()):
        retain = days or sink.retain_days
        if retain is None:
            print(f"sink {sink_name!r}: no retain_days, every export kept")
        else:
            chosen.append((sink_name, sink, retain))
    return chosen


async def _collect(name: str, config: SinkConfig, retain: float, dry_run: bool) -> GcReport:
    from durable_agent.activities.agent import build_sink
    from durable_agent.activities.sink_gc import GcOptions, collect_sink

    sink = build_sink(name, config)
    try:
        return await collect_sink(name, sink, GcOptions(retain_days=retain, dry_run=dry_run))
    finally:
        close = getattr(sink, "aclose", None)  # a PostgreSQL sink's pool
        if close is not None:
            await close()


def cmd_gc(args: argparse.Namespace) -> int:
    """Collect the config's sinks (or ``--sink``'s), print what was removed and kept.

    Args:
        args: ``--sink``, ``--dry-run``, ``--retain-days``, ``--json``.

    Returns:
        0; 1 when a sink could not be collected; 2 for a config or sink name that does not fit.
    """
    from durable_agent.activities.sink_gc import GcError

    try:
        chosen = _chosen(load_config(), args.sink, args.retain_days)
    except ConfigError as exc:
        err(f"gc: {exc}")
        return 2
    reports: list[GcReport] = []
    failed = 0
    for name, config, retain in chosen:
        try:
            report = asyncio.run(_collect(name, config, retain, args.dry_run))
        # a database that refused, a folder not readable, a sink of a kind gc cannot collect
        except (DurableAgentError, OSError, GcError) as exc:
            failed += 1
            err(f"gc: sink {name!r}: {one_line(exc)}")
            continue
        reports.append(report)
        if not args.json:
            print(report.line())
            for problem in report.problems:
                print(f"  kept: {problem}")
    if args.json:
        print(json.dumps([report.model_dump(mode="json") for report in reports], indent=2))
    return 1 if failed else 0
