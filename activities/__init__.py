"""Activities: every side effect of an agent run (model calls, tools, store, sinks)."""

from activities.agent import AgentActivities

__all__ = ["AgentActivities"]
