"""Deep or odd JSON from outside gives the typed error of its layer, once, without a traceback.

Two layers take JSON from outside: a model's tool-call arguments (the
providers) and export files (``checkpoint``, the CLI's ``verify`` and
``resume``). Both parse through ``json_limits``; these tests play a hostile
model and a hostile file.
"""

from __future__ import annotations

import asyncio
import json
import math
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest
from pydantic import ValidationError
from temporalio.client import Client

from durable_agent.activities import AgentActivities
from durable_agent.activities.providers.http_errors import Failures
from durable_agent.cli.commands import run_cli
from durable_agent.core.canonical import CanonicalJsonError, canonical_bytes, digest_of, sha256_digest
from durable_agent.core.events import ToolEndEvent
from durable_agent.core.export import (
    EncodingError,
    InvalidDescriptor,
    SessionCheckpointExportV1,
    load_export,
    open_export,
)
from durable_agent.core.json_limits import (
    DOCUMENT_MAX_DEPTH,
    TOOL_ARGUMENTS_MAX_DEPTH,
    JsonLimitError,
    check_value,
    loads,
)
from tests.helpers import RecordingSink, final, running_worker, scripted_config, start, tool_call
from tests.test_checkpoint_contract import export_at, state_at_boundary
from tests.test_http_providers import KEY_ENV, MODEL, SECRET, model_attempts
from tests.wire_servers import AnthropicWire, Call, OpenAIWire, Wire, WireServer

HOSTILE_DEPTH = 5_000  # a hostile model's tool arguments
EXPORT_DEPTH = 200_000  # a hostile export's content


def nested(levels: int) -> str:
    """``{"a":{"a":…1…}}``, ``levels`` objects deep."""
    return '{"a":' * levels + "1" + "}" * levels


def nested_value(levels: int) -> dict[str, Any]:
    value: dict[str, Any] = {"a": 1}
    for _ in range(levels - 1):
        value = {"a": value}
    return value


# --- json_limits ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        (nested(HOSTILE_DEPTH), f"nested deeper than {TOOL_ARGUMENTS_MAX_DEPTH} levels (at character 320)"),
        ("[" * EXPORT_DEPTH + "]" * EXPORT_DEPTH, f"nested deeper than {TOOL_ARGUMENTS_MAX_DEPTH} levels"),
        ('{"a": NaN}', "NaN is not allowed"),
        ('{"a": Infinity}', "Infinity is not allowed"),
        ('{"a": -Infinity}', "-Infinity is not allowed"),
        ('{"a": ' + "7" * 5000 + "}", "an integer of 5000 digits is too long (at most 100)"),
        ('{"a": -' + "7" * 101 + "}", "an integer of 101 digits is too long"),
        ('{"a": 1e400}', "the number 1e400 is out of range"),
        ('{"a": 1, "a": 2}', "duplicate key 'a'"),
    ],
    ids=["deep-5000", "deep-200000", "nan", "inf", "-inf", "int-5000", "int-101", "1e400", "dup-key"],
)
def test_loads_refuses_with_a_one_line_typed_error(text: str, fragment: str) -> None:
    with pytest.raises(JsonLimitError) as caught:
        loads(text, max_depth=TOOL_ARGUMENTS_MAX_DEPTH)
    assert fragment in str(caught.value) and "\n" not in str(caught.value)


def test_loads_takes_what_is_within_the_limits() -> None:
    at_bound = nested(TOOL_ARGUMENTS_MAX_DEPTH)
    assert loads(at_bound, max_depth=TOOL_ARGUMENTS_MAX_DEPTH) == nested_value(TOOL_ARGUMENTS_MAX_DEPTH)
    # brackets and escaped quotes inside strings are text, not nesting
    tricky = '{"a": "[[[[{{{{\\"[[[[", "b": [1, "]]]}}}"], "c": ' + "9" * 100 + ', "d": 1.5e308}'
    assert loads(tricky, max_depth=2)["a"] == '[[[[{{{{"[[[['
    # text that is not JSON keeps json's own error (a ValueError), not ours
    with pytest.raises(json.JSONDecodeError):
        loads('{"a": [1, 2', max_depth=5)


