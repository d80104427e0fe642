"""``bench/proc_sample.py``: a process's CPU and memory read from ``/proc``, and py-spy's stacks ranked."""

from __future__ import annotations

import asyncio
import os
import sys

import pytest

from bench.proc_sample import Sampler, cpu_seconds, descendants, rss_mb, thread_cpu, top_functions

TOP = "<module> (bench/scale_worker.py:1);run (asyncio/runners.py:160)"
OURS = "AgentRun.run (durable_agent/workflows/agent_run.py:246)"
SDK = "execute (temporalio/worker/_activity.py:525)"
LEAF = "dumps (json/encoder.py:183)"
RAW = f"{TOP};{OURS};{LEAF} 6\n{TOP};{SDK};{LEAF} 3\n{TOP} 1\nnot a stack line\n"


def test_top_functions_ranks_leaves_stacks_and_our_frames() -> None:
    top = top_functions(RAW, k=3)
    assert top["samples"] == 10
    assert top["own"][0] == (LEAF, 0.9)
    total = dict(top["total"])
    assert total == {LEAF: 0.9, OURS: 0.6, SDK: 0.3}  # the event loop's plumbing left out
    assert top["ours"] == [(OURS, 0.6)]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_this_process_is_read_from_proc() -> None:
    me = os.getpid()
    assert (cpu_seconds(me) or 0) > 0
    assert (rss_mb(me) or 0) > 1
    assert sum(thread_cpu(me).values()) > 0
    assert descendants(me)[0] == me
    assert cpu_seconds(2**22 + 1) is None  # no such process


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_sampler_counts_cpu_spent_between_start_and_stop() -> None:
    async def spin() -> dict[str, object]:
        sampler = Sampler({"me": [os.getpid()]}, "me", threads=os.getpid())
        sampler.start()
        end = asyncio.get_running_loop().time() + 0.3
        while asyncio.get_running_loop().time() < end:
            sum(range(10_000))
        await asyncio.sleep(0.3)  # the watcher samples the peak memory
        return await sampler.stop()

    figures = asyncio.run(spin())
    me = figures["me"]
    assert isinstance(me, dict) and me["cpu_s"] > 0.1 and 0 < me["cores"] <= (os.cpu_count() or 1)
    assert isinstance(figures["peak_mb"], float) and figures["peak_mb"] > 1
    assert figures["thread_cpu_s"]
