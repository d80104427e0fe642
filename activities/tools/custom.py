"""Tools of your own, from typed Python functions: ``@tool`` (``docs/tools.md``, "Your own tools").

The function's parameters become the arguments' pydantic model (its JSON schema is what the
model is offered, and every call is validated against it), its docstring's text the tool's
description and its Google-style ``Args:`` the arguments' descriptions. An optional first
parameter typed ``ToolContext`` receives the call's workspace, run and call id. The tool runs
as ``agent.tool_call`` like the built-in ones: heartbeats, cancellation, permission rules,
approvals, redaction and the staging of long results are the activity's, not the function's.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path, PurePath
from typing import Annotated, Any, Generic, ParamSpec, TypeVar, get_args, get_origin, get_type_hints, overload

from pydantic import ConfigDict, Field, create_model
from pydantic.fields import FieldInfo
from pydantic_core import to_json

from durable_agent.activities.tools.tool import CURRENT_CALL, Tool, ToolContent, ToolImpl, confine, threaded
from durable_agent.core.errors import DurableAgentError
from durable_agent.core.tool_specs import MCP_PREFIX, TOOL_NAME_MAX, ToolArgs, ToolSpec

P = ParamSpec("P")
R = TypeVar("R")

# What a permission rule can name (``core/permissions.py``) and a provider accepts as a tool name.
_NAME = re.compile(rf"[A-Za-z_][A-Za-z0-9_-]{{0,{TOOL_NAME_MAX - 1}}}")
# The Google-style sections a docstring's description ends at; ``Args:`` and its synonyms are read.
_ARGS_SECTIONS = ("args", "arguments", "parameters", "params")
_SECTION = re.compile(r"^([A-Za-z][A-Za-z ]*):\s*$")
_ARG_LINE = re.compile(r"^\*{0,2}(\w+)\s*(?:\([^)]*\))?\s*:\s*(.*)$")


class ToolDefinitionError(DurableAgentError, ValueError):
    """A function that cannot be made a tool, or tools whose names clash (raised when the tool
    is made or registered, never during a run)."""


@dataclass(frozen=True)
class ToolContext:
    """What a tool of yours learns about the call it runs for, when its first parameter is
    typed ``ToolContext``.

    Attributes:
        workspace: The run's workspace folder on this worker.
        run_id: The run's id (the same for every call of the run, and after a crash).
        call_id: The model's id for this call: with ``run_id``, a key to make a call that runs
            again (Temporal runs it at least once) do its effect once.
        tool: The tool's name.
    """

    workspace: Path
    run_id: str
    call_id: str
    tool: str

    def path(self, path: str | PurePath) -> Path:
        """``path`` resolved inside the workspace, links followed as far as it exists.

        Args:
            path: A path relative to the workspace (or absolute, inside it).

        Returns:
            The absolute path.

        Raises:
            ToolFailure: The path leads outside the workspace (by ``..``, by being absolute, or
                through a link), or cannot be resolved; the model is told so.
        """
        return confine(self.workspace, str(path))


class FunctionArgs(ToolArgs):
    """Base of the argument models ``tool`` makes: as every tool's, frozen and strict about
    unknown fields; any parameter name is welcome (``model_name`` included)."""

    model_config = ConfigDict(extra="forbid", frozen=True, protected_namespaces=())


@dataclass(frozen=True)
class FunctionTool(Tool, Generic[P, R]):
    """A tool made by ``tool`` from a function; calling it calls the function (for your tests).

    Attributes:
        function: The function, as written.
        read_only: Whether the function only reads (as its author says).
    """

    function: Callable[P, R]
    read_only: bool = False

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R:
        return self.function(*args, **kwargs)


@overload
def tool(function: Callable[P, R], /) -> FunctionTool[P, R]: ...


@overload
def tool(
    *,
    name: str | None = None,
    description: str | None = None,
    read_only: bool = False,
    idempotent: bool | None = None,
    permission_target: str | None = None,
    target_is_path: bool | None = None,
) -> Callable[[Callable[P, R]], FunctionTool[P, R]]: ...


def tool(
    function: Callable[P, R] | None = None,
    /,
    *,
    name: str | None = None,
    description: str | None = None,
    read_only: bool = False,
    idempotent: bool | None = None,
    permission_target: str | None = None,
    target_is_path: bool | None = None,
) -> FunctionTool[P, R] | Callable[[Callable[P, R]], FunctionTool[P, R]]:
    """Make a tool of a typed function (``async def`` or plain ``def``): ``@tool`` or ``@tool(...)``.

    The parameters are the tool's arguments: their type hints (pydantic models, ``Literal``,
    ``Annotated[int, Field(ge=1)]``, …) make its JSON schema, their defaults make them
    optional. The docstring's text before its sections is the description the model reads;
    its ``Args:`` section describes the arguments (a ``Field(description=...)`` wins). A first
    parameter typed ``ToolContext`` is not an argument: it receives the call's context.

    A plain function runs in a thread; a coroutine function on the worker's event loop, where a
    cancel reaches it as ``asyncio.CancelledError``. It returns text, ``ToolContent`` (text and
    images), or anything pydantic serialises (a model, a dict, a list), which the model gets as
    JSON. ``ToolFailure`` raised in it is shown to the model as the tool's error; any other
    exception fails the activity, which Temporal retries when the tool is idempotent (else the
    model is told the call failed).

    Args:
        function: The function (when used as ``@tool`` without parentheses).
        name: The tool's name; default: the function's. Letters, digits, ``_`` and ``-``, at
            most 64, not starting with ``mcp__``.
        description: The description; default: the docstring's.
        read_only: Whether the tool only reads (changes nothing anywhere); such a tool is
            idempotent unless ``idempotent`` says otherwise.
        idempotent: Whether running a call twice is harmless: the activity is then retried after
            an unexpected error. Default: ``read_only``.
        permission_target: The argument permission rules match (``name(pattern)``); it must be a
            string. Default: none, so rules name the tool alone.
        target_is_path: Whether that argument is a workspace path: normalised before matching
            and judged again with links resolved, as the file tools' are. Default: whether its
            type hint is ``Path``.

    Returns:
        The tool (``@tool``), or a decorator making it (``@tool(...)``).

    Raises:
        ToolDefinitionError: The function cannot be a tool (``*args``, a type hint that does not
            resolve, a bad name, a permission target that is not a string argument, …).
    """

    def make(fn: Callable[P, R]) -> FunctionTool[P, R]:
        tool_name = name if name is not None else getattr(fn, "__name__", "")
        check_name(tool_name)
        if inspect.isasyncgenfunction(fn) or inspect.isgeneratorfunction(fn):
            raise ToolDefinitionError(
                f"tool {tool_name!r}: a generator cannot be a tool; return the result whole"
            )
        try:
            signature = inspect.signature(fn)
            hints = get_type_hints(fn, include_extras=True)
        except (NameError, TypeError, ValueError) as exc:
            raise ToolDefinitionError(f"tool {tool_name!r}: its signature cannot be read: {exc}") from None
        params = list(signature.parameters.values())
        takes_context = bool(params) and _is_context(hints.get(params[0].name))
        if takes_context:
            params = params[1:]
        summary, described = parse_docstring(inspect.getdoc(fn) or "")
        fields: dict[str, Any] = {}
        for param in params:
            if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
                raise ToolDefinitionError(
                    f"tool {tool_name!r}: *{param.name} cannot be offered; name each argument"
                )
            if _is_context(hints.get(param.name)):
                raise ToolDefinitionError(f"tool {tool_name!r}: ToolContext must be the first parameter")
            if param.name.startswith("_"):
                raise ToolDefinitionError(f"tool {tool_name!r}: argument {param.name!r} starts with '_'")
            annotation = hints.get(param.name, Any)
            fields[param.name] = (annotation, _field(param, annotation, described.get(param.name)))
        try:
            args: type[ToolArgs] = create_model(
                f"{_camel(tool_name)}Args", __base__=FunctionArgs, __module__=fn.__module__, **fields
            )
            schema = args.model_json_schema()
        except Exception as exc:  # pydantic's errors for a type it cannot validate or describe
            raise ToolDefinitionError(
                f"tool {tool_name!r}: its arguments cannot be described: {exc}"
            ) from None
        is_path = target_is_path
        if permission_target is not None:
            is_path = _check_target(tool_name, permission_target, schema, hints, target_is_path)
        spec = ToolSpec(
            tool_name,
            description if description is not None else summary,
            args,
            permission_target,
            target_is_path=bool(is_path),
            repeatable=read_only if idempotent is None else idempotent,
            read_only=read_only,
        )
        return FunctionTool(spec, _runner(fn, tool_name, params, takes_context), fn, read_only)

    return make if function is None else make(function)


def check_name(name: str) -> None:
    """Refuse (``ToolDefinitionError``) a name a provider or a permission rule cannot take, or
    one of the names MCP servers' tools are offered by."""
    if not _NAME.fullmatch(name):
        raise ToolDefinitionError(
            f"tool name {name!r}: use letters, digits, '_' and '-' (at most {TOOL_NAME_MAX}), "
            "starting with a letter or '_'"
        )
    if name.lower().startswith(MCP_PREFIX):
        raise ToolDefinitionError(
            f"tool name {name!r}: names starting with {MCP_PREFIX!r} are MCP servers' tools"
        )


