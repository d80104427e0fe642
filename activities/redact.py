"""Defence in depth for credentials: a value the worker holds never enters the history.

The bash tool's environment is an allowlist and the sandbox hides the
worker's ``/proc``, so a command should never see a credential. Should one
get through anyway (a key copied into a workspace file, a provider echoing a
header in an error, a sandbox turned off), the tool and model activities
replace every credential value in what they return with
``[redacted: $NAME]`` before it reaches Temporal's history, the session store
or an export.

What counts as a credential, whatever its variable is called:

- the variables the config names as holding one: the providers' keys
  (``api_key_env``), what MCP servers get (their ``env`` values and
  ``headers``), the PostgreSQL DSNs of the store and the sinks (``dsn_env``)
  and the payload codec's keys (``[codec.keys]``);
- the password inside any of those that is a URL or a ``key=value`` DSN
  (``postgresql://agent:PASSWORD@db/agent``, ``password=PASSWORD``), and the
  values of ``OTEL_EXPORTER_OTLP_*HEADERS`` (``Authorization=Bearer …``);
- a provider's header whose name says it holds one (``Authorization``,
  ``X-Api-Key``, …) and a password in a provider's ``base_url``;
- any variable of the worker's environment whose name says it holds one
  (``…KEY``, ``…TOKEN``, ``…SECRET``, ``…PASSWORD``, ``…CREDENTIALS``,
  ``…AUTH…``);
- the password inside a URL or a ``password=`` DSN in any variable of the
  worker's environment, whatever its name (``FAULTS_PG_DSN``): a credential by
  its shape.

Each value at least ``MIN_SECRET_CHARS`` long is matched as it is, as it
appears inside a JSON string, URL-encoded (``%40``, ``+`` for a space, upper
or lower case hex), and base64-encoded (standard and URL-safe alphabets, at
any of the three byte alignments inside a longer encoded text, as in an HTTP
``Basic`` header); a value that is itself base64 of 16 bytes or more (a codec
key) also as those bytes in hex and in the other alphabet.
"""

from __future__ import annotations

import base64
import binascii
import json
import os
import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote, quote_plus, unquote, urlsplit

from durable_agent.config import AgentConfig

# Shorter values ("1", "true", a port) would redact ordinary text and protect nothing.
MIN_SECRET_CHARS = 8
_SECRET_NAME = re.compile(r"KEY|TOKEN|SECRET|PASSWORD|PASSWD|CREDENTIAL|AUTH|PRIVATE|COOKIE", re.IGNORECASE)
# OpenTelemetry's exporter headers: ``k1=v1,k2=v2``, values URL-encoded (often a bearer token).
_OTEL_HEADERS = re.compile(r"^OTEL_EXPORTER_OTLP_(?:[A-Z]+_)?HEADERS$")
# An HTTP authorization value: ``Bearer TOKEN``, ``Basic BASE64``, ``Token …``.
_AUTH_SCHEME = re.compile(r"([A-Za-z][A-Za-z0-9_-]*)\s+(\S{8,})")
# libpq's ``key=value`` connection strings: ``password=x`` or ``password='x y'``.
_KV_PASSWORD = re.compile(r"(?:^|\s)password\s*=\s*(?:'((?:[^'\\]|\\.)*)'|(\S+))", re.IGNORECASE)


