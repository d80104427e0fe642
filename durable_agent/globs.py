"""Glob patterns as regular expressions over ``/``-separated paths.

One translation for the permission rules and for the ``glob`` / ``grep``
tools, so the two can never disagree on what ``*`` or ``**`` means.
"""

from __future__ import annotations

import re


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
            body = (body[1:] if negate else body).replace("\\", "\\\\").replace("[", "\\[")
            out.append(f"[^/{body}]" if negate else f"[{body}]")
            i = end + 1
        elif extended and c == "{" and (end := pattern.find("}", i)) != -1:
            alternatives = pattern[i + 1 : end].split(",")
            out.append("(?:" + "|".join(translate(alt, extended=True) for alt in alternatives) + ")")
            i = end + 1
        else:
            out.append(re.escape(c))
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
