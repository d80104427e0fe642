"""A worker's workflow-task slots: many for the runs it holds, few for runs it must replay.

A workflow task reaches a worker by one of two queues. Its own sticky queue brings the
next task of a run it holds in memory: cheap, a few milliseconds of workflow code. The
task queue all workers share brings a run's first task, and the tasks of runs it does not
hold, whose history it replays whole first: a run another worker ran until it died, or one
this worker dropped from its cache. A replay takes seconds of CPU for a long run, and
replays run one at a time on Python's one interpreter thread: taken ten at once after a
takeover, each waits for the others, passes the 3 s workflow-task timeout and starts again.

So a worker takes at most ``shared`` tasks from the shared queue at once, and up to
``total`` in all: ``WorkflowTaskSlots`` gives Temporal's poller a slot for a shared-queue
poll only while fewer than ``shared`` are out. Measured on 2 cores (``docs/costs.md``):
with 4 slots in all, 20 runs at once made 19 steps a second, waiting for slots; with 100
in all, 4 of them shared, 29, and a takeover keeps the 4-slot time.
"""

from __future__ import annotations

import asyncio
import threading

from temporalio.worker import (
    CustomSlotSupplier,
    FixedSizeSlotSupplier,
    SlotMarkUsedContext,
    SlotPermit,
    SlotReleaseContext,
    SlotReserveContext,
    WorkerTuner,
)

# Temporal's default for each kind of slot; ours for activities, local activities and Nexus tasks.
SDK_SLOTS = 100


class QueuePermit(SlotPermit):
    """A slot given for a poll of the sticky queue or of the shared one."""

    def __init__(self, sticky: bool) -> None:
        self.sticky = sticky
        self.used = False  # a task came with it
        self.released = False


class WorkflowTaskSlots(CustomSlotSupplier):
    """Workflow-task slots: ``total`` in all, at most ``shared`` of them for the shared queue,
    and while a task from the shared queue is worked on (a replay, most likely), no more than
    ``shared`` tasks at once: a replay does not share the core with many runs' steps.

    Temporal's core calls ``reserve_slot`` before each poll, from the worker's event loop,
    and the others from its own threads: the counts are kept under a lock, and a waiting
    reservation is woken on its own loop.
    """

    def __init__(self, total: int, shared: int) -> None:
        """Args:
        total: the most workflow tasks at once.
        shared: the most of them from the shared task queue (``1 <= shared <= total``).
        """
        if not 1 <= shared <= total:
            raise ValueError(f"shared slots must be from 1 to the total ({total}), not {shared}")
        self.total = total
        self.shared = shared
        self._lock = threading.Lock()
        self._out = 0  # permits given, not released
        self._shared_out = 0
        self._busy = 0  # permits a task came with, not released
        self._shared_busy = 0
        self._waiting: list[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]] = []

    @property
    def in_use(self) -> tuple[int, int, int, int]:
        """Slots given and not released yet: ``(all, shared)``, then those a task came with."""
        with self._lock:
            return self._out, self._shared_out, self._busy, self._shared_busy

    def _take(self, sticky: bool) -> QueuePermit | None:
        """A permit if one is free (the lock held)."""
        if self._out >= self.total or (not sticky and self._shared_out >= self.shared):
            return None
        if sticky and self._shared_busy and self._busy >= self.shared:
            return None  # a replay is on: the steps of runs held wait their turn with it
        self._out += 1
        self._shared_out += not sticky
        return QueuePermit(sticky)

    async def reserve_slot(self, ctx: SlotReserveContext) -> SlotPermit:
        loop = asyncio.get_running_loop()
        while True:
            with self._lock:
                permit = self._take(ctx.is_sticky)
                if permit is not None:
                    return permit
                waiter: asyncio.Future[None] = loop.create_future()
                self._waiting.append((loop, waiter))
            try:
                await waiter
            finally:
                with self._lock:
                    if (loop, waiter) in self._waiting:
                        self._waiting.remove((loop, waiter))

    def try_reserve_slot(self, ctx: SlotReserveContext) -> SlotPermit | None:
        # an eager task (a run started with its first task): counted as the shared queue's
        with self._lock:
            return self._take(ctx.is_sticky)

    def mark_slot_used(self, ctx: SlotMarkUsedContext) -> None:
        permit = ctx.permit
        if not isinstance(permit, QueuePermit):
            return
        with self._lock:
            if permit.used or permit.released:
                return
            permit.used = True
            self._busy += 1
            self._shared_busy += not permit.sticky

    def release_slot(self, ctx: SlotReleaseContext) -> None:
        permit = ctx.permit
        if not isinstance(permit, QueuePermit):
            return
        with self._lock:
            if permit.released:
                return
            permit.released = True
            self._out -= 1
            self._shared_out -= not permit.sticky
            if permit.used:
                self._busy -= 1
                self._shared_busy -= not permit.sticky
            # few wait (one per poller): each tries again
            waiting, self._waiting = self._waiting, []
        for loop, waiter in waiting:
            loop.call_soon_threadsafe(_wake, waiter)


def _wake(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)


def worker_tuner(
    total: int,
    shared: int,
    *,
    activities: int | None = None,
    local_activities: int | None = None,
    nexus_tasks: int | None = None,
) -> WorkerTuner:
    """A tuner with ``WorkflowTaskSlots(total, shared)`` for workflow tasks and fixed slots for
    the rest (Temporal's default, 100, for each kind not given).

    Args:
        total: the most workflow tasks at once.
        shared: the most of them from the shared task queue.
        activities: the most activities at once.
        local_activities: the most local activities at once.
        nexus_tasks: the most Nexus tasks at once.

    Returns:
        The tuner to give ``Worker(tuner=...)``.
    """
    return WorkerTuner.create_composite(
        workflow_supplier=WorkflowTaskSlots(total, shared),
        activity_supplier=FixedSizeSlotSupplier(activities or SDK_SLOTS),
        local_activity_supplier=FixedSizeSlotSupplier(local_activities or SDK_SLOTS),
        nexus_supplier=FixedSizeSlotSupplier(nexus_tasks or SDK_SLOTS),
    )
