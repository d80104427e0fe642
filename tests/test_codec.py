"""Payload encryption (``durable_agent.codec``) and the codec server, on a real Temporal server.

A run recorded with the codec leaves no plaintext of its prompt or of a tool's output in
the server's history (raw protobuf, its JSON, or base64 of either); the exports stay plain;
the codec server decrypts the history's payloads over HTTP for a request shaped as the
Web UI sends it.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import subprocess
import sys
import threading
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from google.protobuf import json_format
from google.protobuf.message import Message
from temporalio.api.common.v1 import Payload, Payloads, SearchAttributes
from temporalio.api.enums.v1 import EventType
from temporalio.api.failure.v1 import Failure
from temporalio.client import (
    Client,
    WorkflowFailureError,
    WorkflowHandle,
    WorkflowHistory,
    WorkflowUpdateFailedError,
)
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.exceptions import ApplicationError

from durable_agent.activities import AgentActivities
from durable_agent.activities.providers import build_providers
from durable_agent.cli.codec_server import CodecServer, parse_bind
from durable_agent.client import cancel_run, end_conversation, run_result, send_prompt
from durable_agent.codec import (
    DECRYPTED_METADATA,
    ENCODING,
    KEY_ID_METADATA,
    UNDECRYPTABLE_ENCODING,
    AesGcmCodec,
    CodecError,
    KeyRing,
    PlaintextTolerantConverter,
    SealedPayloadConverter,
    codec_for,
    data_converter,
    load_keys,
    new_key,
)
from durable_agent.config import CodecConfig, ConfigError
from durable_agent.core.events import ErrorEvent, EventRecord, TextDeltaEvent
from durable_agent.core.run_api import (
    PAYLOAD_REFUSED,
    AgentRunResult,
    ApprovalAnswer,
    ApprovalDecision,
    FollowUpPrompt,
    RunControl,
    SteerMessage,
)
from tests.helpers import (
    RecordingProvider,
    awaiting_approval,
    final,
    read_call,
    run_status,
    running_worker,
    scripted_config,
    start,
    status_when,
    until,
    workspace_with,
)

UI_ORIGIN = "http://localhost:8233"
REPO = Path(__file__).resolve().parent.parent


def ring(encrypt_with: str, **keys: bytes) -> KeyRing:
    return KeyRing(encrypt_with=encrypt_with, keys=keys)


def plain(text: str) -> Payload:
    return pydantic_data_converter.payload_converter.to_payloads([text])[0]


def base64_forms(marker: bytes) -> list[bytes]:
    """What any base64 text holding ``marker`` (at any offset) contains, standard or URL-safe."""
    forms = []
    for shift in range(3):
        encoded = base64.b64encode(b"\0" * shift + marker)
        # only the 3-byte groups wholly inside the marker encode the same whatever surrounds it
        core = encoded[(4 if shift else 0) : (shift + len(marker)) // 3 * 4]
        forms += [core, core.replace(b"+", b"-").replace(b"/", b"_")]
    return [f for f in forms if len(f) >= 8]


def assert_no_trace(blob: bytes, marker: str, where: str) -> None:
    raw = marker.encode()
    assert raw not in blob, f"{where} holds {marker!r} in plaintext"
    for form in base64_forms(raw):
        assert form not in blob, f"{where} holds {marker!r} in base64 ({form!r})"


# --- the codec itself ------------------------------------------------------------------


async def test_round_trip_names_the_key_and_hides_the_plaintext() -> None:
    codec = AesGcmCodec(ring("k1", k1=os.urandom(32)))
    original = plain("the secret MARKER-round-trip")
    [sealed] = await codec.encode([original])
    assert sealed.metadata["encoding"] == ENCODING
    assert sealed.metadata[KEY_ID_METADATA] == b"k1"
    assert_no_trace(sealed.SerializeToString(), "MARKER-round-trip", "the encrypted payload")
    [again] = await codec.encode([original])
    assert again.data[:12] != sealed.data[:12], "every payload has a fresh nonce"
    assert await codec.decode([sealed]) == [original]


async def test_rotation_old_payloads_decrypt_until_their_key_is_dropped() -> None:
    old, new = os.urandom(32), os.urandom(32)
    [before] = await AesGcmCodec(ring("old", old=old)).encode([plain("written with the old key")])
    rotated = AesGcmCodec(ring("new", old=old, new=new))
    assert await rotated.decode([before]) == [plain("written with the old key")]
    [after] = await rotated.encode([plain("written with the new key")])
    assert after.metadata[KEY_ID_METADATA] == b"new"
    dropped = AesGcmCodec(ring("new", new=new))
    assert await dropped.decode([after]) == [plain("written with the new key")]
    with pytest.raises(CodecError, match=r"'old'.*not in \[codec.keys\]") as caught:
        await dropped.decode([before])
    assert caught.value.key_id == "old"


async def test_tampered_or_relabelled_payloads_fail_naming_the_key_id() -> None:
    key = os.urandom(32)
    # the same key under two ids: only the associated data tells them apart
    codec = AesGcmCodec(ring("a", a=key, b=key))
    [sealed] = await codec.encode([plain("do not touch")])

    flipped = Payload()
    flipped.CopyFrom(sealed)
    flipped.data = sealed.data[:20] + bytes([sealed.data[20] ^ 1]) + sealed.data[21:]
    with pytest.raises(CodecError, match="key id 'a' fails authentication"):
        await codec.decode([flipped])

    relabelled = Payload()
    relabelled.CopyFrom(sealed)
    relabelled.metadata[KEY_ID_METADATA] = b"b"
    with pytest.raises(CodecError, match="key id 'b' fails authentication"):
        await codec.decode([relabelled])

    truncated = Payload(metadata=dict(sealed.metadata), data=sealed.data[:10])
    with pytest.raises(CodecError, match="fails authentication"):
        await codec.decode([truncated])


async def test_unencrypted_payloads_pass_through() -> None:
    codec = AesGcmCodec(ring("k", k=os.urandom(32)))
    older = [plain("recorded before encryption"), Payload(metadata={"encoding": b"binary/null"})]
    assert await codec.decode(older) == older


def test_key_config_errors_name_the_key_and_variable_never_the_value() -> None:
    config = CodecConfig(keys={"prod-1": "AGENT_TEST_CODEC_KEY"}, encrypt_with="prod-1")
    short = base64.b64encode(os.urandom(16)).decode()
    for environ, problem in (
        ({}, "is not set"),
        ({"AGENT_TEST_CODEC_KEY": "  "}, "is not set"),
        ({"AGENT_TEST_CODEC_KEY": "not base64 at all!"}, "is not valid base64"),
        ({"AGENT_TEST_CODEC_KEY": short}, "holds 16 bytes, not 32"),
    ):
        with pytest.raises(ConfigError) as caught:
            load_keys(config, environ)
        message = str(caught.value)
        assert "'prod-1'" in message and "AGENT_TEST_CODEC_KEY" in message and problem in message
        value = environ.get("AGENT_TEST_CODEC_KEY", "").strip()
        assert not value or value not in message
    key = os.urandom(32)
    for text in (base64.b64encode(key).decode(), base64.urlsafe_b64encode(key).decode().rstrip("=")):
        assert load_keys(config, {"AGENT_TEST_CODEC_KEY": text}).keys == {"prod-1": key}
    assert len(base64.b64decode(new_key(), validate=True)) == 32


def test_without_keys_the_data_converter_is_pydantics_unchanged() -> None:
    assert data_converter(CodecConfig()) is pydantic_data_converter
    config = CodecConfig(keys={"k": "K"}, encrypt_with="k")
    encrypting = data_converter(config, {"K": new_key()})
    assert isinstance(encrypting.payload_codec, AesGcmCodec)
    # pydantic's, refusing what clients send a run unless it came encrypted
    assert encrypting.payload_converter_class is SealedPayloadConverter
    assert issubclass(SealedPayloadConverter, pydantic_data_converter.payload_converter_class)
    tolerant = data_converter(config.model_copy(update={"accept_plaintext": True}), {"K": new_key()})
    assert tolerant.payload_converter_class is PlaintextTolerantConverter


async def test_failure_messages_are_encrypted_too() -> None:
    config = CodecConfig(keys={"k": "K"}, encrypt_with="k")
    converter = data_converter(config, {"K": new_key()})
    failure = Failure()
    await converter.encode_failure(ApplicationError("tool said MARKER-failure-text"), failure)
    assert_no_trace(failure.SerializeToString(), "MARKER-failure-text", "the encoded failure")
    error = await converter.decode_failure(failure)
    assert "MARKER-failure-text" in str(error)


# --- a real run, recorded with the codec -------------------------------------------------

PROMPT_MARKER = "PROMPT-MARKER-7c1e9a52"
TOOL_MARKER = "TOOL-OUTPUT-MARKER-b83f06d4"
KEY_VARIABLE = "AGENT_TEST_CODEC_KEY"


@dataclass(frozen=True)
class RecordedRun:
    """A finished run recorded with the codec: its history as the server holds it, and more."""

    history: WorkflowHistory
    exports: Path
    result: AgentRunResult
    summary: str | None
    workflow_id: str = ""


@pytest.fixture(scope="module")
def codec_key() -> str:
    return new_key()


@pytest.fixture
async def recorded_run(
    client: Client, tmp_path: Path, codec_key: str, monkeypatch: pytest.MonkeyPatch
) -> RecordedRun:
    monkeypatch.setenv(KEY_VARIABLE, codec_key)
    config = scripted_config(
        tmp_path,
        [read_call("c1", "secret.txt"), final("the file holds a marker")],
        codec={"keys": {"k1": KEY_VARIABLE}, "encrypt_with": "k1"},
    )
    options = client.config()
    options["data_converter"] = data_converter(config.codec)
    codec_client = Client(**options)  # the same connection, with the codec
    workspace = workspace_with(tmp_path, {"secret.txt": f"the answer is {TOOL_MARKER}\n"})
    async with running_worker(codec_client, AgentActivities(config)) as queue:
        handle = await start(codec_client, queue, workspace, f"read secret.txt ({PROMPT_MARKER})")
        result = await asyncio.wait_for(handle.result(), 60)
        summary = await (await handle.describe()).static_summary()
    # fetched through a client without the codec: what the server holds
    history = await client.get_workflow_handle(handle.id).fetch_history()
    return RecordedRun(history, tmp_path / "exports", result, summary, handle.id)


def payloads_in(message: Message) -> Iterator[Payload]:
    """Every payload a history event holds, but search attributes' (never encoded: indexed)."""
    if isinstance(message, Payload):
        yield message
        return
    if isinstance(message, SearchAttributes):
        return
    for field, value in message.ListFields():
        if field.message_type is None:
            continue
        if field.message_type.GetOptions().map_entry:
            items = list(value.values())
        elif isinstance(value, Message):
            items = [value]
        else:
            items = list(value)
        for item in items:
            if isinstance(item, Message):
                yield from payloads_in(item)


