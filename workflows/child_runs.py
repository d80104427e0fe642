"""The ``task`` tool: a call of it starts a child ``AgentRun`` and waits for its answer.

The child is a run of its own (a child workflow: its own run id, history, context and
export series) in the parent's session and workspace (a copy of its own for a child that may
change files of a parent whose workspace follows it: ``child_workspace``), started with the input a client
would send (``AgentRunInput``, with ``subagent`` saying who its parent is), so it is
resolved, run, exported and ended as any run is. Its final answer is the call's tool
result; a child that did not complete is a tool error the parent's model sees.

- Its workflow id comes from the parent's and the call's (``child_workflow_id``): a
  workflow task that runs again after its worker died, or a replay, finds the child it
  started; Temporal keeps the child running meanwhile, on any worker.
- ``parent_close_policy=REQUEST_CANCEL``: a parent that ends, however, cancels the children
  still running; a cancel of the parent (signal or Temporal request) cancels them at once
  and waits for them to end, as a cancel waits for a tool activity.
- What a child may do is at most what its parent may (``core/subagents.py``): its tools
  are the parent's (or fewer), its rules the parent's within the agent type's, its budgets
  what remains of the parent's (an equal part of it for each child started at once); its
  depth and the parent's count of children are bounded.
- Each child's ``subagent_start`` and ``subagent_end`` events are the parent's
  (``LoopState.record_subagent``): the end's carries the child's run id and its last
  export's digest, so the parent's exports link the child's series.

``task`` calls are offered as ``parallel``: the calls of one answer start their children at
once and wait for them together (``call_batch.py``), each boundary recorded in the
answer's order.
"""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

from temporalio import workflow
from temporalio.exceptions import CancelledError, ChildWorkflowError, FailureError

with workflow.unsafe.imports_passed_through():
    from pydantic import ValidationError

    from durable_agent.core.activity_api import ToolOutput
    from durable_agent.core.errors import validation_message
    from durable_agent.core.failures import failure_message
    from durable_agent.core.loop import LoopState
    from durable_agent.core.models import ToolUseBlock, WorkspaceChange, WorkspaceState
    from durable_agent.core.output_schema import FINAL_RESULT_TOOL
    from durable_agent.core.run_api import WORKFLOW_TYPE, AgentRunInput, AgentRunResult
    from durable_agent.core.run_workspace import RunWorkspace, TreeSource
    from durable_agent.core.subagents import (
        TASK,
        ChildRun,
        SubagentOrigin,
        SubagentPlan,
        TaskArgs,
        child_policy,
        child_workflow_id,
        task_answer,
    )

from durable_agent.workflows.calls import Cancellation, RunCancelled, now_ms
from durable_agent.workflows.display import RunDisplay, start_attributes
from durable_agent.workflows.workflow_metrics import invalid_tool_call
from durable_agent.workflows.workflow_tools import denied_in_workflow

SUMMARY_CHARS = 120


def child_input(state: LoopState, args: TaskArgs, call: ToolUseBlock, together: int = 1) -> AgentRunInput:
    """The input of the child a ``task`` call starts, as a client would send it.

    Args:
        state: The parent's state: its plan (tools, rules, budgets) and usage.
        args: The call's arguments.
        call: The call.
        together: The children its answer starts at once (this one among them), which share
            what remains of the parent's budgets.

    Returns:
        The child's input: the parent's session, workspace, sink and model (or the agent
        type's), its rules within the parent's, its tools the parent's (or the type's among
        them), its part of what remains of the parent's budgets, and who its parent is.
    """
    plan = state.plan
    subagents = plan.subagents
    assert subagents is not None
    kind = subagents.types.get(args.agent_type) if args.agent_type else None
    names = [o.definition.name for o in plan.tools if o.definition.name != FINAL_RESULT_TOOL]
    if kind is not None and kind.tools is not None:
        names = [name for name in names if name in kind.tools]
    workspace, shared = child_workspace(state, names)
    origin = SubagentOrigin(
        parent_run_id=plan.run_id,
        parent_workflow_id=workflow.info().workflow_id,
        call_id=call.id,
        depth=subagents.depth + 1,
        agent_type=args.agent_type,
        tools=tuple(names),
        tree=shared.tree if shared is not None else None,
        host=shared.host if shared is not None else None,
    )
    budgets: dict[str, Any] = {}
    for budget in state.budgets():
        # an equal part each: children running at once, each given all that is left, would
        # together spend that many times over before the parent could stop them
        left = (budget.limit - budget.used) / max(together, 1)
        if budget.budget == "tokens":
            budgets["max_total_tokens"] = max(int(left), 1)
        else:
            budgets["max_cost_usd"] = left
    return AgentRunInput(
        prompt=args.prompt,
        session_id=plan.session_id,
        workspace=workspace,
        model=(kind.model if kind is not None else None) or plan.model,
        permissions=child_policy(plan.permissions, kind.permissions if kind is not None else None),
        export_sink=plan.export_sink,
        max_tool_rounds=kind.max_tool_rounds if kind is not None else None,
        approval_timeout_seconds=plan.approval_timeout_seconds,
        subagent=origin,
        **budgets,
    )


