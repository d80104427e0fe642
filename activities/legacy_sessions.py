"""The activities' side of the time before linear history: ``agent.load_session``, and where
the inputs of that time are read.

Workers before linear history (the first format of 0.1) scheduled other shapes under the
same activity names: a whole conversation to the model (``ModelCallInput``), a whole
checkpoint to save, an export built in the workflow, a run's whole record to keep
(``durable_agent.core.legacy_shapes``), and ``agent.load_session``. During a rolling deploy a new
worker may take a task an old one queued. Each activity is registered on its live method,
which takes the legacy shape too and hands it, in its first lines, to the legacy adapter
beside it:

- ``agent.model_call``: ``ModelCalls.model_call``; a ``ModelCallInput`` goes to
  ``ModelCalls.answer`` (``activities/model_call.py``);
- ``agent.save_checkpoint``: ``RunLogs.save_checkpoint``; a ``LegacySaveCheckpointInput``
  writes nothing (``activities/checkpointing.py``, as the next two);
- ``agent.export_checkpoint``: ``RunLogs.export_checkpoint``; a ``LegacyExportInput`` is
  checked, then delivered as it is;
- ``agent.finish_run``: ``RunLogs.finish_run``; a ``LegacyFinishRunInput`` goes to
  ``RunLogs.keep_record``.

``agent.load_session`` has no live method: only the workflow's branch for runs started before
linear history (``workflows/legacy_start.py``) schedules it, so it is registered here.

All of it goes in 0.3 (the ledger, ``workflows/patches.py``, and the docs' "Supporting runs
started on older releases"), once no worker from before linear history can still have activity
tasks queued and no run started before it can still be running or replayed: when
``tests/histories/agent_run_v1.json``, ``agent_run_approval_v1.json`` and
``agent_run_continued_v1*.json`` are dropped. Then delete this module (with
``durable_agent/core/legacy_shapes.py`` and ``LOAD_SESSION``), narrow each method above to its current
input (and ``agent.export_checkpoint``'s result to ``ExportDescriptor``), and drop its legacy
lines, each marked ``# legacy: goes in 0.3``.
"""

from __future__ import annotations

from temporalio import activity

from durable_agent.activities.store.session_store import SessionStore
from durable_agent.activities.support import heartbeating
from durable_agent.core.activity_api import LOAD_SESSION, LoadSessionInput, SessionRuns


class LegacySessions:
    """``agent.load_session``: a session's ended runs, as runs before linear history read them."""

    def __init__(self, store: SessionStore) -> None:
        self.store = store

    @activity.defn(name=LOAD_SESSION.name)
    async def load_session(self, inp: LoadSessionInput) -> SessionRuns:
        """The session's ended runs (other than this one), oldest first.

        Called by runs recorded before ``agent.open_run`` existed; kept for them.
        """
        records = await heartbeating(self.store.load_run_records(inp.session_id))
        return SessionRuns(records=tuple(r for r in records if r.snapshot.id != inp.run_id))
