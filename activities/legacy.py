"""Every input of the time before linear history, in one place.

Workers before linear history (version 0.1.0 of the workflow) scheduled other
shapes under the same activity names: a whole conversation to the model
(``ModelCallInput``), a whole checkpoint to save, an export built in the
workflow, a run's whole record to keep, and ``agent.load_session``. During a
rolling deploy a new worker may take a task an old one queued, and a run
started then may still replay. The four activities whose names took other
shapes are registered here: each reads the legacy shape itself and hands the
current one to its part (``ModelCalls``, ``RunLogs``), whose paths read one
shape only.

Delete this module (with ``durable_agent/core/legacy.py`` and
``LOAD_SESSION``) once no worker from before linear history can still have
activity tasks queued and no run started before it can still be running or
replayed: when ``tests/histories/agent_run_v1.json``,
``agent_run_approval_v1.json`` and ``agent_run_continued_v1*.json`` are
dropped. Then put each ``@activity.defn`` below on the method it calls
(``ModelCalls.model_call``, ``RunLogs.save_checkpoint``, ``export_checkpoint``,
``finish_run``) and register those in ``AgentActivities.all()``.
"""

from __future__ import annotations

from temporalio import activity

from durable_agent.activities.model_call import ModelCalls
from durable_agent.activities.run_log import RunLogs
from durable_agent.activities.support import heartbeating
from durable_agent.core.activity_api import (
    EXPORT_CHECKPOINT,
    FINISH_RUN,
    LOAD_SESSION,
    MODEL_CALL,
    SAVE_CHECKPOINT,
    ExportInput,
    FinishRunInput,
    LoadSessionInput,
    ModelCallInput,
    ModelStepInput,
    SaveCheckpointInput,
    SessionRuns,
)
from durable_agent.core.export import ExportDescriptor, SessionCheckpointExportV1
from durable_agent.core.legacy import LegacyExportInput, LegacyFinishRunInput, LegacySaveCheckpointInput
from durable_agent.core.models import ModelResponse


class LegacyInputs:
    """The activities that also take inputs from before linear history."""

    def __init__(self, models: ModelCalls, run_logs: RunLogs) -> None:
        self.models = models
        self.run_logs = run_logs

    @activity.defn(name=MODEL_CALL.name)
    async def model_call(self, inp: ModelStepInput | ModelCallInput) -> ModelResponse:
        """Ask the model for its next step, on the conversation in the run's log (or, from a
        worker before linear history, on the conversation given)."""
        if isinstance(inp, ModelCallInput):
            return await self.models.answer(inp)
        return await self.models.model_call(inp)

    @activity.defn(name=SAVE_CHECKPOINT.name)
    async def save_checkpoint(self, inp: SaveCheckpointInput | LegacySaveCheckpointInput) -> None:
        """Append entries to the run's logical checkpoint in the session store, durably."""
        if isinstance(inp, LegacySaveCheckpointInput):
            # a whole checkpoint, from a worker before linear history: the workflow, on this
            # code now, finds its log missing when it next reads it and sends it again
            return
        await self.run_logs.save_checkpoint(inp)

    @activity.defn(name=EXPORT_CHECKPOINT.name)
    async def export_checkpoint(self, inp: ExportInput | LegacyExportInput) -> ExportDescriptor | None:
        """Build the boundary's export from the run's log and hand it to the sink; return only
        once the sink holds it. (``None`` is in the result type for results recorded before
        linear history; this worker never returns it.)"""
        if isinstance(inp, LegacyExportInput):  # built by a workflow before linear history
            legacy = inp

            async def validated() -> SessionCheckpointExportV1:
                legacy.export.open()
                return legacy.export

            return await self.run_logs.deliver(inp.sink, validated)
        return await self.run_logs.export_checkpoint(inp)

    @activity.defn(name=FINISH_RUN.name)
    async def finish_run(self, inp: FinishRunInput | LegacyFinishRunInput) -> None:
        """Keep the ended run's record in its session, then drop its log."""
        if isinstance(inp, LegacyFinishRunInput):  # the whole record, from an older worker
            await self.run_logs.keep_record(inp.record)
            return
        await self.run_logs.finish_run(inp)

    @activity.defn(name=LOAD_SESSION.name)
    async def load_session(self, inp: LoadSessionInput) -> SessionRuns:
        """The session's ended runs (other than this one), oldest first.

        Called by runs recorded before ``agent.open_run`` existed; kept for them.
        """
        records = await heartbeating(self.run_logs.store.load_run_records(inp.session_id))
        return SessionRuns(records=tuple(r for r in records if r.snapshot.id != inp.run_id))
