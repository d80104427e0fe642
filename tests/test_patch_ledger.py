"""The patch ledger (``workflows/patches.py``) is true: to the code that asks for each patch and to
the committed histories in ``tests/histories/`` that replay through it.

- every ``workflow.patched`` (or ``deprecate_patch``) call asks through a ledger constant, and
  every ledger id is asked for; no patch id is spelled out anywhere else;
- every ledger id is carried by at least one committed history: exactly the ones it names
  (read from the histories' ``MarkerRecorded`` events, their ``patch-data`` details);
- its ``old_branch`` names exactly the histories whose replay breaks when the old branch goes
  (``patched`` replaced by ``deprecate_patch``), and its own histories need its new branch.
"""

from __future__ import annotations

import ast
import base64
import json
import os
from collections.abc import Callable, Iterator
from functools import cache
from pathlib import Path

import pytest
from temporalio import workflow
from temporalio.api.enums.v1 import EventType
from temporalio.client import WorkflowHistory
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.worker import Replayer, UnsandboxedWorkflowRunner

import durable_agent
from durable_agent.workflows import AgentRun, patches
from durable_agent.workflows.patches import CHECKPOINT_COMPLETES_PATCH, LEDGER, LOCAL_BOOKENDS_PATCH, Patch

HISTORIES = Path(__file__).parent / "histories"
PACKAGE = Path(durable_agent.__file__).resolve().parent
WORKFLOWS = Path(patches.__file__).resolve().parent
IDS = {p.id: p for p in LEDGER}
# Patches whose two branches issue the same commands: a local activity's result comes from its
# marker on replay, whether the workflow waited for it or cancelled it meanwhile.
REPLAY_BLIND = {CHECKPOINT_COMPLETES_PATCH}


def patch_markers(path: Path) -> set[str]:
    """The patch ids in a JSON history's ``MarkerRecorded`` events."""
    ids = set()
    for event in json.loads(path.read_text())["events"]:
        marker = event.get("markerRecordedEventAttributes")
        if not marker or marker["markerName"] != "core_patch":
            continue
        [payload] = marker["details"]["patch-data"]["payloads"]
        data = json.loads(base64.b64decode(payload["data"]))
        ids.add(data["id"] if isinstance(data, dict) else data)
    return ids


@cache
def carried() -> dict[str, frozenset[str]]:
    """Each committed history's name, and the patch ids it carries."""
    return {p.name: frozenset(patch_markers(p)) for p in sorted(HISTORIES.glob("*.json"))}


def release(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in version.split("."))


def test_the_ledger_names_each_patch_once_with_histories_that_exist() -> None:
    assert len(IDS) == len(LEDGER)
    for p in LEDGER:
        names = [*p.histories, *p.old_branch]
        assert set(names) <= set(carried()), f"{p.id} names histories not in tests/histories/"
        assert list(p.histories) == sorted(set(p.histories)), f"{p.id}: histories sorted, once each"
        assert not set(p.histories) & set(p.old_branch), p.id
        assert release(p.release) < release(p.deprecate_in), p.id


@pytest.mark.parametrize("entry", LEDGER, ids=lambda p: p.id)
def test_every_patch_is_carried_by_the_committed_histories_it_names(entry: Patch) -> None:
    holding = sorted(name for name, ids in carried().items() if entry.id in ids)
    assert holding, f"no committed history carries {entry.id!r}: record one (scripts/record_history.py)"
    assert list(entry.histories) == holding, f"{entry.id}: the ledger should name histories={tuple(holding)}"


def test_no_committed_history_carries_a_patch_the_ledger_lacks() -> None:
    unknown = {name: sorted(ids - set(IDS)) for name, ids in carried().items() if ids - set(IDS)}
    assert not unknown, f"patch ids missing from workflows/patches.py: {unknown}"


# --- the code asks through the ledger --------------------------------------------------------


def workflow_modules() -> Iterator[tuple[Path, ast.Module]]:
    for path in sorted(WORKFLOWS.glob("*.py")):
        yield path, ast.parse(path.read_text(), str(path))


def ledger_imports(tree: ast.Module) -> dict[str, str]:
    """The names a module imports from the ledger, and the ids they stand for."""
    names: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module == patches.__name__:
            for alias in node.names:
                value = getattr(patches, alias.name)
                if isinstance(value, str):
                    names[alias.asname or alias.name] = value
    return names


