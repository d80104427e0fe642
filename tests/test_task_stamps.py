"""A workflow task lost after it exported a boundary, run again, exports the same bytes: what it
stamped is fixed by the history (``StepClock``, ``stamps-fixed-by-history``), whatever else the
re-run meets. Real Temporal, real worker processes killed by their sink, a scripted model.

- a local checkpoint that outlasts its workflow task: the SDK completes the task after 80 % of its
  timeout and the workflow goes on in a new one, whose time a re-run does not have;
- a signal whose handler records something (a bare ``cancel`` to a run whose worker takes only
  encrypted signals) delivered in the same task as the model's answer, as it is when it came while
  the lost task waited to run again;
- a call a person approved, then run as a local read: the approval's task has no time the
  history fixes.
"""

from __future__ import annotations

import asyncio
import subprocess
from pathlib import Path
from typing import Any

from temporalio.client import Client, WorkflowHandle

from durable_agent.activities.sinks import read_export_file
from durable_agent.client import start_run
from durable_agent.codec import data_converter, new_key
from durable_agent.config import CodecConfig
from durable_agent.core.activity_api import TOOL_CALL
from durable_agent.core.events import AgentEvent, ConfirmationReceivedEvent, ErrorEvent
from durable_agent.core.run_api import AgentRunInput, AgentRunResult, ApprovalDecision
from tests.helpers import activity_calls, awaiting_approval, until
from tests.test_crash_recovery import (
    N_CALLS,
    check_recovered_run,
    export_files,
    read_responses,
    workers,
    write_setup,
)

REPO_ROOT = Path(__file__).resolve().parent.parent
DYING = str(REPO_ROOT / "tests" / "dying_sink_worker.py")
KEY_VARIABLE = "AGENT_TEST_STAMPS_CODEC_KEY"


async def died_after(proc: subprocess.Popen[bytes], turn: int) -> None:
    """Wait for the worker ``proc`` to die by its sink, right after turn ``turn``'s export."""

    async def died() -> bool:
        return proc.poll() is not None

    await until(f"the first worker to die after turn {turn}'s export", died, 45)


def export_events(path: Path) -> list[AgentEvent]:
    """The events of the exported run, in order."""
    return [record.event for record in read_export_file(path).open().source_run().events]


async def test_a_local_checkpoint_outlasting_its_task_then_a_lost_task_exports_the_same_bytes(
    client: Client, tmp_path: Path
) -> None:
    # One answer reads two files; turn 1's export takes longer than 80 % of the 3 s workflow task
    # timeout, so turn 2 is exported in the task the SDK went on in. The worker dies right after
    # it: the re-run of that task must export turn 2 as it was.
    responses = read_responses(delay_ms=100)
    first, second = responses[0]["tool_calls"][0], responses[1]["tool_calls"][0]
    responses = [{"tool_calls": [first, second], "delay_ms": 100}, *responses[2:]]
    config, workspace, sink_root = write_setup(tmp_path, responses)
    marker = tmp_path / "died.txt"
    with workers(client, config, tmp_path) as procs:
        dying = procs.start(DYING, "2", str(marker), "1", "3.5")
        handle = await start_run(
            client, AgentRunInput(prompt="read the files", workspace=str(workspace)), queue=procs.queue
        )

        await died_after(dying, 2)
        assert len(export_files(sink_root)) == 2
        other = procs.start()
        result = await check_recovered_run(handle, sink_root, (dying.pid, other.pid))
    assert result.tool_calls_count == N_CALLS


async def test_a_signal_in_the_re_run_of_a_lost_task_is_recorded_after_its_exports(
    client: Client, tmp_path: Path
) -> None:
    # The worker dies right after turn 3's export, in the task that took the model's answer. A bare
    # ``cancel`` comes meanwhile: the run's worker takes only encrypted signals, so it drops it and
    # records that it did. The re-run takes the answer and the signal in one task; turn 3's export
    # must be the one made before, and the record comes after it.
    key = new_key()
    codec = CodecConfig(keys={"k1": KEY_VARIABLE}, encrypt_with="k1")
    extra = f'\n[codec]\nencrypt_with = "k1"\nkeys = {{ k1 = "{KEY_VARIABLE}" }}\n'
    config, workspace, sink_root = write_setup(tmp_path, read_responses(delay_ms=100), extra)
    options = client.config()
    options["data_converter"] = data_converter(codec, {KEY_VARIABLE: key})
    keyed = Client(**options)
    marker = tmp_path / "died.txt"
    with workers(client, config, tmp_path) as procs:
        procs.env[KEY_VARIABLE] = key
        dying = procs.start(DYING, "3", str(marker))
        handle: WorkflowHandle[Any, AgentRunResult] = await start_run(
            keyed, AgentRunInput(prompt="read the files", workspace=str(workspace)), queue=procs.queue
        )

        await died_after(dying, 3)
        await client.get_workflow_handle(handle.id).signal("cancel")  # bare: no payload at all
        other = procs.start()
        result = await check_recovered_run(handle, sink_root, (dying.pid, other.pid))
    dropped = [e for e in export_events(max(export_files(sink_root))) if isinstance(e, ErrorEvent)]
    assert len(dropped) == 1 and "'cancel' signal without an encrypted payload" in dropped[0].message
    assert result.status == "completed"


async def test_an_approved_read_whose_task_is_lost_exports_the_same_bytes(
    client: Client, tmp_path: Path
) -> None:
    # The first read waits for a person. Approved, it runs as an ordinary activity: the task that
    # took the approval stamped its decision with its own time, which only its completion fixes.
    # The worker dies right after turn 1's export; the re-run exports it as it was.
    config, workspace, sink_root = write_setup(tmp_path, read_responses(delay_ms=100))
    others = ", ".join(f'"read(file{i}.txt)"' for i in range(2, N_CALLS + 1))
    rules = config.read_text().replace('"read(*)"', others)
    config.write_text(rules.replace('default = "deny"', 'default = "deny"\nask = ["read(file1.txt)"]'))
    marker = tmp_path / "died.txt"
    with workers(client, config, tmp_path) as procs:
        dying = procs.start(DYING, "1", str(marker))
        handle: WorkflowHandle[Any, AgentRunResult] = await start_run(
            client, AgentRunInput(prompt="read the files", workspace=str(workspace)), queue=procs.queue
        )
        await awaiting_approval(handle, 45)
        # answered once a worker completes the task that takes it: before the fix, the second one
        approve = ApprovalDecision(call_id="r1", approved=True, reason="fine")
        approving = asyncio.create_task(handle.execute_update("approve", approve))

        await died_after(dying, 1)
        other = procs.start()
        await approving
        result = await check_recovered_run(handle, sink_root, (dying.pid, other.pid))
        calls = activity_calls([e async for e in handle.fetch_history_events()])
    # the approved read ran as an ordinary activity; the others, each in its answer's task, locally
    assert calls.count(("remote", TOOL_CALL.name)) == 1, calls
    assert calls.count(("local", TOOL_CALL.name)) == N_CALLS - 1, calls
    assert any(isinstance(e, ConfirmationReceivedEvent) for e in export_events(min(export_files(sink_root))))
    assert result.status == "completed"
