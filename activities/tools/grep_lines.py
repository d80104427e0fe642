"""How ``grep`` finds the lines of a file's text that may match: by one search over the whole
file where that gives the same result (the file itself is opened by ``search`` beneath the
workspace, without following links).

The bounds come from the caller (``search.grep``), which owns them.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from functools import lru_cache

import re2

# A pattern that can tell a line's start from the text's (``\A``, ``\z``, or ``m`` turned off)
# would match differently in the whole text than in a line: such patterns go line by line.
_LINE_BOUND = re.compile(r"\\[Az]|\(\?[a-zA-Z]*-")


@lru_cache(maxsize=16)
def scanner(pattern: str, case_insensitive: bool) -> re2._Regexp[bytes] | None:
    """``pattern`` for searching a whole file at once: ``^``/``$`` at line ends, never across one.

    One search over the file finds the next line worth matching at C speed
    instead of one Python call per line; the line is then matched on its own,
    so the result is the same. None when that would not be so.
    """
    if _LINE_BOUND.search(pattern):
        return None
    options = re2.Options()
    options.log_errors = False
    options.never_capture = True
    options.never_nl = True
    options.case_sensitive = not case_insensitive
    try:
        return re2.compile(b"(?m)" + pattern.encode(), options)
    except re2.error:
        return None


def candidates(
    text: str,
    regex: re2._Regexp[str],
    scan: re2._Regexp[bytes] | None,
    stopped: Callable[[], bool],
    line_budget: int,
) -> Iterator[tuple[int, str]]:
    """``(number, line)`` for the lines of ``text`` that may match, in order, until ``stopped()``.

    Lines are split on ``\\n`` only, so line numbers agree with ``read``'s.
    """
    if not text:
        return
    body = text[:-1] if text.endswith("\n") else text
    data = body.encode()
    # A whole-file search costs at most what one long line may; bigger files go line by line.
    if scan is None or len(data) * max(scan.programsize, regex.programsize) > line_budget:
        for number, line in enumerate(body.split("\n"), start=1):
            if stopped():  # each match call is bounded, so looking once a line is often enough
                return
            yield number, line
        return
    position, counted, number = 0, 0, 1
    while position <= len(data) and not stopped():
        found = scan.search(data, position)
        if found is None:
            return
        start = data.rfind(b"\n", 0, found.start()) + 1
        end = data.find(b"\n", found.start())
        end = len(data) if end == -1 else end
        number += data.count(b"\n", counted, start)
        counted = start
        yield number, data[start:end].decode()
        position = end + 1