@dataclass(frozen=True)
class Redactor:
    """Replaces credential values in text: longest first, so a value inside another is not left half."""

    secrets: tuple[tuple[str, str], ...] = ()  # (variable name, value)
    _text: re.Pattern[str] | None = field(default=None, compare=False, repr=False)
    _json: re.Pattern[str] | None = field(default=None, compare=False, repr=False)
    _names: dict[str, str] = field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def of(cls, named: Mapping[str, str] | Iterable[tuple[str, str]]) -> Redactor:
        """A redactor for ``{variable name: value}`` (or ``(name, value)`` pairs, a name may
        come more than once); short values are left out.

        Args:
            named: the credentials, by the name a redaction shows.

        Returns:
            The redactor (falsy when it holds nothing to redact).
        """
        pairs = named.items() if isinstance(named, Mapping) else named
        kept = tuple(sorted({(n, v) for n, v in pairs if len(v) >= MIN_SECRET_CHARS}))
        names: dict[str, str] = {}
        text_forms: set[str] = set()
        json_forms: set[str] = set()
        for name, value in kept:
            escaped = {json.dumps(value, ensure_ascii=False)[1:-1], json.dumps(value)[1:-1]}
            encoded = set(encodings(value))
            for form in (value, *escaped, *encoded):
                names.setdefault(form, name)
            text_forms |= {value, *escaped, *encoded}
            json_forms |= escaped | encoded  # the encodings hold nothing JSON escapes
        return cls(kept, _alternation(text_forms), _alternation(json_forms), names)

    @classmethod
    def from_environment(
        cls, config: AgentConfig | None = None, environ: Mapping[str, str] | None = None
    ) -> Redactor:
        """The worker's credentials (see the module's docstring) from ``environ`` (default:
        the process's environment) and ``config``."""
        env = os.environ if environ is None else environ
        names = set(_config_names(config)) | {name for name in env if _SECRET_NAME.search(name)}
        pairs = [(name, env[name]) for name in names if env.get(name)]
        for name, value in list(pairs):
            pairs += [(name, part) for part in embedded_secrets(value)]
        # a password is one by its shape, in a variable of any name (``FAULTS_PG_DSN``)
        for name, value in env.items():
            pairs += [(name, part) for part in passwords_in(value)]
        for name, value in env.items():
            if _OTEL_HEADERS.match(name) and value:
                pairs += [(name, value)]
                for header in _header_values(value):
                    pairs += [(name, header), *((name, part) for part in embedded_secrets(header))]
        pairs += list(_config_values(config))
        return cls.of(pairs)

    def __call__(self, text: str) -> str:
        """``text`` with every credential value replaced by ``[redacted: $NAME]``."""
        return self._sub(self._text, text)

    def json_text(self, text: str) -> str:
        """The same for JSON text: only a value's JSON-escaped (or encoded) form is replaced, so
        the JSON stays JSON whatever characters a value holds."""
        return self._sub(self._json, text)

    def _sub(self, pattern: re.Pattern[str] | None, text: str) -> str:
        if pattern is None or not text:
            return text
        return pattern.sub(lambda m: f"[redacted: ${self._names[m.group(0)]}]", text)

    def __bool__(self) -> bool:
        return bool(self.secrets)


def encodings(value: str) -> Iterator[str]:
    """The forms of ``value`` a program commonly prints it in: URL-encoded, and base64 (the
    characters that depend on the value alone, at each alignment); for a value that is base64
    of 16 bytes or more, those bytes in hex and in the other base64 alphabet. Each form is at
    least ``MIN_SECRET_CHARS`` long; ``value`` itself is not among them."""
    forms: set[str] = set()
    for quoted in (quote(value, safe=""), quote(value), quote_plus(value)):
        forms |= {quoted, re.sub(r"%[0-9A-F]{2}", lambda m: m.group(0).lower(), quoted)}
    raw = value.encode("utf-8", "surrogatepass")
    forms |= set(_base64_cores(raw))
    decoded = _as_base64(value)
    if decoded is not None and len(decoded) >= 16:
        forms |= {decoded.hex(), decoded.hex().upper()}
        for encode in (base64.b64encode, base64.urlsafe_b64encode):
            text = encode(decoded).decode("ascii")
            forms |= {text, text.rstrip("=")}
    forms.discard(value)
    return iter(sorted(f for f in forms if len(f) >= MIN_SECRET_CHARS))


def _base64_cores(raw: bytes) -> Iterator[str]:
    """The base64 characters that encode ``raw`` alone wherever it starts in a longer text:
    with 0, 1 or 2 bytes before it, the characters that mix in a neighbour's bits are cut."""
    for before in range(3):
        total = before + len(raw)
        start = (before * 8 + 5) // 6  # the first character holding none of the bytes before
        end = total * 8 // 6  # the last whole character of the value's bits
        padded = base64.b64encode(b"\0" * before + raw).decode("ascii")
        core = padded[start:end]
        yield core
        yield core.translate(str.maketrans("+/", "-_"))


def _as_base64(value: str) -> bytes | None:
    text = value.strip()
    if len(text) < 16 or not re.fullmatch(r"[A-Za-z0-9+/_-]+=*", text):
        return None
    try:
        return base64.b64decode(text.replace("-", "+").replace("_", "/") + "=" * (-len(text) % 4))
    except (binascii.Error, ValueError):
        return None


