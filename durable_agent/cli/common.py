"""What the CLI's commands and the demo share: error lines, run inputs, following a run.

Its own module so that ``demo`` and ``commands`` both import it and never each other.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from temporalio.client import Client, WorkflowFailureError, WorkflowHandle

from durable_agent.cli.render import EventPrinter, print_result
from durable_agent.client import follow_run, run_result
from durable_agent.core.failures import failure_message
from durable_agent.core.run_api import AgentRunInput, AgentRunResult


def err(message: str) -> None:
    """``durable-agent: MESSAGE`` on standard error."""
    print(f"durable-agent: {message}", file=sys.stderr, flush=True)


def build_run_input(fields: dict[str, Any]) -> AgentRunInput:
    """An ``AgentRunInput`` from the fields given (``None`` means "use the worker's default")."""
    return AgentRunInput.model_validate({k: v for k, v in fields.items() if v is not None})


async def follow_and_report(
    client: Client, handle: WorkflowHandle[Any, AgentRunResult]
) -> AgentRunResult | None:
    """Print the run's live log and then its result; ``None`` when the workflow itself failed."""
    printer = EventPrinter()
    async for record in follow_run(handle):
        printer.show(record)
    printer.finish()
    try:
        result = await run_result(client, handle.id)
    except WorkflowFailureError as exc:
        # The run was refused (bad input or config): the cause holds the reason.
        err(f"workflow {handle.id} failed: {failure_message(exc)}")
        return None
    print_result(result)
    return result


def policy_arg(args: argparse.Namespace) -> dict[str, Any] | None:
    """The run's rules from ``--allow``/``--deny``/``--ask``/``--default`` (None: the worker's)."""
    if not (args.allow or args.deny or args.ask or args.default):
        return None
    policy: dict[str, Any] = {"allow": args.allow or [], "deny": args.deny or [], "ask": args.ask or []}
    if args.default:
        policy["default"] = args.default
    return policy


def workspace_arg(value: str | None) -> str | None:
    """``--workspace`` as the worker should read it."""
    # A folder that exists here is most likely meant: make it absolute, since the
    # worker resolves relative paths against its own current folder.
    if value is not None and Path(value).expanduser().is_dir():
        return str(Path(value).expanduser().resolve())
    return value


def budget_fields(args: argparse.Namespace) -> dict[str, Any]:
    """The run input's budget fields from the budget options."""
    return {
        "max_total_tokens": args.max_total_tokens,
        "max_cost_usd": args.max_cost_usd,
        "idle_timeout_seconds": args.idle_timeout,
    }


def budget_options(run: argparse.ArgumentParser) -> None:
    """``--max-total-tokens``, ``--max-cost-usd`` and ``--idle-timeout``."""
    run.add_argument("--max-total-tokens", type=int, metavar="N", help="the run's token budget")
    run.add_argument("--max-cost-usd", type=float, metavar="USD", help="the run's cost budget")
    run.add_argument(
        "--idle-timeout", type=float, metavar="SECONDS", help="with follow-ups: close after this long idle"
    )
