"""The state a run carries over continue-as-new is a versioned schema that the build a run moves
to and the build before it both read (docs/deploys.md, "The carried state"): read both ways.

- old → new: the states written before the schema (``tests/carried_states/``: the continue-as-new
  inputs of ``agent_run_continued_v2-last.json``, release 0.1, and of
  ``agent_run_continued_v10-last.json``, 0.2 before the schema) are read by this code as schema 1;
- new → old (a rollback): a state a next build writes, with a top-level field this build lacks,
  is read by this code, its field ignored; one whose ``min_reader`` is past this build fails the
  workflow task, not the run, which waits for a build that reads it.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import pytest
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowExecutionStatus
from temporalio.exceptions import ApplicationError

from durable_agent.activities import AgentActivities
from durable_agent.core import run_api
from durable_agent.core.loop import LoopState
from durable_agent.core.run_api import (
    CARRIED_STATE_MIN_READER,
    CARRIED_STATE_SCHEMA,
    AgentRunInput,
    CarriedState,
    CarriedStateUnreadable,
)
from tests.helpers import running_worker, scripted_config, until

CARRIED = Path(__file__).parent / "carried_states"
PREVIOUS_RELEASES = sorted(CARRIED.glob("continued_input_*.json"))


def previous_input(path: Path = CARRIED / "continued_input_0.2.json") -> dict[str, Any]:
    data: dict[str, Any] = json.loads(path.read_text())
    return data


def written_now() -> dict[str, Any]:
    """The continue-as-new input this build writes from the previous release's state."""
    run_input = AgentRunInput.model_validate(previous_input())
    assert run_input.continued is not None
    carried = run_input.continued.stamped()
    return run_input.model_copy(update={"continued": carried}).model_dump(mode="json", exclude_none=True)


@pytest.mark.parametrize("path", PREVIOUS_RELEASES, ids=lambda p: p.stem)
def test_a_state_written_before_the_schema_reads_as_schema_1(path: Path) -> None:
    run_input = AgentRunInput.model_validate(previous_input(path))
    carried = run_input.continued
    assert carried is not None
    assert (carried.schema_version, carried.min_reader) == (1, 1)
    carried.check_readable()
    state = LoopState.restore(carried)
    assert (state.turn, state.plan.run_id) == (carried.turn, carried.plan.run_id)


def test_this_build_writes_its_schema_and_reads_it_back() -> None:
    data = written_now()
    assert data["continued"]["schema_version"] == CARRIED_STATE_SCHEMA
    assert data["continued"]["min_reader"] == CARRIED_STATE_MIN_READER
    again = AgentRunInput.model_validate(json.loads(json.dumps(data)))
    assert again.continued is not None
    again.continued.check_readable()
    assert again.continued == AgentRunInput.model_validate(data).continued


def test_a_next_build_s_state_with_a_field_this_build_lacks_is_read_its_field_ignored() -> None:
    """A rollback: the next build added a top-level field (and kept ``min_reader``)."""
    data = written_now()
    data["continued"] |= {"schema_version": CARRIED_STATE_SCHEMA + 1, "moved_at_ms": 1_700_000_000_000}
    run_input = AgentRunInput.model_validate(data)
    carried = run_input.continued
    assert carried is not None
    carried.check_readable()
    assert "moved_at_ms" not in carried.model_dump()
    state = LoopState.restore(carried)
    assert state.turn == carried.turn
    # and what this build carries on writes its own schema, without the field
    assert carried.stamped().schema_version == CARRIED_STATE_SCHEMA


def test_a_state_that_needs_a_newer_reader_is_refused_without_failing_the_run() -> None:
    data = written_now()
    data["continued"] |= {"schema_version": CARRIED_STATE_SCHEMA + 2, "min_reader": CARRIED_STATE_SCHEMA + 1}
    carried = AgentRunInput.model_validate(data).continued
    assert carried is not None
    with pytest.raises(CarriedStateUnreadable, match="make current a build that reads it") as raised:
        carried.check_readable()
    # not an ApplicationError: the workflow task fails and is retried, the run stays open
    assert not isinstance(raised.value, ApplicationError)


def test_a_state_older_than_the_build_before_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    """Once schema 3 is written, schema 1 (two back) is no longer read."""
    carried = CarriedState.model_validate(previous_input()["continued"])
    monkeypatch.setattr(run_api, "CARRIED_STATE_OLDEST", 2)
    with pytest.raises(CarriedStateUnreadable, match="schema 1"):
        carried.check_readable()


async def test_a_run_carried_over_with_an_unreadable_state_waits_open(client: Client, tmp_path: Path) -> None:
    """On the dev server: the execution's workflow task fails, again and again, and the run
    stays running (a build that reads the state would take it on)."""
    data = written_now()
    data["continued"] |= {"min_reader": CARRIED_STATE_SCHEMA + 1}
    config = scripted_config(tmp_path, [{"text": "never asked"}])
    async with running_worker(client, AgentActivities(config)) as queue:
        handle = await client.start_workflow(
            "AgentRun", data, id=f"carried-{uuid.uuid4().hex[:8]}", task_queue=queue
        )

        async def task_failed() -> str | None:
            async for event in handle.fetch_history_events():
                if event.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_FAILED:
                    return event.workflow_task_failed_event_attributes.failure.message
            return None

        message = await until("a workflow task to fail", task_failed)
        assert "make current a build that reads it" in message
        assert (await handle.describe()).status == WorkflowExecutionStatus.RUNNING
        await handle.terminate("test over")