def added_tools(tools: Iterable[Tool | Callable[..., Any]], taken: Iterable[str]) -> dict[str, Tool]:
    """The tools a host adds beside ``taken`` (the built-in ones), by name; a plain function is
    made a tool with ``tool``'s defaults.

    Args:
        tools: Tools (``@tool`` functions, or ``Tool`` objects) and plain functions.
        taken: The names already in the worker's table.

    Returns:
        The added tools by name.

    Raises:
        ToolDefinitionError: A function cannot be a tool, or a name is taken (by a built-in
            tool, another tool given, or MCP servers' ``mcp__`` names), ignoring case: the
            permission rules do.
    """
    reserved = {n.lower(): n for n in taken}
    out: dict[str, Tool] = {}
    for given in tools:
        added = given if isinstance(given, Tool) else tool(given)
        name = added.spec.name
        check_name(name)
        if name.lower() in reserved:
            raise ToolDefinitionError(
                f"tool {name!r}: the built-in tool {reserved[name.lower()]!r} has that name; give yours "
                "another (tool(name=...))"
            )
        if any(n.lower() == name.lower() for n in out):
            raise ToolDefinitionError(f"tool {name!r} is given twice")
        out[name] = added
    return out


def with_tools(builtin: Mapping[str, Tool], tools: Iterable[Tool | Callable[..., Any]]) -> dict[str, Tool]:
    """``builtin`` and the tools a host adds (``added_tools``) in one table."""
    return {**builtin, **added_tools(tools, builtin)}


