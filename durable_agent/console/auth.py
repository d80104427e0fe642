"""Every request to the console is checked here, before any route sees it.

A token (``AGENT_CONSOLE_TOKEN``, or one made at start and printed in the link) is required on
every request, the static files included: an API client sends it as ``Authorization: Bearer``; a
person opens ``/?token=…`` once, which sets it as an HttpOnly, SameSite=Strict cookie (as Jupyter
does) and sends them on to the same page without it, so the token is not left in the address bar
or the history. Every POST must come from the console's own origin (``Origin`` and
``Sec-Fetch-Site``, when the browser sends them), and one the cookie authenticates must also
carry the CSRF cookie's value in ``X-CSRF-Token`` (a double submit: another site can neither read
the cookie nor set the header). Every answer carries a strict Content-Security-Policy: scripts
only from the console's own files, none inline, so even text that got into the page as HTML
could not run.
"""

from __future__ import annotations

import hmac
import ipaddress
import json
import secrets
from collections.abc import Awaitable, Callable, MutableMapping
from http.cookies import SimpleCookie
from typing import Any
from urllib.parse import parse_qsl, urlencode

TOKEN_ENV = "AGENT_CONSOLE_TOKEN"
COOKIE = "durable_console"
CSRF_COOKIE = "durable_console_csrf"
CSRF_HEADER = "x-csrf-token"
# The shortest token accepted from the environment: a guessable one would make the rest moot.
MIN_TOKEN_CHARS = 16

CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; "
    "form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
)
SECURITY_HEADERS: tuple[tuple[bytes, bytes], ...] = (
    (b"content-security-policy", CSP.encode()),
    (b"x-content-type-options", b"nosniff"),
    (b"x-frame-options", b"DENY"),
    (b"referrer-policy", b"no-referrer"),
    (b"cross-origin-opener-policy", b"same-origin"),
    (b"cache-control", b"no-store"),
)
UNSAFE_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


class ConsoleAuthError(ValueError):
    """The console cannot start with this token or address (the message says why)."""


def console_token(environ: MutableMapping[str, str] | dict[str, str]) -> tuple[str, bool]:
    """The console's token: ``AGENT_CONSOLE_TOKEN``, else a new random one.

    Args:
        environ: The environment (``os.environ``).

    Returns:
        The token, and whether it was given (False: made here, to be printed).

    Raises:
        ConsoleAuthError: The variable is set but shorter than ``MIN_TOKEN_CHARS``.
    """
    given = environ.get(TOKEN_ENV, "").strip()
    if not given:
        return secrets.token_urlsafe(24), False
    if len(given) < MIN_TOKEN_CHARS:
        raise ConsoleAuthError(f"{TOKEN_ENV} is {len(given)} characters: give at least {MIN_TOKEN_CHARS}")
    return given, True


