"""The console's JSON API (``/api/``): what its page reads and does, and the same for
integrations (docs/console.md lists each route).

Every action goes through the update or signal the CLI sends (``approve``, ``prompt``, ``steer``,
``rewind``; ``cancel``, ``end``), with the client's helpers, and a run's refusal comes back as it
gave it (409, its message). The events stream is server-sent events from ``follow_run``: the
run's events, and between them the model's text so far (its activity's heartbeats).
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
from starlette.routing import Route
from temporalio.client import (
    Client,
    WorkflowExecutionStatus,
    WorkflowFailureError,
    WorkflowQueryFailedError,
    WorkflowUpdateFailedError,
)
from temporalio.service import RPCError, RPCStatusCode

from durable_agent.client import end_conversation, follow_run, resume_run, run_result, send_prompt, steer_run
from durable_agent.codec import ENCODING, CodecError
from durable_agent.console.files import FilesError, export_file, restore_ended, run_diff
from durable_agent.console.runs import RowCache, list_runs
from durable_agent.core.errors import validation_message
from durable_agent.core.events import CheckpointExportedEvent, EventRecord
from durable_agent.core.failures import failure_message
from durable_agent.core.models import LiveText
from durable_agent.core.run_api import (
    AWAITING_PROMPT,
    QUERY_EVENTS,
    QUERY_STATUS,
    SIGNAL_CANCEL,
    UPDATE_APPROVE,
    UPDATE_REWIND,
    AgentRunResult,
    ApprovalAnswer,
    ApprovalDecision,
    RewindAccepted,
    RewindRequest,
    RunStatusView,
    UserText,
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


def _error(status: int, message: str, **more: Any) -> JSONResponse:
    return JSONResponse({"error": message, **more}, status_code=status)


def guarded(handler: Handler) -> Handler:
    """Temporal's and the codec's errors as JSON answers a page can show, not a server error."""

    async def run(request: Request) -> Response:
        try:
            return await handler(request)
        except RPCError as exc:
            if exc.status == RPCStatusCode.NOT_FOUND:
                return _error(404, exc.message)
            return _error(502, f"Temporal: {exc.message}")
        except WorkflowQueryFailedError as exc:
            return _error(502, f"the run's query failed: {exc}")
        except TimeoutError:
            return _error(504, "no worker answered in time: is one running for this task queue?")
        except CodecError as exc:  # encrypted with a key this config does not hold
            return _error(500, f"{exc}: run the console with the config and key variables the workers use")
        except KeyError as exc:
            if ENCODING.decode() not in str(exc):
                raise
            return _error(
                500,
                "the run's payloads are encrypted ([codec] on the workers): start the console with "
                "AGENT_CONFIG set to a config with the same [codec] keys, and their variables",
            )
        except FilesError as exc:
            return _error(exc.status, str(exc))

    return run


async def _body(request: Request, model: type[M]) -> M | JSONResponse:
    raw = await request.body()
    if len(raw) > MAX_BODY_BYTES:
        return _error(413, f"the body is over {MAX_BODY_BYTES} bytes")
    try:
        return model.model_validate_json(raw or b"{}")
    except ValidationError as exc:
        return _error(400, f"invalid body: {validation_message(exc)}")


def _state(request: Request) -> ConsoleState:
    state: ConsoleState = request.app.state.console
    return state


def _client(request: Request) -> Client:
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
    s = _state(request)
    return JSONResponse(s.model_dump())


async def runs(request: Request) -> Response:
    """``GET /api/runs?status=&q=&limit=``: the task queue's runs, newest first."""
    q = request.query_params
    try:
        limit = min(max(int(q.get("limit", "50")), 1), 500)
        cache: RowCache = request.app.state.rows
        rows = await list_runs(
            _client(request),
            _state(request).task_queue,
            status=q.get("status", ""),
            text=q.get("q", ""),
            limit=limit,
            cache=cache,
        )
    except ValueError as exc:
        return _error(400, str(exc))
    return JSONResponse({"runs": [r.model_dump(mode="json") for r in rows]})


