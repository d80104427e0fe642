"""Argument models of the built-in tools, and the limits the tools hold to.

Each model is both the JSON schema the model is shown and the validator its
calls pass through. Unknown fields are refused, so a misspelt argument is an
error the model sees instead of a setting silently ignored.

The limits live here, next to the arguments, because the tool descriptions
quote them and the workflow must not import the activities that enforce them.
They keep every result well inside a checkpoint: each tool result lands in
the conversation, and the conversation in every checkpoint the run exports.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from functools import lru_cache
from typing import Annotated, Any, Literal

import re2
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, field_validator, model_validator

from durable_agent.core.models import NonBlank
from durable_agent.core.patch_format import parse_patch, patch_paths

# read: output of one call, and the longest line shown whole.
READ_MAX_BYTES = 100_000
READ_MAX_LINE_CHARS = 2_000
# ls: entries listed.
LS_MAX_ENTRIES = 1_000
# edit: files larger than this are refused (they are read whole).
EDIT_MAX_FILE_BYTES = 10 * 1024 * 1024
# multi_edit: edits in one call. apply_patch: a patch's characters and the files it names.
MULTI_EDIT_MAX_EDITS = 100
PATCH_MAX_CHARS = 1_000_000
PATCH_MAX_FILES = 100
# glob and grep: entries a search visits before it stops, results shown.
WALK_MAX_ENTRIES = 200_000
GLOB_MAX_RESULTS = 500
GREP_MAX_MATCHES = 200
GREP_MAX_LINE_CHARS = 300
GREP_MAX_FILE_BYTES = 5 * 1024 * 1024
# glob and grep: a search stops (saying so) after this long, whatever the pattern and the files.
SEARCH_MAX_SECONDS = 60
# Patterns: their length, and a grep pattern's size once compiled (RE2 instructions). RE2 is linear
# in the text, but when its fast matcher gives up the cost per character grows with that size.
GLOB_MAX_PATTERN_CHARS = 1_000
GREP_MAX_PATTERN_CHARS = 1_000
GREP_MAX_PROGRAM_SIZE = 10_000
# grep: characters of one line times the program's size matched in one go. A longer line is matched
# in its first part only (and the result says so), so one match call stays well under a second.
GREP_LINE_BUDGET = 100_000_000
# bash: timeouts in seconds, output kept (the start and the end of it).
BASH_DEFAULT_TIMEOUT = 120
BASH_MAX_TIMEOUT = 600
BASH_OUTPUT_HEAD_BYTES = 10_000
BASH_OUTPUT_TAIL_BYTES = 20_000
# web_fetch: redirects followed, the longest URL taken, and the defaults of ``[tools.web_fetch]``
# (the worker's config). A page's text is shown ``READ_MAX_BYTES`` at a time, as ``read`` shows a file.
WEB_FETCH_MAX_REDIRECTS = 5
WEB_FETCH_MAX_URL_CHARS = 8_192
WEB_FETCH_DEFAULT_MAX_BYTES = 5 * 1024 * 1024
WEB_FETCH_DEFAULT_TIMEOUT = 30
# todo_write: items in the list, the characters of one item's text and of its id. The newest list
# travels in the run's state (and its continue-as-new input), so it stays small: at most ~60 KB.
TODO_MAX_ITEMS = 100
TODO_MAX_CONTENT_CHARS = 500
TODO_MAX_ID_CHARS = 100


class ToolArgs(BaseModel):
    """Base of every tool's arguments: immutable, unknown fields refused."""

    model_config = ConfigDict(extra="forbid", frozen=True)


def bounded_text(max_chars: int, description: str) -> Any:
    """A required text argument of 1 to ``max_chars`` characters: longer, the call is refused.

    Args:
        max_chars: The most characters the text may have.
        description: What the model is told of the argument.

    Returns:
        The field, to assign to a ``str`` annotation of a ``ToolArgs`` model.
    """
    return Field(min_length=1, max_length=max_chars, description=description)


def checked_by(check: Callable[[str], object]) -> AfterValidator:
    """The validator of a text argument that ``check`` must accept; the text is kept as given.

    Args:
        check: Raises ``ValueError``, saying why, for a text the tool cannot take.

    Returns:
        The validator, for the argument's ``Annotated`` type (it runs after the length bounds).
    """

    def accepted(value: str) -> str:
        check(value)
        return value

    return AfterValidator(accepted)


