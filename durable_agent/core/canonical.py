"""Canonical JSON and content digests, as the checkpoint contract defines them."""

from __future__ import annotations

import hashlib
import json
from typing import Any

from pydantic import BaseModel

from durable_agent.core.errors import DurableAgentError


class CanonicalJsonError(DurableAgentError, ValueError):
    """The value has no canonical JSON form: NaN or an infinity, a string with a lone surrogate,
    or it nests too deep to encode.

    Raised instead of emitting text that is not JSON (``NaN``) or of the
    encoder's own ``RecursionError``; a ``ValueError``, as before.
    """


def canonical_bytes(value: Any) -> bytes:
    """UTF-8 JSON with sorted keys, no insignificant white space, array order kept."""
    try:
        if isinstance(value, BaseModel):
            value = value.model_dump(mode="json", by_alias=True)
        text = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    except RecursionError:
        raise CanonicalJsonError("the value nests too deep to encode as JSON") from None
    except ValueError as exc:
        # json.dumps' "Out of range float values are not JSON compliant", Python's limit on
        # turning a huge integer into text, or pydantic's "Maximum serialization depth exceeded"
        if "Out of range float" in str(exc):
            raise CanonicalJsonError("NaN and Infinity have no canonical JSON form") from None
        raise CanonicalJsonError(f"the value has no canonical JSON form: {exc}") from None
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError as exc:
        # a string with a lone surrogate (U+D800 to U+DFFF), which no UTF-8 encoder takes; the
        # text a run records is cleaned before it gets here (``core/surrogates.py``)
        where = repr(exc.object[max(exc.start - 20, 0) : exc.end + 20])
        raise CanonicalJsonError(
            f"a string holds a lone surrogate, which has no UTF-8 form (near {where})"
        ) from None


def sha256_digest(data: bytes) -> str:
    """``sha256:`` plus the lowercase hex digest, the form every digest field uses."""
    return "sha256:" + hashlib.sha256(data).hexdigest()


def digest_of(value: Any) -> str:
    """The digest of ``value``'s canonical JSON."""
    return sha256_digest(canonical_bytes(value))
