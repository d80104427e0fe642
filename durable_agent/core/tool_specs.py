"""Tool definitions: the pure half of the tool set.

The workflow uses this module to offer tools, to validate a call's arguments
and to find what a call touches for the permission check; the activities in
``activities/tools*.py`` run them. The argument models and limits are in
``durable_agent.core.tool_args``; the built-in tools' definitions, and what a
repeat of each does, in ``durable_agent.core.builtin_catalog``.
"""

from __future__ import annotations

import copy
import functools
import posixpath
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import ConfigDict, ValidationError

from durable_agent.core.canonical import digest_of
from durable_agent.core.capability_binding import CapabilityBinding
from durable_agent.core.errors import DurableAgentError, validation_message
from durable_agent.core.models import InstructionFile, Sparse, ToolDefinition
from durable_agent.core.patch_format import PatchError, parse_patch, patch_paths
from durable_agent.core.permissions import DOMAIN_PREFIX, DOMAIN_TOOLS, PermissionPolicy
from durable_agent.core.tool_args import ToolArgs, url_host

# The generation of the built-in catalog as shipped (``catalog_generation``).
BUILTIN_CATALOG_GENERATION = 0
# Tools of MCP servers are offered as ``mcp__SERVER__TOOL``.
MCP_PREFIX = "mcp__"
_OFFERED_NAME = re.compile(r"[^A-Za-z0-9_-]")
# Providers take tool names of at most 64 characters of ``[A-Za-z0-9_-]``.
TOOL_NAME_MAX = 64


def mcp_tool_name(server: str, tool: str) -> str:
    """The name the model is offered an MCP server's tool by: ``mcp__SERVER__TOOL``, with
    characters providers refuse made ``_`` and a long name cut, a digest of the whole kept."""
    name = f"{MCP_PREFIX}{server}__{_OFFERED_NAME.sub('_', tool)}"
    if len(name) <= TOOL_NAME_MAX and _OFFERED_NAME.sub("_", tool) == tool:
        return name
    tail = digest_of([server, tool]).partition(":")[2][:8]
    return f"{name[: TOOL_NAME_MAX - 9]}_{tail}"


@dataclass(frozen=True)
class ToolSpec:
    """A tool's offer to the model and how the permission check sees a call."""

    name: str
    description: str
    args: type[ToolArgs]
    # The argument the permission pattern is matched against (None: the tool name alone).
    target_arg: str | None
    # Whether that argument is a path, normalised before matching (a command or a regex is not).
    target_is_path: bool = True
    # What the target argument holds: the one target (``value``), or a patch in the apply_patch
    # format whose every path is a target, each judged (``patch``; see ``permission_targets``).
    targets_from: TargetsFrom = "value"
    # Whether running a call twice is harmless. A tool that is not (bash) is not retried after an
    # unexpected error of ours; a worker crash still runs the call again (Temporal: at least once).
    repeatable: bool = True
    # The arguments' JSON schema as another program gave it (an MCP server's tool), for a tool
    # whose ``args`` is ``JsonArgs``: offered as it is, and checked only for its shape here
    # (the program checks the rest).
    schema: dict[str, Any] | None = None
    # Answered by the workflow itself, without an activity (``todo_write``): it changes nothing
    # outside the run, and only the deny rules apply to it (``in_workflow_policy``).
    in_workflow: bool = False
    # Whether a call only reads (changes nothing anywhere): the calls of one answer to such
    # tools may run together (``ToolOffer.parallel``).
    read_only: bool = False
    # Whether a call only reads the workspace and is done in moments (``read``, ``ls``, ``glob``,
    # ``grep``): it may run as a local activity, within the workflow task (``ToolOffer.local``).
    quick: bool = False

    def offer(self, *, parallel: bool | None = None, local: bool = False) -> ToolOffer:
        """The tool as the workflow offers it to the model.

        Args:
            parallel: whether its calls may run together with the answer's other such calls
                (default: whether the tool only reads).
            local: whether its calls run as local activities (only a ``quick`` tool's do).

        Returns:
            The offer.
        """
        schema = dict(self.schema) if self.schema is not None else copy.deepcopy(_args_schema(self.args))
        definition = ToolDefinition(name=self.name, description=self.description, input_schema=schema)
        return ToolOffer(
            definition=definition,
            target_arg=self.target_arg,
            target_is_path=self.target_is_path,
            targets_from=self.targets_from,
            in_workflow=self.in_workflow,
            parallel=self.read_only if parallel is None else parallel,
            local=local and self.quick,
            read_only=self.read_only,
        )


@functools.cache
def _args_schema(args: type[ToolArgs]) -> dict[str, Any]:
    """An argument model's JSON schema, made once a worker process: pydantic builds it anew on
    each call, and every run's plan offers every tool (a tenth of a burst of starts' time).
    Callers copy it; the model classes do not change once defined."""
    schema = args.model_json_schema()
    # The model's docstring is for developers; the model reads ``description``.
    schema.pop("title", None)
    schema.pop("description", None)
    return schema


