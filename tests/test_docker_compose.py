"""Checks for the container deployment: Dockerfile, docker-compose.yaml, deploy/.

Two kinds of test live here:

* a static check that always runs and reads the files only, so a broken
  compose file is caught on machines without Docker too;
* an end-to-end check (marked ``docker``) that builds and starts the whole
  stack with testcontainers. It is skipped, with the reason, when no Docker
  engine answers; it is never faked.
"""

from __future__ import annotations

import asyncio
import fnmatch
import json
import os
import re
import shutil
import socket
import subprocess
import tomllib
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any
from urllib.parse import urlsplit

import pytest

from tests.docker_engine import engine_problem
from tests.helpers import until

REPO_ROOT = Path(__file__).resolve().parent.parent
COMPOSE_FILE = REPO_ROOT / "docker-compose.yaml"
DOCKERFILE = REPO_ROOT / "Dockerfile"
DOCKERIGNORE = REPO_ROOT / ".dockerignore"

EXPECTED_SERVICES = {"postgresql", "temporal", "temporal-ui", "worker", "prometheus", "grafana"}
TEMPORAL_SQL_PLUGINS = {"postgres12", "postgres12_pgx"}
WORKER_SEARCH_ATTRIBUTES = ("AgentSessionId", "AgentRunStatus")

# `docker compose down --volumes` runs at teardown: a project name of its own
# keeps that from deleting the volumes of a stack the developer runs for real.
TEST_PROJECT_NAME = "durable-agent-compose-test"
PUBLISHED_PORTS = (7233, 8080, 9090, 3000)


# --------------------------------------------------------------------------
# Reading the compose file
# --------------------------------------------------------------------------


@dataclass
class Service:
    name: str
    image: str | None = None
    build_context: str | None = None
    environment: dict[str, str] = field(default_factory=dict)
    # (source, target) pairs; source is a host path or a named volume.
    volumes: list[tuple[str, str]] = field(default_factory=list)


def _import_yaml() -> Any | None:
    try:
        import yaml
    except ImportError:
        return None
    return yaml


_DEFAULTED_VARIABLE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::?-([^}]*))?\}")


def _with_defaults(value: str) -> str:
    """Compose's ``${VAR:-default}`` as it reads with nothing set in the environment."""
    return _DEFAULTED_VARIABLE.sub(lambda m: m.group(2) or "", value)


def _split_volume(spec: str) -> tuple[str, str]:
    parts = _with_defaults(spec).split(":")
    if len(parts) == 1:  # anonymous volume: only a container path
        return "", parts[0]
    return parts[0], parts[1]


def _services_from_yaml(data: dict[str, Any]) -> dict[str, Service]:
    services: dict[str, Service] = {}
    for name, spec in (data.get("services") or {}).items():
        spec = spec or {}
        build = spec.get("build")
        if isinstance(build, dict):
            build = build.get("context", ".")
        env = spec.get("environment") or {}
        if isinstance(env, list):
            env = dict(item.split("=", 1) if "=" in item else (item, "") for item in env)
        volumes = []
        for item in spec.get("volumes") or []:
            if isinstance(item, dict):
                volumes.append((_with_defaults(str(item.get("source", ""))), str(item["target"])))
            else:
                volumes.append(_split_volume(str(item)))
        services[name] = Service(
            name=name,
            image=spec.get("image"),
            build_context=None if build is None else str(build),
            environment={str(k): "" if v is None else str(v) for k, v in env.items()},
            volumes=volumes,
        )
    return services


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip(" "))


def _is_content(line: str) -> bool:
    stripped = line.strip()
    return bool(stripped) and not stripped.startswith("#")


def _sub_block(lines: list[str], key: str) -> list[str]:
    """Lines nested under ``key:`` (by indentation) within ``lines``."""
    for i, line in enumerate(lines):
        if re.fullmatch(rf"\s*{re.escape(key)}:\s*(#.*)?", line):
            level = _indent(line)
            body = []
            for nested in lines[i + 1 :]:
                if _is_content(nested) and _indent(nested) <= level:
                    break
                if _is_content(nested):
                    body.append(nested)
            return body
    return []


