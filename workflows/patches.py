"""Every ``workflow.patched`` id of ``AgentRun``, in one ledger: what each changes, when it
shipped, which committed histories carry its marker, and when it can go.

A patch keeps a run that an older worker started on the branch it took: ``workflow.patched(id)``
is ``True`` in a new execution (which records the id's marker) and in the replay of a history
with the marker, ``False`` in the replay of a history without it. Every call site imports its id
from here; ``tests/test_patch_ledger.py`` holds the ledger to the code and to
``tests/histories/``: each id is asked for by the workflow, through the constant, and carried by
at least one committed history (the ones named in ``histories``, no more, no fewer).

Since ``local-start-and-finish``, each execution also asks every patch in its first workflow
task, before any local activity (``starting.ask_patches_first``): the SDK fails a replay that
meets a patch's marker after a local activity's in one task. ``asked`` says where a patch's
branch is taken; runs started since carry every marker from their first task. A patch that goes
goes from both places.

When a patch goes (the docs' "Supporting runs started on older releases"): a release replays and
carries on the runs started on itself and on the release before it. Runs started on the release
a patch shipped in, before the patch, lack its marker; so in ``deprecate_in``, the second release
after ``release``, its ``workflow.patched(id)`` becomes ``workflow.deprecate_patch(id)`` and the
code after it unconditional; the old branch, the histories in ``old_branch`` and whatever only
the old branch reads are deleted. The ``deprecate_patch`` call goes one release later (runs
started since hold a deprecated marker, which replays without it). Before deploying
``deprecate_in``, no execution begun on a worker of ``release`` or earlier may be open, or closed
within the namespace's retention (a query, ``result`` among them, replays a closed run).

With worker versioning (docs/deploys.md) a run is pinned to the build that started it and
replays only there, so a change shipped as a new build needs no patch for the runs pinned to
other builds. The ledger stays for what versioning does not cover: the runs started on
unversioned workers before the cutover (the first versioned build takes and replays them),
unversioned workers, and an emergency fix deployed under the same build id. A pinned run's move to
a new build (``upgrading.py``) needs none: it reads only what the history records. Each release
also commits a history of its own (``agent_run_release_<release>.json``, and its ``-moved``:
``scripts/record_release_history.py``), which every later release replays.

Releases, as the code names them (no tag yet; ``__version__`` has said 0.1.0 throughout): 0.1 up
to ``c144c0f`` (2026-11-30: the first format, then linear history), 0.2 from ``7319190``
(2026-12-01, "the 0.2 layout") up to the next tag, 0.3. A patch committed after a tag ships in
the next one.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Patch:
    """One patch id and what the ledger knows of it."""

    id: str  # as recorded in histories' markers: never changes
    shipped: str  # the commit that brought it, and its date
    release: str  # the release it shipped in (a patch committed after a tag ships in the next)
    changes: str  # what runs started since do instead of what runs started before did
    asked: str  # when the workflow asks for it: a history holds its marker only if it got there
    histories: tuple[str, ...]  # the committed histories (``tests/histories/``) that carry its marker
    old_branch: tuple[str, ...] = ()  # the committed histories that replay only through its old branch
    # the release whose workflow calls ``deprecate_patch`` and drops the old branch; unless given, the
    # second after ``release`` (the module's docstring says why)
    deprecate_in: str = ""

    def __post_init__(self) -> None:
        if not self.deprecate_in:
            major, minor = self.release.split(".")
            object.__setattr__(self, "deprecate_in", f"{major}.{int(minor) + 2}")


def listed(*lines: str) -> tuple[str, ...]:
    """History file names written several to a line, for a ``histories`` or ``old_branch`` too long
    for one.

    Args:
        lines: Names, separated by spaces.

    Returns:
        The names, in their order.
    """
    return tuple(name for line in lines for name in line.split())


PATCH_LINEAR_HISTORY = "linear-history"
ONE_CHECKPOINT_PATCH = "boundary-one-local-checkpoint"
SAME_BYTES_PATCH = "boundary-checkpoint-same-bytes"
PATCH_CANCELED_STATE = "cancel-ends-canceled"
CHECKPOINT_COMPLETES_PATCH = "cancel-waits-for-checkpoint"
BOUNDED_PROMPT_PATCH = "bounded-start-prompt"
PATCH_SHELL_UNSEEN = "shell-judge-unseen"
HOOKS_PATCH = "run-hooks"
PARALLEL_CALLS_PATCH = "parallel-tool-calls"
LOCAL_BOOKENDS_PATCH = "local-start-and-finish"
PATCH_SHELL_PROGRAMS = "shell-judge-programs"
PATCH_HISTORY_STAMPS = "stamps-fixed-by-history"

# Each entry: its id, the commit that brought it and its date, its release; the rest by name.
LEDGER: tuple[Patch, ...] = (
    Patch(
        PATCH_LINEAR_HISTORY,
        "6864f50 (2026-11-29)",
        "0.1",
        changes=(
            "a new run appends what is new to a log in the session store, opened by agent.open_run; "
            "runs started before load their session's ended runs (agent.load_session) and carry "
            "their conversation whole (workflows/legacy_start.py, durable_agent.core.legacy_shapes)"
        ),
        asked="at a new run's start (Starter.start); not in an execution continued as new",
        histories=listed(
            "agent_run_approval_v11.json agent_run_approval_v12.json agent_run_approval_v2.json",
            "agent_run_approval_v3.json agent_run_approval_v4.json agent_run_approval_v5.json",
            "agent_run_cancel_checkpoint_v7.json agent_run_cancelled_v6.json agent_run_compacted_v3.json",
            "agent_run_compacted_v4.json agent_run_compacted_v5.json agent_run_continued_v10.json",
            "agent_run_continued_v2.json agent_run_continued_v3.json agent_run_continued_v4.json",
            "agent_run_continued_v5.json agent_run_conversation_v3.json agent_run_conversation_v4.json",
            "agent_run_conversation_v5.json agent_run_guarded_v2.json agent_run_guarded_v4.json",
            "agent_run_guarded_v5.json agent_run_hooks_v8.json agent_run_parallel_v10.json",
            "agent_run_parallel_v8.json agent_run_parallel_v9.json agent_run_reasoning_v6.json",
            "agent_run_release_0.2.json agent_run_shell_programs_v12.json agent_run_shell_unseen_v7.json",
            "agent_run_subagents_v10-child1.json agent_run_subagents_v10.json agent_run_v10.json",
            "agent_run_v2.json agent_run_v4.json agent_run_v5.json agent_run_v9.json",
        ),
        old_branch=("agent_run_approval_v1.json", "agent_run_continued_v1.json", "agent_run_v1.json"),
    ),
    Patch(
        ONE_CHECKPOINT_PATCH,
        "bf7d7a0 (2026-12-01)",
        "0.2",
        changes=(
            "a tool boundary is one local activity, agent.checkpoint (one workflow task); before, "
            "agent.save_checkpoint then agent.export_checkpoint (three)"
        ),
        asked="at every tool boundary (LogKeeper.boundary)",
        histories=listed(
            "agent_run_approval_v11.json agent_run_approval_v12.json agent_run_approval_v4.json",
            "agent_run_approval_v5.json agent_run_cancel_checkpoint_v7.json agent_run_cancelled_v6.json",
            "agent_run_compacted_v4.json agent_run_compacted_v5.json agent_run_continued_v10-last.json",
            "agent_run_continued_v10.json agent_run_continued_v4-last.json agent_run_continued_v4.json",
            "agent_run_continued_v5-last.json agent_run_continued_v5.json agent_run_conversation_v4.json",
            "agent_run_conversation_v5.json agent_run_guarded_v4.json agent_run_guarded_v5.json",
            "agent_run_hooks_v8.json agent_run_parallel_v10.json agent_run_parallel_v8.json",
            "agent_run_parallel_v9.json agent_run_reasoning_v6.json agent_run_release_0.2-moved.json",
            "agent_run_release_0.2.json agent_run_shell_programs_v12.json agent_run_shell_unseen_v7.json",
            "agent_run_subagents_v10-child1.json agent_run_subagents_v10.json agent_run_v10.json",
            "agent_run_v4.json agent_run_v5.json agent_run_v9.json",
        ),
        old_branch=listed(
            "agent_run_approval_v1.json agent_run_approval_v2.json agent_run_approval_v3.json",
            "agent_run_compacted_v3.json agent_run_continued_v1-last.json agent_run_continued_v1.json",
            "agent_run_continued_v2-last.json agent_run_continued_v2.json agent_run_continued_v3-last.json",
            "agent_run_continued_v3.json agent_run_conversation_v3.json agent_run_guarded_v2.json",
            "agent_run_v1.json agent_run_v2.json",
        ),
    ),
    Patch(
        SAME_BYTES_PATCH,
        "c710968 (2026-12-01)",
        "0.2",
        changes=(
            "a boundary whose time the history does not fix (a call that never ran: denied, unknown, "
            "refused after a wait) is checkpointed by agent.checkpoint as an ordinary activity, its "
            "input recorded; before, as a local one"
        ),
        asked=f"at a boundary without a tool activity's time, under {ONE_CHECKPOINT_PATCH}",
        histories=listed(
            "agent_run_approval_v11.json agent_run_approval_v12.json agent_run_approval_v5.json",
            "agent_run_continued_v10-last.json agent_run_continued_v10.json agent_run_guarded_v5.json",
            "agent_run_parallel_v10.json agent_run_release_0.2-moved.json agent_run_release_0.2.json",
            "agent_run_shell_programs_v12.json agent_run_shell_unseen_v7.json",
            "agent_run_subagents_v10-child1.json agent_run_subagents_v10.json agent_run_v10.json",
            "agent_run_v5.json agent_run_v9.json",
        ),
        old_branch=listed(
            "agent_run_approval_v4.json agent_run_compacted_v4.json agent_run_continued_v4-last.json",
            "agent_run_continued_v4.json agent_run_conversation_v4.json agent_run_guarded_v4.json",
            "agent_run_v4.json",
        ),
    ),
    Patch(
        PATCH_CANCELED_STATE,
        "e35ed77 (2026-12-01)",
        "0.2",
        changes=(
            "a cancelled run closes in Temporal's Canceled state, asking for its own cancel request "
            "(agent.request_cancel) when only the cancel signal stopped it; before, it completed, "
            "with status cancelled"
        ),
        asked="when a cancelled run closes (Ending.close)",
        histories=listed(
            "agent_run_approval_v11.json agent_run_approval_v12.json agent_run_cancel_checkpoint_v7.json",
            "agent_run_cancelled_v6.json agent_run_continued_v10-last.json agent_run_continued_v10.json",
            "agent_run_parallel_v10.json agent_run_release_0.2-moved.json agent_run_release_0.2.json",
            "agent_run_shell_programs_v12.json agent_run_subagents_v10-child1.json",
            "agent_run_subagents_v10.json agent_run_v10.json",
        ),
    ),
    Patch(
        CHECKPOINT_COMPLETES_PATCH,
        "baa8ce8 (2026-12-01)",
        "0.2",
        changes=(
            "a cancel during a boundary's checkpoint lets it finish, its export acknowledged, before "
            "the run stops; before, it cancelled the checkpoint. Replay cannot tell the two apart "
            "(a local activity's result comes from its marker)"
        ),
        asked=f"at every boundary checkpointed by agent.checkpoint, under {ONE_CHECKPOINT_PATCH}",
        histories=listed(
            "agent_run_approval_v11.json agent_run_approval_v12.json agent_run_cancel_checkpoint_v7.json",
            "agent_run_continued_v10-last.json agent_run_continued_v10.json agent_run_hooks_v8.json",
            "agent_run_parallel_v10.json agent_run_parallel_v8.json agent_run_parallel_v9.json",
            "agent_run_reasoning_v6.json agent_run_release_0.2-moved.json agent_run_release_0.2.json",
            "agent_run_shell_programs_v12.json agent_run_shell_unseen_v7.json",
            "agent_run_subagents_v10-child1.json agent_run_subagents_v10.json agent_run_v10.json",
            "agent_run_v9.json",
        ),
    ),
    Patch(
        BOUNDED_PROMPT_PATCH,
        "07142ac (2026-12-01)",
        "0.2",
        changes=(
            "a new run refuses a prompt over [limits] max_message_bytes (InputTooLarge); before, it "
            "went on with it"
        ),
        asked="only when a new run's prompt is over the limit",
        histories=listed(
            "agent_run_approval_v11.json agent_run_approval_v12.json agent_run_bounded_prompt_v7.json",
            "agent_run_continued_v10.json agent_run_parallel_v10.json agent_run_release_0.2.json",
            "agent_run_shell_programs_v12.json agent_run_subagents_v10-child1.json",
            "agent_run_subagents_v10.json agent_run_v10.json",
        ),
    ),
    Patch(
        PATCH_SHELL_UNSEEN,
        "07142ac (2026-12-01)",
        "0.2",
        changes=(
            "a bash line is judged by the fail-closed rules (a line that hides what it runs, a script "
            "fed to a shell, variables after a :* rule); before, by the rules before them"
        ),
        asked="only when the two judges decide a call differently (workflows/shell_gate.py)",
        histories=listed(
            "agent_run_approval_v11.json agent_run_approval_v12.json agent_run_continued_v10-last.json",
            "agent_run_continued_v10.json agent_run_parallel_v10.json agent_run_release_0.2-moved.json",
            "agent_run_release_0.2.json agent_run_shell_programs_v12.json agent_run_shell_unseen_v7.json",
            "agent_run_subagents_v10-child1.json agent_run_subagents_v10.json agent_run_v10.json",
        ),
    ),
    Patch(
        HOOKS_PATCH,
        "3ee88e1 (2026-12-01)",
        "0.2",
        changes=(
            "a run whose plan has [hooks] runs them as agent.hook activities (before and after tool "
            "calls, on its prompts, at its end); runs before had no hooks"
        ),
        asked="only by a run whose plan has hooks, before its first hook (workflows/hook_runner.py)",
        histories=listed(
            "agent_run_approval_v11.json agent_run_approval_v12.json agent_run_continued_v10-last.json",
            "agent_run_continued_v10.json agent_run_hooks_v8.json agent_run_parallel_v10.json",
            "agent_run_release_0.2-moved.json agent_run_release_0.2.json",
            "agent_run_shell_programs_v12.json agent_run_subagents_v10-child1.json",
            "agent_run_subagents_v10.json agent_run_v10.json",
        ),
    ),
    Patch(
        PARALLEL_CALLS_PATCH,
        "3ee88e1 (2026-12-01)",
        "0.2",
        changes=(
            "the calls of one answer to tools whose offer says parallel (read-only tools, [tools] "
            "parallel) run together, their tool activities scheduled at once, each boundary then "
            "exported in the answer's order; the calls that need a person's decision are asked about "
            "together, before any call of the answer runs. Before, one call after another, each "
            "asked about in its turn"
        ),
        asked=(
            "only for an answer with two consecutive calls to such tools, or two calls a rule may "
            "send to a person, all with different ids (workflows/call_batch.py)"
        ),
        histories=listed(
            "agent_run_approval_v11.json agent_run_approval_v12.json agent_run_continued_v10-last.json",
            "agent_run_continued_v10.json agent_run_parallel_v10.json agent_run_parallel_v8.json",
            "agent_run_parallel_v9.json agent_run_release_0.2-moved.json agent_run_release_0.2.json",
            "agent_run_shell_programs_v12.json agent_run_subagents_v10-child1.json",
            "agent_run_subagents_v10.json agent_run_v10.json",
        ),
    ),
    Patch(
        LOCAL_BOOKENDS_PATCH,
        "issue 26 (2026-12-02)",
        "0.2",
        changes=(
            "agent.resolve_run and agent.open_run run as local activities in the run's first "
            "workflow task, and agent.finish_run in its last: no task queue round trip each, and one "
            "billed action for a task's local activities. Each execution asks every patch it may "
            "need in its first workflow task, before any local activity (starting.ask_patches_first), "
            "since the SDK fails a replay that meets a patch marker after a local activity's in one "
            "task. Before, three ordinary activities, and patches asked where their branch is"
        ),
        asked=(
            "first in every execution (Starter.start, Starter.continued: ask_patches_first), and "
            "when a run finishes (LogKeeper.finish)"
        ),
        histories=listed(
            "agent_run_approval_v11.json agent_run_approval_v12.json agent_run_continued_v10-last.json",
            "agent_run_continued_v10.json agent_run_parallel_v10.json agent_run_release_0.2-moved.json",
            "agent_run_release_0.2.json agent_run_shell_programs_v12.json",
            "agent_run_subagents_v10-child1.json agent_run_subagents_v10.json agent_run_v10.json",
        ),
        old_branch=listed(
            "agent_run_approval_v1.json agent_run_approval_v2.json agent_run_approval_v3.json",
            "agent_run_approval_v4.json agent_run_approval_v5.json agent_run_bounded_prompt_v7.json",
            "agent_run_cancel_checkpoint_v7.json agent_run_cancelled_v6.json",
            "agent_run_compacted_v3.json agent_run_compacted_v4.json agent_run_compacted_v5.json",
            "agent_run_continued_v1-last.json agent_run_continued_v1.json",
            "agent_run_continued_v2-last.json agent_run_continued_v2.json",
            "agent_run_continued_v3-last.json agent_run_continued_v3.json",
            "agent_run_continued_v4-last.json agent_run_continued_v4.json",
            "agent_run_continued_v5-last.json agent_run_continued_v5.json",
            "agent_run_conversation_v3.json agent_run_conversation_v4.json",
            "agent_run_conversation_v5.json agent_run_guarded_v2.json agent_run_guarded_v4.json",
            "agent_run_guarded_v5.json agent_run_hooks_v8.json agent_run_parallel_v8.json",
            "agent_run_parallel_v9.json agent_run_reasoning_v6.json agent_run_shell_unseen_v7.json",
            "agent_run_v1.json agent_run_v2.json agent_run_v4.json agent_run_v5.json",
            "agent_run_v9.json",
        ),
    ),
    Patch(
        PATCH_SHELL_PROGRAMS,
        "issue 38 (2026-12-07)",
        "0.2",
        changes=(
            "a bash line is judged by the rules that read what programs run: an interpreter's code, "
            "script or module, awk's system(), sed's e, a git alias, git -c config and variables that "
            "may run a command keep a broad allow off while a deny rule could match them (unless an "
            "allow rule names what runs), and the commands git or a variable hands a shell are read "
            "for the deny rules; before, by the fail-closed rules of shell-judge-unseen"
        ),
        asked=(
            "first in every execution (starting.ask_patches_first); its branch is taken only when "
            "the two judges decide a call differently (workflows/shell_gate.py)"
        ),
        histories=("agent_run_approval_v12.json", "agent_run_shell_programs_v12.json"),
    ),
    Patch(
        PATCH_HISTORY_STAMPS,
        "issue 38 (2026-12-07)",
        "0.2",
        changes=(
            "everything a workflow task stamps is a time the history fixes (StepClock): the completion "
            "time of the activity result it took (model, tool, hook), the execution's start in its "
            "first task, the time held across a local activity that outlasts its task; a quick tool "
            "call is local only in a task holding such a time (after an approval it is an ordinary "
            "activity), agent.finish_run too; a dropped signal is recorded at the next model request. "
            "Before, only a model answer's task held a time, and a handler's record was stamped at once"
        ),
        asked=(
            "first in every execution (starting.ask_patches_first: fix_stamps); its answer is the "
            "StepClock's ``fixed``"
        ),
        histories=("agent_run_approval_v12.json", "agent_run_shell_programs_v12.json"),
        old_branch=("agent_run_approval_v11.json", "agent_run_parallel_v10.json"),
    ),
)
