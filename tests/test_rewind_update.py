"""The ``rewind`` update: a conversation run that waits for its next prompt goes back to one of
its exported turns: its workspace restored to that turn's files, and the run going on, under the
same workflow id, as a new run resumed from that turn's export."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from temporalio.client import Client, WorkflowHandle, WorkflowUpdateFailedError

from durable_agent.activities import AgentActivities
from durable_agent.activities.providers.from_config import build_providers
from durable_agent.activities.providers.model_provider import ModelProvider, TextSink, assistant_step
from durable_agent.client import end_conversation
from durable_agent.config import AgentConfig
from durable_agent.core.activity_api import ModelCallInput
from durable_agent.core.events import EventRecord, RewindEvent
from durable_agent.core.models import ModelResponse, TextBlock, TokenUsage, ToolResultBlock
from durable_agent.core.run_api import UPDATE_REWIND, RewindAccepted, RewindRequest
from tests.helpers import (
    RecordingProvider,
    final,
    running_worker,
    scripted_config,
    start,
    status_when,
    tool_call,
)
from tests.test_workspace_checkpoints import cli, files_of

AFTER = "go on after the rewind"

SCRIPT = [
    tool_call("w1", "write", file_path="a.txt", content="alpha\n"),
    tool_call("b1", "bash", command="echo beta > b.txt && echo changed > a.txt"),
    final("done"),
]


class AfterRewind:
    """The scripted model, but a request whose last message holds ``AFTER`` is answered with text
    (the script counts steps from the conversation, which a rewind shortens)."""

    def __init__(self, inner: ModelProvider) -> None:
        self.inner = inner

    async def complete(self, call: ModelCallInput, model: str, on_text: TextSink) -> ModelResponse:
        last = call.messages[-1]
        if any(isinstance(b, TextBlock) and b.text == AFTER for b in last.content):
            return assistant_step([TextBlock(text="answered from turn 1")], TokenUsage(), "end_turn")
        return await self.inner.complete(call, model, on_text)


def writing_config(tmp: Path, script: list[dict[str, Any]] = SCRIPT, **extra: Any) -> AgentConfig:
    """The scripted model's config, allowed to read, write and run bash (unsandboxed), its
    workspace recorded in a shadow of the test's own."""
    return scripted_config(
        tmp,
        script,
        permissions={"allow": ["read(*)", "write(*)", "bash"], "default": "deny"},
        sandbox={"kind": "none"},
        workspace_checkpoints={"path": str(tmp / "worker-shadow")},
        **extra,
    )


def activities(tmp: Path) -> tuple[AgentActivities, RecordingProvider]:
    config = writing_config(tmp)
    model = RecordingProvider(AfterRewind(build_providers(config)["scripted"]))
    return AgentActivities(config, providers={"scripted": model}), model


async def awaiting_prompt(handle: WorkflowHandle[Any, Any]) -> None:
    await status_when(handle, lambda s: s.status == "awaiting_prompt", "the run to await a prompt")


async def rewind(handle: WorkflowHandle[Any, Any], turn: int, prompt: str | None = None) -> RewindAccepted:
    accepted: RewindAccepted = await handle.execute_update(
        UPDATE_REWIND, RewindRequest(turn=turn, prompt=prompt), result_type=RewindAccepted
    )
    return accepted


async def events_of(handle: WorkflowHandle[Any, Any]) -> list[EventRecord]:
    records: list[EventRecord] = await handle.query("events", 0, result_type=list[EventRecord])
    return records


def workspace(tmp: Path) -> Path:
    ws = tmp / "workspace"
    ws.mkdir()
    (ws / "keep.txt").write_text("kept\n")
    return ws


