"""GNU sed's words and scripts, read for the one way sed runs a command: ``e``.

GNU sed runs a command through its ``e`` command (``sed 'e'``, ``sed '1e git push'``) and the
``e`` flag of ``s`` (``s/.*/git push/e``): ``shell_programs`` calls a sed line unseen when its
script has either, or is read from a file (``-f``) the judge cannot see. Everything else sed
does (``s/a/b/g``, ``-i``) runs nothing.

The script is read as GNU sed 4.9 reads it (addresses, ``!``, ``{}``, labels, the text of
``a``/``i``/``c``, file names, the parts of ``s`` and ``y``), and the reading fails closed
(``sed_commands`` returns None) wherever it cannot be sure: a character sed would refuse, an
unterminated part, a bracket expression holding the delimiter (sed versions read
``s/[/]/x/`` differently), an option it does not know. ``tests/test_shell_programs.py``
checks it against the ``sed`` installed, whose ``--sandbox`` refuses ``e``, ``r`` and ``w``.

Pure: no I/O.
"""

from __future__ import annotations

_LONG_VALUED = ("--expression", "--file", "--line-length")
_LONG = (
    *_LONG_VALUED, "--quiet", "--silent", "--debug", "--follow-symlinks", "--in-place", "--null-data",
    "--zero-terminated", "--posix", "--regexp-extended", "--separate", "--sandbox", "--unbuffered",
    "--binary", "--help", "--version",
)  # fmt: skip
_SHORT_FLAGS = frozenset("nrEsuzb")
# Commands by what follows their letter.
_BARE = frozenset("{}=dDgGhHnNpPxzF")
_NUMBERED = frozenset("qQlL")
_LABELED = frozenset(":btTv")
_TO_LINE_END = frozenset("rRwWe")
_TEXT = frozenset("aic")


def sed_options(form: tuple[str, ...]) -> tuple[str, int, bool, bool, bool]:
    """What a ``sed`` command's words give it to run.

    GNU sed takes options anywhere before ``--`` (getopt permutes them); without ``-e`` or
    ``-f``, its first operand is the script.

    Args:
        form: the command's words, ``sed`` first.

    Returns:
        Its script (the ``-e`` ones joined by newlines, as sed joins them); the index after the
        last word that holds script or names its file (0 when none does); whether it reads
        script from a file; whether it has an option this module does not know; whether it has
        ``--sandbox``.
    """
    scripts: list[str] = []
    operands: list[int] = []
    last, files, unknown, sandbox = 0, False, False, False
    i = 1
    while i < len(form):
        w = form[i]
        if w == "--":
            operands += range(i + 1, len(form))
            break
        if w.startswith("--"):
            name, eq, attached = w.partition("=")
            matches = [o for o in _LONG if o.startswith(name)]
            option = name if name in _LONG else (matches[0] if len(matches) == 1 else None)
            valued = option in _LONG_VALUED
            value = attached if eq else (form[i + 1] if valued and i + 1 < len(form) else "")
            i += 2 if valued and not eq else 1
            files = files or option == "--file"
            unknown = unknown or option is None
            sandbox = sandbox or option == "--sandbox"
            if option == "--expression":
                scripts.append(value)
            last = i if option in ("--expression", "--file") else last
            continue
        if w.startswith("-") and len(w) > 1:
            letters = w[1:].lstrip("".join(_SHORT_FLAGS))
            letter = letters[:1]
            if letter in ("e", "f", "l"):
                value = letters[1:] or (form[i + 1] if i + 1 < len(form) else "")
                i += 1 if letters[1:] else 2
                if letter == "e":
                    scripts.append(value)
                files = files or letter == "f"
                last = i if letter in "ef" else last
                continue
            unknown = unknown or letter not in ("", "i")  # ``-i`` takes the rest as a suffix
            i += 1
            continue
        operands.append(i)
        i += 1
    if not scripts and not files and operands:
        scripts, last = [form[operands[0]]], operands[0] + 1
    return "\n".join(scripts), last, files, unknown, sandbox


def sed_runs(script: str) -> bool:
    """Whether a GNU sed script may run a command: an ``e`` command or flag, or a doubt.

    Args:
        script: the script, as ``sed_options`` gives it.

    Returns:
        False only when the script was read to its end and has no ``e``.
    """
    commands = sed_commands(script)
    return commands is None or "e" in commands


