"""Tool definitions: the pure half of the tool set.

The workflow uses this module to offer tools, to validate a call's arguments
and to find what a call touches for the permission check; the activities in
``activities/tools*.py`` run them. The argument models and limits are in
``durable_agent.core.tool_args``.

Temporal runs an activity at least once, so a tool call may run again after a
worker crash. What a repeat of each built-in tool does:

- ``read``, ``ls``, ``glob``, ``grep`` only read: a repeat changes nothing and
  answers from the files as they are then.
- ``write`` writes the same content again: harmless, and the result says the
  file already had that content.
- ``edit``: when ``old_string`` no longer occurs outside a copy of
  ``new_string`` and ``new_string`` is in the file, the edit is reported as
  already applied and nothing changes; so a repeat neither fails nor applies
  the edit twice, even when ``new_string`` contains ``old_string``. The one
  exception is a repeated deletion (empty ``new_string``): it fails as "not
  found", since nothing in the file shows the deletion was done.
- ``bash`` runs the command again. Commands that are not safe to repeat
  should be asked for (``ask``) or kept out of the ``allow`` rules.
"""

from __future__ import annotations

import posixpath
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from pydantic import ConfigDict, ValidationError

from durable_agent.core.canonical import digest_of
from durable_agent.core.errors import DurableAgentError, validation_message
from durable_agent.core.export import CapabilityBinding
from durable_agent.core.models import Frozen, ToolDefinition
from durable_agent.core.permissions import PermissionPolicy
from durable_agent.core.tool_args import (
    BASH_DEFAULT_TIMEOUT,
    BASH_MAX_TIMEOUT,
    BASH_OUTPUT_HEAD_BYTES,
    BASH_OUTPUT_TAIL_BYTES,
    GLOB_MAX_RESULTS,
    GREP_MAX_FILE_BYTES,
    GREP_MAX_LINE_CHARS,
    GREP_MAX_MATCHES,
    LS_MAX_ENTRIES,
    READ_MAX_BYTES,
    READ_MAX_LINE_CHARS,
    BashArgs,
    EditArgs,
    GlobArgs,
    GrepArgs,
    LsArgs,
    ReadArgs,
    ToolArgs,
    WriteArgs,
)

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
    # Whether running a call twice is harmless. A tool that is not (bash) is not retried after an
    # unexpected error of ours; a worker crash still runs the call again (Temporal: at least once).
    repeatable: bool = True
    # The arguments' JSON schema as another program gave it (an MCP server's tool), for a tool
    # whose ``args`` is ``JsonArgs``: offered as it is, and checked only for its shape here
    # (the program checks the rest).
    schema: dict[str, Any] | None = None

    def offer(self) -> ToolOffer:
        """The tool as the workflow offers it to the model."""
        if self.schema is not None:
            schema = dict(self.schema)
        else:
            schema = self.args.model_json_schema()
            # The model's docstring is for developers; the model reads ``description``.
            schema.pop("title", None)
            schema.pop("description", None)
        definition = ToolDefinition(name=self.name, description=self.description, input_schema=schema)
        return ToolOffer(
            definition=definition, target_arg=self.target_arg, target_is_path=self.target_is_path
        )


class ToolOffer(Frozen):
    """A tool as the workflow knows it: its definition and its permission target."""

    definition: ToolDefinition
    target_arg: str | None = None
    # Defaults to True so plans recorded before the field existed replay as they ran.
    target_is_path: bool = True


def permission_target(
    offer: ToolOffer, arguments: dict[str, Any], workspace: str | None = None
) -> str | None:
    """What the call touches, as the rules see it; ``ToolCallError`` if it is not a string.

    A path is normalised, and an absolute one inside ``workspace`` is made
    relative to it, so ``edit(src/**)`` covers ``/repo/src/a.py`` as it covers
    ``src/a.py``. (Lexically: links are the tools' business, which refuse
    anything that resolves outside.)
    """
    if offer.target_arg is None:
        return None
    value = arguments.get(offer.target_arg)
    if value is None:
        field = offer.definition.input_schema.get("properties", {}).get(offer.target_arg, {})
        value = field.get("default")
    if not isinstance(value, str) or not value:
        raise ToolCallError(
            f"invalid arguments for {offer.definition.name!r}: {offer.target_arg} must be a non-empty string"
        )
    if not offer.target_is_path:
        return value
    path = posixpath.normpath(value)
    if path.startswith("/") and workspace:
        root = posixpath.normpath(workspace)
        if path == root or path.startswith(root.rstrip("/") + "/"):
            return posixpath.relpath(path, root)
    return path


_REPEAT_READS = "Only reads, so it is safe to repeat."