def _scalar(lines: list[str], key: str) -> str | None:
    for line in lines:
        match = re.fullmatch(rf"\s*{re.escape(key)}:\s*[\"']?([^\"'\s#]+)[\"']?\s*(#.*)?", line)
        if match:
            return match.group(1)
    return None


def _services_from_text(text: str) -> dict[str, Service]:
    """Shallow, indentation-based reading used only when PyYAML is missing.

    It understands the subset docker-compose.yaml is written in (block
    mappings, short volume syntax, environment as a map or a list) and no
    more; it exists so the static checks still bite without PyYAML.
    """
    lines = text.splitlines()
    blocks: dict[str, list[str]] = {}
    in_services = False
    service_indent: int | None = None
    current: str | None = None
    for line in lines:
        if not _is_content(line):
            continue
        indent = _indent(line)
        if indent == 0:
            in_services = re.fullmatch(r"services:\s*(#.*)?", line) is not None
            current = None
            continue
        if not in_services:
            continue
        if service_indent is None:
            service_indent = indent
        if indent == service_indent:
            match = re.fullmatch(r"\s*([A-Za-z0-9._-]+):\s*(#.*)?", line)
            assert match, f"cannot read service header line: {line!r}"
            current = match.group(1)
            blocks[current] = []
        elif current is not None:
            blocks[current].append(line)

    services: dict[str, Service] = {}
    for name, block in blocks.items():
        build = _scalar(block, "build")
        if build is None and _sub_block(block, "build"):
            build = _scalar(_sub_block(block, "build"), "context") or "."
        env: dict[str, str] = {}
        for line in _sub_block(block, "environment"):
            match = re.fullmatch(
                r"\s*(?:-\s*)?[\"']?([A-Za-z_][A-Za-z0-9_]*)(?:=|:\s*)[\"']?([^\"'#]*?)[\"']?\s*(#.*)?",
                line,
            )
            if match:
                env[match.group(1)] = match.group(2).strip()
        volumes = []
        for line in _sub_block(block, "volumes"):
            match = re.fullmatch(r"\s*-\s*[\"']?([^\"'\s#]+)[\"']?\s*(#.*)?", line)
            if match:
                volumes.append(_split_volume(match.group(1)))
        services[name] = Service(
            name=name,
            image=_scalar(block, "image"),
            build_context=build,
            environment=env,
            volumes=volumes,
        )
    return services


def load_compose_services(path: Path = COMPOSE_FILE) -> dict[str, Service]:
    text = path.read_text(encoding="utf-8")
    yaml = _import_yaml()
    if yaml is not None:
        return _services_from_yaml(yaml.safe_load(text) or {})
    return _services_from_text(text)


# --------------------------------------------------------------------------
# Reading the Dockerfile and .dockerignore
# --------------------------------------------------------------------------


def dockerfile_workdir(path: Path = DOCKERFILE) -> PurePosixPath:
    workdirs = re.findall(r"(?im)^\s*WORKDIR\s+(\S+)\s*$", path.read_text(encoding="utf-8"))
    assert workdirs, f"{path.name} sets no WORKDIR"
    workdir = PurePosixPath(workdirs[-1])
    assert workdir.is_absolute(), f"WORKDIR {workdir} must be absolute"
    return workdir


def dockerignore_excludes(relative: PurePosixPath, path: Path = DOCKERIGNORE) -> str | None:
    """The .dockerignore pattern that keeps ``relative`` out of the image, if any.

    Approximates Docker's matcher: a pattern matching the path or one of its
    parent directories excludes it, and a later ``!pattern`` re-includes it.
    """
    if not path.exists():
        return None
    candidates = [str(PurePosixPath(*relative.parts[: i + 1])) for i in range(len(relative.parts))]
    excluded_by: str | None = None
    for raw in path.read_text(encoding="utf-8").splitlines():
        pattern = raw.strip()
        if not pattern or pattern.startswith("#"):
            continue
        negated = pattern.startswith("!")
        body = pattern[1:] if negated else pattern
        body = body.strip("/")
        globs = [body]
        if body.startswith("**/"):
            globs.append(body[3:])
        hit = any(fnmatch.fnmatchcase(c, g) for c in candidates for g in globs)
        if hit:
            excluded_by = None if negated else pattern
    return excluded_by