TargetsFrom = Literal["value", "patch"]


class ToolOffer(Sparse):
    """A tool as the workflow knows it: its definition and its permission target."""

    definition: ToolDefinition
    target_arg: str | None = None
    # Defaults to True so plans recorded before the field existed replay as they ran.
    target_is_path: bool = True
    # See ``ToolSpec.targets_from``; left out of the JSON for ``value``, so a plan keeps its bytes.
    targets_from: TargetsFrom = "value"
    # See ``ToolSpec.in_workflow``; left out of the JSON when False. The workflow answers a call
    # itself only where the run's plan says so, so a run whose plan never did (recorded before
    # ``todo_write``, or a host's own tool of that name) replays as it ran.
    in_workflow: bool = False
    # Whether its calls may run together with the other such calls of one answer (a tool that
    # only reads, or one the worker's ``[tools] parallel`` names; ``workflows/call_batch.py``).
    # False in plans made before the field existed, so their runs replay one call at a time;
    # left out of the JSON when False.
    parallel: bool = False
    # Whether its calls run as local activities: on the worker within the workflow task, with no
    # task queue round trip and no activity events (``workflows/tool_step.py``; the worker's
    # ``[tools] local_calls``). False in plans made before the field existed, so their runs
    # replay with ordinary activities; left out of the JSON when False.
    local: bool = False
    # Whether the tool only reads (``ToolSpec.read_only``): a child run offered only such tools
    # shares its parent's workspace instead of a copy of its own (``workflows/child_runs.py``).
    # False in plans made before the field existed; left out of the JSON when False.
    read_only: bool = False

    left_out_at_default = ("targets_from", "in_workflow", "parallel", "local", "read_only")


def permission_targets(
    offer: ToolOffer, arguments: dict[str, Any], workspace: str | None = None
) -> tuple[str | None, ...]:
    """Everything the call touches, as the rules see it: each is decided, the strictest wins.

    For most tools the one ``permission_target``. For a tool whose target
    argument is a patch (``targets_from == "patch"``), every path the patch
    names, a move's destination included, each normalised as ``permission_target``
    normalises a path; a patch that does not parse is a ``ToolCallError`` naming the line.

    Args:
        offer: the tool as offered.
        arguments: the call's arguments.
        workspace: the run's workspace (an absolute path inside it is made relative).

    Returns:
        The targets, at least one (``None`` for a tool without a target).
    """
    if offer.targets_from == "value" or offer.target_arg is None:
        return (permission_target(offer, arguments, workspace),)
    value = arguments.get(offer.target_arg)
    value = _target_text(offer, value)
    try:
        paths = patch_paths(parse_patch(value))
    except PatchError as exc:
        raise ToolCallError(f"invalid arguments for {offer.definition.name!r}: {exc}") from None
    return tuple(dict.fromkeys(_normal_path(path, workspace) for path in paths))


def _target_text(offer: ToolOffer, value: Any) -> str:
    """The target argument's value, or ``ToolCallError`` when it is not a non-empty string."""
    if not isinstance(value, str) or not value:
        raise ToolCallError(
            f"invalid arguments for {offer.definition.name!r}: {offer.target_arg} must be a non-empty string"
        )
    return value


def _normal_path(value: str, workspace: str | None) -> str:
    """A path as the rules see it: normalised, and relative when absolute inside ``workspace``."""
    path = posixpath.normpath(value)
    if path.startswith("/") and workspace:
        root = posixpath.normpath(workspace)
        if path == root or path.startswith(root.rstrip("/") + "/"):
            return posixpath.relpath(path, root)
    return path


def permission_target(
    offer: ToolOffer, arguments: dict[str, Any], workspace: str | None = None
) -> str | None:
    """What the call touches, as the rules see it; ``ToolCallError`` if it is not a string.

    A path is normalised, and an absolute one inside ``workspace`` is made
    relative to it, so ``edit(src/**)`` covers ``/repo/src/a.py`` as it covers
    ``src/a.py``. (Lexically: links are the tools' business, which refuse
    anything that resolves outside.) A URL (``web_fetch``) is its host,
    ``domain:HOST`` (``tool_args.url_host``).
    """
    if offer.target_arg is None:
        return None
    if offer.targets_from != "value":
        # fail closed: one target cannot stand for several (``permission_targets`` gives each)
        raise ToolCallError(f"{offer.definition.name!r} touches several paths; each must be judged")
    value = arguments.get(offer.target_arg)
    if value is None:
        field = offer.definition.input_schema.get("properties", {}).get(offer.target_arg, {})
        value = field.get("default")
    value = _target_text(offer, value)
    if offer.definition.name.lower() in DOMAIN_TOOLS:
        try:
            return DOMAIN_PREFIX + url_host(value)
        except ValueError as exc:
            raise ToolCallError(f"invalid arguments for {offer.definition.name!r}: url: {exc}") from None
    if not offer.target_is_path:
        return value
    return _normal_path(value, workspace)


