"""``apply_patch``: a patch in OpenAI's format (``core.patch_format``) applied to the workspace.

Every file the patch names is read first, through ``beneath.walk`` like the
other file tools (confined to the workspace, no link followed by the kernel,
the opened path judged by the run's rules), and every change is worked out in
memory, operations on the same file one after the other. Only when all of
them can be made is anything written: added and updated files first (each
replaced atomically, after checking it still holds what was read), then
deletions (a moved file's old path among them). A failure before the writes
leaves every file as it was; one during them (a disk error, a file changed
meanwhile) is reported with the files already written.

A hunk is found as the reference implementation (codex's ``apply-patch``)
finds it: its ``@@`` context lines first, each after the one before, then its
old lines (context and ``-``) at or after them, matched exactly, then ignoring
trailing whitespace, then ignoring surrounding whitespace; a hunk ending in
``*** End of File`` is looked for at the end first. The matched lines are
replaced by the hunk's new lines as the patch gives them. A hunk with only
``+`` lines goes after its context line, or at the end of the file. An updated
file ends with a line break; a file with Windows line ends keeps them.

What a repeat does (Temporal runs activities at least once; a crash can come
between two files): each operation already in place is recognised and left
alone. An added file that holds the patch's content; an update whose hunks'
new lines are all found in order (exactly: they are written as the patch gives
them), each hunk's old lines found only inside its new ones or not at all; a
deleted file that is missing; a moved file missing at its old path and found,
updated, at its new one. When every operation is in place, the result says
"already applied" and nothing is written.
"""

from __future__ import annotations

import os
import posixpath
import stat
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from durable_agent.activities.tools.beneath import walk
from durable_agent.activities.tools.edits import file_text
from durable_agent.activities.tools.fs import walked
from durable_agent.activities.tools.tool import ToolFailure
from durable_agent.core.patch_format import AddFile, DeleteFile, Hunk, UpdateFile, parse_patch
from durable_agent.core.tool_args import EDIT_MAX_FILE_BYTES, ApplyPatchArgs

# How a line is compared, strictest first (the reference's fallbacks).
_MATCHERS: tuple[Callable[[str], str], ...] = (lambda s: s, str.rstrip, str.strip)
# Lines of a hunk quoted in an error.
_QUOTED_LINES = 8


@dataclass
class _File:
    """One path of the patch: its bytes on disk when read (``before``; None: missing) and once
    the patch is applied (``after``), its mode, and what the operations on it did."""

    path: str
    before: bytes | None
    after: bytes | None
    mode: int | None


def apply_patch(args: ApplyPatchArgs, workspace: Path) -> str:
    """Apply a patch to the workspace's files: every change worked out first, then written.

    Args:
        args: the patch.
        workspace: the run's workspace.

    Returns:
        A line per operation (``A``, ``M``, ``D``), or "already applied" when every change is in
        place; ``ToolFailure`` saying which operation cannot be made, with nothing written.
    """
    files: dict[str, _File] = {}
    root = workspace.resolve()

    def at(path: str) -> _File:
        key = posixpath.normpath(path)
        if key.startswith("/") and key.startswith(str(root) + "/"):
            key = posixpath.relpath(key, str(root))
        if key not in files:
            files[key] = _read(workspace, path)
        return files[key]

    report = []
    for op in parse_patch(args.patch):
        if isinstance(op, AddFile):
            report.append(_add(at(op.path), op))
        elif isinstance(op, DeleteFile):
            report.append(_delete(at(op.path)))
        else:
            source = at(op.path)
            target = at(op.move_to) if op.move_to is not None else None
            report.append(_update(source, None if target is source else target, op))
    changed = [f for f in files.values() if f.after is not None and f.after != f.before]
    removed = [f for f in files.values() if f.after is None and f.before is not None]
    if not changed and not removed:
        return "already applied: every change in the patch is in place; nothing changed\n" + "\n".join(report)
    written: list[str] = []
    for file in changed:
        _write(workspace, file, written)
        written.append(file.path)
    for file in removed:
        _remove(workspace, file, written)
        written.append(file.path)
    return f"applied the patch ({len(written)} files changed)\n" + "\n".join(report)


