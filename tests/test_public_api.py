"""The public API is declared in one place, ``durable_agent.__all__``, and every name in it imports."""

from __future__ import annotations

import importlib
import subprocess
import sys

import pytest

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
