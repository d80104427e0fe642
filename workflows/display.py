"""How an ``AgentRun`` shows itself outside: the UI's current details (with the counters
of the run's ``LoopState``, which ``AgentRun`` holds and hands in) and the search attributes
``AgentSessionId`` and ``AgentRunStatus`` (which ``durable-agent runs`` and ``approvals``
list runs by).

The details are not commands; each search attribute upsert is one, in the order
recorded histories hold them, so where the workflow calls these matters.
"""

from __future__ import annotations

from temporalio import workflow
from temporalio.common import SearchAttributeKey, SearchAttributePair, TypedSearchAttributes

with workflow.unsafe.imports_passed_through():
    from durable_agent.core.loop import LoopState
    from durable_agent.core.run_api import (
        AWAITING_APPROVAL,
        AWAITING_PROMPT,
        EXECUTING,
        SA_RUN_STATUS,
        SA_SESSION_ID,
    )
    from durable_agent.core.todo_list import checklist_markdown, summary

from durable_agent.workflows.calls import Cancellation

SESSION_ID_KEY = SearchAttributeKey.for_keyword(SA_SESSION_ID)
RUN_STATUS_KEY = SearchAttributeKey.for_keyword(SA_RUN_STATUS)


def start_attributes(session_id: str) -> TypedSearchAttributes:
    """The search attributes of a run under way in ``session_id``, as its start sets them: a
    run started with them does not upsert them (``RunDisplay.started``), an action Temporal
    Cloud bills."""
    return TypedSearchAttributes(
        [SearchAttributePair(SESSION_ID_KEY, session_id), SearchAttributePair(RUN_STATUS_KEY, EXECUTING)]
    )


class RunDisplay:
    """The run's current details and search attributes: what the UI and ``runs`` show of it."""

    def __init__(self, cancellation: Cancellation) -> None:
        self._cancellation = cancellation
        self._shown = EXECUTING  # the status search lists the run by

    def started(self, session_id: str, *, unless_set: bool = False) -> None:
        """A run (or an execution it continued as new into) is under way in ``session_id``.

        ``unless_set``: no upsert (a billed action on Temporal Cloud) when the execution started
        with these values already (``client.start_run`` sets them; continue-as-new carries them).
        Histories recorded before ``local-start-and-finish`` upserted them again.
        """
        wanted = [SESSION_ID_KEY.value_set(session_id), RUN_STATUS_KEY.value_set(EXECUTING)]
        given = workflow.info().typed_search_attributes
        if unless_set and all(given.get(update.key) == update.value for update in wanted):
            return
        workflow.upsert_search_attributes(wanted)

    def status(self, status: str) -> None:
        """The run's status as search lists it: executing, awaiting_approval, or how it ended."""
        self._shown = status
        workflow.upsert_search_attributes([RUN_STATUS_KEY.value_set(status)])

    def details(self, line: str, state: LoopState | None) -> None:
        """The UI's current details: what the run is doing now, and the counters and prompt
        of its ``state`` (``None`` before the run has one)."""
        prompt = (state.plan.prompt if state else "")[:200]
        head, _, rest = line.partition("\n\n")
        parts = [head if head.startswith("**") else f"**{head}**", *([rest] if rest else [])]
        if state is not None:
            view = state.status_view(
                self._cancellation.requested, awaiting_prompt=self._shown == AWAITING_PROMPT
            )
            # the status search lists the run by: a call waiting for a person shows as such
            status = AWAITING_APPROVAL if self._shown == AWAITING_APPROVAL else view.status
            parts.append(
                f"status: {status} · turn {view.turn} · tool calls {view.tool_calls} · "
                f"exports {view.exports_delivered} (failed {view.export_failures})"
            )
            # what the worker resolved, where the start's details could only say "the default"
            parts.append(f"model: {state.plan.model} · workspace: `{state.plan.workspace}`")
            if view.context_window:
                parts.append(
                    f"context: {view.context_tokens} of {view.context_window} tokens · "
                    f"compactions {view.compactions}"
                )
            if view.usage.total_tokens:
                cost = f" · cost ${view.cost_usd:.4f}" if view.cost_usd is not None else ""
                usage = view.usage
                parts.append(
                    f"tokens: {usage.total_tokens} · prompt {usage.prompt_tokens} "
                    f"(cache read {usage.cache_read_tokens}, write {usage.cache_write_tokens}){cost}"
                )
            if view.last_content_digest:
                parts.append(f"last export: `{view.last_content_digest}`")
            if state.todos:  # the model's plan (``todo_write``), as a checklist
                parts += [f"plan: {summary(state.todos)}", checklist_markdown(state.todos)]
            parts.append(f"prompt: {prompt}")
        workflow.set_current_details("\n\n".join(parts))
