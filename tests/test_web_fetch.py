"""``web_fetch``: domain rules, no way into the worker's network, HTML as markdown, bounds.

A real HTTP server runs on loopback for these tests. Since loopback is what
``web_fetch`` refuses by default, the tests that fetch from it turn
``allow_private_addresses`` on (or let the address check pass that one
address, to see what it refuses on a redirect), and one checks that without it
loopback is refused before anything is sent.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from temporalio.client import Client

from durable_agent.activities import AgentActivities
from durable_agent.activities.tools.builtin import builtin_tools
from durable_agent.activities.tools.tool import ToolFailure
from durable_agent.activities.tools.web_fetch import Fetcher, refused_address
from durable_agent.config import WebFetchConfig
from durable_agent.core.builtin_catalog import BUILTIN_TOOLS
from durable_agent.core.events import ToolEndEvent
from durable_agent.core.permissions import InvalidRule, PermissionPolicy, parse_rule
from durable_agent.core.tool_args import READ_MAX_BYTES, WebFetchArgs
from durable_agent.core.tool_specs import (
    ToolCallError,
    capability_binding,
    offered_tools,
    permission_target,
    validate_args,
)
from tests.helpers import RecordingSink, running_worker, scripted_config, start, tool_call

PRIVATE_OK = WebFetchConfig(allow_private_addresses=True)
PAGE = (
    "<!doctype html><html><head><title>The Guide</title><style>p { color: red }</style>"
    "<script>document.write('tracking')</script></head><body>"
    "<h1>Install</h1><p>Run <code>pip install x</code>, then read <a href='/docs/next'>the next page</a>."
    "</p><ul><li>one</li><li>two</li></ul><a href='javascript:alert(1)'>click</a>"
    "<img src='data:image/png;base64,AAAA' alt='inline'></body></html>"
)
BIG = "".join(f"line {i:06d} {'x' * 90}\n" for i in range(3_000))  # about 300 KB


@dataclass
class Server:
    """The test's HTTP server: what it serves by path, and the requests it saw."""

    port: int = 0
    routes: dict[str, tuple[int, dict[str, str], bytes]] = field(default_factory=dict)
    seen: list[tuple[str, str]] = field(default_factory=list)  # (path, Host header)
    slow: float = 3.0

    def url(self, path: str, host: str = "127.0.0.1") -> str:
        return f"http://{host}:{self.port}{path}"


@pytest.fixture(scope="module")
def server() -> Iterator[Server]:
    state = Server()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            state.seen.append((self.path, self.headers.get("Host", "")))
            if self.path == "/slow":
                time.sleep(state.slow)
            status, headers, body = state.routes.get(
                self.path, (404, {"Content-Type": "text/plain"}, b"nope")
            )
            try:
                self.send_response(status)
                for name, value in headers.items():
                    self.send_header(name, value)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
            except (BrokenPipeError, ConnectionResetError):
                pass  # the client stopped reading: the size cut, or a timeout

        def log_message(self, format: str, *args: Any) -> None:
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    httpd.daemon_threads = True
    state.port = httpd.server_address[1]
    state.routes.update(
        {
            "/page": (200, {"Content-Type": "text/html; charset=utf-8"}, PAGE.encode()),
            "/text": (200, {"Content-Type": "text/plain; charset=utf-8"}, "plain ä text\n".encode()),
            "/data.json": (200, {"Content-Type": "application/json"}, b'{"a": [1, 2]}'),
            "/big": (200, {"Content-Type": "text/plain"}, BIG.encode()),
            "/image.png": (200, {"Content-Type": "image/png"}, b"\x89PNG\r\n\x1a\n"),
            "/missing": (404, {"Content-Type": "application/json"}, b'{"error": "no such page"}'),
            "/moved": (302, {"Location": "/page"}, b""),
            "/to-localhost": (302, {"Location": state.url("/text", "localhost")}, b""),
            "/to-other-port": (302, {"Location": f"http://127.0.0.2:{state.port}/text"}, b""),
            "/to-metadata": (302, {"Location": "http://169.254.169.254/latest/meta-data/"}, b""),
            "/to-mapped": (302, {"Location": f"http://[::ffff:127.0.0.1]:{state.port}/text"}, b""),
            "/to-file": (302, {"Location": "file:///etc/passwd"}, b""),
            "/loop": (302, {"Location": "/loop"}, b""),
        }
    )
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield state
    httpd.shutdown()
    httpd.server_close()