class FileArgs(ToolArgs):
    """Base of the arguments of a tool that works on one file, named first."""

    file_path: str = Field(min_length=1, description="Path of the file, relative to the workspace.")


class ReadArgs(FileArgs):
    """Arguments of ``read``."""

    offset: int = Field(0, ge=0, description="First line to return, 0-based.")
    limit: int | None = Field(None, ge=1, description="How many lines to return at most.")


class LsArgs(ToolArgs):
    """Arguments of ``ls``."""

    path: str = Field(".", min_length=1, description="Folder to list, relative to the workspace.")


class WriteArgs(FileArgs):
    """Arguments of ``write``."""

    content: str = Field(description="The whole new content of the file (written as UTF-8).")


class StringEdit(ToolArgs):
    """One replacement of ``multi_edit``, as ``edit`` takes it; ``old_string`` and ``new_string`` differ."""

    old_string: str = Field(min_length=1, description="The exact text to replace, whitespace included.")
    new_string: str = Field(description="The text to put in its place.")
    replace_all: bool = Field(False, description="Replace every occurrence instead of exactly one.")

    @model_validator(mode="after")
    def _changes_something(self) -> StringEdit:
        if self.old_string == self.new_string:
            raise ValueError("old_string and new_string are the same: the edit would change nothing")
        return self


# ``FileArgs`` last among the bases: pydantic takes the fields base by base from the last, so
# ``file_path`` comes first, as the model has always been shown it.
class EditArgs(StringEdit, FileArgs):
    """Arguments of ``edit``: one ``StringEdit`` in one file."""


def _inlined(schema: dict[str, Any]) -> dict[str, Any]:
    """``schema`` with its ``$defs`` written in where they are referred to: some providers
    refuse ``$ref`` in tool schemas, and models read a flat schema more easily."""
    defs = schema.pop("$defs", {})

    def expand(node: Any) -> Any:
        if isinstance(node, dict):
            ref = node.get("$ref")
            if isinstance(ref, str) and ref.startswith("#/$defs/"):
                # the model's docstring is for developers, as the tool's own (``ToolSpec.offer``)
                found = {k: v for k, v in defs[ref.removeprefix("#/$defs/")].items() if k != "description"}
                return expand(found)
            return {key: expand(value) for key, value in node.items()}
        if isinstance(node, list):
            return [expand(value) for value in node]
        return node

    return expand(schema)  # type: ignore[no-any-return]


class MultiEditArgs(FileArgs):
    """Arguments of ``multi_edit``: ``edit``'s replacements, several in one file."""

    edits: tuple[StringEdit, ...] = Field(
        min_length=1,
        max_length=MULTI_EDIT_MAX_EDITS,
        description="The replacements, applied in order, each to the text the ones before left.",
    )

    @classmethod
    def model_json_schema(cls, *args: Any, **kwargs: Any) -> dict[str, Any]:
        return _inlined(super().model_json_schema(*args, **kwargs))


def _patch_parses(patch: str) -> None:
    if len(patch_paths(parse_patch(patch))) > PATCH_MAX_FILES:
        raise ValueError(f"the patch names more than {PATCH_MAX_FILES} files; split it")


class ApplyPatchArgs(ToolArgs):
    """Arguments of ``apply_patch``; ``patch`` must parse (``core.patch_format``)."""

    patch: Annotated[str, checked_by(_patch_parses)] = bounded_text(
        PATCH_MAX_CHARS, "The patch, from '*** Begin Patch' to '*** End Patch'."
    )


class GlobArgs(ToolArgs):
    """Arguments of ``glob``."""

    pattern: str = bounded_text(
        GLOB_MAX_PATTERN_CHARS, "Glob relative to the workspace, e.g. 'src/**/*.py' or '**/*.{ts,tsx}'."
    )


_GREP_OPTIONS = re2.Options()
_GREP_OPTIONS.log_errors = False  # a bad pattern is the model's error, not a line on the worker's stderr
_GREP_OPTIONS.never_capture = True  # only whether a line matches counts; groups would cost time
_GREP_OPTIONS_ICASE = re2.Options()
_GREP_OPTIONS_ICASE.log_errors = False
_GREP_OPTIONS_ICASE.never_capture = True
_GREP_OPTIONS_ICASE.case_sensitive = False

