"""Record the histories that ``tests/test_replay.py`` replays.

Run it only for an intended change that breaks replay (ship such a change
behind ``workflow.patched``, or as a new workflow version, and keep the old
histories): ::

    python scripts/record_history.py basic tests/histories/agent_run_v5.json
    python scripts/record_history.py approval tests/histories/agent_run_approval_v5.json
    python scripts/record_history.py continued tests/histories/agent_run_continued_v5.json
    python scripts/record_history.py guarded tests/histories/agent_run_guarded_v5.json
    python scripts/record_history.py compacted tests/histories/agent_run_compacted_v5.json
    python scripts/record_history.py conversation tests/histories/agent_run_conversation_v5.json
    python scripts/record_history.py cancelled tests/histories/agent_run_cancelled_v6.json
    python scripts/record_history.py reasoning tests/histories/agent_run_reasoning_v6.json
    python scripts/record_history.py cancel-checkpoint tests/histories/agent_run_cancel_checkpoint_v7.json
    python scripts/record_history.py shell-unseen tests/histories/agent_run_shell_unseen_v7.json
    python scripts/record_history.py bounded-prompt tests/histories/agent_run_bounded_prompt_v7.json
    python scripts/record_history.py parallel tests/histories/agent_run_parallel_v8.json
    python scripts/record_history.py hooks tests/histories/agent_run_hooks_v8.json
    python scripts/record_history.py basic tests/histories/agent_run_v9.json
    python scripts/record_history.py parallel tests/histories/agent_run_parallel_v9.json
    python scripts/record_history.py basic tests/histories/agent_run_v10.json
    python scripts/record_history.py parallel tests/histories/agent_run_parallel_v10.json
    python scripts/record_history.py continued tests/histories/agent_run_continued_v10.json
    python scripts/record_history.py subagents tests/histories/agent_run_subagents_v10.json
    python scripts/record_history.py approval tests/histories/agent_run_approval_v11.json
    python scripts/record_history.py shell-programs tests/histories/agent_run_shell_programs_v12.json
    python scripts/record_history.py approval tests/histories/agent_run_approval_v12.json

``*_v1`` were recorded before linear history (the run loaded its session and
passed its conversation to its activities); they replay through the
``linear-history`` patch. ``*_v2`` are linear. ``*_v3`` come from the 0.2 layout, whose
commands are the same but whose inputs differ: the plan is resolved without the prompt
(``ResolveInput.settings``), and a run continues as new without it (its plan carries it).
``*_v4`` checkpoint each tool boundary in one local activity (``agent.checkpoint``,
the ``boundary-one-local-checkpoint`` patch) instead of ``agent.save_checkpoint`` then
``agent.export_checkpoint``; the earlier histories replay the two activities.
``*_v5``: a boundary whose call never ran (denied, unknown) is checkpointed by an ordinary
``agent.checkpoint`` activity (the ``boundary-checkpoint-same-bytes`` patch), its input recorded;
after a tool activity it stays local, stamped with the activity's completion time.
``*_v6``: a cancelled run ends in Temporal's Canceled state (the ``cancel-ends-canceled`` patch):
after its end is in the store it asks for its own cancel (``agent.request_cancel``) when only
the ``cancel`` signal stopped it.
``*_v7``: recorded on the workflow with every patch of ``workflows/patches.py``, each exercising
one that only some runs ask for: ``cancel-waits-for-checkpoint``, ``shell-judge-unseen`` and
``bounded-start-prompt``. (``agent_run_reasoning_v6.json``, recorded on that workflow too,
carries ``cancel-waits-for-checkpoint``'s marker without a cancel.) Which history carries which
patch's marker is in the ledger, ``workflows/patches.py``.

``*_v8``: a run with ``[hooks]`` (the ``run-hooks`` patch), its hooks run as ``agent.hook`` activities.

``*_v9``: the quick tools' calls (``read``, ``ls``, ``glob``, ``grep``) are local activities (the
plan's ``ToolOffer.local``, so no patch: a plan from before has none), and the workflow task that
takes a model answer is stamped with the model activity's completion time
(``ModelResponse.completed_at_ms``).

``*_v10``: the run's plan, its log's opening and its end are local activities (the
``local-start-and-finish`` patch): the plan and the log in the run's first workflow task, the
end in its last; and each execution asks every patch it may need in its first workflow task,
before any local activity (``workflows/starting.py``, ``ask_patches_first``).
``agent_run_subagents_v10.json`` (and its ``-child1``) were recorded on that workflow before its
child runs were started with their search attributes set (the child upserted them itself):
a child's search attributes are not part of what a replay matches, so both replay since.

``*_v11``: the run's workspace follows it (docs/workspaces.md), with no patch, since every new
decision reads a recorded result: its plan has the base tree the resolve recorded (a plan from
before has none, and the run does not follow), each tool call carries the tree and the run's
host, each output names its host, and the run's end asks ``agent.workspace_change`` (a local
activity) for its change set.

``*_v12``: recorded on the workflow whose first task asks ``shell-judge-programs`` and
``stamps-fixed-by-history`` too (issue 38). Under the latter, every time a workflow task stamps is
one the history fixes (``workflows/calls.py``, ``StepClock``): the approved ``ls`` of
``agent_run_approval_v12.json`` runs as an ordinary activity, since the task that took the
person's decision holds no such time (in ``_v11`` it was a local one).

``basic``: two reads, an unknown tool and a path outside the workspace.
``approval``: a call that waits for a person and is approved through the
``approve`` update, a denied shell line, and a write.
``cancelled``: the ``cancel`` signal after a boundary, while the model thinks.
``cancel-checkpoint``: the ``cancel`` signal while the sink holds the first boundary's export
(past the workflow task timeout): the checkpoint finishes, acknowledged, then the run stops.
``shell-unseen``: a ``bash`` line that today's judge denies (a here-string's script is read) and
the judge before it sent to a person (``workflows/shell_gate.py``).
``shell-programs``: a ``bash`` line whose interpreter runs what the judge cannot see, under a
broad allow and a deny rule: today's judge denies it (the default), the judge before it let it
run (``workflows/shell_gate.py``).
``bounded-prompt``: a start prompt over ``[limits] max_message_bytes``: the run is refused
(``InputTooLarge``) after resolving its plan.
``hooks``: a ``user_prompt_submit`` hook, a ``pre_tool_use`` hook that blocks a ``bash`` call
(exit 2), a ``post_tool_use`` hook after a ``write`` and a failing ``stop`` hook.
``parallel`` (the ``parallel-tool-calls`` patch): an answer of two reads and a grep, run together,
a write, alone, and a read after it; then an answer of two ``ls`` calls asked about together.
``subagents``: a run that delegates a read to a child run (``task``, ``[agents]``); OUT-child1
gets the child's history, which replays as any run's.
``conversation``: a run with ``follow_ups``: a second prompt after its answer, then ``end``.
``continued``: a run that continues as new, twice, once between two calls of
one model step; OUT gets its first execution, OUT-last its last.
``reasoning``: a model that thinks before each step (its thinking kept in the conversation,
a ``thinking`` event each step) and takes images (``attachment``): a ``read`` of a PNG whose
image the history holds by digest only.
``guarded``: the guard rails: an approved call id that the model reuses in a
later step is asked about again; a read through a link to a denied file is
refused by the tool activity; a read through a link to a path that needs
``ask`` waits for a person, then runs; a comment-smuggled shell line is denied.
"""

