"""What a tool boundary costs on Temporal Cloud: billable actions, ours against the naive loop.

Run it from the repository root:

    python bench/actions.py                                  # N = 20, fast reads and 2 s tool calls
    python bench/actions.py --boundaries 5 --tool-seconds 1 --json
    python bench/actions.py --tool-seconds 0                 # the fast reads only

It starts one Temporal dev server (in memory, with its Prometheus metrics on a free
port) unless ``TEMPORAL_ADDRESS`` is set; then heartbeats are read from
``--metrics-url`` if given, else shown as ``—``. Each design runs the scripted
reader of ``bench/step_cost.py`` once per workload, one run at a time:

- ``fast``: N ``read`` calls of one ``--file-bytes`` file, as ``bench/step_cost.py``;
- ``T s tool``: N calls of ``slow_read``, a tool of ours (``@tool``) that waits
  ``--tool-seconds`` and then reads the same file, so that its activity heartbeats.

Ours is ``AgentRun`` (``start_run``) on ``build_worker``; naive is ``NaiveAgentRun``
(``bench/naive.py``) on Temporal's defaults: no heartbeat timeout, so its tool activity
heartbeats first after 5 s (``heartbeating``), and not at all in a shorter call. Both designs
run the same ``agent.tool_call`` activity; ours runs a quick tool's (``read``) as a local one.

The figures, per run:

- ``N``: tool boundaries completed (``agent.tool_call`` as an activity or a local activity).
- ``actions``: billable actions by Temporal Cloud's published rules (docs.temporal.io/cloud/actions;
  ``bench/step_floor_notes.md``): those ``count_actions`` finds in the run's histories (every
  execution) plus the activity heartbeats that reached the server. ``/boundary``: over N.
- ``heartbeats``: ``RecordActivityTaskHeartbeat`` requests the server's frontend received during
  the run (its ``service_requests`` counter); ``hb share``: their part of ``actions``.
- one column per category of ``count_actions`` that any run used (``CATEGORIES`` says what each
  counts).
- ``server Δ``: the server's own action counter (``action``, which Temporal's frontend keeps by
  the same rules) over the run, less what the histories predict it counts: 0 when the two agree.
  The server also counts ``TemporalChangeVersion`` upserts (free on Cloud), and not local-activity
  retries nor workflow-task heartbeats; the prediction allows for that.

``--json`` adds one JSON line with every run's figures.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import uuid
from collections.abc import Iterable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout

from temporalio.api.enums.v1 import EventType, WorkflowTaskFailedCause
from temporalio.api.history.v1 import HistoryEvent
from temporalio.client import Client, WorkflowHistory
from temporalio.contrib.pydantic import pydantic_data_converter

from bench.naive import NaiveInput
from bench.reader_setup import add_workload_arguments, prepare, reader_config, sink_root, workspace_of
from bench.runs import CoreLog, completed_calls, fetch_chain, settle
from bench.server_metrics import HEARTBEAT_ACTIONS, settled_counts, start_metered_server
from bench.step_cost import Bench, free_port, naive_worker, start_naive, start_ours
from bench.step_report import fmt, table
from bench.tokens import ReaderModel
from durable_agent.activities import AgentActivities
from durable_agent.activities.providers.model_provider import ModelProvider, TextSink
from durable_agent.activities.tools.custom import FunctionTool, ToolContext, tool
from durable_agent.client import connect, ensure_search_attributes, exit_process
from durable_agent.core.activity_api import TOOL_CALL, ModelCallInput
from durable_agent.core.models import ModelResponse, ToolUseBlock
from durable_agent.core.permissions import PermissionPolicy
from durable_agent.core.tool_specs import offered_tools
from durable_agent.devserver import stop_dev_server
from durable_agent.worker import build_worker

E = EventType
CATEGORIES = {
    "workflow_started": "executions started: by a client, or by continue-as-new",
    "child_workflows": "child workflows started: 2 each (the intent, then the start)",
    "activities": "activities scheduled",
    "activity_retries": "activity attempts after the first (ActivityTaskStarted.attempt - 1)",
    "markers": "workflow tasks that recorded markers (local activities, patches): 1 each, however many",
    "local_activity_retries": "local-activity attempts after the first (the workflow task's metering)",
    "workflow_task_heartbeats": "workflow tasks completed only to be followed by the next at once",
    "timers": "timers started",
    "signals": "signals received",
    "updates": "updates accepted or rejected",
    "search_attribute_upserts": "search-attribute upserts, but those of TemporalChangeVersion alone",
    "properties_modified": "memo upserts (workflow properties modified)",
    "options_updated": "workflow execution options updated",
    "resets": "workflow resets",
    "nexus": "Nexus operations scheduled or asked to cancel",
}
CHANGE_VERSION = "TemporalChangeVersion"  # the SDKs' patch bookkeeping: exempt from billing
SLOW_TOOL = "slow_read"
# the events that are one action each, by their category (the others are counted below)
ONE_EACH = {
    E.EVENT_TYPE_WORKFLOW_EXECUTION_STARTED: "workflow_started",
    E.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED: "activities",
    E.EVENT_TYPE_TIMER_STARTED: "timers",
    E.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED: "signals",
    E.EVENT_TYPE_WORKFLOW_EXECUTION_UPDATE_ACCEPTED: "updates",
    E.EVENT_TYPE_WORKFLOW_EXECUTION_UPDATE_REJECTED: "updates",
    E.EVENT_TYPE_WORKFLOW_PROPERTIES_MODIFIED: "properties_modified",
    E.EVENT_TYPE_WORKFLOW_EXECUTION_OPTIONS_UPDATED: "options_updated",
    E.EVENT_TYPE_NEXUS_OPERATION_SCHEDULED: "nexus",
    E.EVENT_TYPE_NEXUS_OPERATION_CANCEL_REQUESTED: "nexus",
}


# --- counting a run's billable actions from its histories -------------------------------


def count_actions(histories: Iterable[WorkflowHistory]) -> dict[str, int]:
    """Temporal Cloud's billable actions recorded in a run's histories, by category.

    Activity heartbeats and queries are billed too but never reach a history: count them
    elsewhere. A child's own actions are in its histories: pass them to count them.

    Args:
        histories: Every execution of the run (``bench.runs.fetch_chain``), in any order.

    Returns:
        The count of each category of ``CATEGORIES``, and ``total``, their sum.
    """
    counts = dict.fromkeys(CATEGORIES, 0)
    for history in histories:
        events = list(history.events)
        marked_tasks: set[int] = set()
        for i, e in enumerate(events):
            kind = e.event_type
            if kind in ONE_EACH:
                counts[ONE_EACH[kind]] += 1
            elif kind == E.EVENT_TYPE_START_CHILD_WORKFLOW_EXECUTION_INITIATED:
                counts["child_workflows"] += 2
            elif kind == E.EVENT_TYPE_ACTIVITY_TASK_STARTED:
                counts["activity_retries"] += max(e.activity_task_started_event_attributes.attempt - 1, 0)
            elif kind == E.EVENT_TYPE_MARKER_RECORDED:
                marked_tasks.add(e.marker_recorded_event_attributes.workflow_task_completed_event_id)
            elif kind == E.EVENT_TYPE_WORKFLOW_TASK_COMPLETED:
                metering = e.workflow_task_completed_event_attributes.metering_metadata
                counts["local_activity_retries"] += metering.nonfirst_local_activity_execution_attempts
                # a workflow task heartbeat (a long local activity) asks for the next task at
                # once: nothing happened in between to schedule it
                following = events[i + 1].event_type if i + 1 < len(events) else None
                counts["workflow_task_heartbeats"] += following == E.EVENT_TYPE_WORKFLOW_TASK_SCHEDULED
            elif kind == E.EVENT_TYPE_UPSERT_WORKFLOW_SEARCH_ATTRIBUTES:
                counts["search_attribute_upserts"] += not is_version_upsert(e)
            elif kind == E.EVENT_TYPE_WORKFLOW_TASK_FAILED:
                cause = e.workflow_task_failed_event_attributes.cause
                counts["resets"] += cause == WorkflowTaskFailedCause.WORKFLOW_TASK_FAILED_CAUSE_RESET_WORKFLOW
        counts["markers"] += len(marked_tasks)
    counts["total"] = sum(counts.values())
    return counts


def is_version_upsert(event: HistoryEvent) -> bool:
    """An upsert of ``TemporalChangeVersion`` alone (a patch's bookkeeping), which Cloud does not bill."""
    fields = event.upsert_workflow_search_attributes_event_attributes.search_attributes.indexed_fields
    return set(fields) == {CHANGE_VERSION}


def version_upserts(histories: Iterable[WorkflowHistory]) -> int:
    return sum(
        1
        for h in histories
        for e in h.events
        if e.event_type == E.EVENT_TYPE_UPSERT_WORKFLOW_SEARCH_ATTRIBUTES and is_version_upsert(e)
    )


# --- the slow tool and the model that calls it -------------------------------------------


def slow_read(seconds: float) -> FunctionTool[..., Any]:
    """A tool that waits ``seconds``, then reads a workspace file: a tool call long enough to heartbeat."""

    @tool(name=SLOW_TOOL, read_only=True)
    async def read_slowly(context: ToolContext, file_path: str) -> str:
        """Read a file, slowly.

        Args:
            file_path: The file, relative to the workspace.
        """
        await asyncio.sleep(seconds)
        return context.path(file_path).read_text()

    return read_slowly


class SlowReader:
    """``ReaderModel``, whose reads call ``slow_read`` instead of ``read``."""

    def __init__(self, reader: ReaderModel) -> None:
        self.reader = reader

    async def complete(self, call: ModelCallInput, model: str, on_text: TextSink) -> ModelResponse:
        response = await self.reader.complete(call, model, on_text)
        content = tuple(
            b.model_copy(update={"name": SLOW_TOOL}) if isinstance(b, ToolUseBlock) else b
            for b in response.message.content
        )
        message = response.message.model_copy(update={"content": content})
        return response.model_copy(update={"message": message})


# --- the runs ------------------------------------------------------------------------------


def workload(client: Client, base: Path, file_bytes: int, tool_seconds: float) -> Bench:
    """Both designs' set-up for one workload: the fast reads (``tool_seconds`` 0) or the slow tool."""
    prepare(base, file_bytes)
    config = reader_config(base)
    reader = ReaderModel(None, max_tokens=4096)
    if tool_seconds:
        allow = PermissionPolicy(allow=(*config.permissions.allow, SLOW_TOOL))
        config = config.model_copy(update={"permissions": allow})
        providers: dict[str, ModelProvider] = {"reader": SlowReader(reader)}
        acts = AgentActivities(config, providers=providers, tools=[slow_read(tool_seconds)])
    else:
        acts = AgentActivities(config, providers={"reader": reader})
    offers = offered_tools((t.spec for t in acts.tools.values()), config.permissions)
    naive = NaiveInput(
        prompt="-", workspace=str(workspace_of(base)), model="reader/n1", system_prompt=config.system_prompt,
        tools=tuple(t.offer().definition for t in offers), max_steps=2,
    )  # fmt: skip
    tag = uuid.uuid4().hex[:8]
    return Bench(client, base, acts, sink_root(config), f"actions-{tag}", f"actions-naive-{tag}", naive)


async def measure(b: Bench, design: str, n: int, label: str, metrics: str | None) -> dict[str, Any]:
    """One run of ``design``: its actions by category, and the server's counters around it."""
    namespace = b.client.namespace
    before = await settled_counts(metrics, namespace)
    handle = await (start_ours(b, n, b.queue) if design == "ours" else start_naive(b, n, b.naive_queue))
    problem = await settle(handle, 300 + 10 * n)
    histories = await fetch_chain(b.client, handle.id)
    after = await settled_counts(metrics, namespace)
    counts = count_actions(histories)
    boundaries = completed_calls(histories, TOOL_CALL.name)  # ordinary or local
    row: dict[str, Any] = {
        "tools": label,
        "design": design,
        "boundaries": boundaries,
        "workflow_id": handle.id,
        "outcome": problem or "ok",
        "history_actions": counts.pop("total"),
        "by_category": counts,
        "heartbeats": None,
        "server_actions": None,
        "server_minus_history": None,
    }
    if before is not None and after is not None:
        delta = after - before
        metered = {k.removeprefix("action:"): v for k, v in delta.items() if k.startswith("action:")}
        beats = delta["heartbeats"]
        # what the server's counter should show: its rules differ from Cloud's in three places
        expected = (
            row["history_actions"] + version_upserts(histories)
            - counts["local_activity_retries"] - counts["workflow_task_heartbeats"]
        )  # fmt: skip
        not_beats = sum(v for k, v in metered.items() if k not in HEARTBEAT_ACTIONS)
        row |= {"heartbeats": beats, "server_actions": metered, "server_minus_history": not_beats - expected}
    row["actions"] = row["history_actions"] + (row["heartbeats"] or 0)
    row["per_boundary"] = round(row["actions"] / boundaries, 2) if boundaries else None
    beats = row["heartbeats"]
    row["heartbeat_share"] = (
        round(beats / row["actions"], 3) if beats is not None and row["actions"] else None
    )
    print(f"{label} {design}: {row['outcome']}, N={boundaries}, {row['actions']} actions", file=sys.stderr)
    return row


async def run_all(
    client: Client, tmp: Path, args: argparse.Namespace, metrics: str | None
) -> list[dict[str, Any]]:
    """Each workload, each design, each N: one run at a time, each design on its own worker."""
    rows: list[dict[str, Any]] = []
    loads = [("fast", 0.0)]
    if args.tool_seconds:
        loads.append((f"{args.tool_seconds:g} s tool", args.tool_seconds))
    for i, (label, seconds) in enumerate(loads):
        b = workload(client, tmp / f"load{i}", args.file_bytes, seconds)
        async with build_worker(client, b.acts, b.queue), naive_worker(b, b.naive_queue):
            for n in args.boundaries:
                rows.append(await measure(b, "ours", n, label, metrics))
                if n <= args.naive_max:
                    rows.append(await measure(b, "naive", n, label, metrics))
        await b.acts.aclose()
    return rows


def report(rows: list[dict[str, Any]], args: argparse.Namespace) -> None:
    used = [c for c in CATEGORIES if any(r["by_category"][c] for r in rows)]
    where = os.environ.get("TEMPORAL_ADDRESS") or "dev server (in memory)"
    print(f"\nbillable Temporal Cloud actions per tool boundary; server: {where}")
    lines = [
        [r["tools"], r["design"], str(r["boundaries"]), fmt(r["actions"]), fmt(r["per_boundary"], "{:.2f}"),
         fmt(r["heartbeats"]), fmt(r["heartbeat_share"], "{:.1%}"),
         *(fmt(r["by_category"][c]) for c in used), fmt(r["server_minus_history"])]
        for r in rows
    ]  # fmt: skip
    header = ["tools", "design", "N", "actions", "/boundary", "heartbeats", "hb share", *used, "server Δ"]
    table(header, lines)
    for r in rows:
        if r["outcome"] != "ok":
            print(f"  (!) {r['tools']} {r['design']} N={r['boundaries']}: {r['outcome']}")
    print("  goal: ours' actions per boundary <= the naive loop's")
    if args.json:
        print(json.dumps({"actions": rows}))


async def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_workload_arguments(parser)
    parser.set_defaults(boundaries=[20])
    parser.add_argument("--tool-seconds", type=float, default=2.0, help="the slow tool's wait; 0: none")
    parser.add_argument("--metrics-url", help="the server's Prometheus endpoint, with TEMPORAL_ADDRESS")
    parser.add_argument("--json", action="store_true", help="also one JSON line with every run's figures")
    args = parser.parse_args()
    if min(args.boundaries) < 1 or args.tool_seconds < 0:
        parser.error("--boundaries must be at least 1, --tool-seconds at least 0")
    core_log = CoreLog()  # the SDK's payload-size warnings (the naive design's) kept off the terminal
    with tempfile.TemporaryDirectory(prefix="actions-") as tmp_name:
        tmp = Path(tmp_name)
        server = None
        if os.environ.get("TEMPORAL_ADDRESS"):
            client = await connect(runtime=core_log.runtime())
            await ensure_search_attributes(client)
            metrics = args.metrics_url
        else:
            port, metrics_port = free_port(), free_port()
            server = start_metered_server(port, metrics_port, tmp / "server.log")
            metrics = f"http://127.0.0.1:{metrics_port}/metrics"
        try:
            if server is not None:
                client = await Client.connect(
                    f"127.0.0.1:{port}", data_converter=pydantic_data_converter, runtime=core_log.runtime()
                )
            rows = await run_all(client, tmp, args, metrics)
        finally:
            if server is not None:
                stop_dev_server(server)
    report(rows, args)
    return 0


if __name__ == "__main__":
    exit_process(asyncio.run(main()))