async def test_history_holds_no_plaintext_of_the_prompt_or_the_tool_output(recorded_run: RecordedRun) -> None:
    run = recorded_run
    assert run.result.status == "completed" and run.result.tool_calls_count == 1
    # the client with the key reads the summary (it is a payload too: encrypted in the history)
    assert run.summary is not None and PROMPT_MARKER in run.summary
    raw = b"".join(event.SerializeToString() for event in run.history.events)
    as_json = run.history.to_json().encode()
    for marker in (PROMPT_MARKER, TOOL_MARKER):
        assert_no_trace(raw, marker, "the history's protobuf")
        assert_no_trace(as_json, marker, "the history's JSON")
    payloads = [p for event in run.history.events for p in payloads_in(event)]
    assert len(payloads) > 10
    # Every payload is encrypted, the start event's summary and details included, but the SDK's
    # own bookkeeping in markers (patch ids; a local activity's type, attempt and times), which
    # it writes without the codec. A local activity's result is in a marker too: encrypted.
    plain = [p for p in payloads if p.metadata["encoding"] != ENCODING]
    bookkeeping = [
        p
        for event in run.history.events
        if event.HasField("marker_recorded_event_attributes")
        for name, details in event.marker_recorded_event_attributes.details.items()
        if name != "result"
        for p in details.payloads
    ]
    assert all(p in bookkeeping for p in plain), [p for p in plain if p not in bookkeeping]
    assert len(plain) < len(payloads) // 2
    started = run.history.events[0]
    assert started.user_metadata.summary.metadata["encoding"] == ENCODING
    assert started.user_metadata.details.metadata["encoding"] == ENCODING


