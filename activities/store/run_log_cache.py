"""Runs' logs as the activities read them: from the session store, kept folded in memory.

A worker folds a run's log once and then applies each new entry as it is
saved, so a boundary costs what is new, not the whole conversation again.
Another worker (or this one after a restart) folds it from the store.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Sequence
from typing import TypeVar

from durable_agent.activities.store.session_store import SessionStore
from durable_agent.core.export import RunRecord
from durable_agent.core.export_parts import ExportEncoder
from durable_agent.core.models import Message
from durable_agent.core.run_log import LogEntry, LogRef, RunHeader, RunLog, StateMissing

# Runs whose folded log (and export encoding) a worker keeps: at most this many, and at most
# about this many bytes of encoded conversation (the objects take two to three times more).
# A run that falls out is folded again from the store: a cost of its whole length, once.
CACHED_RUNS = 256
CACHED_BYTES = 256 * 1024 * 1024

T = TypeVar("T")


class RunLogCache:
    """The session store's runs, with the newest folded logs cached."""

    def __init__(self, store: SessionStore, capacity: int = CACHED_RUNS, budget: int = CACHED_BYTES) -> None:
        self.store = store
        self.capacity = capacity
        self.budget = budget
        self._logs: OrderedDict[str, RunLog] = OrderedDict()
        self._headers: dict[str, RunHeader] = {}
        self._prior: dict[str, list[RunRecord]] = {}
        self._encoders: OrderedDict[str, ExportEncoder] = OrderedDict()
        # each run's messages with their images filled in, by the log's message object (see
        # ``filled``): an export hands its encoder the same objects at every boundary
        self._filled: dict[str, dict[int, tuple[Message, Message]]] = {}

    async def header(self, run_id: str) -> RunHeader:
        header = self._headers.get(run_id) or await self.store.load_header(run_id)
        if header is None:
            raise StateMissing(
                f"the store holds no header for run {run_id!r}", await self.store.log_head(run_id)
            )
        self._headers[run_id] = header
        return header

    async def save_header(self, header: RunHeader) -> None:
        await self.store.save_header(header)
        self._headers[header.run_id] = header

    async def prior_runs(self, header: RunHeader) -> list[RunRecord]:
        """The ended runs the header names, as the store holds them (an ended run does not change)."""
        prior = self._prior.get(header.run_id)
        if prior is None:
            wanted = set(header.prior_run_ids)
            records = await self.store.load_run_records(header.session_id) if wanted else []
            prior = self._prior[header.run_id] = [r for r in records if r.snapshot.id in wanted]
        return prior

    def filled(self, run_id: str) -> dict[int, tuple[Message, Message]]:
        """The run's memo of messages whose images were filled in: ``id(logged)`` to
        ``(logged, filled)`` (the logged message is kept, so its id is never reused)."""
        return self._filled.setdefault(run_id, {})

    def encoder(self, run_id: str) -> ExportEncoder:
        """The run's export encoder: the canonical bytes of what its last export here held."""
        encoder = self._encoders.pop(run_id, None) or ExportEncoder()
        self._encoders[run_id] = encoder
        self._evict()
        return encoder

    async def read(self, ref: LogRef) -> RunLog:
        """The run's log folded up to ``ref``; ``StateMissing`` when the store cannot give it."""
        log = self._logs.get(ref.run_id)
        if log is not None and log.version == ref.version and log.digest == ref.digest:
            self._logs.move_to_end(ref.run_id)
            return log
        if log is not None and log.version < ref.version:
            try:
                log.apply_all(await self.store.read_log(ref.run_id, log.version, ref.version))
            except StateMissing:
                log = None
        else:
            log = None
        if log is None:
            log = RunLog(ref.run_id)
            try:
                log.apply_all(await self.store.read_log(ref.run_id, 0, ref.version))
            except StateMissing:
                log = None
        if log is None or log.version != ref.version or log.digest != ref.digest:
            self._logs.pop(ref.run_id, None)
            raise StateMissing(
                f"the store does not hold version {ref.version} ({ref.digest[:19]}…) of run "
                f"{ref.run_id!r}'s log",
                await self.store.log_head(ref.run_id),
            )
        self._remember(log)
        return log

    async def append(self, run_id: str, entries: Sequence[LogEntry]) -> None:
        """Store ``entries``; the cached log follows when they extend it."""
        await self.store.append_log(run_id, entries)
        log = self._logs.get(run_id)
        if log is None or not entries:
            return
        first = entries[0]
        if first.delta.replace or first.version == log.version + 1:
            try:
                log.apply_all(entries)
                return
            except StateMissing:
                pass
        self._logs.pop(run_id, None)  # folded again from the store when next read

    async def append_while(
        self, run_id: str, entries: Sequence[LogEntry], work: Callable[[], Awaitable[T]]
    ) -> T:
        """``append``, with ``work`` run while the store writes: ``work`` reads the log with the
        entries already folded in (when this cache holds the log they extend; otherwise it runs
        after the write).

        A boundary builds its export this way: the store's fsynced write and the export's
        encoding and digests take about as long as each other, and the sink is handed the
        export only once this returns, so the store still holds a boundary before its sink does.

        Args:
            run_id: the run.
            entries: the entries to store, checked against their digests.
            work: what to run meanwhile.

        Returns:
            ``work``'s result, once the store holds the entries. A write that fails raises its
            error (the cache forgets the run, to fold it again from the store); ``work``'s
            result is then dropped.
        """
        log = self._logs.get(run_id)
        first = entries[0] if entries else None
        if log is None or first is None or not (first.delta.replace or first.version == log.version + 1):
            await self.append(run_id, entries)
            return await work()
        try:
            log.apply_all(entries)
        except StateMissing:
            self._logs.pop(run_id, None)  # half applied: folded again from the store
            await self.append(run_id, entries)
            return await work()
        write = asyncio.ensure_future(self.store.append_log(run_id, entries))
        try:
            result = await work()
        finally:
            # the store's outcome decides the cache, whatever became of the work; its failure
            # is the one raised
            try:
                await write
            except BaseException:
                self._logs.pop(run_id, None)
                raise
        return result

    def _remember(self, log: RunLog) -> None:
        self._logs[log.run_id] = log
        self._logs.move_to_end(log.run_id)
        self._evict()

    def _evict(self) -> None:
        """Forget the least recently used runs past the count or the bytes (the newest stays)."""
        while len(self._logs) > self.capacity or (len(self._logs) > 1 and self._bytes() > self.budget):
            run_id, _ = self._logs.popitem(last=False)
            self._encoders.pop(run_id, None)
            self._filled.pop(run_id, None)
        while len(self._encoders) > self.capacity:
            run_id, _ = self._encoders.popitem(last=False)
            self._filled.pop(run_id, None)

    def _bytes(self) -> int:
        return sum(e.size for e in self._encoders.values())

    async def drop(self, run_id: str) -> None:
        await self.store.drop_run(run_id)
        self._logs.pop(run_id, None)
        self._headers.pop(run_id, None)
        self._prior.pop(run_id, None)
        self._encoders.pop(run_id, None)
        self._filled.pop(run_id, None)
