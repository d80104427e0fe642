"""The workflow's branch for runs started before linear history: they loaded their
session's ended runs (``agent.load_session``) instead of opening a log in the store.
Their histories replay through this branch, which the ``linear-history`` patch guards:
``Starter.start`` (``starting.py``) asks ``workflow.patched(PATCH_LINEAR_HISTORY)`` and
comes here only when the history has no marker: a new run never runs this module's code.
(The state side, a ``CarriedState`` carried whole, is ``durable_agent.core.legacy_shapes``.)

Delete this module once no run started before linear history can be running or
replayed (in 0.3: the ledger, ``workflows/patches.py``): when
``tests/histories/agent_run_v1.json``, ``agent_run_approval_v1.json`` and
``agent_run_continued_v1*.json`` are dropped. Then ``Starter.start`` calls
``workflow.deprecate_patch(PATCH_LINEAR_HISTORY)`` where it asks ``workflow.patched`` (runs
started since hold the patch's marker), and opens the log unconditionally.
"""

from __future__ import annotations

from temporalio import workflow
from temporalio.exceptions import ActivityError

with workflow.unsafe.imports_passed_through():
    from durable_agent.core.activity_api import LOAD_SESSION, LoadSessionInput
    from durable_agent.core.export import LoopCheckpoint
    from durable_agent.core.failures import failure_message
    from durable_agent.core.loop import LoopState
    from durable_agent.core.plan import RunPlan

from durable_agent.workflows.calls import CallRunner, now_ms


async def start_from_session(calls: CallRunner, plan: RunPlan, resume: LoopCheckpoint | None) -> LoopState:
    """The state of a run that loads its session's ended runs; a store that cannot be read
    costs the snapshot, not the run."""
    failure: str | None = None
    try:
        runs = await calls.run(
            LOAD_SESSION,
            LoadSessionInput(session_id=plan.session_id, run_id=plan.run_id),
            summary=f"load session {plan.session_id}",
            timeouts=plan.timeouts,
            cancellable=False,
        )
        prior_run_ids = tuple(r.snapshot.id for r in runs.records)
    except ActivityError as exc:
        prior_run_ids, failure = (), failure_message(exc)
    state = LoopState(plan, now_ms(), resume=resume)
    # nothing is in the log yet: this records the session's ended runs only
    state.journal.record_opened(prior_run_ids)
    if failure:
        state.journal.record_persistence_failure("load", failure, state.turn, now_ms())
    return state