def sed_commands(script: str) -> str | None:
    """The command letters of a GNU sed script, and ``e``/``w`` for those flags of ``s``.

    Args:
        script: the script.

    Returns:
        The letters in order, or None where the script is not read to its end as sed would.
    """
    s, n, i = script, len(script), 0
    found: list[str] = []
    while True:
        i = _skip(s, i, " \t\n;")
        if i >= n:
            return "".join(found)
        if s[i] == "#":
            i = _line_end(s, i)
            continue
        at = _address(s, i, second=False)
        if at is not None and at < n and s[at] == ",":
            at = _address(s, _skip(s, at + 1, " \t"), second=True)
        if at is None:
            return None
        i = _skip(s, at, " \t")
        while i < n and s[i] == "!":
            i = _skip(s, i + 1, " \t")
        if i >= n:
            return None
        c = s[i]
        i += 1
        found.append(c)
        if c in _BARE:
            continue
        if c in _NUMBERED:
            i = _skip(s, i, " \t")
            while i < n and s[i].isdigit():
                i += 1
        elif c in _LABELED:
            # a label ends at ``;`` or a newline; stopping at a blank or ``}`` too reads more as
            # commands than sed does, never less
            i = _skip(s, i, " \t")
            while i < n and s[i] not in " \t\n;}":
                i += 1
        elif c in _TO_LINE_END:
            i = _line_end(s, i)
        elif c in _TEXT:
            i = _text_end(s, i)
        elif c in "sy":
            at = _parts(s, i, regex=c == "s")
            if at is None:
                return None
            i = at
            if c == "s":
                flags = _flags(s, i)
                if flags is None:
                    return None
                i, letters = flags
                found += letters
        else:
            return None


def _skip(s: str, i: int, chars: str) -> int:
    while i < len(s) and s[i] in chars:
        i += 1
    return i


def _line_end(s: str, i: int) -> int:
    end = s.find("\n", i)
    return len(s) if end < 0 else end


def _text_end(s: str, i: int) -> int:
    """The end of ``a``/``i``/``c``'s text: the first newline no backslash escapes."""
    while i < len(s) and s[i] != "\n":
        i += 2 if s[i] == "\\" else 1
    return min(i, len(s))


def _address(s: str, i: int, *, second: bool) -> int | None:
    """The index after an address at ``i`` (``i`` itself when there is none); None if unread."""
    n = len(s)
    if i >= n:
        return i
    c = s[i]
    if c.isdigit() or (second and c in "+~"):
        i = _skip(s, i + 1, "0123456789")
        if i < n and s[i] == "~" and not second:
            i = _skip(s, i + 1, "0123456789")
        return i
    if c == "$":
        return i + 1
    if c in "/\\":
        delimiter = "/" if c == "/" else s[i + 1 : i + 2]
        start = i + 1 if c == "/" else i + 2
        if delimiter in ("", "\n", "\\"):
            return None
        end = _delimited(s, start, delimiter, regex=True)
        return None if end is None else _skip(s, end + 1, "IM")
    return i


def _parts(s: str, i: int, *, regex: bool) -> int | None:
    """``s``'s regex and replacement (``y``'s two lists): the index after the last delimiter."""
    delimiter = s[i : i + 1]
    if delimiter in ("", "\n", "\\"):
        return None
    end = _delimited(s, i + 1, delimiter, regex=regex)
    if end is None:
        return None
    end = _delimited(s, end + 1, delimiter, regex=False)
    return None if end is None else end + 1


def _delimited(s: str, i: int, delimiter: str, *, regex: bool) -> int | None:
    """The index of the delimiter that ends a part starting at ``i``; None if there is none."""
    while i < len(s):
        c = s[i]
        if c == "\\":
            i += 2
            continue
        if c == delimiter:
            return i
        if c == "\n":
            return None  # sed refuses a newline here, unless a backslash escapes it
        if regex and c == "[":
            end = _bracket_end(s, i)
            if end is None or delimiter in s[i:end]:
                return None  # sed versions disagree on a delimiter inside brackets
            i = end
        i += 1
    return None


def _bracket_end(s: str, i: int) -> int | None:
    """The index of the ``]`` that ends a bracket expression opening at ``i``."""
    j = i + 1
    if j < len(s) and s[j] == "^":
        j += 1
    if j < len(s) and s[j] == "]":
        j += 1
    while j < len(s) and s[j] != "]":
        if s[j] == "[" and j + 1 < len(s) and s[j + 1] in ".:=":
            close = s.find(s[j + 1] + "]", j + 2)
            if close < 0:
                return None
            j = close + 2
            continue
        j += 1
    return j if j < len(s) else None


def _flags(s: str, i: int) -> tuple[int, list[str]] | None:
    """``s``'s flags from ``i``: the index after them, and ``e``/``w`` if there; None if unread."""
    letters: list[str] = []
    while i < len(s):
        c = s[i]
        if c in "gpiImMe0123456789 \t":
            letters += ["e"] if c == "e" else []
        elif c == "w":
            return _line_end(s, i), [*letters, "w"]
        elif c in ";\n}#":
            break
        else:
            return None
        i += 1
    return i, letters
