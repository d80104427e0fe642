"""The ``agent.tool_call`` activity: one tool call run in the run's workspace."""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from temporalio import activity
from temporalio.exceptions import ApplicationError

from durable_agent.activities.redact import Redactor
from durable_agent.activities.staging import stage, stage_images, staged_text
from durable_agent.activities.store.session_store import SessionStore
from durable_agent.activities.support import heartbeating, state_missing
from durable_agent.activities.tools.path_guard import READ_DENIED, check_resolved, read_denier
from durable_agent.activities.tools.tool import CURRENT_CALL, Tool, ToolContent, ToolFailure
from durable_agent.activities.workspace_tree import WorkspaceTooLarge, WorkspaceTrees
from durable_agent.activities.workspaces.copies import WorkspaceCopies
from durable_agent.activities.workspaces.holds import entered, left, restore_note
from durable_agent.core.activity_api import TOOL_CALL, ToolCallInput, ToolOutput
from durable_agent.core.models import ImageBlock, Message
from durable_agent.core.run_log import StateMissing, recorded_result
from durable_agent.core.surrogates import text_without_lone_surrogates
from durable_agent.core.tool_specs import ToolCallError, validate_args
from durable_agent.telemetry_spans import ActivityTelemetry, ToolCallSpan, activity_metrics

log = logging.getLogger(__name__)

# How many log entries after a local call's ``recorded_after`` are read to find its output: a
# lost workflow task stores at most its model message and one boundary per call of the answer.
RECORDED_LOOKAHEAD = 256


