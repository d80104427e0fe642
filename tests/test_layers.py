"""The package's layers, enforced by reading every import statement.

Every ``.py`` under ``durable_agent/`` (through the ``workflows``, ``activities`` and
``worker.py`` links) is parsed with ``ast``; every import counts: module level, inside a
function, under ``if TYPE_CHECKING:``. ``from pkg import name`` means ``pkg.name`` when
that is a module of the package. The layers, bottom up:

- ``durable_agent.core``: pure (no I/O, no Temporal): the contracts the workflow replays.
- ``durable_agent.workflows``: core + temporalio + pydantic + stdlib without I/O.
- ``durable_agent.config``: core + pydantic + stdlib.
- ``durable_agent.codec``: core + config + temporalio + cryptography + stdlib.
- ``durable_agent.telemetry``, ``durable_agent.telemetry_spans``: core + config + temporalio +
  OpenTelemetry + stdlib (traces and metrics, for the client, the worker and the activities).
- ``durable_agent.client``, ``durable_agent.devserver``: core + config + codec + telemetry +
  temporalio + stdlib.
- ``durable_agent.activities``: core + config + telemetry + itself + its I/O libraries.
- ``durable_agent.plugin``: anything above (it assembles a worker); only the worker and the
  CLI import it.
- ``durable_agent.worker``: anything above but the CLI.
- ``durable_agent.cli``: the top; nothing else imports it.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
import textwrap
from collections import defaultdict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from functools import cache
from itertools import pairwise
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PACKAGE = "durable_agent"
# Python files under the package that are data, not modules (the demo's sample workspace).
NOT_MODULES = ("durable_agent/data/",)

# --- what each layer may import -------------------------------------------------------

# Pure stdlib modules the core may use (top-level names). A new pure one goes here.
CORE_STDLIB = frozenset(
    {
        "__future__",
        "abc",
        "base64",
        "binascii",
        "bisect",
        "codecs",
        "collections",
        "contextlib",
        "copy",
        "dataclasses",
        "datetime",
        "decimal",
        "difflib",
        "enum",
        "fnmatch",
        "fractions",
        "functools",
        "hashlib",
        "heapq",
        "itertools",
        "json",
        "keyword",
        "math",
        "numbers",
        "operator",
        "pathlib",  # only its pure classes: see test_core_never_uses_filesystem_paths
        "posixpath",
        "re",
        "reprlib",
        "shlex",
        "string",
        "struct",
        "textwrap",
        "types",
        "typing",
        "unicodedata",
        "warnings",
        "weakref",
        "zlib",
    }
)
# Third-party libraries the core may use: validation, linear-time regexes, the shell grammar.
CORE_THIRD_PARTY = frozenset(
    {
        "pydantic",
        "pydantic_core",
        "annotated_types",
        "typing_extensions",
        "re2",
        "tree_sitter",
        "tree_sitter_bash",
        "jsonschema",  # a typed result's answer checked against its schema (``core/output_schema.py``)
    }
)
# Never in the core: Temporal, the network, processes, files, threads, signals.
IO_MODULES = frozenset(
    {
        "temporalio",
        "httpx",
        "subprocess",
        "socket",
        "asyncio",
        "tomllib",
        "shutil",
        "tempfile",
        "urllib",
        "http",
        "ssl",
        "sqlite3",
        "threading",
        "multiprocessing",
        "signal",
        "os",
        "io",
        "glob",
        "select",
        "selectors",
        "concurrent",
        "mmap",
        "fcntl",
        "pty",
        "ctypes",
        "platform",
        "logging",
    }
)
# Workflow code awaits with asyncio; everything else there is I/O or a clock.
# Workers run workflow code without Temporal's sandbox (``worker.py``): clocks and randomness
# are as forbidden there as I/O (``workflow.now()``, ``workflow.random()``, ``workflow.uuid4()``).
NONDETERMINISTIC_MODULES = frozenset({"time", "random", "uuid", "secrets"})
WORKFLOW_IO_MODULES = (IO_MODULES | NONDETERMINISTIC_MODULES) - {"asyncio", "temporalio"}
WORKFLOW_THIRD_PARTY = frozenset({"temporalio", "pydantic", "pydantic_core", "typing_extensions"})
# The import names of pyproject's dependencies (and of what pydantic exposes for typing).
DECLARED_THIRD_PARTY = frozenset(
    {
        "temporalio",
        "pydantic",
        "pydantic_core",
        "annotated_types",
        "typing_extensions",
        "httpx",
        "re2",
        "tree_sitter",
        "tree_sitter_bash",
        "asyncpg",
        "opentelemetry",
        "cryptography",
        "google",  # google.protobuf (the codec server's JSON form of Temporal's payloads)
        "mcp",
        "anyio",
        "httpx2",  # the mcp SDK's HTTP client: its streamable HTTP transport takes one
        "markdownify",  # web_fetch: HTML as markdown
        "bs4",  # beautifulsoup4: web_fetch parses the HTML it hands markdownify
        "jsonschema",  # typed results: answers checked against the run's output schema
        "starlette",  # the console (``durable-agent console``): its web app
        "sse_starlette",  # the console's event streams
        "uvicorn",  # the console's server
    }
)
# The top-level names ``durable_agent`` must never claim or import: a user's project has its own.
SHADOWED_NAMES = frozenset({"workflows", "activities", "worker"})


# --- the import graph ------------------------------------------------------------------


@dataclass(frozen=True)
class Edge:
    importer: str
    imported: str  # a module of the package when it is one, else the name as written
    path: Path
    line: int
    where: str  # "module", "function" or "TYPE_CHECKING"

    @property
    def top(self) -> str:
        return self.imported.split(".")[0]

    def __str__(self) -> str:
        where = "" if self.where == "module" else f" ({self.where})"
        return f"{self.importer} -> {self.imported}  [{self.path.relative_to(REPO)}:{self.line}{where}]"


def _module_files(folder: str) -> dict[str, Path]:
    """``{module name: file}`` for every ``.py`` under ``REPO/folder``, following links."""
    found: dict[str, Path] = {}
    root = REPO / folder
    for dirpath, dirnames, filenames in os.walk(root, followlinks=True):
        dirnames[:] = sorted(d for d in dirnames if d != "__pycache__" and not d.startswith("."))
        for name in sorted(filenames):
            if not name.endswith(".py"):
                continue
            path = Path(dirpath) / name
            relative = path.relative_to(REPO).as_posix()
            if relative.startswith(NOT_MODULES):
                continue
            parts = relative[: -len(".py")].split("/")
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


@cache
def package_modules() -> dict[str, Path]:
    return _module_files(PACKAGE)


def _is_package(module: str, files: dict[str, Path]) -> bool:
    return files[module].name == "__init__.py"


def _type_checking_test(node: ast.expr) -> bool:
    return (isinstance(node, ast.Name) and node.id == "TYPE_CHECKING") or (
        isinstance(node, ast.Attribute) and node.attr == "TYPE_CHECKING"
    )


def _imports(tree: ast.AST) -> Iterator[tuple[ast.Import | ast.ImportFrom, str]]:
    """Every import statement in ``tree`` with where it sits."""

    def visit(node: ast.AST, where: str) -> Iterator[tuple[ast.Import | ast.ImportFrom, str]]:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.Import | ast.ImportFrom):
                yield child, where
            elif isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
                yield from visit(child, "function" if where == "module" else where)
            elif isinstance(child, ast.If) and _type_checking_test(child.test):
                for stmt in child.body:
                    yield from visit(ast.Module(body=[stmt], type_ignores=[]), "TYPE_CHECKING")
                for stmt in child.orelse:
                    yield from visit(ast.Module(body=[stmt], type_ignores=[]), where)
            else:
                yield from visit(child, where)

    yield from visit(tree, "module")


def module_edges(module: str, path: Path, known: dict[str, Path]) -> list[Edge]:
    """The imports of one module; ``known`` names the modules ``from x import y`` may mean."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    is_package = path.name == "__init__.py"
    edges: list[Edge] = []
    for node, where in _imports(tree):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        else:
            if node.level:
                base_parts = module.split(".")
                if not is_package:
                    base_parts = base_parts[:-1]
                base_parts = base_parts[: len(base_parts) - (node.level - 1)]
                base = ".".join([*base_parts, *([node.module] if node.module else [])])
            else:
                base = node.module or ""
            names = []
            for alias in node.names:
                candidate = f"{base}.{alias.name}"
                names.append(candidate if candidate in known else base)
        for name in dict.fromkeys(names):
            edges.append(Edge(module, name, path, node.lineno, where))
    return edges