def _image_path_to_repo(container_path: PurePosixPath, worker: Service, workdir: PurePosixPath) -> Path:
    """Where ``container_path`` in the worker comes from in this repository."""
    for source, target in worker.volumes:
        target_path = PurePosixPath(target)
        if container_path == target_path or target_path in container_path.parents:
            assert source.startswith((".", "/")), (
                f"{container_path} is hidden by volume {source!r} mounted at {target}: "
                "the file baked into the image would not be visible"
            )
            return (REPO_ROOT / source / container_path.relative_to(target_path)).resolve()
    assert workdir in container_path.parents, (
        f"{container_path} is neither under WORKDIR {workdir} (where the Dockerfile "
        "copies the repository) nor under a bind mount"
    )
    relative = container_path.relative_to(workdir)
    excluded_by = dockerignore_excludes(PurePosixPath(relative))
    assert excluded_by is None, f".dockerignore pattern {excluded_by!r} keeps {relative} out of the image"
    return REPO_ROOT / relative


# --------------------------------------------------------------------------
# Static checks: always run
# --------------------------------------------------------------------------


def test_compose_file_matches_repository() -> None:
    services = load_compose_services()

    missing = EXPECTED_SERVICES - services.keys()
    assert not missing, f"docker-compose.yaml lacks services {sorted(missing)}"

    worker = services["worker"]
    assert worker.build_context is not None, "worker must be built, not pulled"
    assert worker.build_context.rstrip("/") in {".", ""}, (
        f"worker builds from {worker.build_context!r}, expected the repository root '.'"
    )
    assert DOCKERFILE.exists(), "worker builds from '.', but there is no Dockerfile"

    # Every pulled image carries an explicit, non-floating tag.
    for service in services.values():
        if service.image is None:
            continue
        name, _, tag = service.image.rpartition(":")
        assert name and tag and "/" not in tag, f"{service.name}: image {service.image!r} has no tag"
        assert tag != "latest", f"{service.name}: image {service.image!r} is not pinned"

    temporal = services["temporal"]
    assert temporal.image and temporal.image.startswith("temporalio/auto-setup:"), temporal.image
    assert temporal.environment.get("DB") in TEMPORAL_SQL_PLUGINS, (
        f"temporal DB={temporal.environment.get('DB')!r}, expected one of {sorted(TEMPORAL_SQL_PLUGINS)}"
    )
    seeds = temporal.environment.get("POSTGRES_SEEDS")
    assert seeds in services, f"POSTGRES_SEEDS={seeds!r} names no service in the file"
    database_image = services[seeds].image or ""
    assert database_image.startswith("postgres:"), (
        f"POSTGRES_SEEDS points at {seeds!r}, whose image {database_image!r} is not PostgreSQL"
    )

    # the server's dynamic config: a file of the repository, mounted where the variable says
    dynamic = temporal.environment.get("DYNAMIC_CONFIG_FILE_PATH")
    assert dynamic, "temporal has no DYNAMIC_CONFIG_FILE_PATH"
    [source] = [src for src, target in temporal.volumes if target == dynamic]
    dynamic_file = REPO_ROOT / source.removeprefix("./")
    assert dynamic_file.is_file(), f"{source} is not a file of the repository"
    text = dynamic_file.read_text()
    for key in ("limit.maxIDLength", "history.transferProcessorMaxPollRPS"):
        assert f"\n{key}:" in text, f"{source} does not set {key}"

    config = worker.environment.get("AGENT_CONFIG")
    assert config, "worker has no AGENT_CONFIG"
    config_path = PurePosixPath(config)
    assert config_path.is_absolute(), f"AGENT_CONFIG={config} should be an absolute container path"
    in_repo = _image_path_to_repo(config_path, worker, dockerfile_workdir())
    assert in_repo.is_file(), (
        f"AGENT_CONFIG={config} maps to {in_repo.relative_to(REPO_ROOT)}, which does not exist"
    )


