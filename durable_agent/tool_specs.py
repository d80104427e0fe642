"""Tool definitions and argument models: the pure half of the tool set.

The workflow uses this module to offer tools, to validate a call's arguments
and to find what a call touches for the permission check; the activities in
``activities/tools.py`` run them.
"""

from __future__ import annotations

import posixpath
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from durable_agent.canonical import digest_of
from durable_agent.checkpoint import CapabilityBinding
from durable_agent.errors import validation_message
from durable_agent.models import Frozen, ToolDefinition
from durable_agent.permissions import PermissionPolicy

# Bumped whenever the set of tools offered changes at run time (not yet done).
BUILTIN_CATALOG_GENERATION = 0


class ToolArgs(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ReadArgs(ToolArgs):
    file_path: str = Field(min_length=1, description="Path of the file, relative to the workspace.")
    offset: int = Field(0, ge=0, description="First line to return, 0-based.")
    limit: int | None = Field(None, ge=1, description="How many lines to return at most.")


class LsArgs(ToolArgs):
    path: str = Field(".", min_length=1, description="Folder to list, relative to the workspace.")


@dataclass(frozen=True)
class ToolSpec:
    """A tool's offer to the model and how the permission check sees a call."""

    name: str
    description: str
    args: type[ToolArgs]
    # The argument the permission pattern is matched against (None: the tool name alone).
    target_arg: str | None

    def offer(self) -> ToolOffer:
        schema = self.args.model_json_schema()
        schema.pop("title", None)
        definition = ToolDefinition(name=self.name, description=self.description, input_schema=schema)
        return ToolOffer(definition=definition, target_arg=self.target_arg)


class ToolOffer(Frozen):
    """A tool as the workflow knows it: its definition and its permission target."""

    definition: ToolDefinition
    target_arg: str | None = None


def permission_target(offer: ToolOffer, arguments: dict[str, Any]) -> str | None:
    """What the call touches, normalised; raise ``ToolCallError`` if it is not a string."""
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
    return value if value.startswith("/") else posixpath.normpath(value)


BUILTIN_TOOLS: dict[str, ToolSpec] = {
    spec.name: spec
    for spec in (
        ToolSpec(
            "read",
            "Read a text file in the workspace. Returns its lines numbered from 1.",
            ReadArgs,
            "file_path",
        ),
        ToolSpec(
            "ls",
            "List a folder in the workspace: one entry a line, with its kind and size.",
            LsArgs,
            "path",
        ),
    )
}


class ToolCallError(ValueError):
    """A call the model made that cannot run; its message is shown to the model."""


def find_offer(offers: Iterable[ToolOffer], name: str) -> ToolOffer:
    """The offered tool called ``name``, or ``ToolCallError`` naming what is offered."""
    by_name = {o.definition.name: o for o in offers}
    if name not in by_name:
        offered = ", ".join(sorted(by_name)) or "none"
        raise ToolCallError(f"unknown tool {name!r}; the tools offered are: {offered}")
    return by_name[name]


def validate_args(spec: ToolSpec, arguments: dict[str, Any]) -> ToolArgs:
    """Validate a call's arguments against the tool's model, or raise ``ToolCallError``."""
    name = spec.name
    try:
        return spec.args.model_validate(arguments)
    except ValidationError as exc:
        raise ToolCallError(f"invalid arguments for {name!r}: {validation_message(exc)}") from None


def offered_tools(specs: Iterable[ToolSpec], policy: PermissionPolicy) -> list[ToolSpec]:
    """The tools the model is shown: every tool not denied outright, by name."""
    return sorted((s for s in specs if not policy.denies_outright(s.name)), key=lambda s: s.name)


def capability_binding(definitions: Iterable[ToolDefinition], policy: PermissionPolicy) -> CapabilityBinding:
    """Pin the offered tools and the rules in force, per the checkpoint contract."""
    catalog = {
        "tools": [d.model_dump(mode="json") for d in sorted(definitions, key=lambda d: d.name)],
        "permissions": policy.model_dump(mode="json"),
    }
    return CapabilityBinding(catalog_generation=BUILTIN_CATALOG_GENERATION, catalog_digest=digest_of(catalog))
