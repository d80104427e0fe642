"""Glob patterns as regular expressions over ``/``-separated paths.

One translation for the permission rules and for the ``glob`` / ``grep``
tools, so the two can never disagree on what ``*`` or ``**`` means.

Patterns are compiled with RE2, whose matching time is linear in the text:
a rule or a glob such as ``*a*a*a*a*a*a*c`` cannot make a long name (chosen
by the model) take minutes, as a backtracking engine would.
"""

from __future__ import annotations

from functools import lru_cache

import re2

from durable_agent.core.errors import DurableAgentError

_OPTIONS = re2.Options()
_OPTIONS.log_errors = False  # a bad pattern is reported by the caller, not printed to stderr
_OPTIONS.dot_nl = True


class GlobError(DurableAgentError, ValueError):
    """A glob (or the regular expression it stands for) that cannot be compiled."""


@lru_cache(maxsize=1024)
def compile_glob(pattern: str, *, extended: bool, suffix: str = "") -> re2._Regexp[str]:
    """``pattern`` compiled for ``fullmatch`` in linear time; ``suffix`` is raw RE2 appended to it."""
    try:
        return re2.compile(translate(pattern, extended=extended) + suffix, _OPTIONS)
    except re2.error as exc:
        raise GlobError(f"invalid pattern {pattern!r}: {_reason(exc)}") from None


def _reason(exc: Exception) -> str:
    arg = exc.args[0] if exc.args else exc
    return arg.decode(errors="replace") if isinstance(arg, bytes) else str(arg)


def _escape(c: str) -> str:
    """One literal character, in a form RE2 reads the same whatever it is."""
    return c if c.isascii() and (c.isalnum() or c == "_") else f"\\x{{{ord(c):X}}}"


def translate(pattern: str, *, extended: bool) -> str:
    """The regular expression (without anchors) that ``pattern`` stands for.

    ``*`` and ``?`` do not cross ``/``, ``**`` does (``a/**/b`` also matches
    ``a/b``), and ``*`` matches names that start with a dot. ``extended`` adds
    character classes (``[abc]``, ``[!abc]``) and alternatives (``{x,y}``);
    without it those characters are literal.
    """
    out: list[str] = []
    i, n = 0, len(pattern)
    while i < n:
        c = pattern[i]
        if pattern.startswith("**/", i):
            out.append("(?:.*/)?")
            i += 3
        elif pattern.startswith("**", i):
            out.append(".*")
            i += 2
        elif c == "*":
            out.append("[^/]*")
            i += 1
        elif c == "?":
            out.append("[^/]")
            i += 1
        elif extended and c == "[" and (end := _class_end(pattern, i)) != -1:
            body = pattern[i + 1 : end]
            negate = body[:1] in ("!", "^")
            body = "".join(_escape(ch) if ch != "-" else ch for ch in (body[1:] if negate else body))
            out.append(f"[^/{body}]" if negate else f"[{body}]")
            i = end + 1
        elif extended and c == "{" and (end := pattern.find("}", i)) != -1:
            alternatives = pattern[i + 1 : end].split(",")
            out.append("(?:" + "|".join(translate(alt, extended=True) for alt in alternatives) + ")")
            i = end + 1
        else:
            out.append(_escape(c))
            i += 1
    return "".join(out)


def _class_end(pattern: str, start: int) -> int:
    """Index of the ``]`` closing the class opened at ``start``, or -1 (then ``[`` is literal)."""
    j = start + 1
    if j < len(pattern) and pattern[j] in "!^":
        j += 1
    if j < len(pattern) and pattern[j] == "]":
        j += 1  # a ``]`` first in the class is part of it
    return pattern.find("]", j)
