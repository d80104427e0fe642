"""How the CLI shows a run to a person: its live events, its status and its result."""

from __future__ import annotations

import json
import shlex
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Literal, TextIO

from durable_agent.core.builtin_catalog import BUILTIN_TOOLS
from durable_agent.core.events import (
    BudgetExhaustedEvent,
    CheckpointExportedEvent,
    CheckpointExportFailedEvent,
    EndEvent,
    ErrorEvent,
    EventRecord,
    FinalResultEvent,
    HookRunEvent,
    PermissionDeniedEvent,
    PersistenceFailedEvent,
    RewindEvent,
    RunStartEvent,
    SubagentEndEvent,
    SubagentStartEvent,
    TextDeltaEvent,
    ThinkingEvent,
    TodoEvent,
    ToolEndEvent,
    ToolStartEvent,
    ToolsUnavailableEvent,
    UserMessageEvent,
)
from durable_agent.core.models import LiveText, TokenUsage
from durable_agent.core.run_api import AgentRunResult, Budget, PendingApproval, RunStatusView
from durable_agent.core.subagents import ChildRun
from durable_agent.core.todo_list import checklist_lines, summary

DIGEST_HEX_SHOWN = 16


def short_digest(digest: str) -> str:
    """``sha256:`` and the first hex characters: enough to match a file name or a UI line."""
    algorithm, _, hexdigest = digest.rpartition(":")
    prefix = f"{algorithm}:" if algorithm else ""
    return f"{prefix}{hexdigest[:DIGEST_HEX_SHOWN]}…" if len(hexdigest) > DIGEST_HEX_SHOWN else digest


def main_argument(tool: str, arguments: dict[str, Any]) -> str:
    """The argument that says what a tool call touches (its path, its pattern), if any."""
    spec = BUILTIN_TOOLS.get(tool)
    if spec is not None and spec.target_arg is not None:
        value = arguments.get(spec.target_arg)
        if value is None:
            # The model may leave out an argument that has a default (``ls`` lists ".").
            value = spec.args.model_fields[spec.target_arg].default
        return "" if value is None else str(value)
    # A tool this module does not know: its first string argument is the best guess.
    for value in arguments.values():
        if isinstance(value, str):
            return value
    return ""


def _one_line(text: str, limit: int = 160) -> str:
    line = " ".join(text.split())
    return line if len(line) <= limit else line[: limit - 1] + "…"


def hook_line(event: HookRunEvent) -> str:
    """One ``hook_run`` event as a line: ``⚑ hook pre_tool_use[0] bash blocked: reason``.

    Args:
        event: The event.

    Returns:
        The line, without its newline.
    """
    tool = f" {event.tool_name}" if event.tool_name else ""
    said = {"continue": "ok", "block": "blocked", "error": "failed"}[event.decision]
    why = f": {_one_line(event.reason)}" if event.reason else ""
    return f"⚑ hook {event.event}[{event.hook}]{tool} {said}{why}"


def subagent_line(event: SubagentStartEvent | SubagentEndEvent) -> str:
    """A ``subagent_*`` event as a line: ``⑂ subagent started: …`` or ``⑂ subagent completed: …``.

    Args:
        event: The event.

    Returns:
        The line, without its newline.
    """
    if isinstance(event, SubagentStartEvent):
        kind = f" ({event.agent_type})" if event.agent_type else ""
        where = f"[{event.workflow_id}, run {event.run_id}]"
        return f"⑂ subagent{kind} started: {_one_line(event.description)} {where}"
    export = f", last export {short_digest(event.final_content_digest)}" if event.final_content_digest else ""
    why = f": {_one_line(event.error)}" if event.error else ""
    return f"⑂ subagent {event.status}{why} [{event.workflow_id}{export}, {event.usage.total_tokens} tokens]"


def child_line(child: ChildRun) -> str:
    """A child run as ``status`` shows it: its call, kind, status, workflow and run ids."""
    kind = f" ({child.agent_type})" if child.agent_type else ""
    digest = child.final_content_digest
    export = f" · last export {short_digest(digest)}" if digest else ""
    return (
        f"{child.call_id}{kind}: {child.status} · {_one_line(child.description, 60)} · "
        f"workflow {child.workflow_id} · run {child.run_id or '-'}{export}"
    )


