"""Moving a pinned run to its worker deployment's new build, at a safe point (docs/deploys.md).

A run on a versioned worker is pinned to the build that started it (PINNED, the versioned
worker's default behaviour: ``durable_agent/deployments.py``): every workflow task of its execution
goes to that build, so a deploy never replays its history on other code. When its deployment's
current (or ramping) build changes, the server says so in each workflow task
(``is_target_worker_deployment_version_changed``); the run then continues as new with
``AUTO_UPGRADE`` as its next execution's initial behaviour, and that execution starts on the new
build, from the ``CarriedState`` only (whose schema both builds read).

Where a run moves, and where not (``continue_reason``, ``moves_while_waiting``):

- at a tool boundary whose export the sink acknowledged, where it would continue as new for its
  history's size (``Starter.should_continue_as_new``): never between the calls of one answer while
  a later call holds a person's decision (``call_batch.py``), which the next execution would not
  know;
- while it waits for its next prompt (its idle wait), once something wakes it: the ``upgrade``
  signal (``durable-agent upgrade``), since a run that waits has no workflow task of its own;
- not while a call waits for a person's decision: the run moves at that call's boundary, once
  decided (or denied at its timeout), so the decision is made and used on the build that asked.

Needs no ``workflow.patched``: every new decision reads what the history records (the flag is in
each ``WorkflowTaskStarted`` event, the signal is an event), and the histories recorded before
hold neither, so they replay as they ran.
"""

from __future__ import annotations

from typing import Literal

from temporalio import workflow

Reason = Literal["history", "upgrade"]


def continue_reason(
    *, can_carry: bool, target_changed: bool, history_suggested: bool, history_over: bool
) -> Reason | None:
    """Why a run at a tool boundary continues as new now, if it does.

    Args:
        can_carry: the store holds every entry of the run's log, so the next execution can
            start from a reference to it (``RunJournal.can_carry``).
        target_changed: the run's deployment has a new current or ramping build for it.
        history_suggested: Temporal suggests continuing as new.
        history_over: the history is past the plan's ``continue_as_new_events`` or ``_bytes``.

    Returns:
        ``"upgrade"``: to move to the new build; ``"history"``: for a fresh history on this
            build; None: not now.
    """
    if not can_carry:
        return None
    if target_changed:
        return "upgrade"
    return "history" if history_suggested or history_over else None


def moves_while_waiting(
    *,
    target_changed: bool,
    can_carry: bool,
    prompt_given: bool,
    end_requested: bool,
    cancel_requested: bool,
    rewinding: bool,
) -> bool:
    """Whether a run that waits for its next prompt moves to the new build now.

    Anything a person asked for meanwhile comes first: a prompt is answered (the run moves at its
    next boundary or wait), ``end`` and a cancel close the run, a rewind goes on from its turn.

    Args:
        target_changed: the run's deployment has a new current or ramping build for it.
        can_carry: the store holds every entry of the run's log.
        prompt_given: a next prompt came.
        end_requested: ``end`` came.
        cancel_requested: a cancel came.
        rewinding: a ``rewind`` update is restoring files, or is due.

    Returns:
        Whether to continue as new onto the new build.
    """
    busy = prompt_given or end_requested or cancel_requested or rewinding
    return target_changed and can_carry and not busy


def idle_left(timeout: float | None, since_ms: int, now_ms: int) -> float | None:
    """How long a run that waits for its next prompt still waits before its idle timeout closes
    it: a run that moved while it waited goes on with the time it had left.

    Args:
        timeout: the plan's ``idle_timeout_seconds`` (None: it waits for ever).
        since_ms: when it began to wait (epoch ms): now, unless it moved while waiting.
        now_ms: the workflow's time now (epoch ms).

    Returns:
        Seconds (``timeout`` itself when it begins to wait now; a millisecond at least), or None.
    """
    if timeout is None or since_ms == now_ms:
        return timeout
    return max(timeout - (now_ms - since_ms) / 1000, 0.001)


def target_changed() -> bool:
    """Whether the run's deployment has a new target build for it (this workflow task's word).

    Returns:
        False on an unversioned worker, and for a run that is not pinned.
    """
    return workflow.info().is_target_worker_deployment_version_changed()


def build_id() -> str | None:
    """The build this workflow task runs on, for the run's details.

    Returns:
        The worker's build id; None on an unversioned worker.
    """
    version = workflow.info().get_current_deployment_version()
    return version.build_id if version is not None else None


class Upgrades:
    """What the ``upgrade`` signal asked: how many times (a wake-up; the move itself reads the
    server's word, ``target_changed``)."""

    def __init__(self) -> None:
        self.asked = 0

    def ask(self) -> None:
        """The ``upgrade`` signal came: the run's next workflow task looks for a new build."""
        self.asked += 1