async def test_rewind_restores_the_files_and_goes_on_from_the_turn(client: Client, tmp_path: Path) -> None:
    ws = workspace(tmp_path)
    acts, model = activities(tmp_path)
    async with running_worker(client, acts) as queue:
        handle = await start(client, queue, ws, "write, then build", follow_ups=True)
        await awaiting_prompt(handle)
        first_run = (await handle.describe()).run_id
        assert files_of(ws)["b.txt"] == (b"beta\n", 0o644)
        assert files_of(ws)["a.txt"] == (b"changed\n", 0o644)

        accepted = await rewind(handle, 1, AFTER)
        assert accepted.turn == 1 and accepted.tree is not None
        # the files of turn 1: a.txt as written then, no b.txt
        assert files_of(ws) == {"keep.txt": (b"kept\n", 0o644), "a.txt": (b"alpha\n", 0o644)}

        await awaiting_prompt(handle)  # the run went on, same workflow id, and answered
        new_run = (await handle.describe()).run_id
        events = await events_of(handle)
        rewinds = [r.event for r in events if isinstance(r.event, RewindEvent)]
        assert [(e.turn, e.tree) for e in rewinds] == [(1, accepted.tree)]
        await end_conversation(handle)
        result = await handle.result()
    assert result.status == "completed" and result.text == "answered from turn 1"
    # the request after the rewind holds turn 1's result and the prompt, not turn 2's call
    last = model.seen[-1]
    results = [b.tool_use_id for m in last for b in m.content if isinstance(b, ToolResultBlock)]
    assert results == ["w1"]
    assert last[-1].content[-1] == TextBlock(text=AFTER)
    # a new run of the same session (its answer needed no tool call: it made no export)
    exports = sorted((tmp_path / "exports").rglob("turn-*.json"))
    assert {p.parent.name for p in exports} == {first_run}
    assert result.run_id == new_run != first_run
    assert {p.parent.parent.name for p in exports} == {result.session_id}


async def test_rewind_is_refused_unless_the_run_waits_and_the_turn_was_exported(
    client: Client, tmp_path: Path
) -> None:
    ws = workspace(tmp_path)
    acts, _ = activities(tmp_path)
    async with running_worker(client, acts) as queue:
        # a run that does not wait for a prompt (it ends with its answer): refused while it works
        slow = scripted_config(tmp_path, [{"text": "slow", "delay_ms": 3000}])
        async with running_worker(client, AgentActivities(slow)) as slow_queue:
            busy = await start(client, slow_queue, ws, "hello", follow_ups=True)
            await status_when(
                busy, lambda s: s.status == "executing" and s.event_count >= 1, "the run to work"
            )
            with pytest.raises(WorkflowUpdateFailedError) as working:
                await rewind(busy, 1)
            assert "not waiting for a prompt" in str(working.value.cause)
            await busy.terminate("test over")

        handle = await start(client, queue, ws, "write, then build", follow_ups=True)
        await awaiting_prompt(handle)
        with pytest.raises(WorkflowUpdateFailedError) as unknown:
            await rewind(handle, 7)
        assert "no export at turn 7 (turns: [1, 2])" in str(unknown.value.cause)
        history = (await handle.fetch_history()).to_json()
        assert "agent.restore_workspace" not in history  # refused before the history
        assert files_of(ws)["b.txt"] == (b"beta\n", 0o644)  # nothing restored
        await end_conversation(handle)
        assert (await handle.result()).status == "completed"


async def test_the_cli_rewinds_a_waiting_run_with_the_update(client: Client, tmp_path: Path) -> None:
    ws = workspace(tmp_path)
    acts, _ = activities(tmp_path)
    async with running_worker(client, acts) as queue:
        handle = await start(client, queue, ws, "write, then build", follow_ups=True)
        await awaiting_prompt(handle)
        done = await cli(client, tmp_path, "rewind", handle.id, "--turn", "1", "--prompt", AFTER)
        assert done.returncode == 0, done.stderr
        assert done.stdout.strip().splitlines()[-1] == handle.id  # the same workflow goes on
        assert "rewound to turn 1" in done.stdout
        assert "b.txt" not in files_of(ws)
        await awaiting_prompt(handle)
        # a rewind to a turn the run never exported is refused by the run, said on stderr
        refused = await cli(client, tmp_path, "rewind", handle.id, "--turn", "9")
        assert refused.returncode == 2 and "no export at turn 9" in refused.stderr, refused.stderr
        await end_conversation(handle)
        result = await handle.result()
    assert result.text == "answered from turn 1"
