"""The permission decision for a tool call, taken in workflow code, stable across replays.

Issue 22 changed how a ``bash`` line is judged: a line that hides what it runs (a
shell reading stdin, ``$G push``, ``eval $x``, …) no longer passes a broad allow
while a deny rule could match it, scripts fed to a shell are read for the deny
rules, and a ``:*`` rule allows plain variables after its words. A run recorded
before took the old decision, and its replay must take it again: the new decision
is used only under the ``shell-judge-unseen`` patch. The patch is asked for only
when the two decisions differ, so a history whose lines decide alike carries no
marker and replays on either code (``agent_run_shell_unseen_v7.json`` holds one that differs).

Issue 38 changed it again: what a program runs that the judge cannot see (an interpreter's
code, awk's ``system()``, sed's ``e``, a git alias or ``-c`` config, ``GIT_PAGER``…) keeps a
broad allow off too, and the scripts git or a variable hands a shell are read for the deny
rules. That decision is taken under ``shell-judge-programs`` (asked first in every execution
since, so a new run holds its marker; ``agent_run_shell_programs_v12.json`` takes it), and the
one before it otherwise, itself under ``shell-judge-unseen`` as above.
"""

from __future__ import annotations

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from durable_agent.core.permissions import Decision, PermissionPolicy, strictest

from durable_agent.workflows.patches import PATCH_SHELL_PROGRAMS, PATCH_SHELL_UNSEEN


def decide_call(policy: PermissionPolicy, tool: str, target: str | None) -> Decision:
    """``policy.decide(tool, target)``, or the decision before it for a run recorded before its patch.

    Args:
        policy: the run's permission rules.
        tool: the tool called.
        target: what the call touches (for ``bash``, the line).

    Returns:
        The decision this run takes, the same on every replay.
    """
    decision, unseen, legacy = policy.decide_eras(tool, target)
    if decision != unseen and workflow.patched(PATCH_SHELL_PROGRAMS):
        return decision
    # a run recorded before ``shell-judge-programs`` (or a line both judges decide alike)
    if unseen == legacy or workflow.patched(PATCH_SHELL_UNSEEN):
        return unseen
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
