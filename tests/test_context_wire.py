"""A run far longer than its model's context window, over each HTTP wire protocol.

The wire server holds a 32,000-token window, counts every request by its own
rule (``wire_servers.count_tokens``) and refuses one over it with the vendor's
own context-overflow answer. The model reads 60 files of 20 KB (about 5,000
tokens each by that count: 300,000 in all) one by one, then answers. The run
must complete without a request over the window reaching the model, while the
full transcript, every output whole, stays in the run's exports.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from temporalio.client import Client

from durable_agent.activities import AgentActivities
from durable_agent.activities.sinks import read_export_file
from durable_agent.core.events import ContextCompactedEvent
from durable_agent.core.export import tool_end_ids
from durable_agent.core.models import ToolResultBlock
from tests.helpers import running_worker, start, workspace_with
from tests.test_http_providers import WIRES, http_config, key, loopback_only
from tests.wire_servers import Reader, Wire, WireServer

__all__ = ["key", "loopback_only"]  # fixtures, used by name

FILES = 60
FILE_BYTES = 20_000
WINDOW = 32_000
MAX_TOKENS = 2_048


def file_text(index: int) -> str:
    """``FILE_BYTES`` of numbered lines, different in every file."""
    lines: list[str] = []
    size = 0
    n = 0
    while size < FILE_BYTES:
        n += 1
        line = (
            f"file {index:02d} line {n:04d}: the value of item {index * 1000 + n} is {(n * 7919) % 10007}\n"
        )
        lines.append(line)
        size += len(line)
    return "".join(lines)[: FILE_BYTES - 1] + "\n"


def shown_lines(output: str) -> list[str]:
    """A ``read`` output's lines without their numbers (``"     7\\t..."``)."""
    return [line.split("\t", 1)[1] for line in output.splitlines()]


@pytest.mark.parametrize("wire", WIRES)
async def test_a_run_of_sixty_20kb_reads_in_a_32k_window_completes_whole(
    wire: Wire, client: Client, tmp_path: Path, key: str
) -> None:
    names = [f"part-{i:02d}.txt" for i in range(FILES)]
    texts = {name: file_text(i) for i, name in enumerate(names)}
    ws = workspace_with(tmp_path, texts)
    reader = Reader(wire, names, answer=f"I have read all {FILES} files.")
    async with WireServer(wire, context_window=WINDOW, respond=reader) as server:
        config = http_config(wire, server, tmp_path, context_window=WINDOW, max_tokens=MAX_TOKENS)
        async with running_worker(client, AgentActivities(config)) as queue:
            handle = await start(
                client, queue, ws, "Read every part-NN.txt file, in order.", max_tool_rounds=80
            )
            result = await asyncio.wait_for(handle.result(), 600)

    assert result.status == "completed", result.error
    assert result.text == f"I have read all {FILES} files."
    assert result.tool_calls_count == FILES
    # no request that reached the model was over its window; none was refused either
    sizes = [r.tokens for r in server.requests]
    assert max(sizes) <= WINDOW, f"largest request {max(sizes)} tokens > {WINDOW}"
    assert not [r for r in server.requests if r.overflowed]

    # the export series: one per boundary, in order, each one verifying
    exports = sorted(
        (read_export_file(p) for p in (tmp_path / "exports").rglob("*.json")),
        key=lambda e: e.descriptor.turn,
    )
    assert [e.descriptor.turn for e in exports] == list(range(1, FILES + 1))
    assert [e.turn for e in result.exports] == list(range(1, FILES + 1))
    previous = 0
    for export in exports:
        payload = export.open()  # digests, canonical form, schema, self-consistency
        source = payload.source_run()
        assert source.snapshot.event_count > previous
        previous = source.snapshot.event_count
    # the last holds the whole transcript: every output in full, whatever the model saw
    last = exports[-1].open()
    outputs = {
        b.tool_use_id: b.content
        for m in last.logical_resume.messages
        for b in m.content
        if isinstance(b, ToolResultBlock)
    }
    assert sorted(outputs) == [f"read-{i:03d}" for i in range(FILES)]
    for i, name in enumerate(names):
        assert shown_lines(outputs[f"read-{i:03d}"]) == texts[name].splitlines(), name
    assert tool_end_ids(last.source_run()) == [f"read-{i:03d}" for i in range(FILES)]
    compactions = [e.event for e in last.source_run().events if isinstance(e.event, ContextCompactedEvent)]
    assert compactions, "a 300,000-token run in a 32,000-token window must have compacted"


@pytest.mark.parametrize("wire", WIRES)
async def test_a_window_smaller_than_configured_is_recovered_from_by_the_servers_overflow_answer(
    wire: Wire, client: Client, tmp_path: Path, key: str
) -> None:
    # the worker believes the model holds 32,000 tokens; the server holds 16,000 and says so
    files = 12
    names = [f"part-{i:02d}.txt" for i in range(files)]
    texts = {name: file_text(i) for i, name in enumerate(names)}
    ws = workspace_with(tmp_path, texts)
    reader = Reader(wire, names, answer="done")
    async with WireServer(wire, context_window=16_000, respond=reader) as server:
        config = http_config(wire, server, tmp_path, context_window=WINDOW, max_tokens=MAX_TOKENS)
        async with running_worker(client, AgentActivities(config)) as queue:
            handle = await start(
                client, queue, ws, "Read every part-NN.txt file, in order.", max_tool_rounds=20
            )
            result = await asyncio.wait_for(handle.result(), 300)
    assert result.status == "completed", result.error
    assert result.text == "done" and result.tool_calls_count == files
    refused = [r for r in server.requests if r.overflowed]
    assert refused, "the server's window is smaller than the configured one: some request overflowed"
    assert max(r.tokens for r in server.accepted) <= 16_000
    exports = sorted(
        (read_export_file(p) for p in (tmp_path / "exports").rglob("*.json")),
        key=lambda e: e.descriptor.turn,
    )
    last = exports[-1].open()
    events = [e.event for e in last.source_run().events if isinstance(e.event, ContextCompactedEvent)]
    assert any(e.reason == "overflow" for e in events)
    outputs = [b for m in last.logical_resume.messages for b in m.content if isinstance(b, ToolResultBlock)]
    assert [shown_lines(b.content) for b in outputs] == [texts[n].splitlines() for n in names]
