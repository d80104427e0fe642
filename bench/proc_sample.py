"""What processes cost while a bench runs, read from ``/proc``; and ``py-spy``'s busiest functions.

Linux only (``/proc/<pid>/stat``, ``status``, ``task/*/stat`` and ``/proc/stat``),
no psutil. CPU is user + system time (``utime`` + ``stime``, in clock ticks),
memory the resident set (``VmRSS``). ``Sampler`` takes the CPU of named groups
of processes at its start and stop, the peak resident set of one group
between them, and the machine's busy time; ``top_functions`` reads the
output of ``py-spy record --format raw``.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import resource
import time
from asyncio.subprocess import DEVNULL, PIPE
from collections import Counter
from pathlib import Path
from typing import Any

TICKS = os.sysconf("SC_CLK_TCK")
SPY_RATE = 100  # py-spy samples a second
# frames on every stack (the event loop, the thread pool): left out of the "total" ranking
PLUMBING = ("asyncio/", "threading.py", "concurrent/futures/thread.py", "<module>")
OURS = ("durable_agent/", "bench/")  # the project's frames (activities and workflows are linked in)


def _stat_fields(path: Path) -> tuple[str, list[str]] | None:
    """The command name and the fields after it of a ``stat`` file; None when it is gone."""
    try:
        text = path.read_text()
    except OSError:
        return None
    left, right = text.index("("), text.rindex(")")
    return text[left + 1 : right], text[right + 2 :].split()


def cpu_seconds(pid: int) -> float | None:
    """The process's user + system CPU seconds (all its threads), None when it is gone."""
    found = _stat_fields(Path(f"/proc/{pid}/stat"))
    return None if found is None else (int(found[1][11]) + int(found[1][12])) / TICKS


def thread_cpu(pid: int) -> dict[str, float]:
    """CPU seconds of the process's live threads, summed by thread name (``comm``)."""
    out: dict[str, float] = {}
    for task in Path(f"/proc/{pid}/task").glob("*/stat"):
        found = _stat_fields(task)
        if found is not None:
            out[found[0]] = out.get(found[0], 0.0) + (int(found[1][11]) + int(found[1][12])) / TICKS
    return out


def descendants(root: int) -> list[int]:
    """``root`` and every process below it (a PostgreSQL server's backends)."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        found = _stat_fields(stat)
        if found is not None:
            children.setdefault(int(found[1][1]), []).append(int(stat.parent.name))
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo += children.get(pid, [])
    return out


def rss_mb(pid: int) -> float | None:
    """The process's resident set (``VmRSS``) in MB, None when it is gone."""
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return None


