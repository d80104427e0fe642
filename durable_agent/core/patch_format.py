"""The ``apply_patch`` format, as OpenAI's models write it: its grammar and its parser.

The workflow parses a patch to find every path it touches (each is judged by
the permission rules); the tool activity parses it again to apply it
(``activities/tools/patch.py``). The grammar, as OpenAI's codex ``apply-patch``
crate gives it::

    Patch      := "*** Begin Patch" NL { FileOp } "*** End Patch" NL?
    FileOp     := AddFile | DeleteFile | UpdateFile
    AddFile    := "*** Add File: " path NL { "+" line NL }
    DeleteFile := "*** Delete File: " path NL
    UpdateFile := "*** Update File: " path NL [ "*** Move to: " path NL ] { Hunk }
    Hunk       := "@@" [ " " context ] NL { (" " | "-" | "+") line NL } [ "*** End of File" NL ]

Parsing is as lenient as the reference's: blank lines around the patch and
spaces around the markers are ignored, a patch wrapped in a ``<<'EOF'`` …
``EOF`` here-doc is unwrapped, the first hunk of a file may leave out its
``@@`` line, and an empty line inside a hunk is an empty context line. Beyond
the reference: several ``@@ context`` lines in a row narrow the search step by
step (as the format's instructions to the model describe), a unified-diff
header (``@@ -12,3 +12,4 @@``) counts as a bare ``@@``, and an ``Update File``
with a ``Move to`` and no hunk is a plain rename. A patch that does not parse
is a ``PatchError`` naming the line (1-based, counted in the text as given).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from durable_agent.core.errors import DurableAgentError

BEGIN = "*** Begin Patch"
END = "*** End Patch"
ADD = "*** Add File: "
DELETE = "*** Delete File: "
UPDATE = "*** Update File: "
MOVE = "*** Move to: "
END_OF_FILE = "*** End of File"
_UNIFIED_HEADER = re.compile(r"^@@ -\d+(?:,\d+)? \+\d+(?:,\d+)? @@")
_HEREDOC_OPENERS = ("<<EOF", "<<'EOF'", '<<"EOF"')


class PatchError(DurableAgentError, ValueError):
    """A patch that does not follow the format; the message names the line."""


@dataclass(frozen=True)
class Hunk:
    """One ``@@`` section of an update: the lines to find (``old``: context and ``-`` lines) and
    what they become (``new``: context and ``+`` lines), after the ``context`` lines (each
    searched for in turn), at the end of the file when ``end_of_file``."""

    context: tuple[str, ...]
    old: tuple[str, ...]
    new: tuple[str, ...]
    end_of_file: bool
    line: int  # where the hunk starts in the patch


@dataclass(frozen=True)
class AddFile:
    path: str
    content: str
    line: int


@dataclass(frozen=True)
class DeleteFile:
    path: str
    line: int


@dataclass(frozen=True)
class UpdateFile:
    path: str
    move_to: str | None
    hunks: tuple[Hunk, ...]
    line: int


FileOp = AddFile | DeleteFile | UpdateFile


def patch_paths(ops: tuple[FileOp, ...]) -> list[str]:
    """Every path the operations name (a move's destination too), in order, each once."""
    paths: dict[str, None] = {}
    for op in ops:
        paths[op.path] = None
        if isinstance(op, UpdateFile) and op.move_to is not None:
            paths[op.move_to] = None
    return list(paths)


def parse_patch(text: str) -> tuple[FileOp, ...]:
    """The file operations of a patch in the ``apply_patch`` format (see the module docstring).

    Args:
        text: the patch, from ``*** Begin Patch`` to ``*** End Patch``.

    Returns:
        Its operations, in order; ``PatchError`` naming the line when it does not parse.
    """
    lines = [line.removesuffix("\r") for line in text.split("\n")]
    first, last = 0, len(lines) - 1
    while first <= last and not lines[first].strip():
        first += 1
    while last >= first and not lines[last].strip():
        last -= 1
    if first > last:
        raise PatchError("the patch is empty; it must start with '*** Begin Patch'")
    if lines[first].strip() in _HEREDOC_OPENERS and lines[last].strip().endswith("EOF") and last - first >= 3:
        first, last = first + 1, last - 1
    if lines[first].strip() != BEGIN:
        raise PatchError(f"line {first + 1}: the first line of the patch must be '{BEGIN}'")
    if lines[last].strip() != END or last == first:
        raise PatchError(f"line {last + 1}: the last line of the patch must be '{END}'")
    ops = _Parser(lines, first + 1, last).run()
    if not ops:
        raise PatchError(f"line {last + 1}: the patch changes no file (no Add, Update or Delete File)")
    return ops


class _Parser:
    """Reads the lines between the patch's first and last line (``at`` to ``end``, 0-based)."""

    def __init__(self, lines: list[str], at: int, end: int) -> None:
        self.lines, self.at, self.end = lines, at, end

    def error(self, message: str, at: int | None = None) -> PatchError:
        return PatchError(f"line {(self.at if at is None else at) + 1}: {message}")

    def run(self) -> tuple[FileOp, ...]:
        ops: list[FileOp] = []
        while self.at < self.end:
            line = self.lines[self.at].strip()
            if not line:
                self.at += 1
            elif line.startswith(ADD.strip()):
                ops.append(self.add(self.path(line, ADD)))
            elif line.startswith(DELETE.strip()):
                ops.append(DeleteFile(self.path(line, DELETE), self.at + 1))
                self.at += 1
            elif line.startswith(UPDATE.strip()):
                ops.append(self.update(self.path(line, UPDATE)))
            elif ops and isinstance(ops[-1], AddFile) and not line.startswith("***"):
                raise self.error(f"in '{ADD}{ops[-1].path}', every line must start with '+': {line[:80]!r}")
            else:
                raise self.error(
                    f"{line[:80]!r} is not a file operation; expected '{ADD}path', '{DELETE}path' "
                    f"or '{UPDATE}path'"
                )
        return tuple(ops)

    def path(self, line: str, marker: str) -> str:
        path = line[len(marker.strip()) :].strip()
        if not path:
            raise self.error(f"'{marker.strip()}' needs a path")
        return path

    def add(self, path: str) -> AddFile:
        start = self.at
        self.at += 1
        content: list[str] = []
        while self.at < self.end and self.lines[self.at].startswith("+"):
            content.append(self.lines[self.at][1:] + "\n")
            self.at += 1
        return AddFile(path, "".join(content), start + 1)

    def update(self, path: str) -> UpdateFile:
        start = self.at
        self.at += 1
        move_to = None
        if self.at < self.end and self.lines[self.at].strip().startswith(MOVE.strip()):
            move_to = self.path(self.lines[self.at].strip(), MOVE)
            self.at += 1
        hunks: list[Hunk] = []
        while self.at < self.end:
            line = self.lines[self.at]
            if not line.strip():
                self.at += 1  # blank lines between hunks
            elif line.lstrip().startswith("***") and line.strip() != END_OF_FILE:
                break  # the next file operation
            else:
                hunks.append(self.hunk(first=not hunks))
        if not hunks and move_to is None:
            raise self.error(f"'{UPDATE}{path}' has no hunk: nothing to change", start)
        return UpdateFile(path, move_to, tuple(hunks), start + 1)

    def hunk(self, *, first: bool) -> Hunk:
        start = self.at
        context: list[str] = []
        while self.at < self.end and self.lines[self.at].startswith("@@"):
            line = self.lines[self.at]
            if line.strip() != "@@" and not _UNIFIED_HEADER.match(line):
                if not line.startswith("@@ "):
                    raise self.error(f"a hunk header is '@@' or '@@ context line', not {line[:80]!r}")
                if line[3:].strip():
                    context.append(line[3:])
            self.at += 1
        if self.at == start and not first:
            raise self.error(
                f"expected a hunk starting with '@@', got {self.lines[self.at][:80]!r}; every line of a "
                "hunk starts with ' ' (context), '-' (removed) or '+' (added)"
            )
        old: list[str] = []
        new: list[str] = []
        end_of_file = False
        while self.at < self.end:
            line = self.lines[self.at]
            if line.strip() == END_OF_FILE:
                end_of_file = True
                self.at += 1
                break
            if line == "":
                old.append("")  # an empty line: an empty context line
                new.append("")
            elif line[0] == " ":
                old.append(line[1:])
                new.append(line[1:])
            elif line[0] == "-":
                old.append(line[1:])
            elif line[0] == "+":
                new.append(line[1:])
            else:
                break
            self.at += 1
        if not old and not new:
            if not end_of_file and self.at < self.end:
                got = f", got {self.lines[self.at][:80]!r}"
                raise self.error(f"a hunk needs lines starting with ' ', '-' or '+'{got}")
            raise self.error(
                "a hunk needs lines starting with ' ' (context), '-' (removed) or '+' (added)", start
            )
        return Hunk(tuple(context), tuple(old), tuple(new), end_of_file, start + 1)