def patch_calls(tree: ast.Module) -> Iterator[ast.Call]:
    """``workflow.patched(…)`` and ``workflow.deprecate_patch(…)``, however the SDK is reached."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
            if name in ("patched", "deprecate_patch"):
                yield node


def test_every_patched_call_asks_through_a_ledger_constant() -> None:
    asked: set[str] = set()
    for path, tree in workflow_modules():
        imported = ledger_imports(tree)
        for call in patch_calls(tree):
            where = f"{path.name}:{call.lineno} {ast.unparse(call)}"
            assert len(call.args) == 1 and isinstance(call.args[0], ast.Name), where
            patch_id = imported.get(call.args[0].id)
            assert patch_id in IDS, f"{where}: not a constant of workflows/patches.py"
            asked.add(patch_id)
    assert asked == set(IDS), f"in the ledger but never asked for: {sorted(set(IDS) - asked)}"


def test_no_patch_id_is_spelled_out_outside_the_ledger() -> None:
    ledger = Path(patches.__file__).resolve()
    # through the package's links (``workflows``, ``activities``, ``worker.py``)
    paths = {Path(d, f).resolve() for d, _, fs in os.walk(PACKAGE, followlinks=True) for f in fs}
    python = {p for p in paths if p.suffix == ".py"}
    assert WORKFLOWS / "agent_run.py" in python and len(python) > 100, len(python)
    for path in sorted(python - {ledger}):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Constant) and node.value in IDS:
                pytest.fail(f"{path}:{node.lineno} spells out {node.value!r}: import it from the ledger")


# --- what each branch replays --------------------------------------------------------------


@cache
def histories() -> dict[str, WorkflowHistory]:
    # under the workflow id they were recorded with (a child run's id is made from its parent's)
    return {name: WorkflowHistory.from_json("recorded", (HISTORIES / name).read_text()) for name in carried()}


async def failing(names: list[str]) -> list[str]:
    """Which of ``names`` fail to replay on the workflow as ``workflow.patched`` now answers."""
    replayer = Replayer(
        workflows=[AgentRun],
        data_converter=pydantic_data_converter,
        # unsandboxed: the workflow modules see the ``workflow.patched`` this test puts in place
        workflow_runner=UnsandboxedWorkflowRunner(),
    )
    out = []
    for name in names:
        result = await replayer.replay_workflow(histories()[name], raise_on_replay_failure=False)
        if result.replay_failure is not None:
            out.append(name)
    return out


def answering(patch_id: str, new_branch: bool) -> Callable[[str], bool]:
    """``workflow.patched`` with ``patch_id``'s answer fixed: ``True`` as after a
    ``deprecate_patch`` (the old branch gone), or ``False`` with its marker read (the new one)."""
    sdk = workflow.patched

    def patched(asked: str) -> bool:
        if asked != patch_id:
            return sdk(asked)
        if new_branch:
            workflow.deprecate_patch(asked)
            return True
        sdk(asked)
        return False

    return patched


@pytest.mark.parametrize("entry", LEDGER, ids=lambda p: p.id)
async def test_dropping_the_old_branch_breaks_exactly_the_histories_the_ledger_drops(
    entry: Patch, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(workflow, "patched", answering(entry.id, new_branch=True))
    broken = await failing(sorted(carried()))
    assert broken == list(entry.old_branch), f"{entry.id}: the ledger should name old_branch={tuple(broken)}"


@pytest.mark.parametrize("entry", [p for p in LEDGER if p.id not in REPLAY_BLIND], ids=lambda p: p.id)
async def test_the_histories_carrying_a_patch_replay_only_through_its_new_branch(
    entry: Patch, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(workflow, "patched", answering(entry.id, new_branch=False))
    assert await failing(list(entry.histories)), f"no history of {entry.id} tells its branches apart"


def test_the_history_recorded_for_cancel_waits_for_checkpoint_cancels_during_one() -> None:
    """``agent_run_cancel_checkpoint_v7.json``: the ``cancel`` signal comes after the boundary
    asked for the patch and before its local activity's marker; the export is acknowledged (the
    marker holds a result, not a failure) and the run ends Canceled."""
    events = histories()["agent_run_cancel_checkpoint_v7.json"].events
    kinds = [e.WhichOneof("attributes") for e in events]
    asked = next(
        i
        for i, e in enumerate(events)
        if e.HasField("marker_recorded_event_attributes")
        and CHECKPOINT_COMPLETES_PATCH.encode() in e.SerializeToString()
    )
    local = next(
        i
        for i, e in enumerate(events)
        if e.marker_recorded_event_attributes.marker_name == "core_local_activity"
    )
    signal = kinds.index("workflow_execution_signaled_event_attributes")
    assert asked < signal < local
    assert not events[local].marker_recorded_event_attributes.HasField("failure")
    assert kinds[-1] == "workflow_execution_canceled_event_attributes"


def late_patches(history: WorkflowHistory) -> list[int]:
    """The ids of patch markers recorded after a local activity's marker in the same workflow task
    (a task's commands follow its ``WorkflowTaskCompleted``)."""
    late: list[int] = []
    local_seen = False
    for event in history.events:
        if event.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED:
            local_seen = False
        if not event.HasField("marker_recorded_event_attributes"):
            continue
        name = event.marker_recorded_event_attributes.marker_name
        if name == "core_local_activity":
            local_seen = True
        elif name == "core_patch" and local_seen:
            late.append(event.event_id)
    return late


def test_runs_started_since_ask_no_patch_after_a_local_activity_in_one_task() -> None:
    """The SDK fails a replay that meets a patch's marker after a local activity's in one
    workflow task (``starting.ask_patches_first``): the histories recorded since keep none there,
    and a patch added later must be asked up front too. The ones before did, at their first
    boundary."""
    since = [name for name, ids in carried().items() if LOCAL_BOOKENDS_PATCH in ids]
    assert since
    for name in since:
        assert not late_patches(histories()[name]), name
    assert late_patches(histories()["agent_run_v9.json"])  # the fault this test looks for
