"""The ``durable-agent`` command line: runs, approvals, exports, the demo.

Internal: the ``durable-agent`` command and its options are the interface, not these
modules (the public API is ``durable_agent.__all__``); they may change between releases.
"""
