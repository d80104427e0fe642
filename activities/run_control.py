"""``agent.request_cancel``: a run that the ``cancel`` signal ended asks Temporal to cancel it.

Temporal ends a workflow Canceled only after a cancel request, and refuses one that a
workflow aims at itself; the worker's client sends it instead.
"""

from __future__ import annotations

from temporalio import activity
from temporalio.service import RPCError, RPCStatusCode

from durable_agent.core.activity_api import REQUEST_CANCEL, RequestCancelInput


@activity.defn(name=REQUEST_CANCEL.name)
async def request_cancel(inp: RequestCancelInput) -> None:
    """Request the cancel of the execution ``inp`` names (this one only, not a later run of the id)."""
    handle = activity.client().get_workflow_handle(inp.workflow_id, run_id=inp.run_id)
    try:
        await handle.cancel(reason=inp.reason or "")
    except RPCError as exc:
        # already requested (a person's cancel crossed ours): what we asked for is there
        if exc.status != RPCStatusCode.ALREADY_EXISTS:
            raise
