"""Payload encryption: an AES-256-GCM ``PayloadCodec`` for everything sent through Temporal.

With ``[codec]`` keys in the config, the client and the worker encrypt every payload
(workflow and activity inputs and results, heartbeats, signals, queries, updates, memos,
summaries and details, failure messages) before it leaves the process, so the server's
history holds ciphertext only. Each encrypted payload names the key that encrypted it
(``encryption-key-id``), so keys rotate: every key in the ring decrypts, only
``encrypt_with`` encrypts. Search attributes are never encoded: Temporal indexes them.

Encryption is also the worker's integrity check on what clients send a run (its start
input and its ``prompt``, ``steer`` and ``approve`` updates, ``core.run_api.INBOUND_TYPES``):
with keys, a worker refuses such an input when it is not encrypted (a client without the
keys sent it) or does not decrypt (another key, or altered), as a typed failure
(``PayloadRefused``): the update is rejected, the run goes on untouched; a start input
refuses the run. The codec leaves a payload it cannot decrypt as a marker payload instead of
failing the whole workflow task, and ``SealedPayloadConverter`` judges it by where it is read.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from temporalio.api.common.v1 import Payload
from temporalio.common import RawValue
from temporalio.contrib.pydantic import PydanticPayloadConverter, pydantic_data_converter
from temporalio.converter import DataConverter, DefaultFailureConverterWithEncodedAttributes, PayloadCodec
from temporalio.exceptions import ApplicationError

from durable_agent.config import CodecConfig, ConfigError
from durable_agent.core.errors import DurableAgentError
from durable_agent.core.failures import PAYLOAD_REFUSED
from durable_agent.core.run_api import is_inbound

ENCODING = b"binary/encrypted"
KEY_ID_METADATA = "encryption-key-id"
KEY_BYTES = 32
NONCE_BYTES = 12
# What ``AesGcmCodec.decode`` leaves of a payload it cannot decrypt (``marking`` codecs): no data,
# the reason in its metadata. Only ``SealedPayloadConverter`` reads it.
UNDECRYPTABLE_ENCODING = b"binary/undecryptable"
REASON_METADATA = "undecryptable-reason"
# Set by ``decode`` on each payload it decrypted (the key id), and taken off any other, so that
# the converter knows which payloads came encrypted: a client cannot forge it on a plain one.
DECRYPTED_METADATA = "durable-agent-decrypted-with"


class CodecError(DurableAgentError, ValueError):
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

    def __init__(self, keys: KeyRing, *, marking: bool = False) -> None:
        """``marking``: ``decode`` leaves a payload it cannot decrypt as a marker payload (and
        notes on each payload whether it came encrypted) instead of raising ``CodecError``, so
        that a bad payload fails what reads it (an update is rejected) rather than the whole
        workflow task it came in. ``decrypt`` always raises."""
        self._encrypt_with = keys.encrypt_with
        self._ciphers = {key_id: AESGCM(key) for key_id, key in keys.keys.items()}
        self._marking = marking

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
        if not self._marking:
            return [self.decrypt(p) for p in payloads]
        return [self._marked(p) for p in payloads]

    def _marked(self, payload: Payload) -> Payload:
        """One payload decrypted and noted so, passed on without the note when it was plain,
        or a marker payload when it does not decrypt."""
        if payload.metadata.get("encoding") != ENCODING:
            if DECRYPTED_METADATA not in payload.metadata:
                return payload
            plain = Payload()
            plain.CopyFrom(payload)
            del plain.metadata[DECRYPTED_METADATA]
            return plain
        try:
            decoded = self.decrypt(payload)
        except CodecError as exc:
            return undecryptable(str(exc), exc.key_id)
        decoded.metadata[DECRYPTED_METADATA] = payload.metadata[KEY_ID_METADATA]
        return decoded


def undecryptable(reason: str, key_id: str | None = None) -> Payload:
    """The marker payload a marking codec leaves in place of one it cannot decrypt."""
    metadata = {"encoding": UNDECRYPTABLE_ENCODING, REASON_METADATA: reason.encode("utf-8")}
    if key_id is not None:
        metadata[KEY_ID_METADATA] = key_id.encode("utf-8")
    return Payload(metadata=metadata)


class SealedPayloadConverter(PydanticPayloadConverter):
    """Pydantic's payload converter, for a client and worker with ``[codec]`` keys.

    What a client sends a run (a value of an ``INBOUND_TYPES`` type) is refused with a typed
    ``ApplicationError`` (``PayloadRefused``, not retried) when it did not decrypt, or came
    plain (unless ``accept_plaintext``): raised where the workflow reads it, it rejects that
    update, or refuses the run at its start, instead of failing a workflow task. Any other
    payload that did not decrypt raises ``CodecError`` where it is read, as the codec did.
    """

    accept_plaintext: ClassVar[bool] = False

    def from_payloads(self, payloads: Sequence[Payload], type_hints: list[type] | None = None) -> list[Any]:
        """See :py:class:`temporalio.converter.PayloadConverter`."""
        hints: list[Any] = list(type_hints or [])
        for index, payload in enumerate(payloads):
            hint = hints[index] if index < len(hints) else None
            if hint is RawValue:
                continue  # read later, by whoever asked for it raw
            refusal = self._refusal(payload, is_inbound(hint))
            if refusal is not None:
                raise refusal
        return super().from_payloads(payloads, type_hints)

    def _refusal(self, payload: Payload, inbound: bool) -> Exception | None:
        encoding = payload.metadata.get("encoding")
        if encoding == UNDECRYPTABLE_ENCODING:
            reason = payload.metadata.get(REASON_METADATA, b"").decode("utf-8", errors="replace")
            if not inbound:
                key_id = payload.metadata.get(KEY_ID_METADATA)
                return CodecError(reason, key_id.decode("utf-8", errors="replace") if key_id else None)
            return ApplicationError(
                f"refused: the input does not decrypt with this worker's [codec] keys ({reason})",
                type=PAYLOAD_REFUSED,
                non_retryable=True,
            )
        if inbound and not self.accept_plaintext and DECRYPTED_METADATA not in payload.metadata:
            return ApplicationError(
                "refused: the input is not encrypted, and this worker's [codec] takes only input "
                "encrypted with its keys (send it with a client that has them)",
                type=PAYLOAD_REFUSED,
                non_retryable=True,
            )
        return None


class PlaintextTolerantConverter(SealedPayloadConverter):
    """``SealedPayloadConverter`` for ``[codec] accept_plaintext``: plain input is taken (while
    runs started before encryption was turned on still run)."""

    accept_plaintext = True


def codec_for(
    config: CodecConfig, environ: Mapping[str, str] = os.environ, *, marking: bool = False
) -> AesGcmCodec:
    """The codec of ``config``'s keys (``ConfigError`` when there are none or one is unusable);
    ``marking``: see ``AesGcmCodec``."""
    return AesGcmCodec(load_keys(config, environ), marking=marking)


def data_converter(config: CodecConfig, environ: Mapping[str, str] = os.environ) -> DataConverter:
    """The data converter for the client and the worker: pydantic's, encrypting when ``config``
    has keys. Failure messages and stack traces then go through the codec too (as encoded
    attributes), since they quote tool output and provider errors; and what clients send a run
    must come encrypted (``SealedPayloadConverter``)."""
    if not config.enabled:
        return pydantic_data_converter
    converter = PlaintextTolerantConverter if config.accept_plaintext else SealedPayloadConverter
    return dataclasses.replace(
        pydantic_data_converter,
        payload_converter_class=converter,
        payload_codec=codec_for(config, environ, marking=True),
        failure_converter_class=DefaultFailureConverterWithEncodedAttributes,
    )
