"""The ``cancel`` and ``end`` signals of a run whose worker takes only encrypted input.

A signal may come with no payload at all, which no codec sees, so anyone who can reach the
namespace could end anyone's run that way. A run whose plan says its worker's ``[codec]`` takes
only encrypted input (``RunPlan.sealed_signals``) counts these two signals only with an encrypted
``RunControl`` (a plain one is dropped before its handler: ``codec.py``); a bare one is dropped
and recorded. One that comes before the run has its plan waits for the plan to say.

A working run records a dropped signal at its next model request (``record``), not in the
handler: a handler runs first in its workflow task, before the task's time is known
(``StepClock``), and a signal that came while a lost task waited to run again is delivered in
its re-run, whose exports must be those of the lost one. A run that waits for its next prompt
exports nothing before its next request and records it at once.
"""

from __future__ import annotations

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from durable_agent.core.events import ErrorEvent
    from durable_agent.core.loop import LoopState
    from durable_agent.core.run_api import RunControl

from durable_agent.workflows.calls import now_ms

# What a ``cancel`` or ``end`` signal sent without a payload gives its handler (by identity).
BARE = RunControl()


class SignalGate:
    """Decides on each ``cancel`` and ``end`` (see the module docstring)."""

    def __init__(self) -> None:
        self._before_plan: list[str] = []  # bare ones that came before the run's plan
        self._held: list[str] = []  # what the dropped ones' records say, until ``record``

    def dropped(self, name: str, control: RunControl, state: LoopState | None, *, at_once: bool) -> bool:
        """Whether the signal ``name`` with ``control`` does not count.

        Args:
            name: ``cancel`` or ``end``.
            control: Its payload (``BARE``: none).
            state: The run's state (None: no plan yet; the signal is kept for ``early``).
            at_once: Record a dropped one now, not at the run's next request (``record``).

        Returns:
            True when it is dropped (or kept for later), False when it counts now.
        """
        if control is not BARE:
            return False
        if state is None:
            self._before_plan.append(name)
            return True
        if not state.plan.sealed_signals:
            return False
        message = (
            f"a {name!r} signal without an encrypted payload was dropped: this worker's [codec] "
            "takes only signals sent with its keys"
        )
        workflow.logger.warning(message)
        if at_once:
            state.journal.emit(ErrorEvent(message=message), now_ms())
        else:
            self._held.append(message)
        return True

    def record(self, state: LoopState) -> None:
        """Record the dropped signals held since the last time, stamped now.

        Args:
            state: The run's state.
        """
        held, self._held = self._held, []
        for message in held:
            state.journal.emit(ErrorEvent(message=message), now_ms())

    def early(self) -> list[str]:
        """The bare signals that came before the plan, in order, to judge again now that it is in."""
        early, self._before_plan = self._before_plan, []
        return early