from __future__ import annotations

import asyncio
import json
import sys
import tempfile
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from temporalio.client import Client, WorkflowFailureError, WorkflowHandle  # noqa: E402
from temporalio.exceptions import ApplicationError  # noqa: E402

from durable_agent.activities import AgentActivities  # noqa: E402
from durable_agent.client import end_conversation, run_result, send_prompt, start_run  # noqa: E402
from durable_agent.config import parse_config  # noqa: E402
from durable_agent.core.failures import INPUT_TOO_LARGE  # noqa: E402
from durable_agent.core.plan import WORKFLOW_TASK_SECONDS  # noqa: E402
from durable_agent.core.run_api import (  # noqa: E402
    AgentRunInput,
    ApprovalAnswer,
    ApprovalDecision,
    RunStatusView,
)
from durable_agent.devserver import start_ephemeral_server  # noqa: E402
from tests.helpers import (  # noqa: E402
    BlockingSink,
    final,
    read_call,
    running_worker,
    status_when,
    tool_call,
)

# The workflow id the tests replay every history under (``tests/test_replay.py``).
REPLAY_WORKFLOW_ID = "recorded"


async def approve_when_asked(handle: WorkflowHandle[Any, Any], times: int = 1) -> None:
    decided: set[tuple[int, str, str | None]] = set()
    for _ in range(200 * times):
        status = await handle.query("status", result_type=RunStatusView)
        for pending in status.pending_approvals:
            key = (pending.step, pending.call_id, pending.target)
            if key in decided:
                continue
            decision = ApprovalDecision(
                call_id=pending.call_id,
                approved=True,
                reason="recorded",
                step=pending.step,
                arguments_digest=pending.arguments_digest or None,
            )
            await handle.execute_update("approve", decision, result_type=ApprovalAnswer)
            decided.add(key)
            if len(decided) == times:
                return
        await asyncio.sleep(0.05)
    raise RuntimeError(f"fewer than {times} calls waited for approval")


