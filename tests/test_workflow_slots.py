"""``WorkflowTaskSlots``: many workflow-task slots for a worker's own runs, few for replays.

The supplier is driven here as Temporal's core drives it (reserve before a poll, mark used
when a task comes, release after); the suite's every worker runs with it on a real server.
"""

from __future__ import annotations

import asyncio
import threading
from dataclasses import dataclass
from typing import Literal

import pytest
from temporalio.common import WorkerDeploymentVersion
from temporalio.worker import SlotInfo, SlotPermit, SlotReleaseContext

from durable_agent.workflow_slots import QueuePermit, WorkflowTaskSlots


@dataclass
class Reserve:
    """A ``SlotReserveContext`` as core gives one."""

    is_sticky: bool
    slot_type: Literal["workflow", "activity", "local-activity"] = "workflow"
    task_queue: str = "agent"
    worker_identity: str = "test"
    worker_build_id: str = ""
    worker_deployment_version: WorkerDeploymentVersion | None = None


@dataclass
class Info:
    workflow_type: str
    is_sticky: bool


@dataclass
class Used:
    """A ``SlotMarkUsedContext``."""

    slot_info: SlotInfo
    permit: SlotPermit


STICKY, SHARED = Reserve(is_sticky=True), Reserve(is_sticky=False)


async def take(slots: WorkflowTaskSlots, ctx: Reserve, *, used: bool = True) -> QueuePermit:
    permit = await asyncio.wait_for(slots.reserve_slot(ctx), 1)
    assert isinstance(permit, QueuePermit)
    if used:
        slots.mark_slot_used(Used(Info("AgentRun", ctx.is_sticky), permit))
    return permit


def release(slots: WorkflowTaskSlots, permit: SlotPermit) -> None:
    slots.release_slot(SlotReleaseContext(slot_info=None, permit=permit))


async def waits(slots: WorkflowTaskSlots, ctx: Reserve) -> asyncio.Task[SlotPermit]:
    """A reservation that cannot be given now: it is still waiting a moment later."""
    task = asyncio.ensure_future(slots.reserve_slot(ctx))
    await asyncio.sleep(0.05)
    assert not task.done()
    return task


async def test_the_shared_queue_gets_its_few_slots_and_the_sticky_one_the_rest() -> None:
    slots = WorkflowTaskSlots(total=6, shared=2)
    polls = [await take(slots, SHARED, used=False) for _ in range(2)]  # two polls of the shared queue
    third = await waits(slots, SHARED)
    sticky = [await take(slots, STICKY) for _ in range(4)]  # unaffected: the rest of the total
    assert slots.in_use == (6, 2, 4, 0)
    over = await waits(slots, STICKY)  # the total is reached
    release(slots, sticky[0])
    assert isinstance(await asyncio.wait_for(over, 1), QueuePermit)
    release(slots, polls[0])  # a shared poll given back (no task came): the waiting one gets it
    assert (await asyncio.wait_for(third, 1)).sticky is False  # type: ignore[attr-defined]
    release(slots, polls[0])  # released twice: counted once
    assert slots.in_use == (6, 2, 3, 0)  # the two reserved last have no task yet


async def test_while_a_replay_runs_the_worker_takes_no_more_than_the_shared_count() -> None:
    slots = WorkflowTaskSlots(total=10, shared=2)
    replay = await take(slots, SHARED)  # a task came from the shared queue: a replay, most likely
    held = await take(slots, STICKY)
    assert slots.in_use == (2, 1, 2, 1)
    step = await waits(slots, STICKY)  # two tasks at once already: a third waits for the replay
    release(slots, replay)
    assert (await asyncio.wait_for(step, 1)).sticky is True  # type: ignore[attr-defined]
    more = [await take(slots, STICKY) for _ in range(5)]  # no replay: as many as the total allows
    assert slots.in_use == (7, 0, 6, 0)
    for permit in (held, *more):
        release(slots, permit)


async def test_an_eager_task_takes_a_shared_slot_or_none() -> None:
    slots = WorkflowTaskSlots(total=3, shared=1)
    first = slots.try_reserve_slot(SHARED)  # a run started with its first task
    assert isinstance(first, QueuePermit) and slots.try_reserve_slot(SHARED) is None
    assert slots.try_reserve_slot(STICKY) is not None


async def test_a_release_from_another_thread_wakes_the_waiting_reservation() -> None:
    slots = WorkflowTaskSlots(total=1, shared=1)
    permit = await take(slots, STICKY)
    waiting = await waits(slots, STICKY)
    thread = threading.Thread(target=release, args=(slots, permit))  # core's own thread
    thread.start()
    thread.join()
    assert isinstance(await asyncio.wait_for(waiting, 1), QueuePermit)


async def test_a_cancelled_reservation_is_forgotten() -> None:
    slots = WorkflowTaskSlots(total=1, shared=1)
    permit = await take(slots, STICKY)
    waiting = await waits(slots, SHARED)
    waiting.cancel()  # the worker shuts down: core drops its poll
    with pytest.raises(asyncio.CancelledError):
        await waiting
    release(slots, permit)
    assert slots.in_use == (0, 0, 0, 0)
    assert isinstance(await take(slots, SHARED), QueuePermit)


def test_shared_slots_must_fit_the_total() -> None:
    for total, shared in ((4, 0), (4, 5)):
        with pytest.raises(ValueError, match="shared slots"):
            WorkflowTaskSlots(total, shared)
