"""The scripted reader set-up ``bench/step_cost.py`` and its takeover worker processes share.

One folder, ``base``, holds what a worker needs: ``workspace/data.txt`` (the
file every tool step reads), ``script.json`` (the scripted provider's entry;
``ReaderModel`` answers in its place), the session store (``store``) and the
filesystem export sink (``exports``). The model has no context window (the
``--window 0`` of ``bench/boundary_cost.py``), so neither design is refused
by it and ours does not compact.
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

from bench.tokens import ReaderModel
from durable_agent.activities import AgentActivities
from durable_agent.config import AgentConfig, FilesystemSinkConfig, parse_config

SINK = "local"
WORDS = ("request", "response", "cache", "miss", "retry", "timeout", "worker", "queue", "payload",
         "export", "event", "model", "tool", "turn")  # fmt: skip
LEVELS = ("DEBUG", "INFO", "INFO", "INFO", "WARN", "ERROR")


def make_file(path: Path, size: int) -> None:
    """Log-like numbered lines of varied text, ``size`` bytes (every bench's tool output)."""
    rng = random.Random(size)
    lines: list[str] = []
    total = 0
    while total < size:
        words = " ".join(rng.choices(WORDS, k=rng.randint(3, 14)))
        origin = f"{rng.choice(LEVELS):<5} svc.{rng.choice(WORDS)}"
        line = f"{len(lines) + 1:05d} {origin}: {words} #{rng.randint(0, 99999)}\n"
        lines.append(line)
        total += len(line)
    path.write_text("".join(lines)[: size - 1] + "\n")


def add_workload_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of the reader workload that ``boundary_cost`` and ``step_cost`` both measure:
    the run lengths (``--boundaries``), the file read (``--file-bytes``), and how far the naive
    design goes (``--naive-max``)."""
    parser.add_argument("--boundaries", type=int, nargs="+", default=[10, 50, 200, 1000], metavar="N")
    parser.add_argument("--file-bytes", type=int, default=20_000, help="size of the file each read returns")
    parser.add_argument("--naive-max", type=int, default=200, help="run the naive design only up to this N")


def workspace_of(base: Path) -> Path:
    return base / "workspace"


def prepare(base: Path, file_bytes: int) -> None:
    """Write the workspace's ``data.txt`` and the script under ``base``."""
    workspace_of(base).mkdir(parents=True, exist_ok=True)
    make_file(workspace_of(base) / "data.txt", file_bytes)
    script = {"responses": [{"text": "unused: ReaderModel answers"}]}
    (base / "script.json").write_text(json.dumps(script))


def reader_config(base: Path) -> AgentConfig:
    """The worker's config: the reader provider, the store and the filesystem sink under ``base``."""
    return parse_config(
        {
            "default_model": "reader/n1",
            "default_workspace": str(workspace_of(base)),
            "providers": {"reader": {"kind": "scripted", "script": str(base / "script.json")}},
            "store": {"path": str(base / "store")},
            "default_sink": SINK,
            "sinks": {SINK: {"kind": "filesystem", "path": str(base / "exports")}},
            "permissions": {"allow": ["read(*)"], "default": "deny"},
        },
        base,
    )


def sink_root(config: AgentConfig) -> Path:
    """Where the filesystem sink of ``reader_config`` writes."""
    sink = config.sinks[SINK]
    assert isinstance(sink, FilesystemSinkConfig)
    return sink.path


def reader_activities(config: AgentConfig) -> tuple[AgentActivities, ReaderModel]:
    """The agent's activities with ``ReaderModel`` as the ``reader`` provider; the sinks from the config."""
    model = ReaderModel(None, max_tokens=4096)
    return AgentActivities(config, providers={"reader": model}), model
