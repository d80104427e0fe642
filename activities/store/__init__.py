"""The session store: the protocol (``session_store``), on disk (``filesystem``), in memory
(``memory``), and the worker's cache of folded logs (``run_log_cache``).

Internal: the public API is ``durable_agent.__all__`` (import its names from ``durable_agent``);
this package may change between releases.
"""

from durable_agent.activities.store.filesystem import FilesystemSessionStore
from durable_agent.activities.store.memory import MemorySessionStore
from durable_agent.activities.store.session_store import SessionStore

__all__ = ["FilesystemSessionStore", "MemorySessionStore", "SessionStore"]
