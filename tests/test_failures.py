"""One vocabulary: every failure type in ``core/failures.py``, one innermost failure message,
one root for the errors a host sees.

A failure type (an ``ApplicationError``'s ``type``) is in recorded histories and in hosts'
code: its value never changes, and it is written once, in ``durable_agent/core/failures.py``.
The source is read with ``ast`` (through the ``workflows``, ``activities`` and ``worker.py``
links), so a literal written elsewhere fails here before it drifts from the constant.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
import temporalio.client
import temporalio.exceptions
from temporalio.client import WorkflowFailureError, WorkflowUpdateFailedError
from temporalio.exceptions import ApplicationError, CancelledError

from durable_agent.core import export, failures
from durable_agent.core.errors import DurableAgentError
from durable_agent.core.failures import failure_message
from durable_agent.workflows.calls import as_activity_error

REPO = Path(__file__).resolve().parent.parent
PACKAGE = REPO / "durable_agent"
FAILURES = (PACKAGE / "core" / "failures.py").resolve()
NOT_MODULES = ("durable_agent/data/",)

# Every failure type, as recorded histories and clients know it. A value here never changes;
# a new type is added here and in ``core/failures.py`` at once.
FAILURE_TYPES = {
    "CONTEXT_OVERFLOW": "ContextOverflow",
    "PROVIDER_ERROR": "ProviderError",
    "MODEL_ANSWER_TOO_LARGE": "ModelAnswerTooLarge",
    "EMPTY_SUMMARY": "EmptySummary",
    "STATE_MISSING": "StateMissing",
    "STATE_LOST": "StateLost",
    "INVALID_LOG_ENTRY": "InvalidLogEntry",
    "SINK_ERROR": "SinkError",
    "INPUT_TOO_LARGE": "InputTooLarge",
    "QUEUE_FULL": "SteerQueueFull",
    "HISTORY_FULL": "HistoryLimit",
    "PAYLOAD_REFUSED": "PayloadRefused",
    "INVALID_RUN_INPUT": "InvalidRunInput",
    "WORKSPACE_NOT_RESTORED": "WorkspaceNotRestored",
    "WORKSPACE_NOT_RECORDED": "WorkspaceNotRecorded",
}
# The failure types of an export that fails its own validation: its ``core.export`` error's class
# name, so no constant each (``failures.EXPORT_FAILURE_TYPES`` holds them with ``SinkError``).
EXPORT_ERROR_TYPES = {"ExportError", "InvalidDescriptor", "InvalidPayload", "ContentDrift", "EncodingError"}


def _source_files() -> Iterator[Path]:
    """Every ``.py`` of the package, following its links (``workflows``, ``activities``)."""
    for dirpath, dirnames, filenames in os.walk(PACKAGE, followlinks=True):
        dirnames[:] = sorted(d for d in dirnames if d != "__pycache__" and not d.startswith("."))
        for name in sorted(filenames):
            path = Path(dirpath) / name
            if name.endswith(".py") and not path.relative_to(REPO).as_posix().startswith(NOT_MODULES):
                yield path


def _is_type_read(node: ast.expr) -> bool:
    """``x.type`` or ``getattr(x, "type", ...)``: a failure's type being read."""
    if isinstance(node, ast.Attribute):
        return node.attr == "type"
    return (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id == "getattr"
        and len(node.args) >= 2
        and isinstance(node.args[1], ast.Constant)
        and node.args[1].value == "type"
    )


def _strings(node: ast.expr) -> list[str]:
    """The string literals of ``node``: itself, or the items of a tuple, list or set."""
    items = node.elts if isinstance(node, ast.Tuple | ast.List | ast.Set) else [node]
    return [i.value for i in items if isinstance(i, ast.Constant) and isinstance(i.value, str)]


def _looks_like_failure_type(text: str) -> bool:
    """CamelCase, as every failure type is (``tree-sitter`` and wire types are snake_case)."""
    return text[:1].isupper() and text.isidentifier() and "_" not in text