def parse_docstring(doc: str) -> tuple[str, dict[str, str]]:
    """A Google-style docstring's description (its text before the first section) and its
    ``Args:`` entries by name (continuation lines joined)."""
    lines = doc.splitlines()
    description: list[str] = []
    args: dict[str, str] = {}
    section: str | None = None
    current: str | None = None
    indent: int | None = None
    for line in lines:
        header = _SECTION.match(line)
        if header and not line.startswith((" ", "\t")):
            section, current, indent = header.group(1).strip().lower(), None, None
            continue
        if section is None:
            description.append(line)
            continue
        if section not in _ARGS_SECTIONS or not line.strip():
            continue
        depth = len(line) - len(line.lstrip())
        if indent is None:
            indent = depth
        entry = _ARG_LINE.match(line.strip()) if depth <= indent else None
        if entry:
            current = entry.group(1)
            args[current] = entry.group(2).strip()
        elif current is not None:
            args[current] = f"{args[current]} {line.strip()}".strip()
    return "\n".join(description).strip(), args


def _is_context(annotation: Any) -> bool:
    if get_origin(annotation) is Annotated:
        annotation = get_args(annotation)[0]
    return isinstance(annotation, type) and issubclass(annotation, ToolContext)


def _field(param: inspect.Parameter, annotation: Any, doc: str | None) -> FieldInfo:
    """The argument's field: its default, and the docstring's description where the hints give none."""
    default = param.default
    if isinstance(default, FieldInfo):
        if doc and default.description is None:
            return FieldInfo.merge_field_infos(default, description=doc)
        return default
    described = get_origin(annotation) is Annotated and any(
        isinstance(m, FieldInfo) and m.description for m in get_args(annotation)[1:]
    )
    extra: dict[str, Any] = {"description": doc} if doc and not described else {}
    value: Any = ... if default is param.empty else default
    result: FieldInfo = Field(value, **extra)
    return result


