"""One tool call of ``AgentRun``: its permission, a person's approval, and its tool activity.

``ToolStep.judge`` finds the tool and decides the call by the run's rules (allow, deny or
ask); ``ask`` waits, durably, for a person's decision on one call and ``ask_together`` on
several (the calls of one answer, asked at once: ``call_batch.py``); ``execute`` runs a
call that may run: its ``pre_tool_use`` hooks, the ``agent.tool_call`` activity (again,
with the person's leave, when a link leads to a path a rule asks about) and its
``post_tool_use`` hooks. ``execute`` is the one place every call that runs goes through,
whether it runs alone or with others of its answer. ``step`` is a call from end to end,
one at a time, as runs recorded before parallel calls took them.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from datetime import timedelta

from temporalio import workflow
from temporalio.exceptions import ActivityError

from durable_agent.workflows.approval_book import ApprovalBook, summarize_arguments

with workflow.unsafe.imports_passed_through():
    from durable_agent.core.activity_api import TOOL_CALL, ToolCallInput, ToolOutput
    from durable_agent.core.canonical import canonical_bytes, digest_of
    from durable_agent.core.events import (
        ConfirmationReceivedEvent,
        ConfirmationRequiredEvent,
        PermissionDeniedEvent,
    )
    from durable_agent.core.failures import failure_message
    from durable_agent.core.loop import LoopState
    from durable_agent.core.models import ToolUseBlock
    from durable_agent.core.permissions import COMMAND_TOOLS, Decision
    from durable_agent.core.run_api import AWAITING_APPROVAL, EXECUTING, ApprovalDecision, PendingApproval
    from durable_agent.core.run_log import STAGE_MIN_BYTES
    from durable_agent.core.subagents import TASK
    from durable_agent.core.tool_specs import ToolCallError, ToolOffer, find_offer, permission_targets

from durable_agent.workflows.calls import CallRunner, Cancellation, missing_state, now_ms, stamps_fixed
from durable_agent.workflows.child_merge import merged
from durable_agent.workflows.child_runs import SubagentRunner
from durable_agent.workflows.display import RunDisplay
from durable_agent.workflows.hook_runner import HookRunner
from durable_agent.workflows.hosting import on_host
from durable_agent.workflows.shell_gate import decide_targets
from durable_agent.workflows.workflow_metrics import (
    approval_decided,
    approval_requested,
    invalid_tool_call,
    tool_call_refused,
)
from durable_agent.workflows.workflow_tools import answer_in_workflow


def call_summary(call: ToolUseBlock, target: str | None) -> str:
    """A call as one line: its tool and what it touches."""
    return f"{call.name} {target}" if target else call.name


@dataclass(frozen=True)
class Verdict:
    """What the run's rules say of one call, before it runs.

    Attributes:
        call: the model's call.
        offer: the tool offered by that name (None: no such tool, or arguments it cannot take).
        decision: the rules' decision (``allow`` for a tool the workflow answers itself).
        target: what the call touches, as shown to a person.
        error: why the call cannot run at all (an unknown tool, arguments it cannot take).
    """

    call: ToolUseBlock
    offer: ToolOffer | None
    decision: Decision
    target: str | None = None
    error: str | None = None

    @property
    def in_workflow(self) -> bool:
        """A tool the workflow answers itself, without an activity (``workflow_tools.py``)."""
        return self.offer is not None and self.offer.in_workflow

    @property
    def child(self) -> bool:
        """A ``task`` call: the workflow answers it with a child run (``child_runs.py``), which runs
        beside the answer's other parallel calls as an activity would."""
        return self.in_workflow and self.call.name == TASK

    def denial(self) -> str:
        """The reason the model is given for a call the rules deny."""
        shown = call_summary(self.call, self.target)
        return f"permission denied: {shown} is not allowed by the run's permissions"


