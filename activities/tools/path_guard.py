"""Permission rules that see through links: the tool activity's half of the check.

The workflow judges a call on the path as the model gave it; it cannot look
at the file system. A link inside the workspace can make that path name
another file (``notenv -> .env``, ``src/hooks -> ../.git/hooks``), so before a
path tool runs, the activity resolves the path and judges the resolved path
too: a ``deny`` on either denies, and an ``ask`` the workflow has not asked a
person about sends the call back to the workflow to ask.

``apply_patch`` touches every path its patch names: each is resolved and
judged so, a deny on any denies the call, and the resolved paths that need
``ask`` are asked about together.

``grep`` reads every file below its ``path``, so it leaves out the files an
explicit ``read`` deny rule covers, by their path as walked or as resolved.

A link can change between this check and the tool's open. So the file tools
do not open by name: they walk the path without following links
(``beneath.walk``) and judge the path they actually opened with the same
rules (``check_opened``, which ``check_resolved`` arms for the call it
judged); a link flipped in between makes the call fail, never read or write
what the rules deny.
"""

from __future__ import annotations

import contextvars
import posixpath
from collections.abc import Callable
from pathlib import Path
from typing import Any

from durable_agent.activities.tools.tool import ToolFailure, confine
from durable_agent.core.activity_api import ToolCallInput, ToolOutput
from durable_agent.core.patch_format import PatchError, parse_patch, patch_paths
from durable_agent.core.permissions import PermissionPolicy, parse_rule
from durable_agent.core.tool_specs import ToolSpec

# Set by the tool activity for the tool it runs: whether ``read`` rules deny a workspace-relative
# path. A context variable, so that it reaches the thread a search runs in (``asyncio.to_thread``
# copies the context) without changing every tool's signature.
READ_DENIED: contextvars.ContextVar[Callable[[str], bool] | None] = contextvars.ContextVar(
    "read_denied", default=None
)


# Set by ``check_resolved`` for the call it judged: what the tool opened is judged with it
# (``check_opened``). A context variable: each activity runs in a context of its own, and the
# tool's thread gets a copy of it.
OPENED_JUDGE: contextvars.ContextVar[Callable[[str], str | None] | None] = contextvars.ContextVar(
    "opened_judge", default=None
)


def check_opened(resolved: str) -> None:
    """Refuse (``ToolFailure``) a path the call's rules deny, or ask about unapproved, as the
    tool found it when it opened it (workspace-relative, links resolved)."""
    judge = OPENED_JUDGE.get()
    refusal = judge(resolved) if judge is not None else None
    if refusal is not None:
        raise ToolFailure(refusal)


def relative(root: Path, path: Path) -> str:
    """``path`` (inside ``root``) as the rules see it: workspace-relative, ``/``-separated."""
    return "." if path == root else path.relative_to(root).as_posix()


def read_denier(policy: PermissionPolicy, root: Path) -> Callable[[str], bool]:
    """Whether an explicit ``read`` deny rule covers a path, as given or links resolved.

    Only explicit rules: a ``default = "deny"`` leaves ``grep`` its files, as
    it did before (``grep`` has its own rules).
    """
    rules = [rule for rule in (parse_rule(r) for r in policy.deny) if rule.names("read")]
    if not rules:
        return lambda _given: False

    def covered(path: str) -> bool:
        return any(rule.matches("read", path) for rule in rules)

    def denied(given: str) -> bool:
        if covered(given):
            return True
        try:
            resolved = relative(root, confine(root, given))
        except Exception:
            return True  # cannot be resolved inside the workspace: never read it
        return resolved != given and covered(resolved)

    return denied


