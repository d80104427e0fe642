"""The CLI's parser declares every command; each command's module is imported only when it runs."""

from __future__ import annotations

import argparse
import importlib
import subprocess
import sys

from durable_agent.cli.commands import Handler, build_parser


def _commands(parser: argparse.ArgumentParser, path: str = "") -> dict[str, object]:
    """Each command's ``func`` default, by its words (``mcp list``)."""
    found: dict[str, object] = {}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                words = f"{path} {name}".strip()
                if "func" in sub._defaults:
                    found[words] = sub._defaults["func"]
                found.update(_commands(sub, words))
    return found


def test_every_command_has_a_handler_that_exists() -> None:
    commands = _commands(build_parser())
    assert len(commands) >= 20, sorted(commands)
    for words, func in commands.items():
        if isinstance(func, Handler):
            # the name is resolved only when the command runs: a typo must fail here, not there
            func = getattr(importlib.import_module(func.module), func.function)
        assert callable(func), words


def test_the_parser_and_help_import_no_command_and_no_temporal() -> None:
    code = (
        "import sys\n"
        "from durable_agent.cli.commands import run_cli\n"
        "try:\n"
        "    run_cli(['run', '--help'])\n"
        "except SystemExit:\n"
        "    pass\n"
        "loaded = sorted(m for m in sys.modules if m.split('.')[0] in ('durable_agent', 'temporalio'))\n"
        "print(loaded, file=sys.stderr)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stderr.strip() == "['durable_agent', 'durable_agent.cli', 'durable_agent.cli.commands']"
