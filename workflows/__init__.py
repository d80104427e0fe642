"""Workflows: the deterministic agent loop."""

from durable_agent.workflows.agent_run import AgentRun

__all__ = ["AgentRun"]