def _on_a_mount(path: PurePosixPath, worker: Service) -> bool:
    targets = [PurePosixPath(target) for _source, target in worker.volumes]
    return any(path == t or t in path.parents for t in targets)


def test_worker_config_is_self_consistent() -> None:
    from durable_agent.config import (
        ConfigError,
        FilesystemSinkConfig,
        FilesystemStoreConfig,
        PostgresSinkConfig,
        PostgresStoreConfig,
        load_config,
    )

    worker = load_compose_services()["worker"]
    workdir = dockerfile_workdir()
    config_file = _image_path_to_repo(PurePosixPath(worker.environment["AGENT_CONFIG"]), worker, workdir)

    # The worker's own loader, so the schema checked is the one enforced at start.
    try:
        config = load_config(config_file)
    except ConfigError as exc:
        pytest.fail(f"the worker would refuse {config_file.relative_to(REPO_ROOT)}: {exc}")

    def in_container(path: Path) -> PurePosixPath:
        # load_config resolved relative paths against the file's folder in
        # this checkout; the image holds that checkout at WORKDIR.
        if path.is_relative_to(REPO_ROOT):
            return workdir / path.relative_to(REPO_ROOT).as_posix()
        return PurePosixPath(path)

    assert config.default_sink is None or config.default_sink in config.sinks, (
        f"default_sink {config.default_sink!r} has no [sinks.*] table"
    )

    for name, provider in config.providers.items():
        if provider.kind == "scripted":
            script = _image_path_to_repo(in_container(provider.script), worker, workdir)
            assert script.is_file(), (
                f"providers.{name}.script maps to {script}, which is not a file in this repository"
            )

    # What the container writes to its own filesystem is lost with it, so the
    # store and the filesystem sinks must sit on a volume.
    locations = {"store": config.store.path} if isinstance(config.store, FilesystemStoreConfig) else {}
    locations.update(
        {f"sinks.{name}": s.path for name, s in config.sinks.items() if isinstance(s, FilesystemSinkConfig)}
    )
    for label, location in locations.items():
        assert _on_a_mount(in_container(location), worker), (
            f"{label} path {in_container(location)} is on no worker volume {worker.volumes}"
        )

    # A PostgreSQL store or sink reads its DSN from the variable it names: the worker must have it,
    # and the stack's database service must be what it points at.
    for label, part in [("store", config.store), *((f"sinks.{n}", s) for n, s in config.sinks.items())]:
        if isinstance(part, (PostgresStoreConfig, PostgresSinkConfig)):
            dsn = worker.environment.get(part.dsn_env)
            assert dsn, f"{label} reads ${part.dsn_env}, which the worker service does not set"
            host = urlsplit(dsn.replace("${", "").replace("}", "")).hostname
            assert host == "postgresql", (
                f"{label}: ${part.dsn_env} points at {host!r}, not the stack's database"
            )

    workspace = in_container(config.default_workspace)
    assert _on_a_mount(workspace, worker), (
        f"default_workspace {workspace} is on no worker volume {worker.volumes}"
    )
    host_workspace = _image_path_to_repo(workspace, worker, workdir)
    assert host_workspace.is_dir(), f"default_workspace maps to {host_workspace}, which is not a folder"


def _service_field(name: str, key: str) -> Any:
    """A field of one service as YAML reads it (the text reader: a JSON flow value or a block list)."""
    text = COMPOSE_FILE.read_text(encoding="utf-8")
    yaml = _import_yaml()
    if yaml is not None:
        return ((yaml.safe_load(text) or {}).get("services") or {}).get(name, {}).get(key)
    block = _sub_block(text.splitlines(), name)
    for line in block:
        match = re.fullmatch(rf"\s*{re.escape(key)}:\s*(.*?)\s*", line)
        if match and match.group(1) and not match.group(1).startswith("#"):
            return json.loads(match.group(1))
    nested = _sub_block(block, key)
    if nested and nested[0].lstrip().startswith("-"):
        return [re.sub(r"^\s*-\s*", "", line).strip().strip("\"'") for line in nested]
    return json.loads(" ".join(nested)) if nested else None


