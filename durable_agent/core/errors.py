"""The root of the errors a host sees, and error messages a person can act on."""

from __future__ import annotations

from pydantic import ValidationError


class DurableAgentError(Exception):
    """The root of the errors this package raises to a host, or that a host's own code raises
    to it (a sink's ``SinkError``, a provider's ``ProviderError``, a store's ``StateMissing``):
    ``except DurableAgentError`` catches any of them. Each keeps its older base too
    (``ConfigError`` is still a ``ValueError``). The failure types a workflow or a client reads
    are ``durable_agent.core.failures``."""


def validation_problems(exc: ValidationError) -> list[str]:
    """A pydantic error as ``field.path: problem`` lines, without pydantic's links and reprs."""
    return [f"{'.'.join(str(p) for p in e['loc']) or '(top level)'}: {e['msg']}" for e in exc.errors()]


def validation_message(exc: ValidationError) -> str:
    """The same problems on one line."""
    return "; ".join(validation_problems(exc))
