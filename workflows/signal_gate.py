"""The ``cancel`` and ``end`` signals of a run whose worker takes only encrypted input.

A signal may come with no payload at all, which no codec sees, so anyone who can reach the
namespace could end anyone's run that way. A run whose plan says its worker's ``[codec]`` takes
only encrypted input (``RunPlan.sealed_signals``) counts these two signals only with an encrypted
``RunControl`` (a plain one is dropped before its handler: ``codec.py``); a bare one is dropped
and recorded. One that comes before the run has its plan waits for the plan to say.
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

    def dropped(self, name: str, control: RunControl, state: LoopState | None) -> bool:
        """Whether the signal ``name`` with ``control`` does not count.

        Args:
            name: ``cancel`` or ``end``.
            control: Its payload (``BARE``: none).
            state: The run's state (None: no plan yet; the signal is kept for ``early``).

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
        state.journal.emit(ErrorEvent(message=message), now_ms())
        return True

    def early(self) -> list[str]:
        """The bare signals that came before the plan, in order, to judge again now that it is in."""
        early, self._before_plan = self._before_plan, []
        return early