def _host_port(spec: str) -> tuple[int, int]:
    """``[ip:]host:container`` as (host port, container port)."""
    *_ip, host, container = spec.split(":")
    return int(host), int(container)


def test_codec_server_is_wired_to_the_ui_and_the_workers_keys() -> None:
    from durable_agent.cli.commands import build_parser
    from durable_agent.config import load_config, parse_config

    services = load_compose_services()
    assert "codec-server" in services, "docker-compose.yaml has no codec-server service"
    codec, worker, ui = services["codec-server"], services["worker"], services["temporal-ui"]
    assert codec.build_context == worker.build_context, "the codec server runs the worker's image"
    assert codec.environment.get("AGENT_CONFIG") == worker.environment["AGENT_CONFIG"], (
        "the codec server must read the worker's config: its [codec] keys"
    )

    command = _service_field("codec-server", "command")
    assert isinstance(command, list) and command[:2] == ["durable-agent", "codec-server"], command
    args = build_parser().parse_args(command[1:])
    [published] = _service_field("codec-server", "ports")
    host_port, container_port = _host_port(published)
    assert args.bind[1] == container_port, f"it listens on {args.bind}, but {published} is published"
    assert args.bind[0] == "0.0.0.0", "inside its container it must listen on every interface"
    # the browser calls it from the UI's page: the UI's host-published origin must be allowed
    ui_port, _ = _host_port(_service_field("temporal-ui", "ports")[0])
    assert f"http://localhost:{ui_port}" in (args.origin or []), (args.origin, ui_port)
    assert "TEMPORAL_CODEC_ENDPOINT" in ui.environment, "the UI is never told where the codec server is"
    # its value is the host's address (the browser calls it): documented in the UI's own comment
    text = COMPOSE_FILE.read_text(encoding="utf-8")
    ui_text = text[text.index("\n  temporal-ui:") : text.index("\n  worker:")]
    assert f"http://localhost:{host_port}" in ui_text, (
        "the UI's TEMPORAL_CODEC_ENDPOINT value is not documented"
    )

    # Encryption is opt-in: the shipped config has no keys, so the codec server (which
    # refuses to start without them) is behind a profile and stays down by default.
    config_file = _image_path_to_repo(
        PurePosixPath(worker.environment["AGENT_CONFIG"]), worker, dockerfile_workdir()
    )
    if not load_config(config_file).codec.enabled:
        assert _service_field("codec-server", "profiles"), "codec-server would start (and fail) without keys"

    # The commented [codec] example, uncommented, is valid and names variables both services get.
    lines = config_file.read_text(encoding="utf-8").splitlines()
    start = lines.index("# [codec]")
    example = []
    for line in lines[start:]:
        if not line.startswith("# "):
            break
        example.append(line[2:])
    codec_config = parse_config(tomllib.loads("\n".join(example)), config_file.parent).codec
    assert codec_config.enabled
    for variable in codec_config.keys.values():
        for service in (worker, codec):
            assert variable in service.environment, f"{service.name} does not get ${variable}"


DASHBOARD = REPO_ROOT / "deploy" / "grafana" / "durable-agent-dashboard.json"
PROMETHEUS_CONFIG = REPO_ROOT / "deploy" / "prometheus.yml"
GRAFANA_PROVISIONING = REPO_ROOT / "deploy" / "grafana" / "provisioning"
_METRIC_NAME = re.compile(r"\b((?:durable_agent|temporal)_[a-z0-9_]+)")


def dashboard_panels() -> list[dict[str, Any]]:
    """The dashboard's panels (rows left out)."""
    dashboard = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    return [p for p in dashboard["panels"] if p.get("type") != "row"]


