"""How long waiting runs take to move to a new build after it is promoted, and what a move costs a
run (docs/deploys.md): ::

    python -m bench.upgrade_move [RUNS]      # default 10, on a dev server of its own

``RUNS`` conversations answer their first prompt on build ``b1`` of a Worker Deployment and wait.
Build ``b2`` starts and is made current (``promote``); ``durable-agent upgrade`` (its function)
waits for the new routing to reach the queue and wakes them. Printed, from the server's event
times:

* ``promote → moved``: from the promote's return to each run's new execution starting on ``b2``;
* ``signal → moved``: from each run's ``upgrade`` signal to that start (the move itself);
* ``promote → signal``: what ``upgrade`` waited for the routing to propagate;
* what the move adds to a run: the events of the old execution from the signal on, the workflow
  tasks and events of the new one until it waits again, and its Temporal actions (the signal,
  the continue-as-new's new execution).
"""

from __future__ import annotations

import asyncio
import statistics
import sys
import tempfile
import time
import uuid
from contextlib import AsyncExitStack
from pathlib import Path

from temporalio.api.enums.v1 import EventType
from temporalio.api.history.v1 import HistoryEvent
from temporalio.client import Client, WorkflowHandle

from durable_agent.cli.upgrade import upgrade_waiting
from durable_agent.client import start_run
from durable_agent.config import AgentConfig
from durable_agent.core.run_api import AWAITING_PROMPT, AgentRunInput
from durable_agent.devserver import start_ephemeral_server
from tests.helpers import final, read_call, scripted_config, status_when, until
from tests.versioning import pinned_build, set_current, versioned_worker

SIGNALED = EventType.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED
STARTED = EventType.EVENT_TYPE_WORKFLOW_EXECUTION_STARTED
TASK_COMPLETED = EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED


def when(event: HistoryEvent) -> float:
    return event.event_time.ToNanoseconds() / 1e9


def stats(name: str, values: list[float]) -> str:
    ms = sorted(v * 1000 for v in values)
    return f"{name:<18} p50 {statistics.median(ms):7.0f} ms   max {ms[-1]:7.0f} ms   (n={len(ms)})"


async def moved_run(client: Client, handle: WorkflowHandle[object, object], first: str) -> str | None:
    latest = await client.get_workflow_handle(handle.id).describe()
    if latest.run_id != first and await pinned_build(client, handle.id) == "b2":
        return latest.run_id
    return None


async def moved_by(client: Client, handle: WorkflowHandle[object, object], first: str) -> str:
    """The run's execution on ``b2``, once it has moved."""
    found: str = await until("the run to move", lambda: moved_run(client, handle, first), 60)
    return found


async def main(runs: int) -> None:
    env = await start_ephemeral_server()
    client = env.client
    try:
        with tempfile.TemporaryDirectory() as name:
            tmp = Path(name)
            ws = tmp / "ws"
            ws.mkdir()
            (ws / "a.txt").write_text("alpha\n")
            responses = [read_call("r1", "a.txt"), final("alpha")]
            deployment, queue = f"bench-{uuid.uuid4().hex[:8]}", f"bench-{uuid.uuid4().hex[:8]}"

            def config(build: str) -> AgentConfig:
                return scripted_config(tmp, responses, worker={"deployment": deployment, "build_id": build})

            async with AsyncExitStack() as stack:
                await stack.enter_async_context(versioned_worker(client, config("b1"), queue))
                await set_current(client, deployment, "b1")
                handles = [
                    await start_run(
                        client,
                        AgentRunInput(prompt="read a.txt", workspace=str(ws), follow_ups=True),
                        queue=queue,
                    )
                    for _ in range(runs)
                ]
                for handle in handles:
                    await status_when(handle, lambda s: s.status == AWAITING_PROMPT, "the first answer", 60)
                firsts = [(await h.describe()).run_id for h in handles]
                await stack.enter_async_context(versioned_worker(client, config("b2"), queue))
                await set_current(client, deployment, "b2")
                promoted = time.time()
                woken: set[str] = set()
                while len(woken) < runs:  # visibility lags the runs' status a moment
                    woken |= set((await upgrade_waiting(client, queue)).woken)
                    await asyncio.sleep(0.2)
                seconds: list[str] = []
                for handle, first in zip(handles, firsts, strict=True):
                    seconds.append(await moved_by(client, handle, first))
                for handle in handles:
                    await status_when(
                        handle, lambda s: s.status == AWAITING_PROMPT, "the moved run to wait", 60
                    )
                to_moved, signal_to_moved, to_signal, old_events, new_events, new_tasks = (
                    [],
                    [],
                    [],
                    [],
                    [],
                    [],
                )
                for handle, first, second in zip(handles, firsts, seconds, strict=True):
                    old = (await client.get_workflow_handle(handle.id, run_id=first).fetch_history()).events
                    new = (await client.get_workflow_handle(handle.id, run_id=second).fetch_history()).events
                    signal = next(e for e in old if e.event_type == SIGNALED)
                    start = next(e for e in new if e.event_type == STARTED)
                    to_moved.append(when(start) - promoted)
                    signal_to_moved.append(when(start) - when(signal))
                    to_signal.append(when(signal) - promoted)
                    old_events.append(len(old) - old.index(signal))
                    new_events.append(len(new))
                    new_tasks.append(sum(1 for e in new if e.event_type == TASK_COMPLETED))
                for handle in handles:
                    await handle.terminate("bench over")
        print(f"{runs} waiting runs moved from b1 to b2")
        print(stats("promote → moved", to_moved))
        print(stats("promote → signal", to_signal))
        print(stats("signal → moved", signal_to_moved))
        print(
            f"a move costs a run: {statistics.median(old_events):.0f} events in the old execution from the "
            f"signal on, {statistics.median(new_tasks):.0f} workflow task(s) and "
            f"{statistics.median(new_events):.0f} events in the new one until it waits again; "
            "actions: the signal and one continue-as-new"
        )
    finally:
        await env.shutdown()


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1]) if len(sys.argv) > 1 else 10))