def _check_target(
    name: str, target: str, schema: dict[str, Any], hints: dict[str, Any], is_path: bool | None
) -> bool:
    """Whether the permission target is a path; ``ToolDefinitionError`` if it is no string argument."""
    field = schema.get("properties", {}).get(target)
    if field is None:
        raise ToolDefinitionError(f"tool {name!r}: permission_target {target!r} is not one of its arguments")
    if field.get("type") != "string":
        raise ToolDefinitionError(
            f"tool {name!r}: permission_target {target!r} must be a string argument (rules match text)"
        )
    if is_path is not None:
        return is_path
    hint = hints.get(target)
    if get_origin(hint) is Annotated:
        hint = get_args(hint)[0]
    return isinstance(hint, type) and issubclass(hint, PurePath)


def _runner(
    function: Callable[..., Any], name: str, params: list[inspect.Parameter], takes_context: bool
) -> ToolImpl:
    """The tool's ``run(args, workspace)``: the function called with the validated arguments."""
    # a coroutine function, or an object whose ``__call__`` is one
    is_async = inspect.iscoroutinefunction(function) or inspect.iscoroutinefunction(type(function).__call__)

    def arguments(args: Any, workspace: Path) -> tuple[list[Any], dict[str, Any]]:
        positional: list[Any] = [context(workspace, name)] if takes_context else []
        keywords: dict[str, Any] = {}
        for param in params:
            value = getattr(args, param.name)
            if param.kind is param.POSITIONAL_ONLY:
                positional.append(value)
            else:
                keywords[param.name] = value
        return positional, keywords

    def call_blocking(args: Any, workspace: Path) -> Any:
        positional, keywords = arguments(args, workspace)
        return function(*positional, **keywords)

    blocking = threaded(call_blocking)

    async def run(args: Any, workspace: Path) -> str | ToolContent:
        if is_async:
            positional, keywords = arguments(args, workspace)
            result = function(*positional, **keywords)
        else:
            result = await blocking(args, workspace)
        if inspect.isawaitable(result):  # a plain function that hands back a coroutine
            result = await result
        return tool_result(result)

    return run


def context(workspace: Path, name: str) -> ToolContext:
    """The context of the call the tool activity runs (empty ids outside one: a test's call)."""
    call = CURRENT_CALL.get()
    return ToolContext(
        workspace=workspace,
        run_id=call.run_id if call is not None else "",
        call_id=call.call_id if call is not None else "",
        tool=name,
    )


def tool_result(result: Any) -> str | ToolContent:
    """A function's result as the model gets it: text as it is, anything else as JSON."""
    if isinstance(result, str | ToolContent):
        return result
    return to_json(result).decode()


def _camel(name: str) -> str:
    return "".join(part[:1].upper() + part[1:] for part in re.split(r"[_-]+", name)) or "Tool"