@dataclass(eq=False)
class ToolCalls:
    """Runs this worker's tools; expected failures become tool errors the model sees."""

    tools: Mapping[str, Tool]
    store: SessionStore
    redact: Redactor
    telemetry: ActivityTelemetry = field(default_factory=ActivityTelemetry)
    # records the workspace after a call to a tool that may change files (None: never)
    workspace_trees: WorkspaceTrees | None = None
    # keeps this machine's copy of a run's workspace at the run's tree (None: never followed)
    copies: WorkspaceCopies | None = None

    @activity.defn(name=TOOL_CALL.name)
    async def tool_call(self, inp: ToolCallInput) -> ToolOutput:
        """Run one tool call in the workspace; expected failures become tool errors."""
        if inp.recorded_after is not None and (recorded := await self._recorded(inp)) is not None:
            return recorded
        if inp.expect_tree is not None and self.copies is not None:
            return await self._followed(inp, self.copies)
        output = await self._observed(inp)
        update: dict[str, Any] = {"completed_at_ms": int(time.time() * 1000)}
        trees = self.workspace_trees
        # a tool that may change files ran (or was refused its arguments): record the workspace
        if trees is not None and self._changes(inp) and output.permission is None:
            update["workspace"] = await heartbeating(trees.record(Path(inp.workspace), inp.sink))
            update["completed_at_ms"] = int(time.time() * 1000)
        return output.model_copy(update=update)

    def _changes(self, inp: ToolCallInput) -> bool:
        """Whether the call's tool may change files (an unknown tool runs nothing)."""
        tool = self.tools.get(inp.name)
        return tool is not None and not tool.spec.read_only

    async def _observed(self, inp: ToolCallInput) -> ToolOutput:
        known = inp.name in self.tools
        with self.telemetry.tool_call(inp, known=known) as observed:
            output = await self._tool_call(inp, observed)
            observed.finished(output, known=known)
        return output

    async def _followed(self, inp: ToolCallInput, copies: WorkspaceCopies) -> ToolOutput:
        """A call of a run whose workspace follows it: this machine's copy made equal to the
        tree the run expects, the call run, and the new tree recorded, its objects in the sink,
        before the call returns (``activities/workspaces/copies.py``)."""
        assert inp.expect_tree is not None
        changes = self._changes(inp)
        where = (inp.workspace, inp.expect_tree, inp.sink, inp.host, inp.take_over)
        held = await entered(copies, *where, changes=changes, redact=self.redact)
        if held is None:
            return ToolOutput(
                content=f"the run's workspace is on worker {inp.host}, not here ({copies.host})",
                is_error=True,
                elsewhere=True,
                host=copies.host,
            )
        try:
            output = await self._observed(inp)
        except BaseException:
            await copies.leave(held, None, record=False)
            raise
        recorded = changes and output.permission is None
        try:
            state = await left(copies, held, inp.sink, self.redact, record=recorded)
        except WorkspaceTooLarge as exc:
            return ToolOutput(
                content=f"{output.content}\n\n[{exc}: the call's changes to files were undone, "
                "nothing was recorded. Remove or leave out (.gitignore) large files, then try again.]",
                is_error=True,
                host=copies.host,
                restored=held.restored,
                completed_at_ms=int(time.time() * 1000),
            )
        update: dict[str, Any] = {
            "completed_at_ms": int(time.time() * 1000),
            "host": copies.host,
            "workspace": state,
            "restored": held.restored,
        }
        notes = ""
        if held.restored is not None:
            restored = held.restored
            seconds = restored.duration_ms / 1000
            activity_metrics().workspace_restored(restored.reason, restored.bytes, seconds)
            notes += restore_note(restored)
        if notes := notes + (held.setup or ""):
            update["content"] = output.content + notes
            update["staged"] = False  # the staged text is the output without the notes
        return output.model_copy(update=update)

    async def _tool_call(self, inp: ToolCallInput, observed: ToolCallSpan) -> ToolOutput:
        tool = self.tools.get(inp.name)
        if tool is None:
            return ToolOutput(content=f"unknown tool {inp.name!r} on this worker", is_error=True)
        if inp.arguments_in is None:
            arguments = inp.arguments
        else:
            arguments = await self._staged_arguments(inp)
            observed.arguments(arguments)
        try:
            args = validate_args(tool.spec, arguments)
            if (refused := check_resolved(inp, tool.spec, arguments)) is not None:
                return refused
            if inp.permissions is not None:
                READ_DENIED.set(read_denier(inp.permissions, Path(inp.workspace).resolve()))
            CURRENT_CALL.set(inp)
            content = await heartbeating(tool.run(args, Path(inp.workspace)))
        except (ToolCallError, ToolFailure) as exc:
            return ToolOutput(content=self.redact(text_without_lone_surrogates(str(exc))), is_error=True)
        except Exception as exc:
            log.exception("tool %s of run %s failed", inp.name, inp.run_id)
            # Temporal retries it, unless the tool is not safe to repeat: a bug of ours, not the
            # command's, is no reason to run the command again. Without the cause chain, whose
            # text would reach the history unredacted.
            raise ApplicationError(
                self.redact(f"{inp.name} failed: {exc}"),
                type=type(exc).__name__,
                non_retryable=not tool.spec.repeatable,
            ) from None
        images: tuple[ImageBlock, ...] = ()
        if isinstance(content, ToolContent):
            # kept in the store before the call returns: the history will hold only their digests
            images = await heartbeating(stage_images(self.store, inp.run_id, content.images))
            content = content.text
        # an MCP server's or a tool of your own's text may hold a lone surrogate, which no UTF-8
        # encoder (a payload, the store, an export) takes: replaced, as in model output
        content = self.redact(text_without_lone_surrogates(content))
        # A local call's output goes to the boundary's local activity, whose input the history
        # does not record: nothing to save by keeping it in the store first.
        staged = inp.recorded_after is None and await stage(self.store, inp.run_id, content)
        return ToolOutput(content=content, staged=staged, images=images)

    async def _recorded(self, inp: ToolCallInput) -> ToolOutput | None:
        """The output of a local call whose boundary a lost attempt of the workflow task
        already stored and exported (``recorded_result``); None on the usual path, where the
        store holds nothing after ``recorded_after``."""
        after = inp.recorded_after
        assert after is not None
        entries = await self.store.read_log(inp.run_id, after.version, after.version + RECORDED_LOOKAHEAD)
        found = recorded_result(entries, after, inp.call_id)
        if found is None:
            return None
        log.info(
            "tool call %s of run %s: its boundary was exported already; output kept", inp.call_id, inp.run_id
        )
        block = found.block
        return ToolOutput(
            content=block.content,
            is_error=block.is_error,
            images=block.images,
            permission="denied" if found.denied else None,
            completed_at_ms=found.ended_at_ms,
        )

    async def _staged_arguments(self, inp: ToolCallInput) -> dict[str, Any]:
        """The call's arguments, from the model message the model activity staged."""
        assert inp.arguments_in is not None
        text = await staged_text(self.store, inp.run_id, inp.arguments_in)
        if text is not None:
            for call in Message.model_validate_json(text).tool_uses():
                if call.id == inp.call_id:
                    return call.input
        missing = StateMissing(f"the store does not hold the model message with call {inp.call_id}")
        raise state_missing(missing)
