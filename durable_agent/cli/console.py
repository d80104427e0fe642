"""``durable-agent console``: the web console (``durable_agent/console/``) on this machine.

The parser (``cli/commands.py``) imports this module only when ``console`` runs.
"""

from __future__ import annotations

import argparse
import os

from durable_agent.cli.common import err, network
from durable_agent.client import connect
from durable_agent.client import task_queue as default_task_queue
from durable_agent.config import load_config


async def _console(args: argparse.Namespace) -> int:
    from durable_agent.console.api import ConsoleState
    from durable_agent.console.app import create_app, serve
    from durable_agent.console.auth import ConsoleAuthError, check_bind, console_token

    host, port = args.bind
    try:
        token, given = console_token(os.environ)
        check_bind(host, given)
    except ConsoleAuthError as exc:
        err(f"console: {exc}")
        return 2
    config = load_config()  # its [codec] keys decode the runs' payloads, as the workers' do
    client = await connect(config)
    from durable_agent.console.app import codec_note

    state = ConsoleState(
        task_queue=args.task_queue or default_task_queue(),
        namespace=client.namespace,
        temporal_ui=args.temporal_ui,
        codec=codec_note(config.codec),
        sink=args.sink,
    )
    shown = f"[{host}]" if ":" in host else host
    link = f"http://{shown}:{port}/" + ("" if given else f"?token={token}")
    print(f"durable-agent console on task queue {state.task_queue!r}: {link}", flush=True)
    if given:
        print(f"(the token is {'AGENT_CONSOLE_TOKEN'}'s: open {link}?token=… with it)", flush=True)
    print(state.codec, flush=True)
    await serve(create_app(client, token, state), host, port)
    return 0


cmd_console = network(_console)
