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


TextSink = Callable[[str], None]


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
    piece of answer text to ``on_text`` as it arrives, so followers see it live.
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
