"""The model provider seam: every provider, scripted or HTTP, behind one protocol.

The ``agent.model_call`` activity looks the provider up by the ``provider``
part of ``"provider/model"`` and calls ``complete``. A provider raises
``ProviderError`` for failures it understands; the activity turns that into a
retryable or non-retryable Temporal error. HTTP providers add their kinds here.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from datetime import timedelta
from typing import Protocol

from durable_agent.config import ConfigError
from durable_agent.core.activity_api import ModelCallInput
from durable_agent.core.errors import DurableAgentError
from durable_agent.core.models import ContentBlock, Message, ModelResponse, TokenUsage


class ProviderError(DurableAgentError):
    """A model call failed. ``retryable`` and ``retry_after`` steer Temporal's retry.

    ``context_overflow``: the server refused the request because it is larger
    than the model's context window. Not retryable as it stands; a smaller
    request (the conversation compacted) may succeed.
    """

    def __init__(
        self,
        message: str,
        *,
        retryable: bool,
        retry_after: timedelta | None = None,
        context_overflow: bool = False,
    ) -> None:
        super().__init__(message)
        self.retryable = retryable
        self.retry_after = retry_after
        self.context_overflow = context_overflow


# Where a streaming provider hands each piece of the answer's text as it arrives.
TextSink = Callable[[str], None]


class LiveParts:
    """The pieces of a streaming answer as they arrive, its text and its thinking kept apart.

    The model activity passes one as ``on_text``: calling it adds a piece of answer text, so a
    provider that knows nothing of thinking streams its text as before, and ``thinking`` adds
    a piece of the model's reasoning (``thinking_sink`` finds it), which a follower shows as
    thinking, never as the answer.
    """

    def __init__(self) -> None:
        self.text: list[str] = []
        self.thought: list[str] = []

    def __call__(self, text: str) -> None:
        self.text.append(text)

    def thinking(self, text: str) -> None:
        """Add a piece of the model's reasoning.

        Args:
            text: the piece, as the provider streamed it.
        """
        self.thought.append(text)


def _nowhere(text: str) -> None:
    """A sink for thinking that nobody watches."""


def thinking_sink(on_text: TextSink) -> TextSink:
    """Where a provider hands the pieces of the model's thinking as they arrive.

    Args:
        on_text: the sink ``complete`` was given.

    Returns:
        Its ``thinking`` when it is a ``LiveParts`` (the model activity's); otherwise (a host's
        own caller, a test that collects text in a list) a sink that drops them, since a
        plain text sink would show the thinking as the answer.
    """
    return on_text.thinking if isinstance(on_text, LiveParts) else _nowhere


def assistant_step(
    blocks: Iterable[ContentBlock], usage: TokenUsage, stop_reason: str | None
) -> ModelResponse:
    """A model step that answered with ``blocks``, in their order, as the assistant's message.

    Args:
        blocks: the answer's thinking, text and tool uses.
        usage: the tokens the step cost.
        stop_reason: why the model stopped (the Messages vocabulary: ``end_turn``, ``tool_use``...).

    Returns:
        The step.
    """
    message = Message(role="assistant", content=tuple(blocks))
    return ModelResponse(message=message, usage=usage, stop_reason=stop_reason)


class ModelProvider(Protocol):
    """One model vendor's wire protocol.

    ``complete`` returns the whole step; a streaming provider also hands each
    piece of answer text to ``on_text`` as it arrives, so followers see it live, and
    each piece of its thinking to ``thinking_sink(on_text)``, which keeps it apart.
    """

    async def complete(self, call: ModelCallInput, model: str, on_text: TextSink) -> ModelResponse: ...


def read_credential(env_var: str, provider: str) -> str:
    """The provider's key from the worker's environment; a clear error if unset."""
    value = os.environ.get(env_var)
    if not value:
        raise ConfigError(
            f"provider {provider!r} needs a credential in the environment variable "
            f"{env_var}, which is not set on this worker"
        )
    return value
