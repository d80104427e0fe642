"""The permission decision for a tool call, taken in workflow code, stable across replays.

Issue 22 changed how a ``bash`` line is judged: a line that hides what it runs (a
shell reading stdin, ``$G push``, ``eval $x``, …) no longer passes a broad allow
while a deny rule could match it, scripts fed to a shell are read for the deny
rules, and a ``:*`` rule allows plain variables after its words. A run recorded
before took the old decision, and its replay must take it again: the new decision
is used only under the ``shell-judge-unseen`` patch. The patch is asked for only
when the two decisions differ, so a history whose lines decide alike carries no
marker and replays on either code (``agent_run_shell_unseen_v7.json`` holds one that differs).
"""

from __future__ import annotations

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from durable_agent.core.permissions import Decision, PermissionPolicy, strictest

from durable_agent.workflows.patches import PATCH_SHELL_UNSEEN


def decide_call(policy: PermissionPolicy, tool: str, target: str | None) -> Decision:
    """``policy.decide(tool, target)``, or its legacy decision for a run recorded before the patch.

    Args:
        policy: the run's permission rules.
        tool: the tool called.
        target: what the call touches (for ``bash``, the line).

    Returns:
        The decision this run takes, the same on every replay.
    """
    decision, legacy = policy.decide_both(tool, target)
    if decision == legacy or workflow.patched(PATCH_SHELL_UNSEEN):
        return decision
    return legacy


def decide_targets(
    policy: PermissionPolicy, tool: str, targets: tuple[str | None, ...]
) -> tuple[Decision, str | None]:
    """The decision for a call touching ``targets`` (``tool_specs.permission_targets``): each is
    decided with ``decide_call``, in order, and the strictest stands (any deny denies, else any
    ask asks). A call with one target is decided exactly as ``decide_call`` decides it.

    Args:
        policy: the run's permission rules.
        tool: the tool called.
        targets: what the call touches, at least one.

    Returns:
        The decision, and the target to show: the first denied one for a denial, else all of
        them (joined by ", ").
    """
    decisions = [decide_call(policy, tool, target) for target in targets]
    decision = strictest(decisions)
    if decision == "deny":
        return decision, targets[decisions.index("deny")]
    shown = [target for target in targets if target is not None]
    return decision, ", ".join(shown) if shown else None
