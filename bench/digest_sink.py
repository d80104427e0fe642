"""The bench's export sink: checks each export's digest, counts it, keeps only the last.

A run of N boundaries of 20 KB tool output exports N checkpoints of up to
N × 22 KB each: about 12 GB for N = 1,000. The filesystem sink would write all
of it; this one holds one export a run in memory.
"""

from __future__ import annotations

import asyncio
import hashlib
from dataclasses import dataclass

from durable_agent.activities.sinks import SinkError
from durable_agent.core.export import ExportDescriptor, SessionCheckpointExportV1


@dataclass
class RunExports:
    """What a run exported: how many exports, their content bytes, and the last one."""

    count: int = 0
    content_bytes: int = 0
    last: SessionCheckpointExportV1 | None = None


class DigestSink:
    """An ``ExportSink`` that verifies ``sha256(content)`` and forgets all but the last export."""

    def __init__(self) -> None:
        self.runs: dict[str, RunExports] = {}

    async def deliver(self, export: SessionCheckpointExportV1) -> None:
        d = export.descriptor
        content = export.content.encode("utf-8")
        digest = "sha256:" + await asyncio.to_thread(lambda: hashlib.sha256(content).hexdigest())
        if digest != d.content_digest:
            raise SinkError(
                f"turn {d.turn}: sha256 of the content is not {d.content_digest}", retryable=False
            )
        run = self.runs.setdefault(d.run_id, RunExports())
        if run.last is not None and run.last.descriptor.content_digest == d.content_digest:
            return  # a repeat delivery of the same export
        run.count += 1
        run.content_bytes += len(content)
        run.last = export

    async def fetch(self, descriptor: ExportDescriptor) -> SessionCheckpointExportV1 | None:
        """The export ``descriptor`` names, if it is the run's last (the only one kept)."""
        run = self.runs.get(descriptor.run_id)
        last = run.last if run is not None else None
        if last is None or last.descriptor.content_digest != descriptor.content_digest:
            return None
        return last

    def take(self, run_id: str) -> RunExports:
        """The run's exports, forgotten here."""
        return self.runs.pop(run_id, RunExports())
