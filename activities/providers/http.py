"""Model providers over HTTP: what the OpenAI and Anthropic kinds share.

Each provider owns one ``httpx.AsyncClient``, created on first use, that never
retries by itself (Temporal owns retries), streams every answer as server-sent
events and turns every failure into a ``ProviderError`` through ``errors``.
The wire formats live in ``openai`` and ``anthropic``.
"""

from __future__ import annotations

import asyncio
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from typing import Any, TypeVar

import httpx
from pydantic import AliasPath, BaseModel, ConfigDict, Field, ValidationError

from durable_agent.activities.providers.http_errors import Failures
from durable_agent.activities.providers.model_provider import TextSink
from durable_agent.activities.providers.sse import SseEvent, aiter_sse, is_event_stream
from durable_agent.config import ConfigError, HttpProviderConfig
from durable_agent.core.errors import validation_message
from durable_agent.core.json_limits import TOOL_ARGUMENTS_MAX_DEPTH, JsonLimitError, check_value, loads
from durable_agent.core.models import ModelResponse

# Enough of an error body to quote the server; the rest is not read.
_ERROR_BODY_LIMIT = 64 * 1024
# Connecting never deserves the long wait that a model's first token may.
_CONNECT_TIMEOUT_SECONDS = 10.0
USER_AGENT = "durable-agent/0.1"


def checked_key(key: str, env_var: str, provider: str) -> str:
    """The key as it goes into a header; a clear error if it cannot, without showing it.

    A key pasted with a trailing newline is common and harmless, so outer
    whitespace is dropped; anything else a header cannot carry is refused.
    """
    key = key.strip()
    if not key.isascii() or not key.isprintable() or any(c.isspace() for c in key):
        raise ConfigError(
            f"provider {provider!r}: the credential in {env_var} holds characters an HTTP header "
            "cannot carry (spaces, line breaks or non-ASCII)"
        )
    return key


class Wire(BaseModel):
    """Base of the models that read a vendor's stream.

    New fields and event types arrive without a version bump: unknown ones are ignored, and
    only what is read must have its type.
    """

    model_config = ConfigDict(extra="ignore")


class TypedEvent(Wire):
    """An event of a stream that names its kind in ``type``: the Messages API's, the Responses API's."""

    type: str


WireT = TypeVar("WireT", bound=Wire)
T = TypeVar("T")


def nested(first: str, *rest: str) -> Any:
    """A ``Wire`` field read from deeper in the object, as ``nested("function", "name")``.

    Saves a model for an object of which one field is read. The field is None where
    the path is missing or passes through something other than an object.
    """
    return Field(None, validation_alias=AliasPath(first, *rest))


class StreamReader(ABC):
    """Reads one streamed answer into the step: fed each event's data, then asked for the response.

    Holds what every wire's reader needs: the call's failures and its output limit.
    """

    def __init__(self, failures: Failures, max_tokens: int | None) -> None:
        self.failures = failures
        self.max_tokens = max_tokens

    @abstractmethod
    def feed(self, data: str, on_text: TextSink) -> None:
        """Take one event's data; answer text goes on to ``on_text`` as it comes."""

    @abstractmethod
    def response(self) -> ModelResponse:
        """The finished step; a stream that ended before it was complete raises ``ended_early``."""

    @property
    def finished(self) -> bool:
        """The answer's last event came, so the rest of the stream is not read; a wire without
        such an event is read to its end."""
        return False

    def parse(self, wire: type[WireT], data: str, refusal: str) -> WireT:
        """One event's ``data`` read as ``wire``; anything else is ``unparsable``, said as ``refusal``.

        Args:
            wire: the model of the event (or chunk).
            data: the ``data`` of one server-sent event.
            refusal: what the message says ("a stream event is not a Messages API event").

        Returns:
            The event.
        """
        try:
            return wire.model_validate_json(data)
        except ValidationError as exc:
            raise self.failures.unparsable(f"{refusal}: {validation_message(exc)}", data) from None

    def carried(self, value: T | None, event: TypedEvent, field: str, data: str = "") -> T:
        """``value``, which an event of this kind must carry as ``field``; without it, ``unparsable``.

        Args:
            value: the field's value in the event.
            event: the event, for its kind.
            field: the field's name on the wire ("index", "response").
            data: the event's data, quoted in the error.

        Returns:
            The value.
        """
        if value is None:
            raise self.failures.unparsable(f"a {event.type} event has no {field}", data)
        return value

    def tool_arguments(self, name: str, raw: str, *, given: dict[str, Any], cut_off: bool) -> dict[str, Any]:
        """The arguments a model wrote for tool ``name``: ``raw`` parsed, or ``given`` when it is blank.

        Arguments that are not a JSON object are ``bad_tool_arguments`` (retried: a
        new sample usually does better), or ``truncated_tool_call`` when the answer
        was ``cut_off`` by its output limit. Arguments beyond ``json_limits`` are
        refused at once: nested past ``TOOL_ARGUMENTS_MAX_DEPTH`` they would break
        the data converter, the workflow's digests and every export further on.

        Args:
            name: the tool's name.
            raw: the arguments as the model wrote them (JSON text, perhaps blank).
            given: the arguments the stream gave whole (Anthropic's ``input``), else ``{}``.
            cut_off: the answer stopped at its output limit.

        Returns:
            The arguments, a JSON object.
        """
        arguments: Any
        try:
            if raw.strip():
                arguments = loads(raw, max_depth=TOOL_ARGUMENTS_MAX_DEPTH)
            else:
                arguments = given
                check_value(given, max_depth=TOOL_ARGUMENTS_MAX_DEPTH)
        except JsonLimitError as exc:
            raise self.failures.refused_tool_arguments(name, str(exc)) from None
        except ValueError:
            arguments = None
        if not isinstance(arguments, dict):
            if cut_off:
                raise self.failures.truncated_tool_call(name, self.max_tokens)
            raise self.failures.bad_tool_arguments(name, raw)
        return arguments