def test_check_value_holds_parsed_values_to_the_same_limits_and_names_the_path() -> None:
    with pytest.raises(JsonLimitError, match=r"nested deeper than 64 levels at \$\.a\.a"):
        check_value(nested_value(HOSTILE_DEPTH), max_depth=TOOL_ARGUMENTS_MAX_DEPTH)
    with pytest.raises(JsonLimitError, match=r"nan is not allowed at \$\.x\[1\]"):
        check_value({"x": [1, math.nan]}, max_depth=3)
    with pytest.raises(JsonLimitError, match=r"about 5000 digits at \$\.n is too long"):
        check_value({"n": 10**4999}, max_depth=3)
    check_value(nested_value(TOOL_ARGUMENTS_MAX_DEPTH), max_depth=TOOL_ARGUMENTS_MAX_DEPTH)


@pytest.mark.parametrize(
    ("value", "fragment"),
    [
        (math.nan, "NaN and Infinity have no canonical JSON form"),
        ({"a": [math.inf]}, "NaN and Infinity have no canonical JSON form"),
        (10**5000, "no canonical JSON form: Exceeds the limit"),
        (nested_value(HOSTILE_DEPTH), "nests too deep to encode as JSON"),
    ],
    ids=["nan", "inf", "int-5000", "deep-5000"],
)
def test_canonical_bytes_refuses_what_has_no_canonical_json(value: Any, fragment: str) -> None:
    with pytest.raises(CanonicalJsonError, match=fragment):
        canonical_bytes(value)


def test_a_deep_http_error_body_is_quoted_not_a_recursion_error() -> None:
    error = Failures("p", "m", None).status(400, httpx.Headers(), b"[" * 60_000)
    assert not error.retryable and "HTTP 400 Bad Request (not retried): [[[[" in str(error)


# --- exports: the Python API ---------------------------------------------------------


def forged(content: str) -> SessionCheckpointExportV1:
    """``content`` under a descriptor whose size and digests match it: only the parse can refuse it."""
    good = export_at(state_at_boundary(), 5_000)
    fields = good.descriptor.model_dump(mode="json", exclude={"descriptor_digest"})
    data = content.encode("utf-8", errors="surrogatepass")
    fields |= {"size_bytes": len(data), "content_digest": sha256_digest(data)}
    descriptor = good.descriptor.model_validate({**fields, "descriptor_digest": digest_of(fields)})
    return SessionCheckpointExportV1.model_construct(descriptor=descriptor, content=content)


def good_content() -> str:
    return export_at(state_at_boundary(), 5_000).content


BAD_CONTENTS: list[tuple[str, str, str]] = [
    ("deep", "[" * EXPORT_DEPTH + "]" * EXPORT_DEPTH, f"nested deeper than {DOCUMENT_MAX_DEPTH} levels"),
    ("nan", good_content().replace('"total_tokens":3', '"total_tokens":NaN', 1), "NaN is not allowed"),
    ("inf", good_content().replace('"total_tokens":3', '"total_tokens":Infinity', 1), "Infinity is not"),
    ("int-5000", good_content().replace('"turn":1', '"turn":' + "1" * 5000, 1), "5000 digits is too long"),
    ("1e400", good_content().replace('"total_tokens":3', '"total_tokens":1e400', 1), "1e400 is out of range"),
    ("dup-key", '{"logical_resume":1,"logical_resume":2}', "duplicate key 'logical_resume'"),
]


@pytest.mark.parametrize(
    ("content", "fragment"), [c[1:] for c in BAD_CONTENTS], ids=[c[0] for c in BAD_CONTENTS]
)
def test_opening_refuses_odd_content_with_encoding_error(content: str, fragment: str) -> None:
    with pytest.raises(EncodingError) as caught:
        open_export(forged(content))
    message = str(caught.value)
    assert message.startswith("content is refused: ") and fragment in message and "\n" not in message


