"""The console's list of runs: a task queue's runs from Temporal's visibility, newest first, each
with what the list shows of it (summary, model, tokens and cost, whether it waits for a person).

Visibility gives the id, the times, Temporal's status and the run's own (``AgentRunStatus``); the
summary is the start's (``describe``), the model, tokens and cost are the ``status`` query's while
the run is open and its result's once it has ended. What an ended run shows never changes, so it
is read once and kept (``RowCache``); an open run's is read again each time, a few at once.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict
from temporalio.client import Client, WorkflowExecution, WorkflowExecutionStatus, WorkflowFailureError
from temporalio.service import RPCError

from durable_agent.client import RUN_STATUS_KEY, SESSION_ID_KEY, run_result
from durable_agent.core.run_api import (
    AWAITING_APPROVAL,
    AWAITING_PROMPT,
    QUERY_STATUS,
    WORKFLOW_TYPE,
    RunStatusView,
)

# The filters the list offers: Temporal's states, and the run's own waits.
StatusFilter = Literal[
    "", "running", "awaiting_approval", "awaiting_prompt", "completed", "failed", "cancelled"
]
STATUS_FILTERS: tuple[str, ...] = StatusFilter.__args__  # type: ignore[attr-defined]
_VISIBILITY = {
    "running": 'ExecutionStatus = "Running"',
    "awaiting_approval": f'ExecutionStatus = "Running" AND AgentRunStatus = "{AWAITING_APPROVAL}"',
    "awaiting_prompt": f'ExecutionStatus = "Running" AND AgentRunStatus = "{AWAITING_PROMPT}"',
    "completed": 'ExecutionStatus = "Completed"',
    "failed": 'ExecutionStatus IN ("Failed", "Terminated", "TimedOut")',
    "cancelled": 'ExecutionStatus = "Canceled"',
}
# An open run's status query waits this long at most: a run no worker holds must not stall the list.
QUERY_SECONDS = 3.0
# How many runs' details are read at once.
CONCURRENCY = 16
# A visibility query's value is quoted: this keeps a task queue's name from ending the quote.
_QUOTABLE = re.compile(r"^[\w.\-:/@]+$")


class RunRow(BaseModel):
    """One run as the console's list shows it."""

    model_config = ConfigDict(frozen=True)

    workflow_id: str
    run_id: str
    execution_status: str  # Temporal's: RUNNING, COMPLETED, FAILED, CANCELED, TERMINATED, …
    status: str  # the run's own (executing, awaiting_approval, …) or its end (completed, …)
    waiting_for_person: bool
    session_id: str | None = None
    summary: str | None = None
    model: str | None = None
    started_ms: int
    closed_ms: int | None = None
    total_tokens: int | None = None
    cost_usd: float | None = None
    pending_approvals: int = 0
    parent_workflow_id: str | None = None


class RowCache:
    """What an ended run shows, by workflow and run id: it never changes, so it is read once."""

    def __init__(self, limit: int = 5000) -> None:
        self._rows: dict[tuple[str, str], RunRow] = {}
        self._summaries: dict[tuple[str, str], tuple[str | None, str | None]] = {}
        self._limit = limit

    def row(self, key: tuple[str, str]) -> RunRow | None:
        """The ended run's row, if read before."""
        return self._rows.get(key)

    def keep(self, row: RunRow) -> None:
        """Keep an ended run's row (the oldest dropped beyond the limit)."""
        if len(self._rows) >= self._limit:
            self._rows.pop(next(iter(self._rows)))
        self._rows[(row.workflow_id, row.run_id)] = row

    def summary(self, key: tuple[str, str]) -> tuple[str | None, str | None] | None:
        """The run's summary and start model, if read before (None: not read)."""
        return self._summaries.get(key)

    def keep_summary(self, key: tuple[str, str], summary: str | None, model: str | None) -> None:
        """Keep a run's summary and start model (its start's: they never change)."""
        if len(self._summaries) >= self._limit:
            self._summaries.pop(next(iter(self._summaries)))
        self._summaries[key] = (summary, model)


def visibility_query(task_queue: str, status: str) -> str:
    """The visibility query of a task queue's agent runs, filtered by ``status``.

    Raises:
        ValueError: ``status`` is not one of ``STATUS_FILTERS``, or the queue's name has quotes.
    """
    if status not in STATUS_FILTERS:
        raise ValueError(f"status must be one of {', '.join(s for s in STATUS_FILTERS if s)}, not {status!r}")
    if not _QUOTABLE.match(task_queue):
        raise ValueError(f"task queue {task_queue!r} has characters a visibility query cannot quote")
    query = f'WorkflowType = "{WORKFLOW_TYPE}" AND TaskQueue = "{task_queue}"'
    if status:
        query += f" AND {_VISIBILITY[status]}"
    # newest first: visibility's own order (SQLite's visibility refuses an ORDER BY)
    return query


def _ms(when: dt.datetime | None) -> int | None:
    return int(when.timestamp() * 1000) if when is not None else None


