"""``durable-agent deploy`` on a real dev server: two builds of the worker in this process, and the
commands that route new runs between them (``durable_agent/cli/deploy.py``, ``deploy_state.py``,
``deploy_routing.py``).

The module starts a dev server of its own, which checks every second whether a build that is no
longer current is drained (the server's default waits minutes), so that ``status`` shows it.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from temporalio.client import Client, WorkflowHandle
from temporalio.testing import WorkflowEnvironment

from durable_agent import deploy_state
from durable_agent.activities import AgentActivities
from durable_agent.cli.commands import run_cli
from durable_agent.client import end_conversation
from durable_agent.devserver import DEV_SERVER_SETTINGS, start_ephemeral_server
from durable_agent.worker import build_worker
from tests.helpers import final, scripted_config, start, until, workspace_with

FAST_DRAINAGE = (
    "--dynamic-config-value",
    'matching.wv.VersionDrainageStatusRefreshInterval="1s"',
    "--dynamic-config-value",
    'matching.wv.VersionDrainageStatusVisibilityGracePeriod="1s"',
)


@pytest.fixture(scope="module")
async def deploy_server() -> AsyncIterator[WorkflowEnvironment]:
    env = await start_ephemeral_server(dev_server_extra_args=[*DEV_SERVER_SETTINGS, *FAST_DRAINAGE])
    try:
        yield env
    finally:
        await env.shutdown()


@pytest.fixture
def dclient(deploy_server: WorkflowEnvironment, monkeypatch: pytest.MonkeyPatch) -> Client:
    """The module's server's client; the CLI pointed at it, with no deployment of its own."""
    client = deploy_server.client
    monkeypatch.setenv("TEMPORAL_ADDRESS", client.service_client.config.target_host)
    monkeypatch.setenv("TEMPORAL_NAMESPACE", client.namespace)
    for name in ("AGENT_CONFIG", "AGENT_DEPLOYMENT", "AGENT_BUILD_ID", "TEMPORAL_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    return client


async def deploy(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    """``durable-agent deploy ARGS`` in this process (a thread: it runs its own event loop)."""
    capsys.readouterr()
    code = await asyncio.to_thread(run_cli, ["deploy", *args])
    out, err = capsys.readouterr()
    return code, out, err


async def state(capsys: pytest.CaptureFixture[str], name: str) -> dict[str, Any]:
    code, out, err = await deploy(capsys, "status", "--deployment", name, "--json")
    assert code == 0, err
    return dict(json.loads(out))


def build_of(found: dict[str, Any], build_id: str) -> dict[str, Any]:
    """The build ``build_id`` in ``deploy status --json``'s output (empty: not there yet)."""
    return dict(next((b for b in found["builds"] if b["build_id"] == build_id), {}))


async def pinned_to(handle: WorkflowHandle[Any, Any]) -> tuple[int, str]:
    info = (await handle.describe()).raw_description.workflow_execution_info.versioning_info
    return info.behavior, info.deployment_version.build_id


class Builds:
    """Workers of deployment ``name`` on one task queue, one a build, in this process."""

    def __init__(self, client: Client, tmp: Path, stack: AsyncExitStack) -> None:
        self.client, self.tmp, self.stack = client, tmp, stack
        self.name = f"agents-{uuid.uuid4().hex[:8]}"
        self.queue = f"deploy-{uuid.uuid4().hex[:8]}"
        self.workspace = workspace_with(tmp, {"a.txt": "a\n"})

    async def start(self, build_id: str, capsys: pytest.CaptureFixture[str]) -> None:
        folder = self.tmp / build_id
        folder.mkdir()
        config = scripted_config(
            folder,
            [final(f"{build_id} one"), final(f"{build_id} two"), final(f"{build_id} three")],
            worker={"deployment": self.name, "build_id": build_id},
        )
        await self.stack.enter_async_context(build_worker(self.client, AgentActivities(config), self.queue))

        async def polls() -> bool:
            code, out, _ = await deploy(capsys, "status", "--deployment", self.name, "--json")
            return code == 0 and build_of(json.loads(out), build_id).get("pollers", 0) > 0

        await until(f"build {build_id}'s worker in deploy status", polls)

    async def run(self) -> WorkflowHandle[Any, Any]:
        handle = await start(self.client, self.queue, self.workspace, "hello", follow_ups=True)

        async def placed() -> bool:
            return bool((await pinned_to(handle))[1])

        await until("the run's first workflow task", placed)
        return handle