def _names_not_types(tree: ast.AST) -> set[int]:
    """The ids of the string constants that are text or names, not failure types: those that
    stand alone as statements (docstrings) and those of ``__all__`` and of the package's table
    of where each public name lives, ``_WHERE`` (a class may share a failure type's name)."""
    ids = {
        id(stmt.value)
        for stmt in ast.walk(tree)
        if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant)
    }
    for stmt in ast.walk(tree):
        targets = stmt.targets if isinstance(stmt, ast.Assign) else [getattr(stmt, "target", None)]
        if isinstance(stmt, ast.Assign | ast.AugAssign | ast.AnnAssign) and any(
            isinstance(t, ast.Name) and t.id in {"__all__", "_WHERE"} for t in targets
        ):
            ids.update(id(c) for c in ast.walk(stmt) if isinstance(c, ast.Constant))
    return ids


def failure_literals(source: str, filename: str = "<source>") -> list[str]:
    """Where ``source`` writes a failure type as a literal: an ``ApplicationError(type="...")``,
    a comparison of a ``.type`` with a CamelCase string, or any known failure type's value."""
    tree = ast.parse(source, filename)
    known = set(FAILURE_TYPES.values()) | EXPORT_ERROR_TYPES
    names = _names_not_types(tree)
    found: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
            typed = [k.value for k in node.keywords if k.arg == "type"] if name == "ApplicationError" else []
            for texts in filter(None, map(_strings, typed)):
                found.append(f"{filename}:{node.lineno}: ApplicationError(type={texts})")
        elif isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            if any(_is_type_read(side) for side in sides):
                for side in sides:
                    for text in _strings(side):
                        if _looks_like_failure_type(text):
                            found.append(f"{filename}:{node.lineno}: .type compared with {text!r}")
        elif (
            isinstance(node, ast.Constant)
            and isinstance(node.value, str)
            and node.value in known
            and id(node) not in names
        ):
            found.append(f"{filename}:{node.lineno}: {node.value!r}")
    return sorted(set(found))


# --- the failure types ----------------------------------------------------------------


def test_every_failure_type_keeps_its_value() -> None:
    constants = {
        name: value for name, value in vars(failures).items() if name.isupper() and isinstance(value, str)
    }
    assert constants == FAILURE_TYPES


def test_no_failure_type_is_written_outside_core_failures() -> None:
    found = [
        hit
        for path in _source_files()
        if path.resolve() != FAILURES
        for hit in failure_literals(path.read_text(), path.relative_to(REPO).as_posix())
    ]
    assert found == [], "import the constant from durable_agent.core.failures:\n" + "\n".join(found)


def test_the_walk_reads_every_layer() -> None:
    seen = {path.relative_to(REPO).parts[1] for path in _source_files()}
    assert {"core", "workflows", "activities", "cli", "worker.py", "client.py", "codec.py"} <= seen


@pytest.mark.parametrize(
    "source",
    [
        'raise ApplicationError("no", type="ProviderError")',
        'raise temporalio.exceptions.ApplicationError("no", type="SomethingNew", non_retryable=True)',
        'ok = cause.type == "ContextOverflow"',
        'ok = exc.cause.type != "SomethingNew"',
        'ok = cause.type in ("StateLost", "StateMissing")',
        'ok = getattr(cause, "type", None) == "SomethingNew"',
        'ok = kind in {"SinkError", "other"}',
        'KIND = "EmptySummary"',
    ],
)
def test_the_check_finds_a_literal(source: str) -> None:
    assert failure_literals(source) != []


@pytest.mark.parametrize(
    "source",
    [
        'raise ApplicationError("no", type=PROVIDER_ERROR)',
        'raise ApplicationError("no", type=type(exc).__name__)',
        'ok = node.type == "heredoc_redirect"',
        'ok = event.type in ("message_start", "error")',
        '"""A docstring may name ``SinkError`` or even SinkError alone:"""\n"SinkError"',
        '__all__ = ["ProviderError", "SinkError"]',
        "ok = cause.type == CONTEXT_OVERFLOW",
    ],
)
def test_the_check_lets_constants_and_other_types_be(source: str) -> None:
    assert failure_literals(source) == []


