"""One worker process for ``bench/takeover.py``: ``build_worker`` with the reader model.

    python bench/takeover_worker.py --base DIR --queue QUEUE --identity NAME

Connects as ``durable_agent.client.connect`` does (``TEMPORAL_ADDRESS`` and
Temporal's profiles) with the worker identity ``NAME`` (the ``identity`` of
the activity events it records), serves ``AgentRun`` and its activities on
``QUEUE`` with the config of ``bench/reader_setup.py`` under ``DIR`` (the same
store and sink folders as the other worker processes on the queue), prints
``ready`` once it polls, and runs until its standard input closes (the bench
closes it, or dies) or it is killed.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout

from bench.reader_setup import reader_activities, reader_config
from durable_agent.client import connect, exit_process
from durable_agent.worker import build_worker


async def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", type=Path, required=True, help="the folder of bench/reader_setup.py")
    parser.add_argument("--queue", required=True, help="the task queue")
    parser.add_argument("--identity", required=True, help="the worker's identity")
    args = parser.parse_args()
    acts, _ = reader_activities(reader_config(args.base))
    client = await connect(identity=args.identity)
    async with build_worker(client, acts, args.queue):
        print("ready", flush=True)
        await asyncio.to_thread(sys.stdin.buffer.read)  # until EOF: the bench is done, or gone
    await acts.aclose()
    return 0


if __name__ == "__main__":
    exit_process(asyncio.run(main()))
