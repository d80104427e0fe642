"""Exports with thinking, redacted thinking and images: ``verify``, ``pack`` and ``resume`` take
them, and a resume sends the blocks back exactly; exports without them keep the bytes earlier
code wrote, and older exports keep opening (``docs/checkpoint-export-v1.md``).

The commands run as a user runs them, in a subprocess (``tests.test_cli.cli``); the runs go
through ``AgentRun`` on the Temporal dev server, on the scripted model or over HTTP against
``AnthropicThinking`` (tests/wire_anthropic.py), which refuses thinking whose signature was
changed.
"""

from __future__ import annotations

import asyncio
import base64
import json
from pathlib import Path
from typing import Any

import pytest
from temporalio.client import Client

from durable_agent.activities import AgentActivities
from durable_agent.activities.providers import build_providers
from durable_agent.activities.sinks import read_export_file
from durable_agent.config import AgentConfig
from durable_agent.core.canonical import canonical_bytes, digest_of, sha256_digest
from durable_agent.core.events import ThinkingEvent
from durable_agent.core.export import ExportDescriptor, InvalidPayload, SessionCheckpointExportV1, open_export
from durable_agent.core.images import image_block, with_image_data
from durable_agent.core.loop import LoopState
from durable_agent.core.models import (
    ImageBlock,
    Message,
    ModelResponse,
    RedactedThinkingBlock,
    TextBlock,
    ThinkingBlock,
    ToolResultBlock,
    ToolUseBlock,
)
from durable_agent.core.run_log import RunLog, export_payload
from tests.export_fixtures import BEFORE_21, FIRST, golden_plan, write_golden
from tests.helpers import RecordingProvider, running_worker, scripted_config, start, tool_call, workspace_with
from tests.test_cli import cli
from tests.test_images import TINY_B64, payload_text
from tests.wire_anthropic import AnthropicThinking, Step
from tests.wire_servers import AnthropicWire, Call, Received, WireServer

TINY_PNG = base64.b64decode(TINY_B64)  # a 1x1 PNG
KEY_ENV = "AGENT_EXPORT_BLOCKS_KEY"
BUDGET = 2048


