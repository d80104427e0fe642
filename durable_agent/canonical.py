"""Canonical JSON and content digests, as the checkpoint contract defines them."""

from __future__ import annotations

import hashlib
import json
from typing import Any

from pydantic import BaseModel


def canonical_bytes(value: Any) -> bytes:
    """UTF-8 JSON with sorted keys, no insignificant white space, array order kept."""
    if isinstance(value, BaseModel):
        value = value.model_dump(mode="json", by_alias=True)
    return json.dumps(
        value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
    ).encode("utf-8")


def sha256_digest(data: bytes) -> str:
    """``sha256:`` plus the lowercase hex digest, the form every digest field uses."""
    return "sha256:" + hashlib.sha256(data).hexdigest()


def digest_of(value: Any) -> str:
    return sha256_digest(canonical_bytes(value))
