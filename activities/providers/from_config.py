"""The providers a worker's config names, built once at worker start."""

from __future__ import annotations

from durable_agent.activities.providers.anthropic import AnthropicProvider
from durable_agent.activities.providers.model_provider import ModelProvider
from durable_agent.activities.providers.openai import OpenAIProvider
from durable_agent.activities.providers.openai_responses import OpenAIResponsesProvider
from durable_agent.activities.providers.scripted import ScriptedProvider
from durable_agent.config import AgentConfig, OpenAIProviderConfig, ScriptedProviderConfig


def build_providers(config: AgentConfig) -> dict[str, ModelProvider]:
    """Build every configured provider; raises ``ConfigError`` on the first bad one.

    Credentials are read here, so a worker missing one refuses to start.
    """
    providers: dict[str, ModelProvider] = {}
    for name, pc in config.providers.items():
        if isinstance(pc, ScriptedProviderConfig):
            providers[name] = ScriptedProvider.from_config(name, pc)
        elif isinstance(pc, OpenAIProviderConfig):
            # One kind, two protocols: Chat Completions, or the Responses API (``api``).
            wire = OpenAIResponsesProvider if pc.api == "responses" else OpenAIProvider
            providers[name] = wire.from_config(name, pc)
        else:
            providers[name] = AnthropicProvider.from_config(name, pc)
    return providers
