"""The conversation commands: ``chat`` (a conversation in the terminal), ``prompt``, ``steer``
and ``end`` (a run with follow-ups, from another shell).

The parser (``cli/commands.py``) imports this module only when one of these commands runs.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from pydantic import ValidationError
from temporalio.client import WorkflowFailureError, WorkflowHandle, WorkflowUpdateFailedError

from durable_agent.cli.common import (
    budget_fields,
    build_run_input,
    err,
    network,
    policy_arg,
    workspace_arg,
)
from durable_agent.cli.render import EventPrinter, print_result
from durable_agent.client import (
    connect,
    end_conversation,
    follow_turn,
    run_result,
    send_prompt,
    start_run,
    steer_run,
)
from durable_agent.client import task_queue as default_task_queue
from durable_agent.core.errors import validation_message
from durable_agent.core.events import EndEvent, EventRecord
from durable_agent.core.failures import failure_message
from durable_agent.core.run_api import AWAITING_PROMPT, QUERY_STATUS, AgentRunResult, RunStatusView

T = TypeVar("T")


async def _chat(args: argparse.Namespace) -> int:
    """A terminal conversation: each answer streams, then the next line of stdin is the next
    prompt; ``/end`` or the end of input closes the run."""
    client = await connect()
    after = 0
    if args.workflow_id:
        handle = client.get_workflow_handle(args.workflow_id, result_type=AgentRunResult)
        print(f"attached to {handle.id}")
    else:
        prompt = args.prompt or _read_line()
        if prompt is None or not prompt.strip() or prompt.strip() == "/end":
            err("chat: no prompt given")
            return 2
        fields: dict[str, Any] = {
            "prompt": prompt,
            "workspace": workspace_arg(args.workspace),
            "model": args.model,
            "session_id": args.session_id,
            "follow_ups": True,
            "permissions": policy_arg(args),
            "instructions": args.instructions,
            **budget_fields(args),
        }
        try:
            run = build_run_input(fields)
        except ValidationError as exc:
            err(f"chat: invalid run input: {validation_message(exc)}")
            return 2
        handle = await start_run(client, run, workflow_id=args.id, queue=default_task_queue())
        print(f"started {handle.id} (a conversation: /end or end of input closes it)")
    printer = EventPrinter()
    ended = False
    while not ended:
        async for record in follow_turn(handle, after=after):
            printer.show(record)
            if isinstance(record, EventRecord):
                after = record.sequence
                ended = ended or isinstance(record.event, EndEvent)
        printer.finish()
        if ended:
            break
        view = await handle.query(QUERY_STATUS, result_type=RunStatusView)
        if view.status != AWAITING_PROMPT:
            break  # the workflow closed without an end event (refused)
        line = _read_line()
        if line is None or line.strip() == "/end":
            await end_conversation(handle)
            continue
        if not line.strip():
            continue
        try:
            accepted = await send_prompt(handle, line)
        except WorkflowUpdateFailedError as exc:
            err(f"chat: prompt refused: {failure_message(exc)}")
            continue
        after = max(after, accepted.after_sequence)
    try:
        result = await run_result(client, handle.id)
    except WorkflowFailureError as exc:
        err(f"workflow {handle.id} failed: {failure_message(exc)}")
        return 1
    print_result(result)
    return 0 if result.status == "completed" else 1


def _read_line() -> str | None:
    """The next line of standard input (without its line break), or None at its end."""
    sys.stdout.write("\nyou> ")
    sys.stdout.flush()
    line = sys.stdin.readline()
    if not line:
        sys.stdout.write("\n")
        return None
    return line.rstrip("\n")


async def _update(
    args: argparse.Namespace, command: str, send: Callable[[WorkflowHandle[Any, Any], str], Awaitable[T]]
) -> T | None:
    """Send ``args.text`` to the run ``args.workflow_id`` by the update ``send``; None when refused.

    Args:
        args: the command's arguments (``workflow_id``, ``text``).
        command: the command's name, for the refusal's message.
        send: the client's call that sends the update.

    Returns:
        What the run answered, or None when it refused (said on standard error).
    """
    handle = (await connect()).get_workflow_handle(args.workflow_id)
    try:
        return await send(handle, args.text)
    except WorkflowUpdateFailedError as exc:
        err(f"{command}: refused: {failure_message(exc)}")
        return None


async def _prompt(args: argparse.Namespace) -> int:
    accepted = await _update(args, "prompt", send_prompt)
    if accepted is None:
        return 1
    print(f"prompt sent to {args.workflow_id}; its events follow sequence {accepted.after_sequence}")
    return 0


async def _steer(args: argparse.Namespace) -> int:
    accepted = await _update(args, "steer", steer_run)
    if accepted is None:
        return 1
    print(
        f"steer sent to {args.workflow_id}: the model sees it at its next request ({accepted.queued} waiting)"
    )
    return 0


async def _end(args: argparse.Namespace) -> int:
    await end_conversation((await connect()).get_workflow_handle(args.workflow_id))
    print(f"end requested for {args.workflow_id}")
    return 0


cmd_chat = network(_chat)
cmd_prompt = network(_prompt)
cmd_steer = network(_steer)
cmd_end = network(_end)
