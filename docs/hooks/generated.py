"""MkDocs hook: the parts of pages generated when the site is built, from the code and the README.

- ``<!-- config-reference -->`` (``configuration.md``) becomes a table per section of the
  worker's TOML config: every key of ``AgentConfig`` and of the models beneath it (provider
  kinds, ``ModelSettings``, store and sink kinds, ``[permissions]``, ``[timeouts]``,
  ``[limits]``, ``[sandbox]``, ``[context]``, ``[codec]``, ``[mcp.NAME]`` …), with its type,
  its default, its bounds and what it does: the field's ``description``, else the comments
  written beside it in the model's source, else a line of this file (``FALLBACK``), and the
  model's docstring above its table. What the worker validates is what the page says.
- ``<!-- readme -->`` … ``<!-- /readme -->`` (``index.md``) becomes ``README.md``, so the site's
  home page and the repository's are one text.
- ``<!-- patch-markers -->`` (``architecture.md``) becomes the list of the committed histories
  (``tests/histories/*.json``) that carry each ``workflow.patched`` id's marker.

``tests/test_docs.py`` renders the configuration page with this hook and checks that every
key of every model is in it.
"""

from __future__ import annotations

import ast
import base64
import inspect
import io
import json
import re
import textwrap
import tokenize
import types
import typing
import warnings
from pathlib import Path
from typing import Any

from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

README_MARK = re.compile(r"<!-- readme -->.*?<!-- /readme -->", re.S)
README_ONLY = re.compile(r"<!-- readme-only -->.*?<!-- /readme-only -->\n?", re.S)
CONFIG_MARK = "<!-- config-reference -->"
MARKERS_MARK = "<!-- patch-markers -->"
REPO = Path(__file__).resolve().parents[2]