def dashboard_metric_names() -> set[str]:
    """The metrics the dashboard's queries read, as the code names them (no histogram suffix)."""
    names = set()
    for panel in dashboard_panels():
        for target in panel["targets"]:
            for name in _METRIC_NAME.findall(target["expr"]):
                names.add(re.sub(r"_(bucket|sum|count)$", "", name))
    return names


def test_the_dashboard_reads_the_metrics_the_code_defines() -> None:
    from durable_agent.core.metrics import METRICS

    dashboard = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert (
        variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    )
    panels = dashboard_panels()
    assert len({p["id"] for p in dashboard["panels"]}) == len(dashboard["panels"]), "panel ids repeat"
    for panel in panels:
        assert panel["datasource"]["uid"] == "${datasource}", f"{panel['title']}: not on the variable"
        assert panel["targets"] and all(t["expr"].strip() for t in panel["targets"]), panel["title"]
    ours = {n for n in dashboard_metric_names() if n.startswith("durable_agent_")}
    defined = {m.name for m in METRICS}
    assert ours <= defined, f"the dashboard reads metrics the code does not record: {sorted(ours - defined)}"
    assert ours == defined, f"metrics no panel shows: {sorted(defined - ours)}"
    # the SDK's names are checked against a real worker's endpoint in tests/test_telemetry.py
    assert {"temporal_workflow_task_execution_latency", "temporal_activity_execution_failed"} <= (
        dashboard_metric_names()
    )


def _prometheus_dns_targets(text: str) -> list[tuple[str, int]]:
    """The (name, port) pairs the scrape configs' ``dns_sd_configs`` look up."""
    yaml = _import_yaml()
    if yaml is not None:
        data = yaml.safe_load(text) or {}
        return [
            (name, int(sd["port"]))
            for job in data.get("scrape_configs") or []
            for sd in job.get("dns_sd_configs") or []
            for name in sd.get("names") or []
        ]
    names = re.findall(r"names:\s*\[([^\]]*)\]", text)
    ports = re.findall(r"^\s*port:\s*(\d+)", text, re.MULTILINE)
    assert len(names) == len(ports), "the text reader expects names: [...] and a port in each dns_sd_config"
    return [
        (n.strip().strip("\"'"), int(port))
        for listed, port in zip(names, ports, strict=True)
        for n in listed.split(",")
    ]


def test_prometheus_scrapes_every_worker_replica_and_grafana_shows_the_dashboard() -> None:
    from durable_agent.config import load_config

    services = load_compose_services()
    worker = services["worker"]
    config_file = _image_path_to_repo(
        PurePosixPath(worker.environment["AGENT_CONFIG"]), worker, dockerfile_workdir()
    )
    bind = load_config(config_file).metrics.bind
    assert bind is not None, "the worker's config has no [metrics] bind: nothing to scrape"
    host, _, port = bind.rpartition(":")
    assert host in ("0.0.0.0", ""), (
        f"[metrics] bind = {bind!r} is not reachable from the Prometheus container"
    )
    # DNS discovery of the service name: compose answers it with every replica's address
    assert ("worker", int(port)) in _prometheus_dns_targets(PROMETHEUS_CONFIG.read_text(encoding="utf-8"))

    prometheus = services["prometheus"]
    mounted = dict((source, target) for source, target in prometheus.volumes)
    target = mounted.get("./deploy/prometheus.yml")
    assert target, f"prometheus does not mount deploy/prometheus.yml: {prometheus.volumes}"
    assert f"--config.file={target}" in _service_field("prometheus", "command")

    grafana = services["grafana"]
    mounted = dict((source, target) for source, target in grafana.volumes)
    assert mounted.get("./deploy/grafana/provisioning") == "/etc/grafana/provisioning", grafana.volumes
    dashboard_at = PurePosixPath(mounted["./deploy/grafana/durable-agent-dashboard.json"])
    providers = (GRAFANA_PROVISIONING / "dashboards" / "durable-agent.yml").read_text(encoding="utf-8")
    [folder] = re.findall(r"^\s*path:\s*(\S+)", providers, re.MULTILINE)
    assert dashboard_at.parent == PurePosixPath(folder), (
        f"the dashboard is at {dashboard_at}, not in {folder}"
    )
    datasources = (GRAFANA_PROVISIONING / "datasources" / "prometheus.yml").read_text(encoding="utf-8")
    [url] = re.findall(r"^\s*url:\s*(\S+)", datasources, re.MULTILINE)
    assert urlsplit(url).hostname == "prometheus" and urlsplit(url).port == 9090, url


