"""A credential the worker holds never enters the history or an export, even when a tool prints it."""

from __future__ import annotations

import base64
import json
import re
from pathlib import Path
from urllib.parse import quote, quote_plus

import pytest
from temporalio.client import Client

from durable_agent.activities import AgentActivities
from durable_agent.activities.redact import MIN_SECRET_CHARS, Redactor
from durable_agent.config import AgentConfig, PostgresSinkConfig, parse_config
from durable_agent.core.events import ToolEndEvent
from tests.helpers import RecordingSink, running_worker, scripted_config, start, tool_call

KEY = "sk-test-9f8e7d6c5b4a3210"


@pytest.mark.parametrize(
    ("named", "text", "expected"),
    [
        ({"OPENAI_API_KEY": KEY}, f"key={KEY}!", "key=[redacted: $OPENAI_API_KEY]!"),
        ({"OPENAI_API_KEY": KEY}, f"{KEY}{KEY}", "[redacted: $OPENAI_API_KEY][redacted: $OPENAI_API_KEY]"),
        ({"OPENAI_API_KEY": KEY}, "nothing here", "nothing here"),
        ({"SHORT_TOKEN": "abc"}, "abc abc", "abc abc"),  # too short to be told from text
        (
            {"A_TOKEN": "secret-value-1", "B_TOKEN": "secret-value-12"},
            "secret-value-12",
            "[redacted: $B_TOKEN]",
        ),
        ({"Q_SECRET": 'pa"ss\\word'}, 'x pa"ss\\word y', "x [redacted: $Q_SECRET] y"),
        ({}, f"{KEY}", f"{KEY}"),
    ],
)
def test_values_are_replaced_by_their_variable_name(named: dict[str, str], text: str, expected: str) -> None:
    assert Redactor.of(named)(text) == expected


def test_json_text_stays_json_whatever_a_value_holds() -> None:
    secret = 'pa"ss\\word\n"}'
    redact = Redactor.of({"DB_PASSWORD": secret})
    document = json.dumps({"text": f"the password is {secret}", "other": "x"})
    clean = redact.json_text(document)
    assert json.loads(clean) == {"text": "the password is [redacted: $DB_PASSWORD]", "other": "x"}


def test_the_environment_gives_named_keys_and_variables_named_like_credentials() -> None:
    environ = {
        "MY_PROVIDER": "x" * 20,  # not named like a credential, but the config names it
        "GITHUB_TOKEN": "ghp_abcdefghijklmnop",
        "AWS_SECRET_ACCESS_KEY": "wJalrXUtnFEMI/K7MDENG",
        "HOME": "/root/somewhere/long",
        "PATH": "/usr/local/bin:/usr/bin",
        "EMPTY_TOKEN": "",
    }
    redact = Redactor.from_environment(None, environ)
    assert {name for name, _ in redact.secrets} == {"GITHUB_TOKEN", "AWS_SECRET_ACCESS_KEY"}
    assert redact("/root/somewhere/long") == "/root/somewhere/long"
    assert MIN_SECRET_CHARS == 8


def test_a_password_in_a_url_or_dsn_is_a_credential_whatever_its_variable_is_called() -> None:
    environ = {
        "FAULTS_PG_DSN": "postgresql://agent:pg-pass-w0rd-17@db.internal:5432/agent",
        "LEGACY_CONN": "host=db user=agent password='kv pass 123' dbname=x",
        "UPSTREAM": "https://mirror.example.com/simple",  # a URL without a password: nothing
        "GREETING": "Hello worldwide friends",  # not an authorization value by its name: kept
    }
    redact = Redactor.from_environment(None, environ)
    text = "see postgresql://agent:pg-pass-w0rd-17@db.internal:5432/agent and kv pass 123; Hello worldwide"
    assert redact(text) == (
        "see postgresql://agent:[redacted: $FAULTS_PG_DSN]@db.internal:5432/agent and "
        "[redacted: $LEGACY_CONN]; Hello worldwide"
    )
    assert {name for name, _ in redact.secrets} == {"FAULTS_PG_DSN", "LEGACY_CONN"}


def test_what_mcp_servers_get_from_the_worker_is_redacted_too() -> None:
    """A server's ``env`` and ``headers`` values: a server may echo them back in a result."""
    environ = {"TRACKER_AUTH": "Bearer abcdefghijkl", "DB_PASS": "hunter2hunter2", "OTHER": "y" * 20}
    config = parse_config(
        {
            "mcp": {
                "db": {"command": "db-mcp", "env": {"PGPASSWORD": "DB_PASS"}},
                "tracker": {"url": "https://t.example/mcp", "headers": {"Authorization": "TRACKER_AUTH"}},
            }
        },
        Path("."),
    )
    redact = Redactor.from_environment(config, environ)
    assert {name for name, _ in redact.secrets} == {"TRACKER_AUTH", "DB_PASS"}
    assert redact("token Bearer abcdefghijkl") == "token [redacted: $TRACKER_AUTH]"


