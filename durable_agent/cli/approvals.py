"""``durable-agent approvals | approve | deny``: the person's side of human approval.

The parser (``cli/commands.py``) imports this module only when one of these commands runs.
"""

from __future__ import annotations

import argparse
import datetime as dt

from temporalio.client import Client, WorkflowUpdateFailedError
from temporalio.service import RPCError

from durable_agent.cli.common import network
from durable_agent.client import connect
from durable_agent.core.failures import failure_message
from durable_agent.core.run_api import (
    AWAITING_APPROVAL,
    QUERY_STATUS,
    SA_RUN_STATUS,
    UPDATE_APPROVE,
    ApprovalAnswer,
    ApprovalDecision,
    PendingApproval,
    RunStatusView,
)


def _line(workflow_id: str, p: PendingApproval) -> str:
    since = dt.datetime.fromtimestamp(p.since_ms / 1000, tz=dt.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    target = f" {p.target}" if p.target else ""
    timeout = f", denied after {p.timeout_seconds:g} s" if p.timeout_seconds else ""
    return (
        f"{workflow_id}  {p.call_id}  {p.tool}{target}  {p.arguments}  "
        f"(step {p.step}, arguments {p.arguments_digest}, since {since}{timeout})"
    )


async def _pending(client: Client, workflow_id: str) -> tuple[PendingApproval, ...]:
    view: RunStatusView = await client.get_workflow_handle(workflow_id).query(
        QUERY_STATUS, result_type=RunStatusView
    )
    return view.pending_approvals


async def waiting_in_tree(
    client: Client, workflow_id: str, view: RunStatusView | None = None
) -> list[tuple[str, PendingApproval]]:
    """The calls waiting for a decision in a run and in its children, theirs and so on (a call
    a child's rules send to a person waits in the child's workflow: docs/subagents.md).

    Args:
        client: A connected client.
        workflow_id: The run at the top.
        view: Its ``status``, when the caller has it already.

    Returns:
        Each waiting call with the workflow id of the run it waits in (the one to approve it in),
        the run's own first, then its running children's in the order they started.
    """
    if view is None:
        view = await client.get_workflow_handle(workflow_id).query(QUERY_STATUS, result_type=RunStatusView)
    found = [(workflow_id, p) for p in view.pending_approvals]
    for child in view.children:
        if child.status != "running" or child.run_id is None:
            continue
        try:
            found += await waiting_in_tree(client, child.workflow_id)
        except RPCError:  # it ended meanwhile, or its history is gone: it waits for nothing
            continue
    return found


async def list_approvals(args: argparse.Namespace) -> int:
    """The calls waiting for a decision: of one run and its children, or of every run that
    waits (a child that waits is such a run)."""
    client = await connect()
    if args.workflow_id:
        waiting = await waiting_in_tree(client, args.workflow_id)
    else:
        query = f'{SA_RUN_STATUS} = "{AWAITING_APPROVAL}" AND ExecutionStatus = "Running"'
        ids = [w.id async for w in client.list_workflows(query)]
        waiting = [(wid, p) for wid in ids for p in await _pending(client, wid)]
    rows = [_line(wid, p) for wid, p in waiting]
    print("\n".join(rows) if rows else "no calls are waiting for approval")
    return 0


async def decide(args: argparse.Namespace) -> int:
    """Send the ``approve`` update; the run answers once the decision is recorded."""
    approved = args.command == "approve"
    client = await connect()
    # Bound to the request as it is now: a call that reuses the id later, or whose arguments
    # differ from what was shown, is not decided by this. A call of a child of the run named
    # goes to the child it waits in.
    waiting = [
        (wid, p) for wid, p in await waiting_in_tree(client, args.workflow_id) if p.call_id == args.call_id
    ]
    where, request = waiting[0] if waiting else (args.workflow_id, None)
    if len({wid for wid, _ in waiting}) > 1:
        runs = ", ".join(wid for wid, _ in waiting)
        print(
            f"durable-agent: {args.command}: call {args.call_id!r} waits in more than one run of the tree "
            f"({runs}): name the run it waits in; nothing was decided"
        )
        return 1
    handle = client.get_workflow_handle(where)
    if request is not None and args.digest is not None and args.digest != request.arguments_digest:
        print(
            f"durable-agent: {args.command}: call {args.call_id!r} has arguments "
            f"{request.arguments_digest} now, not {args.digest}; nothing was decided"
        )
        return 1
    # (no such request: the run's own answer says why, already decided or never asked)
    decision = ApprovalDecision(
        call_id=args.call_id,
        approved=approved,
        reason=args.reason,
        step=request.step if request else None,
        arguments_digest=request.arguments_digest if request else args.digest,
    )
    try:
        answer = await handle.execute_update(UPDATE_APPROVE, decision, result_type=ApprovalAnswer)
    except WorkflowUpdateFailedError as exc:
        print(f"durable-agent: {args.command}: {failure_message(exc)}")
        return 1
    verb = "approved" if answer.approved else "denied"
    bound = f" (step {request.step}, arguments {request.arguments_digest})" if request else ""
    print(f"{verb}: {answer.tool} call {answer.call_id}{bound} in {where}")
    return 0


cmd_approvals = network(list_approvals)
cmd_decide = network(decide)  # approve and deny
