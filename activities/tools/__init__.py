"""Tools: what a tool is (``tool``), the built-in ones (``fs``, ``search`` with how grep reads
a file in ``grep_lines``, ``bash``), the sandbox ``bash`` runs in, the link-aware permission
check (``path_guard``), and the built-in set by name (``builtin``).

Internal: the public API is ``durable_agent.__all__`` (import its names from ``durable_agent``);
this package may change between releases.
"""

from durable_agent.activities.tools.builtin import builtin_tools
from durable_agent.activities.tools.tool import Tool, ToolFailure

__all__ = ["Tool", "ToolFailure", "builtin_tools"]
