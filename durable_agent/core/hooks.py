"""Hooks: commands of the worker's ``[hooks]`` run at four moments of a run, as Claude Code's.

At ``pre_tool_use`` (before a tool call runs), ``post_tool_use`` (after it ran),
``user_prompt_submit`` (a prompt or a follow-up is taken) and ``stop`` (the run ends), each
hook of that moment whose ``matcher`` fits the tool's name runs as ``/bin/bash -c COMMAND``
in the ``bash`` tool's sandbox, in the workspace, with a JSON document on stdin
(``HookDocument``: Claude Code's field names, plus ``run_id``). Its exit code decides:

- 0: the run goes on (``"continue"``);
- 2: the call (or prompt) is refused, and the hook's stderr is the reason the model is
  given (``"block"``);
- anything else, a timeout, a sandbox that cannot start: recorded, the run goes on
  (``"error"``).

Each run is one ``agent.hook`` activity (``activities/hook_call.py``), and each outcome a
``hook_run`` event (``HookRunEvent``) in the run's events and exports. The run's plan carries
the hooks (``RunPlan.hooks``, resolved once at the run's start): a replay sees the hooks its
run started with, whatever the worker's config says now.

Pure: the workflow picks the hooks with ``hooks_for``, builds their document with
``hook_document`` (and the activity's input with ``activity_api.hook_call``), and reads the
outcomes with ``block_reason`` and ``hook_event``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Literal, get_args

import re2
from pydantic import Field, field_validator, model_validator

from durable_agent.core.events import TOOL_OUTPUT_PREVIEW_CHARS, HookRunEvent
from durable_agent.core.models import Frozen, Sparse, WorkspaceRestore, WorkspaceState

# The four moments, defined beside the ``hook_run`` event that names them; exported here too.
from durable_agent.core.models import HookEventName as HookEventName

HOOK_EVENTS: tuple[HookEventName, ...] = get_args(HookEventName)
# The events whose hooks name tools (``matcher``); the others run for every prompt or stop.
TOOL_EVENTS: frozenset[HookEventName] = frozenset({"pre_tool_use", "post_tool_use"})
# ``hook_event_name`` in the document: Claude Code's names, so that its hook scripts run as they are.
CLAUDE_EVENT_NAMES: Mapping[HookEventName, str] = MappingProxyType(
    {
        "pre_tool_use": "PreToolUse",
        "post_tool_use": "PostToolUse",
        "user_prompt_submit": "UserPromptSubmit",
        "stop": "Stop",
    }
)
# The longest a hook may be given; the default is ``[timeouts] hook_seconds``.
HOOK_MAX_TIMEOUT_SECONDS = 3600
# The exit code that blocks, as in Claude Code.
BLOCK_EXIT_CODE = 2
# A hook's stdout and stderr are each kept as their first and last bytes: the outcome travels
# in the run's history and its reason to the model.
HOOK_OUTPUT_HEAD_BYTES = 4_000
HOOK_OUTPUT_TAIL_BYTES = 4_000
# What one command, and all of them together, may hold: the plan carries them in the run's
# payloads (a longer script goes in a file the command runs).
HOOK_COMMAND_MAX_CHARS = 8_192
HOOKS_MAX_CHARS = 32_768
# A string of the document (an argument, a tool's output, a prompt) past this is cut, with a
# note of how much: the document is part of the activity's input, within Temporal's payload limit.
HOOK_VALUE_MAX_CHARS = 65_536

_RE2_OPTIONS = re2.Options()
_RE2_OPTIONS.log_errors = False  # a bad pattern is reported by the config's check, not printed
# A matcher of only these characters names tools (``bash``, ``write|edit``); any other is a
# regular expression, as in Claude Code.
_PLAIN_NAMES = re2.compile(r"[A-Za-z0-9_|]+", _RE2_OPTIONS)


def _compile(matcher: str) -> re2._Regexp[str]:
    try:
        return re2.compile(matcher, _RE2_OPTIONS)
    except re2.error as exc:
        arg = exc.args[0] if exc.args else exc
        reason = arg.decode(errors="replace") if isinstance(arg, bytes) else str(arg)
        raise ValueError(f"matcher {matcher!r} is not a valid regular expression (RE2): {reason}") from None


def matches(matcher: str, tool_name: str) -> bool:
    """Whether a hook's ``matcher`` takes the tool ``tool_name``, as Claude Code's matchers do.

    Args:
        matcher: Empty or ``*``: every tool. Only letters, digits, ``_`` and ``|``: those tool
            names, exactly (``bash``, ``write|edit``). Anything else: a regular expression
            (RE2) searched for in the name (``mcp__github__.*``, ``^mcp__``).
        tool_name: The name of the tool called, as the model called it.

    Returns:
        Whether the hook runs for that tool.
    """
    if matcher in ("", "*"):
        return True
    if _PLAIN_NAMES.fullmatch(matcher) is not None:
        return tool_name in matcher.split("|")
    return _compile(matcher).search(tool_name) is not None


class HookConfig(Frozen):
    """One hook: ``[[hooks.EVENT]]``, a command run at that moment of every run."""

    # The tools it runs for (``pre_tool_use`` and ``post_tool_use`` only): empty or "*" every
    # tool; names with "|" between them ("write|edit") those exactly; anything else a regular
    # expression (RE2) searched for in the tool's name ("^mcp__github__").
    matcher: str = ""
    # Run as ``/bin/bash -c COMMAND`` in the bash tool's sandbox, in the workspace, the JSON
    # document on stdin; exit 0 goes on, exit 2 blocks with its stderr as the reason, any other
    # exit is recorded and the run goes on.
    command: str = Field(min_length=1, max_length=HOOK_COMMAND_MAX_CHARS)
    # Stopped after this long, which counts as an error (unset: ``[timeouts] hook_seconds``).
    timeout_seconds: float | None = Field(None, gt=0, le=HOOK_MAX_TIMEOUT_SECONDS)

    @field_validator("matcher")
    @classmethod
    def _valid_matcher(cls, matcher: str) -> str:
        if matcher not in ("", "*") and _PLAIN_NAMES.fullmatch(matcher) is None:
            _compile(matcher)
        return matcher


class HooksConfig(Frozen):
    """``[hooks]``: commands run at four moments of every run, as Claude Code's hooks (see the
    Tool hooks page). Each moment takes a list, ``[[hooks.pre_tool_use]]`` and so on, run in
    order."""

    # Before a tool call runs (after the permission rules allowed it): exit 2 refuses the call.
    pre_tool_use: tuple[HookConfig, ...] = ()
    # After a tool call ran: exit 2 adds the hook's stderr to what the model is told.
    post_tool_use: tuple[HookConfig, ...] = ()
    # When the run takes a prompt (its first, a follow-up): exit 2 refuses the prompt.
    user_prompt_submit: tuple[HookConfig, ...] = ()
    # When the run ends (completed, failed or cancelled): its outcome is recorded.
    stop: tuple[HookConfig, ...] = ()

    @model_validator(mode="before")
    @classmethod
    def _known_events(cls, data: Any) -> Any:
        if isinstance(data, dict):
            unknown = sorted(str(k) for k in data if k not in HOOK_EVENTS)
            if unknown:
                ours = {claude: event for event, claude in CLAUDE_EVENT_NAMES.items()}
                named = ", ".join(f"{u!r} (write it {ours[u]})" if u in ours else repr(u) for u in unknown)
                raise ValueError(f"unknown hook event {named}: the events are {', '.join(HOOK_EVENTS)}")
        return data

    @model_validator(mode="after")
    def _matchers_on_tool_events(self) -> HooksConfig:
        total = sum(len(h.command) + len(h.matcher) for event in HOOK_EVENTS for h in self.of(event))
        if total > HOOKS_MAX_CHARS:
            raise ValueError(
                f"the hooks' commands and matchers hold {total} characters together, over {HOOKS_MAX_CHARS}: "
                "a run's plan carries them in its payloads (put a long script in a file the command runs)"
            )
        for event in HOOK_EVENTS:
            if event in TOOL_EVENTS:
                continue
            for index, hook in enumerate(self.of(event)):
                if hook.matcher not in ("", "*"):
                    raise ValueError(
                        f"{event}[{index}]: matcher {hook.matcher!r} is for the tool events "
                        f"({', '.join(sorted(TOOL_EVENTS))}); a {event} hook runs every time"
                    )
        return self

    def of(self, event: HookEventName) -> tuple[HookConfig, ...]:
        """The hooks of ``event``, in their order."""
        hooks: tuple[HookConfig, ...] = getattr(self, event)
        return hooks

    @property
    def empty(self) -> bool:
        """No hook at all."""
        return not any(self.of(event) for event in HOOK_EVENTS)


@dataclass(frozen=True)
class HookRef:
    """A hook of the plan and its position in its event's list (what its events name)."""

    index: int
    hook: HookConfig


