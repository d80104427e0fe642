"""The one place where an HTTP model call's failure becomes retryable or not.

Temporal owns retries: the HTTP client never retries by itself, a provider
raises ``ProviderError`` and the activity turns it into a Temporal failure.
So every decision about what is worth another attempt is made here:

- 408, 409, 429 and 5xx (and the vendors' in-stream "overloaded" errors) and
  network failures are retryable; a ``Retry-After`` becomes the next delay.
- Every other status, above all 400, 401, 403, 404 and 422, fails the run at
  once: asking again would get the same answer.
- A response that does not parse fails at once too: a server that speaks
  another protocol keeps doing so, and a crash loop helps nobody.
- Tool arguments that are JSON but beyond ``json_limits`` (nested too deep,
  NaN, a huge integer, a repeated key) fail at once: they would break the run
  further on, and a model that writes them is broken, not unlucky.
- A request larger than the model's context window is refused by the server
  with a 400 (see ``is_context_overflow`` for the shapes); it is not retried
  as it stands, and its ``ProviderError`` says ``context_overflow`` so that
  the run can make the conversation smaller and ask again.

Messages name the provider, the model and what the server said. They end up
in the workflow history, so they never carry the credential, even when a
server echoes it back.
"""

from __future__ import annotations

import email.utils
from datetime import UTC, datetime, timedelta

import httpx

from durable_agent.activities.providers.model_provider import ProviderError
from durable_agent.core import json_limits

# A server asking for a longer pause than this is capped: the activity's retry
# policy and timeouts are tuned for minutes, not hours.
MAX_RETRY_AFTER = timedelta(minutes=5)
# What is kept of an error body or an unparsable response for the message.
MAX_DETAIL_CHARS = 500

_RETRYABLE_STATUSES = frozenset({408, 409, 429})

# How servers say that a request does not fit the model's context window:
# - OpenAI (and Groq, DeepSeek...): 400, ``error.code`` "context_length_exceeded",
#   "This model's maximum context length is N tokens. However, your messages resulted in M tokens...";
# - vLLM, OpenRouter: 400, another code or none, the same "maximum context length" wording;
# - llama.cpp's server: 400, ``error.type`` "exceed_context_size_error",
#   "request (M tokens) exceeds the available context size (N tokens)";
# - Anthropic: 400 ``invalid_request_error``, "prompt is too long: M tokens > N maximum", or,
#   when the prompt fits but not with the ``max_tokens`` asked for, "input length and
#   `max_tokens` exceed context limit: M + K > N, decrease input length or `max_tokens`...".
_OVERFLOW_KINDS = frozenset({"context_length_exceeded", "exceed_context_size_error"})
_OVERFLOW_PHRASES = ("maximum context length", "exceeds the available context size")
_ANTHROPIC_OVERFLOW = ("prompt is too long", "input length and `max_tokens` exceed context limit")


def is_retryable_status(status: int) -> bool:
    """The status mapping: timeouts, conflicts, rate limits and server errors are worth retrying."""
    return status in _RETRYABLE_STATUSES or status >= 500


def parse_retry_after(headers: httpx.Headers, now: datetime | None = None) -> timedelta | None:
    """The pause a server asks for, capped at ``MAX_RETRY_AFTER``; None when absent or unusable.

    Reads ``retry-after-ms`` (sent by OpenAI) and ``Retry-After`` in both of
    its forms, delay-seconds and HTTP-date.
    """
    millis = headers.get("retry-after-ms")
    if millis is not None:
        try:
            return _capped(timedelta(milliseconds=float(millis)))
        except (ValueError, OverflowError):
            pass
    value = headers.get("retry-after")
    if value is None:
        return None
    value = value.strip()
    try:
        return _capped(timedelta(seconds=float(value)))
    except (ValueError, OverflowError):
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:  # RFC 9110 dates are GMT; a zone-less one is read as such
        when = when.replace(tzinfo=UTC)
    return _capped(when - (now or datetime.now(UTC)))


def _capped(delay: timedelta) -> timedelta | None:
    if delay != delay or delay <= timedelta(0):  # NaN, zero, or a date in the past
        return None
    return min(delay, MAX_RETRY_AFTER)


def is_context_overflow(error: object) -> bool:
    """Whether a vendor's error object (an error body's ``error``) says the request is over the window."""
    if not isinstance(error, dict):
        return False
    code, kind, message = error.get("code"), error.get("type"), error.get("message")
    if code in _OVERFLOW_KINDS or kind in _OVERFLOW_KINDS:
        return True
    if not isinstance(message, str):
        return False
    text = message.lower()
    if kind == "invalid_request_error" and text.startswith(_ANTHROPIC_OVERFLOW):
        return True
    return any(phrase in text for phrase in _OVERFLOW_PHRASES)


def _body_error(body: bytes) -> object:
    """An error body's ``error`` object, or None when the body is not such JSON."""
    try:
        data = json_limits.loads(body.decode("utf-8", errors="replace"))
    except ValueError:
        return None
    return data.get("error") if isinstance(data, dict) else None


