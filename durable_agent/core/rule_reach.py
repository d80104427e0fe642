"""Whether a permission pattern could match a command the judge saw only the start of, and
whether it names what a program runs.

When a shell line hides part of what it runs (``git $x``: the judge sees ``git`` and
not what ``$x`` holds), a deny rule must still win if it could match some command that
starts so. ``could_match(pattern, start)`` answers that: yes when the pattern matches
``start`` itself (the hidden part may be empty) or some ``start`` + blank + more. An
empty start is "the judge saw no command word", which every pattern could match.

The second test is a full match of ``start`` + blank against the pattern's *prefix
language*, the texts that some match of the pattern begins with, built from the same
glob tokens as ``globs.translate`` (``extended=False``, as the rules use it) and the
``:*`` suffix of ``permissions``: ``*`` and ``?`` do not cross ``/``, ``**`` does, and
``:*`` adds an optional blank or colon then anything. Both are RE2 expressions, linear
in the text, so a long hidden start costs what matching its words costs.

``names_program(pattern, program, command)`` is the exception ``permissions`` makes for a
program whose code the judge cannot see (``shell_programs``): an allow rule names it when its
pattern, without its ``:*``, is the words that name what runs (``python3 -m pytest``) or begins
with them then a blank, and matches the command. Literal words: ``bash(python3 *:*)`` names no
module, and ``bash(python3:*)`` names only the interpreter.

Pure: no I/O.
"""

from __future__ import annotations

from functools import lru_cache

import re2

from durable_agent.core.globs import GlobError, compile_glob, translate

# RE2's ``\s`` in ``permissions``' suffix: the blank or colon after a ``:*`` prefix.
_SUFFIX = r"(?:[\s:].*)?"
_OPTIONS = re2.Options()
_OPTIONS.log_errors = False
_OPTIONS.dot_nl = True


_CHUNK = 16  # literal characters read as one token, so that long patterns nest shallowly


def _tokens(body: str) -> list[str]:
    """The glob's tokens: ``**/``, ``**``, ``*``, ``?``, and runs of literal characters."""
    out: list[str] = []
    i = 0
    while i < len(body):
        token = next((t for t in ("**/", "**", "*", "?") if body.startswith(t, i)), None)
        if token is None:
            if out and out[-1] not in ("**/", "**", "*", "?") and len(out[-1]) < _CHUNK:
                out[-1] += body[i]
            else:
                out.append(body[i])
            i += 1
        else:
            out.append(token)
            i += len(token)
    return out


def _prefixes(tokens: list[str], suffix: bool) -> str:
    """An RE2 expression for every text that some match of the tokens (and suffix) begins with.

    From the end: the prefixes of ``t`` then ``rest`` are the prefixes of ``t`` and
    ``t`` followed by a prefix of ``rest``; an empty prefix is always one.
    """
    rest = _SUFFIX if suffix else ""
    for token in reversed(tokens):
        if token in ("**", "**/"):
            rest = ".*"  # whatever comes, the rest can still follow (after a ``/``)
        elif token == "*":
            rest = f"[^/]*(?:{rest})"
        elif token == "?":
            rest = f"(?:[^/](?:{rest}))?"
        else:
            run = [translate(c, extended=False) for c in token]
            shorter = ["".join(run[:n]) for n in range(len(run))]
            rest = "(?:" + "|".join([*shorter, "".join(run) + f"(?:{rest})"]) + ")"
    return rest


@lru_cache(maxsize=512)
def _compiled(pattern: str) -> tuple[re2._Regexp[str], re2._Regexp[str]] | None:
    """The pattern's full and prefix expressions; None when RE2 refuses one (then it could match)."""
    prefix = pattern.endswith(":*")
    body = pattern[:-2] if prefix else pattern
    try:
        full = compile_glob(body, extended=False, suffix=_SUFFIX if prefix else "")
        return full, re2.compile(_prefixes(_tokens(body), prefix), _OPTIONS)
    except (GlobError, re2.error):
        return None


def could_match(pattern: str, start: str) -> bool:
    """Whether ``pattern`` could match a command whose text begins with ``start``.

    Args:
        pattern: a rule's pattern, as written inside ``bash(…)``.
        start: the words the judge saw, joined by single blanks; what follows is
            unseen, and may be nothing or further words.

    Returns:
        True when some command starting with ``start`` (then nothing, or a blank and
        anything) would match ``pattern``.
    """
    if not start:
        return True
    compiled = _compiled(pattern)
    if compiled is None:
        return True  # fail closed
    full, prefixes = compiled
    return full.fullmatch(start) is not None or prefixes.fullmatch(start + " ") is not None


def names_program(pattern: str, program: tuple[str, ...], command: tuple[str, ...]) -> bool:
    """Whether ``pattern`` names what a program runs (see the module docstring).

    Args:
        pattern: a rule's pattern, as written inside ``bash(…)``.
        program: the words that name what the program runs (``Unseen.program``); none when
            nothing may name it.
        command: the command (the spelling) those words begin.

    Returns:
        True when the pattern is those words or begins with them and a blank, and matches
        the command.
    """
    if not program:
        return False
    words = " ".join(program)
    body = pattern[:-2] if pattern.endswith(":*") else pattern
    if body != words and not body.startswith(words + " "):
        return False
    compiled = _compiled(pattern)
    return compiled is not None and compiled[0].fullmatch(" ".join(command)) is not None