def _model_of(details: str | None) -> str | None:
    """The model a run was started with, from its fixed details (``client.details_of``)."""
    found = re.search(r"\*\*model:\*\* (\S+)", details or "")
    return found.group(1) if found else None


async def _summary(client: Client, w: WorkflowExecution, cache: RowCache) -> tuple[str | None, str | None]:
    """The run's summary and the model it was started with (its start's fixed metadata)."""
    key = (w.id, w.run_id)
    known = cache.summary(key)
    if known is not None:
        return known
    try:
        desc = await client.get_workflow_handle(w.id, run_id=w.run_id).describe()
        summary = await desc.static_summary()
        details = await desc.static_details()
    except RPCError:
        return None, None
    cache.keep_summary(key, summary, _model_of(details))
    return summary, _model_of(details)


async def _row(client: Client, w: WorkflowExecution, cache: RowCache) -> RunRow:
    cached = cache.row((w.id, w.run_id))
    if cached is not None:
        return cached
    running = w.status == WorkflowExecutionStatus.RUNNING
    attrs = w.typed_search_attributes
    own = attrs.get(RUN_STATUS_KEY)
    summary, model = await _summary(client, w, cache)
    fields: dict[str, Any] = {
        "workflow_id": w.id,
        "run_id": w.run_id,
        "execution_status": w.status.name if w.status is not None else "UNKNOWN",
        "session_id": attrs.get(SESSION_ID_KEY),
        "summary": summary,
        "model": model,
        "started_ms": _ms(w.start_time) or 0,
        "closed_ms": _ms(w.close_time),
        "parent_workflow_id": w.parent_id,
    }
    if running:
        fields["status"] = own or "executing"
        view = await _status(client, w.id)
        if view is not None:
            fields.update(
                status=view.status,
                model=view.model or model,
                total_tokens=view.usage.total_tokens,
                cost_usd=view.cost_usd,
                pending_approvals=len(view.pending_approvals),
            )
        fields["waiting_for_person"] = fields["status"] in (AWAITING_APPROVAL, AWAITING_PROMPT)
        return RunRow(**fields)
    fields["status"] = (w.status.name.lower() if w.status is not None else "unknown").replace(
        "canceled", "cancelled"
    )
    fields["waiting_for_person"] = False
    if w.status in (WorkflowExecutionStatus.COMPLETED, WorkflowExecutionStatus.CANCELED):
        try:
            result = await asyncio.wait_for(run_result(client, w.id), QUERY_SECONDS)
            fields.update(
                status=result.status, total_tokens=result.usage.total_tokens, cost_usd=result.cost_usd
            )
        except (RPCError, WorkflowFailureError, TimeoutError):
            pass  # a run cancelled before it started, or no worker to answer its result query
    row = RunRow(**fields)
    cache.keep(row)
    return row


async def _status(client: Client, workflow_id: str) -> RunStatusView | None:
    try:
        view: RunStatusView = await asyncio.wait_for(
            client.get_workflow_handle(workflow_id).query(QUERY_STATUS, result_type=RunStatusView),
            QUERY_SECONDS,
        )
    except (RPCError, TimeoutError, Exception):  # no worker holds it now: the row says less
        return None
    return view


def _matches(row: RunRow, text: str) -> bool:
    words = text.lower().split()
    hay = " ".join(
        s for s in (row.workflow_id, row.session_id, row.summary, row.model, row.status) if s
    ).lower()
    return all(word in hay for word in words)


async def list_runs(
    client: Client,
    task_queue: str,
    *,
    status: str = "",
    text: str = "",
    limit: int = 50,
    scan: int = 1000,
    cache: RowCache | None = None,
) -> list[RunRow]:
    """A task queue's runs, newest first.

    Args:
        client: A client from ``connect``.
        task_queue: The queue the runs were started on.
        status: One of ``STATUS_FILTERS`` ("" for every run).
        text: Words every row shown must hold (in its id, session, summary, model or status).
        limit: The most rows returned.
        scan: The most runs read from visibility to find them.
        cache: Where ended runs' rows are kept between calls.

    Returns:
        The rows, newest first.

    Raises:
        ValueError: ``status`` is not a filter the list knows.
        temporalio.service.RPCError: Visibility cannot be read.
    """
    cache = cache if cache is not None else RowCache()
    listed = [w async for w in client.list_workflows(visibility_query(task_queue, status), limit=scan)]
    gate = asyncio.Semaphore(CONCURRENCY)

    async def one(w: WorkflowExecution) -> RunRow:
        async with gate:
            return await _row(client, w, cache)

    rows: list[RunRow] = []
    # in pages of ``limit``: a search reads the rows it needs, not every run listed
    for start in range(0, len(listed), max(limit, 1)):
        page = await asyncio.gather(*(one(w) for w in listed[start : start + limit]))
        rows.extend(r for r in page if not text or _matches(r, text))
        if len(rows) >= limit:
            break
    return rows[:limit]
