"""What a run admits from outside: a person's messages, the steers that wait, and the history's
room for them.

An update a validator lets through enters the history, and its text later travels in the
payloads of the run's activities (the model step's pending events, the boundary's save, the
continue-as-new input). Temporal fails a workflow task whose payloads pass 2 MiB, and
terminates a run whose history passes its limit: an update accepted past either would wedge
the run or lose it, after the client was told it was taken. So each is checked here, in the
validators, against the run's ``[limits]`` (``durable_agent.core.plan.Limits``), and refused
with a typed ``ApplicationError`` (``core.failures``: ``InputTooLarge``, ``SteerQueueFull``,
``HistoryLimit``) that the client sees as the update's failure; the run goes on untouched. What
a validator accepts, the run then does: an update's reported outcome is its outcome.
"""

from __future__ import annotations

from temporalio import workflow
from temporalio.exceptions import ApplicationError

with workflow.unsafe.imports_passed_through():
    from durable_agent.core.canonical import canonical_bytes
    from durable_agent.core.failures import HISTORY_FULL, INPUT_TOO_LARGE, QUEUE_FULL
    from durable_agent.core.plan import Limits

# Room kept in the history for what an update brings besides its text: its own events, the
# workflow task that handles it, the model step or save that carries the text on.
UPDATE_OVERHEAD_BYTES = 64 * 1024
UPDATE_OVERHEAD_EVENTS = 16
# A message's text enters the history in its update, then in the model step that reads it
# and in the boundary's save that keeps it: counted this many times against the history.
HISTORY_COPIES = 3


def json_size(text: str) -> int:
    """The bytes ``text`` takes in a payload: its JSON string (escapes included), UTF-8."""
    return len(canonical_bytes(text))


def rejected(message: str, kind: str) -> ApplicationError:
    """A validator's typed refusal: the update fails with ``kind``, and is never retried."""
    return ApplicationError(message, type=kind, non_retryable=True)


class Admission:
    """Checks what a run is sent against its limits, and keeps count of the steers that wait."""

    def __init__(self) -> None:
        # JSON bytes of the user messages queued for the model's next request
        self.queued_bytes = 0

    def queued(self, text: str) -> None:
        """A user message joined the queue (a steer, a follow-up, a resumed run's prompt)."""
        self.queued_bytes += json_size(text)

    def taken(self) -> None:
        """The model's next request took every queued message."""
        self.queued_bytes = 0

    @staticmethod
    def message(text: str, limits: Limits, what: str) -> int:
        """``text``'s size, or ``InputTooLarge`` past ``max_message_bytes``.

        Args:
            text: A person's message.
            limits: The run's limits.
            what: What it came as (``prompt``, ``steer``), for the reason.

        Returns:
            Its size in a payload, bytes.
        """
        size = json_size(text)
        if size > limits.max_message_bytes:
            raise rejected(
                f"the {what} is {size} bytes as JSON, over [limits] max_message_bytes="
                f"{limits.max_message_bytes}: send a shorter message (or the text as a file in the "
                "workspace, and ask the model to read it)",
                INPUT_TOO_LARGE,
            )
        return size

    def steer_room(self, waiting: int, size: int, limits: Limits) -> None:
        """``SteerQueueFull`` when one more steer of ``size`` bytes would pass the queue's bounds.

        Args:
            waiting: How many user messages wait for the model's next request.
            size: The new steer's size, bytes.
            limits: The run's limits.
        """
        if waiting + 1 > limits.max_queued_messages or self.queued_bytes + size > limits.max_queued_bytes:
            raise rejected(
                f"{waiting} message(s) of {self.queued_bytes} bytes already wait for the model's next "
                f"request ([limits] max_queued_messages={limits.max_queued_messages}, "
                f"max_queued_bytes={limits.max_queued_bytes}): steer again once it has taken them",
                QUEUE_FULL,
            )

    def history_room(self, limits: Limits, size: int) -> None:
        """``HistoryLimit`` when an update carrying ``size`` bytes of text would take the history
        past ``max_history_bytes`` or ``max_history_events`` (the run's own check stops it there).

        Args:
            limits: The run's limits.
            size: The text the update brings, bytes.
        """
        info = workflow.info()
        length, now = info.get_current_history_length(), info.get_current_history_size()
        # what this workflow task accepted already is not in ``now`` yet: the queue holds it
        projected = now + self.queued_bytes + HISTORY_COPIES * size + UPDATE_OVERHEAD_BYTES
        if (
            projected > limits.max_history_bytes
            or length + UPDATE_OVERHEAD_EVENTS > limits.max_history_events
        ):
            raise rejected(
                f"the run's history holds {length} events, {now} bytes: this update would take it past "
                f"[limits] max_history_events={limits.max_history_events} or max_history_bytes="
                f"{limits.max_history_bytes}",
                HISTORY_FULL,
            )