# What a key does, for the keys whose model says nothing of them (no description, no comment).
FALLBACK: dict[str, dict[str, str]] = {
    "AgentConfig": {
        "default_model": (
            'The model of a run that names none: "provider/model", its provider one of `[providers.NAME]`.'
        ),
        "default_sink": "The export sink of a run that names none: one of `[sinks.NAME]`.",
        "default_workspace": "The workspace of a run that names none: a folder on the worker's machine.",
        "system_prompt": "The system prompt of every run.",
        "max_tool_rounds": (
            "Model steps of a run that may ask for tools; past it the run fails. A run's input may "
            "set its own."
        ),
        "providers": "The model providers, by name: `[providers.NAME]`.",
        "store": "The session store: running runs' logs, staged outputs, ended runs' records.",
        "sinks": "The export sinks, by name: `[sinks.NAME]`.",
        "permissions": "The rules of runs that bring none.",
        "timeouts": "Each activity's timeout and attempts.",
        "limits": "When a run continues as new, where it stops, and what it takes in.",
        "sandbox": "Where the `bash` tool's commands run.",
        "conversation": "Runs started with `follow_ups`.",
        "budgets": "Each run's default budgets.",
        "context": "Context management: compaction before a request past the model's window.",
        "metrics": "The worker's Prometheus endpoint.",
        "telemetry": "What trace spans may hold.",
        "codec": "Payload encryption.",
        "mcp": "MCP servers, by name: `[mcp.NAME]`.",
        "hooks": "Commands run at four moments of every run, each event a list: `[[hooks.EVENT]]`.",
    },
    "ScriptedProviderConfig": {
        "kind": "A provider whose answers come from a file.",
        "script": 'The JSON file of answers: `{"responses": [...]}`, response *n* for the *n*-th model step.',
        "models": 'Per model: `[providers.NAME.models."MODEL"]` (only `attachment` matters here).',
    },
    "ModelSettings": {
        "max_tokens": "The answer's token limit.",
        "temperature": "The sampling temperature (not sent with Anthropic's extended thinking).",
        "headers": "HTTP headers added to the provider's for this model.",
    },
    "HttpProviderConfig": {
        "base_url": "The API's address (`http://` or `https://`).",
        "headers": (
            "HTTP headers sent with every request (`anthropic-beta`, an `anthropic-version` of your own …)."
        ),
        "max_tokens": "The answer's token limit, for all its models (a model's own wins).",
        "temperature": "The sampling temperature, for all its models (a model's own wins).",
        "models": (
            'Per model: `[providers.NAME.models."MODEL"]`, any setting but `base_url` and `timeout_seconds`.'
        ),
    },
    "OpenAIProviderConfig": {
        "kind": "The Chat Completions wire (or, with `api`, OpenAI's Responses API).",
    },
    "AnthropicProviderConfig": {
        "kind": "The Anthropic Messages wire.",
        "api_key_env": (
            "The environment variable that holds the API key; a worker without it refuses to start."
        ),
    },
    "FilesystemStoreConfig": {
        "kind": "The store in a folder of the worker's machine (the default).",
        "path": "The folder.",
    },
    "PostgresStoreConfig": {
        "kind": "The store on PostgreSQL, shared by workers on many machines.",
        "dsn_env": "The environment variable that holds the connection string.",
    },
    "FilesystemSinkConfig": {
        "kind": "Exports in a folder: a manifest per export and content-addressed parts (the default).",
        "path": "The folder: `<path>/<session>/<run>/turn-000001-<digest>.json`.",
    },
    "PostgresSinkConfig": {
        "kind": "Exports in PostgreSQL; `pg:SESSION/RUN/TURN` names one on the command line.",
        "dsn_env": "The environment variable that holds the connection string.",
    },
    "SandboxConfig": {
        "kind": '`"bubblewrap"`: each command in a sandbox of its own; `"none"`: directly on the worker.',
        "network": "Whether the command may use the network (else only a loopback of its own).",
        "writable": "Extra paths the command may write, at the same path inside.",
        "uid": "Who the command is inside its user namespace (never 0).",
        "gid": "Its group inside the user namespace.",
    },
    "BudgetsConfig": {
        "max_total_tokens": "A run's token budget (its own usage, not a resumed export's).",
        "max_cost_usd": "A run's cost budget, at the model's prices; refused for a model without prices.",
    },
    "ContextConfig": {
        "keep_recent": "The newest tool outputs that never leave the model's view.",
        "compaction_model": 'The model that writes the summaries, "provider/model" (unset: the run\'s own).',
    },
    "ConversationConfig": {
        "idle_timeout_seconds": (
            "How long a run with `follow_ups` waits for the next prompt before it completes (unset: "
            "for ever)."
        ),
    },
    "CodecConfig": {
        "keys": (
            "Key id → the environment variable that holds the key (32 bytes, base64). No keys: no encryption."
        ),
        "encrypt_with": "The key id new payloads are encrypted with; every key in `keys` still decrypts.",
    },
    "McpServerConfig": {
        "command": (
            "A stdio server: the program the worker starts (a bare name not on PATH is looked for "
            "beside the worker's Python)."
        ),
        "args": "The program's arguments.",
        "env": (
            "The server's variables: its variable = the worker's variable that holds the value (the "
            "server gets no other)."
        ),
        "cwd": "The program's working folder.",
        "url": "A streamable HTTP server: its address.",
        "headers": "HTTP headers: header = the worker's variable that holds its value.",
    },
    "MetricsConfig": {
        "bind": "Where the worker serves Prometheus metrics, `HOST:PORT` (unset: nowhere).",
    },
    "Timeouts": {
        "model_seconds": "One model call, per attempt.",
        "tool_seconds": "One tool call, per attempt.",
        "checkpoint_max_attempts": "Temporal's tries of a boundary's checkpoint.",
    },
    "Limits": {
        "max_history_bytes": (
            "The safety net: a step that would take the history past this stops the run cleanly, "
            "`failed`, rather than have Temporal terminate it at 50 MB."
        ),
        "max_history_events": "The same, in events (Temporal's limit: 51,200).",
    },
    "PermissionPolicy": {
        "allow": "Rules that allow a call: `tool` or `tool(pattern)`.",
        "deny": "Rules that refuse a call; deny wins over allow.",
        "ask": "Rules that make a call wait for a person's decision; allow wins over ask.",
        "default": "The decision when no rule matches.",
    },
}


class Section(typing.NamedTuple):
    """One table of the page: a TOML table (``[sandbox]``, ``[providers.NAME]`` of one kind)."""

    path: str  # "" for the top level; "providers.NAME", 'providers.NAME.models."MODEL"'
    model: type[BaseModel]
    defaults: BaseModel | None  # the instance the parent's default gives, whose values win
    kind: str | None = None  # the discriminator's value, for a member of a union of kinds
    array: bool = False  # an array of tables (``[[hooks.stop]]``): a list of this model

    @property
    def title(self) -> str:
        if not self.path:
            return "Top level"
        title = f"`[[{self.path}]]`" if self.array else f"`[{self.path}]`"
        return f'{title} with `kind = "{self.kind}"`' if self.kind else title


# --- walking the models --------------------------------------------------------------------