async def test_the_cli_reads_an_encrypted_run_with_the_keys_and_says_what_is_missing_without(
    recorded_run: RecordedRun, client: Client, tmp_path: Path, codec_key: str
) -> None:
    def result(config: str | None, **env: str) -> subprocess.CompletedProcess[str]:
        base = {k: v for k, v in os.environ.items() if k not in ("AGENT_CONFIG", KEY_VARIABLE)}
        base["TEMPORAL_ADDRESS"] = client.service_client.config.target_host
        base["TEMPORAL_NAMESPACE"] = client.namespace
        if config is not None:
            base["AGENT_CONFIG"] = config
        command = [sys.executable, "-m", "durable_agent.cli", "result", recorded_run.workflow_id]
        return subprocess.run(command, env={**base, **env}, capture_output=True, text=True, timeout=60)

    keyed = tmp_path / "keyed.toml"
    keyed.write_text(f'[codec]\nencrypt_with = "k1"\nkeys = {{ k1 = "{KEY_VARIABLE}" }}\n')
    other = tmp_path / "other.toml"
    other.write_text('[codec]\nencrypt_with = "k9"\nkeys = { k9 = "OTHER_KEY" }\n')
    read = result(str(keyed), **{KEY_VARIABLE: codec_key})
    assert read.returncode == 0, read.stderr
    assert AgentRunResult.model_validate_json(read.stdout) == recorded_run.result
    plain = result(None)
    assert plain.returncode == 2 and "the run's payloads are encrypted" in plain.stderr, plain.stderr
    assert "Traceback" not in plain.stderr
    wrong = result(str(other), OTHER_KEY=new_key())
    assert wrong.returncode == 2 and "key id 'k1'" in wrong.stderr, wrong.stderr
    unset = result(str(keyed))
    assert unset.returncode == 2 and KEY_VARIABLE in unset.stderr, unset.stderr


