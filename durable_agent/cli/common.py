"""What the CLI's commands and the demo share: error lines, run inputs, following a run, and
the wrapper that runs a command against Temporal (``network``).

Its own module so that the commands' modules all import it and never each other.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

from pydantic import ValidationError
from temporalio.client import Client, WorkflowFailureError, WorkflowHandle, WorkflowQueryFailedError
from temporalio.exceptions import WorkflowAlreadyStartedError
from temporalio.service import RPCError

from durable_agent.cli.render import EventPrinter, print_result
from durable_agent.client import follow_run, run_result
from durable_agent.codec import ENCODING, CodecError
from durable_agent.config import ConfigError
from durable_agent.core.errors import validation_message
from durable_agent.core.failures import failure_message
from durable_agent.core.run_api import AgentRunInput, AgentRunResult

#: A command that talks to Temporal: the parsed arguments in, the exit code out.
AsyncCommand = Callable[[argparse.Namespace], Coroutine[Any, Any, int]]


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


def one_line(exc: Exception) -> str:
    """``Type: message`` on one line, whatever the message holds (a reader's error quotes input).

    Args:
        exc: The error.

    Returns:
        Its type's name and its message (pydantic's, shortened), on one line.
    """
    message = validation_message(exc) if isinstance(exc, ValidationError) else str(exc)
    return f"{type(exc).__name__}: {' '.join(message.split())}"


def network(command: AsyncCommand) -> Callable[[argparse.Namespace], int]:
    """Run an async command; Temporal's errors become a one-line message and exit code 1.

    Args:
        command: The command, a coroutine function of the parsed arguments.

    Returns:
        A command that runs it with ``asyncio.run`` and gives its exit code: 1 when Temporal
            cannot be reached or refuses, 2 for a config or codec key that does not fit, 130
            when interrupted.
    """

    def run(args: argparse.Namespace) -> int:
        try:
            return asyncio.run(command(args))
        # RuntimeError is what Client.connect raises when nothing answers.
        except (RPCError, WorkflowQueryFailedError, WorkflowAlreadyStartedError, RuntimeError) as exc:
            err(f"{args.command}: {exc}")
            return 1
        except ConfigError as exc:  # the config the client reads its codec keys from
            err(f"{args.command}: {exc}")
            return 2
        except CodecError as exc:  # encrypted with a key this config does not hold
            err(f"{args.command}: {exc}: give this command the config and key variables the workers use")
            return 2
        except KeyError as exc:
            if ENCODING.decode() not in str(exc):
                raise
            # the run's payloads are encrypted and this client has no [codec] keys at all
            err(
                f"{args.command}: the run's payloads are encrypted ([codec] on the workers): set "
                "AGENT_CONFIG to a config with the same [codec] keys, and their variables"
            )
            return 2
        except KeyboardInterrupt:
            return 130  # a run being followed goes on without us

    return run
