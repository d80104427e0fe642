"""``multi_edit``: several of ``edit``'s replacements in one file, written once, all or none.

The edits are applied in order to the file's text in memory, each matched as
``edit`` matches (exactly, once unless ``replace_all``, a file with Windows line
ends matched with the model's ``\\n`` read as ``\\r\\n``), each to the text the
ones before left. If one fails nothing is written, and the error names it.
The file is then replaced atomically, like ``edit``'s.

What a repeat does (Temporal runs activities at least once): the write is
atomic, so a repeat finds the file before the edits or after all of them.
After, every edit is *in place*: what it put in, as the later edits left it
(``new_string`` with the later edits applied to it), is in the file, and its
``old_string`` no longer occurs outside such text. Then the set is reported
as already applied and nothing changes, even when a later edit changed what
an earlier one put in. An edit that deletes (empty ``new_string``) is in place
when its ``old_string`` is gone, provided another edit of the set shows its
text: nothing else shows a deletion was done. Otherwise each edit follows
``edit``'s rule: one whose ``old_string`` is gone and whose ``new_string`` is
there is skipped, and the result says so.
"""

from __future__ import annotations

import bisect
import os
import stat
from pathlib import Path

from durable_agent.activities.tools.fs import _line_of, _occurrences, _pending, _reader, _walked, is_binary
from durable_agent.activities.tools.tool import ToolFailure
from durable_agent.core.tool_args import EDIT_MAX_FILE_BYTES, MultiEditArgs, StringEdit


def file_text(raw: bytes, name: str, tool: str) -> str:
    """A file's bytes as text to edit, or ``ToolFailure``: too large, binary, or not UTF-8.

    Args:
        raw: the file's first ``EDIT_MAX_FILE_BYTES + 1`` bytes.
        name: the file's path as the model gave it.
        tool: the tool that edits it, for the message.

    Returns:
        The text.
    """
    if len(raw) > EDIT_MAX_FILE_BYTES:
        raise ToolFailure(
            f"{name!r} is larger than {EDIT_MAX_FILE_BYTES} bytes; {tool} refuses files that big"
        )
    if is_binary(raw):
        raise ToolFailure(f"{name!r} is a binary file; {tool} only changes text files")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        raise ToolFailure(f"{name!r} is not UTF-8 text; {tool} refuses to rewrite it") from None


def multi_edit(args: MultiEditArgs, workspace: Path) -> str:
    """Apply ``args.edits`` in order to one file and write it once; all of them or none.

    Args:
        args: the file and its edits.
        workspace: the run's workspace.

    Returns:
        What was replaced, or that every edit was already in place (nothing written);
        ``ToolFailure`` naming the edit that cannot be made, with nothing written.
    """
    name = args.file_path
    with _walked(workspace, name) as at:
        with _reader(at, name) as f:
            raw = f.read(EDIT_MAX_FILE_BYTES + 1)
            mode = stat.S_IMODE(os.fstat(f.fileno()).st_mode)
        text = file_text(raw, name, "multi_edit")
        if _in_place(text, args.edits):
            return (
                f"already applied: every edit is in place in {name} (no old_string left to replace, "
                "the new text present); nothing changed"
            )
        edited, lines = _applied(text, args.edits, name)
        try:
            at.replace(edited.encode("utf-8"), mode)
        except PermissionError:
            raise ToolFailure(f"cannot write {name!r}: permission denied") from None
        except OSError as exc:
            raise ToolFailure(f"cannot write {name!r}: {exc.strerror or exc}") from None
    made = sum(1 for line in lines if "already applied" not in line)
    return f"edited {name}: {made} of {len(args.edits)} edits made\n" + "\n".join(lines)


def _applied(text: str, edits: tuple[StringEdit, ...], name: str) -> tuple[str, list[str]]:
    """The text with every edit made in order (``edit``'s rule for each), and a line per edit."""
    lines: list[str] = []
    total = len(edits)
    for n, edit in enumerate(edits, 1):
        old, new = edit.old_string, edit.new_string
        if "\r\n" in text and "\r" not in old + new and not _pending(text, old, new):
            old, new = old.replace("\n", "\r\n"), new.replace("\n", "\r\n")
        pending = _pending(text, old, new)
        if not pending:
            if new and new in text:
                lines.append(f"edit {n}: already applied (no old_string left, new_string present)")
                continue
            raise ToolFailure(
                f"edit {n} of {total} failed, so nothing was written: its old_string was not found in "
                f"{name}{' after the edits before it' if n > 1 else ''}; it must match exactly, "
                "whitespace and indentation included (read the file to copy the text)"
            )
        if len(pending) > 1 and not edit.replace_all:
            at = ", ".join(str(_line_of(text, i)) for i in pending[:10])
            raise ToolFailure(
                f"edit {n} of {total} failed, so nothing was written: its old_string occurs "
                f"{len(pending)} times in {name} (lines {at}); add surrounding lines to make it unique, "
                "or set replace_all to true"
            )
        parts, last = [], 0
        for i in pending:
            parts += [text[last:i], new]
            last = i + len(old)
        first = _line_of(text, pending[0])
        text = "".join([*parts, text[last:]])
        count = f"{len(pending)} occurrences" if len(pending) > 1 else "1 occurrence"
        lines.append(f"edit {n}: replaced {count} (first at line {first})")
    return text, lines


def _in_place(text: str, edits: tuple[StringEdit, ...]) -> bool:
    """Whether every edit is already in place (see the module docstring), its strings as given or,
    in a file with Windows line ends, with ``\\n`` read as ``\\r\\n``."""
    pairs = [(e.old_string, e.new_string) for e in edits]
    if _pairs_in_place(text, pairs):
        return True
    if "\r\n" in text and not any("\r" in old + new for old, new in pairs):
        crlf = [(old.replace("\n", "\r\n"), new.replace("\n", "\r\n")) for old, new in pairs]
        return _pairs_in_place(text, crlf)
    return False


def _pairs_in_place(text: str, pairs: list[tuple[str, str]]) -> bool:
    results = []
    for i, (_, new) in enumerate(pairs):
        # what edit i put in, as the edits after it left it
        for later_old, later_new in pairs[i + 1 :]:
            new = new.replace(later_old, later_new)
        results.append(new)
    if not any(result and result in text for result in results):
        return False  # nothing shows any edit was made
    for i, (old, _) in enumerate(pairs):
        if results[i] and results[i] not in text:
            return False
        if _uncovered(text, old, results[i:]):
            return False
    return True


def _uncovered(text: str, old: str, covers: list[str]) -> bool:
    """Whether ``old`` occurs in ``text`` other than inside an occurrence of one of ``covers``."""
    starts = _occurrences(text, old)
    if not starts:
        return False
    spans = [(cover, _occurrences(text, cover)) for cover in covers if old in cover]
    for i in starts:
        inside = False
        for cover, at in spans:
            k = bisect.bisect_right(at, i) - 1
            if k >= 0 and i + len(old) <= at[k] + len(cover):
                inside = True
                break
        if not inside:
            return True
    return False
