"""One worker process for ``bench/scale.py``: ours or the naive loop, with enough slots for many runs.

    python bench/scale_worker.py --base DIR --queue QUEUE --identity NAME \\
        [--design ours|naive] [--slots N] [--workflow-task-slots N] [--postgres] [--remote-tools]

Connects as ``durable_agent.client.connect`` does (``TEMPORAL_ADDRESS``) with
the worker identity ``NAME``, and serves on ``QUEUE`` either ``AgentRun`` and
its activities (``build_worker``, ``--design ours``) or ``NaiveAgentRun``
unsandboxed (``bench/step_cost.py``'s ``naive_worker(..., sandboxed=False)``,
``--design naive``), with the reader set-up of ``bench/reader_setup.py``
under ``DIR``. ``--slots N`` gives the worker N activity and local-activity
slots (Temporal's default is 100 each), a workflow cache of at least N, and
the naive loop's worker N workflow-task slots; ours keeps the workflow-task
slots it ships with (``[worker] workflow_task_slots``) unless
``--workflow-task-slots`` says otherwise. ``--postgres`` puts the store and the sink on the PostgreSQL
server that ``BENCH_PG_DSN`` names (``bench/pg_cost.py``'s ``on_postgres``);
``--remote-tools`` runs every tool call as an ordinary activity (``[tools]
local_calls = false``; by default the quick built-in tools run as local ones).
It prints ``ready`` once it polls and runs until its standard input closes;
``SIGUSR1`` prints every asyncio task's stack to its standard error.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout

from temporalio.client import Client
from temporalio.worker import Worker

from bench.naive import NaiveInput
from bench.pg_cost import on_postgres
from bench.reader_setup import reader_activities, reader_config, sink_root, workspace_of
from bench.step_cost import Bench, naive_worker
from durable_agent.client import connect, exit_process
from durable_agent.core.tool_specs import offered_tools
from durable_agent.worker import build_worker, connect_storage

DESIGNS = ("ours", "naive")


def reader_bench(
    client: Client, base: Path, queue: str, *, postgres: bool = False, remote_tools: bool = False
) -> Bench:
    """``bench/step_cost.py``'s ``Bench`` for the reader set-up under ``base``, both designs on ``queue``.

    Args:
        client: The connected client.
        base: The folder of ``bench/reader_setup.py`` (``prepare`` already ran).
        queue: The task queue of both designs.
        postgres: The store and sink on ``BENCH_PG_DSN``'s server rather than under ``base``.
        remote_tools: Every tool call an ordinary activity (``[tools] local_calls = false``).

    Returns:
        What ``start_ours``, ``start_naive`` and ``naive_worker`` take.
    """
    config = reader_config(base)
    if postgres:
        config = on_postgres(config)
    if remote_tools:
        if "local_calls" not in type(config.tools).model_fields:
            raise SystemExit("--remote-tools: this checkout's [tools] has no local_calls")
        config = config.model_copy(update={"tools": config.tools.model_copy(update={"local_calls": False})})
    acts, _model = reader_activities(config)
    offers = offered_tools((t.spec for t in acts.tools.values()), config.permissions)
    naive = NaiveInput(
        prompt="-", workspace=str(workspace_of(base)), model="reader/n1", system_prompt=config.system_prompt,
        tools=tuple(t.offer().definition for t in offers), max_steps=2,
    )  # fmt: skip
    return Bench(client, base, acts, sink_root(reader_config(base)), queue, queue, naive)


async def scaled_worker(b: Bench, design: str, slots: int, workflow_task_slots: int = 0) -> Worker:
    """The design's worker on ``b.queue`` with ``slots`` activity and local-activity slots (and
    workflow-task slots: ``workflow_task_slots``, else the naive loop ``slots`` and ours its own),
    and a workflow cache of at least ``slots``; everything else as the design's own.

    The design's own worker is built on a queue of its own (the SDK refuses two workers on one
    queue of a client), its settings are taken, and it is shut down unused.
    """
    aside = replace(b, queue=f"{b.queue}-template")
    template = (
        build_worker(b.client, b.acts, aside.queue)
        if design == "ours"
        else naive_worker(aside, aside.queue, sandboxed=False)
    )
    config = template.config()
    template._bridge_worker.initiate_shutdown()  # never run: it stops without polling
    config["task_queue"] = b.queue
    if design != "ours" or workflow_task_slots:
        config["max_concurrent_workflow_tasks"] = workflow_task_slots or slots
    config["max_concurrent_activities"] = slots
    config["max_concurrent_local_activities"] = slots
    config["max_cached_workflows"] = max(config.get("max_cached_workflows", 1000), slots)
    return Worker(**config)


def dump_tasks() -> None:
    """Every asyncio task's stack to standard error (``kill -USR1 <pid>``): where a worker that
    stopped moving waits."""
    tasks = asyncio.all_tasks()
    print(f"--- {len(tasks)} asyncio tasks", file=sys.stderr)
    for task in tasks:
        task.print_stack(limit=12, file=sys.stderr)
    sys.stderr.flush()


async def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", type=Path, required=True, help="the folder of bench/reader_setup.py")
    parser.add_argument("--queue", required=True, help="the task queue")
    parser.add_argument("--identity", required=True, help="the worker's identity")
    parser.add_argument("--design", choices=DESIGNS, default="ours")
    parser.add_argument(
        "--slots",
        type=int,
        default=100,
        help="activity and local-activity slots (and the naive loop's workflow-task slots)",
    )
    parser.add_argument(
        "--workflow-task-slots",
        type=int,
        default=0,
        help="workflow-task slots; default: the design's own",
    )
    parser.add_argument("--postgres", action="store_true", help="store and sink on BENCH_PG_DSN's server")
    parser.add_argument("--remote-tools", action="store_true", help="[tools] local_calls = false")
    args = parser.parse_args()
    asyncio.get_running_loop().add_signal_handler(signal.SIGUSR1, dump_tasks)
    client = await connect(identity=args.identity)
    b = reader_bench(client, args.base, args.queue, postgres=args.postgres, remote_tools=args.remote_tools)
    await connect_storage(b.acts)
    async with await scaled_worker(b, args.design, args.slots, args.workflow_task_slots):
        print("ready", flush=True)
        await asyncio.to_thread(sys.stdin.buffer.read)  # until EOF: the bench is done, or gone
    await b.acts.aclose()
    return 0


if __name__ == "__main__":
    exit_process(asyncio.run(main()))
