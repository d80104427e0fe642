"""Whether a Docker engine answers here: the Docker tests, and the PostgreSQL fixture's last
resort (testcontainers), skip or step aside with the reason."""

from __future__ import annotations

import os


def engine_problem() -> str | None:
    """Why no Docker engine can be used here, or None when one answers a ping."""
    docker_host = os.environ.get("DOCKER_HOST") or "unset, so the default local socket"
    try:
        import docker
    except ImportError as exc:
        return (
            "no Docker engine was reachable: the `docker` Python package is not "
            f"importable ({exc}), so the engine could not be pinged"
        )
    try:
        client = docker.from_env(timeout=5)
        try:
            client.ping()
        finally:
            client.close()
    except Exception as exc:  # DockerException, connection and timeout errors alike
        return (
            "no Docker engine was reachable: docker.from_env().ping() failed "
            f"(DOCKER_HOST {docker_host}): {type(exc).__name__}: {exc}"
        )
    return None