async def test_a_printed_credential_is_redacted_before_the_history(
    client: Client, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AGENT_TEST_API_KEY", KEY)
    monkeypatch.setenv("DEPLOY_TOKEN", "dt-0123456789abcdef")
    ws = tmp_path / "ws"
    ws.mkdir()
    # the key got into the workspace (a careless .env): reading it must not carry it into the history
    (ws / "leak.txt").write_text(f"OPENAI_API_KEY={KEY}\nDEPLOY=dt-0123456789abcdef\n")
    script = [
        tool_call("r1", "read", file_path="leak.txt"),
        tool_call("r2", "read", file_path=f"missing-{KEY}.txt"),  # a tool error that echoes it
        {"text": f"I found the key {KEY}, and I will repeat it: {KEY}"},
    ]
    config = scripted_config(tmp_path, script, api_key_env="AGENT_TEST_API_KEY")
    sink = RecordingSink()
    async with running_worker(client, AgentActivities(config, sinks={"local": sink})) as queue:
        handle = await start(client, queue, ws)
        result = await handle.result()
        history = await handle.fetch_history()
    assert result.status == "completed"
    shown = "[redacted: $AGENT_TEST_API_KEY]"
    assert result.text == f"I found the key {shown}, and I will repeat it: {shown}"
    everything = history.to_json() + "".join(e.model_dump_json() for e in sink.exports)
    assert KEY not in everything and "dt-0123456789abcdef" not in everything
    events = [r.event for r in sink.exports[-1].open().source_run().events]
    ends = {e.id: e for e in events if isinstance(e, ToolEndEvent)}
    assert "OPENAI_API_KEY=[redacted: $AGENT_TEST_API_KEY]" in ends["r1"].output
    assert "DEPLOY=[redacted: $DEPLOY_TOKEN]" in ends["r1"].output
    assert ends["r2"].is_error and "missing-[redacted: $AGENT_TEST_API_KEY].txt" in ends["r2"].output


# --- every credential the worker holds, whatever its name, and its common encodings -----------

DSN_PASSWORD = "pg-Pa$$/w0rd@42"
DSN = f"postgresql://agent:{quote(DSN_PASSWORD, safe='')}@db.internal:5432/agent"
CODEC_KEY = base64.b64encode(bytes(range(32))).decode()


def every_encoding(value: str) -> list[str]:
    """``value`` as programs print it: plain, URL-encoded (upper and lower case hex, ``+`` for
    a space), base64 in both alphabets, alone or inside a longer encoded text (``Basic``)."""
    raw = value.encode()
    lower_hex = re.sub(r"%[0-9A-F]{2}", lambda m: m.group(0).lower(), quote(value, safe=""))
    forms = [value, quote(value, safe=""), lower_hex, quote_plus(value)]
    for encode in (base64.b64encode, base64.urlsafe_b64encode):
        forms.append(encode(raw).decode())
        for before, after in ((b"agent:", b""), (b"x", b"\n"), (b"xy", b"tail")):
            forms.append(encode(before + raw + after).decode())
    return forms


def full_config() -> AgentConfig:
    return parse_config(
        {
            "default_model": "gw/some-model",
            "providers": {
                "gw": {
                    "kind": "openai",
                    "base_url": "https://user:gateway-pass-9@llm.internal/v1",
                    "headers": {"X-Api-Key": "hdr-key-123456", "Authorization": "Bearer tok-abcdef123456"},
                }
            },
            "store": {"kind": "postgres", "dsn_env": "STORE_DB"},
            "sinks": {"archive": {"kind": "postgres", "dsn_env": "ARCHIVE_DB"}},
            "codec": {"keys": {"k1": "PAYLOAD_CODEC"}, "encrypt_with": "k1"},
            "mcp": {
                "db": {"command": "db-mcp", "env": {"PGPASSWORD": "MCP_DB_PASS"}},
                "tracker": {"url": "https://t.example/mcp", "headers": {"Authorization": "TRACKER_HDR"}},
            },
        },
        Path("."),
    )


ENVIRON = {
    "STORE_DB": DSN,
    "ARCHIVE_DB": "host=db.internal user=agent password='kv pass 77' dbname=x",
    "PAYLOAD_CODEC": CODEC_KEY,
    "MCP_DB_PASS": "mcp-db-pass-1234",
    "TRACKER_HDR": "Bearer tracker-token-5678",
    "OTEL_EXPORTER_OTLP_HEADERS": "Authorization=Bearer%20otel-token-42,x-team=observability",
    "HOME": "/root/somewhere/long",
    "GIT_AUTH": "Basic " + base64.b64encode(b"svc:basic-pass-31").decode(),
}


@pytest.mark.parametrize(
    ("secret", "name"),
    [
        (DSN, "STORE_DB"),
        (DSN_PASSWORD, "STORE_DB"),  # the password alone, decoded from the DSN
        (quote(DSN_PASSWORD, safe=""), "STORE_DB"),  # as the DSN writes it
        ("kv pass 77", "ARCHIVE_DB"),  # libpq's key=value form
        (CODEC_KEY, "PAYLOAD_CODEC"),
        ("mcp-db-pass-1234", "MCP_DB_PASS"),
        ("Bearer tracker-token-5678", "TRACKER_HDR"),
        ("tracker-token-5678", "TRACKER_HDR"),  # the token without its scheme
        (base64.b64encode(b"svc:basic-pass-31").decode(), "GIT_AUTH"),
        ("basic-pass-31", "GIT_AUTH"),  # the password a Basic credential encodes
        ("otel-token-42", "OTEL_EXPORTER_OTLP_HEADERS"),
        ("tok-abcdef123456", "providers.gw.headers.Authorization"),
        ("hdr-key-123456", "providers.gw.headers.X-Api-Key"),
        ("gateway-pass-9", "providers.gw.base_url"),
    ],
)
def test_every_credential_the_worker_holds_is_redacted_in_every_common_encoding(
    secret: str, name: str
) -> None:
    redact = Redactor.from_environment(full_config(), ENVIRON)
    for form in every_encoding(secret):
        out = redact(f"[{form}]")
        assert secret not in out and form not in out, (form, out)
        assert f"[redacted: ${name}]" in out, (form, out)
    assert redact(f"say {secret}!") == f"say [redacted: ${name}]!"
    assert redact("/root/somewhere/long db.internal") == "/root/somewhere/long db.internal"


def test_a_codec_key_is_redacted_as_its_bytes_in_hex_and_url_safe_base64() -> None:
    redact = Redactor.from_environment(full_config(), ENVIRON)
    raw = base64.b64decode(CODEC_KEY)
    for form in (raw.hex(), raw.hex().upper(), base64.urlsafe_b64encode(raw).decode().rstrip("=")):
        assert redact(form) == "[redacted: $PAYLOAD_CODEC]", form


def test_encoded_forms_in_json_text_keep_it_json() -> None:
    redact = Redactor.from_environment(full_config(), ENVIRON)
    basic = base64.b64encode(f"agent:{DSN_PASSWORD}".encode()).decode()
    document = json.dumps({"auth": f"Basic {basic}", "dsn": DSN, "pw": quote_plus(DSN_PASSWORD)})
    clean = json.loads(redact.json_text(document))
    assert DSN_PASSWORD not in json.dumps(clean) and quote(DSN_PASSWORD, safe="") not in json.dumps(clean)
    assert clean["dsn"] == "[redacted: $STORE_DB]"
    assert "[redacted: $STORE_DB]" in clean["auth"] and "[redacted: $STORE_DB]" in clean["pw"]


async def test_a_dsn_password_printed_encoded_by_a_tool_never_reaches_the_history(
    client: Client, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The store's DSN is in a variable not named like a credential; the config names it."""
    monkeypatch.setenv("AGENT_TEST_STORE_DSN", DSN)
    ws = tmp_path / "ws"
    ws.mkdir()
    basic = base64.b64encode(f"agent:{DSN_PASSWORD}".encode()).decode()
    (ws / "leak.txt").write_text(
        f"plain {DSN_PASSWORD}\nurl {quote(DSN_PASSWORD, safe='')}\nbasic {basic}\ndsn {DSN}\n"
    )
    config = scripted_config(tmp_path, [tool_call("r1", "read", file_path="leak.txt"), {"text": "done"}])
    # the config names the variable (as a PostgreSQL store would); the run keeps the disk store
    config = config.model_copy(
        update={
            "sinks": {
                **config.sinks,
                "pg": PostgresSinkConfig(kind="postgres", dsn_env="AGENT_TEST_STORE_DSN"),
            }
        }
    )
    sink = RecordingSink()
    async with running_worker(client, AgentActivities(config, sinks={"local": sink})) as queue:
        handle = await start(client, queue, ws)
        result = await handle.result()
        history = await handle.fetch_history()
    assert result.status == "completed", result
    everything = history.to_json() + "".join(e.model_dump_json() for e in sink.exports)
    for form in (DSN_PASSWORD, quote(DSN_PASSWORD, safe=""), basic, DSN):
        assert form not in everything, form
    events = [r.event for r in sink.exports[-1].open().source_run().events]
    [end] = [e for e in events if isinstance(e, ToolEndEvent) and e.id == "r1"]
    assert end.output.count("[redacted: $AGENT_TEST_STORE_DSN]") >= 4, end.output
