"""Bounded JSON: parse text from outside (a model's tool arguments, an export file) safely.

Python's ``json`` module recurses once per nesting level, so a document like
``[[[[…]]]]`` 5,000 levels deep raises ``RecursionError`` (a ``RuntimeError``
no caller expects); it also accepts ``NaN`` and ``Infinity``, which are not
JSON, turns ``1e400`` into ``inf`` silently, and refuses integers past 4,300
digits with a bare ``ValueError``. Everything downstream has its own, lower
ceilings: pydantic's JSON parser (the Temporal data converter's) stops at 200
levels, its serializer at about 255, and canonical JSON refuses NaN.

So text from outside goes through ``loads`` here: an iterative depth scan of
the raw text first (it never recurses, and skips what is inside strings), then
``json.loads`` with hooks that refuse non-finite numbers, over-long integers
and duplicate keys. Every refusal is a ``JsonLimitError`` (a ``ValueError``)
with a one-line message. ``check_value`` holds values that are already Python
objects (a scripted answer, a parsed stream event) to the same limits.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterator
from typing import Any, Final

from durable_agent.core.errors import DurableAgentError

# A tool's arguments are a flat object in every built-in tool and seldom nest
# past a handful of levels in any tool schema. 64 leaves ample room for those,
# and keeps a model message (arguments + 5 levels of message) far below the
# 200 levels at which the data converter stops decoding an activity result.
TOOL_ARGUMENTS_MAX_DEPTH: Final = 64
# A whole document (an export file, its content, a script): its tool arguments
# sit about 8 levels down, so 200 holds every export this runtime can write
# while staying below the ~255 levels pydantic's serializer allows.
DOCUMENT_MAX_DEPTH: Final = 200
# Enough for any count, size, id or timestamp (int64 has 19 digits), and far
# below the 4,300 digits past which Python refuses to convert (quadratic cost).
MAX_INT_DIGITS: Final = 100
_MAX_INT_BITS: Final = int(MAX_INT_DIGITS / math.log10(2)) + 1

# A whole string (with its escapes), a string left open at the end, or a bracket.
_TOKENS = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"|"|[\[\]{}]', re.DOTALL)


class JsonLimitError(DurableAgentError, ValueError):
    """JSON refused for its shape: too deep, a non-finite number, a huge integer, a repeated key.

    ``offset`` is the character offset in the text where it was found, when known.
    """

    def __init__(self, message: str, offset: int | None = None) -> None:
        super().__init__(message if offset is None else f"{message} (at character {offset})")
        self.offset = offset


def check_depth(text: str, max_depth: int) -> None:
    """Raise ``JsonLimitError`` if ``text`` nests arrays or objects deeper than ``max_depth``.

    Brackets inside strings do not count. Malformed text is left for the parser
    to report: the scan only measures. It costs two to four times what
    ``json.loads`` does (10-35 ms a MB), and next to nothing for text with fewer
    brackets than the bound (any usual tool call).
    """
    if text.count("[") + text.count("{") <= max_depth:
        return  # too few brackets to go deeper, strings or not: the usual case, at C speed
    depth = 0
    for match in _TOKENS.finditer(text):
        token = match.group()
        if token in "[{":
            depth += 1
            if depth > max_depth:
                raise JsonLimitError(f"nested deeper than {max_depth} levels", match.start())
        elif token in "]}":
            depth -= 1
        elif token == '"':
            return  # a string that never ends: not JSON, which json.loads says better


def _refuse_constant(name: str) -> Any:
    raise JsonLimitError(f"{name} is not allowed (not a JSON number)")


def _bounded_int(text: str) -> int:
    digits = len(text.lstrip("-"))
    if digits > MAX_INT_DIGITS:
        raise JsonLimitError(f"an integer of {digits} digits is too long (at most {MAX_INT_DIGITS})")
    return int(text)


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        shown = text if len(text) <= 40 else text[:37] + "..."
        raise JsonLimitError(f"the number {shown} is out of range (it is not a finite double)")
    return value


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out = dict(pairs)
    if len(out) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise JsonLimitError(f"duplicate key {key!r} in an object")
            seen.add(key)
    return out


def loads(data: str | bytes, *, max_depth: int = DOCUMENT_MAX_DEPTH) -> Any:
    """``json.loads`` within limits: ``JsonLimitError`` for a refused shape, else its own errors.

    Bytes must be UTF-8 (``UnicodeDecodeError`` otherwise, a ``ValueError``);
    text that is not JSON raises ``json.JSONDecodeError`` as usual.
    """
    text = data.decode("utf-8") if isinstance(data, bytes) else data
    check_depth(text, max_depth)
    return json.loads(
        text,
        parse_constant=_refuse_constant,
        parse_int=_bounded_int,
        parse_float=_finite_float,
        object_pairs_hook=_unique_keys,
    )


def _children(value: Any, path: str) -> Iterator[tuple[Any, str]]:
    if isinstance(value, dict):
        for key, item in value.items():
            yield item, f"{path}.{key}" if isinstance(key, str) and key.isidentifier() else f"{path}[{key!r}]"
    elif isinstance(value, list | tuple):
        for i, item in enumerate(value):
            yield item, f"{path}[{i}]"


def check_value(value: Any, *, max_depth: int, path: str = "$") -> None:
    """Hold a parsed value to ``loads``' limits, without recursing; errors name the JSON path."""
    stack: list[tuple[Any, int, str]] = [(value, 0, path)]
    while stack:
        item, depth, where = stack.pop()
        if isinstance(item, dict | list | tuple):
            if depth + 1 > max_depth:
                shown = where if len(where) <= 120 else f"{where[:60]}…{where[-59:]}"
                raise JsonLimitError(f"nested deeper than {max_depth} levels at {shown}")
            stack.extend((child, depth + 1, at) for child, at in _children(item, where))
        elif isinstance(item, float) and not math.isfinite(item):
            raise JsonLimitError(f"{item!r} is not allowed at {where} (not a JSON number)")
        # bit_length bounds the digit count without turning a huge number into text
        elif isinstance(item, int) and item.bit_length() > _MAX_INT_BITS - 4:
            digits = len(str(abs(item))) if item.bit_length() <= _MAX_INT_BITS else None
            if digits is None or digits > MAX_INT_DIGITS:
                about = digits or int(item.bit_length() * math.log10(2)) + 1
                raise JsonLimitError(
                    f"an integer of {'' if digits else 'about '}{about} digits at {where} is too long "
                    f"(at most {MAX_INT_DIGITS})"
                )
