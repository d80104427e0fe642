"""What following a run's workspace costs, on a generated 10,000-file repository; run from the
repository root (about 4 minutes on 2 cores; figures in docs/costs.md):

    python bench/workspace_cost.py                      # 10,000 files
    python bench/workspace_cost.py --files 2000 --repeat 10 --restores 1

No Temporal server: it drives ``WorkspaceCopies`` (``activities/workspaces/copies.py``) and
``WorkspaceTrees`` (``activities/workspace_tree.py``) directly, on a filesystem sink, as a
worker's tool-call activity does around a call (neither reads ``activity.info()``). Each figure
is a median with its spread (p10-p90 over 10 samples or more, else min-max); the first line
gives the machine's load average at the start and the end (on a shared machine the load moves
the figures more than the code). It prints:

1. **fast path**: ``enter`` + ``leave(record=False)`` around a read-only call on a copy already
   at the run's tree (goal <= 5 ms); ``enter(changes=True)`` + ``leave(record=True)`` around a
   call that changed nothing.
2. **one-file boundary**: ``enter(changes=True)``, one file rewritten, ``leave(record=True)``:
   the record and its new objects put in the sink (goal <= 20 ms); ``ShadowRepo.record`` alone,
   each change recorded in turn the whole way too (``git ls-files`` + ``git add -A``, every
   record before one ``git status``, now the fallback: the same load on both), and both again
   with nothing changed; and where a boundary's time goes, by git command and sink call (a
   second pass, timed through subclasses of the shadow and the sink).
3. **restore on an empty machine**: after 1 and after 50 one-file boundaries on machine A, a
   fresh shadow root and an empty folder (machine B) ``enter`` with ``take_over``: its time (and
   where it goes, through the timed shadow and sink), the objects and bytes it fetched,
   against ``git clone --no-hardlinks file://`` of a git repository holding the same files
   with one commit a boundary.

Machine A's workspace is a git repository too (what section 3 clones); section 3 runs first, on
a fresh run, and sections 1 and 2 then run on machine A where it left the copy.

The repository (``generate_repository``) is seeded: nested folders like a project's, 200 B to
8 KB a file, one in twenty binary.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout

from durable_agent.activities.sinks import FilesystemExportSink
from durable_agent.activities.workspace_tree import WorkspaceTrees
from durable_agent.activities.workspaces.copies import WorkspaceCopies
from durable_agent.activities.workspaces.shadow import ShadowRepo
from durable_agent.config import WorkspaceCheckpointsConfig

SINK = "s"
FAST_GOAL_MS = 5.0
BOUNDARY_GOAL_MS = 20.0

# a plain git, as the shadow runs it: neither the user's settings nor the system's
_GIT_ENV = {
    "GIT_CONFIG_GLOBAL": os.devnull,
    "GIT_CONFIG_NOSYSTEM": "1",
    "GIT_TERMINAL_PROMPT": "0",
    "GIT_AUTHOR_NAME": "bench",
    "GIT_AUTHOR_EMAIL": "bench@example.com",
    "GIT_COMMITTER_NAME": "bench",
    "GIT_COMMITTER_EMAIL": "bench@example.com",
    "LC_ALL": "C",
}

# --- the repository ----------------------------------------------------------------------------

_TOP = ("src", "tests", "docs", "lib", "scripts", "tools", "examples", "assets", "config", "vendor")
_SYLLABLES = ("core", "api", "util", "model", "view", "net", "io", "db", "auth", "cache", "log",
              "task", "job", "web", "cli", "parse", "store", "sync", "queue", "mail", "user",
              "admin", "report", "media", "search", "graph", "batch", "test", "common", "proto")  # fmt: skip
_TEXT = (".py", ".py", ".py", ".ts", ".ts", ".md", ".json", ".yaml", ".c", ".h", ".txt", ".toml")
_BINARY = (".png", ".bin", ".woff")
_WORDS = ("def", "return", "self", "value", "import", "from", "class", "if", "else", "for", "in",
          "None", "True", "data", "result", "config", "name", "path", "items", "count", "index",
          "error", "raise", "with", "open", "async", "await", "the", "a", "of", "to", "and",
          "request", "response", "state", "update", "query", "key", "record", "buffer", "line")  # fmt: skip
MIN_SIZE, MAX_SIZE = 200, 8192
BINARY_SHARE = 0.05


def _folders(rng: random.Random, count: int) -> list[str]:
    """``count`` folders under the top ones, nested one to four deep, as a project's are."""
    out: list[str] = list(_TOP)
    while len(out) < count:
        parent = rng.choice(out)
        if parent.count("/") >= 3:
            continue
        child = f"{parent}/{rng.choice(_SYLLABLES)}{rng.choice(('', '', '_v2', 's', '_impl'))}"
        if child not in out:
            out.append(child)
    return out


