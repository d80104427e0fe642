"""The session store: the protocol (``session_store``), on disk (``filesystem``), in memory
(``memory``), and the worker's cache of folded logs (``run_log_cache``)."""

from durable_agent.activities.store.filesystem import FilesystemSessionStore
from durable_agent.activities.store.memory import MemorySessionStore
from durable_agent.activities.store.session_store import SessionStore

__all__ = ["FilesystemSessionStore", "MemorySessionStore", "SessionStore"]
