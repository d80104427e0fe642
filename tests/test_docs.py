"""The documentation: a short README, a configuration reference with every key of the config
models, links that resolve, a layout table that names every module, and a site that builds.

The pages are ``README.md`` and ``docs/*.md``, built into a site by MkDocs (``mkdocs.yml``);
``docs/hooks/generated.py`` fills in the parts generated from the code when the site is
built. The strict build itself (``mkdocs build --strict``: every link and anchor, every page
in the nav) runs here when MkDocs is installed (the ``dev`` extras), and in CI.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import sys
import types
import typing
import unicodedata
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from durable_agent.config import AgentConfig

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
README = ROOT / "README.md"
PAGES = sorted(DOCS.glob("*.md"))
README_MAX_LINES = 250


def load_hook() -> types.ModuleType:
    path = DOCS / "hooks" / "generated.py"
    spec = importlib.util.spec_from_file_location("docs_hooks_generated", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


# --- the README --------------------------------------------------------------------------------


def test_the_readme_is_short() -> None:
    lines = README.read_text(encoding="utf-8").count("\n")
    assert lines <= README_MAX_LINES, (
        f"README.md has {lines} lines; at most {README_MAX_LINES}: move text to docs/"
    )


def test_the_readme_keeps_the_two_commands() -> None:
    text = README.read_text(encoding="utf-8")
    demo = "python3 -m venv .venv && .venv/bin/pip install -q -e . && .venv/bin/durable-agent demo"
    assert demo in text
    assert "\nbash .ci/run\n" in text
    assert (ROOT / ".ci" / "run").is_file()


def test_the_sites_home_page_is_the_readme() -> None:
    home = load_hook().render((DOCS / "index.md").read_text(encoding="utf-8"))
    assert "bash .ci/run" in home and "](docs/" not in home


# --- the configuration reference ------------------------------------------------------------------


def _bare(annotation: Any) -> Any:
    """``annotation`` without ``Annotated`` and without ``| None``."""
    if typing.get_origin(annotation) is typing.Annotated:
        return _bare(typing.get_args(annotation)[0])
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        rest = [a for a in typing.get_args(annotation) if a is not type(None)]
        if len(rest) == 1:
            return _bare(rest[0])
    return annotation


def _tables(annotation: Any) -> list[type[BaseModel]]:
    """The models a value of ``annotation`` may be (a union of kinds: each)."""
    annotation = _bare(annotation)
    candidates = (
        typing.get_args(annotation)
        if typing.get_origin(annotation) in (typing.Union, types.UnionType)
        else (annotation,)
    )
    found = [_bare(c) for c in candidates]
    return [c for c in found if isinstance(c, type) and issubclass(c, BaseModel)]


def config_keys() -> dict[tuple[str, str | None], set[str]]:
    """Every TOML table of the config (its path, and its ``kind`` where one table takes several
    kinds) with the keys its model takes: ``AgentConfig``'s fields, walked recursively."""
    keys: dict[tuple[str, str | None], set[str]] = {}

    def visit(model: type[BaseModel], path: str, kind: str | None) -> None:
        keys.setdefault((path, kind), set()).update(model.model_fields)
        for name, field in model.model_fields.items():
            child = f"{path}.{name}" if path else name
            annotation = _bare(field.annotation)
            if typing.get_origin(annotation) is dict:
                annotation = typing.get_args(annotation)[1]
                extra = field.json_schema_extra if isinstance(field.json_schema_extra, dict) else {}
                if extra.get("tables_here"):  # ``[agents.NAME]``, beside the table's own keys
                    child = path
                child += ".MODEL" if name == "models" else ".NAME"
            elif typing.get_origin(annotation) is tuple and typing.get_args(annotation):
                annotation = typing.get_args(annotation)[0]  # an array of tables: [[hooks.stop]]
            kinds = [t for t in _tables(annotation) if t is not model]  # no table within itself
            for table in kinds:
                own = None
                if len(kinds) > 1:
                    [own] = typing.get_args(_bare(table.model_fields["kind"].annotation))
                visit(table, child, own)

    visit(AgentConfig, "", None)
    return keys


def reference_tables(markdown: str) -> dict[tuple[str, str | None], set[str]]:
    """The tables of the rendered reference: each ``###`` heading's TOML path and kind, and the
    keys of the rows under it."""
    found: dict[tuple[str, str | None], set[str]] = {}
    current: tuple[str, str | None] | None = None
    for line in markdown.splitlines():
        if line.startswith("### "):
            path = re.search(r"\[([^\]]+)\]", line)
            kind = re.search(r'kind = "([^"]+)"', line)
            table = path.group(1).replace('"', "").lstrip("[") if path else ""
            current = (table, kind.group(1) if kind else None)
            found.setdefault(current, set())
        elif line.startswith("## "):
            current = None
        elif current is not None and (row := re.match(r"\| `([a-z_]+)` \|", line)):
            found[current].add(row.group(1))
    return found


def test_the_configuration_page_is_generated_from_the_models() -> None:
    text = (DOCS / "configuration.md").read_text(encoding="utf-8")
    hook = load_hook()
    assert hook.CONFIG_MARK in text, "docs/configuration.md lost the mark the reference is generated at"
    assert hook.CONFIG_MARK not in hook.render(text)


def test_every_config_key_is_in_the_reference() -> None:
    rendered = load_hook().render((DOCS / "configuration.md").read_text(encoding="utf-8"))
    tables = reference_tables(rendered)
    expected = config_keys()
    assert len(expected) > 15  # the walk reached the nested tables
    missing = [
        f"[{path or 'top level'}]{f' kind={kind}' if kind else ''} {key}"
        for (path, kind), keys in expected.items()
        for key in sorted(keys - tables.get((path, kind), set()))
    ]
    assert not missing, "keys of the config models missing from docs/configuration.md:\n" + "\n".join(missing)


