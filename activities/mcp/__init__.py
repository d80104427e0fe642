"""MCP (Model Context Protocol) servers: the connection to each (``connection``, over the
session task in ``session``, with a stdio server's stderr logged by ``stderr_log``), what the
model sees of their tools and results (``model_text``), and the worker's catalog of their tools
(``catalog``).

Internal: the public API is ``durable_agent.__all__`` (import its names from ``durable_agent``);
this package may change between releases.
"""