# --------------------------------------------------------------------------
# End to end: only where a Docker engine answers
# --------------------------------------------------------------------------


def docker_unavailable_reason() -> str | None:
    """Why the stack cannot be started here, or None when it can."""
    problem = engine_problem()
    if problem is not None:
        return problem
    # testcontainers' DockerCompose shells out to the Compose v2 CLI plugin.
    if shutil.which("docker") is None:
        return "a Docker engine answered, but there is no `docker` CLI on PATH for `docker compose`"
    try:
        probe = subprocess.run(["docker", "compose", "version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"a Docker engine answered, but `docker compose version` could not run: {exc}"
    if probe.returncode != 0:
        return (
            "a Docker engine answered, but the Compose v2 plugin is missing: "
            f"`docker compose version` exited {probe.returncode}: {probe.stderr.strip()}"
        )
    return None


def _engine_is_local() -> bool:
    host = os.environ.get("DOCKER_HOST", "")
    return not host or host.startswith(("unix://", "npipe://"))


def _port_is_taken(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.settimeout(1)
        return probe.connect_ex(("127.0.0.1", port)) == 0


def _published_address(compose: Any, service: str, port: int) -> tuple[str, int]:
    host, published = compose.get_service_host_and_port(service, port)
    if host in (None, "", "0.0.0.0", "::"):
        host = "localhost"
    assert published, f"{service} does not publish port {port}"
    return host, int(published)


async def _check_temporal(address: str, namespace: str, task_queue: str) -> None:
    from temporalio.api.enums.v1 import IndexedValueType, TaskQueueType
    from temporalio.api.operatorservice.v1 import ListSearchAttributesRequest
    from temporalio.api.taskqueue.v1 import TaskQueue
    from temporalio.api.workflowservice.v1 import DescribeTaskQueueRequest
    from temporalio.client import Client

    client = await Client.connect(address, namespace=namespace)
    assert await client.service_client.check_health(), f"Temporal at {address} is not SERVING"
    # Listing exercises the namespace and the PostgreSQL visibility store.
    async for _ in client.list_workflows(page_size=1):
        break

    # The worker polls its task queue and registers its search attributes at
    # start; wait for both rather than trusting that its container is up.
    pollers: list[Any] = []
    attributes: dict[str, int] = {}

    async def worker_ready() -> bool:
        described = await client.workflow_service.describe_task_queue(
            DescribeTaskQueueRequest(
                namespace=namespace,
                task_queue=TaskQueue(name=task_queue),
                task_queue_type=TaskQueueType.TASK_QUEUE_TYPE_WORKFLOW,
            )
        )
        pollers[:] = described.pollers
        listed = await client.operator_service.list_search_attributes(
            ListSearchAttributesRequest(namespace=namespace)
        )
        attributes.clear()
        attributes.update(listed.custom_attributes)
        return bool(pollers) and all(name in attributes for name in WORKER_SEARCH_ATTRIBUTES)

    await until(
        lambda: (
            f"a worker to poll task queue {task_queue!r} in namespace {namespace!r} and register its "
            f"search attributes (pollers: {len(pollers)}, attributes: {sorted(attributes)})"
        ),
        worker_ready,
        120,
        interval=2,
    )
    for name in WORKER_SEARCH_ATTRIBUTES:
        assert attributes.get(name) == IndexedValueType.INDEXED_VALUE_TYPE_KEYWORD, (
            f"search attribute {name} missing or not Keyword: {attributes.get(name)!r}"
        )


def _wait_for_http_200(url: str, timeout_s: float = 60) -> None:
    last: list[object] = [None]

    def answers() -> bool:
        try:
            with urllib.request.urlopen(url, timeout=5) as response:
                status: int = response.status
                last[0] = f"HTTP {status}"
                return status == 200
        except (urllib.error.URLError, OSError) as exc:
            last[0] = exc
            return False

    asyncio.run(until(lambda: f"{url} to answer HTTP 200 (last: {last[0]})", answers, timeout_s, interval=1))


@pytest.mark.docker
# Building the image and pulling three others can outlast the suite's default timeout.
@pytest.mark.timeout(1800)
def test_compose_stack_comes_up(monkeypatch: pytest.MonkeyPatch) -> None:
    reason = docker_unavailable_reason()
    if reason is not None:
        pytest.skip(reason)

    from testcontainers.compose import DockerCompose

    if _engine_is_local():
        taken = [port for port in PUBLISHED_PORTS if _port_is_taken(port)]
        if taken:
            pytest.fail(
                f"host port(s) {taken} already in use; the stack publishes fixed ports "
                f"{list(PUBLISHED_PORTS)}, so stop whatever holds them first"
            )

    worker_env = load_compose_services()["worker"].environment
    namespace = worker_env["TEMPORAL_NAMESPACE"]
    task_queue = worker_env["AGENT_TASK_QUEUE"]

    monkeypatch.setenv("COMPOSE_PROJECT_NAME", TEST_PROJECT_NAME)
    # wait=True runs `up --wait`: it returns once every service with a
    # healthcheck is healthy (temporal, postgresql) and the rest are running.
    compose = DockerCompose(
        context=str(REPO_ROOT),
        compose_file_name=COMPOSE_FILE.name,
        build=True,
        wait=True,
    )
    with compose:
        try:
            host, port = _published_address(compose, "temporal", 7233)
            asyncio.run(_check_temporal(f"{host}:{port}", namespace, task_queue))

            ui_host, ui_port = _published_address(compose, "temporal-ui", 8080)
            _wait_for_http_200(f"http://{ui_host}:{ui_port}/")

            grafana_host, grafana_port = _published_address(compose, "grafana", 3000)
            _wait_for_http_200(f"http://{grafana_host}:{grafana_port}/api/health")
            prometheus_host, prometheus_port = _published_address(compose, "prometheus", 9090)
            _check_scraped_workers(f"http://{prometheus_host}:{prometheus_port}", 2)

            workers = [c for c in compose.get_containers() if c.Service == "worker"]
            assert len(workers) == 2, f"{len(workers)} worker containers, expected the 2 replicas"
            import docker

            client = docker.from_env(timeout=10)
            try:
                for worker in workers:
                    assert worker.State == "running", f"worker container is {worker.State}"
                    restarts = client.containers.get(worker.ID).attrs["RestartCount"]
                    assert restarts == 0, f"worker container restarted {restarts} time(s)"
            finally:
                client.close()
        except BaseException:
            stdout, stderr = compose.get_logs()
            print(f"--- docker compose logs (last 200 lines) ---\n{_tail(stdout + stderr, 200)}")
            raise


def _check_scraped_workers(prometheus: str, replicas: int) -> None:
    """Prometheus finds every worker replica and scrapes it: the targets are up."""
    seen: list[object] = [None]

    def up() -> bool:
        try:
            with urllib.request.urlopen(f"{prometheus}/api/v1/targets?state=active", timeout=5) as response:
                targets = json.load(response)["data"]["activeTargets"]
        except (urllib.error.URLError, OSError, KeyError, ValueError) as exc:
            seen[0] = exc
            return False
        workers = [t for t in targets if t["labels"].get("job") == "durable-agent-worker"]
        seen[0] = [(t["scrapeUrl"], t["health"]) for t in workers]
        return len(workers) == replicas and all(t["health"] == "up" for t in workers)

    asyncio.run(
        until(lambda: f"{replicas} worker targets up in Prometheus (seen: {seen[0]})", up, 120, interval=2)
    )


def _tail(text: str, lines: int) -> str:
    return "\n".join(text.splitlines()[-lines:])