class ToolCallError(DurableAgentError, ValueError):
    """A call the model made that cannot run; its message is shown to the model."""


def find_offer(offers: Iterable[ToolOffer], name: str) -> ToolOffer:
    """The offered tool called ``name``, or ``ToolCallError`` naming what is offered."""
    by_name = {o.definition.name: o for o in offers}
    if name not in by_name:
        offered = ", ".join(sorted(by_name)) or "none"
        raise ToolCallError(f"unknown tool {name!r}; the tools offered are: {offered}")
    return by_name[name]


class JsonArgs(ToolArgs):
    """The arguments of a tool known by a JSON schema (``ToolSpec.schema``): kept as given."""

    model_config = ConfigDict(extra="allow", frozen=True)

    def given(self) -> dict[str, Any]:
        return dict(self.model_extra or {})


def validate_args(spec: ToolSpec, arguments: dict[str, Any]) -> ToolArgs:
    """Validate a call's arguments against the tool's model, or raise ``ToolCallError``."""
    name = spec.name
    if spec.schema is not None:
        missing = [k for k in spec.schema.get("required", ()) if k not in arguments]
        if missing:
            raise ToolCallError(f"invalid arguments for {name!r}: missing {', '.join(map(str, missing))}")
        return JsonArgs.model_validate(arguments)
    try:
        return spec.args.model_validate(arguments)
    except ValidationError as exc:
        raise ToolCallError(f"invalid arguments for {name!r}: {validation_message(exc)}") from None


def in_workflow_policy(policy: PermissionPolicy) -> PermissionPolicy:
    """The rules as they apply to a tool the workflow answers itself (``ToolSpec.in_workflow``):
    its deny rules only. Such a tool touches nothing outside the run, so it is allowed whatever
    ``default`` and the ask rules say; a deny rule naming it (``todo_write``, ``*``) turns it off."""
    return PermissionPolicy(
        deny=policy.deny, default="allow", within=tuple(in_workflow_policy(p) for p in policy.within)
    )


def offered_tools(specs: Iterable[ToolSpec], policy: PermissionPolicy) -> list[ToolSpec]:
    """The tools the model is shown: every tool not denied outright, by name."""

    def denied(spec: ToolSpec) -> bool:
        rules = in_workflow_policy(policy) if spec.in_workflow else policy
        return rules.denies_outright(spec.name)

    return sorted((s for s in specs if not denied(s)), key=lambda s: s.name)


def catalog_generation(definitions: Iterable[ToolDefinition]) -> int:
    """The generation of the catalog ``definitions`` make: ``BUILTIN_CATALOG_GENERATION`` for the
    tools a worker ships with; with tools of MCP servers, a number taken from those tools'
    definitions, so it changes when a server's tool list does, and is the same on every worker
    that sees the same servers."""
    found = sorted((d for d in definitions if d.name.startswith(MCP_PREFIX)), key=lambda d: d.name)
    if not found:
        return BUILTIN_CATALOG_GENERATION
    digest = digest_of([d.model_dump(mode="json") for d in found]).partition(":")[2]
    return int(digest[:8], 16) or 1


def capability_binding(
    definitions: Iterable[ToolDefinition],
    policy: PermissionPolicy,
    instruction_files: Sequence[InstructionFile] = (),
) -> CapabilityBinding:
    """Pin the offered tools, the rules in force and the project instruction files read, per
    the checkpoint contract.

    Args:
        definitions: The tools offered to the model.
        policy: The run's permission rules.
        instruction_files: The project instruction files in the run's system prompt.

    Returns:
        The binding; its digest covers the instruction files only when there are some, so a
        run without them has the binding (and digest) it had before they were read.
    """
    ordered = sorted(definitions, key=lambda d: d.name)
    catalog: dict[str, Any] = {
        "tools": [d.model_dump(mode="json") for d in ordered],
        "permissions": policy.model_dump(mode="json"),
    }
    if instruction_files:
        catalog["instruction_files"] = [f.model_dump(mode="json") for f in instruction_files]
    return CapabilityBinding(
        catalog_generation=catalog_generation(ordered),
        catalog_digest=digest_of(catalog),
        tools=tuple(d.name for d in ordered),
        permissions=policy,
        instruction_files=tuple(instruction_files),
    )


__all__ = [
    "MCP_PREFIX",
    "JsonArgs",
    "ToolArgs",
    "ToolCallError",
    "ToolOffer",
    "ToolSpec",
    "capability_binding",
    "catalog_generation",
    "find_offer",
    "in_workflow_policy",
    "mcp_tool_name",
    "offered_tools",
    "permission_target",
    "permission_targets",
    "validate_args",
]