def hooks_for(hooks: HooksConfig, event: HookEventName, tool_name: str | None = None) -> tuple[HookRef, ...]:
    """The hooks to run at ``event``, in order: for the tool events, those whose matcher takes
    ``tool_name``.

    Args:
        hooks: The run's hooks (``RunPlan.hooks``).
        event: The moment.
        tool_name: The tool called (``pre_tool_use``, ``post_tool_use``); ignored otherwise.

    Returns:
        Each hook to run with its index in the event's list.
    """
    listed = hooks.of(event)
    if event in TOOL_EVENTS:
        name = tool_name or ""
        return tuple(HookRef(i, h) for i, h in enumerate(listed) if matches(h.matcher, name))
    return tuple(HookRef(i, h) for i, h in enumerate(listed))


# --- what a hook reads on stdin ---------------------------------------------------------------


class ToolResponse(Frozen):
    """A tool call's result, for ``post_tool_use``: its text (cut past ``HOOK_VALUE_MAX_CHARS``)."""

    content: str
    is_error: bool = False


class HookDocument(Sparse):
    """The JSON a hook reads on stdin: Claude Code's fields, those of its event, plus ``run_id``.
    Fields that do not belong to the event are left out of the JSON."""

    session_id: str
    run_id: str
    cwd: str  # the workspace, also the command's working folder
    hook_event_name: Literal["PreToolUse", "PostToolUse", "UserPromptSubmit", "Stop"]
    tool_name: str | None = None
    tool_use_id: str | None = None
    tool_input: dict[str, Any] | None = None
    tool_response: ToolResponse | None = None
    prompt: str | None = None
    # ``stop``: how the run ended, and its last answer; ``stop_hook_active`` as Claude Code
    # sends it (always false: a stop hook never makes the run go on here)
    status: Literal["completed", "failed", "cancelled"] | None = None
    result: str | None = None
    stop_hook_active: bool | None = None

    # only the document's own fields: a None inside ``tool_input`` is the model's and stays
    left_out_at_default = (
        "tool_name",
        "tool_use_id",
        "tool_input",
        "tool_response",
        "prompt",
        "status",
        "result",
        "stop_hook_active",
    )