# What the model most likely meant, by RE2's complaint (RE2 names the operator, not the feature).
_UNSUPPORTED = (
    ("invalid perl operator: (?=", "lookahead (?=...)"),
    ("invalid perl operator: (?!", "negative lookahead (?!...)"),
    ("invalid perl operator: (?<=", "lookbehind (?<=...)"),
    ("invalid perl operator: (?<!", "negative lookbehind (?<!...)"),
    ("invalid perl operator: (?P", "a named backreference (?P=name)"),
    ("invalid repetition size", "a repetition count over 1000"),
)


def _unsupported(reason: str) -> str:
    if reason.startswith("invalid escape sequence: \\") and reason[-1:].isdigit():
        return "a backreference"
    return next((what for prefix, what in _UNSUPPORTED if reason.startswith(prefix)), "this pattern")


# Small: each compiled pattern may hold megabytes of RE2's matching cache (up to ``max_mem``).
@lru_cache(maxsize=16)
def grep_regex(pattern: str, *, case_insensitive: bool = False) -> re2._Regexp[str]:
    """``pattern`` compiled with RE2 (linear time in the text), or ``ValueError`` saying why not.

    A pattern Python's ``re`` reads but RE2 does not (a backreference,
    lookaround) gets a message naming what is missing, so the model can
    rewrite it; a pattern that compiles too large is refused, since matching
    time grows with it.
    """
    options = _GREP_OPTIONS_ICASE if case_insensitive else _GREP_OPTIONS
    try:
        regex = re2.compile(pattern, options)
    except re2.error as exc:
        arg = exc.args[0] if exc.args else exc
        reason = arg.decode(errors="replace") if isinstance(arg, bytes) else str(arg)
        if reason.startswith("pattern too large"):
            raise ValueError(_too_large("more than RE2's memory limit allows")) from None
        try:
            re.compile(pattern)  # only to tell "not RE2" from "not a regular expression"; never matched
        except Exception:
            raise ValueError(f"invalid regular expression: {reason}") from None
        raise ValueError(
            f"grep patterns use RE2 syntax: {_unsupported(reason)} is not supported: {reason}"
        ) from None
    if regex.programsize > GREP_MAX_PROGRAM_SIZE:
        raise ValueError(_too_large(f"{regex.programsize} instructions"))
    return regex


def _too_large(size: str) -> str:
    return (
        f"grep pattern is too large: it compiles to {size}, at most {GREP_MAX_PROGRAM_SIZE} "
        "instructions are allowed; use fewer or smaller repetitions"
    )


class GrepArgs(ToolArgs):
    """Arguments of ``grep``; ``pattern`` must compile with RE2 (see ``grep_regex``)."""

    # Compiled case-sensitively: ``case_insensitive`` is not validated yet; the tool compiles it as asked.
    pattern: Annotated[str, checked_by(grep_regex)] = bounded_text(
        GREP_MAX_PATTERN_CHARS,
        "A regular expression in RE2 syntax (no backreferences or lookaround), matched line by line.",
    )
    path: str = Field(".", min_length=1, description="Folder or file to search, relative to the workspace.")
    glob: str | None = Field(
        None,
        min_length=1,
        max_length=GLOB_MAX_PATTERN_CHARS,
        description="Only search files matching this glob: against the file name, or against the "
        "workspace-relative path when it contains '/'.",
    )
    case_insensitive: bool = Field(False, description="Ignore case when matching.")


class BashArgs(ToolArgs):
    """Arguments of ``bash``."""

    command: str = Field(min_length=1, description="The command, run with /bin/bash -c in the workspace.")
    timeout_seconds: float = Field(
        BASH_DEFAULT_TIMEOUT,
        gt=0,
        le=BASH_MAX_TIMEOUT,
        description=f"Stop the command after this many seconds (at most {BASH_MAX_TIMEOUT}).",
    )


