"""Workflows: the deterministic agent loop."""

from workflows.agent_run import AgentRun

__all__ = ["AgentRun"]