async def test_promote_ramp_rollback_and_drain(
    dclient: Client, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    async with AsyncExitStack() as stack:
        builds = Builds(dclient, tmp_path, stack)
        await builds.start("b1", capsys)
        code, out, _ = await deploy(capsys, "promote", "b1", "--deployment", builds.name)
        assert code == 0 and "build b1 is the current build" in out
        first = await builds.run()
        assert await pinned_to(first) == (1, "b1")  # VERSIONING_BEHAVIOR_PINNED
        found = await state(capsys, builds.name)
        assert found["current"] == "b1"
        assert {k: build_of(found, "b1")[k] for k in ("status", "running", "pinned")} == {
            "status": "current",
            "running": 1,
            "pinned": 1,
        }

        await builds.start("b2", capsys)
        code, out, _ = await deploy(capsys, "ramp", "b2", "25", "--deployment", builds.name)
        assert (code, out.strip()) == (0, f"25% of the new runs of deployment {builds.name} go to build b2")
        found = await state(capsys, builds.name)
        assert (found["ramping"], found["ramp_percentage"]) == ("b2", 25)
        code, out, _ = await deploy(capsys, "status", "--deployment", builds.name)
        assert "ramping 25%" in out
        code, out, _ = await deploy(capsys, "rollback", "--deployment", builds.name)
        assert code == 0 and "the ramp of build b2 ended" in out
        assert (await state(capsys, builds.name))["ramping"] is None

        code, out, _ = await deploy(capsys, "promote", "b2", "--deployment", builds.name)
        assert code == 0 and "runs pinned to build b1 stay on it" in out
        second = await builds.run()
        assert await pinned_to(second) == (1, "b2")
        assert await pinned_to(first) == (1, "b1")  # the run in flight stays on its build
        found = await state(capsys, builds.name)
        assert (found["current"], build_of(found, "b1")["status"], build_of(found, "b1")["pinned"]) == (
            "b2",
            "draining",
            1,
        )
        await end_conversation(first)
        assert (await first.result()).text == "b1 one"  # answered and closed on build b1

        async def drained() -> bool:
            return bool(build_of(await state(capsys, builds.name), "b1")["status"] == "drained")

        await until("build b1 drained once its run ended", drained)
        code, out, _ = await deploy(capsys, "status", "--deployment", builds.name)
        assert "its workers may stop" in out

        code, out, _ = await deploy(capsys, "rollback", "--deployment", builds.name)
        assert code == 0 and f"build b1 is the current build of deployment {builds.name} again" in out
        third = await builds.run()
        assert await pinned_to(third) == (1, "b1")
        for handle in (second, third):
            await end_conversation(handle)
            await handle.result()


async def test_refusals_are_one_line_and_exit_non_zero(
    dclient: Client, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    code, _, err = await deploy(capsys, "status", "--deployment", "never-polled")
    assert (code, err.strip()) == (
        1,
        "durable-agent: deploy status: no worker deployment 'never-polled': no worker of it has polled yet "
        "(workers name it with [worker] deployment or AGENT_DEPLOYMENT)",
    )
    code, _, err = await deploy(capsys, "status")
    assert code == 2 and "no deployment named: give --deployment NAME" in err
    async with AsyncExitStack() as stack:
        builds = Builds(dclient, tmp_path, stack)
        await builds.start("b1", capsys)
        code, _, err = await deploy(capsys, "promote", "b9", "--deployment", builds.name)
        assert (code, err.strip()) == (
            1,
            f"durable-agent: deploy promote: deployment {builds.name!r} has no build 'b9' (its builds: b1): "
            "start a worker of it first",
        )
        code, _, err = await deploy(capsys, "rollback", "--deployment", builds.name)
        assert code == 1 and "nothing to roll back to" in err
        await deploy(capsys, "promote", "b1", "--deployment", builds.name)
        code, _, err = await deploy(capsys, "ramp", "b1", "10", "--deployment", builds.name)
        assert code == 1 and "is the current build already" in err
        # the deployment from the environment, as the workers read it
        monkeypatch.setenv("AGENT_DEPLOYMENT", builds.name)
        code, out, _ = await deploy(capsys, "promote", "b1")
        assert (code, out.strip()) == (
            0,
            f"build b1 is the current build of deployment {builds.name} already",
        )


async def test_a_build_no_worker_polls_gets_no_runs_unless_forced(
    dclient: Client, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    async with AsyncExitStack() as stack:
        builds = Builds(dclient, tmp_path, stack)
        await builds.start("b1", capsys)
        async with AsyncExitStack() as second:
            builds.stack = second
            await builds.start("b2", capsys)
        code, _, _ = await deploy(capsys, "promote", "b1", "--deployment", builds.name)
        assert code == 0
        # b2's worker stopped: the server lists a poller for minutes after its last poll, so the
        # window that counts one as still there is cut to nothing
        live = deploy_state.LIVE_POLL
        monkeypatch.setattr(deploy_state, "LIVE_POLL", timedelta(0))
        code, _, err = await deploy(capsys, "promote", "b2", "--deployment", builds.name)
        assert (code, err.strip()) == (
            1,
            "durable-agent: deploy promote: no worker of build 'b2' polls (none in the last 0 s): start its "
            "workers first (--force routes runs to it anyway, to wait for them)",
        )
        code, _, err = await deploy(capsys, "ramp", "b2", "50", "--deployment", builds.name)
        assert code == 1 and "no worker of build 'b2' polls" in err
        code, out, _ = await deploy(capsys, "promote", "b2", "--force", "--deployment", builds.name)
        assert code == 0 and "build b2 is the current build" in out
        code, _, err = await deploy(capsys, "rollback", "--deployment", builds.name)
        assert code == 1 and "no worker of build 'b1' polls" in err
        monkeypatch.setattr(deploy_state, "LIVE_POLL", live)
        code, out, _ = await deploy(capsys, "rollback", "--deployment", builds.name)
        assert code == 0 and "build b1 is the current build" in out


async def test_an_ended_run_of_a_stopped_drained_build_answers_its_result_not_queries(
    dclient: Client, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    async with AsyncExitStack() as stack:
        builds = Builds(dclient, tmp_path, stack)
        async with AsyncExitStack() as first:
            builds.stack = first
            await builds.start("b1", capsys)
            await deploy(capsys, "promote", "b1", "--deployment", builds.name)
            handle = await builds.run()
            await end_conversation(handle)
            await handle.result()
            builds.stack = stack
            await builds.start("b2", capsys)
            await deploy(capsys, "promote", "b2", "--deployment", builds.name)

            async def drained() -> bool:
                return bool(build_of(await state(capsys, builds.name), "b1")["status"] == "drained")

            await until("build b1 drained", drained)
        # b1's workers stopped
        capsys.readouterr()
        started = asyncio.get_running_loop().time()
        code = await asyncio.to_thread(run_cli, ["status", handle.id])
        took = asyncio.get_running_loop().time() - started
        _, err = capsys.readouterr()
        print(f"status of a run on a stopped drained build: exit {code} after {took:.1f} s: {err.strip()}")
        # while the server still lists the stopped workers (minutes), the query waits for one of
        # them and fails; after, the server refuses it at once (docs/production.md)
        assert code == 1 and len(err.strip().splitlines()) == 1
        assert "no poller seen for task queue recently" in err or "PINNED to Worker Deployment Version" in err
        capsys.readouterr()  # the line above
        code = await asyncio.to_thread(run_cli, ["result", handle.id])
        out, err = capsys.readouterr()
        assert code == 0, err
        assert json.loads(out)["text"] == "b1 one", out
