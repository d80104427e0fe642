"""The error of the workspace's trees: a workspace that could not be recorded, or a tree that
could not be rebuilt (``workspace_tree.py``, ``workspaces/shadow.py``, ``workspaces/fetching.py``).
"""

from __future__ import annotations

from durable_agent.core.errors import DurableAgentError

__all__ = ["WorkspaceTreeError"]


class WorkspaceTreeError(DurableAgentError):
    """The workspace could not be recorded, or a tree rebuilt (git failed, objects missing)."""
