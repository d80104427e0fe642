"""Workflows: the deterministic agent loop.

Internal: the public API is ``durable_agent.__all__`` (import its names from ``durable_agent``);
this package may change between releases.
"""

from durable_agent.workflows.agent_run import AgentRun

__all__ = ["AgentRun"]