def child_workspace(state: LoopState, tools: list[str]) -> tuple[str | TreeSource, RunWorkspace | None]:
    """Where a child offered ``tools`` works (docs/workspaces.md, Subagents).

    Args:
        state: The parent's state: its plan and its workspace's tree.
        tools: The child's tools, by name.

    Returns:
        The child's ``workspace`` input, and the parent's workspace when the child shares it:
        a parent whose workspace does not follow it shares its folder, as before; one that
        follows gives a child that may change files a copy of its own, made from the parent's
        tree (merged back when the parent records the call), and a child that only reads its own
        tree and host.
    """
    plan, parent = state.plan, state.workspace
    if not parent.follows or parent.tree is None:
        return plan.workspace, None
    offers = {o.definition.name: o for o in plan.tools}
    writes = any(
        not offers[name].read_only and not offers[name].in_workflow for name in tools if name in offers
    )
    if writes:
        return TreeSource(tree=parent.tree), None
    return plan.workspace, parent


class SubagentRunner:
    """Answers ``task`` calls with child runs (see the module docstring).

    Args:
        cancellation: The parent's cancel flag: a cancel cancels its children.
        display: The parent's details in the UI.
    """

    def __init__(self, cancellation: Cancellation, display: RunDisplay) -> None:
        self._cancellation = cancellation
        self._display = display
        self._starting = 0  # children being started now: they count against ``max_children``

    async def run(self, state: LoopState, call: ToolUseBlock, together: int = 1) -> ToolOutput:
        """Start the call's child, wait for it to end, and give its answer.

        Args:
            state: The parent's state.
            call: The ``task`` call.
            together: The children its answer starts at once, this one among them: they share
                what remains of the parent's budgets.

        Returns:
            The child's answer, or the tool error the parent's model is shown (the call is
                refused, the child could not start, or it did not complete).

        Raises:
            RunCancelled: The parent was cancelled; its child was cancelled first.
        """
        plan = state.plan
        denied = denied_in_workflow(state, call)
        if denied is not None:
            return denied
        try:
            args = TaskArgs.model_validate(call.input)
        except ValidationError as exc:
            invalid_tool_call(plan.tools, call.name)
            return ToolOutput(
                content=f"invalid arguments for {TASK!r}: {validation_message(exc)}", is_error=True
            )
        refusal = self._refusal(state, args)
        if refusal is not None:
            return ToolOutput(content=refusal, is_error=True)
        self._starting += 1
        try:
            return await self._child(state, call, args, together)
        finally:
            self._starting -= 1

    def _refusal(self, state: LoopState, args: TaskArgs) -> str | None:
        """Why the call may not start a child, if it may not."""
        subagents: SubagentPlan | None = state.plan.subagents
        if subagents is None or not subagents.may_start():
            return f"{TASK!r} cannot start a subagent here: this run is at the most depth subagents may reach"
        if args.agent_type is not None and args.agent_type not in subagents.types:
            known = ", ".join(sorted(subagents.types)) or "none (leave agent_type out)"
            return f"unknown agent_type {args.agent_type!r}; the kinds of subagent are: {known}"
        started = sum(1 for c in state.children if c.run_id is not None) + self._starting
        if started >= subagents.max_children:
            return (
                f"this run has started {started} subagents, the most it may ([agents] "
                f"max_children={subagents.max_children}): do the rest of the work here"
            )
        spent = next((b for b in state.budgets() if b.used >= b.limit), None)
        if spent is not None:
            return f"no budget is left for a subagent ({spent.budget}: {spent.used:g} of {spent.limit:g})"
        return None

    async def _child(self, state: LoopState, call: ToolUseBlock, args: TaskArgs, together: int) -> ToolOutput:
        plan = state.plan
        assert plan.subagents is not None
        workflow_id = child_workflow_id(workflow.info().workflow_id, state.tool_rounds, call.id)
        child = ChildRun(
            call_id=call.id, workflow_id=workflow_id, description=args.description, agent_type=args.agent_type
        )
        run_input = child_input(state, args, call, together)
        kind = f" ({args.agent_type})" if args.agent_type else ""
        try:
            handle = await workflow.start_child_workflow(
                WORKFLOW_TYPE,
                run_input.model_dump(mode="json", exclude_none=True),
                id=workflow_id,
                result_type=AgentRunResult,
                parent_close_policy=workflow.ParentClosePolicy.REQUEST_CANCEL,
                cancellation_type=workflow.ChildWorkflowCancellationType.WAIT_CANCELLATION_COMPLETED,
                task_timeout=timedelta(seconds=plan.timeouts.workflow_task_seconds),
                # listed by ``durable-agent runs`` from its start, with no upsert of its own
                search_attributes=start_attributes(plan.session_id),
                static_summary=_one_line(f"task{kind}: {args.description}"),
                static_details=f"**subagent of** `{workflow.info().workflow_id}` (call `{call.id}`)\n\n"
                f"**prompt:** {_one_line(args.prompt, 400)}",
            )
        except asyncio.CancelledError:
            self._cancellation.temporal_request()
            raise RunCancelled() from None
        except FailureError as exc:  # the start was refused (a workflow of that id is running)
            ended = child.model_copy(update={"status": "not_started", "error": failure_message(exc)})
            state.record_subagent(ended, now_ms())
            return ToolOutput(content=f"the subagent could not start: {ended.error}", is_error=True)
        child = child.model_copy(update={"run_id": handle.first_execution_run_id})
        state.record_subagent(child, now_ms())
        self._display.details(f"subagent `{workflow_id}` started: {args.description}", state)
        ended, answer, change = await self._end(state, child, handle)
        text, is_error = task_answer(ended, answer, self._limit(state))
        if change is None or not change.final:
            return ToolOutput(content=text, is_error=is_error)
        # the files as the child left them: a child in the parent's folder gives the parent its
        # tree; one that worked from the parent's tree (its base) has its change merged into the
        # parent's when the call is recorded (``child_merge.py``; docs/workspaces.md)
        return ToolOutput(
            content=text,
            is_error=is_error,
            workspace=WorkspaceState(tree=change.final),
            merge_base=change.base,
        )

    async def _end(
        self, state: LoopState, child: ChildRun, handle: workflow.ChildWorkflowHandle[Any, AgentRunResult]
    ) -> tuple[ChildRun, str, WorkspaceChange | None]:
        """The child as it ended, its end recorded, its final answer ("" when it has none), and
        what it did to its workspace (None: it gave no result).
        A cancel of the parent cancels the child and waits for it to end, then stops the parent."""
        cancellation = self._cancellation
        try:
            await workflow.wait_condition(lambda: handle.done() or cancellation.requested)
        except asyncio.CancelledError:
            cancellation.temporal_request()  # a Temporal cancel request of the parent
        if not handle.done():
            handle.cancel()
        try:
            result = await handle
        except (ChildWorkflowError, asyncio.CancelledError) as exc:
            # a child cancelled ends Canceled, one refused at its start fails: no result either way
            cancelled = (
                cancellation.requested
                or isinstance(exc, asyncio.CancelledError)
                or (isinstance(exc.cause, CancelledError) if isinstance(exc, ChildWorkflowError) else False)
            )
            status = "cancelled" if cancelled else "failed"
            ended = child.model_copy(update={"status": status, "error": failure_message(exc)})
            answer, change = "", None
        else:
            last = result.exports[-1].content_digest if result.exports else None
            ended = child.model_copy(
                update={
                    "status": result.status,
                    "error": result.error,
                    "final_content_digest": last,
                    "exports": len(result.exports),
                    "usage": result.usage,
                    "cost_usd": result.cost_usd,
                }
            )
            answer, change = result.text, result.workspace
        state.record_subagent(ended, now_ms())
        cancellation.check()
        return ended, answer, change

    @staticmethod
    def _limit(state: LoopState) -> int:
        subagents = state.plan.subagents
        assert subagents is not None
        return subagents.max_answer_chars


def _one_line(text: str, limit: int = SUMMARY_CHARS) -> str:
    line = " ".join(text.split())
    return line if len(line) <= limit else line[: limit - 1] + "…"
