"""The console's actions (``POST /api/runs/{workflow_id}/...``): each through the update or signal
the CLI sends (``approve``, ``prompt``, ``steer``, ``rewind``; ``cancel``, ``end``), with the
client's helpers; a run's refusal comes back as it gave it (409, its message).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from pydantic import BaseModel
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from temporalio.client import WorkflowExecutionStatus, WorkflowUpdateFailedError

from durable_agent.client import cancel_run, end_conversation, resume_run, send_prompt, steer_run
from durable_agent.console.api import body_of, client_of, error, files_of, state_of, status_of
from durable_agent.core.failures import failure_message
from durable_agent.core.run_api import (
    AWAITING_PROMPT,
    UPDATE_APPROVE,
    UPDATE_REWIND,
    ApprovalAnswer,
    ApprovalDecision,
    RewindAccepted,
    RewindRequest,
    UserText,
)


def _refused(exc: WorkflowUpdateFailedError) -> JSONResponse:
    message = failure_message(exc)
    return error(409, f"refused: {message}", refused=message)


async def approve(request: Request) -> Response:
    """``POST .../approve``: the ``approve`` update's own ``{"call_id", "approved", "reason"}``,
    bound to the waiting request (its step and arguments' digest) as ``durable-agent approve`` does."""
    body = await body_of(request, ApprovalDecision)
    if isinstance(body, JSONResponse):
        return body
    client, wid = client_of(request), request.path_params["workflow_id"]
    view = await status_of(client, wid)
    pending = next((p for p in view.pending_approvals if p.call_id == body.call_id), None)
    if pending is not None and body.arguments_digest not in (None, pending.arguments_digest):
        return error(
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
    body = await body_of(request, UserText)
    if isinstance(body, JSONResponse):
        return body
    handle = client_of(request).get_workflow_handle(request.path_params["workflow_id"])
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
    body = await body_of(request, CancelBody)
    if isinstance(body, JSONResponse):
        return body
    handle = client_of(request).get_workflow_handle(request.path_params["workflow_id"])
    await cancel_run(handle, body.reason)
    return JSONResponse({"sent": "cancel"})


async def end(request: Request) -> Response:
    """``POST .../end``: the ``end`` signal (a conversation completes with its last answer)."""
    await end_conversation(client_of(request).get_workflow_handle(request.path_params["workflow_id"]))
    return JSONResponse({"sent": "end"})


async def rewind(request: Request) -> Response:
    """``POST .../rewind`` ``{"turn", "prompt"}``: a run that waits for a prompt rewinds itself
    (update ``rewind``); an ended run's workspace is rebuilt on this machine and a new run goes on
    from that turn's export, as ``durable-agent rewind`` does."""
    body = await body_of(request, RewindRequest)
    if isinstance(body, JSONResponse):
        return body
    client, wid = client_of(request), request.path_params["workflow_id"]
    handle = client.get_workflow_handle(wid)
    if (await handle.describe()).status == WorkflowExecutionStatus.RUNNING:
        view = await status_of(client, wid)
        if view.status != AWAITING_PROMPT:
            return error(
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
    export, workspace, tree = await asyncio.to_thread(files_of(request).restore_ended, wid, body.turn)
    fields: dict[str, Any] = {"workspace": workspace, "prompt": body.prompt}
    new = await resume_run(
        client, export, queue=state_of(request).task_queue, **{k: v for k, v in fields.items() if v}
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
