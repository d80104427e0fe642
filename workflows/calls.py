"""How ``AgentRun`` calls its activities, and how a cancel stops them.

``CallRunner.run`` is the one way the workflow calls an activity: it takes the
activity's declaration (``durable_agent.core.activity_api``), so mypy checks
each call's input and result, and turns the declaration's options into
Temporal's timeouts and retry policy. ``Cancellation`` is the run's cancel flag
(the ``cancel`` signal, or a Temporal cancel request). The run's own failures
(``RunCancelled``, ``RunFailed``) and the helpers that read an activity's
failure live here too.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from datetime import timedelta
from functools import partial
from typing import Any, TypeVar, cast

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError, ApplicationError, CancelledError, FailureError

with workflow.unsafe.imports_passed_through():
    from durable_agent.core.activity_api import ActivityDecl
    from durable_agent.core.failures import STATE_MISSING
    from durable_agent.core.plan import Timeouts
    from durable_agent.core.run_log import LogRef

InT = TypeVar("InT")
OutT = TypeVar("OutT")

TEMPORAL_CANCEL_REASON = "cancelled by a Temporal cancel request"
# A cancel's reason is kept this long at most (as an approval's reason): a signal cannot be
# refused, and its reason travels on in the run's end record, the payload of an activity.
CANCEL_REASON_MAX_CHARS = 2000


class RunCancelled(Exception):
    """The run was asked to stop (the ``cancel`` signal or a Temporal cancel request)."""


class RunFailed(Exception):
    """A run error: the run ends ``failed`` with this message, recorded on the run."""


def _clock() -> StepClock | None:
    clock = getattr(workflow.instance(), "clock", None)
    return clock if isinstance(clock, StepClock) else None


def now_ms() -> int:
    """The time (epoch ms) to stamp what the run records now: the workflow's clock, or the time
    the run's ``StepClock`` holds for the current workflow task."""
    clock = _clock()
    if clock is not None:
        return clock.now_ms()
    return int(workflow.now().timestamp() * 1000)


def stamps_fixed() -> bool:
    """Whether everything this workflow task stamped is fixed by the history, so that a local
    activity may export it (a run recorded before ``stamps-fixed-by-history``: always)."""
    clock = _clock()
    return clock is None or not clock.fixed or clock.pinned()


def fix_stamps(fixed: bool) -> None:
    """Set whether this execution stamps by ``stamps-fixed-by-history`` (``StepClock``), asked in
    its first workflow task; if so, that task holds the execution's start (its first event)."""
    clock = _clock()
    if clock is None:
        return
    clock.fixed = fixed
    if fixed:
        clock.pin(int(workflow.info().workflow_start_time.timestamp() * 1000))


def pin_clock(at_ms: int | None) -> None:
    """Hold ``at_ms`` (a time the history fixes) for the rest of this workflow task, in a run that
    stamps by ``stamps-fixed-by-history`` (see ``StepClock``)."""
    clock = _clock()
    if clock is not None and clock.fixed and at_ms is not None:
        clock.pin(at_ms)


def _stamped(result: OutT) -> OutT:
    """``result``, its completion time held for the rest of the task (``StepClock``)."""
    at_ms = getattr(result, "completed_at_ms", None)
    pin_clock(at_ms if isinstance(at_ms, int) else None)
    return result


class StepClock:
    """The run's clock for what it records: the workflow task's time, or a time the history
    fixes, held for the rest of the task.

    A workflow task may export boundaries (local tool calls and the local checkpoint run within
    it). A worker that dies after an export, before the task completed, leaves the task to run
    again later, at another workflow time: whatever the task stamped must come out the same then,
    so the boundary is not exported twice with different content.

    Before ``stamps-fixed-by-history`` (``fixed`` false) only a task that took a model answer held
    a time, the answer's. Since, in every execution (``fixed``):

    - a task that took an activity result with a completion time (a model answer, a tool's
      output, a hook's outcome: ``completed_at_ms``) holds that time (``CallRunner.run``);
    - an execution's first task holds the execution's start (the history's first event);
    - a local activity that outlasts its workflow task (the SDK completes the task and goes on in
      a new one after 80 % of its timeout) keeps the time held when it started;
    - a local tool call runs as one only where the task holds a time (``stamps_fixed``), and what
      a signal's handler records waits for the run's next request (``signal_gate.py``).

    The pin holds while the workflow's time is that of the task it was set in: the next task
    unpins it.
    """

    def __init__(self) -> None:
        self._pinned: tuple[int, float] | None = None  # (the time held, the task's workflow time)
        # the execution stamps by ``stamps-fixed-by-history`` (``starting.ask_patches_first``)
        self.fixed = False

    def pin(self, at_ms: int | None) -> None:
        """Hold ``at_ms`` for the rest of the current workflow task (None: nothing to hold)."""
        self._pinned = None if at_ms is None else (at_ms, workflow.now().timestamp())

    def pinned(self) -> bool:
        """Whether a time is held in the current workflow task."""
        return self._pinned is not None and self._pinned[1] == workflow.now().timestamp()

    def now_ms(self) -> int:
        task_time = workflow.now().timestamp()
        if self._pinned is not None:
            at_ms, pinned_in = self._pinned
            if pinned_in == task_time:
                return at_ms
            self._pinned = None
        return int(task_time * 1000)

    def held(self) -> tuple[int, float]:
        """The time stamped now, and the task's: what ``keep`` holds on in a later task."""
        return self.now_ms(), workflow.now().timestamp()

    def keep(self, held: tuple[int, float]) -> None:
        """Hold ``held``'s time on, when the workflow task changed since (a local activity outlasted
        its task): the task it was taken in was completed early, and its time is in the history.
        A time the activity's result brought (``_stamped``) is held instead, as in any task."""
        if self.fixed and held[1] != workflow.now().timestamp() and not self.pinned():
            self._pinned = (held[0], workflow.now().timestamp())