def budget_line(budget: Budget) -> str:
    """Usage against one budget in one line."""
    if budget.budget == "cost":
        return f"${budget.used:.4f} of ${budget.limit:g} (max_cost_usd)"
    return f"{budget.used:g} of {budget.limit:g} tokens (max_total_tokens)"


def usage_line(usage: TokenUsage) -> str:
    """Token usage in one line."""
    line = f"{usage.total_tokens} (prompt {usage.prompt_tokens}, completion {usage.completion_tokens}"
    if usage.reasoning_tokens:
        line += f", of which reasoning {usage.reasoning_tokens}"
    if usage.cache_read_tokens or usage.cache_write_tokens:
        line += f", cache read {usage.cache_read_tokens}, cache write {usage.cache_write_tokens}"
    return line + ")"


class EventPrinter:
    """Prints a run's events as a readable live log.

    Model text is written as it arrives, without a line break of its own, so
    that text streamed in several deltas reads as one paragraph; the next
    other event closes the line first. The model's thinking, streamed too, is
    its own paragraph: each line marked ``∴`` and, on a terminal, dimmed, so it
    never reads as the answer.
    """

    def __init__(self, out: TextIO | None = None, indent: str = "  ") -> None:
        self.out = out or sys.stdout
        self.indent = indent
        self._open: Literal["text", "thinking"] | None = None  # the paragraph the line is in
        self._live: LiveText | None = None  # what was shown of the model call in flight
        isatty = getattr(self.out, "isatty", None)
        self._dim = bool(isatty and isatty())

    def _line(self, text: str) -> None:
        self._close_text()
        self.out.write(f"{self.indent}{text}\n")
        self.out.flush()

    def _close_text(self) -> None:
        if self._open is not None:
            self.out.write("\n")
            self._open = None

    def _text(self, text: str, kind: Literal["text", "thinking"] = "text") -> None:
        """Write a piece of the answer's text, or of its thinking (each line marked, dimmed)."""
        if not text:
            return
        mark = "∴ " if kind == "thinking" else ""
        if self._open != kind:
            self._close_text()
            self.out.write(self.indent + mark)
            self._open = kind
        shown = text.replace("\n", "\n" + self.indent + mark)
        self.out.write(f"\x1b[2m{shown}\x1b[0m" if mark and self._dim else shown)
        self.out.flush()

    def show_live(self, live: LiveText) -> None:
        """Print what is new of a streaming model call, its thinking apart from its text; a
        retry starts afresh."""
        shown = self._live
        if shown is not None and live.attempt != shown.attempt:
            self._line(f"↻ the model call is retried (attempt {live.attempt}); its answer so far:")
            shown = None
        for part in ("thinking", "text"):
            now, before = getattr(live, part), getattr(shown, part, "")
            self._text(now[len(before) :] if now.startswith(before) else now, part)
        self._live = live

    def show(self, record: EventRecord | LiveText) -> None:
        """Print one event (some, such as ``turn_end``, print nothing)."""
        if isinstance(record, LiveText):
            self.show_live(record)
            return
        event = record.event
        live = self._live
        if isinstance(event, ThinkingEvent) and live is not None and live.thinking:
            # the durable thinking of a call shown while it streamed: print only what is missing
            if event.text.startswith(live.thinking):
                self._text(event.text[len(live.thinking) :], "thinking")
            else:
                self._line(f"∴ thinking: {_one_line(event.text)}")
            # the text's event follows (then the same for the text), or the call has none
            self._live = live.model_copy(update={"thinking": ""}) if live.text else None
        elif isinstance(event, TextDeltaEvent):
            # the durable text of a call that was shown while it streamed: print only what is missing
            live, self._live = self._live, None
            if live is not None and event.text.startswith(live.text):
                self._text(event.text[len(live.text) :])
            else:
                if live is not None:
                    self._close_text()
                self._text(event.text)
        else:
            for line in _lines(event):
                self._line(line)

    def finish(self) -> None:
        """End a pending line of model text."""
        self._close_text()
        self.out.flush()


def _tool_end(event: ToolEndEvent) -> str:
    if event.is_error:
        return f"← error: {_one_line(event.output)}"
    lines = len(event.output.splitlines())
    more = "+" if event.output_chars > len(event.output) else ""
    return f"← ok ({lines}{more} line{'' if lines == 1 else 's'})"


