"""The run's ``[hooks]`` (``durable_agent.core.hooks``), at the four moments they run at.

Each hook is one ``agent.hook`` activity (``activities/hook_call.py``), run through the run's
``CallRunner``: durable, retried by Temporal when its worker is lost, and stopped by a cancel.
Its outcome is a ``hook_run`` event, stamped with the activity's own completion time. What the
outcomes mean for the run:

- ``pre_tool_use``: a block keeps the call from running; the model gets a tool error with the
  reason (``before_tool``);
- ``post_tool_use``: a block's reason is added to the result the model sees (``after_tool``);
- ``user_prompt_submit``: a block refuses the prompt. The run's first prompt refused ends the
  run failed (``first_prompt``); a follow-up, a steer or a resumed run's prompt refused is
  dropped (``screen_queued`` names them; the loop takes the others), and a conversation with
  nothing new for the model waits for its next prompt again;
- ``stop``: recorded only, however the run ended (``stopped``).

A run without hooks (every run recorded before them) schedules nothing here and asks for no
patch: its history and exports are what they were. The loop (``agent_run.py``) does not call
in for such a run (``plan.hooks.empty``). A run with hooks asks for the ``run-hooks`` patch
before its first one.
"""

from __future__ import annotations

from typing import Any

from temporalio import workflow
from temporalio.exceptions import ActivityError

with workflow.unsafe.imports_passed_through():
    from durable_agent.core.activity_api import HOOK, ToolOutput, hook_call
    from durable_agent.core.events import ErrorEvent
    from durable_agent.core.failures import failure_message
    from durable_agent.core.hooks import (
        HookEventName,
        HookOutcome,
        block_reason,
        failed_outcome,
        hook_document,
        hook_event,
        hooks_for,
    )
    from durable_agent.core.loop import LoopState
    from durable_agent.core.models import ToolUseBlock, WorkspaceState
    from durable_agent.core.run_api import FinalStatus

from durable_agent.workflows.calls import CallRunner, RunFailed, now_ms
from durable_agent.workflows.hosting import on_host
from durable_agent.workflows.patches import HOOKS_PATCH