@cache
def package_edges() -> tuple[Edge, ...]:
    files = package_modules()
    return tuple(edge for module, path in files.items() for edge in module_edges(module, path, files))


def _in(module: str, *prefixes: str) -> bool:
    return any(module == p or module.startswith(p + ".") for p in prefixes)


def _edges_from(*prefixes: str) -> list[Edge]:
    return [e for e in package_edges() if _in(e.importer, *prefixes)]


def _is_stdlib(top: str) -> bool:
    return top in sys.stdlib_module_names


def _report(rule: str, offending: Iterable[Edge | str]) -> str:
    lines = sorted({str(o) for o in offending})
    return f"{rule}: {len(lines)} offending import(s)\n  " + "\n  ".join(lines)


CORE = f"{PACKAGE}.core"
WORKFLOWS = f"{PACKAGE}.workflows"
ACTIVITIES = f"{PACKAGE}.activities"
CONFIG = f"{PACKAGE}.config"
CLIENT = f"{PACKAGE}.client"
CODEC = f"{PACKAGE}.codec"
PLUGIN = f"{PACKAGE}.plugin"
DEVSERVER = f"{PACKAGE}.devserver"
WORKER = f"{PACKAGE}.worker"
CLI = f"{PACKAGE}.cli"
TELEMETRY = (f"{PACKAGE}.telemetry", f"{PACKAGE}.telemetry_spans", f"{PACKAGE}.telemetry_export")