_PROMPT_LABELS = {
    "follow_up": "prompt",
    "steer": "steer",
    "resume_prompt": "resume prompt",
    "output_retry": "asked for final_result",
}

# What each event prints, a line or several; an event not here prints nothing. The model's
# reasoning is marked as such and kept short: it is not the answer.
_FORMATS: dict[type[Any], Callable[[Any], str | list[str]]] = {
    ThinkingEvent: lambda e: f"∴ thinking: {_one_line(e.text)}",
    RunStartEvent: lambda e: f"▶ run started with model {e.model}",
    ToolStartEvent: lambda e: f"→ {e.name} {main_argument(e.name, e.input)}".rstrip(),
    ToolEndEvent: _tool_end,
    PermissionDeniedEvent: lambda e: f"⊘ {e.name}: {e.reason}",
    CheckpointExportedEvent: lambda e: (
        f"✓ export turn {e.turn} acknowledged {short_digest(e.content_digest)}"
    ),
    CheckpointExportFailedEvent: lambda e: f"✗ export turn {e.turn} failed: {e.reason}",
    PersistenceFailedEvent: lambda e: f"! checkpoint {e.operation} failed at turn {e.turn}: {e.reason}",
    ErrorEvent: lambda e: f"! error: {e.message}",
    UserMessageEvent: lambda e: f"» {_PROMPT_LABELS[e.kind]}: {_one_line(e.text)}",
    BudgetExhaustedEvent: lambda e: (
        f"$ budget exhausted: {budget_line(Budget(budget=e.budget, used=e.used, limit=e.limit))}; "
        "the run stops here"
    ),
    ToolsUnavailableEvent: lambda e: (
        f"! MCP server {e.server} unavailable this step ({e.reason}): {len(e.tools)} tools left out"
    ),
    HookRunEvent: hook_line,
    TodoEvent: lambda e: [
        f"☰ plan: {summary(e.todos)}",
        *(f"  {line}" for line in checklist_lines(e.todos)),
    ],
    FinalResultEvent: lambda e: f"✓ final result: {_one_line(json.dumps(e.output, ensure_ascii=False))}",
    SubagentStartEvent: subagent_line,
    SubagentEndEvent: subagent_line,
    RewindEvent: lambda e: (
        f"↶ rewound to turn {e.turn} of run {e.run_id} ({short_digest(e.content_digest)}): "
        + (f"workspace tree {e.tree[:12]}" if e.tree else "the files left as they were")
    ),
    EndEvent: lambda e: f"■ run ended: {e.status}",
}


def _lines(event: object) -> list[str]:
    """The lines ``event`` prints (``_FORMATS``)."""
    format_ = _FORMATS.get(type(event))
    if format_ is None:
        return []
    shown = format_(event)
    return [shown] if isinstance(shown, str) else shown


def print_result(result: AgentRunResult, out: TextIO | None = None) -> None:
    """The run's outcome: status, final text, counters and every export."""
    out = out or sys.stdout
    w = out.write
    w(f"\nResult: {result.status}\n")
    if result.error:
        w(f"  error: {result.error}\n")
    w(f"  session: {result.session_id}\n  run: {result.run_id}\n")
    if result.text:
        w("  final text:\n")
        for line in result.text.splitlines():
            w(f"    {line}\n")
    if result.output is not None:
        w("  output:\n")
        for line in json.dumps(result.output, indent=2, ensure_ascii=False).splitlines():
            w(f"    {line}\n")
    w(f"  tool calls: {result.tool_calls_count}\n")
    w(f"  tokens: {usage_line(result.usage)}\n")
    w(f"  exports acknowledged: {len(result.exports)}\n")
    for ref in result.exports:
        w(f"    turn {ref.turn}  {ref.content_digest}\n")
    w(f"  export failures: {len(result.export_failures) or 'none'}\n")
    for failure in result.export_failures:
        w(f"    turn {failure.turn}  {failure.content_digest}: {failure.reason}\n")
    for problem in result.persistence_failures:
        w(f"  checkpoint store problem: {problem}\n")
    out.flush()