def is_loopback(host: str) -> bool:
    """Whether ``host`` (an address or a name) reaches only this machine."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a name other than localhost may resolve anywhere


def check_bind(host: str, token_given: bool) -> None:
    """Refuse to listen beyond this machine with a token nobody chose.

    Raises:
        ConsoleAuthError: ``host`` is not loopback and ``AGENT_CONSOLE_TOKEN`` is not set.
    """
    if not is_loopback(host) and not token_given:
        raise ConsoleAuthError(
            f"--bind {host} listens beyond this machine: set {TOKEN_ENV} to a token of your own "
            "(a long random one) to do that"
        )


def _headers(scope: Scope) -> dict[str, str]:
    return {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}


def _cookies(headers: dict[str, str]) -> dict[str, str]:
    jar: SimpleCookie = SimpleCookie()
    try:
        jar.load(headers.get("cookie", ""))
    except Exception:  # a malformed Cookie header authenticates nothing
        return {}
    return {k: m.value for k, m in jar.items()}


def _same(a: str | None, b: str) -> bool:
    return a is not None and hmac.compare_digest(a.encode(), b.encode())


def _cookie_header(name: str, value: str, *, http_only: bool) -> tuple[bytes, bytes]:
    flags = "; HttpOnly" if http_only else ""
    return b"set-cookie", f"{name}={value}; Path=/; SameSite=Strict{flags}".encode()


class ConsoleGuard:
    """The ASGI middleware that authenticates every request, checks every POST's origin and CSRF
    token, and adds the security headers to every answer.

    Args:
        app: The application it guards.
        token: The console's token.
    """

    def __init__(self, app: ASGIApp, token: str) -> None:
        self.app = app
        self.token = token

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = _headers(scope)
        cookies = _cookies(headers)
        path: str = scope["path"]
        method: str = scope["method"]
        query = dict(parse_qsl(scope.get("query_string", b"").decode("latin-1")))
        bearer = headers.get("authorization", "")
        by_bearer = bearer.lower().startswith("bearer ") and _same(bearer[7:].strip(), self.token)
        by_cookie = _same(cookies.get(COOKIE), self.token)
        if method == "GET" and "token" in query and not path.startswith("/api/"):
            # the link the console printed: the cookie set, then the same page without the token
            if not _same(query["token"], self.token):
                await _refuse(send, path, 401, "that token is not this console's: open the link it printed")
                return
            query.pop("token")
            location = path + (f"?{urlencode(query)}" if query else "")
            csrf = cookies.get(CSRF_COOKIE) or secrets.token_urlsafe(24)
            extra = [
                _cookie_header(COOKIE, self.token, http_only=True),
                _cookie_header(CSRF_COOKIE, csrf, http_only=False),  # the page's script reads it
                (b"location", location.encode()),
            ]
            await _answer(send, 303, b"", b"text/plain", extra)
            return
        if not (by_bearer or by_cookie):
            await _refuse(
                send,
                path,
                401,
                "a token is required: open the link the console printed, or send "
                "Authorization: Bearer <token>",
            )
            return
        if method in UNSAFE_METHODS:
            problem = _cross_site(headers, scope)
            # the cookie is sent by the browser on its own: the header proves the page sent it
            paired = bool(cookies.get(CSRF_COOKIE)) and _same(headers.get(CSRF_HEADER), cookies[CSRF_COOKIE])
            if problem is None and not by_bearer and not paired:
                problem = f"the {CSRF_HEADER} header does not match the console's CSRF cookie"
            if problem is not None:
                await _refuse(send, path, 403, f"refused: {problem}")
                return
        added: list[tuple[bytes, bytes]] = []
        if by_cookie and CSRF_COOKIE not in cookies:  # a cookie from before: give it its pair
            added.append(_cookie_header(CSRF_COOKIE, secrets.token_urlsafe(24), http_only=False))

        async def secured(message: Message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", []), *SECURITY_HEADERS, *added]
            await send(message)

        await self.app(scope, receive, secured)


def _cross_site(headers: dict[str, str], scope: Scope) -> str | None:
    """Why a POST is not from the console's own page (None: nothing says it is not)."""
    site = headers.get("sec-fetch-site")
    if site is not None and site not in ("same-origin", "none"):
        return f"a {site} request (Sec-Fetch-Site)"
    origin = headers.get("origin")
    if origin is not None:
        scheme = scope.get("scheme", "http")
        own = f"{scheme}://{headers.get('host', '')}"
        if origin != own:
            return f"a request from {origin}, not from {own} (Origin)"
    return None


async def _answer(
    send: Send, status: int, body: bytes, media: bytes, extra: list[tuple[bytes, bytes]] | None = None
) -> None:
    headers = [(b"content-type", media), (b"content-length", str(len(body)).encode()), *SECURITY_HEADERS]
    await send({"type": "http.response.start", "status": status, "headers": headers + (extra or [])})
    await send({"type": "http.response.body", "body": body})


async def _refuse(send: Send, path: str, status: int, message: str) -> None:
    if path.startswith("/api/"):
        await _answer(send, status, json.dumps({"error": message}).encode(), b"application/json")
    else:
        await _answer(send, status, f"{status}: {message}\n".encode(), b"text/plain; charset=utf-8")
