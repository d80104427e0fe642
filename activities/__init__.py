"""Activities: every side effect of an agent run (model calls, tools, store, sinks).

Internal: the public API is ``durable_agent.__all__`` (import its names from ``durable_agent``);
this package may change between releases.
"""

from durable_agent.activities.agent import AgentActivities

__all__ = ["AgentActivities"]