# --- the walk itself ---------------------------------------------------------------------


def test_the_walk_sees_every_layer() -> None:
    """The links are followed and imports in functions and TYPE_CHECKING blocks are seen."""
    modules = package_modules()
    for expected in (
        f"{CORE}.models",
        f"{WORKFLOWS}.agent_run",
        f"{ACTIVITIES}.agent",
        WORKER,
        f"{CLI}.demo",
    ):
        assert expected in modules, f"{expected} not found under {PACKAGE}/ (are the links in place?)"
    kinds = {e.where for e in package_edges()}
    assert {"module", "function", "TYPE_CHECKING"} <= kinds, kinds


def test_module_edges_resolve_relative_and_from_imports(tmp_path: Path) -> None:
    source = textwrap.dedent(
        """
        from typing import TYPE_CHECKING
        from . import sibling
        from .sibling import thing
        from .. import other
        import pkg.deep.mod
        if TYPE_CHECKING:
            from pkg.sub import Name
        def f():
            from pkg import sub
        """
    )
    path = tmp_path / "mod.py"
    path.write_text(source)
    known = dict.fromkeys(["pkg", "pkg.sub", "pkg.sub.sibling", "pkg.other", "pkg.deep.mod"], path)
    got = {(e.imported, e.where) for e in module_edges("pkg.sub.mod", path, known)}
    assert got == {
        ("typing", "module"),
        ("pkg.sub.sibling", "module"),
        ("pkg.other", "module"),
        ("pkg.deep.mod", "module"),
        ("pkg.sub", "TYPE_CHECKING"),
        ("pkg.sub", "function"),
    }


# --- the rules ---------------------------------------------------------------------------


def test_core_never_imports_io_or_temporal() -> None:
    bad = [
        e
        for e in _edges_from(CORE)
        if e.top in IO_MODULES or (e.top == PACKAGE and not _in(e.imported, CORE))
    ]
    assert not bad, _report(f"{CORE} must not import I/O, Temporal or {PACKAGE} outside core", bad)


def test_core_imports_only_its_allowlist() -> None:
    allowed = CORE_STDLIB | CORE_THIRD_PARTY
    bad = [e for e in _edges_from(CORE) if e.top != PACKAGE and e.top not in allowed]
    assert not bad, _report(
        f"{CORE} imports outside its allowlist (add a pure stdlib module to CORE_STDLIB)", bad
    )


