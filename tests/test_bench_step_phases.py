"""``bench/step_phases.py``'s clock of local activities and ``bench/floor.py``'s empty loop, on the
test server: what ``bench/step_cost.py`` prints beside its phases."""

from __future__ import annotations

import asyncio
import uuid
from datetime import timedelta

from temporalio import activity, workflow
from temporalio.client import Client
from temporalio.worker import UnsandboxedWorkflowRunner, Worker

from bench.floor import FLOOR_WORKFLOW, floor_worker
from bench.step_phases import LocalActivityClock


@activity.defn(name="bench_test.pause")
async def pause(ms: int) -> None:
    await asyncio.sleep(ms / 1000)


@workflow.defn(name="BenchPhasesProbe")
class BenchPhasesProbe:
    @workflow.run
    async def run(self) -> None:
        for _ in range(2):
            await workflow.execute_local_activity(pause, 60, start_to_close_timeout=timedelta(seconds=10))
        await workflow.execute_activity(pause, 200, start_to_close_timeout=timedelta(seconds=10))


async def test_the_clock_times_each_local_activity_by_run_and_type_and_only_those(client: Client) -> None:
    clock = LocalActivityClock()
    config = client.config()
    config["interceptors"] = [clock]  # as step_cost.py does: workers built on the client run it
    timed = Client(**config)
    queue = f"phases-{uuid.uuid4().hex[:8]}"
    wid = f"phases-{uuid.uuid4().hex[:8]}"
    async with Worker(
        timed,
        task_queue=queue,
        workflows=[BenchPhasesProbe],
        activities=[pause],
        workflow_runner=UnsandboxedWorkflowRunner(),
    ):
        await timed.execute_workflow("BenchPhasesProbe", id=wid, task_queue=queue)
    spent = clock.take(wid, steps=2)
    assert list(spent) == ["local bench_test.pause"]  # the ordinary activity is not counted
    assert 60 <= spent["local bench_test.pause"] < 120  # two of 60 ms over two steps; not the 200 ms one
    assert clock.take(wid, steps=2) == {}  # forgotten once taken


async def test_the_floor_loop_makes_one_activity_a_step(client: Client) -> None:
    queue = f"floor-{uuid.uuid4().hex[:8]}"
    wid = f"floor-{uuid.uuid4().hex[:8]}"
    async with floor_worker(client, queue, workflow_task_slots=4):
        steps = await client.execute_workflow(FLOOR_WORKFLOW, 3, id=wid, task_queue=queue, result_type=int)
    history = await client.get_workflow_handle(wid).fetch_history()
    scheduled = [e for e in history.events if e.HasField("activity_task_scheduled_event_attributes")]
    assert steps == 3 and len(scheduled) == 3
    assert {e.activity_task_scheduled_event_attributes.activity_type.name for e in scheduled} == {
        "bench.empty_step"
    }