def test_export_failure_types_are_the_sink_and_export_errors() -> None:
    def subclasses(cls: type[Exception]) -> Iterator[type[Exception]]:
        yield cls
        for sub in cls.__subclasses__():
            yield from subclasses(sub)

    # an export that fails its own validation is typed by its error's class name
    export_errors = {c.__name__ for c in subclasses(export.ExportError) if c.__module__ == export.__name__}
    assert export_errors == EXPORT_ERROR_TYPES
    assert export_errors | {failures.SINK_ERROR} == failures.EXPORT_FAILURE_TYPES


def test_the_host_contract_still_names_the_refusals() -> None:
    from durable_agent.core import run_api

    for name in ("INPUT_TOO_LARGE", "QUEUE_FULL", "HISTORY_FULL", "PAYLOAD_REFUSED", "INVALID_RUN_INPUT"):
        assert getattr(run_api, name) == FAILURE_TYPES[name]


# --- the innermost failure message -------------------------------------------------------


def test_the_wrapping_failures_are_temporals() -> None:
    for name in failures.WRAPPING_FAILURES:
        found = getattr(temporalio.exceptions, name, None) or getattr(temporalio.client, name, None)
        assert inspect.isclass(found) and issubclass(found, Exception), name


def test_the_message_is_an_activitys_innermost() -> None:
    refused = ApplicationError("the sink refused", "sha256:abc", type="SinkErrorLike")
    refused.__cause__ = ValueError("the sink's own words")
    outer = as_activity_error("agent.checkpoint", refused)
    assert failure_message(outer) == "the sink refused"  # not the wrapper's, not the cause's
    assert failure_message(as_activity_error("agent.model_call", CancelledError("cancelled"))) == "cancelled"


def test_the_message_is_a_workflows_or_an_updates_cause() -> None:
    refused = ApplicationError("prompt too large", type="InputTooLargeLike")
    assert failure_message(WorkflowFailureError(cause=refused)) == "prompt too large"
    assert failure_message(WorkflowUpdateFailedError(refused)) == "prompt too large"
    inner = as_activity_error("agent.resolve_run", ApplicationError("no such model"))
    assert failure_message(WorkflowFailureError(cause=inner)) == "no such model"


def test_the_message_of_anything_else_is_its_text_or_its_name() -> None:
    assert failure_message(ValueError("bad value")) == "bad value"
    assert failure_message(ValueError()) == "ValueError"
    assert failure_message(ApplicationError("")) == "ApplicationError"

    class ActivityError(Exception):  # not Temporal's: nothing to unwrap
        pass

    wrapper = ActivityError("its own words")
    wrapper.__cause__ = ValueError("not these")
    assert failure_message(wrapper) == "its own words"


# --- the root of the host-facing errors --------------------------------------------------