def policy(*allow: str, deny: tuple[str, ...] = (), ask: tuple[str, ...] = ()) -> PermissionPolicy:
    return PermissionPolicy(allow=allow, deny=deny, ask=ask)


LOCAL = policy("web_fetch(domain:127.0.0.1)")


async def fetch(
    url: str,
    rules: PermissionPolicy | None = LOCAL,
    settings: WebFetchConfig = PRIVATE_OK,
    args: dict[str, Any] | None = None,
    **seams: Any,
) -> str:
    """``web_fetch`` of ``url`` under ``rules``, as the tool activity runs it."""
    return await Fetcher(settings, **seams).fetch_text(WebFetchArgs(url=url, **(args or {})), rules)


# --- the rules: domain:HOST, denied unless a rule names web_fetch ------------------------------


def test_the_target_is_the_urls_host() -> None:
    offer = BUILTIN_TOOLS["web_fetch"].offer()

    def target(url: str) -> str | None:
        return permission_target(offer, {"url": url})

    assert target("https://docs.python.org/3/library/") == "domain:docs.python.org"
    assert target("HTTPS://Docs.Python.ORG.:443/x?y#z") == "domain:docs.python.org"
    assert target("http://bücher.de/") == "domain:xn--bcher-kva.de"
    assert target("http://[::1]:8080/") == "domain:::1"
    for bad in (
        "ftp://x.org/",
        "http://user:pw@x.org/",
        "http://a.org\\@b.org/",
        "docs.python.org",
        "http://a b/",
    ):
        with pytest.raises(ToolCallError, match="url"):
            target(bad)
    with pytest.raises(ToolCallError, match="url"):
        validate_args(BUILTIN_TOOLS["web_fetch"], {"url": "file:///etc/passwd"})


def test_web_fetch_is_denied_unless_a_rule_names_it() -> None:
    host = "domain:docs.python.org"
    for default in ("allow", "ask", "deny"):
        everything = PermissionPolicy(allow=("*", "web*(domain:*)"), default=default)
        assert everything.decide("web_fetch", host) == "deny"
        assert everything.denies_outright("web_fetch")
        assert everything.decide("read", "a.txt") == "allow"  # other tools as before
    assert policy("web_fetch").decide("web_fetch", host) == "allow"
    assert policy("web_fetch(domain:docs.python.org)").decide("web_fetch", host) == "allow"
    assert policy("web_fetch(domain:Docs.Python.org)").decide("web_fetch", host) == "allow"
    assert policy("web_fetch(domain:docs.python.org)").decide("web_fetch", "domain:python.org") == "deny"
    subdomains = policy("web_fetch(domain:*.python.org)")
    assert subdomains.decide("web_fetch", "domain:docs.python.org") == "allow"
    assert subdomains.decide("web_fetch", "domain:a.b.python.org") == "allow"
    assert subdomains.decide("web_fetch", "domain:python.org") == "deny"
    assert subdomains.decide("web_fetch", "domain:evilpython.org") == "deny"
    asked = policy(ask=("web_fetch(domain:*.example.com)",))
    assert asked.decide("web_fetch", "domain:a.example.com") == "ask"
    assert not asked.denies_outright("web_fetch")
    denied = policy("web_fetch", deny=("web_fetch(domain:evil.org)",))
    assert denied.decide("web_fetch", "domain:evil.org") == "deny"
    assert denied.decide("web_fetch", "domain:good.org") == "allow"
    assert policy("web_fetch", deny=("*",)).denies_outright("web_fetch")
    with pytest.raises(InvalidRule, match="domain:HOST"):
        parse_rule("web_fetch(docs.python.org)")


def test_a_run_that_does_not_name_web_fetch_is_offered_what_it_was() -> None:
    """Its catalog and capability binding are those of a worker without the tool."""
    specs = [spec for name, spec in BUILTIN_TOOLS.items() if name != "web_fetch"]
    for rules in (PermissionPolicy(allow=("read(**)",)), PermissionPolicy(default="allow")):
        with_it = offered_tools(BUILTIN_TOOLS.values(), rules)
        assert [s.name for s in with_it] == [s.name for s in offered_tools(specs, rules)]
        assert capability_binding((s.offer().definition for s in with_it), rules) == capability_binding(
            (s.offer().definition for s in offered_tools(specs, rules)), rules
        )
    named = offered_tools(BUILTIN_TOOLS.values(), policy("web_fetch(domain:docs.python.org)"))
    assert "web_fetch" in [s.name for s in named]


