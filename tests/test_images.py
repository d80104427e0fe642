"""Images: a tool's image reaches a model that takes images, as a note one that does not,
through history as a reference and into the export whole."""

from __future__ import annotations

import base64
import json
import sys
from pathlib import Path
from typing import Any

import pytest
from temporalio.client import Client

from durable_agent.activities import AgentActivities
from durable_agent.activities.tools.fs import read
from durable_agent.activities.tools.tool import ToolContent
from durable_agent.config import AgentConfig
from durable_agent.core.canonical import canonical_bytes
from durable_agent.core.export import CheckpointPayload, InvalidPayload, SessionCheckpointExportV1
from durable_agent.core.images import (
    IMAGE_MAX_BYTES,
    image_block,
    sniff_media_type,
    with_image_data,
    without_images,
)
from durable_agent.core.models import ImageBlock, Message, TextBlock, ToolResultBlock
from durable_agent.core.tool_args import ReadArgs
from tests.helpers import RecordingProvider, RecordingSink, running_worker, scripted_config, start, tool_call
from tests.mcp_servers.agent_tools import TINY_PNG

AGENT_TOOLS = Path(__file__).parent / "mcp_servers" / "agent_tools.py"
TINY_B64 = base64.b64encode(TINY_PNG).decode()


def test_images_are_known_by_their_first_bytes_not_their_name() -> None:
    assert sniff_media_type(TINY_PNG[:16]) == "image/png"
    assert sniff_media_type(b"\xff\xd8\xff\xe0\x00\x10JFIF") == "image/jpeg"
    assert sniff_media_type(b"GIF89a\x01\x00") == "image/gif"
    assert sniff_media_type(b"RIFF\x24\x00\x00\x00WEBPVP8 ") == "image/webp"
    assert sniff_media_type(b"hello world") is None
    assert sniff_media_type(b"RIFF\x24\x00\x00\x00WAVEfmt ") is None


def test_a_result_without_images_keeps_the_bytes_it_had() -> None:
    block = ToolResultBlock(tool_use_id="t1", content="ok")
    assert (
        canonical_bytes(block) == b'{"content":"ok","is_error":false,"tool_use_id":"t1","type":"tool_result"}'
    )
    with_image = block.model_copy(update={"images": (image_block(TINY_PNG, "image/png"),)})
    assert b'"images":[' in canonical_bytes(with_image)
    assert ToolResultBlock.model_validate_json(with_image.model_dump_json()) == with_image


def _conversation(image: ImageBlock) -> list[Message]:
    result = ToolResultBlock(tool_use_id="t1", content="a.png is an image", images=(image,))
    return [
        Message(role="user", content=(TextBlock(text="look"),)),
        Message(role="user", content=(result,)),
    ]


def test_references_are_filled_from_the_store_and_a_lost_one_is_said_not_left_silent() -> None:
    whole = image_block(TINY_PNG, "image/png")
    messages = _conversation(whole.reference())
    [filled] = with_image_data(messages, {whole.digest: whole.data})[1].images()
    assert filled == whole
    lost = with_image_data(messages, {})[1].content[0]
    assert isinstance(lost, ToolResultBlock) and not lost.images
    assert "no longer available" in lost.content and "image/png" in lost.content


def test_a_model_without_attachment_is_told_what_it_cannot_see() -> None:
    shown = without_images(_conversation(image_block(TINY_PNG, "image/png")), "p/m")[1].content[0]
    assert isinstance(shown, ToolResultBlock) and not shown.images
    assert "not shown" in shown.content and "attachment = true" in shown.content


def test_read_of_an_image_returns_it_and_of_a_huge_one_says_so(tmp_path: Path) -> None:
    (tmp_path / "plot.dat").write_bytes(TINY_PNG)  # by content, whatever its name
    out = read(ReadArgs(file_path="plot.dat"), tmp_path)
    assert isinstance(out, ToolContent) and "image/png" in out.text
    assert [(i.media_type, i.data, i.size) for i in out.images] == [("image/png", TINY_B64, len(TINY_PNG))]
    (tmp_path / "huge.png").write_bytes(TINY_PNG + b"\0" * IMAGE_MAX_BYTES)
    huge = read(ReadArgs(file_path="huge.png"), tmp_path)
    assert isinstance(huge, str) and "larger than" in huge and "not shown" in huge


def payload_text(history_json: str) -> str:
    """Every payload of a history, decoded (its JSON form holds them as base64)."""
    out: list[str] = []

    def walk(value: Any) -> None:
        if isinstance(value, dict):
            for key, item in value.items():
                if key == "data" and isinstance(item, str):
                    out.append(base64.b64decode(item).decode("utf-8", errors="replace"))
                else:
                    walk(item)
        elif isinstance(value, list):
            for item in value:
                walk(item)

    walk(json.loads(history_json))
    return "\n".join(out)


