"""The session store: the protocol (``base``), on disk (``filesystem``), in memory
(``memory``), and the worker's cache of folded logs (``cache``)."""

from durable_agent.activities.store.base import SessionStore
from durable_agent.activities.store.filesystem import FilesystemSessionStore
from durable_agent.activities.store.memory import MemorySessionStore

__all__ = ["FilesystemSessionStore", "MemorySessionStore", "SessionStore"]
