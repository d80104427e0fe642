"""The book of calls waiting for a person's decision, kept by ``AgentRun``.

Pure state: the workflow asks it what is pending and records decisions; the
``approve`` update's validator uses it to refuse an unknown, already-decided
or mismatched decision before anything is written to history.

A decision belongs to one request (a call id, in one model step, with one
set of arguments) and is spent when that request closes: a model that reuses
an approved call id, in the same step or a later one, is asked about again.

The calls of one answer that need a decision are asked about together (``ToolStep.ask_together``):
all pending at once, each decided on its own.
"""

from __future__ import annotations

import json
from typing import Any

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from durable_agent.core.run_api import ApprovalDecision, PendingApproval

ARGUMENTS_SUMMARY_CHARS = 300


def summarize_arguments(arguments: dict[str, Any]) -> str:
    """A call's input as one short line for the person deciding."""
    text = json.dumps(arguments, ensure_ascii=False, sort_keys=True)
    return text if len(text) <= ARGUMENTS_SUMMARY_CHARS else text[: ARGUMENTS_SUMMARY_CHARS - 1] + "…"


class ApprovalBook:
    def __init__(self) -> None:
        self.pending: dict[str, PendingApproval] = {}
        # Decisions on the requests in ``pending``, by call id; removed with the request.
        self.decisions: dict[str, ApprovalDecision] = {}
        # Ids decided on before, only to say so when a late decision for one comes.
        self.spent: set[str] = set()

    def ask(self, request: PendingApproval) -> None:
        # A request is new even when its id is not: nothing decided before carries over.
        self.decisions.pop(request.call_id, None)
        self.pending[request.call_id] = request

    def check(self, decision: ApprovalDecision) -> None:
        """Raise ``ValueError`` (the update is rejected) unless the decision fits a waiting call."""
        request = self.pending.get(decision.call_id)
        if request is None and decision.call_id in self.spent:
            raise ValueError(f"call {decision.call_id!r} has already been decided and is not waiting")
        if request is None:
            waiting = ", ".join(sorted(self.pending)) or "none"
            raise ValueError(f"call {decision.call_id!r} is not waiting for approval (waiting: {waiting})")
        if decision.call_id in self.decisions:
            raise ValueError(f"call {decision.call_id!r} has already been decided")
        if decision.step is not None and decision.step != request.step:
            raise ValueError(
                f"call {decision.call_id!r} waiting now is the one of step {request.step}, "
                f"not of step {decision.step}: look at it again before deciding"
            )
        if decision.arguments_digest is not None and decision.arguments_digest != request.arguments_digest:
            raise ValueError(
                f"call {decision.call_id!r} waiting now has arguments {request.arguments_digest}, "
                f"not {decision.arguments_digest}: look at it again before deciding"
            )

    def decide(self, decision: ApprovalDecision) -> PendingApproval:
        self.check(decision)
        self.decisions[decision.call_id] = decision
        return self.pending[decision.call_id]

    def decided(self, call_id: str) -> bool:
        return call_id in self.decisions

    def decided_all(self, call_ids: list[str]) -> bool:
        """Whether each of ``call_ids`` (the calls of one answer, asked about together) is decided."""
        return all(call_id in self.decisions for call_id in call_ids)

    def close(self, call_id: str) -> ApprovalDecision | None:
        """Stop waiting for ``call_id``; its decision, if one came. The decision is spent."""
        self.pending.pop(call_id, None)
        decision = self.decisions.pop(call_id, None)
        if decision is not None:
            self.spent.add(call_id)
        return decision

    def view(self) -> tuple[PendingApproval, ...]:
        """The requests still waiting for a person: a decided one no longer is, though it stays
        open until the run takes its decision (with those asked about together)."""
        return tuple(r for call_id, r in self.pending.items() if call_id not in self.decisions)
