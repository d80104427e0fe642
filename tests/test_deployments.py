"""Versioned workers (``durable_agent/deployments.py``): the deployment and build a worker runs as,
where each comes from, the default build id, and a real worker of a build on the dev server."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from temporalio.api.deployment.v1 import WorkerDeploymentVersion as VersionProto
from temporalio.api.enums.v1 import TaskQueueType
from temporalio.api.enums.v1 import VersioningBehavior as BehaviorProto
from temporalio.api.workflowservice.v1 import (
    DescribeWorkerDeploymentVersionRequest,
    SetWorkerDeploymentCurrentVersionRequest,
)
from temporalio.client import Client
from temporalio.common import VersioningBehavior, WorkerDeploymentVersion
from temporalio.service import RPCError
from temporalio.worker import Worker

from durable_agent import deployments
from durable_agent.activities import AgentActivities
from durable_agent.config import ConfigError, WorkerConfig, parse_config
from durable_agent.core.run_workspace import HOST_QUEUE_INFIX
from durable_agent.deployments import (
    Deployment,
    default_build_id,
    deployment_config,
    source_digest,
    worker_deployment,
)
from durable_agent.plugin import DurableAgentPlugin
from durable_agent.worker import build_worker
from tests.helpers import final, read_call, scripted_config, start, until, workspace_with

REPO = Path(__file__).resolve().parent.parent


# --- where the deployment and the build come from -----------------------------------------


def test_no_deployment_named_is_an_unversioned_worker() -> None:
    assert worker_deployment(WorkerConfig(), {}) is None
    assert deployment_config(WorkerConfig(build_id="b1"), {"AGENT_BUILD_ID": "b2"}) is None


def test_the_environment_overrides_the_config_and_an_empty_variable_does_not() -> None:
    config = WorkerConfig(deployment="agents", build_id="from-config")
    assert worker_deployment(config, {}) == Deployment(name="agents", build_id="from-config")
    env = {"AGENT_DEPLOYMENT": "other", "AGENT_BUILD_ID": "from-env"}
    assert worker_deployment(config, env) == Deployment(name="other", build_id="from-env")
    assert worker_deployment(config, {"AGENT_DEPLOYMENT": "", "AGENT_BUILD_ID": ""}) == Deployment(
        name="agents", build_id="from-config"
    )
    # the variable alone versions a worker whose config names no deployment
    assert worker_deployment(WorkerConfig(), {"AGENT_DEPLOYMENT": "agents"}) == Deployment(
        name="agents", build_id=default_build_id()
    )


def test_the_deployment_config_pins_runs_to_the_build() -> None:
    made = deployment_config(WorkerConfig(deployment="agents", build_id="b7"), {})
    assert made is not None
    assert made.version == WorkerDeploymentVersion("agents", "b7")
    assert made.use_worker_versioning
    assert made.default_versioning_behavior == VersioningBehavior.PINNED


def test_the_agent_config_takes_the_keys_in_its_worker_table(tmp_path: Path) -> None:
    config = parse_config({"worker": {"deployment": "agents", "build_id": "2026.12.07-1"}}, tmp_path)
    assert worker_deployment(config, {}) == Deployment(name="agents", build_id="2026.12.07-1")


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("deployment", "has.dot"),
        ("deployment", "a:b"),
        ("deployment", "__unversioned__"),
        ("build_id", "a b"),
    ],
)
def test_names_temporal_would_refuse_fail_at_load(tmp_path: Path, key: str, value: str) -> None:
    with pytest.raises(ConfigError, match=key):
        parse_config({"worker": {key: value}}, tmp_path)


@pytest.mark.parametrize(
    "env", [{"AGENT_DEPLOYMENT": "with space"}, {"AGENT_DEPLOYMENT": "ok", "AGENT_BUILD_ID": "__x"}]
)
def test_a_variable_temporal_would_refuse_is_a_config_error_that_names_it(env: dict[str, str]) -> None:
    with pytest.raises(ConfigError, match=next(iter(reversed(env)))):
        worker_deployment(WorkerConfig(), env)


# --- the default build id -----------------------------------------------------------------


def test_the_default_build_id_is_the_version_and_the_source_digest() -> None:
    build = default_build_id()
    version, _, digest = build.rpartition("-")
    assert version and digest == source_digest()[:12]


def test_the_source_digest_is_the_same_in_other_processes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another interpreter (another hash seed, another working folder, its own bytecode) finds
    the same digest of the same files. A copy of the package: the working tree may change while
    the test runs."""
    copy = tmp_path / "durable_agent"
    shutil.copytree(
        Path(deployments.__file__).parent, copy, symlinks=False, ignore=shutil.ignore_patterns("__pycache__")
    )
    code = (
        "import sys; from pathlib import Path; from durable_agent import deployments; "
        "deployments._PACKAGE = Path(sys.argv[1]); print(deployments.source_digest())"
    )
    others = {
        subprocess.run(
            [sys.executable, "-c", code, str(copy)],
            cwd=cwd,
            env={**os.environ, "PYTHONHASHSEED": seed},
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        for cwd, seed in ((REPO, "1"), (tmp_path, "2"))
    }
    monkeypatch.setattr(deployments, "_PACKAGE", copy)
    source_digest.cache_clear()
    try:
        assert others == {source_digest()}
    finally:
        source_digest.cache_clear()


def test_the_digest_changes_with_the_source_and_only_with_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    package = tmp_path / "durable_agent"
    (package / "core").mkdir(parents=True)
    (package / "core" / "loop.py").write_text("STEP = 1\n")
    (tmp_path / "workflows").mkdir()
    (tmp_path / "workflows" / "agent_run.py").write_text("class AgentRun: ...\n")
    (package / "workflows").symlink_to("../workflows")  # as the repository links them
    monkeypatch.setattr(deployments, "_PACKAGE", package)

    def digest() -> str:
        source_digest.cache_clear()
        return source_digest()

    try:
        first = digest()
        (package / "core" / "__pycache__").mkdir()
        (package / "core" / "__pycache__" / "loop.cpython-311.pyc").write_bytes(b"\0bytecode")
        (package / "README.txt").write_text("not code")
        assert digest() == first  # bytecode and other files are not the source
        (tmp_path / "workflows" / "agent_run.py").write_text("class AgentRun: pass\n")
        changed = digest()
        assert changed != first  # a change behind the link counts
        (package / "core" / "new.py").write_text("")
        assert digest() not in (first, changed)  # so does a new file, even empty
    finally:
        source_digest.cache_clear()


# --- a versioned worker on the dev server ---------------------------------------------------


async def version_queues(
    client: Client, version: VersionProto
) -> set[tuple[str, TaskQueueType.ValueType]] | None:
    """The build's task queues, once the shared queue's two and a worker process's own (its host
    queue) are all there."""
    try:
        described = await client.workflow_service.describe_worker_deployment_version(
            DescribeWorkerDeploymentVersionRequest(namespace=client.namespace, deployment_version=version)
        )
    except RPCError:  # not registered yet
        return None
    found = {(q.name, q.type) for q in described.version_task_queues}
    return found if len(found) >= 3 else None


async def test_a_versioned_worker_runs_a_run_pinned_to_its_build(client: Client, tmp_path: Path) -> None:
    """build_worker with ``[worker] deployment``: the worker and its host queue poll as the build;
    once the build is current, a run started goes to it and is pinned to it."""
    name = f"dep-{uuid.uuid4().hex[:8]}"
    ws = workspace_with(tmp_path, {"evidence.txt": "pinned\n"})
    config = scripted_config(
        tmp_path,
        [read_call("r1", "evidence.txt"), final("done")],
        worker={"deployment": name, "build_id": "b1"},
    )
    activities = AgentActivities(config)
    queue = f"test-{uuid.uuid4().hex[:10]}"
    version = VersionProto(deployment_name=name, build_id="b1")
    async with build_worker(client, activities, queue):
        registered = await until("the build's three task queues", lambda: version_queues(client, version))
        assert (queue, TaskQueueType.TASK_QUEUE_TYPE_WORKFLOW) in registered
        assert any(HOST_QUEUE_INFIX in name for name, _ in registered)
        await client.workflow_service.set_worker_deployment_current_version(
            SetWorkerDeploymentCurrentVersionRequest(
                namespace=client.namespace, deployment_name=name, build_id="b1"
            )
        )
        handle = await start(client, queue, ws)
        result = await handle.result()
        described = await handle.describe()
    assert (result.status, result.text) == ("completed", "done")
    info = described.raw_description.workflow_execution_info.versioning_info
    assert info.behavior == BehaviorProto.VERSIONING_BEHAVIOR_PINNED
    assert (info.deployment_version.deployment_name, info.deployment_version.build_id) == (name, "b1")
    assert described.search_attributes.get("TemporalWorkerDeploymentVersion") == [f"{name}:b1"]


async def test_an_unversioned_worker_stays_unversioned(client: Client, tmp_path: Path) -> None:
    config = scripted_config(tmp_path, [final("plain")])
    worker = build_worker(client, AgentActivities(config), f"test-{uuid.uuid4().hex[:10]}")
    assert worker.config()["deployment_config"] is None
    ws = workspace_with(tmp_path, {"a.txt": "a\n"})
    async with worker:
        handle = await start(client, worker.task_queue, ws)
        assert (await handle.result()).text == "plain"
        described = await handle.describe()
    assert not described.raw_description.workflow_execution_info.HasField("versioning_info")


async def test_the_plugin_versions_a_worker_the_host_left_unversioned(client: Client, tmp_path: Path) -> None:
    """The plugin's worker, and the host queue's worker it runs beside it, poll as the build."""
    name = f"dep-{uuid.uuid4().hex[:8]}"
    config = scripted_config(tmp_path, [final()], worker={"deployment": name, "build_id": "b3"})
    own = await Client.connect(
        client.service_client.config.target_host,
        namespace=client.namespace,
        plugins=[DurableAgentPlugin(config)],
    )
    queue = f"plugin-{uuid.uuid4().hex[:8]}"
    made = Worker(own, task_queue=queue)
    assert made.config(active_config=True)["deployment_config"] == deployment_config(config, {})
    async with made:
        registered = await until(
            "the build's three task queues",
            lambda: version_queues(client, VersionProto(deployment_name=name, build_id="b3")),
        )
    assert any(HOST_QUEUE_INFIX in queue_name for queue_name, _ in registered)
    mine = deployment_config(WorkerConfig(deployment="mine", build_id="x"), {})
    kept = Worker(own, task_queue=queue, deployment_config=mine)
    assert kept.config(active_config=True)["deployment_config"] is mine


# --- python worker.py ---------------------------------------------------------------------


def worker_env(client: Client, tmp: Path, **extra: str) -> dict[str, str]:
    config = tmp / "worker.toml"
    config.write_text(
        f'[store]\npath = "{tmp / "store"}"\n[sinks.local]\nkind = "filesystem"\npath = "{tmp / "exports"}"\n'
        '[sandbox]\nkind = "none"\n'
    )
    return {
        **os.environ,
        "TEMPORAL_ADDRESS": client.service_client.config.target_host,
        "TEMPORAL_NAMESPACE": client.namespace,
        "AGENT_TASK_QUEUE": f"worker-py-{uuid.uuid4().hex[:8]}",
        "AGENT_CONFIG": str(config),
        "PYTHONUNBUFFERED": "1",
        **extra,
    }


async def test_python_worker_py_polls_as_the_build_the_environment_names(
    client: Client, tmp_path: Path
) -> None:
    name = f"dep-{uuid.uuid4().hex[:8]}"
    log = tmp_path / "worker.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "worker.py"],
            cwd=REPO,
            env=worker_env(client, tmp_path, AGENT_DEPLOYMENT=name, AGENT_BUILD_ID="from-env"),
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        version = VersionProto(deployment_name=name, build_id="from-env")

        async def registered() -> bool:
            assert proc.poll() is None, log.read_text()
            try:
                await client.workflow_service.describe_worker_deployment_version(
                    DescribeWorkerDeploymentVersionRequest(
                        namespace=client.namespace, deployment_version=version
                    )
                )
            except RPCError:
                return False
            return True

        await until(
            lambda: f"python worker.py as build from-env of {name}: {log.read_text()}", registered, 30
        )
        assert f"as build 'from-env' of worker deployment '{name}'" in log.read_text()
    finally:
        proc.terminate()
        proc.wait(30)


def test_python_worker_py_refuses_a_deployment_name_temporal_would_refuse(
    client: Client, tmp_path: Path
) -> None:
    done = subprocess.run(
        [sys.executable, "worker.py"],
        cwd=REPO,
        env=worker_env(client, tmp_path, AGENT_DEPLOYMENT="has.dot"),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "worker: AGENT_DEPLOYMENT 'has.dot' is not a valid name: a letter or digit first, then no spaces, "
        "quotes, backslashes, '.' or ':'; 255 characters at most"
    ]
