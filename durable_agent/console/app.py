"""The console's application: its pages, its static files, its API, all behind ``ConsoleGuard``,
and ``running_console`` that serves it with uvicorn.

The pages are plain HTML files shipped in the package (``templates/``) with no server-side
templating at all: a run's page is the same file for every run and every boundary
(``/runs/ID``, ``/runs/ID/turns/N``), and its script (``static/``) fills it from the API, with
``textContent`` only, so what a model wrote is never read as HTML. No build step: what is in the
package is what the browser gets.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from functools import cache
from importlib import resources

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from temporalio.client import Client

from durable_agent.config import CodecConfig
from durable_agent.console.actions import approve, cancel, end, prompt, rewind, steer
from durable_agent.console.api import (
    ConsoleState,
    EndedRuns,
    diff,
    events,
    export,
    guarded,
    info,
    run,
    runs,
    stream,
)
from durable_agent.console.auth import ConsoleGuard
from durable_agent.console.files import SinkFiles
from durable_agent.console.runs import RowCache

HERE = resources.files("durable_agent.console")
DEFAULT_TEMPORAL_UI = "http://localhost:8233"


def codec_note(codec: CodecConfig) -> str:
    """What the page says of the payloads: decoded with the workers' keys, or not encrypted."""
    if not codec.keys:
        return "payloads are not encrypted (no [codec] keys in AGENT_CONFIG)"
    ids = ", ".join(sorted(codec.keys))
    return f"payloads decrypted here with the workers' [codec] keys from AGENT_CONFIG ({ids})"


def api_routes() -> list[Route]:
    """The API's routes (``api.py`` reads, ``actions.py`` acts). A child run's workflow id holds
    ``/`` (``PARENT/task-STEP-CALL``): each route's id is a path, and the routes that end in a
    word come before the run's own."""
    prefix = "/api/runs/{workflow_id:path}"
    actions = (
        ("approve", approve),
        ("prompt", prompt),
        ("steer", steer),
        ("cancel", cancel),
        ("end", end),
        ("rewind", rewind),
    )
    return [
        Route("/api/info", guarded(info)),
        Route("/api/runs", guarded(runs)),
        Route(f"{prefix}/events/stream", guarded(stream)),
        Route(f"{prefix}/events", guarded(events)),
        Route(f"{prefix}/diff", guarded(diff)),
        Route(prefix + "/exports/{turn:int}", guarded(export)),
        *(Route(f"{prefix}/{name}", guarded(action), methods=["POST"]) for name, action in actions),
        Route(prefix, guarded(run)),
    ]


@cache
def _page(name: str) -> str:
    return (HERE / "templates" / name).read_text(encoding="utf-8")


async def runs_page(request: Request) -> Response:
    """``/``: the runs list (its filter and search in the query string)."""
    return HTMLResponse(_page("runs.html"))


async def run_page(request: Request) -> Response:
    """``/runs/ID`` and ``/runs/ID/turns/N``: a run, or a run at one of its boundaries."""
    return HTMLResponse(_page("run.html"))


def create_app(client: Client, token: str, state: ConsoleState, *, files: SinkFiles) -> ConsoleGuard:
    """The console as an ASGI application.

    Args:
        client: A client from ``connect`` (the agent's data converter: it decodes with the
            workers' keys).
        token: The token every request must carry (``auth.py``).
        state: The task queue, namespace, Temporal UI and codec note the API answers with.
        files: What reads the runs' diffs and exports from the sink (``cli/console.py``'s
            ``CliSinkFiles``).

    Returns:
        The application, behind its guard.
    """
    static = StaticFiles(directory=str(HERE / "static"))
    app = Starlette(
        routes=[
            *api_routes(),
            Route("/", runs_page),
            Route("/runs/{rest:path}", run_page),
            Mount("/static", app=static, name="static"),
        ]
    )
    app.state.client = client
    app.state.console = state
    app.state.rows = RowCache()
    app.state.ended = EndedRuns()
    app.state.files = files
    return ConsoleGuard(app, token)


@asynccontextmanager
async def running_console(
    app: ConsoleGuard, host: str = "127.0.0.1", port: int = 0
) -> AsyncIterator[tuple[str, asyncio.Task[None]]]:
    """The console served by uvicorn in this event loop, stopped on leaving.

    Args:
        app: From ``create_app``.
        host: The address to listen on.
        port: The port (0: a free one).

    Yields:
        Its URL (``http://host:port``, the port it got), and the server's task (done when it stops).

    Raises:
        OSError: The address cannot be bound (uvicorn's own message said why on stderr).
    """
    import uvicorn

    config = uvicorn.Config(app, host=host, port=port, log_level="warning", lifespan="off")
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve())
    while not server.started:
        if task.done():
            task.result()  # its error, if it could not start
            raise OSError(f"the console could not listen on {host}:{port}")
        await asyncio.sleep(0.01)
    sockets = server.servers[0].sockets if server.servers else ()
    if not sockets:  # it stopped as soon as it started (a signal)
        server.should_exit = True
        raise OSError(f"the console stopped before it listened on {host}:{port}")
    bound = sockets[0].getsockname()
    shown = f"[{bound[0]}]" if ":" in bound[0] else bound[0]
    try:
        yield f"http://{shown}:{bound[1]}", task
    finally:
        server.should_exit = True
        await asyncio.wait({task}, timeout=5)