_URL = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*)://([^/?#]*)(.*)", re.DOTALL)
_IPV6_AUTHORITY = re.compile(r"\[([0-9A-Fa-f:.]+)\](?::([0-9]*))?")
_NAME_AUTHORITY = re.compile(r"([^:\[\]]*)(?::([0-9]*))?")
# A host name's characters (IDNA encodes the others); no ``%``, ``\\``, ``@``: nothing two URL
# parsers could read as different hosts.
_HOST_NAME = re.compile(r"[a-z0-9_-]+(?:\.[a-z0-9_-]+)*")


def url_host(url: str) -> str:
    """The host ``url`` names, as the permission rules see it (``domain:HOST``), or ``ValueError``.

    Only ``http://`` and ``https://`` addresses, without credentials, white space or control
    characters. The host is lower case, IDNA-encoded, without its port or a trailing dot; an
    IPv6 address is given without brackets. Strict on purpose: the tool connects to the host
    its HTTP library reads from the same text and refuses the call when the two differ.

    Args:
        url: the address the model gave.

    Returns:
        The host, e.g. ``docs.python.org``.
    """
    if any(c.isspace() or ord(c) < 0x20 or ord(c) == 0x7F for c in url):
        raise ValueError("the URL holds white space or control characters: percent-encode them")
    m = _URL.fullmatch(url)
    if m is None:
        raise ValueError("not an absolute URL: give it as http://HOST/... or https://HOST/...")
    scheme, authority = m.group(1).lower(), m.group(2)
    if scheme not in ("http", "https"):
        raise ValueError(f"only http:// and https:// URLs are fetched, not {scheme}://")
    if "@" in authority:
        raise ValueError("credentials in the URL (user@host) are not accepted")
    if authority.startswith("["):
        found = _IPV6_AUTHORITY.fullmatch(authority)
    else:
        found = _NAME_AUTHORITY.fullmatch(authority)
    if found is None:
        raise ValueError(f"the URL's host {authority!r} is not a host name or an IP address")
    host, port = found.group(1).lower(), found.group(2)
    if port and not (0 < int(port) <= 65535):
        raise ValueError(f"the URL's port {port} is out of range")
    if authority.startswith("["):
        return host
    host = host.removesuffix(".")
    if not host.isascii():
        try:
            host = host.encode("idna").decode("ascii")
        except UnicodeError:
            raise ValueError(f"the URL's host {host!r} is not a valid domain name") from None
    if _HOST_NAME.fullmatch(host) is None:
        raise ValueError(f"the URL's host {host!r} is not a host name or an IP address")
    return host


class WebFetchArgs(ToolArgs):
    """Arguments of ``web_fetch``; ``url`` must pass ``url_host``."""

    url: Annotated[str, checked_by(url_host)] = bounded_text(
        WEB_FETCH_MAX_URL_CHARS, "The http:// or https:// URL to fetch (GET)."
    )
    offset: int = Field(
        0, ge=0, description="First character of the page's text to show, to read on after a cut."
    )


class TodoEntry(ToolArgs):
    """One item of ``todo_write``'s list."""

    content: NonBlank = bounded_text(TODO_MAX_CONTENT_CHARS, "What the task is, in a short sentence.")
    status: Literal["pending", "in_progress", "completed"] = Field(
        description="pending (not started), in_progress (being worked on) or completed."
    )
    id: str | None = Field(
        None, min_length=1, max_length=TODO_MAX_ID_CHARS, description="A short name for the task (optional)."
    )


class TodoWriteArgs(ToolArgs):
    """Arguments of ``todo_write``: the whole list, which replaces the one before."""

    todos: tuple[TodoEntry, ...] = Field(
        max_length=TODO_MAX_ITEMS,
        description="The whole list, in order: every task, not only the ones that changed. An empty "
        "list clears it.",
    )

    @field_validator("todos")
    @classmethod
    def _ids_unique(cls, value: tuple[TodoEntry, ...]) -> tuple[TodoEntry, ...]:
        ids = [entry.id for entry in value if entry.id is not None]
        repeated = sorted({i for i in ids if ids.count(i) > 1})
        if repeated:
            raise ValueError(f"each id names one task; repeated: {', '.join(repeated)}")
        return value

    @classmethod
    def model_json_schema(cls, *args: Any, **kwargs: Any) -> dict[str, Any]:
        return _inlined(super().model_json_schema(*args, **kwargs))
