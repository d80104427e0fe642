"""The run's workspace on the worker's machines: each copy kept at the tree its run expects and
restored from the run's sink where it is not (``copies``), the worker's own task queue for the
runs it hosts (``hosting``), and what a run changed (``diff``). docs/workspaces.md.

Internal: the public API is ``durable_agent.__all__`` (import its names from ``durable_agent``);
this package may change between releases.
"""
