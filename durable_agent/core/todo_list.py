"""``todo_write``: the plan a model keeps as a checklist, and how it is shown.

The model gives the whole list at every call; the newest list replaces the one before. The
workflow answers the call itself (``ToolSpec.in_workflow``): nothing outside the run changes,
so no worker is needed and the answer is a pure function of the arguments. The list becomes a
``todo`` event (``TodoEvent``), is kept on the run's state (``LoopState.todos``, carried over
continue-as-new) and shown by ``status``, the Temporal UI's current details and the CLI's
followers (the checklists below).

Choices, documented in ``docs/tools.md``:

- At most one task ``in_progress`` is the convention the tool's description asks for, not a
  rule: a list with more is saved, and the answer says how many are in progress.
- Permissions: the deny rules apply (``todo_write`` in ``deny`` turns it off, and it is not
  offered); ``default`` and the ask rules do not, since a plan touches nothing a person guards
  (``tool_specs.in_workflow_policy``).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

from durable_agent.core.errors import validation_message
from durable_agent.core.events import TodoEvent, TodoItem, TodoStatus
from durable_agent.core.tool_args import TodoWriteArgs

if TYPE_CHECKING:
    from durable_agent.core.export import CheckpointPayload

TODO_WRITE = "todo_write"
# What the UI's current details show of the list: the details are read whole at every refresh.
DETAILS_MAX_ITEMS = 30
DETAILS_MAX_CHARS = 200


def _markdown(status: TodoStatus) -> str:
    return {"completed": "- [x]", "in_progress": "- [~]", "pending": "- [ ]"}[status]


def _symbol(status: TodoStatus) -> str:
    return {"completed": "☑", "in_progress": "◐", "pending": "☐"}[status]


@dataclass(frozen=True)
class TodoAnswer:
    """What a ``todo_write`` call comes to: the list to keep (None: the call was refused) and
    the text of its tool result."""

    todos: tuple[TodoItem, ...] | None
    text: str

    @property
    def is_error(self) -> bool:
        return self.todos is None


def answer_todo_write(arguments: dict[str, Any]) -> TodoAnswer:
    """Check a ``todo_write`` call's arguments and say what they come to.

    Args:
        arguments: the call's arguments, as the model gave them.

    Returns:
        The list and the tool result saying it was saved; or, for arguments that are not a valid
        list (a status not known, too many tasks, a blank task), no list and the error the model
        is shown.
    """
    try:
        # as ``tool_specs.validate_args`` says it of every tool's arguments
        args = TodoWriteArgs.model_validate(arguments)
    except ValidationError as exc:
        return TodoAnswer(None, f"invalid arguments for {TODO_WRITE!r}: {validation_message(exc)}")
    todos = tuple(TodoItem(content=e.content, status=e.status, id=e.id) for e in args.todos)
    return TodoAnswer(todos, saved_text(todos))


def counts(todos: Iterable[TodoItem]) -> dict[TodoStatus, int]:
    """How many tasks are in each status."""
    out: dict[TodoStatus, int] = {"completed": 0, "in_progress": 0, "pending": 0}
    for item in todos:
        out[item.status] += 1
    return out


def summary(todos: tuple[TodoItem, ...]) -> str:
    """``"5 tasks: 2 completed, 1 in progress, 2 pending"``."""
    n = counts(todos)
    tasks = f"{len(todos)} task{'' if len(todos) == 1 else 's'}"
    return f"{tasks}: {n['completed']} completed, {n['in_progress']} in progress, {n['pending']} pending"


def saved_text(todos: tuple[TodoItem, ...]) -> str:
    """The tool result of a list saved: what the model is told."""
    if not todos:
        return "The plan is cleared: no tasks. The person watching the run sees it."
    text = f"The plan is saved ({summary(todos)}); the person watching the run sees it."
    busy = counts(todos)["in_progress"]
    if busy > 1:
        text += f" Note: {busy} tasks are in progress; keep one at a time where you can."
    return text


def _cut(text: str, limit: int) -> str:
    line = " ".join(text.split())
    return line if len(line) <= limit else line[: limit - 1] + "…"


def checklist_markdown(todos: tuple[TodoItem, ...]) -> str:
    """The list as a markdown checklist for the UI's details (``- [x]`` done, ``- [~]`` in
    progress, ``- [ ]`` pending), its first ``DETAILS_MAX_ITEMS`` tasks, each cut short."""
    lines = [f"{_markdown(t.status)} {_cut(t.content, DETAILS_MAX_CHARS)}" for t in todos[:DETAILS_MAX_ITEMS]]
    if len(todos) > DETAILS_MAX_ITEMS:
        lines.append(f"- … {len(todos) - DETAILS_MAX_ITEMS} more")
    return "\n".join(lines)


def checklist_lines(todos: tuple[TodoItem, ...], limit: int = 160) -> list[str]:
    """The list as lines for a terminal: ``☑`` done, ``◐`` in progress, ``☐`` pending."""
    return [f"{_symbol(t.status)} {_cut(t.content, limit)}" for t in todos]


def plan_at_checkpoint(payload: CheckpointPayload) -> tuple[TodoItem, ...]:
    """The plan the model had written last when an export was made, for a run resumed from it.

    The newest ``todo`` event of the export's source run (one it wrote, or the ``carried`` one
    it recorded at its start from its own source); for a run recorded before that, when it
    wrote none and was itself resumed, its source's, as far as the export's snapshot holds them
    (a run resumed from another session's export is not in it).

    Args:
        payload: The export's payload.

    Returns:
        The plan's tasks; none when no run of the line wrote one.
    """
    records = {r.snapshot.id: r for r in payload.snapshot.run_records}
    run_id: str | None = payload.logical_resume.run_id
    seen: set[str] = set()
    while run_id is not None and run_id in records and run_id not in seen:
        seen.add(run_id)
        record = records[run_id]
        for entry in reversed(record.events):
            if isinstance(entry.event, TodoEvent):
                return entry.event.todos
        source = record.snapshot.resumed_from
        same_session = source is not None and source.session_id == payload.snapshot.session_id
        run_id = source.run_id if source is not None and same_session else None
    return ()