def _read(workspace: Path, path: str) -> _File:
    """A path of the patch as it is on disk (its folder missing: the file is missing)."""
    try:
        with walk(workspace, path) as at:
            if at.fd is None:
                return _File(path, None, None, None)
            if at.is_folder():
                raise ToolFailure(f"{path!r} is a folder; a patch changes files")
            st = os.fstat(at.fd)
            if not stat.S_ISREG(st.st_mode):
                raise ToolFailure(f"{path!r} is not a regular file")
            with os.fdopen(os.dup(at.fd), "rb") as f:
                raw = f.read(EDIT_MAX_FILE_BYTES + 1)
            return _File(path, raw, raw, stat.S_IMODE(st.st_mode))
    except FileNotFoundError:
        return _File(path, None, None, None)
    except NotADirectoryError:
        raise ToolFailure(f"{path!r} cannot be reached: part of its folder path is a file") from None
    except PermissionError:
        raise ToolFailure(f"{path!r} cannot be reached (permission denied)") from None


def _add(file: _File, op: AddFile) -> str:
    content = op.content.encode("utf-8")
    if file.after == content:
        return f"A {op.path} (already in place)"
    replaced = file.after is not None
    file.after = content
    return f"A {op.path}" + (" (replaced the file there)" if replaced else "")


def _delete(file: _File) -> str:
    if file.after is None:
        return f"D {file.path} (already gone)"
    file.after = None
    return f"D {file.path}"


def _update(source: _File, target: _File | None, op: UpdateFile) -> str:
    shown = f"{op.path} -> {op.move_to}" if target is not None else op.path
    if source.after is None:
        if target is not None and target.after is not None:
            text = file_text(target.after, op.move_to or op.path, "apply_patch")
            if _done(_lines(text)[0], op.hunks):
                return f"M {shown} (already in place)"
        raise ToolFailure(
            f"the patch cannot be applied, nothing was written: '*** Update File: {op.path}' (patch line "
            f"{op.line}): the file does not exist"
        )
    text = file_text(source.after, op.path, "apply_patch")
    lines, eol = _lines(text)
    done = _done(lines, op.hunks)
    if done:
        new = text
    else:
        result = _applied(lines, op)
        new = eol.join([*result, ""]) if result else ""  # every line removed: an empty file
    if target is None:
        source.after = new.encode("utf-8")
    else:
        target.after = new.encode("utf-8")
        if target.before is None:
            target.mode = source.mode
        source.after = None
    return f"M {shown}" + (" (already in place)" if done and target is None else "")


def _lines(text: str) -> tuple[list[str], str]:
    """A file's lines (without the line break after the last) and its line break."""
    eol = "\r\n" if "\r\n" in text and text.count("\r\n") == text.count("\n") else "\n"
    lines = text.split(eol)
    if lines[-1] == "":
        lines.pop()
    return lines, eol


def _seek(
    lines: Sequence[str], pattern: Sequence[str], start: int, eof: bool, *, exact: bool = False
) -> int | None:
    """Where ``pattern`` starts in ``lines`` at or after ``start`` (at the end first when ``eof``),
    matched exactly, then (unless ``exact``) without trailing whitespace, then without
    surrounding whitespace."""
    if not pattern:
        return start
    last = len(lines) - len(pattern)
    if last < start:
        return None
    for same in _MATCHERS[:1] if exact else _MATCHERS:
        wanted = [same(line) for line in pattern]
        ranges = [range(last, last + 1), range(start, last + 1)] if eof else [range(start, last + 1)]
        for candidates in ranges:
            for i in candidates:
                if same(lines[i]) == wanted[0] and all(
                    same(lines[i + k]) == wanted[k] for k in range(1, len(wanted))
                ):
                    return i
    return None


def _find(
    lines: Sequence[str], old: Sequence[str], start: int, eof: bool, *, exact: bool = False
) -> tuple[int, int] | None:
    """Where ``old`` is (its start and its length): as given, else without its trailing empty lines
    (the blank lines a model leaves before the next operation)."""
    found = _seek(lines, old, start, eof, exact=exact)
    while found is None and old and old[-1] == "":
        old = old[:-1]
        found = _seek(lines, old, start, eof, exact=exact)
    return None if found is None else (found, len(old))


def _context(lines: Sequence[str], hunk: Hunk, start: int) -> int | None:
    """The line after the hunk's ``@@`` context lines, each found after the one before."""
    for line in hunk.context:
        found = _seek(lines, [line], start, False)
        if found is None:
            return None
        start = found + 1
    return start