def _strip(annotation: Any) -> Any:
    """The type under ``Annotated`` and ``X | None``."""
    while typing.get_origin(annotation) is typing.Annotated:
        annotation = typing.get_args(annotation)[0]
    if _is_union(annotation):
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        if len(args) == 1:
            return _strip(args[0])
    return annotation


def _is_union(annotation: Any) -> bool:
    return typing.get_origin(annotation) in (typing.Union, types.UnionType)


def _is_model(annotation: Any) -> bool:
    return isinstance(annotation, type) and issubclass(annotation, BaseModel)


def _models_of(annotation: Any) -> list[type[BaseModel]]:
    """The models a value of ``annotation`` is: one, the members of a union of them, or none."""
    annotation = _strip(annotation)
    if _is_model(annotation):
        return [annotation]
    if _is_union(annotation):
        members = [_strip(a) for a in typing.get_args(annotation)]
        if members and all(_is_model(m) for m in members):
            return members
    return []


def _kind(model: type[BaseModel]) -> str | None:
    field = model.model_fields.get("kind")
    if field is None:
        return None
    values = typing.get_args(_strip(field.annotation))
    return str(values[0]) if len(values) == 1 else None


def _placeholder(path: str) -> str:
    return '"MODEL"' if path.endswith("models") else "NAME"


def _value(instance: BaseModel | None, name: str) -> Any:
    """``instance.name``, without the warning a deprecated field gives on reading."""
    if instance is None:
        return None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        return getattr(instance, name, None)


def sections() -> list[Section]:
    """Every table of the config, in the order of the fields, each after its parent."""
    from durable_agent.config import AgentConfig

    found: list[Section] = []

    def visit(section: Section) -> None:
        if any(s.path == section.path and s.model is section.model for s in found):
            return
        found.append(section)
        for name, field in section.model.model_fields.items():
            path = f"{section.path}.{name}" if section.path else name
            annotation = _strip(field.annotation)
            own = _value(section.defaults, name)
            if own is None:
                own = _default(field)
            if typing.get_origin(annotation) is dict:
                value = typing.get_args(annotation)[1]
                members = _models_of(value)
                # ``[agents.NAME]``: tables written beside their parent's keys, not under the field's name
                extra = field.json_schema_extra if isinstance(field.json_schema_extra, dict) else {}
                tables = section.path if extra.get("tables_here") else path
                for member in members:
                    child = f"{tables}.{_placeholder(tables)}"
                    visit(Section(child, member, None, _kind(member) if len(members) > 1 else None))
                continue
            if typing.get_origin(annotation) is tuple and typing.get_args(annotation):
                for member in _models_of(typing.get_args(annotation)[0]):
                    if member is not section.model:  # rules within rules (a subagent's): no table
                        visit(Section(path, member, None, array=True))
                continue
            members = _models_of(annotation)
            for member in members:
                defaults = own if isinstance(own, member) else None
                visit(Section(path, member, defaults, _kind(member) if len(members) > 1 else None))

    visit(Section("", AgentConfig, AgentConfig()))
    return found


# --- what the source says of each field ------------------------------------------------------


def _shares_affix(name: str, other: str) -> bool:
    """Whether two field names belong to one family: a first word in common
    (``max_processes``, ``max_memory_bytes``) or two last words (``…_usd_per_mtok``)."""
    a, b = name.split("_"), other.split("_")
    return a[0] == b[0] or (len(a) > 1 and len(b) > 1 and a[-2:] == b[-2:])


def _comments(model: type[BaseModel]) -> dict[str, str]:
    """The comments beside each field in ``model``'s own source: the lines of comment right
    above it and the comments on its own lines. A field without any takes those above the
    field that starts its family (``input_usd_per_mtok``, then ``output_usd_per_mtok``…,
    with no blank line and no comment of their own between)."""
    try:
        source = textwrap.dedent(inspect.getsource(model))
    except (OSError, TypeError):
        return {}
    by_line: dict[int, str] = {}
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT:
            by_line[token.start[0]] = token.string.lstrip("#").strip()
    lines = source.splitlines()
    [classdef] = [n for n in ast.parse(source).body if isinstance(n, ast.ClassDef)]
    out: dict[str, str] = {}
    group: tuple[str, str] | None = None  # the family's first field, and the comment above it
    previous_end = 0
    for stmt in classdef.body:
        above: list[str] = []
        line = stmt.lineno - 1
        while line >= 1 and lines[line - 1].strip().startswith("#"):
            above.insert(0, by_line.get(line, ""))
            line -= 1
        contiguous = line == previous_end and not above
        previous_end = stmt.end_lineno or stmt.lineno
        if not (isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name)):
            group = None
            continue
        name = stmt.target.id
        beside = [by_line[n] for n in range(stmt.lineno, previous_end + 1) if n in by_line]
        if above or beside:
            out[name] = " ".join(above + beside)
            group = (name, " ".join(above)) if above else None
        elif group is not None and contiguous and _shares_affix(name, group[0]):
            out[name] = group[1]
        else:
            group = None
    return out