# --- the network: loopback, private and metadata addresses refused --------------------------


def test_addresses_outside_the_public_internet_are_refused() -> None:
    for address in (
        "127.0.0.1",
        "10.0.0.8",
        "172.16.3.4",
        "192.168.1.1",
        "169.254.169.254",
        "0.0.0.0",
        "100.64.0.1",
        "224.0.0.1",
        "240.0.0.1",
        "::1",
        "::",
        "fe80::1",
        "fd00:ec2::254",
        "::ffff:127.0.0.1",
        "::ffff:169.254.169.254",
        "64:ff9b::a9fe:a9fe",
        "2002:7f00:1::",
        "ff02::1",
    ):
        assert refused_address(address) is not None, address
    for address in ("8.8.8.8", "151.101.0.223", "2606:4700::1111", "::ffff:8.8.8.8"):
        assert refused_address(address) is None, address


async def test_loopback_is_refused_unless_the_config_allows_private_addresses(server: Server) -> None:
    before = len(server.seen)
    with pytest.raises(ToolFailure, match=r"127\.0\.0\.1 \(loopback\)"):
        await fetch(server.url("/text"), settings=WebFetchConfig())
    with pytest.raises(ToolFailure, match=r"localhost resolves to .*loopback"):
        await fetch(server.url("/text", "localhost"), policy("web_fetch"), settings=WebFetchConfig())
    assert len(server.seen) == before  # refused before anything was sent
    assert "plain ä text" in await fetch(server.url("/text"))


async def test_a_redirect_into_the_workers_network_is_refused(server: Server) -> None:
    """The server at 127.0.0.1 passes as a public one; where its redirects lead does not."""

    def only_the_server(address: str) -> str | None:
        return None if address == "127.0.0.1" else refused_address(address)

    everywhere = policy("web_fetch")
    settings = WebFetchConfig()
    assert "Status: 200" in await fetch(
        server.url("/moved"), everywhere, settings, address_check=only_the_server
    )
    for path, why in (
        ("/to-other-port", r"127\.0\.0\.2 \(loopback\)"),
        ("/to-metadata", r"169\.254\.169\.254 \(link-local\)"),
        ("/to-mapped", r"::ffff:127\.0\.0\.1 \(loopback\)"),
    ):
        with pytest.raises(ToolFailure, match=why):
            await fetch(server.url(path), everywhere, settings, address_check=only_the_server)
    with pytest.raises(ToolFailure, match=r"redirected to file:/etc/passwd, not an http\(s\) URL"):
        await fetch(server.url("/to-file"), everywhere)


async def test_a_name_is_resolved_once_and_the_checked_address_connected_to(server: Server) -> None:
    """The request goes to the address the check saw, the name kept in the Host header."""
    lookups: list[str] = []

    async def resolver(host: str, port: int) -> list[str]:
        lookups.append(host)
        return ["127.0.0.1"]

    text = await fetch(server.url("/text", "docs.example"), policy("web_fetch"), resolver=resolver)
    assert "plain ä text" in text and f"URL: http://docs.example:{server.port}/text" in text
    assert lookups == ["docs.example"]
    assert server.seen[-1] == ("/text", f"docs.example:{server.port}")


# --- redirects and the domain rules ----------------------------------------------------------


async def test_redirects_are_followed_to_hosts_the_rules_allow(server: Server) -> None:
    text = await fetch(server.url("/moved"))
    assert text.startswith(f"URL: {server.url('/page')}\nRedirected from: {server.url('/moved')}\n")
    # to another host (and another address of it: localhost may be ::1 first, where no one listens)
    with pytest.raises(ToolFailure, match=r"permission denied: .*domain:localhost is not allowed"):
        await fetch(server.url("/to-localhost"))
    with pytest.raises(ToolFailure, match="needs a person's approval"):
        await fetch(server.url("/to-localhost"), policy("web_fetch(domain:127.0.0.1)", ask=("web_fetch",)))
    with pytest.raises(ToolFailure, match="no rules to judge"):
        await fetch(server.url("/to-localhost"), None)
    both = policy("web_fetch(domain:127.0.0.1)", "web_fetch(domain:localhost)")
    assert "plain ä text" in await fetch(server.url("/to-localhost"), both)
    with pytest.raises(ToolFailure, match="more than 5 redirects"):
        await fetch(server.url("/loop"))


# --- what is shown -----------------------------------------------------------------------------


