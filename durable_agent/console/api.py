"""The console's JSON API (``/api/``), what it reads: the runs, a run, its events and their
stream, a diff, an export; the same for the page and for integrations (docs/console.md lists each
route; the actions are in ``actions.py``), and the helpers both share.

The events stream is server-sent events from ``follow_run``: the run's events, and between them
the model's text so far (its activity's heartbeats). Temporal's and the codec's errors become
JSON answers a page can show (``guarded``).
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError
from sse_starlette import EventSourceResponse, ServerSentEvent
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from temporalio.client import (
    Client,
    WorkflowExecutionStatus,
    WorkflowFailureError,
    WorkflowQueryFailedError,
)
from temporalio.service import RPCError, RPCStatusCode

from durable_agent.client import follow_run, run_result
from durable_agent.codec import ENCODING, CodecError
from durable_agent.console.files import FilesError, SinkFiles
from durable_agent.console.runs import RowCache, list_runs
from durable_agent.core.errors import validation_message
from durable_agent.core.events import CheckpointExportedEvent, EventRecord
from durable_agent.core.failures import failure_message
from durable_agent.core.models import LiveText
from durable_agent.core.run_api import (
    QUERY_EVENTS,
    QUERY_STATUS,
    AgentRunResult,
    RunStatusView,
)

M = TypeVar("M", bound=BaseModel)
Handler = Callable[[Request], Awaitable[Response]]
# A query of an ended run is answered by a worker that replays it: it may take a while, or never.
QUERY_SECONDS = 10.0
MAX_BODY_BYTES = 1_000_000


class ConsoleState(BaseModel):
    """What the API needs to know of where it runs (frozen: set once at start)."""

    model_config = {"frozen": True, "arbitrary_types_allowed": True}

    task_queue: str
    namespace: str
    temporal_ui: str
    codec: str  # what the page says of the payloads' encryption
    sink: str | None = None


def error(status: int, message: str, **more: Any) -> JSONResponse:
    return JSONResponse({"error": message, **more}, status_code=status)


def guarded(handler: Handler) -> Handler:
    """Temporal's and the codec's errors as JSON answers a page can show, not a server error."""

    async def run(request: Request) -> Response:
        try:
            return await handler(request)
        except RPCError as exc:
            if exc.status == RPCStatusCode.NOT_FOUND:
                return error(404, exc.message)
            return error(502, f"Temporal: {exc.message}")
        except WorkflowFailureError as exc:  # a run refused at its start has no result to read
            return error(409, f"the run ended without a result: {failure_message(exc)}")
        except WorkflowQueryFailedError as exc:
            return error(502, f"the run's query failed: {exc}")
        except TimeoutError:
            return error(504, "no worker answered in time: is one running for this task queue?")
        except CodecError as exc:  # encrypted with a key this config does not hold
            return error(500, f"{exc}: run the console with the config and key variables the workers use")
        except KeyError as exc:
            if ENCODING.decode() not in str(exc):
                raise
            return error(
                500,
                "the run's payloads are encrypted ([codec] on the workers): start the console with "
                "AGENT_CONFIG set to a config with the same [codec] keys, and their variables",
            )
        except FilesError as exc:
            return error(exc.status, str(exc))

    return run


async def body_of(request: Request, model: type[M]) -> M | JSONResponse:
    raw = await request.body()
    if len(raw) > MAX_BODY_BYTES:
        return error(413, f"the body is over {MAX_BODY_BYTES} bytes")
    try:
        return model.model_validate_json(raw or b"{}")
    except ValidationError as exc:
        return error(400, f"invalid body: {validation_message(exc)}")


def state_of(request: Request) -> ConsoleState:
    state: ConsoleState = request.app.state.console
    return state


def files_of(request: Request) -> SinkFiles:
    """What reads the runs' files from the sink (``create_app``'s ``files``)."""
    files: SinkFiles = request.app.state.files
    return files


def client_of(request: Request) -> Client:
    client: Client = request.app.state.client
    return client


def ui_link(state: ConsoleState, workflow_id: str) -> str:
    """The run in the Temporal UI."""
    from urllib.parse import quote

    return (
        f"{state.temporal_ui.rstrip('/')}/namespaces/{quote(state.namespace)}/workflows/{quote(workflow_id)}"
    )


async def info(request: Request) -> Response:
    """``GET /api/info``: where the console reads runs, and how it reads their payloads."""
    s = state_of(request)
    return JSONResponse(s.model_dump())


async def runs(request: Request) -> Response:
    """``GET /api/runs?status=&q=&limit=``: the task queue's runs, newest first."""
    q = request.query_params
    try:
        limit = min(max(int(q.get("limit", "50")), 1), 500)
        cache: RowCache = request.app.state.rows
        rows = await list_runs(
            client_of(request),
            state_of(request).task_queue,
            status=q.get("status", ""),
            text=q.get("q", ""),
            limit=limit,
            cache=cache,
        )
    except ValueError as exc:
        return error(400, str(exc))
    return JSONResponse({"runs": [r.model_dump(mode="json") for r in rows]})


