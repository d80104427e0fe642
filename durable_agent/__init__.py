"""Durable agent runtime: the shared contracts (models, checkpoints, config).

The modules the workflow imports (``models``, ``checkpoint``, ``canonical``,
``permissions``, ``globs``, ``tool_specs``, ``tool_args``, ``run_io``, ``loop``,
``errors``) are pure: no I/O, safe inside the Temporal workflow sandbox. The
client side (``client``, ``cli``, ``demo``, ``devserver``) and ``config`` do I/O.
"""

__version__ = "0.1.0"
