"""Defence in depth for credentials: a value the worker holds never enters the history.

The bash tool's environment is an allowlist and the sandbox hides the
worker's ``/proc``, so a command should never see a credential. Should one
get through anyway (a key copied into a workspace file, a provider echoing a
header in an error, a sandbox turned off), the tool and model activities
replace every credential value in what they return with
``[redacted: $NAME]`` before it reaches Temporal's history, the session store
or an export.

What counts as a credential: the variables the config names as provider keys
(``api_key_env``), and any variable of the worker's environment whose name
says it holds one (``…KEY``, ``…TOKEN``, ``…SECRET``, ``…PASSWORD``,
``…CREDENTIALS``, ``…AUTH…``), when its value is at least
``MIN_SECRET_CHARS`` long. Values are matched as they are and as they appear
inside a JSON string.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from durable_agent.config import AgentConfig

# Shorter values ("1", "true", a port) would redact ordinary text and protect nothing.
MIN_SECRET_CHARS = 8
_SECRET_NAME = re.compile(r"KEY|TOKEN|SECRET|PASSWORD|PASSWD|CREDENTIAL|AUTH|PRIVATE", re.IGNORECASE)


@dataclass(frozen=True)
class Redactor:
    """Replaces credential values in text: longest first, so a value inside another is not left half."""

    secrets: tuple[tuple[str, str], ...] = ()  # (variable name, value)
    _text: re.Pattern[str] | None = field(default=None, compare=False, repr=False)
    _json: re.Pattern[str] | None = field(default=None, compare=False, repr=False)
    _names: dict[str, str] = field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def of(cls, named: Mapping[str, str]) -> Redactor:
        """A redactor for ``{variable name: value}``; short values are left out."""
        kept = tuple(sorted((n, v) for n, v in named.items() if len(v) >= MIN_SECRET_CHARS))
        names: dict[str, str] = {}
        text_forms: set[str] = set()
        json_forms: set[str] = set()
        for name, value in kept:
            escaped = {json.dumps(value, ensure_ascii=False)[1:-1], json.dumps(value)[1:-1]}
            for form in (value, *escaped):
                names.setdefault(form, name)
            text_forms |= {value, *escaped}
            json_forms |= escaped
        return cls(kept, _alternation(text_forms), _alternation(json_forms), names)

    @classmethod
    def from_environment(
        cls, config: AgentConfig | None = None, environ: Mapping[str, str] | None = None
    ) -> Redactor:
        """The worker's credentials: the providers' key variables and variables named like one."""
        env = os.environ if environ is None else environ
        names = set(_config_names(config)) | {name for name in env if _SECRET_NAME.search(name)}
        return cls.of({name: env[name] for name in names if env.get(name)})

    def __call__(self, text: str) -> str:
        """``text`` with every credential value replaced by ``[redacted: $NAME]``."""
        return self._sub(self._text, text)

    def json_text(self, text: str) -> str:
        """The same for JSON text: only a value's JSON-escaped form is replaced, so the
        JSON stays JSON whatever characters a value holds."""
        return self._sub(self._json, text)

    def _sub(self, pattern: re.Pattern[str] | None, text: str) -> str:
        if pattern is None or not text:
            return text
        return pattern.sub(lambda m: f"[redacted: ${self._names[m.group(0)]}]", text)

    def __bool__(self) -> bool:
        return bool(self.secrets)


def _alternation(forms: set[str]) -> re.Pattern[str] | None:
    ordered = sorted(forms, key=lambda form: (-len(form), form))
    return re.compile("|".join(re.escape(form) for form in ordered)) if ordered else None


def _config_names(config: AgentConfig | None) -> Iterable[str]:
    """The variables the config names as holding secrets: the providers' keys, and what MCP
    servers get (their ``env`` values and ``headers``), which a server might echo back."""
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
    return (*providers, *mcp)
