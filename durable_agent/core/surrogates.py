"""Lone surrogates in model output, replaced with U+FFFD.

JSON may escape a UTF-16 surrogate on its own (``"\\ud800"``), and Python's ``json``
module decodes it into a ``str`` that no UTF-8 encoder takes: Temporal's payloads, the
run's log and its exports would all fail on it. A model's answer is text the run keeps,
not bytes it must give back exactly, so such a code point becomes the replacement
character (as a UTF-8 decoder does with a byte it cannot read) where the answer enters
the run, once, and the run goes on.
"""

from __future__ import annotations

import re
from typing import Any, TypeVar

from pydantic import BaseModel

REPLACEMENT = "\ufffd"
_LONE_SURROGATE = re.compile("[\ud800-\udfff]")

M = TypeVar("M", bound=BaseModel)


def has_lone_surrogates(text: str) -> bool:
    """Whether ``text`` holds a surrogate code point (which no UTF-8 encoder takes)."""
    return _LONE_SURROGATE.search(text) is not None


def text_without_lone_surrogates(text: str) -> str:
    """``text`` with each surrogate code point replaced by U+FFFD."""
    return _LONE_SURROGATE.sub(REPLACEMENT, text)


def replace_lone_surrogates(value: Any) -> tuple[Any, int]:
    """``value`` (JSON-like: strings, lists, tuples, dicts with string keys, scalars) with each
    surrogate code point replaced by U+FFFD, and how many were replaced.

    Args:
        value: The value to clean; it is not changed.

    Returns:
        The cleaned value (``value`` itself when there was nothing to replace) and the count.
    """
    if isinstance(value, str):
        cleaned, count = _LONE_SURROGATE.subn(REPLACEMENT, value)
        return (cleaned, count) if count else (value, 0)
    if isinstance(value, dict):
        total, items = 0, []
        for key, item in value.items():
            new_key, in_key = replace_lone_surrogates(key)
            new_item, in_item = replace_lone_surrogates(item)
            total += in_key + in_item
            items.append((new_key, new_item))
        return (dict(items), total) if total else (value, 0)
    if isinstance(value, (list, tuple)):
        total, parts = 0, []
        for item in value:
            new_item, count = replace_lone_surrogates(item)
            total += count
            parts.append(new_item)
        return (type(value)(parts), total) if total else (value, 0)
    return value, 0


def model_without_lone_surrogates(model: M) -> tuple[M, int]:
    """``model`` with every surrogate code point in its strings replaced by U+FFFD, and how many.

    Args:
        model: A pydantic model made of JSON-like fields (a model's answer).

    Returns:
        The model (the same object when it held none) and the number replaced.
    """
    data, count = replace_lone_surrogates(model.model_dump(mode="python", by_alias=True))
    if not count:
        return model, 0
    return type(model).model_validate(data), count