async def approve_three(handle: WorkflowHandle[Any, Any]) -> None:
    await approve_when_asked(handle, 3)


async def approve_two(handle: WorkflowHandle[Any, Any]) -> None:
    """The ``parallel`` scenario's two calls, asked about together: both wait at once."""
    await status_when(handle, lambda s: len(s.pending_approvals) == 2, "two calls to wait together")
    await approve_when_asked(handle, 2)


def linked(ws: Path) -> None:
    (ws / "config").mkdir()
    (ws / "config" / "app.ini").write_text("[app]\n")
    (ws / ".env").write_text("TOKEN=recorded\n")
    (ws / "notenv").symlink_to(".env")
    (ws / "cfg").symlink_to("config")


def big_files(ws: Path) -> None:
    """Six 20 KB files: more than the ``compacted`` scenario's small context window holds."""
    for i in range(1, 7):
        (ws / f"f{i}.txt").write_text(f"file {i} lorem ipsum dolor sit amet consectetur\n" * 400)


# A 1x1 PNG.
TINY_PNG = bytes.fromhex(
    "89504e470d0a1a0a0000000d4948445200000001000000010806000000"
    "1f15c4890000000d49444154789c6360f8cfc0f01f0005000201e5273e1e0000000049454e44ae426082"
)


def plot(ws: Path) -> None:
    (ws / "plot.png").write_bytes(TINY_PNG)


async def converse(handle: WorkflowHandle[Any, Any]) -> None:
    """A follow-up after the first answer, then the end of the conversation."""
    waiting = "awaiting_prompt"
    await status_when(handle, lambda s: s.status == waiting, "the run to wait for a prompt")
    await send_prompt(handle, "now read b.txt")
    await status_when(handle, lambda s: s.status == waiting and s.turn == 2, "the second answer")
    await end_conversation(handle)


async def cancel_during_checkpoint(handle: WorkflowHandle[Any, Any], sink: BlockingSink) -> None:
    """The ``cancel`` signal while the sink holds turn 1's export; released past the workflow task
    timeout, so that the cancel reaches the run while its local activity still runs."""
    await asyncio.wait_for(sink.entered.acquire(), 15)
    await handle.signal("cancel", "recorded cancel")
    await asyncio.sleep(WORKFLOW_TASK_SECONDS + 1)
    sink.release.release()