def _doc(model: type[BaseModel]) -> str:
    doc = model.__dict__.get("__doc__") or ""
    return " ".join(inspect.cleandoc(doc).split()) if doc else ""


def _own(model: type[BaseModel], name: str) -> str:
    """The field's description, or its comments in the class that defines it (or, wanting
    them, a class it inherits it from), or ``FALLBACK``."""
    field = model.model_fields[name]
    if field.description:
        return field.description
    for cls in model.__mro__:
        if not (isinstance(cls, type) and issubclass(cls, BaseModel)) or cls is BaseModel:
            continue
        if name in inspect.get_annotations(cls):
            text = _comments(cls).get(name)
            if text and re.fullmatch(r'"[^"]*"', text):  # a comment that is only an example
                return f"{_fallback(model, name)} For example `{text.strip(chr(34))}`.".strip()
            if text:
                return text
    return _fallback(model, name)


def _fallback(model: type[BaseModel], name: str) -> str:
    for cls in model.__mro__:
        text = FALLBACK.get(cls.__name__, {}).get(name)
        if text:
            return text
    return ""


def describe(model: type[BaseModel], name: str, field: FieldInfo | None = None) -> str:
    """What ``name`` does. A provider's setting that is also a model's (``ModelSettings``)
    says what the model's says, for all the provider's models."""
    from durable_agent.config import HttpProviderConfig, ModelSettings

    text = _own(model, name)
    shared = issubclass(model, HttpProviderConfig) and name in ModelSettings.model_fields
    if shared and (not text or "ModelSettings" in text):
        model_text = _own(ModelSettings, name)
        text = f"{model_text} For all its models; a model's own wins." if model_text else text
    return text


# --- rendering -------------------------------------------------------------------------------


def type_name(annotation: Any) -> str:
    while typing.get_origin(annotation) is typing.Annotated:
        annotation = typing.get_args(annotation)[0]
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is typing.Literal:
        return " or ".join(json.dumps(a) for a in args)
    if _is_union(annotation):
        named = [type_name(a) for a in args if a is not type(None)]
        if _models_of(annotation):
            return "table"
        text = " or ".join(named)
        return f"{text}, optional" if type(None) in args else text
    if origin is tuple:
        return "array of tables" if _models_of(args[0]) else f"list of {type_name(args[0])}"
    if origin is dict:
        value = args[1]
        return "tables" if _models_of(value) else f"table of {type_name(value)}"
    if _is_model(annotation):
        return "table"
    names = {str: "string", int: "integer", float: "number", bool: "boolean", Path: "path"}
    return names.get(annotation, getattr(annotation, "__name__", str(annotation)))


def _default(field: FieldInfo) -> Any:
    if field.default_factory is not None:
        return field.default_factory()  # type: ignore[call-arg]
    return None if field.default is PydanticUndefined else field.default


def toml_value(value: Any) -> str:
    if value is None:
        return "unset"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, Path):
        if value.is_absolute() and REPO in value.parents:
            value = value.relative_to(REPO)
        return json.dumps(str(value))
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, tuple | list):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    if isinstance(value, BaseModel):
        fields = type(value).model_fields
        kept = {k: _value(value, k) for k in fields if k == "kind" or _value(value, k) != _default(fields[k])}
        return "{ " + ", ".join(f"{k} = {toml_value(v)}" for k, v in kept.items()) + " }"
    if isinstance(value, dict):
        if not value:
            return "{}"
        return "{ " + ", ".join(f"{k} = {toml_value(v)}" for k, v in value.items()) + " }"
    return str(value)


def _bounds(field: FieldInfo) -> list[str]:
    out = []
    for meta in field.metadata:
        for attr, sign in (("ge", "≥"), ("gt", ">"), ("le", "≤"), ("lt", "<")):
            bound = getattr(meta, attr, None)
            if bound is not None:
                out.append(f"{sign} {bound}")
        if getattr(meta, "pattern", None):
            out.append(f"matches `{meta.pattern}`")
        if getattr(meta, "max_length", None):
            out.append(f"at most {meta.max_length} characters")
    return out