def print_status(
    view: RunStatusView,
    out: TextIO | None = None,
    *,
    children_waiting: Sequence[tuple[str, PendingApproval]] = (),
) -> None:
    """The ``status`` query's answer, one field a line.

    Args:
        view: The answer.
        out: Where to write (default: standard output).
        children_waiting: Calls waiting for a decision in the run's children, with the
            workflow id of the child each waits in.
    """
    out = out or sys.stdout
    rows: list[tuple[str, object]] = [
        ("status", view.status + (" (cancel requested)" if view.cancel_requested else "")),
        ("session", view.session_id),
        ("run", view.run_id),
        ("model", view.model or "-"),
        ("turn", view.turn),
        ("tool calls", view.tool_calls),
        ("exports delivered", view.exports_delivered),
        ("export failures", view.export_failures),
        ("persistence failures", view.persistence_failures),
        ("last export", view.last_content_digest or "-"),
        ("tokens", usage_line(view.usage)),
    ]
    if view.cost_usd is not None:
        rows.append(("cost", f"${view.cost_usd:.4f} at the model's prices"))
    rows += [("budget", budget_line(budget)) for budget in view.budgets]
    waiting = [("", p) for p in view.pending_approvals]
    waiting += [(f" in subagent {workflow_id}", p) for workflow_id, p in children_waiting]
    for where, pending in waiting:
        target = f" {pending.target}" if pending.target else ""
        rows.append(
            (
                "waiting for approval",
                f"{pending.call_id}: {pending.tool}{target} {pending.arguments}{where} "
                f"(step {pending.step}, arguments {pending.arguments_digest})",
            )
        )
    if view.todos:
        rows.append(("plan", summary(view.todos)))
        rows += [("", line) for line in checklist_lines(view.todos)]
    if view.parent_workflow_id:
        rows.append(("parent", view.parent_workflow_id))
    rows += [("subagent", child_line(child)) for child in view.children]
    if view.output is not None:
        rows.append(("output", json.dumps(view.output, ensure_ascii=False)))
    if view.error:
        rows.append(("error", view.error))
    width = max(len(name) for name, _ in rows)
    for name, value in rows:
        out.write(f"{name + ':':<{width + 1}} {value}\n")
    out.flush()


def print_where_to_look(
    namespace: str,
    workflow_id: str,
    run_id: str,
    ui_base: str | None,
    exports: Path | None,
    *,
    restart_hint: bool = False,
    task_queue: str | None = None,
    programs: tuple[str, str] = ("durable-agent", "temporal"),
    db_file: Path | None = None,
    server_ports: tuple[int, int] | None = None,
    out: TextIO | None = None,
) -> None:
    """Where a person finds the run afterwards: the Web UI, the export files, the commands.

    ``programs``: how to call ``durable-agent`` and ``temporal`` from this shell (a path when
    they are not on PATH); ``task_queue``: the run's, when a worker must be started for it;
    ``server_ports``: the dev server's and its UI's, when not the defaults.
    """
    out = out or sys.stdout
    w = out.write
    agent, temporal = programs
    w("\nWhere to look:\n")
    if ui_base is not None:
        w(f"  Web UI:   {ui_base}/namespaces/{namespace}/workflows/{workflow_id}/{run_id}/history\n")
    else:
        w(f"  workflow: {workflow_id} (namespace {namespace})\n")
    if exports is not None:
        w(f"  exports:  {exports}\n")
    w(f"  commands: {agent} status {workflow_id}\n")
    w(f"            {agent} events {workflow_id}\n")
    w(f"            {temporal} workflow show -w {workflow_id}\n")
    if restart_hint:
        # With --exit the server is gone by the time anyone reads this; its history is not.
        db = shlex.quote(str(db_file or ".agent/temporal.db"))
        queue = f"AGENT_TASK_QUEUE={shlex.quote(task_queue)} " if task_queue else ""
        ports = f" --port {server_ports[0]} --ui-port {server_ports[1]}" if server_ports else ""
        w(
            f"  (--exit: the dev server stops now; its history stays in {db}.\n"
            f"   `{temporal} server start-dev --db-filename {db}{ports}` brings the UI back;\n"
            f"   the status and events commands also need a worker on the run's task queue:\n"
            f"   `{queue}{agent} worker`.)\n"
        )
    out.flush()