def test_opening_refuses_a_lone_surrogate_and_a_descriptor_that_cannot_be_encoded() -> None:
    with pytest.raises(EncodingError, match="content is not valid Unicode at character 1"):
        open_export(forged('"\ud800"'))
    good = export_at(state_at_boundary(), 5_000)
    huge = good.descriptor.model_copy(update={"size_bytes": 10**5000})  # by a road other than a file
    with pytest.raises(InvalidDescriptor, match="the descriptor cannot be encoded"):
        open_export(SessionCheckpointExportV1.model_construct(descriptor=huge, content=good.content))


def export_document(export: SessionCheckpointExportV1) -> str:
    """The file the filesystem sink writes for ``export``."""
    return json.dumps({"descriptor": export.descriptor.model_dump(mode="json"), "content": export.content})


def bad_files() -> list[tuple[str, bytes, str]]:
    """(name, file bytes, message fragment) of hostile export files."""
    good = export_document(export_at(state_at_boundary(), 5_000)).encode()
    out = [
        (name, export_document(forged(content)).encode(), fragment)
        for name, content, fragment in BAD_CONTENTS
    ]
    return [
        *out,
        (
            "file-not-utf8",
            good.replace(b"read it", b"read \xff", 1),
            "the export file is not UTF-8: byte 0xff",
        ),
        ("file-truncated", good[: len(good) // 2], "the export file ends early (truncated?)"),
        ("file-deep", b'{"descriptor":' + b"[" * EXPORT_DEPTH, "the export file is refused: nested deeper"),
        ("file-nan", good.replace(b'"turn": 1', b'"turn": NaN', 1), "the export file is refused: NaN"),
    ]


BAD_FILES = bad_files()


@pytest.mark.parametrize(("data", "fragment"), [f[1:] for f in BAD_FILES], ids=[f[0] for f in BAD_FILES])
def test_loading_and_opening_a_hostile_file_raises_encoding_error(data: bytes, fragment: str) -> None:
    with pytest.raises(EncodingError, match=re.escape(fragment)):
        load_export(data).open()


def test_a_file_that_is_not_json_at_all_keeps_pydantics_error() -> None:
    with pytest.raises(ValidationError, match="Invalid JSON"):
        load_export(b"not an export")


# --- exports: the CLI ---------------------------------------------------------------


@pytest.mark.parametrize(("data", "fragment"), [f[1:] for f in BAD_FILES], ids=[f[0] for f in BAD_FILES])
def test_verify_prints_one_line_and_exits_1(
    data: bytes, fragment: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "export.json"
    path.write_bytes(data)
    assert run_cli(["verify", str(path)]) == 1
    out, err = capsys.readouterr()
    assert out.startswith(f"FAILED {path}: EncodingError: ") and fragment in out
    assert out.count("\n") == 1 and err == ""


@pytest.mark.parametrize("case", ["deep", "nan", "file-truncated", "file-not-utf8"])
def test_resume_refuses_before_connecting_with_one_line_and_exit_2(
    case: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    [(data, fragment)] = [f[1:] for f in BAD_FILES if f[0] == case]
    path = tmp_path / "export.json"
    path.write_bytes(data)
    assert run_cli(["resume", str(path)]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.startswith(f"durable-agent: resume: cannot read {path}: EncodingError: ")
    assert fragment in err and err.count("\n") == 1


def test_the_console_script_on_a_200000_deep_export_prints_no_traceback(tmp_path: Path) -> None:
    [(data, _)] = [f[1:] for f in BAD_FILES if f[0] == "deep"]
    path = tmp_path / "deep.json"
    path.write_bytes(data)
    script = Path(sys.executable).parent / "durable-agent"
    done = subprocess.run([str(script), "verify", str(path)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 1 and done.stderr == ""
    assert done.stdout == (
        f"FAILED {path}: EncodingError: content is refused: nested deeper than {DOCUMENT_MAX_DEPTH} "
        f"levels (at character {DOCUMENT_MAX_DEPTH})\n"
    )


# --- a hostile model, through AgentRun on the real dev server ----------------------------


async def failed_run(client: Client, config: Any, tmp_path: Path) -> tuple[Any, Any]:
    """Run to its end; (result, history)."""
    ws = tmp_path / "ws"
    ws.mkdir(exist_ok=True)
    async with running_worker(client, AgentActivities(config)) as queue:
        handle = await start(client, queue, ws, "hello")
        result = await asyncio.wait_for(handle.result(), 20)
        return result, await handle.fetch_history()


def refused(where: str, reason: str) -> str:
    what = "the model's arguments for tool 'read' are refused (not retried)"
    return f"model call failed: {where}: {what}: {reason}"


@pytest.mark.parametrize(
    ("call", "reason"),
    [
        ({"arguments": nested(HOSTILE_DEPTH)}, "nested deeper than 64 levels (at character 320)"),
        ({"input": nested_value(100)}, "nested deeper than 64 levels at $.a.a.a"),
        ({"arguments": '{"file_path": "a.txt", "offset": NaN}'}, "NaN is not allowed (not a JSON number)"),
    ],
    ids=["arguments-5000", "input-100", "nan"],
)
async def test_a_scripted_model_with_odd_arguments_fails_the_run_once(
    call: dict[str, Any], reason: str, client: Client, tmp_path: Path
) -> None:
    config = scripted_config(tmp_path, [{"tool_calls": [{"id": "c1", "name": "read", **call}]}, final()])
    result, history = await failed_run(client, config, tmp_path)
    assert result.status == "failed" and result.tool_calls_count == 0
    assert result.error.startswith(refused("scripted model scripted/static", reason)), result.error
    assert [a for a, _ in model_attempts(history)] == [1]
    assert "RecursionError" not in history.to_json()


@pytest.mark.parametrize(
    ("wire", "raw", "reason"),
    [
        (OpenAIWire(), nested(HOSTILE_DEPTH), "nested deeper than 64 levels (at character 320)"),
        (AnthropicWire(), nested(HOSTILE_DEPTH), "nested deeper than 64 levels (at character 320)"),
        (OpenAIWire(), '{"file_path": "a", "limit": ' + "9" * 5000 + "}", "an integer of 5000 digits"),
    ],
    ids=["openai-deep", "anthropic-deep", "openai-int-5000"],
)
async def test_a_wire_model_with_odd_arguments_fails_the_run_once(
    wire: Wire, raw: str, reason: str, client: Client, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(KEY_ENV, SECRET)
    async with WireServer() as server:
        server.queue(*[wire.stream(calls=[Call("t1", "read", {}, raw=raw, piece=4096)]) for _ in range(3)])
        config = scripted_config(
            tmp_path,
            [final()],
            default_model=f"{wire.kind}/{MODEL}",
            providers={wire.kind: wire.provider(server.base_url, KEY_ENV)},
        )
        result, history = await failed_run(client, config, tmp_path)
        assert len(server.requests) == 1
    assert result.error.startswith(refused(f"model {wire.kind}/{MODEL}", reason)), result.error
    assert result.status == "failed" and [a for a, _ in model_attempts(history)] == [1]
    assert "RecursionError" not in history.to_json()


async def test_arguments_at_the_bound_reach_the_tool_and_the_run_goes_on(
    client: Client, tmp_path: Path
) -> None:
    # 64 levels: through the data converter, the workflow's digests, the tool and the export
    deep = nested_value(TOOL_ARGUMENTS_MAX_DEPTH - 1)
    config = scripted_config(tmp_path, [tool_call("c1", "read", file_path=deep), final("went on")])
    ws = tmp_path / "ws"
    ws.mkdir()
    sink = RecordingSink()
    async with running_worker(client, AgentActivities(config, sinks={"local": sink})) as queue:
        result = await asyncio.wait_for((await start(client, queue, ws)).result(), 20)
    assert result.status == "completed" and result.text == "went on"
    [end] = [
        e.event for e in sink.exports[-1].open().source_run().events if isinstance(e.event, ToolEndEvent)
    ]
    assert end.is_error and "invalid arguments for 'read'" in end.output