def test_exports_stay_plain_canonical_json(recorded_run: RecordedRun) -> None:
    from durable_agent.activities.sink_files import read_export_file, whole_document

    files = [p for p in recorded_run.exports.rglob("*") if p.is_file()]
    assert all(ENCODING not in p.read_bytes() for p in files), "an export file holds an encrypted payload"
    manifests = sorted(recorded_run.exports.rglob("turn-*.json"))
    assert manifests, "the run exported nothing"
    export = read_export_file(manifests[-1])
    export.open()  # its digests hold: the content is the canonical JSON they cover
    document = whole_document(export)
    json.loads(document)
    for marker in (PROMPT_MARKER, TOOL_MARKER):
        assert marker.encode() in document, f"the export lacks {marker!r} in plain text"
        assert any(marker.encode() in p.read_bytes() for p in files), f"no sink file holds {marker!r}"


# --- the codec server, over HTTP ----------------------------------------------------------


@pytest.fixture
def codec_server(codec_key: str) -> Iterator[CodecServer]:
    codec = codec_for(CodecConfig(keys={"k1": "K"}, encrypt_with="k1"), {"K": codec_key})
    server = CodecServer(("127.0.0.1", 0), codec, origins=[UI_ORIGIN, "https://ui.example.com/"])
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


@pytest.fixture
async def http() -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(timeout=10) as session:
        yield session


def ui_headers(origin: str = UI_ORIGIN, **extra: str) -> dict[str, str]:
    """What the Web UI sends with each decode request."""
    return {"Content-Type": "application/json", "X-Namespace": "default", "Origin": origin, **extra}


def decoded_texts(answer: httpx.Response) -> list[bytes]:
    payloads = json_format.ParseDict(answer.json(), Payloads())
    return [p.data for p in payloads.payloads]


def history_request(run: RecordedRun, codec: AesGcmCodec) -> tuple[dict[str, object], dict[str, object]]:
    """The run's input (the prompt) and the tool call's result, as the UI sends payloads."""
    started = run.history.events[0].workflow_execution_started_event_attributes.input
    # an ordinary activity's result, or a local activity's (a quick tool's), in its marker
    results = [
        e.activity_task_completed_event_attributes.result
        if e.HasField("activity_task_completed_event_attributes")
        else e.marker_recorded_event_attributes.details["result"]
        for e in run.history.events
        if e.HasField("activity_task_completed_event_attributes")
        or "result" in e.marker_recorded_event_attributes.details
    ]
    tool_result = next(
        r for r in results if any(TOOL_MARKER.encode() in codec.decrypt(p).data for p in r.payloads)
    )
    return json_format.MessageToDict(started), json_format.MessageToDict(tool_result)


async def test_codec_server_decodes_the_histories_payloads_for_the_ui(
    recorded_run: RecordedRun, codec_server: CodecServer, http: httpx.AsyncClient
) -> None:
    prompt_request, tool_request = history_request(recorded_run, codec_server.codec)
    assert PROMPT_MARKER not in json.dumps(prompt_request)
    for path, request, marker in (
        ("/decode", prompt_request, PROMPT_MARKER),
        ("/codec/decode", tool_request, TOOL_MARKER),  # mounted under a prefix behind a proxy
    ):
        answer = await http.post(codec_server.url + path, json=request, headers=ui_headers())
        assert answer.status_code == 200, answer.text
        assert any(marker.encode() in data for data in decoded_texts(answer))
        assert answer.headers["Access-Control-Allow-Origin"] == UI_ORIGIN
        assert answer.headers["Access-Control-Allow-Credentials"] == "true"
        assert answer.headers["Vary"] == "Origin"

    # encode is the inverse: what it answers decodes back
    encoded = await http.post(codec_server.url + "/encode", content=answer.content, headers=ui_headers())
    assert encoded.status_code == 200 and TOOL_MARKER not in encoded.text
    again = await http.post(codec_server.url + "/decode", content=encoded.content, headers=ui_headers())
    assert again.json() == answer.json()


