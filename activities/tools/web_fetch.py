"""The ``web_fetch`` tool: one GET over HTTP(S), its page shown as markdown or text.

Which hosts a run may fetch from is decided by its permission rules
(``web_fetch(domain:HOST)``): the workflow judges the URL the model gave, and
this module judges every redirect, since the workflow never sees them. A hop
to another host runs only when the rules allow that host outright (one that
needs a person's approval is refused, and the model can ask for that URL
itself).

Where the worker may connect is decided here, whatever the rules say: every
address a host resolves to must be a public one (no loopback, private,
link-local, such as the cloud metadata service at 169.254.169.254, multicast
or reserved address, IPv4 inside IPv6 included), unless
``[tools.web_fetch] allow_private_addresses`` is on. A host name is resolved
once, its addresses checked, and the request sent to a checked address with
the host name kept in the ``Host`` header and in TLS (SNI and the
certificate's name): HTTP never resolves the name again, so a DNS answer that
changes between the check and the connection (DNS rebinding) cannot lead it
elsewhere. No proxy from the environment is used (it would connect for us, to
addresses we never checked), and no cookie is kept between hops.

What is shown of a page is ``web_page``'s business. Size and time are
bounded: the body is streamed and cut at ``max_bytes``, the whole fetch
(lookups, redirects and body) stops after ``timeout_seconds``, and the text
shown is ``READ_MAX_BYTES`` at a time, with the ``offset`` to read on. A bad
status, a timeout, a refused address or a refused content type is a tool
error the model sees; a connection broken while a response is read is
raised, and Temporal runs the call again.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
import ssl
from collections.abc import Awaitable, Callable
from functools import lru_cache
from http.cookiejar import CookieJar, DefaultCookiePolicy
from pathlib import Path

import httpx

from durable_agent.activities.tools.tool import CURRENT_CALL, ToolFailure
from durable_agent.activities.tools.web_page import (
    Page,
    decode,
    media_type,
    page_kind,
    page_text,
    shown,
    sniffed_kind,
)
from durable_agent.config import WebFetchConfig
from durable_agent.core.permissions import DOMAIN_PREFIX, PermissionPolicy
from durable_agent.core.tool_args import WEB_FETCH_MAX_REDIRECTS, WebFetchArgs, url_host

TOOL = "web_fetch"
REDIRECTS = frozenset({301, 302, 303, 307, 308})
# The body of an error status shown with it, at most (an API's error often says what went wrong).
ERROR_EXCERPT_BYTES = 2_000
Resolver = Callable[[str, int], Awaitable[list[str]]]
AddressCheck = Callable[[str], str | None]


# IPv6 prefixes that carry an IPv4 address to reach in their last 32 bits: IPv4-mapped addresses
# (a dual-stack socket's IPv4) and NAT64's well-known prefix. Judged by that IPv4 address alone.
_CARRY_IPV4 = (ipaddress.IPv6Network("::ffff:0:0/96"), ipaddress.IPv6Network("64:ff9b::/96"))


def refused_address(address: str) -> str | None:
    """Why the worker must not connect to ``address`` (an IP address), or None when it is public.

    An IPv6 address that stands for an IPv4 one (IPv4-mapped ``::ffff:a.b.c.d``,
    NAT64's ``64:ff9b::/96``) is judged by that IPv4 address; one that tunnels to
    an IPv4 address (6to4, Teredo) by both.
    """
    ip = ipaddress.ip_address(address.partition("%")[0])
    candidates: list[ipaddress.IPv4Address | ipaddress.IPv6Address] = [ip]
    if isinstance(ip, ipaddress.IPv6Address):
        if any(ip in network for network in _CARRY_IPV4):
            candidates = [ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)]
        if ip.sixtofour is not None:
            candidates.append(ip.sixtofour)
        if ip.teredo is not None:
            candidates.append(ip.teredo[1])
    for candidate in candidates:
        kind = _kind_of(candidate)
        if kind is not None:
            return f"{address} ({kind})"
    return None


def _kind_of(ip: ipaddress.IPv4Address | ipaddress.IPv6Address) -> str | None:
    if ip.is_unspecified:
        return "unspecified"
    if ip.is_loopback:
        return "loopback"
    if ip.is_link_local:
        return "link-local"
    if ip.is_multicast:
        return "multicast"
    if ip.is_private or (isinstance(ip, ipaddress.IPv6Address) and ip.is_site_local):
        return "private"
    if ip.is_reserved:
        return "reserved"
    if not ip.is_global:
        return "not public"
    return None


async def resolve(host: str, port: int) -> list[str]:
    """The addresses ``host`` resolves to (each once, in the resolver's order); ``ToolFailure``
    when it does not resolve."""
    loop = asyncio.get_running_loop()
    try:
        infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError) as exc:
        raise ToolFailure(f"web_fetch cannot resolve {host}: {exc}") from None
    return list(dict.fromkeys(str(info[4][0]) for info in infos))


@lru_cache(maxsize=1)
def _tls() -> ssl.SSLContext:
    # The worker's CA settings (SSL_CERT_FILE, SSL_CERT_DIR) count, though proxies from the
    # environment do not (the client's ``trust_env`` is off for those).
    return httpx.create_ssl_context(trust_env=True)


def _cookies() -> CookieJar:
    return CookieJar(policy=DefaultCookiePolicy(allowed_domains=[]))


class Fetcher:
    """Fetches pages within ``settings``; ``resolver`` and ``address_check`` are seams for tests."""

    def __init__(
        self,
        settings: WebFetchConfig | None = None,
        *,
        resolver: Resolver = resolve,
        address_check: AddressCheck = refused_address,
    ) -> None:
        self.settings = settings or WebFetchConfig()
        self.resolver = resolver
        self.address_check = address_check

    async def __call__(self, args: WebFetchArgs, workspace: Path) -> str:
        """The tool: fetch ``args.url`` under the rules of the call the activity runs."""
        call = CURRENT_CALL.get()
        return await self.fetch_text(args, call.permissions if call is not None else None)

    async def fetch_text(self, args: WebFetchArgs, policy: PermissionPolicy | None) -> str:
        """Fetch ``args.url`` and show it (see the module docstring).

        Args:
            args: the call's arguments.
            policy: the run's rules, for the hosts redirects lead to (None: only the first host).

        Returns:
            The final URL, status and content type, then the page's text from ``args.offset``.
        """
        timeout = self.settings.timeout_seconds
        try:
            async with asyncio.timeout(timeout):
                page = await self.fetch(args.url, policy)
        except (TimeoutError, httpx.TimeoutException):
            raise ToolFailure(f"web_fetch {args.url} timed out after {timeout:g} s") from None
        # HTML parsing takes a while on a large page: off the worker's event loop
        title, text = await asyncio.to_thread(page_text, page)
        return shown(page, title, text, args.offset, self.settings.max_bytes)

    async def fetch(self, url: str, policy: PermissionPolicy | None) -> Page:
        """The response at the end of ``url``'s redirects, its body read up to ``max_bytes``."""
        first_host = checked_host(url)
        current = httpx.URL(url)
        first = str(current)
        client = httpx.AsyncClient(
            # Temporal retries the activity; the transport retrying a connect would only hide it
            transport=httpx.AsyncHTTPTransport(retries=0, verify=_tls()),
            follow_redirects=False,
            trust_env=False,
            cookies=_cookies(),
            timeout=self.settings.timeout_seconds,
            headers={
                "User-Agent": "durable-agent-web-fetch/1",
                "Accept": "text/html, application/xhtml+xml, text/*;q=0.9, application/json;q=0.9",
                # Uncompressed where the server agrees: a compressed body is decoded a chunk at a
                # time, and a small chunk can decode to megabytes before ``max_bytes`` is counted.
                "Accept-Encoding": "identity",
            },
        )
        async with client:
            for hop in range(WEB_FETCH_MAX_REDIRECTS + 1):
                host = first_host if hop == 0 else checked_host(str(current))
                if host != first_host:
                    judge_redirect(policy, host, str(current))
                page = await self._get(client, current, host, first)
                if isinstance(page, Page):
                    return page
                current = page
        raise ToolFailure(f"web_fetch {url}: more than {WEB_FETCH_MAX_REDIRECTS} redirects")

    async def _get(
        self, client: httpx.AsyncClient, url: httpx.URL, host: str, first: str
    ) -> Page | httpx.URL:
        """One hop: the page, or the URL a redirect leads to."""
        port = url.port or (443 if url.scheme == "https" else 80)
        addresses = await self.resolver(host, port)
        if not addresses:
            raise ToolFailure(f"web_fetch cannot resolve {host}")
        if not self.settings.allow_private_addresses:
            for address in addresses:
                if (why := self.address_check(address)) is not None:
                    raise ToolFailure(
                        f"web_fetch refused {url}: {host} resolves to {why}; web_fetch does not "
                        "connect to private, loopback or link-local addresses"
                    )
        response = await _send(client, url, host, addresses)
        try:
            location = response.headers.get("location")
            if response.status_code in REDIRECTS and location:
                try:
                    target = url.join(location.strip())
                except httpx.InvalidURL as exc:
                    raise ToolFailure(f"web_fetch {url}: redirected to an invalid URL: {exc}") from None
                if target.scheme not in ("http", "https"):
                    raise ToolFailure(f"web_fetch {url}: redirected to {target}, not an http(s) URL")
                return target
            return await _page(response, url, first, self.settings.max_bytes)
        finally:
            await response.aclose()


def checked_host(url: str) -> str:
    """``url``'s host as the rules see it, when the HTTP library reads the same host from it.

    The workflow judged the host ``url_host`` reads; the request goes where httpx
    reads. Where two parsers could disagree (odd escapes, a backslash), the call is
    refused instead of guessing which one the rules meant.
    """
    try:
        host = url_host(url)
        parsed = httpx.URL(url)
    except (ValueError, httpx.InvalidURL) as exc:
        raise ToolFailure(f"web_fetch cannot fetch {url}: {exc}") from None
    if parsed.scheme not in ("http", "https"):
        raise ToolFailure(f"web_fetch cannot fetch {url}: only http:// and https:// URLs are fetched")
    read = parsed.raw_host.decode("ascii").lower().removesuffix(".")
    if read != host:
        raise ToolFailure(f"web_fetch cannot fetch {url}: its host is ambiguous ({host!r} or {read!r})")
    return host


def judge_redirect(policy: PermissionPolicy | None, host: str, url: str) -> None:
    """Refuse (``ToolFailure``) a redirect to ``host`` unless the rules allow it outright."""
    target = DOMAIN_PREFIX + host
    if policy is None:
        raise ToolFailure(f"web_fetch was redirected to {url}: no rules to judge {target} by")
    decision = policy.decide(TOOL, target)
    if decision == "ask":
        raise ToolFailure(
            f"web_fetch was redirected to {url}, and {target} needs a person's approval: call "
            "web_fetch with that URL to ask for it"
        )
    if decision != "allow":
        raise ToolFailure(
            f"permission denied: web_fetch was redirected to {url}, and {target} is not allowed "
            "by the run's permissions"
        )


async def _send(client: httpx.AsyncClient, url: httpx.URL, host: str, addresses: list[str]) -> httpx.Response:
    """GET ``url`` from the first of ``addresses`` that answers, its name kept in ``Host`` and TLS.

    The URL is rewritten to the checked address, so httpx connects there and never resolves
    the name itself; the ``Host`` header and httpcore's ``sni_hostname`` extension (the name
    TLS sends and checks the certificate against) carry the name the server expects. This
    pins the connection with public httpx APIs only: checking inside the connection instead
    would need httpcore's network backend, which httpx's transport does not expose.
    """
    failure: Exception | None = None
    for address in addresses:
        try:
            request = client.build_request(
                "GET",
                url.copy_with(host=address),
                headers={"Host": url.netloc.decode("ascii")},
                extensions={"sni_hostname": host} if url.scheme == "https" else {},
            )
            return await client.send(request, stream=True)
        except httpx.ConnectError as exc:  # this address does not answer (or TLS failed): the next
            failure = exc
        except (httpx.UnsupportedProtocol, httpx.InvalidURL) as exc:
            raise ToolFailure(f"web_fetch {url}: {exc}") from None
    raise ToolFailure(f"web_fetch cannot connect to {host}: {failure}")


async def _page(response: httpx.Response, url: httpx.URL, first: str, max_bytes: int) -> Page:
    """The response as a page, its body read; ``ToolFailure`` for an error status or a type not shown."""
    content_type = response.headers.get("content-type", "")
    media = media_type(content_type)
    kind = page_kind(media)
    if response.status_code >= 400:
        # the start of a text answer (an API's error says what went wrong); not an HTML error page
        excerpt, _ = await _read(response, ERROR_EXCERPT_BYTES) if kind == "text" else (b"", False)
        said = decode(excerpt, response.charset_encoding).strip()
        tail = f"; the server said:\n{said}" if said else ""
        raise ToolFailure(f"web_fetch {url}: HTTP {response.status_code} {response.reason_phrase}{tail}")
    if media and kind is None:
        raise ToolFailure(
            f"web_fetch {url}: the content is {media}, which web_fetch does not show "
            "(it reads HTML, text and JSON)"
        )
    body, cut = await _read(response, max_bytes)
    if not media:
        kind = sniffed_kind(body)
        if kind is None:
            raise ToolFailure(f"web_fetch {url}: the content has no type and is not text")
    assert kind is not None
    return Page(
        first_url=first,
        url=str(url),
        status=response.status_code,
        reason=response.reason_phrase,
        content_type=content_type or "(none)",
        kind=kind,
        body=body,
        charset=response.charset_encoding,
        cut=cut,
    )


async def _read(response: httpx.Response, limit: int) -> tuple[bytes, bool]:
    """The body's first ``limit`` bytes, streamed; and whether there was more."""
    chunks: list[bytes] = []
    size = 0
    try:
        async for chunk in response.aiter_bytes():
            room = limit - size
            if len(chunk) > room:
                chunks.append(chunk[:room])
                return b"".join(chunks), True
            chunks.append(chunk)
            size += len(chunk)
    except httpx.DecodingError as exc:
        raise ToolFailure(f"web_fetch {response.request.url}: the body cannot be decoded: {exc}") from None
    return b"".join(chunks), False