def test_core_never_uses_filesystem_paths() -> None:
    """``pathlib``'s pure classes compute; ``Path`` reads and writes files."""
    bad: list[Edge | str] = []
    for module, path in package_modules().items():
        if not _in(module, CORE):
            continue
        for node, _where in _imports(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import) and any(a.name == "pathlib" for a in node.names):
                bad.append(f"{module}: import pathlib  [{path.relative_to(REPO)}:{node.lineno}]")
            elif isinstance(node, ast.ImportFrom) and node.module == "pathlib":
                impure = [a.name for a in node.names if not a.name.startswith("Pure")]
                if impure:
                    bad.append(
                        f"{module}: from pathlib import {', '.join(impure)}"
                        f"  [{path.relative_to(REPO)}:{node.lineno}]"
                    )
    assert not bad, _report(f"{CORE} must not touch files (only pathlib.Pure* classes)", bad)


def test_workflows_import_only_core_temporal_pydantic_and_pure_stdlib() -> None:
    bad = []
    for e in _edges_from(WORKFLOWS):
        if e.top == PACKAGE:
            ok = _in(e.imported, CORE, WORKFLOWS)
        elif _is_stdlib(e.top):
            ok = e.top not in WORKFLOW_IO_MODULES
        else:
            ok = e.top in WORKFLOW_THIRD_PARTY
        if not ok:
            bad.append(e)
    assert not bad, _report(
        f"{WORKFLOWS} may import only {CORE}, itself, temporalio, pydantic and the stdlib without I/O", bad
    )


def test_activities_never_import_workflows_client_cli_or_worker() -> None:
    bad = [
        e
        for e in _edges_from(ACTIVITIES)
        if e.top == PACKAGE and not _in(e.imported, CORE, CONFIG, ACTIVITIES, *TELEMETRY)
    ]
    assert not bad, _report(
        f"{ACTIVITIES} may import only {CORE}, {CONFIG}, telemetry and itself from {PACKAGE}", bad
    )


def test_telemetry_imports_only_core_config_temporal_opentelemetry_and_stdlib() -> None:
    bad = [
        e
        for e in _edges_from(*TELEMETRY)
        if not (
            _in(e.imported, CORE, CONFIG, *TELEMETRY)
            or _is_stdlib(e.top)
            or e.top in {"temporalio", "opentelemetry"}
        )
    ]
    assert not bad, _report(
        f"{PACKAGE}.telemetry* may import only {CORE}, {CONFIG}, temporalio, opentelemetry and the stdlib",
        bad,
    )


def test_config_imports_only_core_pydantic_and_stdlib() -> None:
    bad = [
        e
        for e in _edges_from(CONFIG)
        if not (_in(e.imported, CORE) or _is_stdlib(e.top) or e.top in {"pydantic", "pydantic_core"})
    ]
    assert not bad, _report(f"{CONFIG} may import only {CORE}, pydantic and the stdlib", bad)


def test_client_and_devserver_import_only_core_config_codec_telemetry_temporal_and_stdlib() -> None:
    bad = [
        e
        for e in _edges_from(CLIENT, DEVSERVER)
        if not (
            _in(e.imported, CORE, CONFIG, CODEC, *TELEMETRY)
            or _is_stdlib(e.top)
            or e.top in {"temporalio", "pydantic"}
        )
    ]
    assert not bad, _report(
        f"{CLIENT} and {DEVSERVER} may import only {CORE}, {CONFIG}, {CODEC}, telemetry, temporalio "
        "and the stdlib",
        bad,
    )


def test_codec_imports_only_core_config_temporal_cryptography_and_stdlib() -> None:
    bad = [
        e
        for e in _edges_from(CODEC)
        if not (_in(e.imported, CORE, CONFIG) or _is_stdlib(e.top) or e.top in {"temporalio", "cryptography"})
    ]
    assert not bad, _report(f"{CODEC} may import only {CORE}, {CONFIG}, temporalio and cryptography", bad)


def _declares_the_api(e: Edge) -> bool:
    """``durable_agent/__init__.py`` names the public API's modules for type checkers only: at
    run time it imports each name when first used, so these edges put no layer under it."""
    return e.importer == PACKAGE and e.where == "TYPE_CHECKING"