def redact(text: str, secret: str | None) -> str:
    """``text`` without ``secret``: servers sometimes quote the key they refused."""
    return text.replace(secret, "***") if secret else text


def _shorten(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= MAX_DETAIL_CHARS else text[:MAX_DETAIL_CHARS] + "…"


def server_message(body: bytes) -> str:
    """What an error body says: the vendor's ``error.message`` if it has one, else the text."""
    text = body.decode("utf-8", errors="replace")
    try:
        # bounded: a body of 64 KB of "[" would make json.loads raise RecursionError
        data = json_limits.loads(text)
    except ValueError:
        return _shorten(text) or "(empty body)"
    if isinstance(data, dict):
        error = data.get("error", data)
        if isinstance(error, dict) and isinstance(error.get("message"), str):
            kind = error.get("type") or error.get("code")
            prefix = f"{kind}: " if isinstance(kind, str) and kind not in error["message"] else ""
            return _shorten(prefix + error["message"])
        if isinstance(error, str):
            return _shorten(error)
    return _shorten(text)


class Failures:
    """Builds one provider's errors for one model; every message names both."""

    def __init__(self, provider: str, model: str, secret: str | None) -> None:
        self.provider = provider
        self.model = model
        self._secret = secret

    def _message(self, what: str) -> str:
        """``what`` went wrong, naming the provider and the model, without the key."""
        return redact(f"model {self.provider}/{self.model}: {what}", self._secret)

    def _error(self, what: str, *, retryable: bool) -> ProviderError:
        return ProviderError(self._message(what), retryable=retryable)

    def status(self, status: int, headers: httpx.Headers, body: bytes) -> ProviderError:
        """An HTTP error status, classified; a ``Retry-After`` steers the next attempt."""
        try:
            phrase = " " + httpx.codes(status).name.replace("_", " ").title()
        except ValueError:
            phrase = ""
        said = server_message(body)
        if is_retryable_status(status):
            message = self._message(f"HTTP {status}{phrase}: {said}")
            return ProviderError(message, retryable=True, retry_after=parse_retry_after(headers))
        overflow = is_context_overflow(_body_error(body))
        message = self._message(f"HTTP {status}{phrase} (not retried): {said}")
        return ProviderError(message, retryable=False, context_overflow=overflow)

    def in_stream(self, said: str, status: int | None, *, error: object = None) -> ProviderError:
        """An error event inside a stream that began well; ``status`` when the vendor gives one.

        ``error``: the vendor's error object, to tell a context overflow.
        """
        # Without a status the failure is the server's, mid-answer: worth another try.
        retryable = status is None or is_retryable_status(status)
        note = "" if retryable else " (not retried)"
        return ProviderError(
            self._message(f"error event in the response stream{note}: {_shorten(said)}"),
            retryable=retryable,
            context_overflow=not retryable and is_context_overflow(error),
        )

    def transport(self, exc: httpx.TransportError, url: httpx.URL) -> ProviderError:
        """A network failure. Everything but an unusable URL is retryable."""
        where = f"{url.scheme}://{url.netloc.decode('ascii', errors='replace')}"
        kind = type(exc).__name__
        if isinstance(exc, httpx.UnsupportedProtocol | httpx.LocalProtocolError):
            return self._error(f"cannot send the request to {where}: {kind}: {exc}", retryable=False)
        detail = str(exc) or "no detail"
        return self._error(f"network error talking to {where}: {kind}: {detail}", retryable=True)

    def unparsable(self, what: str, sample: str = "") -> ProviderError:
        """The server answered, but not in the protocol: not retried."""
        tail = f": {_shorten(sample)}" if sample else ""
        return self._error(f"the response did not parse ({what}){tail}", retryable=False)

    def ended_early(self) -> ProviderError:
        """The stream stopped before the answer was complete: a dropped connection, retried."""
        return self._error("the response stream ended before the answer was complete", retryable=True)

    def truncated_tool_call(self, name: str, max_tokens: int | None) -> ProviderError:
        """A tool call cut off by the output limit; the same limit would cut it off again."""
        limit = f"max_tokens={max_tokens}" if max_tokens else "the server's output limit"
        return self._error(
            f"the answer reached {limit} in the middle of a call to tool {name!r}; "
            "raise max_tokens for this model in the worker config",
            retryable=False,
        )

    def bad_tool_arguments(self, name: str, arguments: str) -> ProviderError:
        """The model wrote tool arguments that are not a JSON object; a new sample usually does better."""
        return self._error(
            f"the model's arguments for tool {name!r} are not a JSON object: {_shorten(arguments)}",
            retryable=True,
        )

    def refused_tool_arguments(self, name: str, reason: str) -> ProviderError:
        """Tool arguments beyond ``json_limits``: the run cannot carry them, so not retried."""
        return self._error(
            f"the model's arguments for tool {name!r} are refused (not retried): {reason}", retryable=False
        )