def _key_bounds(field: FieldInfo) -> list[str]:
    """What a table's names must be (``[mcp.NAME]``: its tools are ``mcp__NAME__TOOL``)."""
    annotation = _strip(field.annotation)
    if typing.get_origin(annotation) is not dict:
        return []
    key = typing.get_args(annotation)[0]
    if typing.get_origin(key) is not typing.Annotated:
        return []
    out = []
    for meta in typing.get_args(key)[1:]:
        for inner in getattr(meta, "metadata", [meta]):
            if getattr(inner, "pattern", None):
                out.append(f"a name matches `{inner.pattern}`")
            if getattr(inner, "max_length", None):
                out.append(f"a name has at most {inner.max_length} characters")
    return out


def _cell(text: str) -> str:
    text = re.sub(r"``([^`]+)``", r"`\1`", " ".join(text.split()))
    return text.replace("|", "\\|")


def render_section(section: Section) -> str:
    model = section.model
    rows = ["| key | type | default | what |", "| --- | --- | --- | --- |"]
    for name, field in model.model_fields.items():
        if section.defaults is not None and section.path:
            default: Any = _value(section.defaults, name)
        else:
            default = _default(field)
        if field.is_required() and field.default_factory is None:
            shown = "required"
        elif _models_of(field.annotation) and not isinstance(default, BaseModel | type(None)):
            shown = toml_value(default)
        elif isinstance(default, BaseModel):
            shown = "its table, below"
        else:
            shown = f"`{toml_value(default)}`" if default is not None else "unset"
        what = describe(model, name, field)
        extra = _bounds(field) + _key_bounds(field)
        if field.deprecated:
            extra.append(f"deprecated: {field.deprecated}")
        if extra:
            what = f"{what} ({'; '.join(extra)})" if what else "; ".join(extra)
        if shown.startswith("{"):
            shown = f"`{shown}`"
        rows.append(f"| `{name}` | {_cell(type_name(field.annotation))} | {_cell(shown)} | {_cell(what)} |")
    intro = _doc(model)
    head = f"### {section.title}\n\n"
    return head + (f"{_cell(intro)}\n\n" if intro else "") + "\n".join(rows) + "\n"


def config_reference() -> str:
    return "\n".join(render_section(s) for s in sections())


# --- the patch markers of the committed histories --------------------------------------------


def patch_markers(histories: Path = REPO / "tests" / "histories") -> str:
    carried: dict[str, list[str]] = {}
    for path in sorted(histories.glob("*.json")):
        events = json.loads(path.read_text(encoding="utf-8")).get("events", [])
        for event in events:
            marker = event.get("markerRecordedEventAttributes") or {}
            if marker.get("markerName") != "core_patch":
                continue
            for value in marker.get("details", {}).values():
                for payload in value.get("payloads", []):
                    data = json.loads(base64.b64decode(payload["data"]))
                    patch = data["id"] if isinstance(data, dict) else str(data)
                    if path.name not in carried.setdefault(patch, []):
                        carried[patch].append(path.name)
    rows = ["| patch id | histories | carried by |", "| --- | ---: | --- |"]
    for patch, names in sorted(carried.items()):
        rows.append(f"| `{patch}` | {len(names)} | {', '.join(f'`{n}`' for n in names)} |")
    return "\n".join(rows) + "\n"


def readme() -> str:
    """``README.md`` for the site's home page: without its title (the page has it) and the parts
    only the repository needs, its links into ``docs/`` made links between pages."""
    text = (REPO / "README.md").read_text(encoding="utf-8")
    text = text.split("\n", 1)[1] if text.startswith("# ") else text
    text = README_ONLY.sub("", text)
    return re.sub(r"\]\(docs/", "](", text).strip() + "\n"


def render(markdown: str) -> str:
    if README_MARK.search(markdown):
        markdown = README_MARK.sub(lambda _: readme(), markdown)
    if CONFIG_MARK in markdown:
        markdown = markdown.replace(CONFIG_MARK, config_reference())
    if MARKERS_MARK in markdown:
        markdown = markdown.replace(MARKERS_MARK, patch_markers())
    return markdown


def on_page_markdown(markdown: str, page: Any = None, config: Any = None, files: Any = None) -> str:
    """MkDocs' event: the page's Markdown with the generated parts in place."""
    return render(markdown)
