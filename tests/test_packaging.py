"""The wheel claims one top-level name, so a user's own ``workflows``/``activities``/``worker`` win.

The repository keeps ``workflows/``, ``activities/`` and ``worker.py`` at its top level;
``durable_agent/`` links to them, and the wheel must hold them as real files under
``durable_agent/`` and nothing else at its top.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import stat
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
# What a build reads: the package (with its links) and what they point at.
SOURCES = ("pyproject.toml", "README.md", "durable_agent", "workflows", "activities", "worker.py")
LINKED = {
    "durable_agent/workflows/agent_run.py": "workflows/agent_run.py",
    "durable_agent/activities/agent.py": "activities/agent.py",
    "durable_agent/worker.py": "worker.py",
}
SHADOWABLE = ("workflows", "activities", "worker")


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in {"PYTHONPATH", "AGENT_CONFIG"}}
    env.update(PIP_DISABLE_PIP_VERSION_CHECK="1", PYTHONDONTWRITEBYTECODE="1", **extra)
    return env


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel ``pip wheel .`` builds, from a copy of the sources (no ``build/`` left in the repo)."""
    root = tmp_path_factory.mktemp("wheel")
    source = root / "src"
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info", ".agent")
    source.mkdir()
    for name in SOURCES:
        path = REPO / name
        if path.is_dir() and not path.is_symlink():
            shutil.copytree(path, source / name, symlinks=True, ignore=ignore)
        else:
            shutil.copy2(path, source / name, follow_symlinks=False)
    out = root / "dist"
    command = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet", "-w", str(out), str(source)]
    # Offline-safe when this interpreter's setuptools builds wheels itself; else pip's isolated build.
    if importlib.util.find_spec("setuptools.command.bdist_wheel") is not None:
        command.insert(4, "--no-build-isolation")
    done = subprocess.run(command, cwd=root, env=_env(), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, f"pip wheel failed:\n{done.stdout}\n{done.stderr}"
    wheels = sorted(out.glob("durable_agent-*.whl"))
    assert len(wheels) == 1, wheels
    return wheels[0]


@pytest.fixture(scope="module")
def unpacked(wheel: Path) -> Path:
    site = wheel.parent.parent / "site"
    with zipfile.ZipFile(wheel) as archive:
        archive.extractall(site)
    return site


def test_wheel_claims_only_durable_agent(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        tops = {name.split("/")[0] for name in names}
        dist_info = {t for t in tops if t.endswith(".dist-info")}
        assert len(dist_info) == 1, tops
        assert tops - dist_info == {"durable_agent"}, f"the wheel's top-level entries: {sorted(tops)}"
        (info,) = dist_info
        if f"{info}/top_level.txt" in names:
            declared = archive.read(f"{info}/top_level.txt").decode().split()
            assert declared == ["durable_agent"], declared
        # The RECORD lists what an installer writes: nothing outside the package and its metadata.
        record = archive.read(f"{info}/RECORD").decode().splitlines()
        outside = [line for line in record if line.split("/")[0] not in {"durable_agent", info}]
        assert not outside, outside


def test_wheel_holds_the_linked_code_as_real_files(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as archive:
        for inside, original in LINKED.items():
            info = archive.getinfo(inside)
            mode = info.external_attr >> 16
            assert not stat.S_ISLNK(mode), f"{inside} is a symlink in the wheel"
            assert archive.read(inside) == (REPO / original).read_bytes(), f"{inside} differs from {original}"
        packages = {n for n in archive.namelist() if n.endswith("/__init__.py")}
        for package in (
            "workflows",
            "activities",
            "activities/providers",
            "activities/tools",
            "activities/store",
        ):
            assert f"durable_agent/{package}/__init__.py" in packages, f"durable_agent/{package} is missing"


USER_MODULES = {
    "workflows/__init__.py": 'MARKER = "user workflows"\n',
    "activities/__init__.py": 'MARKER = "user activities"\n',
    "worker.py": 'MARKER = "user worker"\n',
}

CHECK_NO_SHADOWING = """
import sys
from pathlib import Path

site, user = Path(sys.argv[1]), Path(sys.argv[2])

# The package first: importing it all must not claim the top-level names.
import durable_agent
from durable_agent.workflows import AgentRun
from durable_agent.activities import AgentActivities
from durable_agent.worker import build_worker
import durable_agent.cli.commands

assert Path(durable_agent.__file__).is_relative_to(site), durable_agent.__file__
claimed = sorted(name for name in ("workflows", "activities", "worker") if name in sys.modules)
assert not claimed, f"importing durable_agent imported top-level {claimed}"

import activities
import worker
import workflows

assert workflows.MARKER == "user workflows", workflows.__file__
assert activities.MARKER == "user activities", activities.__file__
assert worker.MARKER == "user worker", worker.__file__
for module in (workflows, activities, worker):
    assert Path(module.__file__).is_relative_to(user), module.__file__
assert AgentRun.__module__.startswith("durable_agent.workflows"), AgentRun.__module__
assert AgentActivities.__module__.startswith("durable_agent.activities"), AgentActivities.__module__
assert callable(build_worker)
print("ok")
"""


def test_a_users_own_workflows_activities_and_worker_are_not_shadowed(unpacked: Path, tmp_path: Path) -> None:
    user = tmp_path / "project"
    for name, text in USER_MODULES.items():
        (user / name).parent.mkdir(parents=True, exist_ok=True)
        (user / name).write_text(text)
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(CHECK_NO_SHADOWING), str(unpacked), str(user)],
        cwd=tmp_path,
        env=_env(PYTHONPATH=os.pathsep.join([str(user), str(unpacked)])),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stdout + done.stderr


def test_the_installed_worker_runs_as_a_module(unpacked: Path, tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "durable_agent.worker", "--help"],
        cwd=tmp_path,
        env=_env(PYTHONPATH=str(unpacked)),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "run an agent worker" in done.stdout


@pytest.mark.parametrize("command", [["worker.py"], ["-m", "durable_agent.worker"]], ids=["script", "module"])
def test_the_repository_worker_still_starts(command: list[str]) -> None:
    """``python worker.py`` from the repository root, as the README and the Dockerfile run it."""
    done = subprocess.run(
        [sys.executable, *command, "--help"],
        cwd=REPO,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "usage:" in done.stdout and "AGENT_TASK_QUEUE" in done.stdout
