"""Model providers: the protocol (``model_provider``), the scripted model, the HTTP providers
(``http``, ``openai``, ``anthropic``), and the set a config names (``from_config``).

Internal: the public API is ``durable_agent.__all__`` (import its names from ``durable_agent``);
this package may change between releases.
"""

from durable_agent.activities.providers.from_config import build_providers
from durable_agent.activities.providers.model_provider import (
    LiveParts,
    ModelProvider,
    ProviderError,
    TextSink,
    thinking_sink,
)
from durable_agent.activities.providers.scripted import ScriptedProvider

__all__ = [
    "LiveParts",
    "ModelProvider",
    "ProviderError",
    "ScriptedProvider",
    "TextSink",
    "build_providers",
    "thinking_sink",
]