# Each public error class and the base it had before ``DurableAgentError`` (kept, so that an
# ``except ValueError`` written against it still catches it).
PUBLIC_ERRORS = {
    "durable_agent.config.ConfigError": ValueError,
    "durable_agent.codec.CodecError": ValueError,
    "durable_agent.devserver.DevServerError": RuntimeError,
    "durable_agent.cli.exports.ExportRefError": ValueError,
    "durable_agent.core.canonical.CanonicalJsonError": ValueError,
    "durable_agent.core.export.ExportError": ValueError,
    "durable_agent.core.export.InvalidDescriptor": ValueError,
    "durable_agent.core.export.InvalidPayload": ValueError,
    "durable_agent.core.export.ContentDrift": ValueError,
    "durable_agent.core.export.EncodingError": ValueError,
    "durable_agent.core.globs.GlobError": ValueError,
    "durable_agent.core.json_limits.JsonLimitError": ValueError,
    "durable_agent.core.permissions.InvalidRule": ValueError,
    "durable_agent.core.patch_format.PatchError": ValueError,
    "durable_agent.core.run_log.StateMissing": Exception,
    "durable_agent.core.tool_specs.ToolCallError": ValueError,
    "durable_agent.core.output_schema.OutputSchemaError": ValueError,
    "durable_agent.core.output_schema.RunOutputError": Exception,
    "durable_agent.conformance.checks.ConformanceError": AssertionError,
    "durable_agent.activities.sink_manifest.ManifestError": ValueError,
    "durable_agent.activities.sinks.SinkError": Exception,
    "durable_agent.activities.providers.model_provider.ProviderError": Exception,
    "durable_agent.activities.tools.tool.ToolFailure": Exception,
    "durable_agent.activities.tools.custom.ToolDefinitionError": ValueError,
    "durable_agent.activities.store.pg_schema.SchemaTooNew": RuntimeError,
    "durable_agent.activities.store.postgres.PostgresConnectError": RuntimeError,
    "durable_agent.activities.workspaces.errors.WorkspaceTreeError": Exception,
    "durable_agent.cli.rewind.RewindError": Exception,
    "durable_agent.worker.StorageUnusable": Exception,
}
# Exceptions that never leave the package: the workflow's and the activities' own control flow.
INTERNAL_EXCEPTIONS = {
    "durable_agent.workflows.agent_run.BudgetStop",  # the run ends budget_exhausted
    "durable_agent.workflows.calls.RunCancelled",  # the run ends cancelled
    "durable_agent.workflows.calls.RunFailed",  # the run ends failed, recorded on the run
    "durable_agent.core.output_schema.OutputSchemaUnusable",  # becomes RunFailed
    "durable_agent.activities.mcp.catalog.McpCallLost",  # Temporal retries the tool call
    "durable_agent.activities.mcp.connection.McpCrashed",  # the tool call's output says so
    "durable_agent.activities.mcp.connection.McpUnavailable",  # the server's tools are unavailable
    "durable_agent.activities.mcp.session.ConnectFailed",  # becomes McpUnavailable
    "durable_agent.activities.tools.sandbox_limits.SandboxUnavailable",  # the bash call's output
    "durable_agent.conformance.checks.CheckSkipped",  # a check that does not apply: not an error
    "durable_agent.cli.diff.DiffError",  # ``durable-agent diff``'s message and exit code
    "durable_agent.activities.sink_gc.rules.GcError",  # ``durable-agent gc``'s message (exit 2)
    "durable_agent.activities.workspace_tree.WorkspaceTooLarge",  # the call's answer, a tool error
    "durable_agent.activities.tools.sandbox_seccomp.SeccompUnsupported",  # becomes SandboxUnavailable
    "durable_agent.console.auth.ConsoleAuthError",  # ``durable-agent console``'s message (exit 2)
    "durable_agent.console.files.FilesError",  # the console's HTTP answer, with its status
    # fails the workflow task, not the run: a build that reads the state takes it (docs/deploys.md)
    "durable_agent.core.run_api.CarriedStateUnreadable",
}


def _by_name(qualified: str) -> type[BaseException]:
    module, _, name = qualified.rpartition(".")
    found = getattr(importlib.import_module(module), name)
    assert inspect.isclass(found) and issubclass(found, BaseException), qualified
    return found


def _modules() -> Iterator[str]:
    for path in _source_files():
        parts = list(path.relative_to(REPO).with_suffix("").parts)
        if parts[-1] == "__main__":  # runs the CLI when imported
            continue
        if parts[-1] == "__init__":
            parts.pop()
        yield ".".join(parts)


@pytest.mark.parametrize("qualified", sorted(PUBLIC_ERRORS))
def test_each_public_error_is_a_durable_agent_error(qualified: str) -> None:
    error = _by_name(qualified)
    assert issubclass(error, DurableAgentError)
    assert issubclass(error, PUBLIC_ERRORS[qualified])


def test_every_exception_class_is_public_or_internal() -> None:
    defined = {
        f"{obj.__module__}.{obj.__qualname__}"
        for module in _modules()
        for obj in vars(importlib.import_module(module)).values()
        if inspect.isclass(obj)
        and issubclass(obj, BaseException)
        and obj.__module__ == module
        and obj is not DurableAgentError
    }
    assert defined == set(PUBLIC_ERRORS) | INTERNAL_EXCEPTIONS
    for qualified in INTERNAL_EXCEPTIONS:
        assert not issubclass(_by_name(qualified), DurableAgentError), qualified
