"""The workflow changes a ``LoopState`` and its journal only through their methods.

Each method of a ``LoopState`` or of its ``RunJournal`` that changes the state
records the event that goes with the change (``durable_agent.core.loop``,
``durable_agent.core.journal``); a workflow module that wrote an attribute itself
(``state.journal.exports.append(...)``, ``state.journal.last_export = ...``) could
change the state without its event. This walks the syntax of every module in
``workflows/`` and fails on any assignment to, augmented assignment of, deletion
of, or mutating call on an attribute of a ``LoopState``: ``state.<x>``,
``self.state.<x>`` or ``self._state.<x>`` (and anything below them, so
``state.journal.<x>`` too).
"""

from __future__ import annotations

import ast
from pathlib import Path

import durable_agent.workflows

WORKFLOWS = Path(durable_agent.workflows.__file__).resolve().parent
MODULES = sorted(WORKFLOWS.glob("*.py"))

# Names a LoopState goes by in workflow code.
STATE_NAMES = {"state"}
STATE_ATTRIBUTES = {"state", "_state"}  # on ``self``
MUTATORS = {
    "append",
    "extend",
    "insert",
    "remove",
    "pop",
    "popitem",
    "clear",
    "add",
    "discard",
    "update",
    "setdefault",
    "sort",
    "reverse",
    "__setitem__",
    "__delitem__",
    "__setattr__",
}


def _is_state(node: ast.expr) -> bool:
    """``state``, ``self.state`` or ``self._state``."""
    if isinstance(node, ast.Name):
        return node.id in STATE_NAMES
    return (
        isinstance(node, ast.Attribute)
        and node.attr in STATE_ATTRIBUTES
        and isinstance(node.value, ast.Name)
        and node.value.id == "self"
    )


def _in_state(node: ast.expr) -> bool:
    """An attribute of a LoopState, or a part of one: ``state.x``, ``state.x[i]``, ``state.x.y``."""
    while isinstance(node, ast.Attribute | ast.Subscript):
        if _is_state(node.value):
            return True
        node = node.value
    return False


def _targets(node: ast.AST) -> list[ast.expr]:
    if isinstance(node, ast.Assign):
        targets = list(node.targets)
    elif isinstance(node, ast.AugAssign | ast.AnnAssign):
        targets = [node.target]
    elif isinstance(node, ast.Delete):
        targets = list(node.targets)
    else:
        return []
    out: list[ast.expr] = []
    while targets:  # ``a, state.x = ...`` and ``(state.x, b) = ...``
        target = targets.pop()
        if isinstance(target, ast.Tuple | ast.List):
            targets.extend(target.elts)
        elif isinstance(target, ast.Starred):
            targets.append(target.value)
        else:
            out.append(target)
    return out


def state_writes(source: str, filename: str = "<source>") -> list[str]:
    """Where ``source`` writes an attribute of a LoopState other than through its methods."""
    found = []
    for node in ast.walk(ast.parse(source, filename)):
        line = getattr(node, "lineno", 0)
        for target in _targets(node):
            if _in_state(target):
                found.append(f"{filename}:{line}: writes {ast.unparse(target)}")
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in MUTATORS
            and _in_state(node.func.value)
        ):
            found.append(f"{filename}:{line}: calls {ast.unparse(node.func)}")
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in ("setattr", "delattr")
            and node.args
            and (_is_state(node.args[0]) or _in_state(node.args[0]))
        ):
            found.append(f"{filename}:{line}: calls {node.func.id} on {ast.unparse(node.args[0])}")
    return found


def test_there_are_workflow_modules() -> None:
    assert any(p.name == "agent_run.py" for p in MODULES), f"no workflow modules in {WORKFLOWS}"


def test_workflows_change_a_loop_state_only_through_its_methods() -> None:
    found = [w for path in MODULES for w in state_writes(path.read_text(), path.name)]
    assert not found, "LoopState written around its methods:\n" + "\n".join(found)


def test_the_check_finds_each_kind_of_write() -> None:
    # the writes the workflow made before ``LoopState`` had its ``record_*`` methods
    bad = """
state.prior_run_ids = opened.prior_run_ids
state.last_export = ExportSeed(sink=plan.export_sink, descriptor=descriptor, log=sent)
state.exports.append(ExportRef(turn=turn, content_digest=digest))
self._state.export_failures.append(failure)
self.state.persistence_failures.extend(more)
state.turn += 1
state.usage: TokenUsage = usage
a, state.final_text = 1, "x"
state.events[0] = record
state.staged_ids.add(call.id)
state.journal.entries.pop()
state.journal.last_export = ExportSeed(sink=plan.export_sink, descriptor=descriptor, log=sent)
state.journal.exports.append(ExportRef(turn=turn, content_digest=digest))
self._state.journal.staged_ids.add(call.id)
state.plan.tools.clear()
del state.error
setattr(state, "error", None)
"""
    assert len(state_writes(bad)) == len(bad.strip().splitlines())
    fine = """
state = self._state = LoopState(plan, now_ms())
self._state = state
state.journal.emit(event, now_ms())
state.journal.record_opened(opened.prior_run_ids)
state.journal.pending().model_copy(update={"events": ()})
state.journal.take_entry()
plan = state.plan
other.exports.append(x)
self.pending.pop(call_id, None)
"""
    assert state_writes(fine) == []
