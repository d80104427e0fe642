"""Payload encryption: an AES-256-GCM ``PayloadCodec`` for everything sent through Temporal.

With ``[codec]`` keys in the config, the client and the worker encrypt every payload
(workflow and activity inputs and results, heartbeats, signals, queries, updates, memos,
summaries and details, failure messages) before it leaves the process, so the server's
history holds ciphertext only. Each encrypted payload names the key that encrypted it
(``encryption-key-id``), so keys rotate: every key in the ring decrypts, only
``encrypt_with`` encrypts. Search attributes are never encoded: Temporal indexes them.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from temporalio.api.common.v1 import Payload
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.converter import DataConverter, DefaultFailureConverterWithEncodedAttributes, PayloadCodec

from durable_agent.config import CodecConfig, ConfigError

ENCODING = b"binary/encrypted"
KEY_ID_METADATA = "encryption-key-id"
KEY_BYTES = 32
NONCE_BYTES = 12


class CodecError(ValueError):
    """A payload cannot be decrypted: its key is unknown, or it fails authentication."""

    def __init__(self, message: str, key_id: str | None = None) -> None:
        super().__init__(message)
        self.key_id = key_id


@dataclass(frozen=True)
class KeyRing:
    """The keys that decrypt (by id) and the id of the one that encrypts."""

    encrypt_with: str
    keys: Mapping[str, bytes] = field(repr=False)

    def __post_init__(self) -> None:
        if self.encrypt_with not in self.keys:
            raise ValueError(f"encrypt_with {self.encrypt_with!r} is not in the key ring")
        for key_id, key in self.keys.items():
            if len(key) != KEY_BYTES:
                raise ValueError(f"key {key_id!r} has {len(key)} bytes, not {KEY_BYTES}")

    def __repr__(self) -> str:
        return f"KeyRing(encrypt_with={self.encrypt_with!r}, ids={sorted(self.keys)!r})"


def new_key() -> str:
    """A fresh random 256-bit key, base64 (the value of a ``[codec.keys]`` variable)."""
    return base64.b64encode(os.urandom(KEY_BYTES)).decode("ascii")


def _decode_key(text: str) -> bytes | None:
    text = "".join(text.split())
    # standard or URL-safe alphabet, with or without padding
    padded = text + "=" * (-len(text) % 4)
    for alphabet in (b"+/", b"-_"):
        try:
            return base64.b64decode(padded, altchars=alphabet, validate=True)
        except (binascii.Error, ValueError):
            continue
    return None


def load_keys(config: CodecConfig, environ: Mapping[str, str] = os.environ) -> KeyRing:
    """Read the keys ``config`` names from ``environ``; ``ConfigError`` when one is unusable.

    Messages name the key id and the variable, never the value.
    """
    if not config.enabled or config.encrypt_with is None:
        raise ConfigError("[codec] has no keys: payload encryption is off")
    keys: dict[str, bytes] = {}
    for key_id, variable in config.keys.items():
        where = f"[codec.keys] {key_id!r}: environment variable {variable}"
        value = environ.get(variable, "")
        if not value.strip():
            raise ConfigError(f"{where} is not set (a 32-byte key, base64; `durable-agent codec-key`)")
        key = _decode_key(value)
        if key is None:
            raise ConfigError(f"{where} is not valid base64")
        if len(key) != KEY_BYTES:
            raise ConfigError(f"{where} holds {len(key)} bytes, not {KEY_BYTES} (AES-256)")
        keys[key_id] = key
    return KeyRing(encrypt_with=config.encrypt_with, keys=keys)


def _associated_data(key_id: str) -> bytes:
    # Authenticated with the ciphertext: relabelling a payload with another key id fails,
    # even where that id names the same key.
    return b"durable-agent/aes-256-gcm/v1 key-id=" + key_id.encode("utf-8")


class AesGcmCodec(PayloadCodec):
    """AES-256-GCM over each whole serialized ``Payload`` (metadata included).

    An encrypted payload has metadata ``encoding: binary/encrypted`` and
    ``encryption-key-id: <id>``, and data ``nonce (12 bytes) + ciphertext + tag``.
    Payloads of any other encoding decode unchanged (histories from before encryption).
    """

    def __init__(self, keys: KeyRing) -> None:
        self._encrypt_with = keys.encrypt_with
        self._ciphers = {key_id: AESGCM(key) for key_id, key in keys.keys.items()}

    @property
    def key_ids(self) -> list[str]:
        """The ids of the keys that decrypt."""
        return sorted(self._ciphers)

    def encrypt(self, payload: Payload) -> Payload:
        """One payload, encrypted with the ``encrypt_with`` key."""
        key_id = self._encrypt_with
        nonce = os.urandom(NONCE_BYTES)
        sealed = self._ciphers[key_id].encrypt(nonce, payload.SerializeToString(), _associated_data(key_id))
        return Payload(
            metadata={"encoding": ENCODING, KEY_ID_METADATA: key_id.encode("utf-8")},
            data=nonce + sealed,
        )

    def decrypt(self, payload: Payload) -> Payload:
        """One payload, decrypted; returned unchanged when it is not encrypted."""
        if payload.metadata.get("encoding") != ENCODING:
            return payload
        raw_id = payload.metadata.get(KEY_ID_METADATA)
        if raw_id is None:
            raise CodecError(f"an encrypted payload has no {KEY_ID_METADATA} metadata")
        key_id = raw_id.decode("utf-8", errors="replace")
        cipher = self._ciphers.get(key_id)
        if cipher is None:
            raise CodecError(
                f"payload encrypted with key id {key_id!r}, which is not in [codec.keys] "
                f"(known: {', '.join(self.key_ids)})",
                key_id,
            )
        data = payload.data
        try:
            plain = cipher.decrypt(data[:NONCE_BYTES], data[NONCE_BYTES:], _associated_data(key_id))
        except (InvalidTag, ValueError):
            # ValueError: too short to hold a nonce and a tag
            raise CodecError(
                f"payload encrypted with key id {key_id!r} fails authentication: the key under that "
                "id is not the one that encrypted it, or the payload was altered",
                key_id,
            ) from None
        decoded = Payload()
        decoded.ParseFromString(plain)
        return decoded

    async def encode(self, payloads: Sequence[Payload]) -> list[Payload]:
        """See :py:class:`temporalio.converter.PayloadCodec`."""
        return [self.encrypt(p) for p in payloads]

    async def decode(self, payloads: Sequence[Payload]) -> list[Payload]:
        """See :py:class:`temporalio.converter.PayloadCodec`."""
        return [self.decrypt(p) for p in payloads]


def codec_for(config: CodecConfig, environ: Mapping[str, str] = os.environ) -> AesGcmCodec:
    """The codec of ``config``'s keys (``ConfigError`` when there are none or one is unusable)."""
    return AesGcmCodec(load_keys(config, environ))


def data_converter(config: CodecConfig, environ: Mapping[str, str] = os.environ) -> DataConverter:
    """The data converter for the client and the worker: pydantic's, encrypting when ``config``
    has keys. Failure messages and stack traces then go through the codec too (as encoded
    attributes), since they quote tool output and provider errors."""
    if not config.enabled:
        return pydantic_data_converter
    return dataclasses.replace(
        pydantic_data_converter,
        payload_codec=codec_for(config, environ),
        failure_converter_class=DefaultFailureConverterWithEncodedAttributes,
    )