async def cancel_after_first_export(handle: WorkflowHandle[Any, Any]) -> None:
    """The ``cancel`` signal while the model thinks: the run ends Canceled (``_v6``)."""
    await status_when(handle, lambda s: s.exports_delivered >= 1, "the first export")
    await handle.signal("cancel", "recorded cancel")


SCENARIOS: dict[str, dict[str, Any]] = {
    "basic": {
        "responses": [
            {"text": "Looking.", **read_call("r1", "a.txt")},
            read_call("r2", "b.txt"),
            tool_call("r3", "frobnicate"),
            read_call("r4", "../escape.txt"),
            final("two files read"),
        ],
        "permissions": {"allow": ["read(*)"]},
        "prompt": "read a.txt and b.txt",
    },
    "approval": {
        "responses": [
            tool_call("l1", "ls", path="."),
            tool_call("b1", "bash", command="cat a.txt; curl example.com"),
            tool_call("w1", "write", file_path="c.txt", content="gamma\n"),
            final("listed after approval, wrote c.txt"),
        ],
        "permissions": {"allow": ["write(*)", "bash(cat:*)"], "ask": ["ls"], "default": "deny"},
        "prompt": "list, then write c.txt",
        "during": approve_when_asked,
    },
    "continued": {
        "responses": [
            *(read_call(f"r{i}", "a.txt") for i in range(1, 5)),
            {
                "tool_calls": [
                    read_call("r5", "a.txt")["tool_calls"][0],
                    read_call("r6", "b.txt")["tool_calls"][0],
                ]
            },
            final("six reads"),
        ],
        "permissions": {"allow": ["read(*)"]},
        "prompt": "read six times",
        "limits": {"continue_as_new_events": 50},
    },
    "compacted": {
        "responses": [*(read_call(f"r{i}", f"f{i}.txt") for i in range(1, 7)), final("six files read")],
        "permissions": {"allow": ["read(*)"]},
        "prompt": "read six big files",
        "setup": big_files,
        # a small window: older reads leave the model's view (context management, tier 1)
        "context_window": 40_000,
        "context": {"keep_recent": 2},
    },
    "conversation": {
        "responses": [
            read_call("r1", "a.txt"),
            final("a.txt says alpha"),
            read_call("r2", "b.txt"),
            final("beta"),
        ],
        "permissions": {"allow": ["read(*)"]},
        "prompt": "read a.txt",
        "input": {"follow_ups": True},
        "during": converse,
    },
    "cancelled": {
        "responses": [read_call("r1", "a.txt"), {"text": "too slow", "delay_ms": 60_000}],
        "permissions": {"allow": ["read(*)"]},
        "prompt": "read a.txt, then think for a minute",
        "during": cancel_after_first_export,
        "status": "cancelled",
    },
    "cancel-checkpoint": {
        "responses": [read_call("r1", "a.txt"), final("never asked")],
        "permissions": {"allow": ["read(*)"]},
        "prompt": "read a.txt",
        "sink": BlockingSink,
        "during": cancel_during_checkpoint,
        "status": "cancelled",
    },
    "shell-unseen": {
        "responses": [tool_call("b1", "bash", command="bash <<< 'git push'"), final("denied")],
        # the judge before read no here-string's script: it asked (``ask``); today's denies
        "permissions": {"deny": ["bash(git push:*)"], "ask": ["bash"], "default": "deny"},
        "prompt": "push",
    },
    "shell-programs": {
        "responses": [
            tool_call("b1", "bash", command="""python3 -c 'import os; os.system("git push")'"""),
            final("denied"),
        ],
        # the judge before read no interpreter's code: the broad allow ran it; today's denies it
        "permissions": {"allow": ["bash"], "deny": ["bash(git push:*)"], "default": "deny"},
        "prompt": "push",
    },
    "bounded-prompt": {
        "responses": [final("never asked")],
        "permissions": {"allow": ["read(*)"]},
        "prompt": "p" * 2_000,
        "limits": {"max_message_bytes": 1_024},
        "status": "refused",
    },
    "hooks": {
        "responses": [
            tool_call("b1", "bash", command="rm -rf build"),
            tool_call("w1", "write", file_path="c.txt", content="gamma\n"),
            final("wrote c.txt"),
        ],
        "permissions": {"allow": ["bash", "write(*)"], "default": "deny"},
        "prompt": "clean up, then write c.txt",
        "hooks": {
            "user_prompt_submit": [{"command": "cat > /dev/null"}],
            "pre_tool_use": [{"matcher": "bash", "command": "echo 'no rm here' >&2; exit 2"}],
            "post_tool_use": [{"matcher": "write", "command": "wc -c c.txt"}],
            "stop": [{"command": "exit 1"}],
        },
    },
    "parallel": {
        "responses": [
            {
                "tool_calls": [
                    read_call("r1", "a.txt")["tool_calls"][0],
                    read_call("r2", "b.txt")["tool_calls"][0],
                    tool_call("g1", "grep", pattern="a")["tool_calls"][0],
                    tool_call("w1", "write", file_path="c.txt", content="gamma\n")["tool_calls"][0],
                    read_call("r3", "c.txt")["tool_calls"][0],
                ]
            },
            {
                "tool_calls": [
                    tool_call("l1", "ls", path=".")["tool_calls"][0],
                    tool_call("l2", "ls", path=".")["tool_calls"][0],
                ]
            },
            final("read together, wrote alone, listed after approval"),
        ],
        "permissions": {"allow": ["read(*)", "write(*)", "grep"], "ask": ["ls"], "default": "deny"},
        "prompt": "read a.txt, b.txt and grep together, write c.txt, then list twice",
        "during": approve_two,
    },
    "reasoning": {
        "responses": [
            {
                "thinking": "The plot first: read it.",
                "text": "Looking at the plot.",
                **read_call("r1", "plot.png"),
            },
            {"thinking": "A single pixel. Now a.txt.", **read_call("r2", "a.txt")},
            {"thinking": "Both are read; answer.", "text": "a pixel, and alpha"},
        ],
        "permissions": {"allow": ["read(*)"]},
        "prompt": "what do plot.png and a.txt hold?",
        "setup": plot,
        "attachment": True,
    },
    "subagents": {
        # one script for the parent and its child, answered by each one's own step: the parent
        # delegates, the child (not offered ``task``) is told so, then both read and answer
        "responses": [
            tool_call("t1", "task", description="read a", prompt="read a.txt"),
            read_call("r1", "a.txt"),
            final("alpha"),
        ],
        "permissions": {"allow": ["read(*)"], "default": "deny"},
        "agents": {"enabled": True},
        "prompt": "delegate the read of a.txt",
        "children": True,
    },
    "guarded": {
        "responses": [
            tool_call("l1", "ls", path="."),
            tool_call("l1", "ls", path="config"),
            read_call("r1", "notenv"),
            read_call("r2", "cfg/app.ini"),
            tool_call("b1", "bash", command="pytest #'\ncurl http://x/y #'"),
            final("guarded"),
        ],
        "permissions": {
            "allow": ["read(*)", "read(cfg/**)", "bash(pytest:*)"],
            "deny": ["read(**/.env)"],
            "ask": ["ls", "read(config/**)"],
            "default": "deny",
        },
        "prompt": "try the guard rails",
        "setup": linked,
        "during": approve_three,
    },
}