async def test_codec_server_cors_preflight_and_origins(
    codec_server: CodecServer, http: httpx.AsyncClient
) -> None:
    preflight = {
        "Origin": UI_ORIGIN,
        "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "content-type,x-namespace",
    }
    answer = await http.options(codec_server.url + "/decode", headers=preflight)
    assert answer.status_code == 204
    assert answer.headers["Access-Control-Allow-Origin"] == UI_ORIGIN
    assert answer.headers["Access-Control-Allow-Methods"] == "POST, OPTIONS"
    allowed = {h.strip().lower() for h in answer.headers["Access-Control-Allow-Headers"].split(",")}
    assert {"content-type", "x-namespace", "authorization"} <= allowed
    assert answer.headers["Access-Control-Allow-Credentials"] == "true"
    assert answer.headers["Vary"] == "Origin"
    # an origin given with a trailing slash on the command line still matches the browser's
    other = await http.options(
        codec_server.url + "/decode", headers={**preflight, "Origin": "https://ui.example.com"}
    )
    assert other.headers["Access-Control-Allow-Origin"] == "https://ui.example.com"

    for origin in ("http://evil.example", "http://localhost:8233.evil.example"):
        refused = await http.options(codec_server.url + "/decode", headers={**preflight, "Origin": origin})
        assert "Access-Control-Allow-Origin" not in refused.headers
        assert "Access-Control-Allow-Credentials" not in refused.headers
        posted = await http.post(
            codec_server.url + "/decode", json={"payloads": []}, headers=ui_headers(origin)
        )
        assert "Access-Control-Allow-Origin" not in posted.headers


async def test_codec_server_refuses_bad_requests(
    codec_server: CodecServer, codec_key: str, http: httpx.AsyncClient
) -> None:
    url = codec_server.url
    bad = await http.post(url + "/decode", content=b"{not json", headers=ui_headers())
    assert bad.status_code == 400 and "error" in bad.json()
    shape = await http.post(url + "/decode", json={"payloads": "nope"}, headers=ui_headers())
    assert shape.status_code == 400 and "error" in shape.json()

    foreign = AesGcmCodec(ring("other", other=os.urandom(32))).encrypt(plain("not ours"))
    unknown = {"payloads": [json_format.MessageToDict(foreign)]}
    answer = await http.post(url + "/decode", json=unknown, headers=ui_headers())
    assert answer.status_code == 400 and "'other'" in answer.json()["error"]
    wrong_key = AesGcmCodec(ring("k1", k1=os.urandom(32))).encrypt(plain("same id, other key"))
    answer = await http.post(url + "/decode", json={"payloads": [json_format.MessageToDict(wrong_key)]})
    assert answer.status_code == 400 and "'k1' fails authentication" in answer.json()["error"]

    assert (await http.get(url + "/health")).status_code == 200
    assert (await http.post(url + "/nothing", json={"payloads": []})).status_code == 404
    codec_server.max_body = 1000
    big = await http.post(url + "/decode", content=b" " * 2000, headers=ui_headers())
    assert big.status_code == 413


async def test_codec_server_auth(codec_key: str, http: httpx.AsyncClient) -> None:
    codec = codec_for(CodecConfig(keys={"k1": "K"}, encrypt_with="k1"), {"K": codec_key})
    server = CodecServer(("127.0.0.1", 0), codec, auth="Bearer s3cret")
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        sealed = {"payloads": [json_format.MessageToDict(codec.encrypt(plain("authorised only")))]}
        without = await http.post(server.url + "/decode", json=sealed, headers=ui_headers())
        assert without.status_code == 401
        wrong = await http.post(
            server.url + "/decode", json=sealed, headers=ui_headers(Authorization="Bearer guess")
        )
        assert wrong.status_code == 401
        preflight = await http.options(server.url + "/decode", headers={"Origin": UI_ORIGIN})
        assert preflight.status_code == 204  # a preflight carries no credentials
        right = await http.post(
            server.url + "/decode", json=sealed, headers=ui_headers(Authorization="Bearer s3cret")
        )
        assert right.status_code == 200 and b"authorised only" in decoded_texts(right)[0]
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


def test_parse_bind() -> None:
    assert parse_bind("0.0.0.0:8081") == ("0.0.0.0", 8081)
    assert parse_bind("[::1]:9000") == ("::1", 9000)
    assert parse_bind(":8081") == ("0.0.0.0", 8081)


# --- the command ---------------------------------------------------------------------------


def _config_file(tmp_path: Path, codec: str) -> Path:
    path = tmp_path / f"agent-{uuid.uuid4().hex[:6]}.toml"
    path.write_text(codec)
    return path


