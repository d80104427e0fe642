"""The public API is declared in one place, ``durable_agent.__all__``, and every name in it imports."""

from __future__ import annotations

import ast
import importlib
import inspect
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

import durable_agent


@pytest.mark.parametrize("name", durable_agent.__all__)
def test_every_public_name_imports(name: str) -> None:
    value = getattr(durable_agent, name)
    assert value is not None
    namespace: dict[str, object] = {}
    exec(f"from durable_agent import {name}", namespace)  # the import a host writes
    assert namespace[name] is value


def test_public_names_are_the_objects_their_modules_define() -> None:
    for name, module in durable_agent._WHERE.items():
        assert getattr(durable_agent, name) is getattr(importlib.import_module(module), name), name


def test_all_and_the_lazy_table_agree() -> None:
    assert set(durable_agent.__all__) == {*durable_agent._WHERE, "__version__"}
    assert len(durable_agent.__all__) == len(set(durable_agent.__all__))
    assert set(durable_agent.__all__) <= set(dir(durable_agent))


def test_an_unknown_name_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="no_such_name"):
        durable_agent.no_such_name  # noqa: B018


def test_importing_the_package_imports_nothing_of_it() -> None:
    """``import durable_agent`` stays light: no public name is imported until used."""
    code = (
        "import sys, durable_agent; print(sorted(m for m in sys.modules if m.startswith('durable_agent.')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


# --- documented: docs/api.md and the docstrings -------------------------------------------------

ROOT = Path(__file__).resolve().parents[1]
API_PAGE = ROOT / "docs" / "api.md"
PUBLIC = sorted(durable_agent._WHERE)


def test_every_public_name_is_on_the_api_page() -> None:
    """Each name in ``__all__`` has its own entry on docs/api.md, under the module it comes from."""
    text = API_PAGE.read_text(encoding="utf-8")
    entries = set(re.findall(r"^::: (\S+)$", text, re.MULTILINE))
    missing = [
        f"{module}.{name}"
        for name, module in durable_agent._WHERE.items()
        if f"{module}.{name}" not in entries
    ]
    assert not missing, "docs/api.md has no `::: path` entry for:\n" + "\n".join(missing)
    assert "__version__" in text


def _own_doc(value: object) -> str:
    doc = value.__dict__.get("__doc__") if isinstance(value, type) else getattr(value, "__doc__", None)
    return inspect.cleandoc(doc) if doc else ""


def _sections_missing(function: Any, doc: str) -> list[str]:
    """The Google-style sections ``doc`` lacks for ``function``: ``Args:`` when it takes
    parameters, ``Returns:`` (or ``Yields:``) when it gives something back."""
    signature = inspect.signature(function)
    params = [p for n, p in signature.parameters.items() if n not in ("self", "cls")]
    missing = []
    if params and "Args:" not in doc:
        missing.append("Args:")
    returns = signature.return_annotation
    if returns not in (inspect.Signature.empty, None, "None") and not re.search(
        r"^(Returns|Yields):", doc, re.M
    ):
        missing.append("Returns:")
    return missing


def _public_methods(cls: type) -> list[tuple[str, Any]]:
    if issubclass(cls, BaseModel):
        # a model's own methods (its fields are attributes; pydantic's machinery is not ours)
        names = [n for n, v in vars(cls).items() if inspect.isfunction(v)]
    else:
        names = [n for n, v in vars(cls).items() if inspect.isfunction(v) or isinstance(v, property)]
    out = []
    for name in names:
        if name.startswith("_"):
            continue
        value = vars(cls)[name]
        out.append((name, value.fget if isinstance(value, property) else value))
    return out


@pytest.mark.parametrize("name", PUBLIC)
def test_every_public_name_has_a_google_style_docstring(name: str) -> None:
    """A docstring of its own, with ``Args:``/``Returns:`` where they apply; so have its
    class's public methods (and a class whose constructor takes arguments says what they are)."""
    value = getattr(durable_agent, name)
    doc = _own_doc(value)
    assert doc, f"{name} has no docstring of its own"
    problems = []
    if inspect.isfunction(value):
        problems += [f"{name}: no {s}" for s in _sections_missing(value, doc)]
    elif isinstance(value, type):
        init = vars(value).get("__init__")
        protocol = getattr(value, "_is_protocol", False)  # a protocol's __init__ is typing's
        takes = init is not None and not protocol and len(inspect.signature(init).parameters) > 1
        if takes and not re.search(r"^(Args|Attributes):", doc, re.M):
            problems.append(f"{name}: its constructor's arguments are not described (Args: or Attributes:)")
        for method, function in _public_methods(value):
            method_doc = _own_doc(function)
            if not method_doc:
                problems.append(f"{name}.{method}: no docstring")
            else:
                problems += [f"{name}.{method}: no {s}" for s in _sections_missing(function, method_doc)]
    assert not problems, "\n".join(problems)


# --- the rest is marked internal ------------------------------------------------------------------

PACKAGES = [
    "durable_agent/core",
    "durable_agent/cli",
    "durable_agent/console",
    "workflows",
    "activities",
    "activities/store",
    "activities/tools",
    "activities/providers",
    "activities/mcp",
    "activities/workspaces",
    "activities/sink_gc",
]


def test_every_package_outside_the_public_api_says_it_is_internal() -> None:
    init_files = {
        str(p.parent.relative_to(ROOT))
        for folder in ("durable_agent", "activities", "workflows")
        for p in (ROOT / folder).rglob("__init__.py")
        if "data" not in p.parts
    }
    # the package itself declares the public API; the conformance checks are documented on the API page
    assert init_files - {"durable_agent", "durable_agent/conformance"} == set(PACKAGES), init_files
    unmarked = []
    for package in PACKAGES:
        doc = ast.get_docstring(ast.parse((ROOT / package / "__init__.py").read_text(encoding="utf-8")))
        if not doc or "Internal:" not in doc or "durable_agent.__all__" not in doc:
            unmarked.append(package)
    assert not unmarked, "package docstrings that do not say they are internal: " + ", ".join(unmarked)