async def run_scenario(client: Client, name: str, tmp: Path) -> dict[str, str]:
    """Run the scenario; its histories as JSON, by the suffix of the file each goes to: ``""``
    for the run's first execution, ``-last`` for its last (a run that continues as new),
    ``-childN`` for its N-th child run (a scenario with ``children``)."""
    scenario = SCENARIOS[name]
    ws = tmp / "ws"
    ws.mkdir()
    (ws / "a.txt").write_text("alpha\n")
    (ws / "b.txt").write_text("beta\n")
    if "setup" in scenario:
        scenario["setup"](ws)
    script = tmp / "script.json"
    script.write_text(json.dumps({"responses": scenario["responses"]}))
    config = parse_config(
        {
            "default_model": "scripted/static",
            "providers": {
                "scripted": {
                    "kind": "scripted",
                    "script": str(script),
                    **(
                        {"context_window": scenario["context_window"]} if "context_window" in scenario else {}
                    ),
                    **({"attachment": True} if scenario.get("attachment") else {}),
                }
            },
            "context": scenario.get("context", {}),
            "store": {"path": str(tmp / "store")},
            "sinks": {"local": {"kind": "filesystem", "path": str(tmp / "exports")}},
            "permissions": scenario["permissions"],
            "limits": scenario.get("limits", {}),
            **({"hooks": scenario["hooks"]} if "hooks" in scenario else {}),
            **({"agents": scenario["agents"]} if "agents" in scenario else {}),
        },
        tmp,
    )
    # a scenario's own sink (it holds exports) is handed to its ``during`` too
    sink = scenario["sink"]() if "sink" in scenario else None
    acts = AgentActivities(config, sinks={"local": sink} if sink is not None else None)
    async with running_worker(client, acts) as queue:
        fields = {"session_id": f"replay-{name}", **scenario.get("input", {})}
        run = AgentRunInput(prompt=scenario["prompt"], workspace=str(ws), **fields)
        # under the id the tests replay it with: a child run's id is made from it
        handle = await start_run(client, run, queue=queue, workflow_id=REPLAY_WORKFLOW_ID)
        if "during" in scenario:
            await scenario["during"](handle, *([sink] if sink is not None else []))
        try:
            result = await run_result(client, handle.id)
            status: str = result.status
        except WorkflowFailureError as exc:  # its input refused
            status = "refused"
            assert isinstance(exc.cause, ApplicationError) and exc.cause.type == INPUT_TOO_LARGE, exc
        assert status == scenario.get("status", "completed"), status
        last = await handle.fetch_history()
        first_run = client.get_workflow_handle(handle.id, run_id=handle.first_execution_run_id)
        first = await first_run.fetch_history()
        children = [
            await client.get_workflow_handle(c.workflow_id).fetch_history()
            for c in (await handle.query("status", result_type=RunStatusView)).children
        ]
    histories = {"": first.to_json()}
    if "continue_as_new_events" in scenario.get("limits", {}):
        histories["-last"] = last.to_json()
    if scenario.get("children"):
        histories |= {f"-child{i}": child.to_json() for i, child in enumerate(children, start=1)}
    return histories


async def record(name: str, out: Path) -> None:
    await record_histories(lambda client, tmp: run_scenario(client, name, tmp), out)


async def record_histories(run: Callable[[Client, Path], Awaitable[dict[str, str]]], out: Path) -> None:
    """Run ``run`` on a dev server of its own, in a scratch folder, and write each history it
    gives (by suffix: ``""``, ``"-child1"``, …) beside ``out``."""
    env = await start_ephemeral_server()
    try:
        with tempfile.TemporaryDirectory() as tmp_name:
            histories = await run(env.client, Path(tmp_name))
        for suffix, history in histories.items():
            path = out.with_name(out.stem + suffix + ".json")
            path.write_text(history)
            print(f"wrote {path}")
    finally:
        await env.shutdown()


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] not in SCENARIOS:
        sys.exit(f"usage: python scripts/record_history.py {{{'|'.join(SCENARIOS)}}} OUT.json")
    asyncio.run(record(sys.argv[1], Path(sys.argv[2])))