async def status_of(client: Client, workflow_id: str) -> RunStatusView:
    view: RunStatusView = await asyncio.wait_for(
        client.get_workflow_handle(workflow_id).query(QUERY_STATUS, result_type=RunStatusView), QUERY_SECONDS
    )
    return view


class EndedRuns:
    """What an ended run's queries answered, kept: it never changes, and a worker answers a query
    of an ended run by replaying its whole history (a second or more for a long run).

    Args:
        limit: How many runs are kept (the oldest read dropped first).
    """

    def __init__(self, limit: int = 32) -> None:
        self.limit = limit
        self.views: OrderedDict[tuple[str, str], dict[str, Any]] = OrderedDict()
        self.events: OrderedDict[tuple[str, str], list[EventRecord]] = OrderedDict()

    def keep(self, table: OrderedDict[tuple[str, str], Any], key: tuple[str, str], value: Any) -> None:
        """Keep ``value`` under ``key`` in ``table``, within the limit."""
        table[key] = value
        while len(table) > self.limit:
            table.popitem(last=False)


def _ended(request: Request) -> EndedRuns:
    ended: EndedRuns = request.app.state.ended
    return ended


async def run(request: Request) -> Response:
    """``GET /api/runs/{workflow_id}``: status, pending approvals, todo, children, exports."""
    client, wid = client_of(request), request.path_params["workflow_id"]
    desc = await client.get_workflow_handle(wid).describe()
    running = desc.status == WorkflowExecutionStatus.RUNNING
    key = (wid, desc.run_id or "")
    if not running and key in _ended(request).views:
        return JSONResponse(_ended(request).views[key])
    out: dict[str, Any] = {
        "workflow_id": wid,
        "run_id": desc.run_id,
        "execution_status": desc.status.name if desc.status else "UNKNOWN",
        "running": running,
        "summary": await desc.static_summary(),
        "parent_workflow_id": desc.parent_id,
        "temporal_ui": ui_link(state_of(request), wid),
        "status": None,
        "result": None,
        "exports": [],
    }
    # both at once: each may be a replay of the run's whole history by a worker
    status, ended = await asyncio.gather(
        status_of(client, wid),
        asyncio.wait_for(run_result(client, wid), QUERY_SECONDS) if not running else _events(client, wid, 0),
        return_exceptions=True,
    )
    if isinstance(status, RunStatusView):
        out["status"] = status.model_dump(mode="json")
    elif isinstance(status, (RPCError, WorkflowQueryFailedError, TimeoutError)):
        out["status_error"] = f"no status: {status or type(status).__name__}"
    elif isinstance(status, BaseException):
        raise status
    if isinstance(ended, AgentRunResult):
        out["result"] = ended.model_dump(mode="json")
        out["exports"] = [e.model_dump(mode="json") for e in ended.exports]
    elif isinstance(ended, list):
        out["exports"] = [
            {"turn": r.event.turn, "content_digest": r.event.content_digest}
            for r in ended
            if isinstance(r.event, CheckpointExportedEvent)
        ]
    elif isinstance(ended, WorkflowFailureError):
        out["failure"] = failure_message(ended)
    elif isinstance(ended, (RPCError, TimeoutError, WorkflowQueryFailedError)):
        out["failure"] = f"no result: {ended or type(ended).__name__}"
    elif isinstance(ended, BaseException):
        raise ended
    if not running and out["status"] is not None and out["result"] is not None:
        _ended(request).keep(_ended(request).views, key, out)
    return JSONResponse(out)


