"""The pure core: what a run is made of, with no Temporal and no I/O.

Messages, content blocks and events (``models``; images in them: ``images``), the export
contract v1 (``export``, ``canonical``, ``export_parts``), the run's log (``run_log``), the
loop's state and step logic (``loop``), the model's view of the conversation (``context``),
the permission language (``permissions``; for ``bash``: ``shell_judge``, ``shell_words``,
``shell_commands``, ``shell_tree``, and what a line hides from the rules: ``shell_unseen``,
``rule_reach``; ``globs``), the tools' specs, arguments and built-in catalog (``tool_specs``,
``tool_args``, ``builtin_catalog``),
the run's plan (``plan``), the workflow's and activities' inputs and outputs (``run_api``,
``activity_api``), bounded JSON and text a payload can carry (``json_limits``,
``surrogates``), the failure types a workflow or a client reads (``failures``), the root of
the errors a host sees (``errors``), and the shapes from before linear history (``legacy``).
``tests/test_layers.py`` keeps it pure.

Internal: the public API is ``durable_agent.__all__`` (import its names from ``durable_agent``);
this package may change between releases, but for the models of the export format and of the
run's contract, versioned by their schema.
"""
