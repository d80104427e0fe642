"""``durable-agent deploy``: a Worker Deployment's builds, and which of them new runs go to.

``status`` shows each build of the deployment (current, ramping, draining: runs still pinned to
it, drained: its workers may stop), its open and pinned runs and the workers polling it;
``promote BUILD`` makes a build current, ``ramp BUILD PERCENT`` sends a share of new runs to
one, ``rollback`` undoes the last change (``durable_agent/deploy_state.py``,
``deploy_routing.py``). The deployment is ``--deployment``'s, else the workers'
(``AGENT_DEPLOYMENT``, ``[worker] deployment`` in ``AGENT_CONFIG``'s config). A refusal is one
line and exit code 1; a deployment not named, 2.
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Callable
from datetime import datetime

from durable_agent.cli.common import AsyncCommand, err, network
from durable_agent.client import connect
from durable_agent.config import DEPLOYMENT_NAME_PATTERN, ConfigError, load_config
from durable_agent.core.errors import DurableAgentError
from durable_agent.deploy_routing import RoutingChange, promote, ramp, rollback
from durable_agent.deploy_state import BuildState, DeploymentState, deployment_state
from durable_agent.deployments import DEPLOYMENT_ENV, worker_deployment

_NOTES = {
    "draining": "runs are pinned to it: keep its workers",
    "drained": "no run is pinned to it: its workers may stop",
}


def deployment_name(args: argparse.Namespace) -> str:
    """The deployment the command is about: ``--deployment``, else the workers' own.

    Raises:
        ConfigError: None names one, or the name given, the variable's or the config's is not
            one Temporal takes.
    """
    if args.deployment is not None:
        if not re.match(DEPLOYMENT_NAME_PATTERN, args.deployment):
            raise ConfigError(f"--deployment {args.deployment!r} is not a deployment name Temporal takes")
        return str(args.deployment)
    found = worker_deployment(load_config())
    if found is None:
        raise ConfigError(
            f"no deployment named: give --deployment NAME, or set {DEPLOYMENT_ENV} or [worker] deployment "
            "in the config (AGENT_CONFIG)"
        )
    return found.name


def _when(moment: datetime | None) -> str:
    return moment.strftime("%Y-%m-%d %H:%M:%SZ") if moment is not None else "-"


def _status_of(state: DeploymentState, build: BuildState) -> str:
    if build.build_id == state.ramping:
        return f"ramping {state.ramp_percentage:g}%"
    return build.status


def print_state(state: DeploymentState) -> None:
    """The deployment's routing on a line, then a line a build, the newest first."""
    where = (
        f"current {state.current}"
        if state.current
        else "no current build (unversioned workers take new runs)"
    )
    if state.ramping:
        where += f", ramping {state.ramping} at {state.ramp_percentage:g}%"
    if state.propagating:
        where += " (the server is still telling the task queues of the last change)"
    print(f"deployment {state.name}: {where}")
    rows = [("BUILD", "STATUS", "RUNNING", "PINNED", "POLLERS", "CREATED", "")]
    for build in state.builds:
        rows.append(
            (
                build.build_id,
                _status_of(state, build),
                str(build.running),
                str(build.pinned),
                str(build.pollers),
                _when(build.created),
                _NOTES.get(build.status, ""),
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]) - 1)]
    for row in rows:
        cells = [cell.ljust(width) for cell, width in zip(row, widths, strict=False)]
        print("  ".join([*cells, row[-1]]).rstrip())


async def _status(args: argparse.Namespace) -> int:
    state = await deployment_state(await connect(), deployment_name(args))
    if args.json:
        print(state.model_dump_json(indent=2))
    else:
        print_state(state)
    return 0


def _propagation(change: RoutingChange) -> None:
    if not change.propagated:
        print(
            f"the server has not told every task queue yet ({change.seconds:.0f} s): runs started in the "
            "next moments may still go where they went before (deploy status says when it has)"
        )


async def _promote(args: argparse.Namespace) -> int:
    name = deployment_name(args)
    change = await promote(await connect(), name, args.build, force=args.force)
    if change.what == "none":
        print(f"build {args.build} is the current build of deployment {name} already")
        return 0
    print(f"build {args.build} is the current build of deployment {name}: new runs go to it")
    if change.previous is not None:
        print(
            f"runs pinned to build {change.previous} stay on it until they move or end: keep its workers "
            "until it is drained"
        )
    _propagation(change)
    return 0


async def _ramp(args: argparse.Namespace) -> int:
    name = deployment_name(args)
    change = await ramp(await connect(), name, args.build, args.percent, force=args.force)
    print(f"{args.percent:g}% of the new runs of deployment {name} go to build {args.build}")
    _propagation(change)
    return 0


async def _rollback(args: argparse.Namespace) -> int:
    name = deployment_name(args)
    change = await rollback(await connect(), name, force=args.force)
    if change.what == "ramp_ended":
        print(
            f"the ramp of build {change.build_id} ended: every new run of deployment {name} goes to the "
            "current build"
        )
    else:
        print(f"build {change.build_id} is the current build of deployment {name} again: new runs go to it")
    _propagation(change)
    return 0


def _deploy_command(action: str, body: AsyncCommand) -> Callable[[argparse.Namespace], int]:
    """``body`` as a command: a refusal is one line and exit code 1, a deployment not named (or
    a config that does not load) 2, and Temporal's errors as every network command has them
    (``network``)."""

    async def guarded(args: argparse.Namespace) -> int:
        try:
            return await body(args)
        except ConfigError as exc:  # a DurableAgentError too, but a usage error
            err(f"deploy {action}: {exc}")
            return 2
        except DurableAgentError as exc:  # a refusal (``deploy_routing``)
            err(f"deploy {action}: {exc}")
            return 1

    return network(guarded)


cmd_deploy_status = _deploy_command("status", _status)
cmd_deploy_promote = _deploy_command("promote", _promote)
cmd_deploy_ramp = _deploy_command("ramp", _ramp)
cmd_deploy_rollback = _deploy_command("rollback", _rollback)