def _applied(lines: list[str], op: UpdateFile) -> list[str]:
    """The lines with every hunk of ``op`` applied, or ``ToolFailure`` naming the hunk."""
    replacements: list[tuple[int, int, tuple[str, ...]]] = []
    cursor = 0
    for hunk in op.hunks:
        after = _context(lines, hunk, cursor)
        if after is None:
            missing = next(c for c in hunk.context if _seek(lines, [c], cursor, False) is None)
            raise _hunk_failure(op, hunk, f"its context line '@@ {missing.strip()}' was not found")
        if not hunk.old:
            at = after if hunk.context and not hunk.end_of_file else len(lines)
            replacements.append((at, 0, hunk.new))
            cursor = after
            continue
        found = _find(lines, hunk.old, after, hunk.end_of_file)
        if found is None:
            quoted = "\n".join(hunk.old[:_QUOTED_LINES]) + ("\n…" if len(hunk.old) > _QUOTED_LINES else "")
            raise _hunk_failure(op, hunk, f"its lines to change were not found:\n{quoted}")
        start, length = found
        new = hunk.new
        # the trailing empty lines left out of the match were context: leave them out of the new lines
        dropped = len(hunk.old) - length
        while dropped and new and new[-1] == "":
            new, dropped = new[:-1], dropped - 1
        replacements.append((start, length, new))
        cursor = start + length
    result: list[str] = []
    done = 0
    for start, length, new in sorted(replacements, key=lambda r: r[0]):
        result += [*lines[done:start], *new]
        done = max(done, start + length)
    return result + lines[done:]


def _hunk_failure(op: UpdateFile, hunk: Hunk, why: str) -> ToolFailure:
    return ToolFailure(
        f"the patch cannot be applied, nothing was written: in '*** Update File: {op.path}', the hunk "
        f"at patch line {hunk.line}: {why}"
    )


def _done(lines: Sequence[str], hunks: tuple[Hunk, ...]) -> bool:
    """Whether every hunk is already in place (see the module docstring)."""
    cursor = 0
    for hunk in hunks:
        after = _context(lines, hunk, cursor)
        if after is None:
            return False
        old = _find(lines, hunk.old, after, hunk.end_of_file) if hunk.old else None
        if not hunk.new:
            if old is not None:
                return False  # what it removes is still there
            continue
        # exactly: a hunk's new lines are written as the patch gives them, and a hunk that only
        # changes whitespace must not pass for done because its old lines match them loosely
        new = _find(lines, hunk.new, after, hunk.end_of_file, exact=True)
        if new is None:
            return False
        if old is not None and not (new[0] <= old[0] and old[0] + old[1] <= new[0] + new[1]):
            return False  # its old lines are there, and not as part of its new ones
        cursor = new[0] + new[1]
    return True


def _write(workspace: Path, file: _File, written: list[str]) -> None:
    """Write ``file.after``: replace the file (if it still holds what was read) or create it."""
    assert file.after is not None
    try:
        with walked(workspace, file.path, make_folders=True) as at:
            if file.before is None:
                if at.fd is not None:
                    raise _midway(file, written, "it appeared while the patch was applied")
                if file.mode is not None:
                    at.replace(file.after, file.mode)  # a moved file keeps its mode
                elif not at.create(file.after):
                    raise _midway(file, written, "it appeared while the patch was applied")
                return
            if at.fd is None or at.is_folder() or not stat.S_ISREG(os.fstat(at.fd).st_mode):
                raise _midway(file, written, "it changed while the patch was applied")
            with os.fdopen(os.dup(at.fd), "rb") as f:
                if f.read(EDIT_MAX_FILE_BYTES + 1) != file.before:
                    raise _midway(file, written, "it changed while the patch was applied")
            at.replace(file.after, file.mode if file.mode is not None else 0o644)
    except PermissionError:
        raise _midway(file, written, "permission denied") from None
    except OSError as exc:
        raise _midway(file, written, str(exc.strerror or exc)) from None


def _remove(workspace: Path, file: _File, written: list[str]) -> None:
    """Delete the file (gone already: nothing to do)."""
    try:
        with walked(workspace, file.path) as at:
            if at.fd is None:
                return
            if at.is_folder():
                raise _midway(file, written, "it is a folder now")
            os.unlink(at.name, dir_fd=at.folder)
            at.sync_folder()
    except PermissionError:
        raise _midway(file, written, "permission denied") from None
    except OSError as exc:
        raise _midway(file, written, str(exc.strerror or exc)) from None


def _midway(file: _File, written: list[str], why: str) -> ToolFailure:
    done = ", ".join(written) if written else "none"
    return ToolFailure(
        f"cannot write {file.path!r}: {why}. Files the patch already changed: {done}; applying the "
        "same patch again makes only the changes not yet in place"
    )
