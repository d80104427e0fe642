"""Durable agent runtime on Temporal.

Layers, bottom up (``tests/test_layers.py`` enforces them):

- ``durable_agent.core``: the pure contracts (models, the export contract, the loop, the
  permission judge): no I/O and no Temporal, safe inside the workflow sandbox.
- ``durable_agent.workflows``: the ``AgentRun`` workflow (core + Temporal).
- ``durable_agent.config`` (the TOML config), ``durable_agent.client`` and
  ``durable_agent.devserver`` (reaching Temporal).
- ``durable_agent.activities``: the I/O (models, tools, stores, sinks).
- ``durable_agent.worker``: a worker for all of the above (``python worker.py``).
- ``durable_agent.cli``: the ``durable-agent`` command, on top.

This file imports nothing, so importing the core never pulls in the rest.
"""

__version__ = "0.1.0"
