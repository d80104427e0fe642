"""Subagents: the ``task`` tool, the kinds of agent it may start, and what a child may do.

A run offered ``task`` (``[agents] enabled``) answers each call of it by starting a child
``AgentRun`` (``workflows/child_runs.py``): a run of its own (its own run id, context and
export series) in the parent's session and workspace, whose final answer is the call's tool
result. This module holds the pure parts:

- ``TASK_SPEC``: the tool as the model is offered it (``TaskArgs``), answered by the
  workflow (``in_workflow``), never by an activity.
- ``AgentType``: one ``[agents.NAME]`` of the worker's config; ``SubagentPlan``: what a
  run's plan says of its subagents (its depth, the bounds, the types); ``SubagentOrigin``:
  what a parent tells its child in the child's input (who its parent is, its depth, the
  tools it may be offered; the worker resolves its agent type's system prompt itself).
- ``child_policy``: the child's permission rules, at most the parent's: the parent's deny
  rules and the type's together, and every call decided by the type's rules *and* the
  parent's (``PermissionPolicy.within``), the strictest decision standing. A child can
  never do what its parent may not.
- ``child_workflow_id``: the child's workflow id, from the parent's and the call's, so a
  workflow task that runs again (a worker killed, a replay) finds the same child.
- ``ChildRun``: a child as the parent's ``status`` shows it; ``task_answer``: what the
  parent's model is told of a child's end.
"""

from __future__ import annotations

import re
from typing import Literal

from pydantic import Field

from durable_agent.core.events import SubagentEndEvent, SubagentStartEvent
from durable_agent.core.models import Frozen, TokenUsage
from durable_agent.core.permissions import PermissionPolicy
from durable_agent.core.tool_args import ToolArgs, bounded_text
from durable_agent.core.tool_specs import ToolSpec

TASK = "task"
# What a ``task`` call's ``description`` may be: a few words, the child's summary in the UI.
TASK_DESCRIPTION_MAX_CHARS = 200
# A child's answer as the parent's model sees it, at most (``[agents] max_answer_chars``).
DEFAULT_ANSWER_CHARS = 20_000
_UNSAFE_ID = re.compile(r"[^A-Za-z0-9_.-]")

ChildStatus = Literal["running", "completed", "failed", "cancelled", "budget_exhausted", "not_started"]


class TaskArgs(ToolArgs):
    """Arguments of ``task``."""

    description: str = bounded_text(
        TASK_DESCRIPTION_MAX_CHARS,
        "A few words saying what the subagent is to do (shown to the person watching).",
    )
    prompt: str = Field(
        min_length=1,
        description="The subagent's whole task: it sees nothing of this conversation but this text, "
        "so say what to look at and what to report.",
    )
    agent_type: str | None = Field(
        None, min_length=1, description="The kind of subagent to start (see the tool's description)."
    )


TASK_SPEC = ToolSpec(
    TASK,
    "Start a subagent: a separate agent with its own, empty conversation and the tools of this "
    "one (or fewer), which works on `prompt` alone and returns its final answer as this call's "
    "result. Use it for work that would fill this conversation (reading many files, searching "
    "widely): only the answer comes back. Several `task` calls in one answer run at the same "
    "time. A subagent may do no more than you may; it cannot ask you questions, so give it "
    "everything it needs in `prompt` and say what its answer must hold.",
    TaskArgs,
    None,
    in_workflow=True,
)


class AgentType(Frozen):
    """One kind of subagent: ``[agents.NAME]`` in the worker's config. Every key is optional:
    what a type leaves out, its child takes from the parent."""

    # What the type is for: the model reads it in the `task` tool's description.
    description: str = ""
    # The child's model ("provider/model"); unset: the parent's.
    model: str | None = None
    # The child's system prompt, instead of the worker's `system_prompt` (project instructions still join it).
    system_prompt: str | None = None
    # The tools the child may be offered, by name; unset: the parent's. Never more than the parent's.
    tools: tuple[str, ...] | None = None
    # Rules that narrow the parent's: a call runs only if these and the parent's rules both let it.
    permissions: PermissionPolicy | None = None
    # The child's `max_tool_rounds`; unset: the worker's.
    max_tool_rounds: int | None = Field(None, ge=1, le=10_000)


class SubagentOrigin(Frozen):
    """What a parent tells its child, in the child's input: who its parent is and what it may
    be offered. Set by a run for its child; a host that sets it only narrows the run."""

    parent_run_id: str
    parent_workflow_id: str
    call_id: str
    depth: int = Field(ge=1)
    agent_type: str | None = None
    # the tools the child may be offered, by name (the parent's, or fewer)
    tools: tuple[str, ...] = ()
    # A child that only reads, of a parent whose workspace follows it: the parent's tree and
    # host, which the child's calls use (it shares the parent's copy; docs/workspaces.md).
    tree: str | None = Field(None, pattern=r"^[0-9a-f]{40}$")
    host: str | None = None


