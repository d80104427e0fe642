"""``DurableAgentPlugin``: durable-agent in a Temporal client and worker of your own, in one line.

::

    plugin = DurableAgentPlugin()  # the config named by AGENT_CONFIG (or pass one)
    client = await Client.connect("localhost:7233", plugins=[plugin])
    worker = Worker(client, task_queue="agent", workflows=[MyWorkflow], activities=[my_activity])

The client gets the agent's data converter (pydantic's, encrypting when ``[codec]`` has keys)
and the tracing interceptor when the ``OTEL_*`` variables ask for traces (it then traces your
workflows too); every worker built from that client also runs ``AgentRun`` and the agent's
activities, opens the store's and sinks' connections before it polls and closes them after,
and (with ``[metrics] bind``) serves Prometheus metrics and counts the runs waiting for
approval. With ``[worker] deployment`` (or ``AGENT_DEPLOYMENT``) a worker given no deployment
config of its own polls as that deployment's build, its runs pinned to it
(``durable_agent/deployments.py``). ``worker.py`` is the same worker with nothing of yours in it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable, Sequence
from datetime import timedelta
from typing import Any

import temporalio.converter
from temporalio.contrib.pydantic import PydanticPayloadConverter
from temporalio.plugin import SimplePlugin
from temporalio.runtime import Runtime
from temporalio.service import ConnectConfig, ServiceClient
from temporalio.worker import (
    FixedSizeSlotSupplier,
    ResourceBasedSlotConfig,
    ResourceBasedSlotSupplier,
    ResourceBasedTunerConfig,
    Worker,
    WorkerConfig,
    WorkerTuner,
    WorkflowRunner,
)
from temporalio.worker.workflow_sandbox import SandboxedWorkflowRunner

from durable_agent.activities import AgentActivities
from durable_agent.activities.tools.custom import added_tools
from durable_agent.activities.tools.tool import Tool
from durable_agent.activities.workspaces.hosting import hosting, is_host_queue
from durable_agent.client import agent_interceptors
from durable_agent.codec import data_converter

# ``[worker]``, named apart from the SDK's ``WorkerConfig`` (a worker's options)
from durable_agent.config import AgentConfig, load_config
from durable_agent.config import WorkerConfig as WorkerSettings
from durable_agent.core.builtin_catalog import BUILTIN_TOOLS
from durable_agent.deployments import deployment_config
from durable_agent.telemetry import approvals_waiting_reporter, metrics_runtime
from durable_agent.workflows import AgentRun

# The SDK's defaults, which the plugin tightens where the worker's config left them as they are.
_SDK_HEARTBEAT_THROTTLE = timedelta(seconds=60)
_SDK_STICKY_TIMEOUT = timedelta(seconds=10)
_SDK_NONSTICKY_RATIO = 0.2
# Heartbeats carry a streaming model call's text to followers, a cancel reaches an activity only
# on a heartbeat's answer, and a worker that died is noticed a heartbeat timeout (2 s) after its
# last one. Each that reaches the server is a billed action on Temporal Cloud: one a second at
# most, half the timeout (``activities/support.py`` ``heartbeating`` beats as often).
HEARTBEAT_THROTTLE = timedelta(seconds=1)
# A run whose worker died moves to another after 2 s, not Temporal's default 10 s.
STICKY_TIMEOUT = timedelta(seconds=2)
# How the worker shares its workflow-task polls between its own (sticky) queue and the shared
# one, where the runs of a worker that died arrive. With the SDK's 0.2 (one poll in five), a
# worker that took over ten runs while busy with those it had already moved on took them up a
# median of 0.6 s later than with an equal share, which cost no steps a second (docs/costs.md).
NONSTICKY_POLL_RATIO = 1.0


# Imported from outside the workflow sandbox: our workflow and core modules keep no state and
# read no clock (tests/test_layers.py), and the native extensions beneath the rest cannot be
# imported twice (a module of the user's that imports this one would otherwise fail there).
PASSED_THROUGH = ("durable_agent", "cryptography", "opentelemetry", "asyncpg", "httpx", "mcp")


def _pass_through(runner: WorkflowRunner | None) -> WorkflowRunner:
    if runner is None:
        raise ValueError("DurableAgentPlugin: the worker has no workflow runner")
    if isinstance(runner, SandboxedWorkflowRunner):
        restrictions = runner.restrictions.with_passthrough_modules(*PASSED_THROUGH)
        return dataclasses.replace(runner, restrictions=restrictions)
    return runner


# Nexus operations a worker runs at once (the SDK's default; the agent runs none).
NEXUS_SLOTS = 100


def slot_options(config: WorkerSettings, workflow_task_slots: int | None = None) -> dict[str, Any]:
    """The ``Worker`` options that bound what one process takes on at once (``[worker]``).

    Args:
        config: ``[worker]``.
        workflow_task_slots: Workflow tasks at once, where not the config's.

    Returns:
        ``max_concurrent_workflow_tasks`` (``tuner = "fixed"``), or a ``tuner`` whose workflow
        slots are that many and whose activity slots follow the machine's memory and CPU
        (``tuner = "resource"``).
    """
    slots = workflow_task_slots or config.workflow_task_slots
    if config.tuner == "fixed":
        return {"max_concurrent_workflow_tasks": slots}
    resources = ResourceBasedTunerConfig(
        target_memory_usage=config.target_memory, target_cpu_usage=config.target_cpu
    )
    calls = ResourceBasedSlotSupplier(ResourceBasedSlotConfig(), resources)
    tuner = WorkerTuner.create_composite(
        workflow_supplier=FixedSizeSlotSupplier(slots),
        activity_supplier=calls,
        local_activity_supplier=calls,
        nexus_supplier=FixedSizeSlotSupplier(NEXUS_SLOTS),
    )
    return {"tuner": tuner}


class DurableAgentPlugin(SimplePlugin):
    """Adds the agent's data converter, workflow, activities and interceptors to a client
    and to the workers built from it (see the module docstring).

    Args:
        config: The agent config; default: the file ``AGENT_CONFIG`` names, or the built-in one.
        activities: The activities to register; default: built from ``config`` when the first
            worker is configured (so a client-only use never reads provider credentials).
        tools: Tools of your own (``@tool`` functions) that the workers offer besides the
            built-in ones, as ``AgentActivities(tools=...)`` takes them; with ``activities``,
            give them to those instead.

    Raises:
        ConfigError: The config file is missing or invalid, or the ``OTEL_*`` variables ask
            for an exporter that cannot be made here.
        ToolDefinitionError: A function in ``tools`` cannot be a tool, or a tool's name is
            taken (by a built-in tool, another one given, or the ``mcp__`` names).
        ValueError: Both ``activities`` and ``tools`` are given.
    """

    def __init__(
        self,
        config: AgentConfig | None = None,
        *,
        activities: AgentActivities | None = None,
        tools: Sequence[Tool | Callable[..., Any]] = (),
    ) -> None:
        if activities is not None and tools:
            raise ValueError("DurableAgentPlugin: give the tools to the AgentActivities passed in")
        self.config = config if config is not None else load_config()
        self._activities = activities
        # checked now, so that a clash fails the host's start, not its first worker
        self._tools = list(added_tools(tools, BUILTIN_TOOLS).values())
        self._runtime: Runtime | None = None
        self._workers = 0  # running workers of this plugin's: the last one closes the connections
        super().__init__(
            "durable_agent.DurableAgentPlugin",
            data_converter=self._data_converter,
            interceptors=agent_interceptors(self.config),
            workflows=[AgentRun],
            activities=self._add_activities,
            workflow_runner=_pass_through,
        )

    @property
    def agent_activities(self) -> AgentActivities:
        """The activities every worker built with this plugin runs (made on first use).

        Returns:
            The ``AgentActivities`` given to the plugin, or made from its config.

        Raises:
            ConfigError: As ``AgentActivities`` (a credential or DSN variable the config names
                is unset, …), when they are made here.
        """
        if self._activities is None:
            self._activities = AgentActivities(self.config, tools=self._tools)
        return self._activities

    def _data_converter(
        self, existing: temporalio.converter.DataConverter | None
    ) -> temporalio.converter.DataConverter:
        ours = data_converter(self.config.codec)
        if existing is None or existing is temporalio.converter.DataConverter.default:
            return ours
        # a converter of the host's own: keep its codec and failure converter unless ours encrypts
        converter = dataclasses.replace(existing, payload_converter_class=PydanticPayloadConverter)
        if self.config.codec.enabled:
            # ours refuses what clients send a run unless it came encrypted (``codec.py``)
            converter = dataclasses.replace(
                converter,
                payload_converter_class=ours.payload_converter_class,
                payload_codec=ours.payload_codec,
                failure_converter_class=ours.failure_converter_class,
            )
        return converter

    def _add_activities(self, existing: Sequence[Callable[..., Any]] | None) -> Sequence[Callable[..., Any]]:
        return [*(existing or ()), *self.agent_activities.all()]

    async def connect_service_client(
        self, config: ConnectConfig, next: Callable[[ConnectConfig], Awaitable[ServiceClient]]
    ) -> ServiceClient:
        """With ``[metrics] bind``, the client runs on a runtime that serves Prometheus metrics
        there (the SDK's and the agent's), unless the host gave a runtime of its own.

        Args:
            config: The service connection's options.
            next: The next plugin's connect (or the SDK's).

        Returns:
            The service client; with ``[metrics] bind`` and no runtime of the host's, on a
                runtime that serves Prometheus metrics there (one, shared by every client of
                this plugin).

        Raises:
            ConfigError: ``[metrics] bind``'s host cannot be resolved, or the endpoint cannot
                start there (the port is taken, say).
        """
        bind = self.config.metrics.bind
        if bind is not None and config.runtime is None:
            if self._runtime is None:
                self._runtime = metrics_runtime(bind)
            config = dataclasses.replace(config, runtime=self._runtime)
        return await next(config)

    def configure_worker(self, config: WorkerConfig) -> WorkerConfig:
        """See ``SimplePlugin``; also the worker options takeover after a crash relies on,
        where the worker was given the SDK's defaults.

        Args:
            config: The worker's options as the host gave them.

        Returns:
            The options with ``AgentRun`` and the agent's activities added to the host's,
                the tracing interceptor when traces are on and the client lacks it, the
                modules of ``PASSED_THROUGH`` (``durable_agent`` and the libraries it builds
                on) passed through a sandboxed workflow runner, and the heartbeat throttle
                (1 s), sticky-queue timeout (2 s), the polls' share for the shared queue
                (``NONSTICKY_POLL_RATIO``) and ``[worker] workflow_task_slots`` where the host
                left the SDK's defaults (and set no tuner), and the deployment's build of
                ``[worker] deployment`` (or ``AGENT_DEPLOYMENT``) where the host gave no
                versioning of its own.

        Raises:
            ConfigError: As ``agent_activities``, the first time; ``AGENT_DEPLOYMENT`` or
                ``AGENT_BUILD_ID`` holds a name Temporal would refuse.
            ValueError: The options hold no workflow runner.
        """
        if is_host_queue(config.get("task_queue") or ""):
            return config  # a worker's own queue, made by ``run_worker`` with what it needs
        config = super().configure_worker(config)
        if config.get("max_heartbeat_throttle_interval") == _SDK_HEARTBEAT_THROTTLE:
            config["max_heartbeat_throttle_interval"] = HEARTBEAT_THROTTLE
        if config.get("sticky_queue_schedule_to_start_timeout") == _SDK_STICKY_TIMEOUT:
            config["sticky_queue_schedule_to_start_timeout"] = STICKY_TIMEOUT
        if config.get("nonsticky_to_sticky_poll_ratio") == _SDK_NONSTICKY_RATIO:
            config["nonsticky_to_sticky_poll_ratio"] = NONSTICKY_POLL_RATIO
        if config.get("max_concurrent_workflow_tasks") is None and config.get("tuner") is None:
            config.update(slot_options(self.config.worker))  # type: ignore[typeddict-item]
        # the host's own versioning, or the SDK's older build ids (which the SDK refuses beside a
        # deployment config), is left as it is
        if not any(config.get(key) for key in ("deployment_config", "use_worker_versioning", "build_id")):
            config["deployment_config"] = deployment_config(self.config)
        return config

    async def run_worker(self, worker: Worker, next: Callable[[Worker], Awaitable[None]]) -> None:
        """While a worker runs: the store's and sinks' connections open (closed after the last
        worker of this plugin stops), and with metrics the approvals-waiting gauge kept.

        Args:
            worker: The worker about to run.
            next: What runs it (the next plugin's, or the SDK's).

        Raises:
            PostgresConnectError: As ``AgentActivities.connect``, which runs before the first
                worker of this plugin polls.
            SchemaTooNew: As ``AgentActivities.connect``.
            OSError: As ``AgentActivities.connect``.
            asyncpg.PostgresError: As ``AgentActivities.connect``.
        """
        if is_host_queue(worker.task_queue):
            await next(worker)  # a worker's own queue (``hosting``), run inside its worker's run
            return
        activities = self.agent_activities
        if self._workers == 0:
            await activities.connect()
        self._workers += 1
        try:
            async with hosting(worker, activities):
                if self.config.metrics.bind is not None:
                    async with approvals_waiting_reporter(worker.client, task_queue=worker.task_queue):
                        await next(worker)
                else:
                    await next(worker)
        finally:
            self._workers -= 1
            if self._workers == 0:
                await activities.aclose()
