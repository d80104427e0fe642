"""``edit`` and ``multi_edit``: exact strings replaced in one file, written once, all or none.

``edit`` replaces ``old_string`` with ``new_string``: exactly one occurrence, or
all with ``replace_all``. ``multi_edit`` applies several such edits in order to
the file's text in memory, each matched as ``edit`` matches (exactly, once
unless ``replace_all``, a file with Windows line ends matched with the model's
``\\n`` read as ``\\r\\n``), each to the text the ones before left. If one fails
nothing is written, and the error names it. The file is then replaced
atomically. Both block, so ``builtin_tools`` runs them in a thread.

What a repeat does (Temporal runs activities at least once): the write is
atomic, so a repeat finds the file before the edits or after all of them.
``edit`` reports "already applied" when ``old_string`` is gone (apart from
copies inside ``new_string``) and ``new_string`` is present, so a retried edit
neither fails nor applies twice; a retried deletion (empty ``new_string``)
fails as "not found", as nothing shows it was done. After a ``multi_edit``,
every edit is *in place*: what it put in, as the later edits left it
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
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from durable_agent.activities.tools.beneath import Walked
from durable_agent.activities.tools.fs import is_binary, reader, walked
from durable_agent.activities.tools.tool import ToolFailure
from durable_agent.core.tool_args import EDIT_MAX_FILE_BYTES, EditArgs, MultiEditArgs, StringEdit

EDIT_SNIPPET_LINES = 12
EDIT_SNIPPET_CHARS = 200


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


@contextmanager
def _editable(workspace: Path, name: str, tool: str) -> Iterator[tuple[Walked, str, int]]:
    """The file opened in its folder, its text (``file_text``) and its permission bits."""
    with walked(workspace, name) as at:
        with reader(at, name) as f:
            raw = f.read(EDIT_MAX_FILE_BYTES + 1)
            mode = stat.S_IMODE(os.fstat(f.fileno()).st_mode)
        yield at, file_text(raw, name, tool), mode


def _write_back(at: Walked, name: str, text: str, mode: int) -> None:
    """Replace the file ``at`` holds with ``text``, atomically, keeping its permission bits."""
    try:
        at.replace(text.encode("utf-8"), mode)
    except PermissionError:
        raise ToolFailure(f"cannot write {name!r}: permission denied") from None
    except OSError as exc:
        raise ToolFailure(f"cannot write {name!r}: {exc.strerror or exc}") from None


def edit(args: EditArgs, workspace: Path) -> str:
    """Replace ``old_string`` with ``new_string``: exactly one occurrence, or all with ``replace_all``.

    Fails clearly when ``old_string`` is missing or (without ``replace_all``)
    not unique. Occurrences of ``old_string`` that lie inside an occurrence of
    ``new_string`` count as already replaced; when none is left to replace and
    ``new_string`` is present, the edit is reported as already applied and
    nothing changes. That is what a repeat after a crash sees, so a repeat
    never fails and never applies the edit twice; the one exception is a
    repeated deletion (empty ``new_string``), which cannot be told from a
    mistaken one and fails as "not found". A file with Windows line
    ends is matched with the model's ``\\n`` read as ``\\r\\n``.
    """
    name = args.file_path
    with _editable(workspace, name, "edit") as (at, text, mode):
        old, new, starts = _matched(text, args.old_string, args.new_string, args.replace_all, name)
        if not starts:
            return (
                f"already applied: {name} has no old_string left to replace and contains new_string; "
                "nothing changed"
            )
        edited = _spliced(text, starts, old, new)
        _write_back(at, name, edited, mode)
    # Where the first replacement landed: nothing before it changed.
    first = _line_of(text, starts[0])
    snippet = _snippet(edited, first, new.count("\n"))
    return f"edited {name}: replaced {_occurrences_said(starts)} (first at line {first})\n{snippet}"


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
    with _editable(workspace, name, "multi_edit") as (at, text, mode):
        if _in_place(text, args.edits):
            return (
                f"already applied: every edit is in place in {name} (no old_string left to replace, "
                "the new text present); nothing changed"
            )
        edited, lines = _applied(text, args.edits, name)
        _write_back(at, name, edited, mode)
    made = sum(1 for line in lines if "already applied" not in line)
    return f"edited {name}: {made} of {len(args.edits)} edits made\n" + "\n".join(lines)


def _applied(text: str, edits: tuple[StringEdit, ...], name: str) -> tuple[str, list[str]]:
    """The text with every edit made in order (``edit``'s rule for each), and a line per edit."""
    lines: list[str] = []
    total = len(edits)
    for n, edit in enumerate(edits, 1):
        failed = f"edit {n} of {total} failed, so nothing was written: its "
        after = " after the edits before it" if n > 1 else ""
        old, new, starts = _matched(
            text, edit.old_string, edit.new_string, edit.replace_all, name, failed, after
        )
        if not starts:
            lines.append(f"edit {n}: already applied (no old_string left, new_string present)")
            continue
        first = _line_of(text, starts[0])
        text = _spliced(text, starts, old, new)
        lines.append(f"edit {n}: replaced {_occurrences_said(starts)} (first at line {first})")
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
    return bool(_outside(text, old, covers))


def _matched(
    text: str, old: str, new: str, replace_all: bool, name: str, failed: str = "", after: str = ""
) -> tuple[str, str, list[int]]:
    """One edit matched in ``text``: its strings (``\\n`` read as ``\\r\\n`` in a file with Windows
    line ends, unless that finds nothing more) and the occurrences of ``old`` still to replace,
    none when the edit is already applied; ``ToolFailure`` when ``old`` is not found or (without
    ``replace_all``) not unique, the message starting with ``failed`` and naming the file with
    ``after``."""
    if "\r\n" in text and "\r" not in old + new and not _pending(text, old, new):
        old, new = old.replace("\n", "\r\n"), new.replace("\n", "\r\n")
    starts = _pending(text, old, new)
    if not starts:
        if new and new in text:
            return old, new, []
        # A deletion (empty new_string) that already happened looks the same: nothing shows it was done.
        raise ToolFailure(
            f"{failed}old_string was not found in {name}{after}; it must match exactly, whitespace and "
            "indentation included (read the file to copy the text)"
        )
    if len(starts) > 1 and not replace_all:
        lines = ", ".join(str(_line_of(text, i)) for i in starts[:10])
        raise ToolFailure(
            f"{failed}old_string occurs {len(starts)} times in {name} (lines {lines}); add surrounding "
            "lines to make it unique, or set replace_all to true"
        )
    return old, new, starts


def _spliced(text: str, starts: list[int], old: str, new: str) -> str:
    """``text`` with ``new`` in place of the occurrences of ``old`` at ``starts``."""
    parts, last = [], 0
    for i in starts:
        parts += [text[last:i], new]
        last = i + len(old)
    return "".join([*parts, text[last:]])


def _occurrences_said(starts: list[int]) -> str:
    return f"{len(starts)} occurrences" if len(starts) > 1 else "1 occurrence"


def _occurrences(text: str, needle: str) -> list[int]:
    """Start offsets of ``needle`` in ``text``, left to right, not overlapping (as ``str.replace``)."""
    found, i = [], text.find(needle)
    while i != -1:
        found.append(i)
        i = text.find(needle, i + len(needle))
    return found


def _outside(text: str, old: str, covers: list[str]) -> list[int]:
    """Occurrences of ``old`` in ``text`` not inside an occurrence of one of ``covers``."""
    starts = _occurrences(text, old)
    if not starts:
        return starts
    spans = [(cover, _occurrences(text, cover)) for cover in covers if old in cover]
    outside = []
    for i in starts:
        if not any(
            (k := bisect.bisect_right(at, i) - 1) >= 0 and i + len(old) <= at[k] + len(cover)
            for cover, at in spans
        ):
            outside.append(i)
    return outside


def _pending(text: str, old: str, new: str) -> list[int]:
    """Occurrences of ``old`` still to replace: those not inside an occurrence of ``new``.

    Only matters when ``new`` contains ``old``: after ``foo`` → ``foo()`` the
    file still contains ``foo``, and a repeat must not make it ``foo()()``.
    """
    return _outside(text, old, [new])


def _line_of(text: str, offset: int) -> int:
    return text.count("\n", 0, offset) + 1


def _snippet(text: str, first_line: int, changed_lines: int) -> str:
    lines = text.split("\n")
    start = max(1, first_line - 2)
    stop = min(len(lines), first_line + changed_lines + 1, start + EDIT_SNIPPET_LINES - 1)
    return "\n".join(
        f"{n:>6}\t{lines[n - 1][:EDIT_SNIPPET_CHARS].rstrip(chr(13))}" for n in range(start, stop + 1)
    )