def test_only_the_worker_and_the_cli_import_the_plugin() -> None:
    bad = [
        e
        for e in package_edges()
        if _in(e.imported, PLUGIN) and not _in(e.importer, CLI, WORKER, PLUGIN) and not _declares_the_api(e)
    ]
    assert not bad, _report(f"only {CLI} and {WORKER} may import {PLUGIN} (it assembles a worker)", bad)


def test_only_the_cli_imports_the_cli_and_the_worker() -> None:
    bad = [
        e
        for e in package_edges()
        if not _declares_the_api(e)
        and (
            (_in(e.imported, CLI) and not _in(e.importer, CLI))
            or (_in(e.imported, WORKER) and not _in(e.importer, CLI, WORKER))
        )
    ]
    assert not bad, _report(f"only {CLI} may import {CLI} and {WORKER} (they are the top layers)", bad)


def test_the_cli_imports_the_worker_side_only_when_a_command_needs_it() -> None:
    """``durable-agent status`` must not load the tools, providers and workflow code."""
    bad = [
        e for e in _edges_from(CLI) if e.where == "module" and _in(e.imported, WORKFLOWS, ACTIVITIES, WORKER)
    ]
    assert not bad, _report(f"{CLI} imports these at module level (import them in the command)", bad)


def test_package_init_imports_nothing_of_the_package() -> None:
    """``import durable_agent.core`` runs ``durable_agent/__init__.py``: it must stay light.

    Its public names are imported when first used (``__getattr__``, by module name); its
    ``TYPE_CHECKING`` block, which only type checkers read, may name their modules."""
    bad = [
        e
        for e in package_edges()
        if e.importer == PACKAGE
        and e.where != "TYPE_CHECKING"
        and e.top not in {"__future__", "importlib", "typing"}
    ]
    assert not bad, _report(f"{PACKAGE}/__init__.py must import nothing of the package at run time", bad)


def test_package_imports_only_declared_dependencies() -> None:
    bad = [
        e
        for e in package_edges()
        if e.top != PACKAGE and not _is_stdlib(e.top) and e.top not in DECLARED_THIRD_PARTY
    ]
    assert not bad, _report("imports of libraries pyproject.toml does not declare", bad)


def test_nothing_imports_the_top_level_workflows_activities_or_worker() -> None:
    """Only ``durable_agent.workflows`` etc.: a user's own top-level packages keep those names."""
    bad: list[Edge] = []
    for folder in (PACKAGE, "tests", "scripts", "bench"):
        files = _module_files(folder)
        known = {**package_modules(), **files}
        for module, path in files.items():
            bad += [e for e in module_edges(module, path, known) if e.top in SHADOWED_NAMES]
    assert not bad, _report(f"imports of {sorted(SHADOWED_NAMES)} instead of {PACKAGE}.*", bad)


# --- cycles ------------------------------------------------------------------------------


def _strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's algorithm, iteratively: the components with more than one module or a self-import."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0
    for root in sorted(graph):
        if root in index:
            continue
        work: list[tuple[str, Iterator[str]]] = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            for child in children:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                    break
                if child in on_stack:
                    low[node] = min(low[node], index[child])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1 or node in graph[node]:
                        found.append(sorted(component))
    return found


def _shortest_cycle(graph: dict[str, set[str]], start: str, within: set[str]) -> list[str]:
    previous: dict[str, str] = {}
    frontier = [start]
    seen = {start}
    while frontier:
        following = []
        for node in frontier:
            for child in sorted(graph[node] & within):
                if child == start:
                    path = [node]
                    while path[-1] != start:
                        path.append(previous[path[-1]])
                    return [*reversed(path), start]
                if child not in seen:
                    seen.add(child)
                    previous[child] = node
                    following.append(child)
        frontier = following
    return []


def import_cycles(edges: Iterable[Edge]) -> list[list[str]]:
    """One shortest cycle through each module that is on a cycle, without repeats."""
    graph: dict[str, set[str]] = defaultdict(set)
    for e in edges:
        graph[e.importer]
        if e.top == PACKAGE:
            graph[e.importer].add(e.imported)
            graph[e.imported]
    cycles: list[list[str]] = []
    seen: set[tuple[str, ...]] = set()
    for component in _strongly_connected(graph):
        for start in component:
            cycle = _shortest_cycle(graph, start, set(component))
            rotation = cycle[:-1]
            pivot = rotation.index(min(rotation))
            key = tuple(rotation[pivot:] + rotation[:pivot])
            if key not in seen:
                seen.add(key)
                cycles.append([*key, key[0]])
    return sorted(cycles)


