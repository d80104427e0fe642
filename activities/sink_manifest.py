"""What the filesystem and PostgreSQL sinks check in a manifest and its parts before they
trust them: every field's type and range (a count is a whole number, a part's name is 64 hex
digits), and whether every part a manifest's chain needs is still there.

A manifest comes from disk or a database row, so anyone with access to either may have edited
it: each problem is a ``ManifestError`` with a one-line message, never a bare ``ValueError``
or ``KeyError``.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from collections.abc import Callable
from typing import Any, Final

from durable_agent.core.export import EncodingError
from durable_agent.core.export_parts import CHAIN_START
from durable_agent.core.json_limits import DOCUMENT_MAX_DEPTH, JsonLimitError
from durable_agent.core.json_limits import loads as bounded_loads

# A part's header (one line: two counts and two part names) is about 200 bytes.
HEADER_MAX_BYTES: Final = 1024
# More items than any run holds (a count past it is damage, not a long run).
MAX_ITEMS: Final = 2**40


# Parts' headers a sink keeps in memory (about half a KB each): the chains of many long runs.
HEADER_CACHE_ENTRIES: Final = 16_384


class ManifestError(EncodingError):
    """A manifest, or a part it names, is missing, damaged or does not add up."""


Header = dict[str, Any]


class HeaderCache:
    """Parts' headers by name, kept. A part's name is the digest of its bytes, so the header a
    name had once it has for ever: checking a chain then costs one listing of the names that
    are there, and reading the headers of parts not seen before."""

    def __init__(self, capacity: int = HEADER_CACHE_ENTRIES) -> None:
        self.capacity = capacity
        self._headers: OrderedDict[str, Header] = OrderedDict()

    def reader(
        self, present: set[str], read: Callable[[str], Header | None]
    ) -> Callable[[str], Header | None]:
        """Headers of the parts in ``present`` (``None`` for any other): kept ones, or ``read``."""

        def header(name: str) -> Header | None:
            if name not in present:
                return None
            found = self._headers.get(name)
            if found is not None:
                self._headers.move_to_end(name)
                return found
            found = read(name)
            if found is not None:
                self._headers[name] = found
                while len(self._headers) > self.capacity:
                    self._headers.popitem(last=False)
            return found

        return header

    def known(self, names: set[str]) -> set[str]:
        """Which of ``names`` have a kept header."""
        return {name for name in names if name in self._headers}


def part_header(head: bytes) -> dict[str, Any]:
    """A part's header from its first bytes, its counts checked (``ManifestError`` if not one)."""
    line, newline, _ = head.partition(b"\n")
    if not newline:
        raise ManifestError("a part's header has no line break")
    header = parse_json(line, "a part's header")
    if not isinstance(header, dict):
        raise ManifestError("a part's header is not an object")
    if header.get("kind") == "records":
        checked_count(header.get("new"), "a records part's count")
        return header
    for key in ("messages", "events"):
        series = header.get(key)
        if not isinstance(series, dict):
            raise ManifestError(f"a part's header has no {key}")
        checked_count(series.get("new"), f"a part's new {key}")
        part_name(series.get("prev"))
    return header


def missing_part(manifest: dict[str, Any], header: Callable[[str], dict[str, Any] | None]) -> str | None:
    """What a manifest needs that is not there: the name of the first part ``header`` cannot
    give (or why the chain does not add up), ``None`` when every part it names is there.
    Reads only the parts' headers, so it costs a few hundred bytes a part."""
    try:
        for key in ("messages", "events"):
            count, name, _ = series_of(manifest, key)
            held, seen = 0, set()
            while held < count:
                if name is None or name in seen:
                    return f"the parts hold {held} of the {count} {key} the manifest names"
                seen.add(name)
                found = header(name)
                if found is None or found.get("kind") == "records":
                    return name
                held += found[key]["new"]
                name = found[key]["prev"]
        prior = part_name(manifest.get("prior"))
        if prior is not None and header(prior) is None:
            return prior
    except ManifestError as exc:
        return str(exc)
    return None


def series_of(manifest: dict[str, Any], key: str) -> tuple[int, str | None, str]:
    """A manifest's ``messages`` or ``events``: (count, newest part, chain), each checked."""
    series = manifest.get(key)
    if not isinstance(series, dict):
        raise ManifestError(f"the manifest's {key} is not an object")
    count = checked_count(series.get("count"), f"the manifest's {key} count")
    chain = series.get("chain", CHAIN_START)
    if not isinstance(chain, str):
        raise ManifestError(f"the manifest's {key} chain is not a digest")
    return count, part_name(series.get("part")), chain


def checked_count(value: object, what: str) -> int:
    # bool is an int to Python, not a count to anyone; a string is not a number here
    if type(value) is not int or not 0 <= value <= MAX_ITEMS:
        raise ManifestError(f"{what} is {shown(value)}, not a whole number from 0 to {MAX_ITEMS}")
    return value


def part_name(value: object) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or len(value) != 64 or not all(c in "0123456789abcdef" for c in value):
        raise ManifestError(f"{shown(value)} is not the name of a part")
    return value


def shown(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 40 else f"{text[:40]}… ({len(text)} characters)"


def parse_json(data: bytes, what: str) -> Any:
    try:
        return bounded_loads(data.decode("utf-8"), max_depth=DOCUMENT_MAX_DEPTH)
    except (UnicodeDecodeError, JsonLimitError, json.JSONDecodeError) as exc:
        raise ManifestError(f"{what} is not a JSON document within limits: {exc}") from None