async def _status(client: Client, workflow_id: str) -> RunStatusView:
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
    client, wid = _client(request), request.path_params["workflow_id"]
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
        "temporal_ui": ui_link(_state(request), wid),
        "status": None,
        "result": None,
        "exports": [],
    }
    # both at once: each may be a replay of the run's whole history by a worker
    status, ended = await asyncio.gather(
        _status(client, wid),
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


async def events(request: Request) -> Response:
    """``GET /api/runs/{workflow_id}/events?after=N``: the run's events after sequence N."""
    client, wid, after = _client(request), request.path_params["workflow_id"], _after(request)
    desc = await client.get_workflow_handle(wid).describe()
    if desc.status == WorkflowExecutionStatus.RUNNING:
        records = await _events(client, wid, after)
    else:  # an ended run's events, read once
        key, ended = (wid, desc.run_id or ""), _ended(request)
        if key not in ended.events:
            ended.keep(ended.events, key, await _events(client, wid, 0))
        records = [r for r in ended.events[key] if r.sequence > after]
    return JSONResponse({"events": [r.model_dump(mode="json") for r in records]})


async def stream(request: Request) -> Response:
    """``GET /api/runs/{workflow_id}/events/stream?after=N``: the run's events as they happen
    (``event: event``, its id the sequence), the model's text while it streams (``event: live``),
    and ``event: closed`` once the run has ended (a browser reconnects after ``Last-Event-ID``)."""
    handle = _client(request).get_workflow_handle(request.path_params["workflow_id"])
    after = _after(request)

    async def items() -> AsyncIterator[ServerSentEvent]:
        async for item in follow_run(handle, after=after, poll_seconds=0.25):
            if isinstance(item, LiveText):
                yield ServerSentEvent(data=item.model_dump_json(), event="live")
            else:
                yield ServerSentEvent(data=item.model_dump_json(), event="event", id=str(item.sequence))
        yield ServerSentEvent(data="{}", event="closed")

    return EventSourceResponse(items(), ping=15)


def _refused(exc: WorkflowUpdateFailedError) -> JSONResponse:
    message = failure_message(exc)
    return _error(409, f"refused: {message}", refused=message)


async def approve(request: Request) -> Response:
    """``POST .../approve``: the ``approve`` update's own ``{"call_id", "approved", "reason"}``,
    bound to the waiting request (its step and arguments' digest) as ``durable-agent approve`` does."""
    body = await _body(request, ApprovalDecision)
    if isinstance(body, JSONResponse):
        return body
    client, wid = _client(request), request.path_params["workflow_id"]
    view = await _status(client, wid)
    pending = next((p for p in view.pending_approvals if p.call_id == body.call_id), None)
    if pending is not None and body.arguments_digest not in (None, pending.arguments_digest):
        return _error(
            409,
            f"call {body.call_id!r} has arguments {pending.arguments_digest} now, "
            f"not {body.arguments_digest}",
        )
    decision = body.model_copy(
        update={
            "step": pending.step if pending else body.step,
            "arguments_digest": pending.arguments_digest if pending else body.arguments_digest,
        }
    )
    try:
        answer = await client.get_workflow_handle(wid).execute_update(
            UPDATE_APPROVE, decision, result_type=ApprovalAnswer
        )
    except WorkflowUpdateFailedError as exc:
        return _refused(exc)
    return JSONResponse(answer.model_dump(mode="json"))


async def prompt(request: Request) -> Response:
    """``POST .../prompt`` ``{"text"}``: the next prompt of a run that waits for one."""
    return await _texted(request, send_prompt)


async def steer(request: Request) -> Response:
    """``POST .../steer`` ``{"text"}``: a message the working run's model sees at its next request."""
    return await _texted(request, steer_run)


async def _texted(request: Request, send: Callable[[Any, str], Awaitable[BaseModel]]) -> Response:
    body = await _body(request, UserText)
    if isinstance(body, JSONResponse):
        return body
    handle = _client(request).get_workflow_handle(request.path_params["workflow_id"])
    try:
        accepted = await send(handle, body.text)
    except WorkflowUpdateFailedError as exc:
        return _refused(exc)
    return JSONResponse(accepted.model_dump(mode="json"))


class CancelBody(BaseModel):
    """``POST .../cancel``'s body: an optional reason."""

    model_config = {"frozen": True, "extra": "forbid"}
    reason: str | None = None


async def cancel(request: Request) -> Response:
    """``POST .../cancel`` ``{"reason"}``: the ``cancel`` signal."""
    body = await _body(request, CancelBody)
    if isinstance(body, JSONResponse):
        return body
    handle = _client(request).get_workflow_handle(request.path_params["workflow_id"])
    await handle.signal(SIGNAL_CANCEL, args=[body.reason] if body.reason else [])
    return JSONResponse({"sent": "cancel"})


async def end(request: Request) -> Response:
    """``POST .../end``: the ``end`` signal (a conversation completes with its last answer)."""
    await end_conversation(_client(request).get_workflow_handle(request.path_params["workflow_id"]))
    return JSONResponse({"sent": "end"})


async def rewind(request: Request) -> Response:
    """``POST .../rewind`` ``{"turn", "prompt"}``: a run that waits for a prompt rewinds itself
    (update ``rewind``); an ended run's workspace is rebuilt on this machine and a new run goes on
    from that turn's export, as ``durable-agent rewind`` does."""
    body = await _body(request, RewindRequest)
    if isinstance(body, JSONResponse):
        return body
    client, wid = _client(request), request.path_params["workflow_id"]
    handle = client.get_workflow_handle(wid)
    if (await handle.describe()).status == WorkflowExecutionStatus.RUNNING:
        view = await _status(client, wid)
        if view.status != AWAITING_PROMPT:
            return _error(
                409,
                f"run {wid} is {view.status}: a run rewinds while it waits for its next prompt "
                "(end it or cancel it to rewind it as an ended run)",
            )
        try:
            accepted = await handle.execute_update(UPDATE_REWIND, body, result_type=RewindAccepted)
        except WorkflowUpdateFailedError as exc:
            return _refused(exc)
        files = f"workspace restored to tree {accepted.tree}" if accepted.tree else "files left as they were"
        return JSONResponse(
            {
                **accepted.model_dump(mode="json"),
                "workflow_id": wid,
                "outcome": f"rewound to turn {accepted.turn}: {files}",
            }
        )
    export, workspace, tree = await asyncio.to_thread(restore_ended, wid, body.turn)
    fields: dict[str, Any] = {"workspace": workspace, "prompt": body.prompt}
    new = await resume_run(
        client, export, queue=_state(request).task_queue, **{k: v for k, v in fields.items() if v}
    )
    return JSONResponse(
        {
            "turn": body.turn,
            "tree": tree,
            "workflow_id": new.id,
            "outcome": f"workspace {workspace} restored to turn {body.turn} (tree {tree}); "
            f"a new run {new.id} goes on from that export",
        }
    )


async def _ids(client: Client, wid: str) -> tuple[str, str]:
    """The session and run ids of the workflow's latest run."""
    desc = await client.get_workflow_handle(wid).describe()
    if desc.status == WorkflowExecutionStatus.RUNNING:
        view = await _status(client, wid)
        return view.session_id, view.run_id
    result = await asyncio.wait_for(run_result(client, wid), QUERY_SECONDS)
    return result.session_id, result.run_id


async def diff(request: Request) -> Response:
    """``GET /api/runs/{workflow_id}/diff?turn=N``: a boundary's change (no turn: the run's)."""
    raw = request.query_params.get("turn")
    if raw is not None and not raw.isdigit():
        return _error(400, f"turn must be a number, not {raw!r}")
    session, run_id = await _ids(_client(request), request.path_params["workflow_id"])
    view = await asyncio.to_thread(run_diff, session, run_id, int(raw) if raw else None, _state(request).sink)
    return JSONResponse(view.model_dump(mode="json"))


async def export(request: Request) -> Response:
    """``GET /api/runs/{workflow_id}/exports/{turn}``: the export of a turn, as a file."""
    session, run_id = await _ids(_client(request), request.path_params["workflow_id"])
    name, data = await asyncio.to_thread(
        export_file, session, run_id, int(request.path_params["turn"]), _state(request).sink
    )
    disposition = f'attachment; filename="{Path(name).name}"'
    return Response(data, media_type="application/json", headers={"content-disposition": disposition})


def routes() -> list[Route]:
    """The API's routes. A child run's workflow id holds ``/`` (``PARENT/task-STEP-CALL``): each
    route's id is a path, and the routes that end in a word come before the run's own."""
    prefix = "/api/runs/{workflow_id:path}"
    actions = (
        ("approve", approve),
        ("prompt", prompt),
        ("steer", steer),
        ("cancel", cancel),
        ("end", end),
        ("rewind", rewind),
    )
    return [
        Route("/api/info", guarded(info)),
        Route("/api/runs", guarded(runs)),
        Route(f"{prefix}/events/stream", guarded(stream)),
        Route(f"{prefix}/events", guarded(events)),
        Route(f"{prefix}/diff", guarded(diff)),
        Route(prefix + "/exports/{turn:int}", guarded(export)),
        *(Route(f"{prefix}/{name}", guarded(action), methods=["POST"]) for name, action in actions),
        Route(prefix, guarded(run)),
    ]


__all__ = ["ConsoleState", "EndedRuns", "routes", "ui_link"]