def test_cycle_finder_finds_cycles() -> None:
    def edge(a: str, b: str) -> Edge:
        return Edge(f"{PACKAGE}.{a}", f"{PACKAGE}.{b}", REPO, 0, "module")

    edges = [edge("a", "b"), edge("b", "c"), edge("c", "a"), edge("c", "d"), edge("d", "d"), edge("e", "a")]
    assert import_cycles(edges) == [
        [f"{PACKAGE}.a", f"{PACKAGE}.b", f"{PACKAGE}.c", f"{PACKAGE}.a"],
        [f"{PACKAGE}.d", f"{PACKAGE}.d"],
    ]


def test_no_import_cycles() -> None:
    """Module-level, function-level and TYPE_CHECKING imports all count."""
    cycles = import_cycles(package_edges())
    where = {(e.importer, e.imported): e for e in package_edges()}
    lines = []
    for cycle in cycles:
        steps = [str(where[(a, b)]) for a, b in pairwise(cycle)]
        lines.append(" -> ".join(cycle) + "\n      " + "\n      ".join(steps))
    assert not cycles, f"{len(cycles)} import cycle(s) among {PACKAGE} modules:\n  " + "\n  ".join(lines)


# --- the core, imported without Temporal or httpx ----------------------------------------

BLOCKING_IMPORTER = """
import importlib, sys

BLOCKED = ("temporalio", "httpx")

class Block:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ImportError(f"the core imported {name}, which it must not")
        return None

sys.meta_path.insert(0, Block())
for name in sys.argv[1:]:
    importlib.import_module(name)
leaked = sorted(m for m in sys.modules if m.split(".")[0] in BLOCKED)
assert not leaked, leaked
print("imported", len(sys.argv) - 1, "modules")
"""


def test_core_imports_without_temporal_or_httpx() -> None:
    core = sorted(m for m in package_modules() if _in(m, CORE))
    assert len(core) > 10, core
    done = subprocess.run(
        [sys.executable, "-c", BLOCKING_IMPORTER, *core],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr + done.stdout
    assert f"imported {len(core)} modules" in done.stdout


# Module-level tables in workflow and core code that are only ever read. Workflow code runs
# unsandboxed, so module state is shared by every run on a worker: anything else mutable at
# module level could carry one run's state into another's replay.
READ_ONLY_TABLES = frozenset(
    {
        "durable_agent.core.context.KNOWN_WINDOWS",
        "durable_agent.core.export._SCHEMA_ALIASED",
        "durable_agent.core.shell_words._ANSI_C",
        "durable_agent.core.builtin_catalog.BUILTIN_TOOLS",
    }
)
WALL_CLOCK_CALLS = frozenset({"now", "utcnow", "today", "fromtimestamp", "time", "monotonic", "perf_counter"})


def test_workflow_and_core_modules_hold_no_mutable_state() -> None:
    import collections
    import importlib

    bad = []
    for module in package_modules():
        if not _in(module, CORE, WORKFLOWS):
            continue
        for name, value in vars(importlib.import_module(module)).items():
            mutable = isinstance(value, (dict, list, set, bytearray, collections.deque))
            if mutable and not name.startswith("__") and f"{module}.{name}" not in READ_ONLY_TABLES:
                bad.append(f"{module}.{name}: a module-level {type(value).__name__}")
    assert not bad, _report("workflow and core modules must keep no state between runs", bad)


def test_workflow_and_core_code_never_reads_a_clock() -> None:
    """``datetime.now()`` and the like; ``workflow.now()`` is the workflow's clock."""
    bad = []
    for module, path in package_modules().items():
        if not _in(module, CORE, WORKFLOWS):
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr in WALL_CLOCK_CALLS
                and not (isinstance(node.func.value, ast.Name) and node.func.value.id == "workflow")
            ):
                bad.append(f"{module}: {ast.unparse(node.func)}()  [{path.relative_to(REPO)}:{node.lineno}]")
    assert not bad, _report("workflow and core code must use workflow.now(), not a clock", bad)
