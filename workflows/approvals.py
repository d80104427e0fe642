"""The book of calls waiting for a person's decision, kept by ``AgentRun``.

Pure state: the workflow asks it what is pending and records decisions; the
``approve`` update's validator uses it to refuse an unknown or already-decided
call before anything is written to history.
"""

from __future__ import annotations

import json
from typing import Any

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from durable_agent.run_io import ApprovalDecision, PendingApproval

ARGUMENTS_SUMMARY_CHARS = 300


def summarize_arguments(arguments: dict[str, Any]) -> str:
    """A call's input as one short line for the person deciding."""
    text = json.dumps(arguments, ensure_ascii=False, sort_keys=True)
    return text if len(text) <= ARGUMENTS_SUMMARY_CHARS else text[: ARGUMENTS_SUMMARY_CHARS - 1] + "…"


class ApprovalBook:
    def __init__(self) -> None:
        self.pending: dict[str, PendingApproval] = {}
        self.decisions: dict[str, ApprovalDecision] = {}

    def ask(self, request: PendingApproval) -> None:
        self.pending[request.call_id] = request

    def check(self, decision: ApprovalDecision) -> None:
        """Raise ``ValueError`` (the update is rejected) unless the call waits for a decision."""
        if decision.call_id in self.decisions:
            raise ValueError(f"call {decision.call_id!r} has already been decided")
        if decision.call_id not in self.pending:
            waiting = ", ".join(sorted(self.pending)) or "none"
            raise ValueError(f"call {decision.call_id!r} is not waiting for approval (waiting: {waiting})")

    def decide(self, decision: ApprovalDecision) -> PendingApproval:
        self.check(decision)
        self.decisions[decision.call_id] = decision
        return self.pending[decision.call_id]

    def decided(self, call_id: str) -> bool:
        return call_id in self.decisions

    def close(self, call_id: str) -> ApprovalDecision | None:
        """Stop waiting for ``call_id``; its decision, if one came."""
        self.pending.pop(call_id, None)
        return self.decisions.get(call_id)

    def view(self) -> tuple[PendingApproval, ...]:
        return tuple(self.pending.values())