class SubagentPlan(Frozen):
    """What a run's plan says of subagents: where the run is in the tree, and the bounds."""

    depth: int = 0  # 0: a run a host started; a child is one deeper than its parent
    max_depth: int = 1
    max_children: int = 8
    max_answer_chars: int = DEFAULT_ANSWER_CHARS
    types: dict[str, AgentType] = Field(default_factory=dict)
    parent: SubagentOrigin | None = None  # a child's: who started it

    def may_start(self) -> bool:
        """Whether the run may start children (its children would be within ``max_depth``)."""
        return self.depth < self.max_depth


class ChildRun(Frozen):
    """A child run as its parent's ``status`` shows it (and its ``subagent_*`` events say)."""

    call_id: str
    workflow_id: str
    description: str
    agent_type: str | None = None
    run_id: str | None = None  # None until Temporal has started it
    status: ChildStatus = "running"
    final_content_digest: str | None = None  # its last export's
    exports: int = 0
    usage: TokenUsage = TokenUsage()
    cost_usd: float | None = None  # at its model's prices; None: unknown
    error: str | None = None


def with_child(children: tuple[ChildRun, ...], child: ChildRun) -> tuple[ChildRun, ...]:
    """``children`` with ``child`` in its place (by workflow id), or added at the end."""
    known = [c.workflow_id for c in children]
    if child.workflow_id not in known:
        return (*children, child)
    at = known.index(child.workflow_id)
    return (*children[:at], child, *children[at + 1 :])


def child_event(child: ChildRun) -> SubagentStartEvent | SubagentEndEvent:
    """The event of a child that started (``status`` running) or ended."""
    event = SubagentStartEvent if child.status == "running" else SubagentEndEvent
    # Each event's fields are ``ChildRun``'s, by the same names, but for the call's ``id``.
    fields = {name: getattr(child, name) for name in event.model_fields if name in ChildRun.model_fields}
    if event is SubagentStartEvent:
        fields["run_id"] = child.run_id or ""  # a start event's run id is a string, empty until known
    return event(id=child.call_id, **fields)


def child_policy(parent: PermissionPolicy, narrower: PermissionPolicy | None) -> PermissionPolicy:
    """A child's permission rules: at most ``parent``'s.

    Without ``narrower`` (an agent type that sets no permissions) the child has the parent's
    rules. With it, the child's own rules are ``narrower``'s with the parent's deny rules
    added, and the parent's rules stay in force beside them (``within``): every call is
    decided by both and the strictest decision stands (deny, then ask, then allow). So a call
    runs in the child only if the parent's rules would let it run too.

    Args:
        parent: The parent's rules (themselves perhaps within its own parent's).
        narrower: The agent type's rules, if it has any.

    Returns:
        The child's rules.
    """
    if narrower is None:
        return parent
    deny = tuple(dict.fromkeys((*parent.deny, *narrower.deny)))
    return PermissionPolicy(
        allow=narrower.allow,
        deny=deny,
        ask=narrower.ask,
        default=narrower.default,
        within=(parent,),
    )


def child_workflow_id(parent_workflow_id: str, step: int, call_id: str) -> str:
    """The workflow id of the child a ``task`` call starts: the same for the same call of the
    same step, so a workflow task that runs again finds the child it started.

    Args:
        parent_workflow_id: The parent's workflow id.
        step: The parent's model step that made the call (``LoopState.tool_rounds``).
        call_id: The call's id.

    Returns:
        ``PARENT/task-STEP-CALL``, the call id's unusual characters made ``_``.
    """
    return f"{parent_workflow_id}/task-{step}-{_UNSAFE_ID.sub('_', call_id)[:64]}"


def task_description(types: dict[str, AgentType]) -> str:
    """``task``'s description, with the agent types the worker defines (none: the base text)."""
    if not types:
        return TASK_SPEC.description
    kinds = "; ".join(f"`{name}`: {t.description or 'no description'}" for name, t in sorted(types.items()))
    return f"{TASK_SPEC.description} Kinds of subagent (`agent_type`, optional): {kinds}."


def bounded_answer(text: str, limit: int) -> str:
    """A child's answer as the parent's model reads it: at most ``limit`` characters, a cut said."""
    if len(text) <= limit:
        return text
    return text[:limit] + f"\n[the subagent's answer is cut here: {len(text)} characters, {limit} shown]"


def task_answer(child: ChildRun, text: str, limit: int) -> tuple[str, bool]:
    """What the parent's model is told of a child that ended: its answer, or why it has none.

    Args:
        child: The child as it ended.
        text: Its final answer (empty when it gave none).
        limit: ``max_answer_chars``.

    Returns:
        The tool result's text, and whether it is a tool error (the child did not complete).
    """
    if child.status == "completed":
        return bounded_answer(text or "(the subagent gave no answer)", limit), False
    why = f": {child.error}" if child.error else ""
    partial = f"\nIts last answer:\n{bounded_answer(text, limit)}" if text else ""
    return f"subagent {child.status}{why}{partial}", True


__all__ = [
    "TASK",
    "TASK_SPEC",
    "AgentType",
    "ChildRun",
    "SubagentOrigin",
    "SubagentPlan",
    "TaskArgs",
    "bounded_answer",
    "child_event",
    "child_policy",
    "child_workflow_id",
    "task_answer",
    "task_description",
    "with_child",
]