BUILTIN_TOOLS: dict[str, ToolSpec] = {
    spec.name: spec
    for spec in (
        ToolSpec(
            "read",
            "Read a text file in the workspace. Returns its lines numbered from 1; `offset` (0-based) "
            f"and `limit` select lines. Output stops at {READ_MAX_BYTES} bytes and lines longer than "
            f"{READ_MAX_LINE_CHARS} characters are cut, with a note saying how to read on. A binary "
            f"file is reported, not shown. {_REPEAT_READS}",
            ReadArgs,
            "file_path",
        ),
        ToolSpec(
            "ls",
            "List a folder in the workspace: one entry a line, with its kind and size "
            f"(at most {LS_MAX_ENTRIES} entries). {_REPEAT_READS}",
            LsArgs,
            "path",
        ),
        ToolSpec(
            "write",
            "Create or overwrite a file in the workspace with `content` (UTF-8), creating missing "
            "parent folders. Says how many bytes were written and whether the file was created or "
            "replaced. Prefer `edit` for changing part of an existing file. Writing the same content "
            "again changes nothing.",
            WriteArgs,
            "file_path",
        ),
        ToolSpec(
            "edit",
            "Replace `old_string` with `new_string` in a file in the workspace. `old_string` must "
            "match the file exactly, whitespace included, and occur exactly once (add surrounding "
            "lines to make it unique), unless `replace_all` is true. When `old_string` no longer "
            "occurs (other than inside `new_string`) and `new_string` does, the edit is reported as "
            "already applied and nothing changes.",
            EditArgs,
            "file_path",
        ),
        ToolSpec(
            "glob",
            "Find files and folders in the workspace whose path matches a glob: `*` and `?` stay "
            "within one folder, `**` spans folders, `[abc]` and `{a,b}` work. Paths are relative to "
            f"the workspace, sorted, folders end in `/`; at most {GLOB_MAX_RESULTS}. .git, .hg and .svn "
            f"folders are not searched, nor links leading out of the workspace. {_REPEAT_READS}",
            GlobArgs,
            "pattern",
        ),
        ToolSpec(
            "grep",
            "Search text files in the workspace for a regular expression in RE2 syntax (no "
            "backreferences, no lookahead or lookbehind), line by line. "
            "`path` limits the search to a folder or a file, `glob` to matching files. Results are "
            f"`file:line: text`, at most {GREP_MAX_MATCHES}, lines cut at {GREP_MAX_LINE_CHARS} "
            f"characters; binary files and files over {GREP_MAX_FILE_BYTES // (1024 * 1024)} MB are "
            f"skipped. {_REPEAT_READS}",
            GrepArgs,
            "pattern",
            target_is_path=False,
        ),
        ToolSpec(
            "bash",
            "Run a command with /bin/bash -c in the workspace folder, stdin empty. Returns stdout and "
            f"stderr together (at most {BASH_OUTPUT_HEAD_BYTES + BASH_OUTPUT_TAIL_BYTES} bytes: the "
            "start and the end are kept) and the exit code. `timeout_seconds` (default "
            f"{BASH_DEFAULT_TIMEOUT}, at most {BASH_MAX_TIMEOUT}) stops the command and every process "
            "it started; processes still running when the command ends are stopped as well. The "
            "environment is minimal: no credentials, HOME is a fresh temporary folder. A repeated "
            "call runs the command again.",
            BashArgs,
            "command",
            target_is_path=False,
            repeatable=False,
        ),
    )
}


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


def offered_tools(specs: Iterable[ToolSpec], policy: PermissionPolicy) -> list[ToolSpec]:
    """The tools the model is shown: every tool not denied outright, by name."""
    return sorted((s for s in specs if not policy.denies_outright(s.name)), key=lambda s: s.name)


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


def capability_binding(definitions: Iterable[ToolDefinition], policy: PermissionPolicy) -> CapabilityBinding:
    """Pin the offered tools and the rules in force, per the checkpoint contract."""
    ordered = sorted(definitions, key=lambda d: d.name)
    catalog = {
        "tools": [d.model_dump(mode="json") for d in ordered],
        "permissions": policy.model_dump(mode="json"),
    }
    return CapabilityBinding(
        catalog_generation=catalog_generation(ordered),
        catalog_digest=digest_of(catalog),
        tools=tuple(d.name for d in ordered),
        permissions=policy,
    )


__all__ = [
    "BUILTIN_TOOLS",
    "MCP_PREFIX",
    "BashArgs",
    "EditArgs",
    "GlobArgs",
    "GrepArgs",
    "JsonArgs",
    "LsArgs",
    "ReadArgs",
    "ToolArgs",
    "ToolCallError",
    "ToolOffer",
    "ToolSpec",
    "WriteArgs",
    "capability_binding",
    "catalog_generation",
    "find_offer",
    "mcp_tool_name",
    "offered_tools",
    "permission_target",
    "validate_args",
]
