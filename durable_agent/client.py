"""Client-side helpers: connect, register search attributes, start and follow runs.

Not imported by workflow code (it does network I/O).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import sys
import uuid
from collections.abc import AsyncIterator, Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any, NoReturn, TypeVar, cast, overload

from temporalio.api.common.v1 import Payload
from temporalio.api.enums.v1 import IndexedValueType
from temporalio.api.operatorservice.v1 import (
    AddSearchAttributesRequest,
    ListSearchAttributesRequest,
)
from temporalio.client import (
    Client,
    Interceptor,
    WorkflowExecutionDescription,
    WorkflowExecutionStatus,
    WorkflowFailureError,
    WorkflowHandle,
    WorkflowQueryFailedError,
    WorkflowUpdateFailedError,
)
from temporalio.common import SearchAttributeKey, SearchAttributePair, TypedSearchAttributes
from temporalio.converter import DataConverter
from temporalio.envconfig import ClientConfig
from temporalio.exceptions import ApplicationError, CancelledError
from temporalio.service import RPCError, RPCStatusCode

from durable_agent.codec import data_converter
from durable_agent.config import AgentConfig, load_config
from durable_agent.core.activity_api import MODEL_CALL
from durable_agent.core.canonical import canonical_bytes
from durable_agent.core.events import EndEvent, EventRecord
from durable_agent.core.export import SessionCheckpointExportV1
from durable_agent.core.failures import INPUT_TOO_LARGE
from durable_agent.core.models import LiveText
from durable_agent.core.output_schema import OutputSchemaError, RunOutputError, schema_of, typed_output
from durable_agent.core.plan import MESSAGE_BYTES_CEILING, WORKFLOW_TASK_SECONDS
from durable_agent.core.run_api import (
    AWAITING_PROMPT,
    EXECUTING,
    QUERY_EVENTS,
    QUERY_RESULT,
    QUERY_STATUS,
    SA_RUN_STATUS,
    SA_SESSION_ID,
    SIGNAL_CANCEL,
    SIGNAL_END,
    UPDATE_PROMPT,
    UPDATE_STEER,
    WORKFLOW_TYPE,
    AgentRunInput,
    AgentRunResult,
    FollowUpPrompt,
    PromptAccepted,
    RunControl,
    RunStatusView,
    SteerAccepted,
    SteerMessage,
)
from durable_agent.telemetry import configure_tracing, tracing_interceptors

SESSION_ID_KEY = SearchAttributeKey.for_keyword(SA_SESSION_ID)
RUN_STATUS_KEY = SearchAttributeKey.for_keyword(SA_RUN_STATUS)

DEFAULT_ADDRESS = "localhost:7233"
DEFAULT_NAMESPACE = "default"
DEFAULT_TASK_QUEUE = "agent"
SEARCH_ATTRIBUTES = (SA_SESSION_ID, SA_RUN_STATUS)

log = logging.getLogger(__name__)
T = TypeVar("T")


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
    """Connection settings read as Temporal's own tools read them (env and profile).

    Returns:
        ``Client.connect``'s keyword arguments from the ``TEMPORAL_*`` variables
            (``TEMPORAL_ADDRESS``, ``TEMPORAL_NAMESPACE``, ``TEMPORAL_PROFILE``, …) and
            Temporal's config file: ``target_host`` (default ``localhost:7233``) and
            ``namespace`` (default ``default``), and ``api_key``, ``tls`` and ``rpc_metadata``
            where they are set.

    Raises:
        RuntimeError: Temporal's config file cannot be read, or has no profile of the name
            ``TEMPORAL_PROFILE`` gives (the SDK's ``ConfigError``, a ``RuntimeError``).
    """
    options: dict[str, Any] = dict(ClientConfig.load_client_connect_config())
    options.setdefault("target_host", DEFAULT_ADDRESS)
    options.setdefault("namespace", DEFAULT_NAMESPACE)
    return options


def agent_interceptors(config: AgentConfig) -> list[Interceptor]:
    """The client's interceptors: Temporal's tracing one when the ``OTEL_*`` variables ask for
    traces (or the host installed a tracer provider); it then traces the workers built from the
    client too. None otherwise."""
    return tracing_interceptors() if configure_tracing(config.telemetry) else []


async def connect(config: AgentConfig | None = None, **overrides: Any) -> Client:
    """A client for agent runs: the data converter the workflow and activities use (pydantic's,
    encrypting every payload when ``[codec]`` has keys) and the tracing interceptor when traces
    are on.

    Args:
        config: The agent config; default: the file ``AGENT_CONFIG`` names (the built-in one
            when unset). Its ``[codec]`` keys encrypt the payloads; its ``[telemetry]`` says
            what the traces hold.
        **overrides: ``temporalio.client.Client.connect``'s own arguments (``runtime``,
            ``plugins``, ``tls``, …); they win over the connection settings read from the
            environment and Temporal's config profiles (``connect_options``). A
            ``data_converter`` or ``interceptors`` given here replaces the agent's.

    Returns:
        A connected ``Client`` with the agent's data converter and, when the ``OTEL_*``
            variables ask for traces (or the host installed a tracer provider), Temporal's
            tracing interceptor.

    Raises:
        ConfigError: The config file is missing or invalid, a ``[codec]`` key's variable is
            unset or holds no usable key, or the ``OTEL_*`` variables ask for an exporter that
            cannot be made here.
        RuntimeError: Temporal's config file or profile cannot be read, or the service cannot
            be reached (the SDK's "Failed client connect: …").
    """
    config = config if config is not None else load_config()
    options = {**connect_options(), **overrides}
    target = options.pop("target_host")
    options.setdefault("data_converter", data_converter(config.codec))
    options.setdefault("interceptors", agent_interceptors(config))
    return await Client.connect(target, **options)


async def ensure_search_attributes(client: Client) -> None:
    """Register ``AgentSessionId`` and ``AgentRunStatus`` (Keyword) if the namespace lacks them.

    Args:
        client: A client of the namespace to prepare.

    Raises:
        temporalio.service.RPCError: The namespace's search attributes cannot be listed or
            added (no permission to, say).
    """
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
    # the model and workspace a run actually uses are in its current details once the worker
    # has resolved them; here only what the start named
    lines = [f"**session:** {run.session_id or 'the workflow id'}"]
    if run.model:
        lines.insert(0, f"**model:** {run.model}")
    if run.workspace:
        lines.insert(len(lines) - 1, f"**workspace:** `{run.workspace}`")
    if run.resume_from is not None:
        d = run.resume_from.descriptor
        lines.append(f"**resumed from:** {d.session_id}/{d.run_id} turn {d.turn} `{d.content_digest}`")
    if run.resume_from_file is not None:
        lines.append(f"**resumed from:** `{run.resume_from_file}` on the worker")
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
    task_timeout: timedelta = timedelta(seconds=WORKFLOW_TASK_SECONDS),
    output_type: Any = None,
) -> WorkflowHandle[Any, AgentRunResult]:
    """Start an ``AgentRun``; the input is validated here first, so errors come back at once.

    The start sets the run's search attributes, ``AgentSessionId`` and ``AgentRunStatus``
    (``executing``), so the run need not upsert them; in a namespace that does not define them
    yet (a worker registers them as it starts) it starts without them, and the run sets them.

    Args:
        client: A client from ``connect`` (or one with the same data converter).
        run: The run's input.
        workflow_id: The workflow id; default ``agent-run-`` and 12 hex digits. It is also the
            session id unless ``run.session_id`` is set.
        queue: The task queue; default ``AGENT_TASK_QUEUE``, else ``agent``.
        task_timeout: The workflow task timeout of the run's first execution (default 3 s):
            how long a run whose worker died in a workflow task waits before another worker
            takes it; the worker's ``[timeouts] workflow_task_seconds`` applies from the run's
            next execution on.
        output_type: A typed result: the type the run's answer must be (a pydantic model, a
            dataclass, ``list[int]``, ... anything pydantic's ``TypeAdapter`` takes). It sets
            ``run.output_schema`` to the type's JSON Schema; read the answer with
            ``run_result(client, workflow_id, output_type=...)``.

    Returns:
        The handle of the started workflow; ``await handle.result()`` gives the
            ``AgentRunResult`` (``run_result`` gives a cancelled run's too).

    Raises:
        pydantic.ValidationError: ``run`` is not a valid ``AgentRunInput``.
        durable_agent.core.output_schema.OutputSchemaError: ``output_type``'s schema is one a run
            cannot take (a ``ValueError``), or ``run`` has an ``output_schema`` too.
        temporalio.exceptions.WorkflowAlreadyStartedError: A workflow with ``workflow_id`` is
            running.
        temporalio.service.RPCError: The service refused the start (an input over its 2 MB
            payload limit, say).
    """
    if output_type is not None:
        if run.output_schema is not None:
            raise OutputSchemaError("give output_type or run.output_schema, not both")
        run = run.model_copy(update={"output_schema": schema_of(output_type)})
    run = AgentRunInput.model_validate(run.model_dump(exclude_none=True))
    title = run.prompt
    if title is None:
        source = run.resume_payload()
        title = f"resumed: {source.source_run().snapshot.prompt}" if source else ""
        if run.resume_from_file is not None:
            title = f"resumed from {Path(run.resume_from_file).name}"
    workflow_id = workflow_id or f"agent-run-{uuid.uuid4().hex[:12]}"
    start = functools.partial(
        client.start_workflow,
        WORKFLOW_TYPE,
        run.model_dump(mode="json", exclude_none=True),
        id=workflow_id,
        task_queue=queue or task_queue(),
        result_type=AgentRunResult,
        static_summary=summary_of(title),
        static_details=details_of(run),
        task_timeout=task_timeout,
        # A worker polling this queue on this same client (a host that runs both) gets the run's
        # first workflow task in the start's answer, without the trip through the task queue.
        # Elsewhere (the CLI) the SDK does not ask for it.
        request_eager_start=True,
    )
    # what the run's first task would set (one billed action less on Temporal Cloud)
    listed = TypedSearchAttributes(
        [
            SearchAttributePair(SESSION_ID_KEY, run.session_id or workflow_id),
            SearchAttributePair(RUN_STATUS_KEY, EXECUTING),
        ]
    )
    try:
        return await start(search_attributes=listed)
    except RPCError as exc:
        if not _unknown_search_attribute(exc):
            raise
    # The namespace does not know them yet (a worker registers them as it starts): the run
    # sets them itself once a worker takes it.
    return await start()


def _unknown_search_attribute(exc: RPCError) -> bool:
    """The service refused a start for a search attribute its namespace does not define."""
    message = exc.message.lower()
    return exc.status == RPCStatusCode.INVALID_ARGUMENT and "search attribute" in message


async def resume_run(
    client: Client,
    export: SessionCheckpointExportV1 | Path,
    *,
    workflow_id: str | None = None,
    queue: str | None = None,
    **fields: Any,
) -> WorkflowHandle[Any, AgentRunResult]:
    """Start a new ``AgentRun`` that goes on from ``export``'s conversation.

    Either way the worker refuses the export where its tools or permissions differ from the
    export's, unless ``force_resume=True``: the run then fails at its start
    (``InvalidRunInput``, as does an export file the worker cannot read or validate).

    Args:
        client: A client from ``connect``.
        export: The export to go on from: by value (validated here; it must fit in a workflow
            input, 2 MB) or a ``Path`` to an export file on the worker's machine (any size;
            the worker validates it and puts its conversation in the session store).
        workflow_id: As for ``start_run``.
        queue: As for ``start_run``.
        **fields: Other ``AgentRunInput`` fields: ``prompt`` (a user message before the first
            request), ``workspace``, ``session_id``, ``force_resume=True`` (resume although the
            worker's tools or permissions differ from the export's), …

    Returns:
        The handle of the new run (a new run id; its exports form a new series).

    Raises:
        pydantic.ValidationError: An export passed by value is tampered or truncated (the
            message names its typed export error), or ``fields`` are invalid.
        temporalio.exceptions.WorkflowAlreadyStartedError: As for ``start_run``.
        temporalio.service.RPCError: The service refused the start (an export by value over
            its 2 MB payload limit, say).
    """
    source: dict[str, Any] = (
        {"resume_from_file": str(export)} if isinstance(export, Path) else {"resume_from": export}
    )
    return await start_run(client, AgentRunInput(**source, **fields), workflow_id=workflow_id, queue=queue)


@overload
async def run_result(client: Client, workflow_id: str) -> AgentRunResult: ...


@overload
async def run_result(client: Client, workflow_id: str, *, output_type: type[T]) -> T: ...


async def run_result(client: Client, workflow_id: str, *, output_type: Any = None) -> Any:
    """The result of the run ``workflow_id`` (its latest execution) once it has ended, however
    it ended; with ``output_type``, its typed answer.

    A cancelled run ends in Temporal's Canceled state, which carries no result: its final
    record comes from the run's ``result`` query (a worker answers it by replaying the run).

    Args:
        client: A client from ``connect``.
        workflow_id: The run's workflow id; its latest execution is read.
        output_type: The type the run was started with (``start_run(..., output_type=...)``):
            the run's ``output`` is validated as one and returned.

    Returns:
        The run's ``AgentRunResult`` once it has ended: completed, failed, out of budget or
            cancelled. With ``output_type``: the run's answer, an ``output_type``.

    Raises:
        durable_agent.core.output_schema.RunOutputError: With ``output_type``: the run did not
            complete with a typed answer (the message says how it ended, and why), or its
            answer is not an ``output_type``.
        temporalio.client.WorkflowFailureError: The workflow ended without a result: its input
            was refused at the start (the cause an ``ApplicationError`` of type
            ``InvalidRunInput``, ``InputTooLarge`` or ``PayloadRefused``), it was cancelled
            before it started, or it was terminated or timed out.
        temporalio.service.RPCError: The workflow does not exist, or no worker answered a
            cancelled run's ``result`` query.
    """
    result = await _ended_result(client, workflow_id)
    return result if output_type is None else typed_result(result, output_type)


def typed_result(result: AgentRunResult, output_type: type[T]) -> T:
    """A run's answer as an ``output_type`` (see ``run_result``)."""
    if result.status != "completed" or result.output is None:
        how = f"ended {result.status}" + (f": {result.error}" if result.error else "")
        if result.status == "completed":
            how = "completed without a typed answer (was it started with output_type?)"
        raise RunOutputError(f"run {result.run_id} has no output: it {how}")
    return typed_output(result.output, output_type)


async def _ended_result(client: Client, workflow_id: str) -> AgentRunResult:
    """The ended run's ``AgentRunResult`` (``run_result``), from the ``result`` query when cancelled."""
    handle = client.get_workflow_handle(workflow_id, result_type=AgentRunResult)
    try:
        result: AgentRunResult = await handle.result()
        return result
    except WorkflowFailureError as exc:
        if not isinstance(exc.cause, CancelledError):
            raise
        record: AgentRunResult | None = await handle.query(
            QUERY_RESULT,
            result_type=cast(type, AgentRunResult | None),  # a union: the converter takes it
        )
        if record is None:  # cancelled before it started: nothing was recorded
            raise
        return record


async def follow_events(
    handle: WorkflowHandle[Any, Any], *, after: int = 0, poll_seconds: float = 0.2
) -> AsyncIterator[EventRecord]:
    """Yield the run's events as they happen, through to its ``end`` event.

    Stops early, without an ``end``, if the workflow closes without one (for
    example when its input was refused). A run that has continued as new
    holds the events of its current execution and the newest 64 before it:
    a follower that starts later (or lags further) starts where they start;
    the whole event log is in the run's exports.

    Args:
        handle: The run's workflow handle.
        after: Yield the events with a sequence above this (0: from the start).
        poll_seconds: How long to wait between two ``events`` queries.

    Yields:
        Each ``EventRecord`` in sequence order, through the run's ``end`` event.

    Raises:
        temporalio.service.RPCError: The workflow does not exist, or the service cannot be
            reached.
    """
    async for item in _follow(handle, after, poll_seconds, live_text=False):
        if isinstance(item, EventRecord):
            yield item


async def follow_run(
    handle: WorkflowHandle[Any, Any], *, after: int = 0, poll_seconds: float = 0.2
) -> AsyncIterator[EventRecord | LiveText]:
    """Like ``follow_events``, with the model's text while it streams.

    A ``LiveText`` is the text so far of the model call in flight, and its thinking
    apart (``thinking``: the model's reasoning, not the answer); the ``thinking``
    and ``text_delta`` events that follow when the call completes hold the same
    for good. A higher ``attempt`` replaces what an earlier one showed.

    Args:
        handle: The run's workflow handle.
        after: Yield the events with a sequence above this (0: from the start).
        poll_seconds: How long to wait between two polls.

    Yields:
        ``EventRecord``s, as ``follow_events`` does, and between them ``LiveText``: the
            text so far of the model call in flight (read from its heartbeats).

    Raises:
        temporalio.service.RPCError: As ``follow_events``.
    """
    async for item in _follow(handle, after, poll_seconds, live_text=True):
        yield item


async def follow_turn(
    handle: WorkflowHandle[Any, Any], *, after: int = 0, poll_seconds: float = 0.2
) -> AsyncIterator[EventRecord | LiveText]:
    """Like ``follow_run``, and also stops once a run with follow-ups waits for its next prompt
    (every event up to the wait given).

    Args:
        handle: The run's workflow handle.
        after: Yield the events with a sequence above this (0: from the start).
        poll_seconds: How long to wait between two polls.

    Yields:
        As ``follow_run``; the last is the last event before the run waits for its next
            prompt, or its ``end`` event.

    Raises:
        temporalio.service.RPCError: As ``follow_events``.
    """
    async for item in _follow(handle, after, poll_seconds, live_text=True, until_prompt=True):
        yield item


def check_message_size(text: str, what: str) -> None:
    """Refuse, before sending, a message no worker takes (``MESSAGE_BYTES_CEILING``), as the run
    would: ``WorkflowUpdateFailedError`` with an ``InputTooLarge`` cause. A run's own limit
    (``[limits] max_message_bytes``, 262,144 bytes by default) is checked by the run.

    Several such updates at once would have Temporal terminate the run (``core.plan``).
    """
    size = len(canonical_bytes(text))
    if size > MESSAGE_BYTES_CEILING:
        raise WorkflowUpdateFailedError(
            ApplicationError(
                f"the {what} is {size} bytes as JSON, over the {MESSAGE_BYTES_CEILING} bytes any run "
                "takes: not sent (put the text in a file in the workspace, and ask the model to read it)",
                type=INPUT_TOO_LARGE,
                non_retryable=True,
            )
        )


async def send_prompt(handle: WorkflowHandle[Any, Any], text: str) -> PromptAccepted:
    """The next prompt of a run that waits for one (update ``prompt``).

    Args:
        handle: The handle of a run started with ``follow_ups`` that waits for its next prompt.
        text: The prompt: not blank, at most 393,216 bytes as JSON here
            (``MESSAGE_BYTES_CEILING``); the run's own ``[limits] max_message_bytes``
            (262,144 by default) is checked by the run.

    Returns:
        The turn's events follow its ``after_sequence`` (``follow_turn``'s ``after``).

    Raises:
        pydantic.ValidationError: ``text`` is blank.
        temporalio.client.WorkflowUpdateFailedError: The run refused the prompt: it is not
            waiting for one, or has ended (the cause an ``ApplicationError`` saying so); or
            its cause is an ``ApplicationError`` of type ``InputTooLarge`` (a text over
            ``MESSAGE_BYTES_CEILING`` is refused so here, not sent), ``HistoryLimit`` or
            ``PayloadRefused``.
        temporalio.service.RPCError: The workflow has closed, or does not exist.
    """
    check_message_size(text, "prompt")
    accepted: PromptAccepted = await handle.execute_update(
        UPDATE_PROMPT, FollowUpPrompt(text=text), result_type=PromptAccepted
    )
    return accepted


async def steer_run(handle: WorkflowHandle[Any, Any], text: str) -> SteerAccepted:
    """A user message the run's model sees at its next request (update ``steer``); the call in
    flight goes on.

    Args:
        handle: The handle of a run that is working.
        text: The message: not blank, at most 393,216 bytes as JSON here, as for
            ``send_prompt``.

    Returns:
        Its ``queued``: how many messages wait for the model's next request, this one
            included.

    Raises:
        pydantic.ValidationError: ``text`` is blank.
        temporalio.client.WorkflowUpdateFailedError: The run refused the message: it has not
            started yet, waits for a prompt (use ``send_prompt``) or has ended (the cause an
            ``ApplicationError`` saying so); or its cause is an ``ApplicationError`` of type
            ``InputTooLarge``, ``SteerQueueFull``, ``HistoryLimit`` or ``PayloadRefused``.
        temporalio.service.RPCError: The workflow has closed, or does not exist.
    """
    check_message_size(text, "steer")
    accepted: SteerAccepted = await handle.execute_update(
        UPDATE_STEER, SteerMessage(text=text), result_type=SteerAccepted
    )
    return accepted


def _control(handle: WorkflowHandle[Any, Any], reason: str | None = None) -> list[Any]:
    """The ``cancel`` or ``end`` signal's arguments: from a client with ``[codec]`` keys an
    encrypted ``RunControl``, which a worker with keys requires (a bare signal anyone could send);
    from one without, as they always were (none, or ``cancel``'s reason), which any worker takes."""
    # the handle's client: the SDK keeps it on the handle and has no public name for it
    encrypts = handle._client.data_converter.payload_codec is not None
    if encrypts:
        return [RunControl(reason=reason)]
    return [reason] if reason else []


async def cancel_run(handle: WorkflowHandle[Any, Any], reason: str | None = None) -> None:
    """Ask a run to stop (signal ``cancel``): the call in flight is cancelled, the run ends
    ``cancelled`` with ``reason``.

    Args:
        handle: The run's handle.
        reason: Why, recorded on the run.

    Raises:
        temporalio.service.RPCError: The workflow has closed, or does not exist.
    """
    await handle.signal(SIGNAL_CANCEL, args=_control(handle, reason))


async def end_conversation(handle: WorkflowHandle[Any, Any]) -> None:
    """Close a run with follow-ups (signal ``end``): it completes with its last answer.

    A run that is working ends once it has answered, instead of waiting for a prompt.

    Args:
        handle: The handle of a run started with ``follow_ups``.

    Raises:
        temporalio.service.RPCError: The workflow has closed, or does not exist.
    """
    await handle.signal(SIGNAL_END, args=_control(handle))


async def _follow(
    handle: WorkflowHandle[Any, Any],
    after: int,
    poll_seconds: float,
    *,
    live_text: bool,
    until_prompt: bool = False,
) -> AsyncIterator[EventRecord | LiveText]:
    idle_polls = 0
    heartbeats = _HeartbeatReader()
    shown: LiveText | None = None
    while True:
        try:
            batch: list[EventRecord] = await handle.query(QUERY_EVENTS, after, result_type=list[EventRecord])
        except RPCError:
            batch = []  # no worker has the run right now (one is starting, or taking it over)
        if batch and batch[0].sequence > after + 1:
            # the run continued as new meanwhile and holds only its newest events
            log.warning(
                "events %d to %d of %s are no longer held by the run (it continued as new); "
                "they are in its exports",
                after + 1,
                batch[0].sequence - 1,
                handle.id,
            )
        for record in batch:
            after = record.sequence
            yield record
            if isinstance(record.event, EndEvent):
                return
        if batch:
            idle_polls = 0
            shown = None
        else:
            idle_polls += 1
            if until_prompt:
                try:
                    view = await handle.query(QUERY_STATUS, result_type=RunStatusView)
                except (RPCError, WorkflowQueryFailedError):
                    view = None
                if view is not None and view.status == AWAITING_PROMPT and after >= view.event_count:
                    return
            if live_text or idle_polls % 10 == 0:
                desc = await handle.describe()
                if desc.status != WorkflowExecutionStatus.RUNNING:
                    return
                live = await _live_text(desc, heartbeats) if live_text else None
                # a call that is still thinking has no text yet: its thinking is shown (as such)
                if live is not None and live != shown and (live.text or live.thinking):
                    shown = live
                    yield live
        await asyncio.sleep(poll_seconds)


class _HeartbeatReader:
    """Decodes a model call's heartbeats with the keys of the config ``AGENT_CONFIG`` names
    (when ``[codec]`` has any), read once, when the first heartbeat needs it."""

    def __init__(self) -> None:
        self._converter: DataConverter | None = None

    async def live_text(self, payloads: Sequence[Payload]) -> LiveText:
        if self._converter is None:
            self._converter = data_converter(load_config().codec)
        [live] = await self._converter.decode(payloads, [LiveText])
        return cast(LiveText, live)


async def _live_text(desc: WorkflowExecutionDescription, heartbeats: _HeartbeatReader) -> LiveText | None:
    """The streaming text of the model call in flight, from its latest heartbeat."""
    for pending in desc.raw_description.pending_activities:
        if pending.activity_type.name != MODEL_CALL.name or not pending.heartbeat_details.payloads:
            continue
        try:
            live = await heartbeats.live_text(pending.heartbeat_details.payloads)
        except Exception:
            return None
        # details left over from a failed attempt are stale until the new one heartbeats
        return live if isinstance(live, LiveText) and live.attempt == pending.attempt else None
    return None