def test_codec_server_command_refuses_to_start_without_keys(tmp_path: Path) -> None:
    env = {**os.environ, "AGENT_CONFIG": str(_config_file(tmp_path, ""))}
    done = subprocess.run(
        [sys.executable, "-m", "durable_agent.cli", "codec-server", "--bind", "127.0.0.1:0"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
    )
    assert done.returncode == 2, done
    assert "no [codec] keys" in done.stderr
    env[KEY_VARIABLE] = ""
    env["AGENT_CONFIG"] = str(
        _config_file(tmp_path, f'[codec]\nencrypt_with = "k1"\nkeys = {{ k1 = "{KEY_VARIABLE}" }}\n')
    )
    done = subprocess.run(
        [sys.executable, "-m", "durable_agent.cli", "codec-server"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
    )
    assert done.returncode == 2 and KEY_VARIABLE in done.stderr and "is not set" in done.stderr, done


async def test_codec_server_command_serves_until_sigterm(
    tmp_path: Path, codec_key: str, http: httpx.AsyncClient
) -> None:
    config = _config_file(tmp_path, f'[codec]\nencrypt_with = "k1"\nkeys = {{ k1 = "{KEY_VARIABLE}" }}\n')
    env = {
        **os.environ,
        "AGENT_CONFIG": str(config),
        KEY_VARIABLE: codec_key,
        "AGENT_TEST_CODEC_AUTH": "token-123",
    }
    command = [
        sys.executable,
        "-m",
        "durable_agent.cli",
        "codec-server",
        "--bind",
        "127.0.0.1:0",
        "--origin",
        "http://localhost:8080",
        "--auth-env",
        "AGENT_TEST_CODEC_AUTH",
    ]
    process = await asyncio.create_subprocess_exec(
        *command, env=env, cwd=REPO, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    try:
        assert process.stdout is not None and process.stderr is not None
        line = (await asyncio.wait_for(process.stdout.readline(), 30)).decode()
        assert "listening on http://127.0.0.1:" in line, line
        url = line.split("listening on ")[1].split()[0]
        codec = codec_for(CodecConfig(keys={"k1": "K"}, encrypt_with="k1"), {"K": codec_key})
        sealed = {"payloads": [json_format.MessageToDict(codec.encrypt(plain("from the command")))]}
        headers = ui_headers("http://localhost:8080", Authorization="token-123")
        answer = await http.post(url + "/decode", json=sealed, headers=headers)
        assert answer.status_code == 200 and b"from the command" in decoded_texts(answer)[0]
        assert answer.headers["Access-Control-Allow-Origin"] == "http://localhost:8080"
        process.terminate()
        assert await asyncio.wait_for(process.wait(), 15) == 0
        log = (await process.stderr.read()).decode()
        assert "POST /decode 200 namespace=default" in log and "payloads=1" in log, log
        assert "from the command" not in log and codec_key not in log and "token-123" not in log
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()


# --- integrity: what a worker with keys takes from clients ----------------------------------

INJECTED = "INJECTED-BY-A-CLIENT-WITHOUT-THE-KEY"


async def test_a_marking_codec_leaves_what_it_cannot_decrypt_for_its_reader_to_refuse() -> None:
    key = os.urandom(32)
    ours = AesGcmCodec(ring("k1", k1=key), marking=True)
    prompt = pydantic_data_converter.payload_converter.to_payloads([FollowUpPrompt(text="hello")])[0]
    converter = SealedPayloadConverter()

    [sealed] = await AesGcmCodec(ring("k1", k1=key)).encode([prompt])
    [opened] = await ours.decode([sealed])
    assert opened.metadata[DECRYPTED_METADATA] == b"k1"
    assert converter.from_payloads([opened], [FollowUpPrompt]) == [FollowUpPrompt(text="hello")]

    for other in (AesGcmCodec(ring("k1", k1=os.urandom(32))), AesGcmCodec(ring("k9", k9=os.urandom(32)))):
        [foreign] = await other.encode([prompt])
        [marker] = await ours.decode([foreign])  # no exception: the workflow task goes on
        assert marker.metadata["encoding"] == UNDECRYPTABLE_ENCODING and not marker.data
        with pytest.raises(ApplicationError) as refused:
            converter.from_payloads([marker], [FollowUpPrompt])
        assert refused.value.type == PAYLOAD_REFUSED and refused.value.non_retryable
        assert "does not decrypt with this worker's [codec] keys" in refused.value.message
        # anything but a client's input fails to read as the codec failed before: CodecError
        with pytest.raises(CodecError, match=r"key id 'k[19]'"):
            converter.from_payloads([marker], [AgentRunResult])

    # a plain payload cannot pass for a decrypted one: the codec takes the note off
    forged = Payload()
    forged.CopyFrom(prompt)
    forged.metadata[DECRYPTED_METADATA] = b"k1"
    [passed] = await ours.decode([forged])
    assert DECRYPTED_METADATA not in passed.metadata
    with pytest.raises(ApplicationError, match="the input is not encrypted") as plain_refused:
        converter.from_payloads([passed], [SteerMessage])
    assert plain_refused.value.type == PAYLOAD_REFUSED
    # plain results (runs from before encryption) still read; and with accept_plaintext, input too
    assert converter.from_payloads([plain("old result")], [str]) == ["old result"]
    assert PlaintextTolerantConverter().from_payloads([passed], [FollowUpPrompt]) == [
        FollowUpPrompt(text="hello")
    ]


@dataclass
class Clients:
    good: Client
    wrong_key: Client  # the same key id, another key
    unknown_key: Client  # a key id the worker does not know
    plain: Client  # no [codec] at all


def clients_for(client: Client, good: CodecConfig, environ: dict[str, str]) -> Clients:
    def with_converter(converter: Any) -> Client:
        options = client.config()
        options["data_converter"] = converter
        return Client(**options)

    return Clients(
        good=with_converter(data_converter(good, environ)),
        wrong_key=with_converter(data_converter(good, {KEY_VARIABLE: new_key()})),
        unknown_key=with_converter(
            data_converter(CodecConfig(keys={"k9": "K9"}, encrypt_with="k9"), {"K9": new_key()})
        ),
        plain=with_converter(pydantic_data_converter),
    )


def refusal_of(error: BaseException) -> ApplicationError:
    assert isinstance(error, (WorkflowUpdateFailedError, WorkflowFailureError)), repr(error)
    cause = error.cause
    assert isinstance(cause, ApplicationError), repr(cause)
    return cause


async def failed_tasks(handle: WorkflowHandle[Any, Any]) -> int:
    history = await handle.fetch_history()
    return sum(1 for e in history.events if e.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_FAILED)


async def test_updates_a_keyed_worker_cannot_trust_are_rejected_and_the_run_goes_on(
    client: Client, tmp_path: Path, codec_key: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(KEY_VARIABLE, codec_key)
    codec = {"keys": {"k1": KEY_VARIABLE}, "encrypt_with": "k1"}
    script = [final("first"), read_call("r1", "a.txt"), final("second")]
    config = scripted_config(
        tmp_path, script, codec=codec, permissions={"allow": [], "ask": ["read"], "default": "deny"}
    )
    clients = clients_for(client, config.codec, {KEY_VARIABLE: codec_key})
    model = RecordingProvider(build_providers(config)["scripted"])
    activities = AgentActivities(config, providers={"scripted": model})
    ws = workspace_with(tmp_path, {"a.txt": "alpha\n"})
    async with running_worker(clients.good, activities) as queue:
        handle = await start(clients.good, queue, ws, "hello", follow_ups=True)
        await status_when(handle, lambda s: s.status == "awaiting_prompt", "the run to await a prompt")
        bad = (clients.wrong_key, clients.unknown_key, clients.plain)
        for other in bad:
            theirs = other.get_workflow_handle(handle.id)
            with pytest.raises(WorkflowUpdateFailedError) as caught:
                await theirs.execute_update("prompt", FollowUpPrompt(text=INJECTED))
            assert refusal_of(caught.value).type == PAYLOAD_REFUSED
            # the run is whole at once: its queries answer, nothing waits 100 s
            status = await asyncio.wait_for(run_status(handle), 5)
            assert status.status == "awaiting_prompt"
        await send_prompt(handle, "now read a.txt")
        waiting = await awaiting_approval(handle)
        [pending] = waiting.pending_approvals
        for other in bad:
            theirs = other.get_workflow_handle(handle.id)
            with pytest.raises(WorkflowUpdateFailedError) as caught:
                await theirs.execute_update(
                    "approve", ApprovalDecision(call_id=pending.call_id, approved=True, reason=INJECTED)
                )
            assert refusal_of(caught.value).type == PAYLOAD_REFUSED
        assert (await run_status(handle)).pending_approvals == (pending,)
        await handle.execute_update(
            "approve", ApprovalDecision(call_id=pending.call_id, approved=True), result_type=ApprovalAnswer
        )
        await status_when(handle, lambda s: s.status == "awaiting_prompt" and model.calls == 3, "the answer")
        await end_conversation(handle)  # with the keys: an encrypted RunControl
        result = await asyncio.wait_for(handle.result(), 30)
        assert await failed_tasks(handle) == 0
    assert result.status == "completed" and result.text == "second"
    assert INJECTED not in repr(model.seen)


async def test_cancel_and_end_from_a_client_without_the_keys_change_nothing(
    client: Client, tmp_path: Path, codec_key: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A signal can come with no payload, which no codec sees: a keyed worker's run counts
    ``cancel`` and ``end`` only with an encrypted ``RunControl``, so a client without the keys
    cannot stop a run (bare, plain or with another key); a client with them can."""
    monkeypatch.setenv(KEY_VARIABLE, codec_key)
    codec = {"keys": {"k1": KEY_VARIABLE}, "encrypt_with": "k1"}
    config = scripted_config(tmp_path, [final("first"), final("second")], codec=codec)
    clients = clients_for(client, config.codec, {KEY_VARIABLE: codec_key})
    ws = workspace_with(tmp_path, {"a.txt": "alpha\n"})
    async with running_worker(clients.good, AgentActivities(config)) as queue:
        handle = await start(clients.good, queue, ws, "hello", follow_ups=True)
        await status_when(handle, lambda s: s.status == "awaiting_prompt", "the run to await a prompt")
        for other in (clients.plain, clients.wrong_key, clients.unknown_key):
            theirs = other.get_workflow_handle(handle.id)
            await theirs.signal("end")  # bare: as any client could send it
            await theirs.signal("cancel", "stop it")  # plain, or under another key
            await theirs.signal("end", RunControl())
            await cancel_run(theirs, "stop it")
        await end_conversation(clients.plain.get_workflow_handle(handle.id))
        await send_prompt(handle, "go on")  # the run still takes its prompt: nothing stopped it

        async def answered() -> bool:
            records = await handle.query("events", 0, result_type=list[EventRecord])
            return any(isinstance(r.event, TextDeltaEvent) and r.event.text == "second" for r in records)

        await until("the second answer", answered, 20)
        status = await status_when(handle, lambda s: s.status == "awaiting_prompt", "the next wait")
        assert not status.cancel_requested
        records: list[EventRecord] = await handle.query("events", 0, result_type=list[EventRecord])
        dropped = [r.event.message for r in records if isinstance(r.event, ErrorEvent)]
        # the bare ones are recorded (one a client, and the keyless end_conversation); a plain or
        # wrongly keyed payload is dropped before the run sees it
        assert len(dropped) == 3 + 1 and all("without an encrypted payload" in m for m in dropped), dropped
        await cancel_run(handle, "done here")  # with the keys
        result = await asyncio.wait_for(run_result(clients.good, handle.id), 30)
        assert await failed_tasks(handle) == 0
    assert (result.status, result.error) == ("cancelled", "done here")


@pytest.mark.parametrize("accept_plaintext", [False, True])
async def test_a_run_started_without_the_key_or_with_another_is_refused(
    client: Client, tmp_path: Path, codec_key: str, monkeypatch: pytest.MonkeyPatch, accept_plaintext: bool
) -> None:
    monkeypatch.setenv(KEY_VARIABLE, codec_key)
    codec = {"keys": {"k1": KEY_VARIABLE}, "encrypt_with": "k1", "accept_plaintext": accept_plaintext}
    config = scripted_config(tmp_path, [final("taken")], codec=codec)
    clients = clients_for(client, config.codec, {KEY_VARIABLE: codec_key})
    model = RecordingProvider(build_providers(config)["scripted"])
    ws = workspace_with(tmp_path, {"a.txt": "alpha\n"})
    async with running_worker(clients.good, AgentActivities(config, providers={"scripted": model})) as queue:
        for other in (clients.wrong_key, clients.unknown_key):
            handle = await start(other, queue, ws, INJECTED)
            with pytest.raises(WorkflowFailureError) as caught:
                await asyncio.wait_for(clients.good.get_workflow_handle(handle.id).result(), 30)
            refused = refusal_of(caught.value)
            assert refused.type == PAYLOAD_REFUSED and "does not decrypt" in refused.message
            assert await failed_tasks(handle) == 0
        handle = await start(clients.plain, queue, ws, "plain prompt")
        if accept_plaintext:
            ours = clients.good.get_workflow_handle(handle.id, result_type=AgentRunResult)
            result = await asyncio.wait_for(ours.result(), 30)
            assert result.status == "completed" and result.text == "taken"
        else:
            with pytest.raises(WorkflowFailureError) as caught:
                await asyncio.wait_for(clients.good.get_workflow_handle(handle.id).result(), 30)
            refused = refusal_of(caught.value)
            assert refused.type == PAYLOAD_REFUSED and "not encrypted" in refused.message
    assert INJECTED not in repr(model.seen)
    assert model.calls == (1 if accept_plaintext else 0)
