"""A run's exports built from fixed inputs, and the copies of them that earlier code wrote.

``golden_exports()`` plays one run through ``LoopState`` (text, tool calls, one step of two
calls, an error result, non-ASCII text, a prior ended run in the session) and builds its
export at each tool boundary as the worker does (``ExportEncoder``). It uses only what the
code had before issue 21 added thinking, redacted thinking and images to the conversation,
so the same function ran on that code wrote ``tests/exports/before-21/`` (the filesystem
sink's manifests and parts, and ``portable.json``, the last export as ``durable-agent pack``
writes it)::

    git archive 51ec92e | tar -x -C /tmp/before-21
    PYTHONPATH=/tmp/before-21 python tests/export_fixtures.py tests/exports/before-21

An export of a run without the new blocks must stay byte-identical to those files
(``tests/test_export_blocks.py``).

``tests/exports/first.json`` is older still: the export of a run of one ``read``, as
the first version of the project wrote it (commit 35ac958, ``LoopState.checkpoint_export``).
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

from durable_agent.activities.sink_files import whole_document
from durable_agent.activities.sinks import FilesystemExportSink
from durable_agent.core.capability_binding import CapabilityBinding
from durable_agent.core.events import ModelUsageEvent, ToolStartEvent, TurnEndEvent
from durable_agent.core.export import RunRecord
from durable_agent.core.export_parts import ExportEncoder, PartedExport, build_parted
from durable_agent.core.loop import LoopState
from durable_agent.core.models import Message, ModelResponse, TextBlock, TokenUsage, ToolUseBlock
from durable_agent.core.permissions import PermissionPolicy
from durable_agent.core.plan import RunPlan
from durable_agent.core.run_log import RunLog, export_payload, run_snapshot

EXPORTS = Path(__file__).parent / "exports"
BEFORE_21 = EXPORTS / "before-21"
FIRST = EXPORTS / "first.json"
SESSION = "golden-session"
# Fixed, so that a change to the built-in tools' descriptions does not change these bytes.
BINDING = CapabilityBinding(
    catalog_generation=0,
    catalog_digest="sha256:" + "5" * 64,
    tools=("bash", "grep", "read"),
    permissions=PermissionPolicy(allow=("read(*)", "grep(*)", "bash(ls:*)"), default="deny"),
)


def golden_plan(run_id: str, prompt: str) -> RunPlan:
    return RunPlan(
        session_id=SESSION,
        run_id=run_id,
        prompt=prompt,
        workspace="/w",
        model="scripted/static",
        system_prompt="You are a careful coding agent.",
        tools=(),
        permissions=BINDING.permissions or PermissionPolicy(),
        capability_binding=BINDING,
        export_sink="local",
        max_tool_rounds=10,
    )


def _prior_run() -> RunRecord:
    """An ended run of the session: its record is in every export's snapshot."""
    state = LoopState(golden_plan("run-0", "say hello"), now_ms=1_000)
    state.add_model_response(
        ModelResponse(message=Message(role="assistant", content=(TextBlock(text="Hello."),))), 1_500
    )
    events = tuple(state.journal.events)
    snapshot = run_snapshot(state.journal.header(), events, "completed", 1_600, result_text="Hello.")
    return RunRecord(snapshot=snapshot, events=events)


def _step(state: LoopState, now_ms: int, text: str | None, *calls: ToolUseBlock) -> None:
    blocks = ((TextBlock(text=text),) if text else ()) + calls
    usage = TokenUsage(prompt_tokens=120, completion_tokens=12, total_tokens=132, cache_read_tokens=40)
    state.add_model_response(
        ModelResponse(message=Message(role="assistant", content=blocks), usage=usage), now_ms
    )
    state.journal.emit(ModelUsageEvent(step=state.tool_rounds, usage=usage, estimated_tokens=118), now_ms)
    for call in calls:
        state.journal.emit(ToolStartEvent.of(call.id, call.name, call.input), now_ms + 1)


def golden_exports() -> list[PartedExport]:
    """The exports of the run, one per tool boundary, as the filesystem sink is handed them."""
    prior = [_prior_run()]
    state = LoopState(golden_plan("run-1", "Read a.txt, find TODOs, list the folder."), now_ms=10_000)
    log, encoder = RunLog("run-1"), ExportEncoder()
    out: list[PartedExport] = []

    def result(call: ToolUseBlock, output: str, is_error: bool, now_ms: int) -> None:
        state.add_tool_result(call, output, is_error, now_ms)
        entry = state.journal.take_entry()
        assert entry is not None
        log.apply(entry)
        payload = export_payload(state.journal.header(), log, prior, state.export_facts(now_ms + 5))
        out.append(build_parted(encoder, payload))

    read = ToolUseBlock(id="c1", name="read", input={"file_path": "a.txt"})
    _step(state, 11_000, "Reading a.txt — ä ☃ first.", read)
    result(read, "     1\talpha ä ☃\n     2\tTODO: beta\n", False, 12_000)
    state.journal.emit(TurnEndEvent(turn=1, usage=state.usage), 12_010)
    grep = ToolUseBlock(id="c2", name="grep", input={"pattern": "TODO", "path": "."})
    ls = ToolUseBlock(id="c3", name="bash", input={"command": "ls -la /root"})
    _step(state, 13_000, None, grep, ls)
    result(grep, "a.txt:2:TODO: beta", False, 14_000)
    result(ls, "permission denied: bash(ls -la /root) is outside the workspace", True, 15_000)
    return out


async def write_golden(root: Path) -> None:
    """Deliver the exports to a filesystem sink at ``root``; the last one packed as ``portable.json``."""
    exports = golden_exports()
    sink = FilesystemExportSink(root)
    for export in exports:
        await sink.deliver_parts(export)
    (root / "portable.json").write_bytes(whole_document(exports[-1].whole()))


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python tests/export_fixtures.py OUT_FOLDER")
    asyncio.run(write_golden(Path(sys.argv[1])))
