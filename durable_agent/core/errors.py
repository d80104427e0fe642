"""Error messages a person can act on."""

from __future__ import annotations

from pydantic import ValidationError


def validation_problems(exc: ValidationError) -> list[str]:
    """A pydantic error as ``field.path: problem`` lines, without pydantic's links and reprs."""
    return [f"{'.'.join(str(p) for p in e['loc']) or '(top level)'}: {e['msg']}" for e in exc.errors()]


def validation_message(exc: ValidationError) -> str:
    """The same problems on one line."""
    return "; ".join(validation_problems(exc))