def failure_detail(exc: ActivityError) -> str | None:
    """The first detail of the failure, where an activity put one (an export's digest)."""
    cause = exc.cause
    if isinstance(cause, ApplicationError) and cause.details and isinstance(cause.details[0], str):
        return cause.details[0]
    return None


def missing_state(exc: ActivityError) -> tuple[bool, LogRef | None]:
    """Whether the activity did not find the run's log state, and what the store holds instead."""
    cause = exc.cause
    if not isinstance(cause, ApplicationError) or cause.type != STATE_MISSING:
        return False, None
    head = cause.details[0] if cause.details else None
    return True, LogRef.model_validate(head) if head is not None else None


def as_activity_error(activity_type: str, failure: FailureError) -> ActivityError:
    """A local activity's failure reaches the workflow without the ``ActivityError`` around it
    that a remote one has; this puts it there, so both read the same (``exc.cause``)."""
    error = ActivityError(
        f"local activity {activity_type} failed",
        scheduled_event_id=0,
        started_event_id=0,
        identity="",
        activity_type=activity_type,
        activity_id="",
        retry_state=None,
    )
    error.__cause__ = failure
    return error


class Cancellation:
    """Whether the run was asked to stop, and why (the first reason given wins); and whether
    Temporal holds a cancel request for it, without which it cannot end Canceled."""

    def __init__(self) -> None:
        self.requested = False
        self.reason: str | None = None
        self.by_temporal = False

    def request(self, reason: str) -> None:
        if not self.requested:
            self.requested = True
            self.reason = reason[:CANCEL_REASON_MAX_CHARS]

    def temporal_request(self) -> None:
        """A Temporal cancel request reached the run (the UI, ``temporal workflow cancel``, or the
        run's own request after the ``cancel`` signal)."""
        self.by_temporal = True
        self.request(workflow.cancellation_reason() or TEMPORAL_CANCEL_REASON)

    def check(self) -> None:
        if self.requested:
            raise RunCancelled()


def _routing(task_queue: str | None, schedule_to_start_seconds: float | None) -> dict[str, Any]:
    """An ordinary activity's queue and its time to leave it; none named: the run's queue, with
    no such timeout, as every activity had before (``workflows/hosting.py``)."""
    if task_queue is None:
        return {}
    routing: dict[str, Any] = {"task_queue": task_queue}
    if schedule_to_start_seconds is not None:
        routing["schedule_to_start_timeout"] = timedelta(seconds=schedule_to_start_seconds)
    return routing


