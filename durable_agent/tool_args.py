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

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

# read: output of one call, and the longest line shown whole.
READ_MAX_BYTES = 100_000
READ_MAX_LINE_CHARS = 2_000
# ls: entries listed.
LS_MAX_ENTRIES = 1_000
# edit: files larger than this are refused (they are read whole).
EDIT_MAX_FILE_BYTES = 10 * 1024 * 1024
# glob and grep: entries a search visits before it stops, results shown.
WALK_MAX_ENTRIES = 200_000
GLOB_MAX_RESULTS = 500
GREP_MAX_MATCHES = 200
GREP_MAX_LINE_CHARS = 300
GREP_MAX_FILE_BYTES = 5 * 1024 * 1024
# bash: timeouts in seconds, output kept (the start and the end of it).
BASH_DEFAULT_TIMEOUT = 120
BASH_MAX_TIMEOUT = 600
BASH_OUTPUT_HEAD_BYTES = 10_000
BASH_OUTPUT_TAIL_BYTES = 20_000


class ToolArgs(BaseModel):
    """Base of every tool's arguments: immutable, unknown fields refused."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class ReadArgs(ToolArgs):
    """Arguments of ``read``."""

    file_path: str = Field(min_length=1, description="Path of the file, relative to the workspace.")
    offset: int = Field(0, ge=0, description="First line to return, 0-based.")
    limit: int | None = Field(None, ge=1, description="How many lines to return at most.")


class LsArgs(ToolArgs):
    """Arguments of ``ls``."""

    path: str = Field(".", min_length=1, description="Folder to list, relative to the workspace.")


class WriteArgs(ToolArgs):
    """Arguments of ``write``."""

    file_path: str = Field(min_length=1, description="Path of the file, relative to the workspace.")
    content: str = Field(description="The whole new content of the file (written as UTF-8).")


class EditArgs(ToolArgs):
    """Arguments of ``edit``; ``old_string`` and ``new_string`` must differ."""

    file_path: str = Field(min_length=1, description="Path of the file, relative to the workspace.")
    old_string: str = Field(min_length=1, description="The exact text to replace, whitespace included.")
    new_string: str = Field(description="The text to put in its place.")
    replace_all: bool = Field(False, description="Replace every occurrence instead of exactly one.")

    @model_validator(mode="after")
    def _changes_something(self) -> EditArgs:
        if self.old_string == self.new_string:
            raise ValueError("old_string and new_string are the same: the edit would change nothing")
        return self


class GlobArgs(ToolArgs):
    """Arguments of ``glob``."""

    pattern: str = Field(
        min_length=1,
        description="Glob relative to the workspace, e.g. 'src/**/*.py' or '**/*.{ts,tsx}'.",
    )


class GrepArgs(ToolArgs):
    """Arguments of ``grep``; ``pattern`` must compile as a Python regular expression."""

    pattern: str = Field(min_length=1, description="A Python regular expression, matched line by line.")
    path: str = Field(".", min_length=1, description="Folder or file to search, relative to the workspace.")
    glob: str | None = Field(
        None,
        min_length=1,
        description="Only search files matching this glob: against the file name, or against the "
        "workspace-relative path when it contains '/'.",
    )
    case_insensitive: bool = Field(False, description="Ignore case when matching.")

    @field_validator("pattern")
    @classmethod
    def _compiles(cls, value: str) -> str:
        try:
            re.compile(value)
        except re.error as exc:
            raise ValueError(f"invalid regular expression: {exc}") from None
        return value


class BashArgs(ToolArgs):
    """Arguments of ``bash``."""

    command: str = Field(min_length=1, description="The command, run with /bin/bash -c in the workspace.")
    timeout_seconds: float = Field(
        BASH_DEFAULT_TIMEOUT,
        gt=0,
        le=BASH_MAX_TIMEOUT,
        description=f"Stop the command after this many seconds (at most {BASH_MAX_TIMEOUT}).",
    )
