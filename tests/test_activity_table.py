"""The worker's activities are the declaration table's, under its names and with its types.

The workflow schedules activities only through ``ACTIVITIES`` (name, input type,
result type); a worker that registered another name, or took or returned another
type, would fail runs at the first call, or replay them differently. The worker's list
(``AgentActivities.all()``) is built from that table and the parts' ``@activity.defn``
methods, so adding an activity is its declaration and its method. Pure: no server.
"""

from __future__ import annotations

import ast
import inspect
import types
import typing
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest
from temporalio import activity

import durable_agent.activities
from durable_agent.activities import AgentActivities
from durable_agent.activities.agent import activity_name, defined_activities, registered
from durable_agent.activities.run_control import request_cancel
from durable_agent.core.activity_api import (
    ACTIVITIES,
    MODEL_CALL,
    SAVE_CHECKPOINT,
    TOOL_CALL,
    ActivityDecl,
    ModelCallInput,
    ModelStepInput,
    SaveCheckpointInput,
    ToolCallInput,
    ToolOutput,
)
from durable_agent.core.legacy_shapes import (
    LegacyExportInput,
    LegacyFinishRunInput,
    LegacySaveCheckpointInput,
)
from durable_agent.core.models import ModelResponse
from tests.helpers import final, scripted_config

# What an activity may accept besides its declared input: the shapes workers before linear
# history scheduled under the same name (``activities/legacy_sessions.py``).
LEGACY_INPUTS: frozenset[Any] = frozenset(
    {ModelCallInput, LegacySaveCheckpointInput, LegacyExportInput, LegacyFinishRunInput}
)


def flat(hint: Any) -> frozenset[Any]:
    """A type as the set of its union's members (``None`` as ``NoneType``)."""
    if hint is None:
        return frozenset({types.NoneType})
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        return frozenset().union(*(flat(arg) for arg in typing.get_args(hint)))
    return frozenset({hint})


def check_table(registered: Sequence[Callable[..., Any]], table: Sequence[ActivityDecl[Any, Any]]) -> None:
    """Fail unless ``registered`` holds each of ``table``'s activities once, as declared, and no other."""
    names = [activity._Definition.must_from_callable(fn).name for fn in registered]
    declared = [decl.name for decl in table]
    assert len(set(declared)) == len(declared), f"a name is declared twice: {declared}"
    assert Counter(names) == Counter(declared), (
        f"registered {sorted(map(str, names))}, declared {sorted(declared)}"
    )
    by_name = dict(zip(names, registered, strict=True))
    for decl in table:
        fn = by_name[decl.name]
        hints = typing.get_type_hints(fn)
        params = list(inspect.signature(fn).parameters.values())
        assert len(params) == 1, f"{decl.name} takes {len(params)} arguments, not one input"
        accepted = flat(hints[params[0].name])
        assert decl.input_type in accepted, f"{decl.name} does not take {decl.input_type.__name__}"
        extra = accepted - {decl.input_type}
        assert extra <= LEGACY_INPUTS, f"{decl.name} also takes {extra}, which no worker ever sent"
        assert flat(hints["return"]) == flat(decl.result_type), (
            f"{decl.name} returns {hints['return']}, declared {decl.result_type}"
        )


def test_the_worker_registers_every_declared_activity_once_and_nothing_else(tmp_path: Path) -> None:
    acts = AgentActivities(scripted_config(tmp_path, [final()]))
    check_table(acts.all(), ACTIVITIES)


def test_the_list_follows_the_declarations_and_refuses_any_mismatch(tmp_path: Path) -> None:
    """``all()`` is the parts' activities in the table's order; a declaration with no activity,
    an activity with no declaration, a name twice or a plain function fail the worker's start."""
    acts = AgentActivities(scripted_config(tmp_path, [final()]))
    assert [activity_name(fn) for fn in acts.all()] == [decl.name for decl in ACTIVITIES]
    defined: list[Callable[..., Any]] = [*defined_activities(acts.parts), request_cancel]

    async def plain(inp: ToolCallInput) -> ToolOutput:
        raise NotImplementedError

    for declared, found, why in (
        (ACTIVITIES[1:], defined, "no declaration"),
        (ACTIVITIES, defined[1:], "no activity"),
        (ACTIVITIES, [*defined, defined[0]], "twice"),
        (ACTIVITIES, [*defined, plain], "not an activity"),
    ):
        with pytest.raises(ValueError, match=why):
            registered(declared, found)


