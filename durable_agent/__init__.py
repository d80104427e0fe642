"""Durable agent runtime: the shared contracts (models, checkpoints, config).

Everything in this package except the modules named in ``IO_MODULES`` is pure:
it does no I/O and may be imported inside the Temporal workflow sandbox.
"""

__version__ = "0.1.0"
