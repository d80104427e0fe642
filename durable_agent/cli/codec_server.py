"""``durable-agent codec-server`` and ``durable-agent codec-key``.

The codec server is Temporal's remote codec endpoint: the Web UI (its "Codec Server"
setting, or ``TEMPORAL_CODEC_ENDPOINT``) and the ``temporal`` CLI (``--codec-endpoint``)
POST the payloads they show to ``<endpoint>/decode`` and show what comes back, so
people who hold the keys read encrypted runs. Requests are the protobuf JSON form of
``temporal.api.common.v1.Payloads``; answers are the same shape. Standard library HTTP
only: it serves one team's UI, not the internet (put TLS in front of it).

The commands' options are declared with the parser (``cli/commands.py``), which imports this
module only when one of them runs.
"""

from __future__ import annotations

import argparse
import hmac
import json
import logging
import os
import signal
import socket
import time
from collections.abc import Iterable, Mapping
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, NoReturn
from urllib.parse import urlsplit

from google.protobuf import json_format
from temporalio.api.common.v1 import Payloads

from durable_agent.cli.commands import DEFAULT_ORIGIN
from durable_agent.cli.commands import parse_bind as parse_bind
from durable_agent.cli.common import err
from durable_agent.codec import AesGcmCodec, CodecError, codec_for, new_key
from durable_agent.config import ConfigError, load_config

MAX_BODY_BYTES = 64 * 1024 * 1024
ALLOW_HEADERS = "Content-Type, X-Namespace, Authorization"

log = logging.getLogger("durable_agent.codec_server")


class CodecServer(ThreadingHTTPServer):
    """An HTTP server that decodes and encodes payloads with ``codec``."""

    daemon_threads = True

    def __init__(
        self,
        address: tuple[str, int],
        codec: AesGcmCodec,
        *,
        origins: Iterable[str] = (DEFAULT_ORIGIN,),
        auth: str | None = None,
        max_body: int = MAX_BODY_BYTES,
    ) -> None:
        if ":" in address[0]:
            self.address_family = socket.AF_INET6
        self.codec = codec
        # Browsers send the origin without a trailing slash; people often type one.
        self.origins = frozenset(o.rstrip("/") for o in origins)
        self.auth = auth
        self.max_body = max_body
        super().__init__(address, _Handler)

    @property
    def url(self) -> str:
        """``http://host:port`` of the bound socket (the port chosen when it was 0)."""
        host, port = self.server_address[:2]
        host = host.decode() if isinstance(host, bytes) else host
        return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