class HookRunner:
    """Runs the plan's hooks of a moment, records their outcomes, and applies their decision.

    Args:
        calls: The run's ``CallRunner``, through which each hook's activity runs.
    """

    def __init__(self, calls: CallRunner) -> None:
        self._calls = calls

    async def run(
        self,
        state: LoopState,
        event: HookEventName,
        *,
        tool_name: str | None = None,
        cancellable: bool = True,
        **fields: Any,
    ) -> list[HookOutcome]:
        """Run the hooks of ``event`` (those whose matcher takes ``tool_name``), one after another.

        Args:
            state: The run's state: its plan's hooks, and the journal their events go to.
            event: The moment.
            tool_name: The tool called, for the tool events.
            cancellable: Whether the run's cancel stops a hook (not for ``stop``: the run has ended).
            **fields: The rest of the document (``hook_document``'s keyword arguments).

        Returns:
            Each hook's outcome, in order; empty when no hook runs (nothing is scheduled then).

        Raises:
            RunCancelled: The run was cancelled while a hook ran (the hook is stopped).
        """
        plan = state.plan
        refs = hooks_for(plan.hooks, event, tool_name)
        # only a run with hooks asks: a run without has the history it had before hooks
        if not refs or not workflow.patched(HOOKS_PATCH):
            return []
        outcomes: list[HookOutcome] = []
        for ref in refs:
            document = hook_document(
                event,
                session_id=plan.session_id,
                run_id=plan.run_id,
                workspace=plan.workspace,
                tool_name=tool_name,
                **fields,
            )
            inp, timeouts = hook_call(plan, ref, event, document)
            if state.workspace.follows:  # it may change files: on the run's tree, recorded after
                where = {"expect_tree": state.workspace.tree, "host": state.workspace.host}
                inp = inp.model_copy(update={**where, "sink": plan.export_sink})
            named = f" {tool_name}" if tool_name else ""
            summary = f"hook {event}[{ref.index}]{named}"
            try:
                outcome = await self._calls.run(
                    HOOK, inp, summary=summary, timeouts=timeouts, cancellable=cancellable
                )
                if outcome.elsewhere:  # its worker does not hold the run's workspace: where it is
                    outcome = await on_host(
                        self._calls, HOOK, inp, plan=plan, summary=summary, timeouts=timeouts
                    )
            except ActivityError as exc:
                # every attempt failed (its worker lost each time, no sandbox there): recorded,
                # and the run goes on as if the hook had not run
                outcome = failed_outcome(failure_message(exc))
            at_ms = outcome.completed_at_ms or now_ms()
            hook_id = fields.get("tool_use_id") or f"{event}[{ref.index}]"
            state.hold_workspace(
                hook_id, f"hook:{event}", outcome.workspace, outcome.host, outcome.restored, at_ms
            )
            state.journal.emit(hook_event(inp, outcome), at_ms)
            outcomes.append(outcome)
        return outcomes

    async def before_tool(self, state: LoopState, call: ToolUseBlock) -> ToolOutput | None:
        """``pre_tool_use``, once the permissions allowed ``call``.

        Args:
            state: The run's state.
            call: The tool call about to run.

        Returns:
            None: the call runs. Otherwise the tool error the model gets instead of its result.
        """
        before = state.workspace.tree
        outcomes = await self._about_call(state, "pre_tool_use", call)
        reason = block_reason(outcomes)
        if reason is None:
            return None
        # the hook's activity fixes the boundary's time, as a tool's does; the files a hook changed
        # are in the call's ``tool_end``, as a tool's are
        return ToolOutput(
            content=f"a pre_tool_use hook refused this call: {reason}",
            is_error=True,
            completed_at_ms=_finished_at(outcomes),
            workspace=_changed(state, before),
        )

    async def after_tool(self, state: LoopState, call: ToolUseBlock, output: ToolOutput) -> ToolOutput:
        """``post_tool_use``, after ``call`` ran, with its result.

        Args:
            state: The run's state.
            call: The tool call that ran.
            output: What it returned (or the tool error its failure is to the model).

        Returns:
            The output the model sees: ``output``, with the reasons of the hooks that blocked
            added, and stamped with the last hook's completion time.
        """
        if state.workspace.follows:
            # the hooks run on the files the call left: the run holds them now (the call's
            # restore recorded here, before the hooks', as it happened), not at its boundary
            state.hold_workspace(call.id, call.name, output.workspace, output.host, output.restored, now_ms())
            output = output.model_copy(update={"restored": None, "host": None})
        before = state.workspace.tree
        outcomes = await self._about_call(
            state, "post_tool_use", call, output=output.content, is_error=output.is_error
        )
        if not outcomes:
            return output
        finished = _finished_at(outcomes)
        update: dict[str, Any] = {"completed_at_ms": finished} if finished is not None else {}
        if (changed := _changed(state, before)) is not None:
            update["workspace"] = changed  # the tree the hooks left, in the call's ``tool_end``
        reason = block_reason(outcomes)
        if reason is not None:
            # the store's staged copy is of the tool's own text: this one is saved whole
            update.update(content=f"{output.content}\n\na post_tool_use hook says: {reason}", staged=False)
        return output.model_copy(update=update)

    async def _about_call(
        self, state: LoopState, event: HookEventName, call: ToolUseBlock, **fields: Any
    ) -> list[HookOutcome]:
        """``run`` for a tool event: the call's tool, id and arguments in the document."""
        return await self.run(
            state, event, tool_name=call.name, tool_use_id=call.id, arguments=call.input, **fields
        )

    async def first_prompt(self, state: LoopState) -> None:
        """``user_prompt_submit`` for a new run's prompt, before its first model request.

        Args:
            state: The run's state, whose plan holds the prompt.

        Raises:
            RunFailed: A hook refused the prompt: the run ends failed with its reason.
        """
        outcomes = await self.run(state, "user_prompt_submit", prompt=state.plan.prompt)
        reason = block_reason(outcomes)
        if reason is not None:
            message = f"a user_prompt_submit hook refused the prompt: {reason}"
            state.journal.emit(ErrorEvent(message=message), now_ms())
            raise RunFailed(message)

    async def screen_queued(self, state: LoopState) -> list[int]:
        """``user_prompt_submit`` for each user message waiting (a follow-up, a steer, a resumed
        run's prompt), before they join the conversation.

        Args:
            state: The run's state.

        Returns:
            The places in the queue of the messages a hook refused: the loop drops them when it
            takes the queue (``LoopState.take_queued``).
        """
        refused: list[int] = []
        if hooks_for(state.plan.hooks, "user_prompt_submit"):
            checked = 0
            # a steer may come while a hook runs: it is checked too before anything is taken
            while checked < state.queued_count():
                message = state.queued_messages()[checked]
                checked += 1
                if message.kind == "output_retry":
                    continue  # the run's own request for a typed answer: no person submitted it
                outcomes = await self.run(state, "user_prompt_submit", prompt=message.text)
                if block_reason(outcomes) is not None:
                    refused.append(checked - 1)
        return refused

    async def stopped(self, state: LoopState, final: FinalStatus) -> None:
        """``stop``, once the run's ending is known and before it is recorded: the hooks' events
        precede the run's ``end`` in its record (the store's, the ``events`` query), not in an
        export: an export is one completed tool call's checkpoint (docs/tool-hooks.md). Recorded
        only.

        Args:
            state: The run's state (its last answer).
            final: How the run ended; ``budget_exhausted`` is ``failed`` to the hook, as in the
                run's exports.
        """
        status = "failed" if final == "budget_exhausted" else final
        # the run has ended: a cancel now is noted, and the hook runs to its end or time limit
        await self.run(state, "stop", cancellable=False, status=status, result=state.final_text or None)


def _changed(state: LoopState, before: str | None) -> WorkspaceState | None:
    """The run's tree, when hooks changed it since ``before``."""
    tree = state.workspace.tree
    return WorkspaceState(tree=tree) if tree is not None and tree != before else None


def _finished_at(outcomes: list[HookOutcome]) -> int | None:
    """When the last of the hooks finished (their activities fix the boundary's time); None if
    none says."""
    done = [o.completed_at_ms for o in outcomes if o.completed_at_ms is not None]
    return max(done) if done else None
