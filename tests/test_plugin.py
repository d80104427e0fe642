"""``DurableAgentPlugin``: one line adds the agent to a client and a plain ``Worker`` of the user's."""

from __future__ import annotations

import base64
import uuid
from datetime import timedelta
from pathlib import Path

import pytest
from temporalio import activity, workflow
from temporalio.client import Client, WorkflowHistory
from temporalio.worker import FixedSizeSlotSupplier, Replayer, ResourceBasedSlotSupplier, Worker, WorkerTuner

from durable_agent.activities import AgentActivities
from durable_agent.activities.workspaces.hosting import hosting
from durable_agent.client import start_run
from durable_agent.config import WORKFLOW_TASK_SLOTS, AgentConfig, ConfigError, load_config
from durable_agent.core.run_api import AgentRunInput
from durable_agent.plugin import (
    HEARTBEAT_THROTTLE,
    NONSTICKY_POLL_RATIO,
    STICKY_TIMEOUT,
    DurableAgentPlugin,
    slot_options,
)
from durable_agent.worker import build_worker
from tests.helpers import final, read_call, scripted_config, workspace_with

HISTORIES = Path(__file__).parent / "histories"


@activity.defn(name="user.greet")
async def greet(name: str) -> str:
    return f"hello {name}"


@workflow.defn(name="UserGreeting")
class UserGreeting:
    """The user's own workflow, on the same worker as the agent's."""

    @workflow.run
    async def run(self, name: str) -> str:
        return await workflow.execute_activity(greet, name, start_to_close_timeout=timedelta(seconds=10))


async def plugin_client(client: Client, plugin: DurableAgentPlugin) -> Client:
    return await Client.connect(
        client.service_client.config.target_host, namespace=client.namespace, plugins=[plugin]
    )


async def test_the_plugin_wires_a_plain_worker_that_completes_a_run(client: Client, tmp_path: Path) -> None:
    ws = workspace_with(tmp_path, {"evidence.txt": "the plugin works\n"})
    config = scripted_config(tmp_path, [read_call("r1", "evidence.txt"), final("read it")])
    plugin = DurableAgentPlugin(config)
    own = await plugin_client(client, plugin)
    queue = f"plugin-{uuid.uuid4().hex[:8]}"
    # the user's worker, as they write it: their workflow and activity, nothing of ours
    worker = Worker(own, task_queue=queue, workflows=[UserGreeting], activities=[greet])
    assert worker.config(active_config=True)["max_heartbeat_throttle_interval"] == HEARTBEAT_THROTTLE
    assert worker.config(active_config=True)["sticky_queue_schedule_to_start_timeout"] == STICKY_TIMEOUT
    assert worker.config(active_config=True)["nonsticky_to_sticky_poll_ratio"] == NONSTICKY_POLL_RATIO
    assert worker.config(active_config=True)["max_concurrent_workflow_tasks"] == WORKFLOW_TASK_SLOTS
    async with worker:
        handle = await start_run(
            own, AgentRunInput(prompt="read the evidence", workspace=str(ws)), queue=queue
        )
        result = await handle.result()
        greeting = await own.execute_workflow(
            UserGreeting.run, "you", id=f"greet-{uuid.uuid4().hex[:8]}", task_queue=queue
        )
    assert (result.status, result.text, result.tool_calls_count) == ("completed", "read it", 1)
    assert [e.turn for e in result.exports] == [1]
    assert greeting == "hello you"
    # the exports went to the config's sink, through the activities the plugin registered
    assert list((tmp_path / "exports").rglob("turn-000001-*.json"))


async def test_workflow_task_slots_come_from_the_config_where_the_host_set_none(
    client: Client, tmp_path: Path
) -> None:
    """``[worker] workflow_task_slots``: build_worker's and the plugin's default; a host's own
    ``max_concurrent_workflow_tasks`` or tuner is kept."""
    config = scripted_config(tmp_path, [final()])
    config = config.model_copy(update={"worker": config.worker.model_copy(update={"workflow_task_slots": 3})})
    own = await plugin_client(client, DurableAgentPlugin(config))

    def slots(worker: Worker) -> object:
        options = worker.config(active_config=True)
        worker._bridge_worker.initiate_shutdown()  # never run: it stops without polling
        return options.get("max_concurrent_workflow_tasks")

    q = f"slots-{uuid.uuid4().hex[:8]}"
    assert slots(Worker(own, task_queue=f"{q}-a")) == 3
    assert slots(Worker(own, task_queue=f"{q}-b", max_concurrent_workflow_tasks=7)) == 7
    fixed = WorkerTuner.create_fixed(workflow_slots=9, activity_slots=9)
    tuned = Worker(own, task_queue=f"{q}-c", tuner=fixed)
    assert slots(tuned) is None
    acts = AgentActivities(config)
    try:
        built = build_worker(client, acts, f"{q}-d")
        assert slots(built) == 3
        assert built.config(active_config=True)["nonsticky_to_sticky_poll_ratio"] == NONSTICKY_POLL_RATIO
        assert slots(build_worker(client, acts, f"{q}-e", workflow_task_slots=5)) == 5
    finally:
        await acts.aclose()