def embedded_secrets(value: str) -> Iterator[str]:
    """The secrets inside a credential: the password of a URL (``scheme://user:PASSWORD@host``,
    as written and decoded) or of libpq's ``password=PASSWORD``, and the token of an HTTP
    authorization value (``Bearer TOKEN``; ``Basic`` also the password it encodes)."""
    scheme = _AUTH_SCHEME.fullmatch(value.strip())
    if scheme is not None:
        token = scheme.group(2)
        yield token
        decoded = _as_base64(token) if scheme.group(1).lower() == "basic" else None
        if decoded is not None:
            yield decoded.decode("utf-8", "replace").partition(":")[2]
    yield from passwords_in(value)


def passwords_in(value: str) -> Iterator[str]:
    """The passwords a value holds by its shape, whatever holds it: a URL's
    (``scheme://user:PASSWORD@host``, as written and decoded) and libpq's ``password=PASSWORD``."""
    for match in re.finditer(r"[A-Za-z][A-Za-z0-9+.-]*://[^\s'\"<>]+", value):
        try:
            password = urlsplit(match.group(0)).password
        except ValueError:
            continue
        if password:
            yield password
            yield unquote(password)
    for match in _KV_PASSWORD.finditer(value):
        quoted, bare = match.group(1), match.group(2)
        yield re.sub(r"\\(.)", r"\1", quoted) if quoted is not None else bare


def _header_values(value: str) -> Iterator[str]:
    """The values of an OTLP headers variable (``k1=v1,k2=v2``), as written and decoded."""
    for item in value.split(","):
        _, sep, header = item.partition("=")
        if sep and header.strip():
            yield header.strip()
            yield unquote(header.strip())


def _alternation(forms: set[str]) -> re.Pattern[str] | None:
    """One pattern matching any of ``forms``, the longest where several start at one place.

    The forms share their prefixes in a trie, so the pattern tries each character once, not
    once a form: a few hundred forms (some thirty credentials and their encodings) cost about
    what one does (2-3 ms for 100 KB of text).
    """
    if not forms:
        return None
    trie: dict[str, dict[str, Any]] = {}
    for form in forms:
        node = trie
        for char in form:
            node = node.setdefault(char, {})
        node[""] = {}  # a form ends here
    return re.compile(_trie_pattern(trie))


def _trie_pattern(node: dict[str, dict[str, Any]]) -> str:
    # a run of single children is written as it is: recursion only where forms part
    literal = []
    while len(node) == 1 and "" not in node:
        ((char, node),) = node.items()
        literal.append(re.escape(char))
    branches = [re.escape(char) + _trie_pattern(child) for char, child in sorted(node.items()) if char]
    if not branches:
        return "".join(literal)
    body = branches[0] if len(branches) == 1 else f"(?:{'|'.join(branches)})"
    # greedy: a longer form that goes on from here wins over one that ends here
    return "".join(literal) + (f"(?:{body})?" if "" in node else body)


def _config_names(config: AgentConfig | None) -> Iterable[str]:
    """The variables the config names as holding secrets: the providers' keys, what MCP servers
    get (their ``env`` values and ``headers``, which a server might echo back), the store's and
    sinks' DSNs and the codec's keys."""
    if config is None:
        return ()
    providers = (
        name
        for provider in config.providers.values()
        if (name := getattr(provider, "api_key_env", None)) is not None
    )
    mcp = (
        name for server in config.mcp.values() for name in (*server.env.values(), *server.headers.values())
    )
    storage = (
        name for part in (config.store, *config.sinks.values()) if (name := getattr(part, "dsn_env", None))
    )
    return (*providers, *mcp, *storage, *config.codec.keys.values())


def _config_values(config: AgentConfig | None) -> Iterator[tuple[str, str]]:
    """Credentials written in the config itself: a provider's headers named like one (with the
    models' own) and a password in its ``base_url``."""
    if config is None:
        return
    for provider_name, provider in config.providers.items():
        where = f"providers.{provider_name}"
        headers = dict(getattr(provider, "headers", {}))
        for model in getattr(provider, "models", {}).values():
            headers.update(model.headers)
        for header, value in headers.items():
            if _SECRET_NAME.search(header):
                yield f"{where}.headers.{header}", value
                for part in embedded_secrets(value):  # "Bearer abc…": the token alone as well
                    yield f"{where}.headers.{header}", part
        for password in embedded_secrets(str(getattr(provider, "base_url", ""))):
            yield f"{where}.base_url", password