def test_every_key_says_what_it_does() -> None:
    rendered = load_hook().render((DOCS / "configuration.md").read_text(encoding="utf-8"))
    empty = [line for line in rendered.splitlines() if re.match(r"\| `[a-z_]+` \|.*\| *\|$", line)]
    assert not empty, "keys without a description (comment the field in its model):\n" + "\n".join(empty)


# --- links --------------------------------------------------------------------------------------


def _prose(text: str) -> str:
    """``text`` without fenced code blocks and inline code, where a bracket is not a link."""
    text = re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)
    return re.sub(r"`[^`\n]*`", "", text)


def links(path: Path) -> Iterator[str]:
    for match in re.finditer(r"\]\(([^)\s]+)\)", _prose(path.read_text(encoding="utf-8"))):
        target = match.group(1)
        if not re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
            yield target


def slug(heading: str) -> str:
    """A heading's anchor as MkDocs (Python-Markdown's ``toc``) and GitHub make it."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link: its text
    text = unicodedata.normalize("NFKD", text.replace("`", "")).encode("ascii", "ignore").decode()
    text = re.sub(r"[^\w\s-]", "", text).strip().lower()
    return re.sub(r"[-\s]+", "-", text)


def anchors(path: Path) -> set[str]:
    text = re.sub(r"^```.*?^```", "", path.read_text(encoding="utf-8"), flags=re.S | re.M)
    found = {slug(m.group(1)) for m in re.finditer(r"^#{1,6} +(.+?) *#*$", text, flags=re.M)}
    if path.name == "api.md":
        # mkdocstrings names each object's heading by its path: every object under a ``:::``
        found |= {f"{m.group(1)}*" for m in re.finditer(r"^::: +([\w.]+)", text, flags=re.M)}
    return found


def resolves(anchor: str, known: set[str]) -> bool:
    return anchor in known or any(k.endswith("*") and anchor.startswith(k[:-1]) for k in known)


@pytest.mark.parametrize("page", [README, *PAGES], ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(page: Path) -> None:
    broken = []
    for target in links(page):
        file, _, anchor = target.partition("#")
        if file.startswith("/"):
            broken.append(f"{target}: an absolute path (write it relative to the page)")
            continue
        dest = (page.parent / file).resolve() if file else page
        if not dest.exists():
            broken.append(f"{target}: no such file")
        elif page.parent == DOCS and DOCS not in dest.parents and dest != DOCS:
            broken.append(f"{target}: outside docs/, which the site does not hold")
        elif anchor and dest.suffix == ".md" and not resolves(anchor, anchors(dest)):
            broken.append(f"{target}: {dest.name} has no heading with that anchor")
    assert not broken, f"{page.relative_to(ROOT)}:\n" + "\n".join(broken)


def test_every_page_is_in_the_nav() -> None:
    config = (ROOT / "mkdocs.yml").read_text(encoding="utf-8")
    nav = config[config.index("\nnav:") :]
    listed = set(re.findall(r":\s*([\w./-]+\.md)\s*$", nav, flags=re.M))
    pages = {p.name for p in PAGES}
    assert pages - listed == set(), "pages missing from mkdocs.yml's nav"
    assert listed - pages == set(), "mkdocs.yml's nav names pages that do not exist"


# --- the layout table ------------------------------------------------------------------------------


def layout_rows() -> list[tuple[str, str]]:
    text = (DOCS / "architecture.md").read_text(encoding="utf-8")
    table = text[text.index("| path | what |") :]
    rows = []
    for line in table.splitlines()[2:]:
        if not line.startswith("| "):
            break
        path, what = line.split(" | ", 2)[:2]
        rows.append((path.removeprefix("| "), what))
    return rows


def named_files() -> set[Path]:
    """The files the layout table names: the first column's paths (each after the first relative
    to the first's folder), and, in a folder's row, the files its second column names."""
    named: set[Path] = set()
    for first, what in layout_rows():
        paths = re.findall(r"`([^`]+)`", first)
        base = ROOT / paths[0]
        folder = base if paths[0].endswith("/") else base.parent
        named.add(base)
        named.update(folder / p for p in paths[1:])
        if paths[0].endswith("/"):
            named.update(folder / n for n in re.findall(r"`([\w/]+\.py)`", what))
    return named


def test_the_layout_table_names_only_files_that_exist() -> None:
    missing = sorted(str(p.relative_to(ROOT)) for p in named_files() if not p.exists())
    assert not missing, "docs/architecture.md's layout table names files that are gone:\n" + "\n".join(
        missing
    )


def test_the_layout_table_names_every_module() -> None:
    named = {p.resolve() for p in named_files()}
    folders = [ROOT / "durable_agent", ROOT / "workflows", ROOT / "activities"]
    modules = {
        p.resolve()
        for folder in folders
        for p in folder.rglob("*.py")
        if p.name not in ("__init__.py", "__main__.py") and "data" not in p.relative_to(folder).parts
    }
    left_out = sorted(str(p.relative_to(ROOT)) for p in modules - named)
    assert not left_out, "modules docs/architecture.md's layout table does not name:\n" + "\n".join(left_out)


# --- the site -----------------------------------------------------------------------------------


def test_the_site_builds_strictly(tmp_path: Path) -> None:
    pytest.importorskip("mkdocs", reason="MkDocs is not installed (pip install -e '.[dev]')")
    mkdocs = shutil.which("mkdocs", path=str(Path(sys.executable).parent)) or shutil.which("mkdocs")
    command = [mkdocs] if mkdocs else [sys.executable, "-m", "mkdocs"]
    done = subprocess.run(
        [*command, "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )
    assert done.returncode == 0, done.stdout + done.stderr
