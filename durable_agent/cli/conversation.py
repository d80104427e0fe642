"""The conversation commands: ``chat`` (a conversation in the terminal), ``prompt``, ``steer``
and ``end`` (a run with follow-ups, from another shell)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Coroutine
from typing import Any

from pydantic import ValidationError
from temporalio.client import WorkflowFailureError, WorkflowUpdateFailedError

from durable_agent.cli.common import (
    budget_fields,
    budget_options,
    build_run_input,
    err,
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
from durable_agent.core.failures import failure_message
from durable_agent.core.models import EndEvent, EventRecord
from durable_agent.core.run_api import AWAITING_PROMPT, QUERY_STATUS, AgentRunResult, RunStatusView

Network = Callable[[Callable[[argparse.Namespace], Coroutine[Any, Any, int]]], Callable[..., int]]


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


async def _prompt(args: argparse.Namespace) -> int:
    handle = (await connect()).get_workflow_handle(args.workflow_id)
    try:
        accepted = await send_prompt(handle, args.text)
    except WorkflowUpdateFailedError as exc:
        err(f"prompt: refused: {failure_message(exc)}")
        return 1
    print(f"prompt sent to {args.workflow_id}; its events follow sequence {accepted.after_sequence}")
    return 0


async def _steer(args: argparse.Namespace) -> int:
    handle = (await connect()).get_workflow_handle(args.workflow_id)
    try:
        accepted = await steer_run(handle, args.text)
    except WorkflowUpdateFailedError as exc:
        err(f"steer: refused: {failure_message(exc)}")
        return 1
    print(
        f"steer sent to {args.workflow_id}: the model sees it at its next request ({accepted.queued} waiting)"
    )
    return 0


async def _end(args: argparse.Namespace) -> int:
    await end_conversation((await connect()).get_workflow_handle(args.workflow_id))
    print(f"end requested for {args.workflow_id}")
    return 0


def add_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser], network: Network) -> None:
    """Register ``chat``, ``prompt``, ``steer`` and ``end``; ``network`` wraps each command."""
    chat = sub.add_parser("chat", help="a conversation in the terminal: start one, or attach to a run")
    chat.add_argument("workflow_id", nargs="?", help="a run with follow-ups to attach to")
    chat.add_argument("--prompt", help="the first prompt (default: the first line read)")
    chat.add_argument("--workspace", help="a folder on the worker's machine (default: the worker's)")
    chat.add_argument("--model", help='"provider/model"')
    chat.add_argument("--session-id")
    chat.add_argument("--id", help="the workflow id (default: agent-run-<random>)")
    for kind in ("allow", "deny", "ask"):
        chat.add_argument(f"--{kind}", action="append", metavar="RULE", help=f"{kind} rule")
    chat.add_argument("--default", choices=("allow", "deny", "ask"), help="decision when no rule matches")
    budget_options(chat)
    chat.set_defaults(func=network(_chat))
    for name, text in (
        ("prompt", "the next prompt of a run that waits for one (update)"),
        ("steer", "a message the run's model sees at its next request (update)"),
    ):
        texted = sub.add_parser(name, help=text)
        texted.add_argument("workflow_id")
        texted.add_argument("text")
        texted.set_defaults(func=network(_prompt if name == "prompt" else _steer))
    end = sub.add_parser("end", help="close a run with follow-ups: it completes with its last answer")
    end.add_argument("workflow_id")
    end.set_defaults(func=network(_end))