class CallRunner:
    """Runs activities by their declarations; a ``cancel`` interrupts the cancellable ones."""

    def __init__(self, cancellation: Cancellation) -> None:
        self._cancellation = cancellation

    async def run(
        self,
        decl: ActivityDecl[InT, OutT],
        arg: InT,
        *,
        summary: str,
        timeouts: Timeouts,
        cancellable: bool = True,
        local: bool = False,
        task_queue: str | None = None,
        schedule_to_start_seconds: float | None = None,
        max_attempts: int | None = None,
    ) -> OutT:
        """Run ``decl`` with ``arg`` under the options ``timeouts`` give it.

        ``local``: as a local activity, on this worker within the workflow task (no
        heartbeat: a worker that dies in it times the workflow task out, and another
        worker runs it again).

        ``task_queue``: on that queue rather than the run's (an ordinary activity: a run's host's
        own queue), which it must leave for a worker within ``schedule_to_start_seconds`` (then it
        fails with a ``SCHEDULE_TO_START`` timeout, which Temporal does not retry).
        ``max_attempts``: at most this many attempts, whatever ``timeouts`` say.

        ``cancellable``: the run's cancel stops the activity (Temporal waits for
        it to acknowledge), and the cancel flag is checked after the activity
        settles, whatever way it settles: an activity that completes normally
        while its cancellation is pending must not swallow the cancel. Without,
        a cancel is noted and the call runs to its end (the steps before the
        loop; a tool boundary's checkpoint, whose export the sink acknowledges
        before the run stops; and the run's end, which must reach the store
        even for a cancelled run).
        """
        clock = _clock()
        # a local activity that outlasts its workflow task goes on with the time held before it
        held = clock.held() if local and clock is not None and clock.fixed else None
        try:
            return await self._run(
                decl,
                arg,
                summary=summary,
                timeouts=timeouts,
                cancellable=cancellable,
                local=local,
                task_queue=task_queue,
                schedule_to_start_seconds=schedule_to_start_seconds,
                max_attempts=max_attempts,
            )
        finally:
            if clock is not None and held is not None:
                clock.keep(held)

    async def _run(
        self,
        decl: ActivityDecl[InT, OutT],
        arg: InT,
        *,
        summary: str,
        timeouts: Timeouts,
        cancellable: bool,
        local: bool,
        task_queue: str | None,
        schedule_to_start_seconds: float | None,
        max_attempts: int | None,
    ) -> OutT:
        """``run``, but for the time held across a local activity."""
        kind = workflow.ActivityCancellationType
        if not cancellable:
            # never cancelled (shielded): the SDK's default cancellation type, as recorded before
            plain = self._start(decl, arg, summary, timeouts, local, kind.TRY_CANCEL)
            try:
                return _stamped(await self._uncancelled(plain))
            except ActivityError:
                raise
            except FailureError as exc:  # a local activity's, bare
                raise as_activity_error(decl.name, exc) from exc
        handle = self._start(
            decl,
            arg,
            summary,
            timeouts,
            local,
            kind.WAIT_CANCELLATION_COMPLETED,
            task_queue=task_queue,
            schedule_to_start_seconds=schedule_to_start_seconds,
            max_attempts=max_attempts,
        )
        cancellation = self._cancellation
        try:
            await workflow.wait_condition(lambda: handle.done() or cancellation.requested)
        except asyncio.CancelledError:
            # A Temporal cancel request (UI, CLI) does not reach this activity by
            # itself: treat it as the cancel signal, so the activity stops too.
            cancellation.temporal_request()
        if not handle.done():
            handle.cancel()
        try:
            result = await handle
        except (ActivityError, CancelledError, asyncio.CancelledError):
            if cancellation.requested:
                raise RunCancelled() from None
            raise
        except FailureError as exc:
            if cancellation.requested:
                raise RunCancelled() from None
            raise as_activity_error(decl.name, exc) from exc
        _stamped(result)  # before the check: a cancel in this task records its end at that time
        cancellation.check()
        return result

    @staticmethod
    def _start(
        decl: ActivityDecl[InT, OutT],
        arg: InT,
        summary: str,
        timeouts: Timeouts,
        local: bool,
        cancellation_type: workflow.ActivityCancellationType,
        *,
        task_queue: str | None = None,
        schedule_to_start_seconds: float | None = None,
        max_attempts: int | None = None,
    ) -> workflow.ActivityHandle[OutT]:
        """Start ``decl`` (as a local activity with ``local``) with the options ``timeouts``
        give it: the one place they become Temporal's timeouts and retry policy."""
        options = decl.options(timeouts)
        start_to_close = timedelta(seconds=options.start_to_close_seconds)
        retry = RetryPolicy(
            initial_interval=timedelta(seconds=options.initial_interval_seconds),
            maximum_interval=(
                timedelta(seconds=options.maximum_interval_seconds)
                if options.maximum_interval_seconds is not None
                else None
            ),
            maximum_attempts=max_attempts or options.maximum_attempts,
        )
        heartbeat = options.heartbeat_seconds
        # the same options either way; a local activity takes no heartbeat timeout
        start: Callable[..., workflow.ActivityHandle[Any]] = (
            workflow.start_local_activity
            if local
            else partial(
                workflow.start_activity,
                heartbeat_timeout=timedelta(seconds=heartbeat) if heartbeat is not None else None,
                **_routing(task_queue, schedule_to_start_seconds),
            )
        )
        handle = start(
            decl.name,
            arg,
            result_type=decl.result_type,
            start_to_close_timeout=start_to_close,
            retry_policy=retry,
            cancellation_type=cancellation_type,
            summary=summary,
        )
        return cast(workflow.ActivityHandle[OutT], handle)

    async def _uncancelled(self, handle: workflow.ActivityHandle[OutT]) -> OutT:
        """The activity's result, which a Temporal cancel request does not stop: it is noted
        (the loop stops at its next check) and the activity goes on (the run's start, and its
        end, which must reach the store even for a cancelled run)."""
        while True:
            try:
                return await asyncio.shield(handle)
            except asyncio.CancelledError:
                if handle.done() and handle.cancelled():
                    raise
                self._cancellation.temporal_request()