async def test_a_resource_based_tuner_runs_the_calls_and_keeps_the_workflow_slots(
    client: Client, tmp_path: Path
) -> None:
    """``[worker] tuner = "resource"``: activities follow the machine's memory and CPU, workflow
    tasks stay ``workflow_task_slots``; build_worker's worker and the plugin's run a run with it."""
    ws = workspace_with(tmp_path, {"evidence.txt": "tuned\n"})
    config = scripted_config(
        tmp_path,
        [read_call("r1", "evidence.txt"), final("read it")],
        worker={"tuner": "resource", "target_memory": 0.9, "target_cpu": 0.95, "workflow_task_slots": 3},
    )
    options = slot_options(config.worker)
    assert set(options) == {"tuner"}
    tuner = options["tuner"]
    workflows, calls = tuner.workflow_slot_supplier, tuner.activity_slot_supplier
    assert isinstance(workflows, FixedSizeSlotSupplier) and workflows.num_slots == 3
    assert isinstance(calls, ResourceBasedSlotSupplier) and calls.tuner_config.target_memory_usage == 0.9
    own = await plugin_client(client, DurableAgentPlugin(config))
    queue = f"tuned-{uuid.uuid4().hex[:8]}"
    async with Worker(own, task_queue=queue, workflows=[UserGreeting], activities=[greet]) as worker:
        assert worker.config(active_config=True).get("tuner") is not None
        run = AgentRunInput(prompt="read the evidence", workspace=str(ws))
        result = await (await start_run(own, run, queue=queue)).result()
    assert (result.status, result.text) == ("completed", "read it")
    acts = AgentActivities(config)
    try:  # and build_worker's worker
        built = build_worker(client, acts, f"{queue}-built")
        assert built.config(active_config=True).get("tuner") is not None
        assert built.config(active_config=True).get("max_concurrent_workflow_tasks") is None
        built._bridge_worker.initiate_shutdown()  # never run: it stops without polling
    finally:
        await acts.aclose()
    with pytest.raises(ConfigError, match="target_cpu"):
        scripted_config(tmp_path, [final()], worker={"tuner": "resource", "target_cpu": 1.5})


def test_workflow_task_slots_below_the_sdks_floor_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "agent.toml"
    path.write_text("[worker]\nworkflow_task_slots = 1\n")
    with pytest.raises(ConfigError, match="workflow_task_slots"):
        load_config(path)
    assert AgentConfig().worker.workflow_task_slots == WORKFLOW_TASK_SLOTS


async def test_the_plugin_encrypts_with_the_config_codec(
    client: Client, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AGENT_TEST_PLUGIN_KEY", base64.b64encode(b"k" * 32).decode())
    ws = workspace_with(tmp_path, {"evidence.txt": "plugin-plaintext-marker\n"})
    config = scripted_config(
        tmp_path,
        [read_call("r1", "evidence.txt"), final()],
        codec={"keys": {"k1": "AGENT_TEST_PLUGIN_KEY"}, "encrypt_with": "k1"},
    )
    own = await plugin_client(client, DurableAgentPlugin(config))
    queue = f"plugin-{uuid.uuid4().hex[:8]}"
    async with Worker(own, task_queue=queue):
        handle = await start_run(own, AgentRunInput(prompt="read it", workspace=str(ws)), queue=queue)
        assert (await handle.result()).status == "completed"
    raw = await client.get_workflow_handle(handle.id).fetch_history()
    assert b"plugin-plaintext-marker" not in raw.to_json().encode()
    started = raw.events[0].workflow_execution_started_event_attributes
    assert started.input.payloads[0].metadata["encoding"] == b"binary/encrypted"


async def test_the_plugin_replays_recorded_histories() -> None:
    """A ``Replayer`` given the plugin has the workflow and the converter it needs."""
    history = WorkflowHistory.from_json("recorded", (HISTORIES / "agent_run_v5.json").read_text())
    replayer = Replayer(workflows=[], plugins=[DurableAgentPlugin()])
    result = await replayer.replay_workflow(history, raise_on_replay_failure=True)
    assert result.replay_failure is None


async def test_the_host_queue_worker_runs_as_the_plugin_configured_the_worker(
    client: Client, tmp_path: Path
) -> None:
    """The worker of a run's host queue (docs/workspaces.md) takes the shared worker's settings as
    the plugin made them, not as the user wrote them: its heartbeat throttle, its shutdown."""
    config = scripted_config(tmp_path, [final("unused")])
    plugin = DurableAgentPlugin(config)
    own = await plugin_client(client, plugin)
    worker = Worker(
        own, task_queue=f"plugin-{uuid.uuid4().hex[:8]}", workflows=[UserGreeting], activities=[greet]
    )
    async with hosting(worker, AgentActivities(config)) as host:
        assert host is not None
        assert host.config(active_config=True)["max_heartbeat_throttle_interval"] == HEARTBEAT_THROTTLE