def files_under(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def turn_files(root: Path) -> list[Path]:
    return sorted(root.rglob("turn-*.json"))


def blocks_of(messages: tuple[Message, ...] | list[Message], kind: type[Any]) -> list[Any]:
    return [b for m in messages for b in m.content if isinstance(b, kind)]


# --- without the new blocks: the bytes of before -------------------------------------------


async def test_an_export_without_the_new_blocks_is_byte_identical_to_before(tmp_path: Path) -> None:
    await write_golden(tmp_path)
    now, before = files_under(tmp_path), files_under(BEFORE_21)
    assert sorted(now) == sorted(before)  # the same manifests and parts, named by the same digests
    for name, data in before.items():
        assert now[name] == data, f"{name} differs from what the code before issue 21 wrote"
    content = read_export_file(tmp_path / "portable.json").content
    assert '"images"' not in content and '"thinking"' not in content


def test_exports_written_by_earlier_versions_still_open() -> None:
    first = read_export_file(FIRST).open()
    assert [m.role for m in first.logical_resume.messages] == ["user", "assistant", "user"]
    [result] = blocks_of(first.logical_resume.messages, ToolResultBlock)
    assert result.content == "     1\talpha\n" and result.images == ()
    assert first.source_run().snapshot.resumed_from is None  # a field added since
    manifests = turn_files(BEFORE_21)
    assert [read_export_file(p).open().logical_resume.turn for p in manifests] == [1, 2, 3]
    assert read_export_file(manifests[-1]) == read_export_file(BEFORE_21 / "portable.json")


async def test_the_cli_verifies_and_packs_earlier_exports_as_they_were(
    client: Client, tmp_path: Path
) -> None:
    manifests = turn_files(BEFORE_21)
    verified = await cli("verify", str(FIRST), *map(str, manifests), client=client, cwd=tmp_path)
    assert verified.code == 0, verified.out + verified.err
    assert verified.out.count("OK ") == 4
    packed = tmp_path / "packed.json"
    done = await cli("pack", str(manifests[-1]), "-o", str(packed), client=client, cwd=tmp_path)
    assert done.code == 0, done.err
    assert packed.read_bytes() == (BEFORE_21 / "portable.json").read_bytes()


# --- the new blocks in an export --------------------------------------------------------


def signed_export() -> SessionCheckpointExportV1:
    """An export whose assistant step has signed thinking and redacted thinking, and whose tool
    result has an image, built as the worker builds one (the log holds the image by reference)."""
    state = LoopState(golden_plan("run-blocks", "What does plot.png show?"), now_ms=1_000)
    call = ToolUseBlock(id="t1", name="read", input={"file_path": "plot.png"})
    thinking = "The user asks about plot.png: read it."
    message = Message(
        role="assistant",
        content=(
            ThinkingBlock(thinking=thinking, signature="c2lnbmVk", wire="anthropic"),
            RedactedThinkingBlock(data="opaque-data"),
            TextBlock(text="Reading it."),
            call,
        ),
    )
    state.add_model_response(ModelResponse(message=message), 2_000)
    image = image_block(TINY_PNG, "image/png")
    state.add_tool_result(call, "plot.png is an image/png", False, 3_000, images=(image,))
    entry = state.journal.take_entry()
    assert entry is not None
    log = RunLog("run-blocks")
    log.apply(entry)
    assert log.messages[-1].images()[0].is_reference  # what the store's log holds
    filled = with_image_data(log.messages, {image.digest: image.data})
    payload = export_payload(state.journal.header(), log, [], state.export_facts(3_500), filled)
    return SessionCheckpointExportV1.build(payload)


def test_each_new_block_is_written_as_the_contract_says() -> None:
    export = signed_export()
    raw = json.loads(export.content)
    _, step, results = raw["logical_resume"]["messages"]
    assert step["content"][:2] == [
        {
            "id": None,
            "signature": "c2lnbmVk",
            "thinking": "The user asks about plot.png: read it.",
            "type": "thinking",
            "wire": "anthropic",
        },
        {"data": "opaque-data", "type": "redacted_thinking"},
    ]
    [result] = results["content"]
    assert result["images"] == [
        {
            "data": TINY_B64,
            "digest": sha256_digest(TINY_B64.encode()),
            "media_type": "image/png",
            "size": len(TINY_PNG),
            "type": "image",
        }
    ]
    events = [e["event"] for e in raw["snapshot"]["run_records"][0]["events"]]
    assert [e["type"] for e in events] == ["run_start", "thinking", "text_delta", "tool_end"]
    assert events[1] == {"text": "The user asks about plot.png: read it.", "type": "thinking"}
    payload = export.open()
    assert canonical_bytes(payload) == export.content.encode()  # every block round-trips
    assert payload.source_run().events[1].event == ThinkingEvent(
        text="The user asks about plot.png: read it."
    )
    # a block this reader does not know is refused, not dropped, even with every digest right
    raw["logical_resume"]["messages"][1]["content"][0]["type"] = "reflection"
    with pytest.raises(InvalidPayload, match="'reflection' found using 'type' does not match any"):
        open_export(with_digests(export, raw))


def with_digests(export: SessionCheckpointExportV1, raw: dict[str, Any]) -> SessionCheckpointExportV1:
    """``raw`` as an export's content, its descriptor's digests made to match."""
    content = canonical_bytes(raw)
    fields = export.descriptor.model_dump(mode="json", exclude={"descriptor_digest"})
    fields |= {
        "size_bytes": len(content),
        "content_digest": sha256_digest(content),
        "snapshot_digest": digest_of(raw["snapshot"]),
        "logical_resume_digest": digest_of(raw["logical_resume"]),
    }
    descriptor = ExportDescriptor.model_validate({**fields, "descriptor_digest": digest_of(fields)})
    return SessionCheckpointExportV1(descriptor=descriptor, content=content.decode())


# --- verify, pack and resume: the scripted model ----------------------------------------


def _with_images(config: AgentConfig) -> AgentConfig:
    scripted = config.providers["scripted"].model_copy(update={"attachment": True})
    return config.model_copy(update={"providers": {"scripted": scripted}})


async def test_verify_pack_and_resume_a_run_with_thinking_and_an_image(
    client: Client, tmp_path: Path
) -> None:
    responses: list[dict[str, Any]] = [
        {
            "thinking": "First, look at the plot.",
            "text": "Looking.",
            **tool_call("r1", "read", file_path="plot.png"),
        },
        {"thinking": "A single pixel. Now a.txt.", **tool_call("r2", "read", file_path="a.txt")},
        {"thinking": "Both seen; answer.", "text": "A pixel, and alpha."},
    ]
    config = _with_images(scripted_config(tmp_path, responses))
    ws = workspace_with(tmp_path, {"a.txt": "alpha\n"})
    (ws / "plot.png").write_bytes(TINY_PNG)
    async with running_worker(client, AgentActivities(config)) as queue:
        first = await (await start(client, queue, ws, "What is in the plot and a.txt?")).result()
    assert first.status == "completed", first.error
    manifests = turn_files(tmp_path / "exports")
    assert len(manifests) == 2
    verified = await cli("verify", *map(str, manifests), client=client, cwd=tmp_path)
    assert verified.code == 0 and verified.out.count("OK ") == 2, verified.out + verified.err
    packed = tmp_path / "turn1.json"
    done = await cli("pack", str(manifests[0]), "-o", str(packed), client=client, cwd=tmp_path)
    assert done.code == 0, done.err
    exported = read_export_file(packed).open().logical_resume.messages
    assert exported == read_export_file(manifests[0]).open().logical_resume.messages
    assert [b.thinking for b in blocks_of(exported, ThinkingBlock)] == ["First, look at the plot."]
    [image] = [i for m in exported for i in m.images()]
    assert (image.data, image.size, image.digest) == (
        TINY_B64,
        len(TINY_PNG),
        sha256_digest(TINY_B64.encode()),
    )

    model = RecordingProvider(build_providers(config)["scripted"])
    acts = AgentActivities(config, providers={"scripted": model})
    async with running_worker(client, acts) as queue:
        resumed = await cli(
            "resume",
            str(packed),
            "--workspace",
            str(ws),
            client=client,
            cwd=tmp_path,
            queue=queue,
            timeout=90,
        )
    assert resumed.code == 0, resumed.out + resumed.err
    assert "A pixel, and alpha." in resumed.out
    # the resumed run's first request: the export's conversation, every block as exported
    assert model.seen[0] == exported
    assert [b.thinking for b in blocks_of(model.seen[-1], ThinkingBlock)] == [
        "First, look at the plot.",
        "A single pixel. Now a.txt.",
    ]


# --- resume sends Anthropic's signed thinking back exactly --------------------------------


def anthropic_config(server: WireServer, tmp_path: Path) -> AgentConfig:
    entry = AnthropicWire().provider(server.base_url, KEY_ENV, thinking_budget_tokens=BUDGET, attachment=True)
    return scripted_config(
        tmp_path, [{"text": "unused"}], default_model="anthropic/test-model", providers={"anthropic": entry}
    )


def sent_blocks(request: Received, kind: str) -> list[dict[str, Any]]:
    return [
        b
        for m in request.body["messages"]
        for b in (m["content"] if isinstance(m["content"], list) else [])
        if b.get("type") == kind
    ]


async def test_a_resume_sends_signed_and_redacted_thinking_and_the_image_back_exactly(
    client: Client, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(KEY_ENV, "sk-ant-export-blocks")
    steps = [
        Step(
            thinking="Look at the plot first.",
            redacted=True,
            calls=[Call("t1", "read", {"file_path": "plot.png"})],
        ),
        Step(thinking="One pixel; a.txt next.", calls=[Call("t2", "read", {"file_path": "a.txt"})]),
        Step(thinking="Done reading.", text="A pixel, and alpha."),
    ]
    ws = workspace_with(tmp_path, {"a.txt": "alpha\n"})
    (ws / "plot.png").write_bytes(TINY_PNG)
    model = AnthropicThinking(steps)
    async with WireServer(respond=model) as server:
        config = anthropic_config(server, tmp_path)
        async with running_worker(client, AgentActivities(config)) as queue:
            handle = await start(client, queue, ws, "What is in the plot and a.txt?")
            first = await asyncio.wait_for(handle.result(), 60)
    assert first.status == "completed" and model.refusals == [], first.error
    manifests = turn_files(tmp_path / "exports")
    packed = tmp_path / "turn2.json"
    verified = await cli("verify", *map(str, manifests), client=client, cwd=tmp_path)
    assert verified.code == 0 and verified.out.count("OK ") == 2, verified.out + verified.err
    done = await cli("pack", str(manifests[-1]), "-o", str(packed), client=client, cwd=tmp_path)
    assert done.code == 0, done.err
    exported = read_export_file(packed).open().logical_resume.messages
    thinking = blocks_of(exported, ThinkingBlock)
    assert [(b.thinking, b.signature, b.wire) for b in thinking] == [
        (s.thinking, model.sign(s.thinking), "anthropic") for s in steps[:2]
    ]
    [redacted] = blocks_of(exported, RedactedThinkingBlock)
    [image] = [i for m in exported for i in m.images()]
    assert isinstance(image, ImageBlock) and image.data == TINY_B64

    # the same model (its secret) answers the resumed run, which the worker reads from the file
    again = AnthropicThinking(
        [Step(thinking="Already read both.", text="A pixel, and alpha.")], secret=model.secret
    )
    async with WireServer(respond=again) as server:
        config = anthropic_config(server, tmp_path)
        async with running_worker(client, AgentActivities(config)) as queue:
            resumed = await cli(
                "resume", str(packed), "--on-worker", "--workspace", str(ws),
                client=client, cwd=tmp_path, queue=queue, timeout=90,
            )  # fmt: skip
        requests = list(server.requests)
    assert resumed.code == 0, resumed.out + resumed.err
    assert again.refusals == [] and len(requests) == 1
    [request] = requests
    assert sent_blocks(request, "thinking") == [
        {"type": "thinking", "thinking": b.thinking, "signature": b.signature} for b in thinking
    ]
    assert sent_blocks(request, "redacted_thinking") == [{"type": "redacted_thinking", "data": redacted.data}]
    [result] = [b for b in sent_blocks(request, "tool_result") if b["tool_use_id"] == "t1"]
    assert {
        "type": "image",
        "source": {"type": "base64", "media_type": "image/png", "data": TINY_B64},
    } in result["content"]
    assert "A pixel, and alpha." in resumed.out


def test_the_recorded_reasoning_history_keeps_thinking_and_holds_the_image_by_digest() -> None:
    """``tests/histories/agent_run_reasoning_v6.json`` (``test_replay.py`` replays it): a run's
    workflow history holds its thinking, and its images as references only."""
    text = payload_text((Path(__file__).parent / "histories" / "agent_run_reasoning_v6.json").read_text())
    assert '"type":"thinking"' in text and "A single pixel. Now a.txt." in text
    assert sha256_digest(TINY_B64.encode()) in text and TINY_B64 not in text