@dataclass
class ToolStep:
    """Judges, asks about and runs the run's tool calls (see the module docstring)."""

    _calls: CallRunner
    _cancellation: Cancellation
    _display: RunDisplay
    _approvals: ApprovalBook
    _hooks: HookRunner

    def __post_init__(self) -> None:
        self._subagents = SubagentRunner(self._cancellation, self._display)  # ``task`` calls: child runs

    async def merge_child(self, state: LoopState, output: ToolOutput) -> ToolOutput:
        """A ``task`` call's output as the parent records it: its child's change merged into the
        run's tree (``child_merge.py``); any other output as it is."""
        if output.merge_base is None:
            return output
        return await merged(self._calls, state, output)

    async def step(self, state: LoopState, call: ToolUseBlock) -> ToolOutput:
        """Run one call, or explain to the model why it did not run.

        Args:
            state: the run's state.
            call: the model's call.

        Returns:
            The tool's output, or the tool error the model is shown instead.
        """
        verdict = self.judge(state, call)
        if verdict.error is not None:
            return ToolOutput(content=verdict.error, is_error=True)
        if verdict.in_workflow:  # answered here, without an activity (``workflow_tools.py``)
            return await self.answer(state, verdict)
        reason: str | None = None
        if verdict.decision == "deny":
            reason = verdict.denial()
        elif verdict.decision == "ask":
            reason = await self.ask(state, call, verdict.target)
        if reason is not None:
            return self.refuse(state, verdict, reason)
        return await self.execute(state, call, verdict.target)

    def judge(self, state: LoopState, call: ToolUseBlock) -> Verdict:
        """Find the call's tool and decide the call by the run's rules; nothing runs yet.

        Args:
            state: the run's state, whose plan holds the tools and the rules.
            call: the model's call.

        Returns:
            The verdict: an error when the call cannot run at all.
        """
        plan = state.plan
        try:
            offer = find_offer(plan.tools, call.name)
            targets = permission_targets(offer, call.input, plan.workspace)
        except ToolCallError as exc:
            invalid_tool_call(plan.tools, call.name)
            return Verdict(call, None, "deny", error=str(exc))
        if offer.in_workflow:  # only its deny rules apply, when it is answered
            return Verdict(call, offer, "allow")
        decision, target = decide_targets(plan.permissions, call.name, targets)
        return Verdict(call, offer, decision, target)

    async def answer(self, state: LoopState, verdict: Verdict) -> ToolOutput:
        """A call of a tool the workflow answers itself: ``task`` with a child run, the others
        at once (``workflow_tools.py``)."""
        if verdict.child:
            return await self._subagents.run(state, verdict.call)
        return answer_in_workflow(state, verdict.call, self._display)

    async def run_allowed(self, state: LoopState, verdict: Verdict, children: int = 1) -> ToolOutput:
        """A call the rules (or a person) allowed, run with others of its answer: a ``task``
        call's child run (one of ``children`` started at once, which share the parent's
        budgets), or the call's activity (``execute``)."""
        if verdict.child:
            return await self._subagents.run(state, verdict.call, children)
        return await self.execute(state, verdict.call, verdict.target)

    def refuse(self, state: LoopState, verdict: Verdict, reason: str) -> ToolOutput:
        """A call refused, by the rules or by a person: its event, and the model's tool error."""
        call = verdict.call
        tool_call_refused(call.name, by_person=verdict.decision == "ask")
        state.journal.emit(PermissionDeniedEvent(id=call.id, name=call.name, reason=reason), now_ms())
        return ToolOutput(content=reason, is_error=True)

    async def execute(self, state: LoopState, call: ToolUseBlock, target: str | None) -> ToolOutput:
        """Run a call the rules (or a person) allowed: its hooks and its tool activity.

        Every call that runs goes through here, alone or with the other calls of its
        answer (``call_batch.py`` runs several at once).

        Args:
            state: the run's state.
            call: the model's call.
            target: what it touches, as the rules saw it.

        Returns:
            The output the model sees.
        """
        plan = state.plan
        summary = call_summary(call, target)
        hooked = not plan.hooks.empty  # a run without [hooks] does not call in (``hook_runner.py``)
        if hooked and (refused := await self._hooks.before_tool(state, call)) is not None:
            return refused  # a pre_tool_use hook blocked it: the tool does not run
        self._display.details(f"running `{summary}`", state)
        inline = ToolCallInput(
            run_id=plan.run_id,
            workspace=plan.workspace,
            permissions=None if call.name.lower() in COMMAND_TOOLS else plan.permissions,
            call_id=call.id,
            name=call.name,
            arguments=call.input,
            sink=plan.export_sink,  # where the workspace's tree goes (activities/workspace_tree.py)
            # a quick tool's call runs as a local activity (see ``ToolCallInput.recorded_after``),
            # where what this task stamped is fixed by the history: its boundary exports it
            recorded_after=(
                state.journal.stored if find_offer(plan.tools, call.name).local and stamps_fixed() else None
            ),
            # a run whose workspace follows it: the tree the call's worker restores its copy to first
            expect_tree=state.workspace.tree if state.workspace.follows else None,
            host=state.workspace.host if state.workspace.follows else None,
        )
        output = await self._call_tool(state, call, inline, summary)
        if output.permission == "ask" and output.resolved_target is not None:
            # The path leads, through a link, to one a rule asks about: ask about that path.
            resolved = output.resolved_target
            reason = await self.ask(state, call, f"{target} (resolves to {resolved})")
            if reason is None:
                approved = inline.model_copy(update={"approved_target": resolved})
                output = await self._call_tool(state, call, approved, summary)
            else:
                tool_call_refused(call.name, by_person=True)
                output = ToolOutput(content=reason, is_error=True, permission="denied")
        if output.permission is not None:
            # denied by the resolved path, or (its link changed meanwhile) still not approved
            content = (
                output.content if output.permission == "denied" else f"permission denied: {output.content}"
            )
            at_ms = output.completed_at_ms or now_ms()
            state.journal.emit(PermissionDeniedEvent(id=call.id, name=call.name, reason=content), at_ms)
            return ToolOutput(content=content, is_error=True, completed_at_ms=output.completed_at_ms)
        return await self._hooks.after_tool(state, call, output) if hooked else output

    async def _call_tool(
        self, state: LoopState, call: ToolUseBlock, inline: ToolCallInput, summary: str
    ) -> ToolOutput:
        """The tool activity's output, or the tool error a failed activity is to the model."""
        try:
            if state.step_message is not None and len(canonical_bytes(call.input)) >= STAGE_MIN_BYTES:
                # long arguments (a file to write) are in the model's message, which its activity staged
                by_ref = inline.model_copy(update={"arguments": {}, "arguments_in": state.step_message})
                return await self._run_tool(state, by_ref, summary, inline)
            return await self._run_tool(state, inline, summary)
        except ActivityError as exc:
            return ToolOutput(content=f"tool {call.name!r} failed: {failure_message(exc)}", is_error=True)

    async def _run_tool(
        self, state: LoopState, inp: ToolCallInput, summary: str, inline: ToolCallInput | None = None
    ) -> ToolOutput:
        """Run the tool call; with ``inline``, again with it should the staged arguments be missing."""
        try:
            output = await self._calls.run(
                TOOL_CALL,
                inp,
                summary=summary,
                timeouts=state.plan.timeouts,
                local=inp.recorded_after is not None,
            )
        except ActivityError as exc:
            if inline is None or not missing_state(exc)[0]:
                raise
            return await self._run_tool(state, inline, summary)
        if output.elsewhere:  # its worker does not hold the run's workspace: where it is
            routed = inp.model_copy(update={"recorded_after": None})
            return await on_host(self._calls, TOOL_CALL, routed, plan=state.plan, summary=summary)
        return output

    # --- a person's decision ---------------------------------------------------------

    async def ask(self, state: LoopState, call: ToolUseBlock, target: str | None) -> str | None:
        """Wait, durably, for a person's decision on one call.

        Args:
            state: the run's state.
            call: the call waiting.
            target: what it touches, as shown to the person.

        Returns:
            The denial's reason, or None when approved.
        """
        timeout = state.plan.approval_timeout_seconds
        request = self._request(state, call, target)
        self._display.status(AWAITING_APPROVAL)
        wid = workflow.info().workflow_id
        self._display.details(
            f"waiting for approval of `{call_summary(call, target)}` (call `{call.id}`, step "
            f"{request.step}, arguments `{request.arguments_digest}`)\n\n"
            f"decide with `durable-agent approve {wid} {call.id}` or `durable-agent deny {wid} {call.id}`",
            state,
        )
        timed_out = await self._wait([call.id], timeout, f"approval timeout for {call.id}")
        # not in a ``finally``: a worker evicting the run closes this coroutine, and no
        # workflow command may be made then
        decision = self._approvals.close(call.id)
        approval_decided(call.name, decision.approved if decision else None, timed_out=timed_out)
        self._display.status(EXECUTING)
        self._cancellation.check()
        return self._received(state, call, target, decision, timed_out)

    async def ask_together(
        self, state: LoopState, asks: list[tuple[ToolUseBlock, str | None]]
    ) -> list[str | None]:
        """Wait, durably, for a person's decision on each of several calls, asked at once.

        Every request is pending together (the ``status`` query lists them all); each is
        decided on its own, and the wait ends when all are decided, at the one approval
        timeout (the undecided ones are then denied) or at a cancel. Call ids must differ.

        Args:
            state: the run's state.
            asks: the calls, in the answer's order, and what each touches.

        Returns:
            For each call, in order, the denial's reason, or None when approved.
        """
        timeout = state.plan.approval_timeout_seconds
        requests = [self._request(state, call, target) for call, target in asks]
        self._display.status(AWAITING_APPROVAL)
        wid = workflow.info().workflow_id
        lines = [
            f"- `{call_summary(call, target)}` (call `{call.id}`, arguments `{request.arguments_digest}`)"
            for (call, target), request in zip(asks, requests, strict=True)
        ]
        self._display.details(
            f"waiting for approval of {len(asks)} calls of step {state.tool_rounds}:\n"
            + "\n".join(lines)
            + f"\n\ndecide each with `durable-agent approve {wid} CALL` or `durable-agent deny {wid} CALL`",
            state,
        )
        ids = [call.id for call, _ in asks]
        timed_out = await self._wait(ids, timeout, f"approval timeout for {', '.join(ids)}")
        decisions = [self._approvals.close(call_id) for call_id in ids]
        for (call, _), decision in zip(asks, decisions, strict=True):
            late = timed_out and decision is None
            approval_decided(call.name, decision.approved if decision else None, timed_out=late)
        self._display.status(EXECUTING)
        self._cancellation.check()
        return [
            self._received(state, call, target, decision, timed_out and decision is None)
            for (call, target), decision in zip(asks, decisions, strict=True)
        ]

    def _request(self, state: LoopState, call: ToolUseBlock, target: str | None) -> PendingApproval:
        """Put the call in the book of calls waiting, and record that it waits."""
        timeout = state.plan.approval_timeout_seconds
        request = PendingApproval(
            call_id=call.id,
            tool=call.name,
            target=target,
            arguments=summarize_arguments(call.input),
            since_ms=now_ms(),
            timeout_seconds=timeout,
            step=state.tool_rounds,
            arguments_digest=digest_of(call.input),
        )
        self._approvals.ask(request)
        approval_requested(call.name)
        state.journal.emit(
            ConfirmationRequiredEvent(
                id=call.id,
                name=call.name,
                target=target,
                arguments=request.arguments,
                timeout_seconds=timeout,
                step=request.step,
                arguments_digest=request.arguments_digest,
            ),
            now_ms(),
        )
        return request

    async def _wait(self, ids: list[str], timeout: float | None, summary: str) -> bool:
        """Wait until every call of ``ids`` is decided, the run is cancelled or ``timeout``
        passes; whether it passed."""
        try:
            await workflow.wait_condition(
                lambda: self._approvals.decided_all(ids) or self._cancellation.requested,
                timeout=timedelta(seconds=timeout) if timeout else None,
                timeout_summary=summary,
            )
        except TimeoutError:
            return True
        except asyncio.CancelledError:
            self._cancellation.temporal_request()
        return False

    def _received(
        self,
        state: LoopState,
        call: ToolUseBlock,
        target: str | None,
        decision: ApprovalDecision | None,
        timed_out: bool,
    ) -> str | None:
        """Record the person's decision (or its absence); the denial's reason, or None."""
        timeout = state.plan.approval_timeout_seconds
        approved = decision is not None and decision.approved
        given = decision.reason if decision else f"no decision within {timeout:g} s"
        state.journal.emit(
            ConfirmationReceivedEvent(
                id=call.id, name=call.name, approved=approved, reason=given, timed_out=timed_out
            ),
            now_ms(),
        )
        if approved:
            return None
        return f"permission denied: {call_summary(call, target)} was not approved" + (
            f": {given}" if given else ""
        )