async def test_html_becomes_markdown(server: Server) -> None:
    text = await fetch(server.url("/page"))
    head, _, body = text.partition("\n\n")
    assert head.splitlines() == [
        f"URL: {server.url('/page')}",
        "Status: 200 OK",
        "Content-Type: text/html; charset=utf-8",
        "Title: The Guide",
    ]
    assert body.startswith("# Install\n\nRun `pip install x`, then read ")
    assert f"[the next page]({server.url('/docs/next')})" in body
    assert "- one\n- two" in body
    assert "click" in body and "javascript" not in body and "data:" not in body
    assert "tracking" not in body and "color" not in body


async def test_text_and_json_as_they_are_others_refused(server: Server) -> None:
    assert (await fetch(server.url("/data.json"))).endswith('\n\n{"a": [1, 2]}')
    assert (await fetch(server.url("/text"))).endswith("\n\nplain ä text\n")
    with pytest.raises(ToolFailure, match="image/png, which web_fetch does not show"):
        await fetch(server.url("/image.png"))
    with pytest.raises(
        ToolFailure, match=r'HTTP 404 Not Found; the server said:\n\{"error": "no such page"\}'
    ):
        await fetch(server.url("/missing"))


async def test_the_body_is_cut_at_max_bytes_and_the_text_shown_a_page_at_a_time(server: Server) -> None:
    small = WebFetchConfig(allow_private_addresses=True, max_bytes=50_000)
    text = await fetch(server.url("/big"), settings=small)
    assert "[the page is longer than 50000 bytes: only its first 50000 bytes were read]" in text
    assert "line 000000" in text and "line 000499" not in text

    first = await fetch(server.url("/big"))
    line = len(BIG.splitlines(keepends=True)[0])
    end = READ_MAX_BYTES // line * line  # whole lines, as many as fit
    assert len(first.encode()) < READ_MAX_BYTES + 500
    assert first.endswith(
        f"[cut: characters 0 to {end} of {len(BIG)} shown; call web_fetch with offset={end} to read on]"
    )
    assert BIG[:end] in first and BIG[: end + line] not in first
    second = await fetch(server.url("/big"), args={"offset": end})
    assert BIG[end : 2 * end] in second
    last = await fetch(server.url("/big"), args={"offset": 3 * end})
    assert last.endswith(f"[characters {3 * end} to {len(BIG)} of {len(BIG)} shown]")
    assert BIG[3 * end :] in last
    past = await fetch(server.url("/big"), args={"offset": 10**7})
    assert past.endswith(f"[offset 10000000 is past the end: the page's text has {len(BIG)} characters]")


async def test_a_slow_server_times_out(server: Server) -> None:
    quick = WebFetchConfig(allow_private_addresses=True, timeout_seconds=0.5)
    began = time.monotonic()
    with pytest.raises(ToolFailure, match=r"timed out after 0\.5 s"):
        await fetch(server.url("/slow"), settings=quick)
    assert time.monotonic() - began < 2


# --- end to end: a run through a real worker ---------------------------------------------------


async def test_a_run_fetches_a_page_into_its_conversation(
    client: Client, tmp_path: Path, server: Server
) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    script = [
        tool_call("f1", "web_fetch", url=server.url("/moved")),
        tool_call("f2", "web_fetch", url=server.url("/text", "localhost")),
        {"text": "read it"},
    ]
    config = scripted_config(
        tmp_path,
        script,
        permissions={"allow": ["web_fetch(domain:127.0.0.1)"]},
        tools={"web_fetch": {"allow_private_addresses": True, "timeout_seconds": 10}},
    )
    sink = RecordingSink()
    activities = AgentActivities(config, sinks={"local": sink})
    assert set(activities.tools) >= set(builtin_tools())
    async with running_worker(client, activities) as queue:
        handle = await start(client, queue, ws, prompt="fetch the guide")
        result = await handle.result()
    assert result.status == "completed"
    payload = sink.exports[-1].open()
    assert "web_fetch" in payload.logical_resume.capability_binding.tools
    events = [record.event for record in payload.source_run().events]
    ends = {e.id: e for e in events if isinstance(e, ToolEndEvent)}
    assert not ends["f1"].is_error
    assert f"URL: {server.url('/page')}" in ends["f1"].output
    assert "Title: The Guide" in ends["f1"].output and "# Install" in ends["f1"].output
    assert ends["f2"].is_error and "domain:localhost is not allowed" in ends["f2"].output
    # the page is in the conversation the run would resume with
    results = json.dumps([m.model_dump(mode="json") for m in payload.logical_resume.messages])
    assert "# Install" in results