class _Handler(BaseHTTPRequestHandler):
    server: CodecServer
    server_version = "durable-agent-codec-server"
    protocol_version = "HTTP/1.1"  # keep-alive: the UI sends many small requests
    timeout = 30  # a client that stops sending mid-request does not hold a thread for ever
    _payload_count: int | None = None

    def version_string(self) -> str:
        return self.server_version  # not Python's version: nothing for a prober to go on

    # --- the verbs ---

    def do_OPTIONS(self) -> None:
        # A CORS preflight carries no credentials: it needs no auth.
        self._reply(HTTPStatus.NO_CONTENT, None, {"Access-Control-Max-Age": "600"})

    def do_GET(self) -> None:
        if self._route() == "health":
            self._reply(HTTPStatus.OK, {"status": "ok"})
        else:
            self._error(HTTPStatus.NOT_FOUND, "not found: POST .../decode or .../encode, GET /health")

    def do_POST(self) -> None:
        self._payload_count = None  # one handler serves every request of a kept-alive connection
        action = self._route()
        # Refused before its body is read: the connection closes, or the body would be read
        # as the next request.
        if action not in ("decode", "encode"):
            self.close_connection = True
            self._error(HTTPStatus.NOT_FOUND, "not found: POST .../decode or .../encode")
            return
        if not self._authorized():
            self.close_connection = True
            self._error(HTTPStatus.UNAUTHORIZED, "missing or wrong Authorization header")
            return
        body = self._body()
        if body is None:
            return
        try:
            payloads = json_format.ParseDict(json.loads(body), Payloads(), ignore_unknown_fields=True)
        except (ValueError, json_format.ParseError, TypeError, AttributeError) as exc:
            # json.JSONDecodeError and UnicodeDecodeError are ValueErrors
            self._error(HTTPStatus.BAD_REQUEST, f"not a Payloads JSON object: {' '.join(str(exc).split())}")
            return
        self._payload_count = len(payloads.payloads)
        convert = self.server.codec.decrypt if action == "decode" else self.server.codec.encrypt
        try:
            converted = Payloads(payloads=[convert(p) for p in payloads.payloads])
        except CodecError as exc:
            self._error(HTTPStatus.BAD_REQUEST, str(exc))
            return
        self._reply(HTTPStatus.OK, json_format.MessageToDict(converted))

    # --- the parts ---

    def _route(self) -> str:
        # The last path segment: behind a proxy the endpoint may be mounted under a prefix.
        return urlsplit(self.path).path.rstrip("/").rpartition("/")[2]

    def _authorized(self) -> bool:
        expected = self.server.auth
        if expected is None:
            return True
        given = self.headers.get("Authorization", "")
        return hmac.compare_digest(given.encode("utf-8"), expected.encode("utf-8"))

    def _body(self) -> bytes | None:
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            self.close_connection = True
            self._error(HTTPStatus.LENGTH_REQUIRED, "send a Content-Length, not a chunked body")
            return None
        try:
            length = int(self.headers.get("Content-Length", "0"))
        except ValueError:
            length = -1
        if length < 0:
            self.close_connection = True
            self._error(HTTPStatus.BAD_REQUEST, "bad Content-Length")
            return None
        if length > self.server.max_body:
            self.close_connection = True
            limit = self.server.max_body
            self._error(HTTPStatus.REQUEST_ENTITY_TOO_LARGE, f"body over {limit:,} bytes")
            return None
        return self.rfile.read(length)

    def _cors(self) -> dict[str, str]:
        origin = self.headers.get("Origin")
        headers = {"Vary": "Origin"}
        if origin is not None and origin.rstrip("/") in self.server.origins:
            headers.update(
                {
                    "Access-Control-Allow-Origin": origin,
                    "Access-Control-Allow-Methods": "POST, OPTIONS",
                    "Access-Control-Allow-Headers": ALLOW_HEADERS,
                    "Access-Control-Allow-Credentials": "true",
                }
            )
        return headers

    def _error(self, status: HTTPStatus, message: str) -> None:
        self._reply(status, {"error": message})

    def _reply(
        self, status: HTTPStatus, body: Mapping[str, Any] | None, extra: Mapping[str, str] = {}
    ) -> None:
        data = b"" if body is None else json.dumps(body).encode("utf-8")
        self.send_response(status)
        for name, value in {**self._cors(), **extra}.items():
            self.send_header(name, value)
        if body is not None:
            self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        if self.close_connection:
            self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(data)

    # --- logging: one line a request, never a payload ---

    def log_request(self, code: int | str = "-", size: int | str = "-") -> None:
        status = code.value if isinstance(code, HTTPStatus) else code
        count = "" if self._payload_count is None else f" payloads={self._payload_count}"
        namespace = self.headers.get("X-Namespace", "-") if self.headers else "-"
        log.info(
            "%s %s %s %s namespace=%s origin=%s%s",
            self.address_string(),
            self.command,
            urlsplit(self.path).path,
            status,
            namespace,
            self.headers.get("Origin", "-") if self.headers else "-",
            count,
        )

    def log_message(self, format: str, *args: Any) -> None:
        log.warning("%s %s", self.address_string(), format % args)


def _stop(*_: object) -> NoReturn:
    raise SystemExit(0)


def cmd_codec_server(args: argparse.Namespace) -> int:
    """Serve the remote codec endpoint with the keys of ``AGENT_CONFIG``'s ``[codec]``."""
    try:
        config = load_config()
        if not config.codec.enabled:
            err("codec-server: the agent config (AGENT_CONFIG) has no [codec] keys: nothing to decrypt with")
            return 2
        codec = codec_for(config.codec)
    except ConfigError as exc:
        err(f"codec-server: {exc}")
        return 2
    auth = None
    if args.auth_env:
        auth = os.environ.get(args.auth_env) or None
        if auth is None:
            err(f"codec-server: --auth-env {args.auth_env}: that environment variable is not set")
            return 2
    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    origins = args.origin or [DEFAULT_ORIGIN]
    try:
        server = CodecServer(args.bind, codec, origins=origins, auth=auth)
    except OSError as exc:
        err(f"codec-server: cannot listen on {args.bind[0]}:{args.bind[1]}: {exc}")
        return 2
    signal.signal(signal.SIGTERM, _stop)
    print(
        f"codec server listening on {server.url} (keys: {', '.join(codec.key_ids)}; "
        f"origins: {', '.join(sorted(server.origins))}; auth: {'on' if auth else 'off'})",
        flush=True,
    )
    started = time.monotonic()
    try:
        server.serve_forever()
    except (KeyboardInterrupt, SystemExit):
        pass
    finally:
        server.server_close()
        log.info("codec server stopped after %.0f s", time.monotonic() - started)
    return 0


def cmd_codec_key(args: argparse.Namespace) -> int:
    """Print a fresh random key for ``[codec.keys]`` (base64 of 32 bytes)."""
    print(new_key())
    return 0