class HttpProvider(ABC):
    """A streaming HTTP provider: one client, one POST per call, failures classified."""

    def __init__(self, name: str, config: HttpProviderConfig, api_key: str | None) -> None:
        self.name = name
        self.config = config
        self._api_key = api_key
        self._client: httpx.AsyncClient | None = None
        self._client_loop: asyncio.AbstractEventLoop | None = None

    @abstractmethod
    def auth_headers(self) -> dict[str, str]:
        """The headers that carry the credential; each wire protocol has its own."""

    def _http(self) -> httpx.AsyncClient:
        # Created lazily, inside the worker's event loop: pooled connections belong
        # to the loop that opened them, so a provider reused by a later loop (a
        # CLI that runs asyncio.run twice) gets a client of its own there.
        loop = asyncio.get_running_loop()
        if self._client is None or self._client_loop is not loop:
            timeout = self.config.timeout_seconds
            self._client = httpx.AsyncClient(
                transport=httpx.AsyncHTTPTransport(retries=0),
                timeout=httpx.Timeout(timeout, connect=min(timeout, _CONNECT_TIMEOUT_SECONDS)),
                follow_redirects=False,
                headers={"user-agent": USER_AGENT},
            )
            self._client_loop = loop
        return self._client

    async def aclose(self) -> None:
        """Close the pooled connections; the next call opens new ones."""
        client, self._client, self._client_loop = self._client, None, None
        if client is not None:
            await client.aclose()

    def failures(self, model: str) -> Failures:
        """The error builder for one call: names this provider and ``model``, hides the key."""
        return Failures(self.name, model, self._api_key)

    @asynccontextmanager
    async def event_stream(
        self, failures: Failures, path: str, body: dict[str, Any], headers: Mapping[str, str]
    ) -> AsyncIterator[AsyncIterator[SseEvent]]:
        """POST ``body`` to ``path`` and yield the answer's events.

        An error status, an answer that is not an event stream and a network
        failure while sending or reading all leave as ``ProviderError``. Leaving
        the block, a cancellation included, closes the response and with it the
        connection, so a cancelled call stops costing tokens.
        """
        url = httpx.URL(self.config.base_url + path)
        request_headers = {"accept": "text/event-stream", **headers, **self.auth_headers()}
        try:
            async with self._http().stream("POST", url, json=body, headers=request_headers) as response:
                if not response.is_success:
                    raw = await _read_some(response)
                    raise failures.status(response.status_code, response.headers, raw)
                if not is_event_stream(response):
                    raw = await _read_some(response)
                    content_type = response.headers.get("content-type") or "none"
                    raise failures.unparsable(
                        f"expected an event stream, got content-type {content_type}",
                        raw.decode("utf-8", errors="replace"),
                    )
                yield aiter_sse(response)
        except httpx.TransportError as exc:
            raise failures.transport(exc, url) from None
        except httpx.DecodingError as exc:
            raise failures.unparsable(f"the body could not be decoded: {exc}") from None


async def _read_some(response: httpx.Response) -> bytes:
    """At most ``_ERROR_BODY_LIMIT`` bytes of the body: enough to say what went wrong."""
    chunks: list[bytes] = []
    size = 0
    async for chunk in response.aiter_bytes():
        chunks.append(chunk)
        size += len(chunk)
        if size >= _ERROR_BODY_LIMIT:
            break
    return b"".join(chunks)[:_ERROR_BODY_LIMIT]
