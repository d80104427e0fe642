"""A credential the worker holds never enters the history or an export, even when a tool prints it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from temporalio.client import Client

from durable_agent.activities import AgentActivities
from durable_agent.activities.redact import MIN_SECRET_CHARS, Redactor
from durable_agent.config import parse_config
from durable_agent.core.models import ToolEndEvent
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
