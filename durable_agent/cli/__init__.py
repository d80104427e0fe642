"""The ``durable-agent`` command line: runs, approvals, exports, the demo."""