async def _events(client: Client, workflow_id: str, after: int) -> list[EventRecord]:
    records: list[EventRecord] = await asyncio.wait_for(
        client.get_workflow_handle(workflow_id).query(QUERY_EVENTS, after, result_type=list[EventRecord]),
        QUERY_SECONDS,
    )
    return records


def _after(request: Request) -> int:
    raw = request.headers.get("last-event-id") or request.query_params.get("after", "0")
    return int(raw) if raw.isdigit() else 0


async def _older(request: Request, wid: str, held: list[EventRecord], after: int) -> list[EventRecord]:
    """The events a run no longer holds itself (it continued as new: it keeps its newest), from
    its newest export in the sink; none when the sink cannot give them."""
    if not held or held[0].sequence <= after + 1:
        return []
    try:
        session, run_id = await _ids(client_of(request), wid)
        exported = await asyncio.to_thread(files_of(request).export_events, session, run_id)
    except (FilesError, RPCError, WorkflowFailureError, WorkflowQueryFailedError, TimeoutError):
        return []
    return [r for r in exported if after < r.sequence < held[0].sequence]


async def events(request: Request) -> Response:
    """``GET /api/runs/{workflow_id}/events?after=N``: the run's events after sequence N (those a
    run that continued as new no longer holds, from its newest export in the sink)."""
    client, wid, after = client_of(request), request.path_params["workflow_id"], _after(request)
    desc = await client.get_workflow_handle(wid).describe()
    if desc.status == WorkflowExecutionStatus.RUNNING:
        records = await _events(client, wid, after)
        records = [*await _older(request, wid, records, after), *records]
    else:  # an ended run's events, read once
        key, ended = (wid, desc.run_id or ""), _ended(request)
        if key not in ended.events:
            held = await _events(client, wid, 0)
            ended.keep(ended.events, key, [*await _older(request, wid, held, 0), *held])
        records = [r for r in ended.events[key] if r.sequence > after]
    return JSONResponse({"events": [r.model_dump(mode="json") for r in records]})


async def stream(request: Request) -> Response:
    """``GET /api/runs/{workflow_id}/events/stream?after=N``: the run's events as they happen
    (``event: event``, its id the sequence), the model's text while it streams (``event: live``),
    and ``event: closed`` once the run has ended (a browser reconnects after ``Last-Event-ID``)."""
    handle = client_of(request).get_workflow_handle(request.path_params["workflow_id"])
    after = _after(request)

    async def items() -> AsyncIterator[ServerSentEvent]:
        async for item in follow_run(handle, after=after, poll_seconds=0.25):
            if isinstance(item, LiveText):
                yield ServerSentEvent(data=item.model_dump_json(), event="live")
            else:
                yield ServerSentEvent(data=item.model_dump_json(), event="event", id=str(item.sequence))
        yield ServerSentEvent(data="{}", event="closed")

    return EventSourceResponse(items(), ping=15)


async def _ids(client: Client, wid: str) -> tuple[str, str]:
    """The session and run ids of the workflow's latest run."""
    desc = await client.get_workflow_handle(wid).describe()
    if desc.status == WorkflowExecutionStatus.RUNNING:
        view = await status_of(client, wid)
        return view.session_id, view.run_id
    result = await asyncio.wait_for(run_result(client, wid), QUERY_SECONDS)
    return result.session_id, result.run_id


async def diff(request: Request) -> Response:
    """``GET /api/runs/{workflow_id}/diff?turn=N``: a boundary's change (no turn: the run's)."""
    raw = request.query_params.get("turn")
    if raw is not None and not raw.isdigit():
        return error(400, f"turn must be a number, not {raw!r}")
    session, run_id = await _ids(client_of(request), request.path_params["workflow_id"])
    view = await asyncio.to_thread(files_of(request).run_diff, session, run_id, int(raw) if raw else None)
    return JSONResponse(view.model_dump(mode="json"))


async def export(request: Request) -> Response:
    """``GET /api/runs/{workflow_id}/exports/{turn}``: the export of a turn, as a file."""
    session, run_id = await _ids(client_of(request), request.path_params["workflow_id"])
    turn = int(request.path_params["turn"])
    name, data = await asyncio.to_thread(files_of(request).export_file, session, run_id, turn)
    disposition = f'attachment; filename="{Path(name).name}"'
    return Response(data, media_type="application/json", headers={"content-disposition": disposition})
