"""The pure core: what a run is made of, with no Temporal and no I/O.

Messages and events (``models``), the export contract v1 (``export``,
``canonical``), the run's log (``run_log``), the loop's state and step logic
(``loop``), the permission language (``permissions``; ``shell_judge``, ``shell_words``,
``shell_commands`` for ``bash``; ``globs``), the tools' specs and arguments (``tool_specs``, ``tool_args``),
the run's plan (``plan``), the workflow's and activities' inputs and outputs
(``run_api``, ``activity_api``), bounded JSON (``json_limits``), and the shapes
from before linear history (``legacy``). ``tests/test_layers.py`` keeps it pure.
"""
