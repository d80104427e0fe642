"""A worker that dies right after its sink has stored one boundary's export, for
``tests/test_local_tool_calls.py``: ``python tests/dying_sink_worker.py TURN FILE``.

It runs as ``python worker.py`` does (``AGENT_CONFIG``, ``AGENT_TASK_QUEUE``), but its
filesystem sink, once it holds the export of turn ``TURN`` durably, appends a line to
``FILE`` (a file the run's ``read`` calls read, so that reading it again would give
something else) and sends itself SIGKILL: the boundary is exported, and the workflow task
that exported it never completes. It does so once (a ``.died`` file beside ``FILE`` says it
did), so a second worker on the same config finishes the run.

``python tests/dying_sink_worker.py TURN FILE SLOW_TURN SECONDS``: its sink also takes
``SECONDS`` to store turn ``SLOW_TURN``'s export, once: a local checkpoint that outlasts its
workflow task (the SDK completes the task and goes on in a new one after 80 % of its timeout).
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout

from durable_agent.activities import AgentActivities
from durable_agent.activities.sinks import FilesystemExportSink
from durable_agent.client import connect, exit_process, task_queue
from durable_agent.config import FilesystemSinkConfig, load_config
from durable_agent.core.export_parts import PartedExport
from durable_agent.worker import build_worker


class DyingSink(FilesystemExportSink):
    """The filesystem sink, which kills its process once it holds turn ``turn``'s export."""

    def __init__(self, root: Path, turn: int, changed: Path, slow: tuple[int, float] | None = None) -> None:
        super().__init__(root)
        self.turn = turn
        self.changed = changed
        self.died = changed.with_name(changed.name + ".died")
        self.slow = slow

    async def deliver_parts(self, export: PartedExport) -> None:
        if self.slow is not None and export.descriptor.turn == self.slow[0] and not self.died.exists():
            await asyncio.sleep(self.slow[1])
        await super().deliver_parts(export)
        if export.descriptor.turn == self.turn and not self.died.exists():
            self.died.write_text("died after the export\n")
            with self.changed.open("a") as out:
                out.write("written after the export\n")
            os.kill(os.getpid(), signal.SIGKILL)


async def main() -> int:
    turn, changed = int(sys.argv[1]), Path(sys.argv[2])
    slow = (int(sys.argv[3]), float(sys.argv[4])) if len(sys.argv) > 4 else None
    config = load_config()
    sinks = {}
    for name, sink in config.sinks.items():
        assert isinstance(sink, FilesystemSinkConfig), "a filesystem sink is expected"
        sinks[name] = DyingSink(Path(sink.path), turn, changed, slow)
    activities = AgentActivities(config, sinks=dict(sinks))
    client = await connect(config)
    async with build_worker(client, activities, task_queue()):
        print("worker ready", flush=True)
        await asyncio.Event().wait()
    return 0


if __name__ == "__main__":
    exit_process(asyncio.run(main()))