def _corpus(rng: random.Random, size: int) -> str:
    """Code-like lines of seeded words: the text files are slices of it."""
    lines, total = [], 0
    while total < size:
        indent = "    " * rng.randint(0, 3)
        line = indent + " ".join(rng.choice(_WORDS) for _ in range(rng.randint(3, 12)))
        lines.append(line)
        total += len(line) + 1
    return "\n".join(lines) + "\n"


def generate_repository(root: Path, files: int = 10_000, seed: int = 1) -> list[str]:
    """Write ``files`` files under ``root``, the same ones for the same ``seed``.

    About 25 files a folder, folders nested one to four deep under ten top folders; sizes
    log-uniform from 200 B to 8 KB; one in twenty binary (random bytes), the rest text whose
    first line names its path, so no two files are the same object.

    Args:
        root: The folder to fill (made if missing).
        files: How many files.
        seed: The random generator's seed.

    Returns:
        The files' paths relative to ``root``, in the order written.
    """
    rng = random.Random(seed)
    corpus = _corpus(rng, 1 << 20)
    folders = _folders(rng, max(2 * len(_TOP), files // 25))
    paths: list[str] = []
    taken: set[str] = set()
    root.mkdir(parents=True, exist_ok=True)
    # none of the names below matches it: every file is in the tree, the restore brings them all
    (root / ".gitignore").write_text("build/\n*.log\n__pycache__/\n", encoding="utf-8")
    while len(paths) < files:
        folder = rng.choice(folders)
        binary = rng.random() < BINARY_SHARE
        suffix = rng.choice(_BINARY if binary else _TEXT)
        name = f"{folder}/{rng.choice(_SYLLABLES)}_{rng.randrange(10_000)}{suffix}"
        if name in taken:
            continue
        taken.add(name)
        size = int(MIN_SIZE * (MAX_SIZE / MIN_SIZE) ** rng.random())
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        if binary:
            path.write_bytes(rng.randbytes(size))
        else:
            head = f"# {name}\n"
            at = rng.randrange(len(corpus) - size)
            path.write_text(head + corpus[at : at + size - len(head)], encoding="utf-8")
        paths.append(name)
    return paths


def change_file(root: Path, name: str, n: int) -> None:
    """Rewrite one text file as a tool's edit would: a line added at its end.

    Args:
        root: The workspace.
        name: The file, relative to ``root``.
        n: A number making the change unique.
    """
    path = root / name
    path.write_bytes(path.read_bytes() + f"# change {n}\n".encode())


def text_files(paths: Sequence[str]) -> list[str]:
    """Those of ``paths`` a boundary may change (text files)."""
    return [p for p in paths if not p.endswith(_BINARY)]


def folder_files(root: Path) -> dict[str, str]:
    """Each file under ``root`` (``.git`` folders left out): its relative path and content's SHA-256.

    Args:
        root: The folder.

    Returns:
        Path -> digest, sorted by path.
    """
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if d != ".git"]
        for name in filenames:
            path = Path(dirpath) / name
            out[path.relative_to(root).as_posix()] = hashlib.sha256(path.read_bytes()).hexdigest()
    return dict(sorted(out.items()))


def folder_bytes(root: Path) -> int:
    """The bytes of the files under ``root``, all of them."""
    return sum(p.stat().st_size for p in root.rglob("*") if p.is_file())


def git(cwd: Path, *args: str) -> None:
    """Run a plain git (no user settings) in ``cwd``.

    Raises:
        subprocess.CalledProcessError: git failed.
    """
    subprocess.run(["git", *args], cwd=cwd, env={**os.environ, **_GIT_ENV}, check=True, capture_output=True)


# --- figures ---------------------------------------------------------------------------------


def spread(samples: Sequence[float]) -> dict[str, float | int]:
    """A median and its spread: p10 and p90 over 10 samples or more, else the least and the most.

    Args:
        samples: The measures (ms).

    Returns:
        ``median``, ``low``, ``high``, ``n``.
    """
    ordered = sorted(samples)
    if len(ordered) >= 10:
        deciles = statistics.quantiles(ordered, n=10, method="inclusive")
        low, high = deciles[0], deciles[-1]
    else:
        low, high = ordered[0], ordered[-1]
    return {"median": statistics.median(ordered), "low": low, "high": high, "n": len(ordered)}


def _ms(since: float) -> float:
    return (time.perf_counter() - since) * 1000


def _phases(
    times: Mapping[str, list[float]], count: int, whole: Sequence[float], rest: str
) -> dict[str, float]:
    """Each git command's and sink call's mean time (ms) over ``count`` operations, and ``rest``:
    the mean of ``whole`` less theirs (means both, so the parts add up to the whole)."""
    out = {key: sum(values) / count for key, values in sorted(times.items())}
    out[rest] = statistics.fmean(whole) - sum(out.values())
    return out


def _say(what: str) -> None:
    """Where the bench is, on standard error (a full run takes minutes)."""
    print(f"[{time.strftime('%H:%M:%S')}] {what}", file=sys.stderr, flush=True)


# --- the worker's objects, and timed ones ---------------------------------------------------------


@dataclass
class Machine:
    """One machine's side of a run's workspace: its shadow repositories, the sink, its copies.

    Args:
        workspace: The copy's folder on this machine.
        trees: The shadow repositories and the sink.
        copies: The copies, under this machine's host id.
        sink_root: The run's filesystem sink.
    """

    workspace: Path
    trees: WorkspaceTrees
    copies: WorkspaceCopies
    sink_root: Path


def machine(
    workspace: Path,
    shadow_root: Path,
    sink_root: Path,
    host: str,
    times: dict[str, list[float]] | None = None,
) -> Machine:
    """A machine's workspace side as a worker builds it, on the filesystem sink at ``sink_root``.

    Args:
        workspace: The copy's folder.
        shadow_root: Where this machine keeps its shadow repositories.
        sink_root: The run's filesystem sink (shared by every machine).
        host: This machine's host id.
        times: Where to add each git command's and sink call's time (ms), by name; None: the
            stock classes, untimed.

    Returns:
        The machine.
    """
    config = WorkspaceCheckpointsConfig(path=shadow_root)
    if times is None:
        trees = WorkspaceTrees(config, {SINK: FilesystemExportSink(sink_root)})
    else:
        trees = _TimedTrees(config, {SINK: _TimedSink(sink_root, times)}, times=times)
    return Machine(workspace, trees, WorkspaceCopies(trees, host), sink_root)


class _TimedShadow(ShadowRepo):
    """A shadow repository that adds each git command's time to ``times["git <command>"]``."""

    def __init__(self, *args: Any, times: dict[str, list[float]], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.times = times

    def git(self, *args: str, stdin: bytes | None = None) -> bytes:
        started = time.perf_counter()
        try:
            return super().git(*args, stdin=stdin)
        finally:
            self.times[f"git {args[0]}"].append(_ms(started))


class _TimedTrees(WorkspaceTrees):
    def __init__(self, *args: Any, times: dict[str, list[float]], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.times = times

    def repo(self, workspace: Path) -> ShadowRepo:
        c = self.config
        return _TimedShadow(
            self.root,
            workspace,
            max_file_bytes=c.max_file_bytes,
            max_total_bytes=c.max_total_bytes,
            exclude=self.exclude,
            times=self.times,
        )


class _TimedSink(FilesystemExportSink):
    """The filesystem sink, each object call's time added to ``times["sink <call>"]``."""

    def __init__(self, root: Path, times: dict[str, list[float]]) -> None:
        super().__init__(root)
        self.times = times

    async def missing_objects(self, ids: Sequence[str]) -> list[str]:
        started = time.perf_counter()
        try:
            return await super().missing_objects(ids)
        finally:
            self.times["sink missing_objects"].append(_ms(started))

    async def put_objects(self, objects: Mapping[str, bytes]) -> None:
        started = time.perf_counter()
        try:
            await super().put_objects(objects)
        finally:
            self.times["sink put_objects"].append(_ms(started))

    async def get_objects(self, ids: Sequence[str]) -> dict[str, bytes]:
        started = time.perf_counter()
        try:
            return await super().get_objects(ids)
        finally:
            self.times["sink get_objects"].append(_ms(started))


async def start_run(m: Machine) -> tuple[str, float]:
    """Record the copy as a run's base (its first tree, every object sent) and mark the copy at it.

    Returns:
        The tree, and how long the record and its sending took (ms).
    """
    started = time.perf_counter()
    state = await m.trees.record(m.workspace, SINK, strict=True)
    took = _ms(started)
    assert state is not None
    await m.copies.adopt(m.workspace, state.tree)
    return state.tree, took


async def boundary(m: Machine, tree: str, name: str, n: int) -> str:
    """One call that changes one file, as the worker runs it: ``enter``, the change, ``leave``.

    Returns:
        The run's tree after it.
    """
    held = await m.copies.enter(m.workspace, tree, SINK, host=m.copies.host, take_over=False, changes=True)
    assert held is not None
    change_file(m.workspace, name, n)
    state = await m.copies.leave(held, SINK, record=True)
    assert state is not None
    return state.tree


# --- the sections ------------------------------------------------------------------------------


async def fast_path(m: Machine, tree: str, repeat: int) -> dict[str, Any]:
    """Section 1: calls on a copy already at ``tree``, which none of them changes.

    Args:
        m: Machine A, its copy marked at ``tree``.
        tree: The run's tree.
        repeat: Read-only calls; a tenth as many that change nothing.

    Returns:
        ``read_only`` and ``unchanged`` spreads (ms).
    """
    read_only, unchanged = [], []
    for _ in range(repeat):
        started = time.perf_counter()
        held = await m.copies.enter(
            m.workspace, tree, SINK, host=m.copies.host, take_over=False, changes=False
        )
        assert held is not None and held.restored is None
        await m.copies.leave(held, SINK, record=False)
        read_only.append(_ms(started))
    for _ in range(max(1, repeat // 10)):
        started = time.perf_counter()
        held = await m.copies.enter(
            m.workspace, tree, SINK, host=m.copies.host, take_over=False, changes=True
        )
        assert held is not None and held.restored is None
        state = await m.copies.leave(held, SINK, record=True)
        unchanged.append(_ms(started))
        assert state is not None and state.tree == tree
    return {"read_only": spread(read_only), "unchanged": spread(unchanged)}


def _whole_way(repo: ShadowRepo) -> Any:
    """``repo`` recorded the whole way (``ShadowRepo._record_whole``), as ``record`` prepares it."""
    repo._init()
    repo._write_excludes()
    return repo._record_whole()


async def one_file_boundaries(
    m: Machine, timed: Machine, tree: str, names: Sequence[str], repeat: int
) -> tuple[dict[str, Any], str]:
    """Section 2: boundaries that each rewrite one file, then the record alone, then a timed pass.

    Args:
        m: Machine A, its copy marked at ``tree``.
        timed: The same copy through the timed shadow and sink (``machine(times=...)``).
        tree: The run's tree.
        names: The files the boundaries change, in turn.
        repeat: Boundaries of each kind.

    Returns:
        The figures (ms: ``boundary``, ``record`` and ``timed_boundary`` spreads; the record
        the whole way in turn with ``record`` (``record_whole``), and both again with nothing
        changed (``record_nothing``, ``record_whole_nothing``); ``phases``,
        each git command's and sink call's mean a timed boundary and the rest, adding up to
        ``timed_boundary_mean``), and the run's tree after them.
    """
    n = 0
    whole = []
    for _ in range(repeat):
        started = time.perf_counter()
        tree = await boundary(m, tree, names[n % len(names)], n)
        whole.append(_ms(started))
        n += 1
    repo = m.trees.repo(m.workspace)
    # the whole way (``_record_whole``: ``ls-files``, ``add -A``, ``write-tree``), as every record
    # was before one ``status`` and now only the fallback, on a copy of the shadow: each change
    # recorded both ways, in turn, so that the machine's load weighs on both alike
    other = ShadowRepo(m.trees.root.parent / "whole-way", m.workspace)
    shutil.copytree(repo.git_dir, other.git_dir)
    records: dict[str, list[float]] = defaultdict(list)
    for i in range(repeat):
        change_file(m.workspace, names[n % len(names)], n)
        n += 1
        for kind in ("one file", "nothing"):
            ways = [("short", repo.record), ("whole", lambda: _whole_way(other))]
            trees = set()
            for way, record in ways[:: 1 if i % 2 else -1]:
                started = time.perf_counter()
                trees.add((await asyncio.to_thread(record)).tree)
                records[f"{way} {kind}"].append(_ms(started))
            assert len(trees) == 1, "the two ways recorded different trees"
    alone = records["short one file"]
    tree = await boundary(m, tree, names[n % len(names)], n)  # the changes above go to the sink
    n += 1
    assert isinstance(timed.trees, _TimedTrees)
    times = timed.trees.times
    times.clear()
    await timed.copies.adopt(timed.workspace, tree)
    timed_whole = []
    for _ in range(repeat):
        started = time.perf_counter()
        tree = await boundary(timed, tree, names[n % len(names)], n)
        timed_whole.append(_ms(started))
        n += 1
    await m.copies.adopt(m.workspace, tree)
    phases = _phases(
        times, repeat, timed_whole, "other (threads, marks, HEAD, objects read and sent, mark_pushed)"
    )
    return {
        "boundary": spread(whole),
        "record": spread(alone),
        "record_whole": spread(records["whole one file"]),
        "record_nothing": spread(records["short nothing"]),
        "record_whole_nothing": spread(records["whole nothing"]),
        "timed_boundary": spread(timed_whole),
        "timed_boundary_mean": statistics.fmean(timed_whole),
        "phases": phases,
    }, tree


@dataclass
class Restored:
    """Section 3 at one number of boundaries: the figures, and the folders to compare.

    Attributes:
        figures: ``boundaries``, ``restore_ms``, ``objects``, ``bytes``, ``clone_ms``,
            ``clone_bytes``, ``clone_git_bytes``, ``workspace_bytes``, ``same_files`` (machine
            B's files, machine A's and the clone's are the same).
        machine_b: Machine B's restored workspace (the last of the restores).
        clone: The last ``git clone`` of machine A's workspace, made after that restore.
        tree: The run's tree restored.
    """

    figures: dict[str, Any]
    machine_b: Path
    clone: Path
    tree: str


async def restore_on_empty_machine(
    work: Path, a: Machine, tree: str, names: Sequence[str], boundaries: Sequence[int], restores: int
) -> tuple[list[Restored], str]:
    """Section 3: machine A (its workspace a git repository too, at ``tree``) runs one-file
    boundaries, committing each, up to each number of ``boundaries``; there machine B (a fresh
    shadow root, an empty folder) takes the run over ``restores`` times, and ``git clone``
    copies machine A's repository as many times.

    Args:
        work: A folder for machine B's and the clones.
        a: Machine A, its copy marked at ``tree``, nothing committed since.
        tree: The run's tree.
        names: The files the boundaries change, in turn.
        boundaries: Numbers of one-file boundaries before a restore, ascending.
        restores: Restores (and clones) to time at each.

    Returns:
        Each number's figures and folders, and the run's tree after the last boundary.
    """
    out: list[Restored] = []
    done = 0
    for k in boundaries:
        for n in range(done, k):
            name = names[n % len(names)]
            tree = await boundary(a, tree, name, n)
            git(a.workspace, "commit", "-q", "-m", f"boundary {n}", "--", name)
        done = k
        took, objects, size = [], [], []
        clone_ms: list[float] = []
        b_ws = clone = work
        times: dict[str, list[float]] = defaultdict(list)
        for i in range(restores):
            b_ws = work / f"b-{k}-{i}" / "workspace"
            b_ws.mkdir(parents=True)
            b = machine(b_ws, work / f"b-{k}-{i}" / "shadow", a.sink_root, "host-b", times=times)
            started = time.perf_counter()
            held = await b.copies.enter(b_ws, tree, SINK, host=a.copies.host, take_over=True, changes=False)
            took.append(_ms(started))
            assert held is not None and held.restored is not None
            await b.copies.leave(held, SINK, record=False)
            objects.append(held.restored.objects)
            size.append(held.restored.bytes)
            clone = work / f"clone-{k}-{i}"
            started = time.perf_counter()
            git(work, "clone", "-q", "--no-hardlinks", a.workspace.resolve().as_uri(), str(clone))
            clone_ms.append(_ms(started))
        figures = {
            "boundaries": k,
            "restore_ms": spread(took),
            "objects": statistics.median(objects),
            "bytes": statistics.median(size),
            "clone_ms": spread(clone_ms),
            "clone_bytes": folder_bytes(clone),
            "clone_git_bytes": folder_bytes(clone / ".git"),
            "workspace_bytes": folder_bytes(b_ws),
            "same_files": folder_files(b_ws) == folder_files(a.workspace) == folder_files(clone),
            "phases": _phases(times, restores, took, "other (objects checked, written to the shadow)"),
        }
        out.append(Restored(figures, b_ws, clone, tree))
    return out, tree


async def measure(
    work: Path,
    *,
    files: int = 10_000,
    repeat: int = 30,
    restores: int = 3,
    boundaries: Sequence[int] = (1, 50),
    seed: int = 1,
) -> tuple[dict[str, Any], list[Restored]]:
    """Every section, in ``work``: machine A records the run's base, section 3 runs its
    boundaries and restores, then sections 1 and 2 run on machine A where section 3 left it.

    Args:
        work: An empty folder.
        files: The repository's files.
        repeat: Boundaries timed in section 2 (of each kind); ten times as many read-only calls.
        restores: Restores (and clones) at each number of boundaries.
        boundaries: The numbers of one-file boundaries before a restore.
        seed: The repository's seed.

    Returns:
        The report (``report_lines`` prints it), and section 3's folders.
    """
    a_ws = work / "a" / "workspace"
    # the machine's load beside the figures: on a shared machine it, not the code, may move them
    load_before = os.getloadavg()[0]
    started = time.perf_counter()
    paths = generate_repository(a_ws, files, seed)
    generated_ms = _ms(started)
    texts = text_files(paths)
    names = random.Random(seed).sample(texts, min(len(texts), 500))
    # machine A's workspace is a project's git repository too: what section 3 clones
    git(a_ws, "init", "-q")
    git(a_ws, "add", "-A")
    git(a_ws, "commit", "-q", "-m", "base")
    repository = {
        "files": files,
        "bytes": folder_bytes(a_ws) - folder_bytes(a_ws / ".git"),
        "folders": sum(1 for p in a_ws.rglob("*") if p.is_dir() and ".git" not in p.parts),
    }
    a = machine(a_ws, work / "a" / "shadow", work / "a" / "sink", "host-a")
    timed = machine(a_ws, work / "a" / "shadow", work / "a" / "sink", "host-a", times=defaultdict(list))
    _say(f"{files:,} files generated; recording the run's base")
    tree, first = await start_run(a)
    _say(f"restores after {', '.join(map(str, boundaries))} boundaries")
    restored, tree = await restore_on_empty_machine(work, a, tree, names, sorted(boundaries), restores)
    os.sync()  # the restores' and clones' writes are not left to flush during the timed calls
    _say("fast path")
    fast = await fast_path(a, tree, repeat * 10)
    _say("one-file boundaries")
    changed, tree = await one_file_boundaries(a, timed, tree, names[len(names) // 2 :], repeat)
    report = {
        **repository,
        "generated_ms": generated_ms,
        "first_record_ms": first,
        "cores": os.cpu_count(),
        "load": [load_before, os.getloadavg()[0]],
        "git": subprocess.run(
            ["git", "--version"], capture_output=True, text=True, check=False
        ).stdout.strip(),
        "fast_path": fast,
        "one_file": changed,
        "restore": [r.figures for r in restored],
    }
    return report, restored


# --- the report --------------------------------------------------------------------------------


def _s(figure: Mapping[str, Any]) -> str:
    return f"{figure['median']:.1f} ms ({figure['low']:.1f}-{figure['high']:.1f}, n={figure['n']})"


def _goal(figure: Mapping[str, Any], goal: float) -> str:
    return f"goal <= {goal:g} ms: {'met' if figure['median'] <= goal else 'missed'}"


def report_lines(report: Mapping[str, Any]) -> list[str]:
    """The report as text, a figure a line (medians, spreads, goals beside them).

    Args:
        report: What ``measure`` gave.

    Returns:
        The lines.
    """
    fast, one = report["fast_path"], report["one_file"]
    lines = [
        f"repository: {report['files']:,} files, {report['folders']:,} folders, {report['bytes']:,} bytes "
        f"(generated in {report['generated_ms']:.0f} ms); {report['cores']} cores; {report['git']}; "
        f"load average {report['load'][0]:.1f} at the start, {report['load'][1]:.1f} at the end",
        f"first record (a run's start, every object sent): {report['first_record_ms']:.0f} ms",
        "1. fast path",
        f"   read-only call, copy at the tree (enter + leave):   {_s(fast['read_only'])}  "
        + _goal(fast["read_only"], FAST_GOAL_MS),
        f"   call that changed nothing (enter + leave(record)):  {_s(fast['unchanged'])}",
        "2. a boundary that changed one file",
        f"   enter + change + leave(record), objects to sink:    {_s(one['boundary'])}  "
        + _goal(one["boundary"], BOUNDARY_GOAL_MS),
        f"   ShadowRepo.record alone:                            {_s(one['record'])}",
        f"     the whole way, each change in turn with it:       {_s(one['record_whole'])}",
        f"   ShadowRepo.record, nothing changed:                 {_s(one['record_nothing'])}",
        f"     the whole way, in turn with it:                   {_s(one['record_whole_nothing'])}",
        f"   where it goes (a timed pass, {_s(one['timed_boundary'])}, "
        f"mean {one['timed_boundary_mean']:.1f} ms; mean ms a boundary):",
    ]
    lines += [f"     {name:<50} {ms:7.2f}" for name, ms in one["phases"].items()]
    lines.append("3. restore on a machine that has nothing (fresh shadow, empty folder), against git clone")
    for r in report["restore"]:
        lines.append(
            f"   after {r['boundaries']:>3} boundaries: restore {_s(r['restore_ms'])}, "
            f"{r['objects']:,} objects, {r['bytes']:,} bytes fetched; "
            f"git clone {_s(r['clone_ms'])}, {r['clone_bytes']:,} bytes ({r['clone_git_bytes']:,} in .git); "
            f"same files: {'yes' if r['same_files'] else 'NO'}"
        )
        where = ", ".join(f"{name} {ms:.0f}" for name, ms in r["phases"].items())
        lines.append(f"     where a restore goes (mean ms): {where}")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--files", type=int, default=10_000, help="the repository's files")
    parser.add_argument(
        "--repeat", type=int, default=30, help="one-file boundaries timed (x10 read-only calls)"
    )
    parser.add_argument(
        "--restores", type=int, default=3, help="restores and clones at each number of boundaries"
    )
    parser.add_argument(
        "--boundaries", type=int, nargs="+", default=[1, 50], help="boundaries before a restore"
    )
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--json", action="store_true", help="the report as one JSON line too")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="workspace-cost-") as tmp:
        report, _ = asyncio.run(
            measure(
                Path(tmp),
                files=args.files,
                repeat=args.repeat,
                restores=args.restores,
                boundaries=args.boundaries,
                seed=args.seed,
            )
        )
    print("\n".join(report_lines(report)))
    if args.json:
        print(json.dumps(report))


if __name__ == "__main__":
    main()