def _cut(text: str) -> str:
    if len(text) <= HOOK_VALUE_MAX_CHARS:
        return text
    more = len(text) - HOOK_VALUE_MAX_CHARS
    return f"{text[:HOOK_VALUE_MAX_CHARS]}…[{more} more characters]"


def _bounded(value: Any) -> Any:
    if isinstance(value, str):
        return _cut(value)
    if isinstance(value, dict):
        return {k: _bounded(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_bounded(v) for v in value]
    return value


def hook_document(
    event: HookEventName,
    *,
    session_id: str,
    run_id: str,
    workspace: str,
    tool_use_id: str | None = None,
    tool_name: str | None = None,
    arguments: dict[str, Any] | None = None,
    output: str | None = None,
    is_error: bool = False,
    prompt: str | None = None,
    status: Literal["completed", "failed", "cancelled"] | None = None,
    result: str | None = None,
) -> HookDocument:
    """The document a hook of ``event`` reads on stdin; long strings cut to ``HOOK_VALUE_MAX_CHARS``.

    Args:
        event: The moment.
        session_id: The run's session (``RunPlan.session_id``).
        run_id: The run (``RunPlan.run_id``).
        workspace: The run's workspace (``RunPlan.workspace``), the document's ``cwd``.
        tool_use_id: The call's id (the tool events).
        tool_name: The tool called (the tool events).
        arguments: The call's input (the tool events): ``tool_input``.
        output: The call's result text (``post_tool_use``): ``tool_response.content``.
        is_error: Whether the call failed (``post_tool_use``).
        prompt: The prompt taken (``user_prompt_submit``).
        status: How the run ended (``stop``).
        result: The run's last answer (``stop``).

    Returns:
        The document, with only the fields of its event.
    """
    base = HookDocument(
        session_id=session_id, run_id=run_id, cwd=workspace, hook_event_name=CLAUDE_EVENT_NAMES[event]
    )
    fields: dict[str, Any] = {}
    if event in TOOL_EVENTS:
        fields.update(
            tool_name=tool_name or "", tool_use_id=tool_use_id, tool_input=_bounded(arguments or {})
        )
        if event == "post_tool_use":
            fields["tool_response"] = ToolResponse(content=_cut(output or ""), is_error=is_error)
    elif event == "user_prompt_submit":
        fields["prompt"] = _cut(prompt or "")
    else:
        fields.update(
            status=status, result=_cut(result) if result is not None else None, stop_hook_active=False
        )
    return base.model_copy(update=fields)


# --- the activity's input and outcome ------------------------------------------------------------


class HookInput(Frozen):
    """``agent.hook``'s input: one hook to run, with the document it reads on stdin."""

    run_id: str
    workspace: str
    event: HookEventName
    index: int  # the hook's position in its event's list
    hook: HookConfig
    document: HookDocument
    # the hook's time limit (the hook's own, else ``[timeouts] hook_seconds``)
    timeout_seconds: float = Field(gt=0)
    # A run whose workspace follows it (docs/workspaces.md), as ``ToolCallInput``'s: the tree the
    # copy must be at before the hook runs, the run's host, whether to take the run over, and the
    # sink the tree the hook leaves goes to (a hook may change files).
    expect_tree: str | None = None
    host: str | None = None
    take_over: bool = False
    sink: str | None = None


HookDecision = Literal["continue", "block", "error"]


class HookOutcome(Frozen):
    """What a hook did. Never a failure of the activity: a hook that fails is ``"error"``."""

    decision: HookDecision
    exit_code: int | None = None  # None: stopped at its timeout, or never started
    stdout: str = ""  # its first and last HOOK_OUTPUT_*_BYTES, redacted
    stderr: str = ""
    # "block": the hook's stderr (what the model is told); "error": what went wrong
    reason: str | None = None
    timed_out: bool = False
    duration_ms: int = 0
    # when the activity returned (epoch ms), for the workflow to stamp its event with
    completed_at_ms: int | None = None
    # A run whose workspace follows it, as ``ToolOutput``'s: the tree the hook left (its objects
    # in the sink), the worker that held the copy, the restore it made first; or ``elsewhere``:
    # the hook did not run, the run's host is another worker.
    workspace: WorkspaceState | None = None
    host: str | None = None
    restored: WorkspaceRestore | None = None
    elsewhere: bool = False


def decide(exit_code: int, stderr: str) -> tuple[HookDecision, str | None]:
    """The decision of a hook that exited with ``exit_code``, and its reason.

    Args:
        exit_code: The command's exit code.
        stderr: What it wrote to stderr (bounded).

    Returns:
        ("continue", None) for 0; ("block", the stderr) for 2; ("error", the exit code and
        stderr) otherwise.
    """
    said = stderr.strip()
    if exit_code == 0:
        return "continue", None
    if exit_code == BLOCK_EXIT_CODE:
        return "block", said or "blocked by a hook (exit code 2) that gave no reason on stderr"
    return "error", f"exit code {exit_code}" + (f": {said}" if said else "")


def block_reason(outcomes: list[HookOutcome] | tuple[HookOutcome, ...]) -> str | None:
    """Why the hooks of one moment block, or None when none does.

    Args:
        outcomes: The outcomes of the hooks that ran at the moment, in order.

    Returns:
        The reasons of the blocking hooks, one per line; None when every hook went on or failed.
    """
    reasons = [o.reason or "" for o in outcomes if o.decision == "block"]
    return "\n".join(reasons) if reasons else None


def hook_event(inp: HookInput, outcome: HookOutcome) -> HookRunEvent:
    """The ``hook_run`` event that records ``outcome`` of the hook ``inp`` ran.

    Args:
        inp: The activity's input.
        outcome: Its result.

    Returns:
        The event, with the command and the reason cut to ``TOOL_OUTPUT_PREVIEW_CHARS``.
    """
    doc = inp.document
    return HookRunEvent(
        event=inp.event,
        hook=inp.index,
        command=inp.hook.command[:TOOL_OUTPUT_PREVIEW_CHARS],
        decision=outcome.decision,
        exit_code=outcome.exit_code,
        reason=outcome.reason[:TOOL_OUTPUT_PREVIEW_CHARS] if outcome.reason is not None else None,
        tool_use_id=doc.tool_use_id,
        tool_name=doc.tool_name,
        duration_ms=outcome.duration_ms,
    )


def failed_outcome(reason: str) -> HookOutcome:
    """The outcome to record when ``agent.hook`` itself failed after its retries (a worker lost
    each time): an error, and the run goes on.

    Args:
        reason: The activity's failure, for the record.

    Returns:
        An ``"error"`` outcome.
    """
    return HookOutcome(decision="error", reason=f"the hook could not be run: {reason}")