def machine_ticks() -> tuple[int, int]:
    """The machine's busy and total clock ticks since boot, over all cores (``/proc/stat``)."""
    values = [int(v) for v in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    idle = values[3] + values[4]  # idle, iowait
    return sum(values) - idle, sum(values)


class Sampler:
    """CPU of groups of processes from ``start`` to ``stop``, and the peak memory of ``watched``.

    Args:
        groups: A name for each group of pids (``worker``, ``server``, ...); a group whose pid is
            a tree root (``trees``) counts its descendants too, as found at start and at stop.
        watched: The group whose summed resident set is sampled every ``every`` seconds (peak).
        threads: The pid whose threads' CPU is split by thread name.
        trees: Groups counted with their descendants.
    """

    def __init__(
        self,
        groups: dict[str, list[int]],
        watched: str,
        threads: int | None = None,
        trees: tuple[str, ...] = (),
        every: float = 0.25,
    ) -> None:
        self.groups, self.watched, self.threads, self.trees, self.every = (
            groups,
            watched,
            threads,
            trees,
            every,
        )
        self.peak_mb = 0.0
        self._task: asyncio.Task[None] | None = None

    def _pids(self, name: str) -> list[int]:
        pids = self.groups[name]
        return [p for root in pids for p in descendants(root)] if name in self.trees else pids

    def _cpu(self) -> dict[str, dict[int, float]]:
        return {name: {p: cpu_seconds(p) or 0.0 for p in self._pids(name)} for name in self.groups}

    def rss(self) -> float:
        """The summed resident set of the watched group now, MB."""
        return sum(rss_mb(p) or 0.0 for p in self.groups[self.watched])

    async def _watch(self) -> None:
        while True:
            self.peak_mb = max(self.peak_mb, self.rss())
            await asyncio.sleep(self.every)

    def start(self) -> None:
        self._t0, self._m0, self._c0 = time.perf_counter(), machine_ticks(), self._cpu()
        self._threads0 = thread_cpu(self.threads) if self.threads else {}
        self.peak_mb = self.rss()
        self._task = asyncio.ensure_future(self._watch())

    async def stop(self) -> dict[str, Any]:
        """The figures since ``start``: per group ``cpu_s`` and ``cores`` (CPU seconds over wall
        seconds), the machine's ``busy_cores`` and the part of them outside the groups
        (``others_cores``), the watched group's ``peak_mb``, and the CPU
        seconds of the ``threads`` process's threads by name (``thread_cpu_s``)."""
        assert self._task is not None
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task
        wall = time.perf_counter() - self._t0
        busy0, total0 = self._m0
        busy1, total1 = machine_ticks()
        c1 = self._cpu()
        out: dict[str, Any] = {"wall_s": round(wall, 3), "peak_mb": round(self.peak_mb, 1)}
        for name in self.groups:
            # a process that started after ``start`` counts from zero; one gone by ``stop`` is lost
            cpu = sum(v - self._c0[name].get(p, 0.0) for p, v in c1[name].items())
            out[name] = {"cpu_s": round(cpu, 2), "cores": round(cpu / wall, 2)}
        cores = os.cpu_count() or 1
        out["busy_cores"] = round((busy1 - busy0) / max(total1 - total0, 1) * cores, 2)
        # what the machine spent on processes outside the groups: other users, py-spy
        out["others_cores"] = round(
            max(out["busy_cores"] - sum(out[n]["cores"] for n in self.groups), 0.0), 2
        )
        if self.threads:
            spent = {k: v - self._threads0.get(k, 0.0) for k, v in thread_cpu(self.threads).items()}
            busiest = sorted(spent.items(), key=lambda kv: -kv[1])[:6]
            out["thread_cpu_s"] = {k: round(v, 2) for k, v in busiest if v > 0}
        return out


def top_functions(raw: str, k: int = 10) -> dict[str, Any]:
    """The ``k`` functions most often on top of the stack (``own``) and anywhere in it
    (``total``, the event loop's and thread pool's frames left out; ``ours``: the project's
    functions only), as shares of the samples,
    from ``py-spy record --format raw`` output (a ``frame;...;leaf count`` line a stack)."""
    own: Counter[str] = Counter()
    total: Counter[str] = Counter()
    ours: Counter[str] = Counter()
    samples = 0
    for line in raw.splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        frames = stack.split(";")
        samples += int(count)
        own[frames[-1]] += int(count)
        for frame in set(frames):
            if any(p in frame for p in PLUMBING):
                continue
            total[frame] += int(count)
            if any(f"({p}" in frame for p in OURS):
                ours[frame] += int(count)
    share = max(samples, 1)
    return {
        "samples": samples,
        "own": [(f, round(n / share, 3)) for f, n in own.most_common(k)],
        "total": [(f, round(n / share, 3)) for f, n in total.most_common(k)],
        "ours": [(f, round(n / share, 3)) for f, n in ours.most_common(k)],
    }


async def py_spy(spy: str, pid: int, seconds: float, out: Path) -> dict[str, Any]:
    """``py-spy record`` of ``pid`` for ``seconds``: the top functions of the thread holding the GIL."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    args = [spy, "record", "--pid", str(pid), "--duration", str(round(seconds)), "--rate", str(SPY_RATE),
            "--gil", "--nonblocking", "--function", "--format", "raw", "--output", str(out)]  # fmt: skip
    proc = await asyncio.create_subprocess_exec(*args, stdout=DEVNULL, stderr=PIPE)
    _, err = await proc.communicate()
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0 or not out.exists():
        return {"error": f"py-spy exited {proc.returncode}: {err.decode(errors='replace').strip()[-300:]}"}
    top = top_functions(out.read_text())
    top["gil_busy"] = round(top["samples"] / (SPY_RATE * seconds), 2)
    top["py_spy_cpu_s"] = round(after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime, 2)
    return top