def check_resolved(inp: ToolCallInput, spec: ToolSpec, arguments: dict[str, Any]) -> ToolOutput | None:
    """The refusal for a call whose path resolves to one the rules deny or ask about; None: go on.

    Only for tools whose permission target is a path; a path that leaves the
    workspace is left to the tool, which refuses it.
    """
    OPENED_JUDGE.set(None)
    policy = inp.permissions
    if policy is None or spec.target_arg is None or not spec.target_is_path:
        return None
    value = arguments.get(spec.target_arg)
    if not isinstance(value, str) or not value:
        return None  # the argument check reports it
    if spec.targets_from == "patch":
        return _check_patch(inp, policy, value)
    root = Path(inp.workspace).resolve()
    given = posixpath.normpath(value)
    if posixpath.isabs(given):
        given = posixpath.relpath(given, str(root)) if given.startswith(str(root)) else given
    OPENED_JUDGE.set(lambda opened: _opened_refusal(inp, policy, value, given, opened))
    try:
        resolved = relative(root, confine(root, value))
    except Exception:
        return None
    if resolved == given:
        return None
    decision = policy.decide(inp.name, resolved)
    shown = f"{inp.name} {value}"
    if decision == "deny":
        return ToolOutput(
            content=(
                f"permission denied: {shown} resolves to {resolved}, which is not allowed by the "
                "run's permissions"
            ),
            is_error=True,
            permission="denied",
            resolved_target=resolved,
        )
    if decision == "ask" and inp.approved_target != resolved:
        return ToolOutput(
            content=f"{shown} resolves to {resolved}, which needs a person's approval",
            is_error=True,
            permission="ask",
            resolved_target=resolved,
        )
    return None


def _opened_refusal(
    inp: ToolCallInput, policy: PermissionPolicy, value: str, given: str, opened: str
) -> str | None:
    """Why the rules refuse the path the tool opened (``None``: they do not), judged as
    ``check_resolved`` judges the path it resolved before."""
    if opened == given:
        return None  # the path the workflow judged (and a person approved, where one was asked)
    decision = policy.decide(inp.name, opened)
    if decision == "deny":
        return (
            f"permission denied: {inp.name} {value} resolves to {opened}, which is not allowed by the "
            "run's permissions"
        )
    if decision == "ask" and inp.approved_target != opened:
        return (
            f"{inp.name} {value} resolves to {opened} now (a link changed since the call was judged), "
            "which needs a person's approval; call it again"
        )
    return None


def _given(root: Path, value: str) -> str:
    """A path as the workflow judged it: normalised, workspace-relative when absolute inside."""
    given = posixpath.normpath(value)
    if posixpath.isabs(given) and given.startswith(str(root)):
        return posixpath.relpath(given, str(root))
    return given


def _check_patch(inp: ToolCallInput, policy: PermissionPolicy, patch: str) -> ToolOutput | None:
    """``check_resolved`` for a patch: every path it names, resolved, judged as one path is."""
    try:
        paths = patch_paths(parse_patch(patch))
    except PatchError:
        return None  # the argument check reports it
    root = Path(inp.workspace).resolve()
    judged = {_given(root, value) for value in paths}  # the workflow decided each of these
    asked: dict[str, None] = {}
    for value in paths:
        try:
            resolved = relative(root, confine(root, value))
        except Exception:
            continue  # outside the workspace: the tool refuses it
        if resolved in judged:
            continue
        decision = policy.decide(inp.name, resolved)
        if decision == "deny":
            return ToolOutput(
                content=(
                    f"permission denied: {inp.name} {value} resolves to {resolved}, which is not allowed "
                    "by the run's permissions"
                ),
                is_error=True,
                permission="denied",
                resolved_target=resolved,
            )
        if decision == "ask":
            asked[resolved] = None
    together = ", ".join(asked)
    approved = set(asked) if asked and inp.approved_target == together else set()
    OPENED_JUDGE.set(lambda opened: _patch_opened_refusal(inp, policy, judged | approved, opened))
    if asked and not approved:
        return ToolOutput(
            content=f"{inp.name}'s paths resolve to {together}, which needs a person's approval",
            is_error=True,
            permission="ask",
            resolved_target=together,
        )
    return None


def _patch_opened_refusal(
    inp: ToolCallInput, policy: PermissionPolicy, passed: set[str], opened: str
) -> str | None:
    """Why the rules refuse a path a patch's tool opened (``None``: they do not); ``passed``: the
    paths the workflow judged and those a person approved."""
    if opened in passed:
        return None
    decision = policy.decide(inp.name, opened)
    if decision == "deny":
        return f"permission denied: {inp.name} reaches {opened}, which the run's permissions do not allow"
    if decision == "ask":
        return (
            f"{inp.name} reaches {opened} now (a link changed since the call was judged), which needs a "
            "person's approval; call it again"
        )
    return None
