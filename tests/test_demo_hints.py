"""``durable-agent demo --exit`` on a machine with no server: the hints it prints work as printed,
from a shell whose PATH lacks the venv (the README's `.venv/bin/durable-agent demo`)."""

from __future__ import annotations

import os
import re
import shlex
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from durable_agent.devserver import is_reachable, stop_dev_server


def free_port_pair() -> int:
    """A port whose neighbour 1000 above (the dev server's UI) is free too."""
    for _ in range(50):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
        if port + 1000 < 65536 and not is_reachable(f"127.0.0.1:{port + 1000}", timeout=0.1):
            return port
    raise AssertionError("no free port pair")


def shell_env(port: int) -> dict[str, str]:
    """A fresh shell's environment: the venv's bin folder not on PATH, the server's address set."""
    venv_bin = str(Path(sys.executable).parent)
    path = os.pathsep.join(p for p in os.environ.get("PATH", "").split(os.pathsep) if p != venv_bin)
    env = {k: v for k, v in os.environ.items() if k not in ("AGENT_CONFIG", "AGENT_TASK_QUEUE")}
    return {**env, "PATH": path, "TEMPORAL_ADDRESS": f"127.0.0.1:{port}", "PYTHONIOENCODING": "utf-8"}


def hinted(out: str, pattern: str) -> list[str]:
    found = re.search(pattern, out)
    assert found is not None, f"no hint matching {pattern!r} in:\n{out}"
    return shlex.split(found.group(1))


def with_env(words: list[str], env: dict[str, str]) -> tuple[list[str], dict[str, str]]:
    """``NAME=value command …`` as a shell runs it."""
    env = dict(env)
    while words and re.fullmatch(r"[A-Z_][A-Z0-9_]*=.*", words[0]):
        name, _, value = words.pop(0).partition("=")
        env[name] = value
    return words, env


@pytest.fixture
def processes() -> Iterator[list[subprocess.Popen[bytes]]]:
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for proc in started:
        stop_dev_server(proc)


@pytest.mark.timeout(240)
def test_the_hints_after_demo_exit_work_as_printed(
    tmp_path: Path, processes: list[subprocess.Popen[bytes]]
) -> None:
    port = free_port_pair()
    env = shell_env(port)
    demo = subprocess.run(
        [str(Path(sys.executable).parent / "durable-agent"), "demo", "--exit"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=150,
    )
    assert demo.returncode == 0, demo.stdout + demo.stderr
    out = demo.stdout
    assert "starting the Temporal dev server" in out
    assert not is_reachable(f"127.0.0.1:{port}")  # --exit stopped it

    # 1. the dev server, from its history file, as printed (the temporal binary by its path)
    server = hinted(out, r"`([^`]*server start-dev[^`]*)` brings the UI back")
    assert Path(server[0]).is_file(), server
    processes.append(
        subprocess.Popen(server, cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    )
    deadline = time.monotonic() + 30
    while not is_reachable(f"127.0.0.1:{port}", timeout=0.3):
        assert time.monotonic() < deadline, "the printed start-dev command did not start the server"
        time.sleep(0.2)

    # 2. a worker on the demo's task queue, as printed
    words, worker_env = with_env(hinted(out, r"`([^`]*worker)`\.\)"), env)
    assert worker_env.get("AGENT_TASK_QUEUE") == "agent-demo"
    processes.append(
        subprocess.Popen(
            words, cwd=tmp_path, env=worker_env, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT
        )
    )

    # 3. the status command, as printed, answers with the run's final record
    status = hinted(out, r"commands: (.*status \S+)\n")
    deadline = time.monotonic() + 60
    while True:
        done = subprocess.run(status, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
        if done.returncode == 0 or time.monotonic() > deadline:
            break
        time.sleep(0.5)  # the worker is starting
    assert done.returncode == 0, done.stdout + done.stderr
    assert re.search(r"^status:\s+completed$", done.stdout, re.MULTILINE), done.stdout

    # 4. and `temporal workflow show`, as printed
    show = hinted(out, r"\n\s+(\S*temporal workflow show -w \S+)\n")
    shown = subprocess.run(show, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    assert shown.returncode == 0, shown.stdout + shown.stderr