def test_a_new_activity_is_its_declaration_and_its_method(tmp_path: Path) -> None:
    """A part's new ``@activity.defn`` method is found; declared, it is registered as declared."""
    new = ActivityDecl[ToolCallInput, ToolOutput]("agent.extra", ToolCallInput, ToolOutput, TOOL_CALL.options)

    class Part:
        @activity.defn(name=new.name)
        async def extra(self, inp: ToolCallInput) -> ToolOutput:
            raise NotImplementedError

    class Hides(Part):
        async def extra(self, inp: ToolCallInput) -> ToolOutput:  # not an activity any more
            raise NotImplementedError

    acts = AgentActivities(scripted_config(tmp_path, [final()]))
    table = (*ACTIVITIES, new)
    check_table(registered(table, [*defined_activities((*acts.parts, Part())), request_cancel]), table)
    assert list(defined_activities([Hides()])) == []


def test_the_check_fails_on_any_mismatch(tmp_path: Path) -> None:
    good = AgentActivities(scripted_config(tmp_path, [final()])).all()

    @activity.defn(name=MODEL_CALL.name)
    async def takes_another_input(inp: ToolCallInput) -> ModelResponse:
        raise NotImplementedError

    @activity.defn(name=MODEL_CALL.name)
    async def returns_another_result(inp: ModelStepInput) -> ToolOutput:
        raise NotImplementedError

    @activity.defn(name=SAVE_CHECKPOINT.name)
    async def takes_an_input_no_worker_sent(inp: SaveCheckpointInput | ToolCallInput) -> None:
        raise NotImplementedError

    @activity.defn(name="agent.unknown")
    async def undeclared(inp: ToolCallInput) -> ToolOutput:
        raise NotImplementedError

    def swapped(name: str, fn: Callable[..., Any]) -> list[Callable[..., Any]]:
        return [fn if activity._Definition.must_from_callable(f).name == name else f for f in good]

    for listed in (
        good[1:],  # one missing
        [*good, good[0]],  # one twice
        [*good, undeclared],  # one not declared
        swapped(MODEL_CALL.name, takes_another_input),
        swapped(MODEL_CALL.name, returns_another_result),
        swapped(SAVE_CHECKPOINT.name, takes_an_input_no_worker_sent),
    ):
        with pytest.raises(AssertionError):
            check_table(listed, ACTIVITIES)


SaveCheckpointInputOr = typing.Union["SaveCheckpointInput", ToolCallInput]


def test_every_activity_is_named_from_its_declaration() -> None:
    """No activity name is spelled out in ``activities/``: each ``activity.defn`` takes its
    declaration's ``.name``, and no string (but docstrings) is an activity's name."""
    root = Path(durable_agent.activities.__file__).resolve().parent
    names = {decl.name for decl in ACTIVITIES}
    defns = 0
    for path in sorted(root.rglob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        docstrings = {id(node.value) for node in ast.walk(tree) if isinstance(node, ast.Expr)}
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and id(node) not in docstrings:
                assert node.value not in names, f"{path}:{node.lineno} spells out {node.value!r}"
            if isinstance(node, ast.Call) and ast.unparse(node.func) == "activity.defn":
                defns += 1
                [keyword] = node.keywords
                name = keyword.value
                assert keyword.arg == "name" and isinstance(name, ast.Attribute), ast.unparse(node)
                assert name.attr == "name" and isinstance(name.value, ast.Name), ast.unparse(node)
                assert name.value.id.isupper(), ast.unparse(node)
    assert defns == len(ACTIVITIES)
