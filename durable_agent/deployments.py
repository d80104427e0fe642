"""Worker versioning: the Worker Deployment and build a worker runs as (docs/production.md, Deploys).

A worker with a deployment name polls as one build (a ``WorkerDeploymentVersion``) of that
deployment: every run it starts is pinned to its build (``VersioningBehavior.PINNED``, the
worker's default) and replays on that build's workers only, so a deploy never hands a run in
flight to code that would replay it differently. New runs go to the deployment's current build,
which ``durable-agent deploy promote`` sets. Without a deployment name the worker is
unversioned, as before: every worker takes every run, and a change to what the workflow does
needs a ``workflow.patched()`` id (``workflows/patches.py``).

The name and the build come from ``[worker] deployment`` and ``build_id`` in the config, which
``AGENT_DEPLOYMENT`` and ``AGENT_BUILD_ID`` override. A build id left unset is
``default_build_id()``: the package's version and a digest of its source.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import os
import re
from collections.abc import Mapping
from pathlib import Path

from pydantic import BaseModel, ConfigDict
from temporalio.common import VersioningBehavior, WorkerDeploymentVersion
from temporalio.worker import WorkerDeploymentConfig

from durable_agent.config import (
    BUILD_ID_PATTERN,
    DEPLOYMENT_NAME_PATTERN,
    AgentConfig,
    ConfigError,
    WorkerConfig,
)

__all__ = [
    "BUILD_ID_ENV",
    "DEPLOYMENT_ENV",
    "Deployment",
    "default_build_id",
    "deployment_config",
    "source_digest",
    "worker_deployment",
]

DEPLOYMENT_ENV = "AGENT_DEPLOYMENT"
BUILD_ID_ENV = "AGENT_BUILD_ID"

# The package's folder; its ``workflows``, ``activities`` and ``worker.py`` are links to the
# repository's top-level copies, which the walk follows (``docs/architecture.md``).
_PACKAGE = Path(__file__).resolve().parent
_DIGEST_CHARS = 12  # 48 bits: two builds of one deployment never meet by chance


class Deployment(BaseModel):
    """The Worker Deployment a worker belongs to, and its build there.

    Attributes:
        name: The deployment's name (``[worker] deployment``, ``AGENT_DEPLOYMENT``).
        build_id: The worker's build (``[worker] build_id``, ``AGENT_BUILD_ID``, else
            ``default_build_id()``).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    build_id: str

    @property
    def version(self) -> WorkerDeploymentVersion:
        """The SDK's ``WorkerDeploymentVersion`` of this build."""
        return WorkerDeploymentVersion(deployment_name=self.name, build_id=self.build_id)

    @property
    def search_value(self) -> str:
        """How visibility's ``TemporalWorkerDeploymentVersion`` writes this build: ``name:build``."""
        return f"{self.name}:{self.build_id}"


@functools.cache
def source_digest() -> str:
    """A SHA-256 of the package's Python source: every ``.py`` file under ``durable_agent/``
    (through its links to ``workflows/``, ``activities/`` and ``worker.py``), by path and content.

    Returns:
        The digest as hex; the same in every process of the same code (it reads files, not
        bytecode or timestamps), another when any file changes. Cached for the process.
    """
    digest = hashlib.sha256()
    files: list[Path] = []
    for dirpath, dirnames, filenames in os.walk(_PACKAGE, followlinks=True):
        dirnames[:] = [d for d in dirnames if d != "__pycache__" and not d.startswith(".")]
        files.extend(Path(dirpath) / name for name in filenames if name.endswith(".py"))
    for path in sorted(files, key=lambda p: p.relative_to(_PACKAGE).as_posix()):
        relative = path.relative_to(_PACKAGE).as_posix().encode()
        content = path.read_bytes()
        # lengths first: no two trees of files hash the same bytes
        digest.update(b"%d:%s%d:" % (len(relative), relative, len(content)))
        digest.update(content)
    return digest.hexdigest()


def default_build_id() -> str:
    """The build id of a worker whose config and environment name none.

    The source's digest rather than a git commit: a checkout with edits not committed would
    share its commit's id while its code differs (the replays pinning exists to prevent), and
    an installed wheel has no ``.git`` at all. It covers durable-agent's own code only: set
    ``build_id`` to your release's id where workflows or activities of your own (the plugin),
    or dependencies' versions, change between deploys.

    Returns:
        ``<package version>-<first 12 hex of source_digest()>``, ``0.1.0-3f2a9c1b7d4e``.
    """
    try:
        version = importlib.metadata.version("durable-agent")
    except importlib.metadata.PackageNotFoundError:  # run from a checkout never installed
        version = "0"
    return f"{version}-{source_digest()[:_DIGEST_CHARS]}"


def _checked(value: str, pattern: str, what: str) -> str:
    if not re.match(pattern, value):
        raise ConfigError(
            f"{what} {value!r} is not a valid name: a letter or digit first, then no spaces, quotes,"
            + (" backslashes, '.' or ':'" if pattern == DEPLOYMENT_NAME_PATTERN else " or backslashes")
            + "; 255 characters at most"
        )
    return value


def worker_deployment(
    config: AgentConfig | WorkerConfig, environ: Mapping[str, str] | None = None
) -> Deployment | None:
    """The deployment and build a worker of ``config`` runs as.

    Args:
        config: The agent config, or its ``[worker]`` table.
        environ: The environment (default ``os.environ``): ``AGENT_DEPLOYMENT`` and
            ``AGENT_BUILD_ID``, when set and not empty, override the config's.

    Returns:
        The deployment and build; None when neither names a deployment (an unversioned worker).

    Raises:
        ConfigError: A variable holds a name Temporal would refuse (the config's are checked
            when it loads).
    """
    worker = config.worker if isinstance(config, AgentConfig) else config
    env = os.environ if environ is None else environ
    name = env.get(DEPLOYMENT_ENV) or worker.deployment
    if not name:
        return None
    build = env.get(BUILD_ID_ENV) or worker.build_id or default_build_id()
    return Deployment(
        name=_checked(name, DEPLOYMENT_NAME_PATTERN, DEPLOYMENT_ENV),
        build_id=_checked(build, BUILD_ID_PATTERN, BUILD_ID_ENV),
    )


def deployment_config(
    config: AgentConfig | WorkerConfig, environ: Mapping[str, str] | None = None
) -> WorkerDeploymentConfig | None:
    """The ``Worker(deployment_config=...)`` of a worker of ``config``.

    Args:
        config: The agent config, or its ``[worker]`` table.
        environ: The environment (default ``os.environ``), as ``worker_deployment`` reads it.

    Returns:
        Worker versioning on, as the deployment's build, with ``PINNED`` the default behavior of
            the workflows it registers; None for an unversioned worker (no deployment named).

    Raises:
        ConfigError: As ``worker_deployment``.
    """
    deployment = worker_deployment(config, environ)
    if deployment is None:
        return None
    return WorkerDeploymentConfig(
        version=deployment.version,
        use_worker_versioning=True,
        # a run replays only on the build that started it; it moves at a continue-as-new
        default_versioning_behavior=VersioningBehavior.PINNED,
    )
