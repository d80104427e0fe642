"""What the store and sink checks share: how a check is written, skipped and run."""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable, Mapping
from typing import TypeVar

from durable_agent.core.errors import DurableAgentError

S = TypeVar("S")

#: A check: an async function given a fresh store or sink that returns normally when the
#: implementation behaves as the contract says and raises ``AssertionError`` (saying what
#: differed) when it does not.
Check = Callable[[S], Awaitable[None]]

#: Makes a fresh, empty subject for one check: a plain or an async callable.
Factory = Callable[[], S | Awaitable[S]]


def registry(checks: dict[str, Check[S]]) -> Callable[[Check[S]], Check[S]]:
    """A decorator that adds each check it marks to ``checks``, by name, in the order defined.

    Args:
        checks: the checks of one kind of subject (``STORE_CHECKS``, ``SINK_CHECKS``).

    Returns:
        The decorator; it gives the check back unchanged.
    """

    def register(check: Check[S]) -> Check[S]:
        checks[check.__name__] = check
        return check

    return register


class CheckSkipped(Exception):
    """The check does not apply to this implementation (a sink without ``fetch``)."""


class ConformanceError(DurableAgentError, AssertionError):
    """One or more checks failed; ``failures`` maps each failed check's name to its error."""

    def __init__(self, subject: str, failures: Mapping[str, BaseException]) -> None:
        self.failures = dict(failures)
        lines = [f"{name}: {type(error).__name__}: {error}" for name, error in self.failures.items()]
        super().__init__(f"{subject} failed {len(lines)} conformance check(s):\n  " + "\n  ".join(lines))


async def fresh(make: Factory[S]) -> S:
    """What ``make`` gives, awaited when it is a coroutine."""
    subject = make()
    if inspect.isawaitable(subject):
        return await subject
    return subject


async def run_checks(subject: str, checks: Mapping[str, Check[S]], make: Factory[S]) -> list[str]:
    """Run every check on its own fresh subject from ``make``; return the names of the skipped.

    Raises ``ConformanceError`` naming every check that failed (all of them run first).
    """
    failures: dict[str, BaseException] = {}
    skipped: list[str] = []
    for name, check in checks.items():
        try:
            await check(await fresh(make))
        except CheckSkipped:
            skipped.append(name)
        except Exception as error:  # every failure is reported, by check
            failures[name] = error
    if failures:
        raise ConformanceError(subject, failures)
    return skipped
