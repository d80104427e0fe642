"""The session store in memory: the smallest complete ``SessionStore``, for tests and embedding."""

from __future__ import annotations

from collections.abc import Sequence

from durable_agent.activities.store.session_store import follows, not_following
from durable_agent.core.export import RunRecord
from durable_agent.core.run_log import LogEntry, LogRef, RunHeader


class MemorySessionStore:
    """A store in memory, for tests and embedding."""

    def __init__(self) -> None:
        self.headers: dict[str, RunHeader] = {}
        self.logs: dict[str, dict[int, LogEntry]] = {}
        self.staged: dict[tuple[str, str], str] = {}
        self.runs: dict[str, dict[str, RunRecord]] = {}

    async def save_header(self, header: RunHeader) -> None:
        self.headers[header.run_id] = header

    async def load_header(self, run_id: str) -> RunHeader | None:
        return self.headers.get(run_id)

    async def append_log(self, run_id: str, entries: Sequence[LogEntry]) -> None:
        if not entries:
            return
        log = self.logs.setdefault(run_id, {})
        first = entries[0]
        if not follows(first, log.get(first.version - 1)):
            raise not_following(run_id, first, await self.log_head(run_id))
        for entry in entries:
            log[entry.version] = entry
        for version in [v for v in log if v > entries[-1].version]:
            del log[version]

    async def read_log(self, run_id: str, after: int, upto: int) -> list[LogEntry]:
        log = self.logs.get(run_id, {})
        return [log[v] for v in sorted(log) if after < v <= upto]

    async def log_head(self, run_id: str) -> LogRef | None:
        log = self.logs.get(run_id)
        return log[max(log)].ref(run_id) if log else None

    async def stage_text(self, run_id: str, digest: str, text: str) -> None:
        self.staged[(run_id, digest)] = text

    async def staged_text(self, run_id: str, digest: str) -> str | None:
        return self.staged.get((run_id, digest))

    async def drop_run(self, run_id: str) -> None:
        self.headers.pop(run_id, None)
        self.logs.pop(run_id, None)
        for key in [k for k in self.staged if k[0] == run_id]:
            del self.staged[key]

    async def save_run_record(self, record: RunRecord) -> None:
        self.runs.setdefault(record.snapshot.session_id, {})[record.snapshot.id] = record

    async def load_run_records(self, session_id: str) -> list[RunRecord]:
        records = self.runs.get(session_id, {}).values()
        return sorted(records, key=lambda r: (r.snapshot.created_at_ms, r.snapshot.id))
