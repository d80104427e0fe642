"""The tools ``AgentRun`` answers itself, without an activity (``ToolSpec.in_workflow``).

Such a tool changes nothing outside the run, so its answer is a pure function of the
call (``durable_agent.core.todo_list``), made in workflow code: no worker runs it and no
command is added to the history for it. The call still has its ``tool_start`` and
``tool_end`` events, its tool result and its tool boundary (``AgentRun._run_calls``).

Only the deny rules apply to it (``tool_specs.in_workflow_policy``): a deny rule that
matches refuses the call as any denial does; ``default`` and the ask rules do not, so no
person is asked about a plan.
"""

from __future__ import annotations

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from durable_agent.core.activity_api import ToolOutput
    from durable_agent.core.events import PermissionDeniedEvent
    from durable_agent.core.loop import LoopState
    from durable_agent.core.models import ToolUseBlock
    from durable_agent.core.todo_list import TODO_WRITE, answer_todo_write, summary
    from durable_agent.core.tool_specs import in_workflow_policy

from durable_agent.workflows.calls import now_ms
from durable_agent.workflows.display import RunDisplay
from durable_agent.workflows.workflow_metrics import invalid_tool_call, tool_call_refused


def denied_in_workflow(state: LoopState, call: ToolUseBlock) -> ToolOutput | None:
    """Refuse ``call``, of a tool the workflow answers, when a deny rule of the run matches it.

    Args:
        state: the run's state: a refusal is journaled on it (``permission_denied``).
        call: the model's call.

    Returns:
        The tool error the model is shown, or None when no deny rule refuses the call.
    """
    if in_workflow_policy(state.plan.permissions).decide(call.name, None) != "deny":
        return None
    reason = f"permission denied: {call.name} is not allowed by the run's permissions"
    tool_call_refused(call.name, by_person=False)
    state.journal.emit(PermissionDeniedEvent(id=call.id, name=call.name, reason=reason), now_ms())
    return ToolOutput(content=reason, is_error=True)


def answer_in_workflow(state: LoopState, call: ToolUseBlock, display: RunDisplay) -> ToolOutput:
    """Answer ``call``, of a tool the run's plan marks ``in_workflow``, here and now.

    Args:
        state: the run's state: a list written is kept on it, with its ``todo`` event.
        call: the model's call.
        display: the run's details in the UI, which show the new list.

    Returns:
        The call's tool result: the list saved, or the error the model is shown (its
        arguments are not a valid list, a deny rule refuses it, or the tool is not one
        this code answers).
    """
    plan = state.plan
    denied = denied_in_workflow(state, call)
    if denied is not None:
        return denied
    if call.name != TODO_WRITE:
        # a plan from a newer worker, with a tool this code does not know how to answer
        invalid_tool_call(plan.tools, call.name)
        return ToolOutput(content=f"tool {call.name!r} cannot be answered by this worker", is_error=True)
    answer = answer_todo_write(call.input)
    if answer.todos is None:
        invalid_tool_call(plan.tools, call.name)
        return ToolOutput(content=answer.text, is_error=True)
    state.record_todos(answer.todos, now_ms())
    display.details(f"plan updated: {summary(answer.todos)}", state)
    return ToolOutput(content=answer.text)