def _config(tmp: Path, responses: list[dict[str, Any]], attachment: bool, **extra: Any) -> AgentConfig:
    config = scripted_config(tmp, responses, **extra)
    scripted = config.providers["scripted"].model_copy(update={"attachment": attachment})
    return config.model_copy(update={"providers": {"scripted": scripted}})


async def _run(
    client: Client, tmp: Path, config: AgentConfig, files: dict[str, bytes]
) -> tuple[Any, RecordingProvider, RecordingSink, str]:
    ws = tmp / "ws"
    ws.mkdir()
    for name, data in files.items():
        (ws / name).write_bytes(data)
    sink = RecordingSink()
    acts = AgentActivities(config, sinks={"local": sink})
    recorder = RecordingProvider(acts.providers["scripted"])
    acts.providers["scripted"] = recorder
    try:
        async with running_worker(client, acts) as queue:
            handle = await start(client, queue, ws, "what does the plot show?")
            result = await handle.result()
            history = payload_text((await handle.fetch_history()).to_json())
    finally:
        await acts.aclose()
    return result, recorder, sink, history


async def test_a_model_with_attachment_sees_the_image_history_holds_a_digest_and_the_export_the_image(
    client: Client, tmp_path: Path
) -> None:
    responses = [tool_call("r1", "read", file_path="plot.png"), {"text": "a single pixel"}]
    config = _config(tmp_path, responses, attachment=True)
    result, recorder, sink, history = await _run(client, tmp_path, config, {"plot.png": TINY_PNG})
    assert result.status == "completed", result.error
    [image] = [i for m in recorder.seen[1] for i in m.images()]
    assert image.data == TINY_B64 and image.media_type == "image/png"
    # the workflow history names the image by digest; the data stayed in the session store
    assert image.digest in history and TINY_B64 not in history
    exported = sink.exports[-1]
    [kept] = [i for m in exported.open().logical_resume.messages for i in m.images()]
    assert kept == image
    # the export is portable: it opens from its JSON with the image in it
    again = SessionCheckpointExportV1.model_validate_json(exported.model_dump_json()).open()
    assert [i.data for m in again.logical_resume.messages for i in m.images()] == [TINY_B64]

    # an image that is not what it states is refused on opening; one without data on building
    payload = exported.open()

    def with_image(**change: Any) -> CheckpointPayload:
        def fix(m: Message) -> Message:
            blocks = tuple(
                b.model_copy(update={"images": tuple(i.model_copy(update=change) for i in b.images)})
                if isinstance(b, ToolResultBlock)
                else b
                for b in m.content
            )
            return m.model_copy(update={"content": blocks})

        logical = payload.logical_resume
        messages = tuple(fix(m) for m in logical.messages)
        return payload.model_copy(
            update={"logical_resume": logical.model_copy(update={"messages": messages})}
        )

    for change in ({"size": 1}, {"digest": "sha256:" + "0" * 64}):
        forged = SessionCheckpointExportV1.build(with_image(**change))
        with pytest.raises(InvalidPayload, match="image"):
            forged.open()
    with pytest.raises(InvalidPayload, match="no data"):
        SessionCheckpointExportV1.build(with_image(data=""))


async def test_a_model_without_attachment_gets_a_note_and_the_export_still_keeps_the_image(
    client: Client, tmp_path: Path
) -> None:
    responses = [tool_call("r1", "read", file_path="plot.png"), {"text": "I cannot see it"}]
    config = _config(tmp_path, responses, attachment=False)
    result, recorder, sink, _ = await _run(client, tmp_path, config, {"plot.png": TINY_PNG})
    assert result.status == "completed", result.error
    second = recorder.seen[1]
    assert not [i for m in second for i in m.images()]
    note = json.dumps([m.model_dump(mode="json") for m in second])
    assert "not configured to take images" in note
    assert [i.data for m in sink.exports[-1].open().logical_resume.messages for i in m.images()] == [TINY_B64]


async def test_an_mcp_servers_image_reaches_the_model_as_an_image(client: Client, tmp_path: Path) -> None:
    servers = {"tools": {"command": sys.executable, "args": [str(AGENT_TOOLS)]}}
    responses = [tool_call("p1", "mcp__tools__picture"), {"text": "a pixel"}]
    config = _config(
        tmp_path,
        responses,
        attachment=True,
        mcp=servers,
        permissions={"allow": ["mcp__*"], "default": "deny"},
    )
    result, recorder, _, history = await _run(client, tmp_path, config, {})
    assert result.status == "completed", result.error
    [image] = [i for m in recorder.seen[1] for i in m.images()]
    assert base64.b64decode(image.data) == TINY_PNG and image.media_type == "image/png"
    assert TINY_B64 not in history
