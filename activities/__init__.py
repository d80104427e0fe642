"""Activities: every side effect of an agent run (model calls, tools, store, sinks)."""

from durable_agent.activities.agent import AgentActivities

__all__ = ["AgentActivities"]
