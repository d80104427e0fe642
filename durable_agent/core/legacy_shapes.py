"""Shapes from before linear history (commit 0f43f17's predecessors, version 0.1.0 of the
workflow): replayed, accepted from activity tasks an old worker queued, never written.

It holds, for the state side (the workflow's branch is ``workflows/legacy_start.py``):

* the activity inputs that workers before linear history scheduled;
* ``carried_whole``: a ``CarriedState`` without ``log`` (it carried ``messages`` and
  ``prior_runs`` whole), turned into today's shape for ``LoopState.restore``;
* ``unbuilt_export``: what an export activity that returned ``None`` (no descriptor: the
  export was not built from the log) counts as, for ``RunJournal.record_export``.

Delete this module, with the branches that call into it (``LoopState.restore``'s
``carried.log is None``, ``RunJournal.record_export``'s ``None``, the activities' legacy
inputs) and the fields only they read (``CarriedState.messages``/``prior_runs``, the
``| None`` of ``EXPORT_CHECKPOINT``'s result), once no run started before linear history
can be running or replayed: when ``tests/histories/agent_run_v1.json``,
``agent_run_approval_v1.json`` and ``agent_run_continued_v1*.json`` are dropped.
"""

from __future__ import annotations

from durable_agent.core.export import LoopCheckpoint, RunRecord, SessionCheckpointExportV1
from durable_agent.core.models import Frozen
from durable_agent.core.run_api import CarriedState, ExportRef
from durable_agent.core.run_log import LogDelta, LogEntry, LogRef, ends_in_results, unanswered_calls

# The inputs that workers before linear history scheduled. An activity task an old worker
# queued may be taken by a new one during a deploy; the activities accept these too.


class LegacySaveCheckpointInput(Frozen):
    checkpoint: LoopCheckpoint


class LegacyExportInput(Frozen):
    sink: str
    export: SessionCheckpointExportV1


class LegacyFinishRunInput(Frozen):
    record: RunRecord


# --- the state a run carried, and the exports it made ------------------------------


def carried_whole(carried: CarriedState) -> tuple[CarriedState, tuple[LogEntry, ...]]:
    """A state carried whole (no ``log``) as today's shape: a reference to the log's start,
    and the one entry, this execution's first, that holds the whole conversation and events."""
    genesis = LogRef(run_id=carried.plan.run_id, version=0)
    messages = list(carried.messages)
    whole = LogDelta(replace=True, messages=carried.messages, events=carried.events)
    linear = carried.model_copy(
        update={
            "log": genesis,
            "event_count": len(carried.events),  # it carried every event
            "pending_events": (),
            "open_results": ends_in_results(messages),
            "due_calls": tuple(unanswered_calls(messages)),
            "prior_run_ids": tuple(r.snapshot.id for r in carried.prior_runs),
            "messages": (),
            "prior_runs": (),
        }
    )
    return linear, (LogEntry.after(genesis, whole),)


def unbuilt_export(turn: int) -> ExportRef:
    """An export acknowledged with no descriptor: it has no digest, and no later execution
    can start from it."""
    return ExportRef(turn=turn, content_digest="")
