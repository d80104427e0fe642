"""Client-side helpers: connect, register search attributes, start and follow runs.

Not imported by workflow code (it does network I/O).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import sys
import uuid
from collections.abc import AsyncIterator
from typing import Any, NoReturn

from temporalio.api.enums.v1 import IndexedValueType
from temporalio.api.operatorservice.v1 import (
    AddSearchAttributesRequest,
    ListSearchAttributesRequest,
)
from temporalio.client import Client, WorkflowExecutionStatus, WorkflowHandle
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.envconfig import ClientConfig

from durable_agent.models import EndEvent, EventRecord
from durable_agent.run_io import (
    QUERY_EVENTS,
    SA_RUN_STATUS,
    SA_SESSION_ID,
    WORKFLOW_TYPE,
    AgentRunInput,
    AgentRunResult,
)

DEFAULT_ADDRESS = "localhost:7233"
DEFAULT_NAMESPACE = "default"
DEFAULT_TASK_QUEUE = "agent"
SEARCH_ATTRIBUTES = (SA_SESSION_ID, SA_RUN_STATUS)


def exit_process(code: int) -> NoReturn:
    """Flush and leave without the interpreter's teardown.

    The Temporal client's Rust threads can crash CPython's finalization (an
    intermittent SIGSEGV or SIGABRT, temporalio/sdk-python#300), which would
    turn a finished command into a failed one.
    """
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code)


def task_queue() -> str:
    return os.environ.get("AGENT_TASK_QUEUE") or DEFAULT_TASK_QUEUE


def connect_options() -> dict[str, Any]:
    """Connection settings read as Temporal's own tools read them (env and profile)."""
    options: dict[str, Any] = dict(ClientConfig.load_client_connect_config())
    options.setdefault("target_host", DEFAULT_ADDRESS)
    options.setdefault("namespace", DEFAULT_NAMESPACE)
    return options


async def connect(**overrides: Any) -> Client:
    """A client with the pydantic data converter the workflow and activities use."""
    options = {**connect_options(), **overrides}
    target = options.pop("target_host")
    return await Client.connect(target, data_converter=pydantic_data_converter, **options)


async def ensure_search_attributes(client: Client) -> None:
    """Register ``AgentSessionId`` and ``AgentRunStatus`` (Keyword) if the namespace lacks them."""
    ns = client.namespace
    existing = await client.operator_service.list_search_attributes(ListSearchAttributesRequest(namespace=ns))
    known = set(existing.custom_attributes) | set(existing.system_attributes)
    missing = {
        name: IndexedValueType.INDEXED_VALUE_TYPE_KEYWORD for name in SEARCH_ATTRIBUTES if name not in known
    }
    if missing:
        await client.operator_service.add_search_attributes(
            AddSearchAttributesRequest(namespace=ns, search_attributes=missing)
        )


def summary_of(prompt: str, limit: int = 120) -> str:
    """The workflow's summary in the UI: the start of the prompt, on one line."""
    line = " ".join(prompt.split())
    return line if len(line) <= limit else line[: limit - 1] + "…"


def details_of(run: AgentRunInput) -> str:
    """The workflow's fixed details in the UI: what the run was started with."""
    lines = [
        f"**model:** {run.model or 'the worker default'}",
        f"**workspace:** `{run.workspace or 'the worker default'}`",
        f"**session:** {run.session_id or 'the workflow id'}",
    ]
    if run.permissions is not None:
        p = run.permissions
        lines.append(
            f"**permissions:** allow {list(p.allow)} · deny {list(p.deny)} · ask {list(p.ask)}"
            f" · default {p.default}"
        )
    return "\n\n".join(lines)


async def start_run(
    client: Client,
    run: AgentRunInput,
    *,
    workflow_id: str | None = None,
    queue: str | None = None,
) -> WorkflowHandle[Any, AgentRunResult]:
    """Start an ``AgentRun``; the input is validated here first, so errors come back at once."""
    run = AgentRunInput.model_validate(run.model_dump(exclude_none=True))
    return await client.start_workflow(
        WORKFLOW_TYPE,
        run.model_dump(mode="json", exclude_none=True),
        id=workflow_id or f"agent-run-{uuid.uuid4().hex[:12]}",
        task_queue=queue or task_queue(),
        result_type=AgentRunResult,
        static_summary=summary_of(run.prompt),
        static_details=details_of(run),
    )


async def follow_events(
    handle: WorkflowHandle[Any, Any], *, after: int = 0, poll_seconds: float = 0.2
) -> AsyncIterator[EventRecord]:
    """Yield the run's events as they happen, through to its ``end`` event.

    Stops early, without an ``end``, if the workflow closes without one (for
    example when its input was refused).
    """
    idle_polls = 0
    while True:
        try:
            batch: list[EventRecord] = await handle.query(QUERY_EVENTS, after, result_type=list[EventRecord])
        except Exception:
            batch = []
        for record in batch:
            after = record.sequence
            yield record
            if isinstance(record.event, EndEvent):
                return
        if batch:
            idle_polls = 0
        else:
            idle_polls += 1
            if idle_polls % 10 == 0:
                desc = await handle.describe()
                if desc.status != WorkflowExecutionStatus.RUNNING:
                    return
        await asyncio.sleep(poll_seconds)
