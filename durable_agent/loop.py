"""The agent loop's state and step logic, as pure functions of what happened.

The workflow feeds it model responses and tool outputs with workflow time; it
keeps the conversation, the event log and the counters, and builds the
checkpoint at a tool boundary. Tests drive it without a server.
"""

from __future__ import annotations

from durable_agent.checkpoint import (
    CheckpointPayload,
    LoopCheckpoint,
    RunRecord,
    RunSnapshot,
    RunStatus,
    SessionCheckpointExportV1,
    SessionSnapshot,
)
from durable_agent.models import (
    AgentEvent,
    EndEvent,
    EventRecord,
    Message,
    ModelResponse,
    RunStartEvent,
    TextBlock,
    TextDeltaEvent,
    TokenUsage,
    ToolEndEvent,
    ToolResultBlock,
    ToolUseBlock,
)
from durable_agent.run_io import (
    AgentRunResult,
    CarriedState,
    ExportFailure,
    ExportRef,
    FinalStatus,
    PendingApproval,
    RunPlan,
    RunStatusView,
)


class LoopState:
    """One run's conversation, events and counters."""

    def __init__(
        self,
        plan: RunPlan,
        now_ms: int,
        prior_runs: tuple[RunRecord, ...] = (),
        resume: LoopCheckpoint | None = None,
    ) -> None:
        """A new run of ``plan``; with ``resume``, one that goes on from that checkpoint's conversation."""
        self.plan = plan
        self.prior_runs = prior_runs  # the session's ended runs, for the snapshot
        self.created_at_ms = now_ms
        self.updated_at_ms = now_ms
        self.status: RunStatus = "executing"
        if resume is None:
            self.messages: list[Message] = [Message(role="user", content=(TextBlock(text=plan.prompt),))]
        else:
            self.messages = list(resume.messages)
        self.events: list[EventRecord] = []
        # a resumed conversation's running total goes on: it is what the conversation cost
        self.usage = resume.total_usage if resume is not None else TokenUsage()
        self.turn = 0  # completed tool calls, i.e. tool boundaries
        self.tool_rounds = 0  # model responses that asked for tools
        self.final_text = ""
        self.error: str | None = None
        self.exports: list[ExportRef] = []
        self.export_failures: list[ExportFailure] = []
        self.persistence_failures: list[str] = []
        source = plan.resumed_from
        lineage = (
            f"{source.session_id}/{source.run_id} at turn {source.turn}, {source.content_digest}"
            if source
            else None
        )
        self.emit(RunStartEvent(prompt=plan.prompt, model=plan.model, resumed_from=lineage), now_ms)

    # --- recording ----------------------------------------------------------

    def emit(self, event: AgentEvent, now_ms: int) -> EventRecord:
        record = EventRecord(sequence=len(self.events) + 1, timestamp_ms=now_ms, event=event)
        self.events.append(record)
        self.updated_at_ms = now_ms
        return record

    def add_model_response(self, response: ModelResponse, now_ms: int) -> list[ToolUseBlock]:
        """Record the assistant's step; return the tool calls it asks for."""
        self.messages.append(response.message)
        self.usage = self.usage + response.usage
        text = response.message.text()
        if text:
            self.emit(TextDeltaEvent(text=text), now_ms)
        calls = response.message.tool_uses()
        if calls:
            self.tool_rounds += 1
        else:
            self.final_text = text
        return calls

    def add_tool_result(self, call: ToolUseBlock, output: str, is_error: bool, now_ms: int) -> None:
        """Record a finished tool call: its ``tool_end`` event and its tool-result block.

        The results of one assistant step share one user message, which grows
        as each call finishes, so every boundary's conversation is well formed.
        """
        self.emit(ToolEndEvent.of(call.id, call.name, output, is_error), now_ms)
        block = ToolResultBlock(tool_use_id=call.id, content=output, is_error=is_error)
        last = self.messages[-1]
        if last.role == "user" and all(isinstance(b, ToolResultBlock) for b in last.content):
            self.messages[-1] = Message(role="user", content=(*last.content, block))
        else:
            self.messages.append(Message(role="user", content=(block,)))
        self.turn += 1

    @classmethod
    def restore(cls, carried: CarriedState) -> LoopState:
        """The state a run carried into this execution when it continued as new."""
        state = cls.__new__(cls)
        state.plan = carried.plan
        state.prior_runs = carried.prior_runs
        state.created_at_ms = carried.created_at_ms
        state.updated_at_ms = carried.events[-1].timestamp_ms if carried.events else carried.created_at_ms
        state.status = "executing"
        state.messages = list(carried.messages)
        state.events = list(carried.events)
        state.usage = carried.usage
        state.turn = carried.turn
        state.tool_rounds = carried.tool_rounds
        state.final_text = ""
        state.error = None
        state.exports = list(carried.exports)
        state.export_failures = list(carried.export_failures)
        state.persistence_failures = list(carried.persistence_failures)
        return state

    def carry(self, executions: int) -> CarriedState:
        """What the next execution needs to go on as this run."""
        return CarriedState(
            plan=self.plan,
            created_at_ms=self.created_at_ms,
            turn=self.turn,
            tool_rounds=self.tool_rounds,
            usage=self.usage,
            messages=tuple(self.messages),
            events=tuple(self.events),
            exports=tuple(self.exports),
            export_failures=tuple(self.export_failures),
            persistence_failures=tuple(self.persistence_failures),
            prior_runs=self.prior_runs,
            executions=executions,
        )

    def pending_calls(self) -> list[ToolUseBlock]:
        """Tool calls of the last model step that have no result yet (a resume mid-step)."""
        for index in range(len(self.messages) - 1, -1, -1):
            message = self.messages[index]
            if message.role == "assistant":
                answered = {
                    block.tool_use_id
                    for later in self.messages[index + 1 :]
                    for block in later.content
                    if isinstance(block, ToolResultBlock)
                }
                return [call for call in message.tool_uses() if call.id not in answered]
        return []

    def finish(self, status: FinalStatus, now_ms: int, error: str | None = None) -> None:
        self.status = status
        self.error = error
        self.emit(EndEvent(status=status, text=self.final_text, usage=self.usage), now_ms)

    # --- views ----------------------------------------------------------------

    def snapshot(self) -> RunSnapshot:
        return RunSnapshot(
            id=self.plan.run_id,
            session_id=self.plan.session_id,
            status=self.status,
            prompt=self.plan.prompt,
            capability_binding=self.plan.capability_binding,
            created_at_ms=self.created_at_ms,
            updated_at_ms=self.updated_at_ms,
            event_count=len(self.events),
            result_text=self.final_text or None,
            error=self.error,
            resumed_from=self.plan.resumed_from,
        )

    def run_record(self) -> RunRecord:
        return RunRecord(snapshot=self.snapshot(), events=tuple(self.events))

    def loop_checkpoint(self, now_ms: int) -> LoopCheckpoint:
        return LoopCheckpoint(
            session_id=self.plan.session_id,
            run_id=self.plan.run_id,
            turn=self.turn,
            messages=tuple(self.messages),
            capability_binding=self.plan.capability_binding,
            total_usage=self.usage,
            tool_calls_count=self.turn,
            checkpoint_ms=now_ms,
        )

    def checkpoint_export(self, now_ms: int) -> SessionCheckpointExportV1:
        """The boundary's export; the same state and time always give the same bytes."""
        payload = CheckpointPayload(
            logical_resume=self.loop_checkpoint(now_ms),
            snapshot=SessionSnapshot(
                session_id=self.plan.session_id, run_records=(*self.prior_runs, self.run_record())
            ),
        )
        return SessionCheckpointExportV1.build(payload)

    def status_view(
        self, cancel_requested: bool, pending_approvals: tuple[PendingApproval, ...] = ()
    ) -> RunStatusView:
        return RunStatusView(
            session_id=self.plan.session_id,
            run_id=self.plan.run_id,
            status="awaiting_approval" if pending_approvals else self.status,
            model=self.plan.model,
            turn=self.turn,
            tool_calls=self.turn,
            exports_delivered=len(self.exports),
            export_failures=len(self.export_failures),
            persistence_failures=len(self.persistence_failures),
            last_content_digest=self.exports[-1].content_digest if self.exports else None,
            cancel_requested=cancel_requested,
            pending_approvals=pending_approvals,
            usage=self.usage,
            error=self.error,
        )

    def result(self) -> AgentRunResult:
        assert self.status in ("completed", "failed", "cancelled")
        return AgentRunResult(
            session_id=self.plan.session_id,
            run_id=self.plan.run_id,
            status=self.status,
            text=self.final_text,
            error=self.error,
            tool_calls_count=self.turn,
            usage=self.usage,
            exports=tuple(self.exports),
            export_failures=tuple(self.export_failures),
            persistence_failures=tuple(self.persistence_failures),
        )
