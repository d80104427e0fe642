"""The decisions of a pinned run about moving to a new build (``workflows/upgrading.py``), pure."""

from __future__ import annotations

import pytest

from durable_agent.workflows.upgrading import continue_reason, idle_left, moves_while_waiting


@pytest.mark.parametrize(
    ("can_carry", "changed", "suggested", "over", "reason"),
    [
        (True, True, False, False, "upgrade"),
        (True, True, True, True, "upgrade"),  # a move is a fresh history too
        (True, False, True, False, "history"),
        (True, False, False, True, "history"),
        (True, False, False, False, None),
        # the store lacks entries of the log: the next execution could not start from it
        (False, True, True, True, None),
    ],
)
def test_a_boundary_continues_as_new_to_move_or_for_its_history(
    can_carry: bool, changed: bool, suggested: bool, over: bool, reason: str | None
) -> None:
    got = continue_reason(
        can_carry=can_carry, target_changed=changed, history_suggested=suggested, history_over=over
    )
    assert got == reason


def waiting(**changes: bool) -> bool:
    facts = {
        "target_changed": True,
        "can_carry": True,
        "prompt_given": False,
        "end_requested": False,
        "cancel_requested": False,
        "rewinding": False,
    }
    return moves_while_waiting(**(facts | changes))


def test_a_waiting_run_moves_when_its_target_changed_and_nothing_else_came() -> None:
    assert waiting()
    assert not waiting(target_changed=False)
    assert not waiting(can_carry=False)


@pytest.mark.parametrize("came", ["prompt_given", "end_requested", "cancel_requested", "rewinding"])
def test_what_a_person_asked_for_comes_before_a_move(came: str) -> None:
    assert not waiting(**{came: True})


def test_the_idle_timeout_goes_on_after_a_move() -> None:
    assert idle_left(None, 0, 5_000) is None
    assert idle_left(60.0, 5_000, 5_000) == 60.0  # waits from now: the timeout as it is
    assert idle_left(60.0, 5_000, 25_000) == 40.0  # moved 20 s into its wait
    assert idle_left(60.0, 0, 90_000) == 0.001  # past it: closes at once
