"""Context management: the estimate, the model's view, the tier decisions (pure), and runs on
the dev server that compact (elide, summarize, after an overflow), resume with the same view,
or fail because nothing more fits."""

from __future__ import annotations

import json
import uuid
from itertools import pairwise
from pathlib import Path
from typing import Any

from temporalio.client import Client

from durable_agent.activities import AgentActivities
from durable_agent.activities.providers import ModelProvider, TextSink
from durable_agent.activities.providers.model_provider import ProviderError
from durable_agent.activities.sinks import FilesystemExportSink
from durable_agent.client import resume_run
from durable_agent.config import AgentConfig, parse_config
from durable_agent.core.activity_api import ModelCallInput
from durable_agent.core.canonical import canonical_bytes
from durable_agent.core.context import (
    SUMMARY_HEADER,
    ContextLedger,
    ContextPolicy,
    known_window,
    message_tokens,
    model_messages,
    next_view,
    plan_compaction,
    request_tokens,
    text_tokens,
)
from durable_agent.core.events import ContextCompactedEvent, EventRecord, ModelUsageEvent
from durable_agent.core.export import SessionCheckpointExportV1
from durable_agent.core.models import (
    ContextView,
    Message,
    ModelResponse,
    TextBlock,
    ToolResultBlock,
    ToolUseBlock,
)
from tests.helpers import RecordingSink, final, read_call, running_worker, start

# --- pure -----------------------------------------------------------------------------


def user(text: str) -> Message:
    return Message(role="user", content=(TextBlock(text=text),))


def call(i: int, name: str = "read") -> Message:
    return Message(
        role="assistant", content=(ToolUseBlock(id=f"c{i}", name=name, input={"file_path": f"f{i}.txt"}),)
    )


def result(i: int, size: int = 3000) -> Message:
    return Message(role="user", content=(ToolResultBlock(tool_use_id=f"c{i}", content="x" * size),))


def transcript(n: int, size: int = 3000) -> list[Message]:
    messages = [user("read the files")]
    for i in range(1, n + 1):
        messages += [call(i), result(i, size)]
    return messages


def well_formed(messages: list[Message]) -> None:
    """Roles alternate from a user message; each tool result answers a call of the message before."""
    assert messages[0].role == "user"
    for before, after in pairwise(messages):
        assert before.role != after.role
        results = {b.tool_use_id for b in after.content if isinstance(b, ToolResultBlock)}
        assert results <= {c.id for c in before.tool_uses()}


def test_the_estimate_is_a_third_of_the_bytes_plus_overheads() -> None:
    assert text_tokens("") == 0
    assert text_tokens("abc") == 1
    assert text_tokens("abcd") == 2
    assert text_tokens("é" * 3) == 2  # 6 UTF-8 bytes
    assert message_tokens(user("abcdef")) == 8 + 8 + 2
    assert request_tokens("sys", [user("abc")], ()) == 16 + 1 + 8 + 8 + 1


def test_known_windows_by_family() -> None:
    assert known_window("gpt-4o-2024-08-06") == 128_000
    assert known_window("gpt-4.1") == 1_047_576
    assert known_window("gpt-4.1-mini") == 128_000
    assert known_window("openai/gpt-5-mini") == 400_000
    assert known_window("claude-sonnet-4-5") == 200_000
    assert known_window("qwen2.5-coder:7b") == 32_768
    assert known_window("llama3.1:8b") == 131_072
    assert known_window("my-own-model") is None


def test_the_ledger_built_step_by_step_equals_the_one_from_the_messages() -> None:
    messages = transcript(5)
    stepwise = ContextLedger()
    for m in messages:
        stepwise = stepwise.applied((), [m])
    assert stepwise == ContextLedger.seeded(messages)
    # results joining the last message later (extend_last) add up the same
    split = ContextLedger().applied((), messages[:-1])
    last = messages[-1].content[0]
    assert isinstance(last, ToolResultBlock)
    joined = split.applied((), [Message(role="user", content=())]).applied([last], [])
    assert joined.estimate(0) == stepwise.estimate(0) + 0
    assert stepwise.estimate(0) == sum(message_tokens(m) for m in messages)


def test_the_view_elides_with_a_stub_and_summarizes_before_an_assistant_message() -> None:
    messages = transcript(4)
    elided = model_messages(messages, ContextView(version=1, elided=("c1",)))
    stub = elided[2].content[0]
    assert isinstance(stub, ToolResultBlock)
    assert "elided" in stub.content and "read" in stub.content and "f1.txt" in stub.content
    assert "3000 characters" in stub.content and "read the file again" in stub.content
    well_formed(elided)
    # a steer between steps stays verbatim next to the summary
    steered = list(messages)
    steered[2] = Message(role="user", content=(*messages[2].content, TextBlock(text="also f9")))
    steered[4] = Message(role="user", content=(*messages[4].content, TextBlock(text="hurry")))
    view = ContextView(version=2, summary="read f1 and f2", summarized=4)
    shown = model_messages(steered, view)
    well_formed(shown)
    first = shown[0]
    texts = [b.text for b in first.content if isinstance(b, TextBlock)]
    assert texts[0] == "read the files"
    assert texts[1].startswith(SUMMARY_HEADER) and texts[1].endswith("read f1 and f2")
    assert "also f9" in texts[2]
    assert shown[1] == steered[5]
    assert model_messages(messages, None) == messages


def test_tier_one_elides_the_oldest_but_never_the_newest() -> None:
    policy = ContextPolicy(window=20_000, reserve=4_000, keep_recent=2)
    ledger = ContextLedger.seeded(transcript(10))
    plan = plan_compaction(ledger, policy, 100, policy.target())
    assert plan is not None and plan.summarize_upto is None
    assert plan.elide[0] == "c1" and "c9" not in plan.elide and "c10" not in plan.elide
    assert plan.estimate_after <= policy.target()
    view, gone = next_view(ledger, plan, None)
    assert view.version == 1 and gone == plan.elide
    assert ledger.compacted(view).estimate(100) == plan.estimate_after


def test_tier_two_when_eliding_is_not_enough() -> None:
    policy = ContextPolicy(window=20_000, reserve=4_000, keep_recent=9)
    ledger = ContextLedger.seeded(transcript(10, 4500))
    plan = plan_compaction(ledger, policy, 100, policy.target())
    assert plan is not None and plan.summarize_upto is not None
    assert ledger.messages[plan.summarize_upto].role == "assistant"
    view, _ = next_view(ledger, plan, "summary")
    assert view.summarized == plan.summarize_upto - 1
    shown = model_messages(transcript(10, 4500), view)
    well_formed(shown)
    # an open step's results and the last call always stay
    assert shown[-2:] == transcript(10, 4500)[-2:]


def test_nothing_to_compact_when_all_must_stay() -> None:
    policy = ContextPolicy(window=5_000, reserve=1_000, keep_recent=4)
    ledger = ContextLedger.seeded([user("x" * 30_000)])
    assert plan_compaction(ledger, policy, 100, policy.target()) is None


def test_the_size_uses_the_providers_report_when_the_view_is_the_same() -> None:
    ledger = ContextLedger.seeded(transcript(2)).answered(5_000, 2_000)
    grown = ledger.applied((), [call(3), result(3, 300)])
    added = grown.estimate(0) - ledger.estimate(0)
    assert grown.size(0) == 5_000 + ledger.estimate(0) - 2_000 + added
    assert grown.compacted(ContextView(version=1)).size(0) == grown.estimate(0)


# --- on the dev server ------------------------------------------------------------------


class Recorder:
    """Keeps every request that reaches the provider; optionally refuses one as too large.

    With ``reads``, it answers by how many answers it gave (read f1 … fN, then a final
    text): the scripted provider counts the assistant messages of the request, which a
    summary takes out of view."""

    def __init__(self, inner: ModelProvider, overflow_at: int | None = None, reads: int = 0) -> None:
        self.inner = inner
        self.calls: list[ModelCallInput] = []
        self.overflow_at = overflow_at
        self.reads = reads
        self.answered = 0

    async def complete(self, call: ModelCallInput, model: str, on_text: TextSink) -> ModelResponse:
        self.calls.append(call)
        if self.overflow_at is not None and len(self.calls) == self.overflow_at:
            raise ProviderError("prompt is too long", retryable=False, context_overflow=True)
        if not self.reads:
            return await self.inner.complete(call, model, on_text)
        self.answered += 1
        n = self.answered
        if n > self.reads:
            return ModelResponse(message=Message(role="assistant", content=(TextBlock(text="done"),)))
        use = ToolUseBlock(id=f"r{n}", name="read", input={"file_path": f"f{n}.txt"})
        return ModelResponse(message=Message(role="assistant", content=(use,)))


def config_for(
    tmp: Path, responses: list[dict[str, Any]], window: int, *, summarizer: bool = False, **context: Any
) -> AgentConfig:
    script = tmp / f"script-{uuid.uuid4().hex[:8]}.json"
    script.write_text(json.dumps({"responses": responses}))
    providers: dict[str, Any] = {
        "scripted": {"kind": "scripted", "script": str(script), "context_window": window}
    }
    if summarizer:
        summary = tmp / "summary.json"
        summary.write_text(json.dumps({"responses": [{"text": "SUMMARY: the files held x's."}]}))
        providers["summarizer"] = {"kind": "scripted", "script": str(summary)}
        context["compaction_model"] = "summarizer/s"
    return parse_config(
        {
            "default_model": "scripted/static",
            "providers": providers,
            "store": {"path": str(tmp / "store")},
            "sinks": {"local": {"kind": "filesystem", "path": str(tmp / "exports")}},
            "permissions": {"allow": ["read(*)"], "default": "deny"},
            "timeouts": {"heartbeat_seconds": 2},
            "context": context,
        },
        tmp,
    )


def files(tmp: Path, n: int, size: int = 20_000) -> Path:
    ws = tmp / "ws"
    ws.mkdir()
    for i in range(1, n + 1):
        line = f"file {i} " + "lorem ipsum dolor sit amet " * 3
        (ws / f"f{i}.txt").write_text((line[:99] + "\n") * (size // 100))
    return ws


def reads(n: int) -> list[dict[str, Any]]:
    return [*(read_call(f"r{i}", f"f{i}.txt") for i in range(1, n + 1)), final("read them all")]


def compactions(events: tuple[EventRecord, ...] | list[EventRecord]) -> list[ContextCompactedEvent]:
    return [r.event for r in events if isinstance(r.event, ContextCompactedEvent)]


def request_key(call: ModelCallInput) -> bytes:
    # the request the model is sent; the session (the prompt cache's key) is the resumed run's own
    return canonical_bytes(call.model_dump(mode="json", exclude={"run_id", "session_id"}))


async def run_reads(
    client: Client, tmp: Path, config: AgentConfig, ws: Path, recorder_args: dict[str, Any] | None = None
) -> tuple[Any, Recorder, RecordingSink]:
    sink = RecordingSink()
    acts = AgentActivities(config, sinks={"local": sink})
    recorder = Recorder(acts.providers["scripted"], **(recorder_args or {}))
    acts.providers["scripted"] = recorder
    async with running_worker(client, acts) as queue:
        handle = await start(client, queue, ws, "read every file")
        result = await handle.result()
    return result, recorder, sink


def usable(config: AgentConfig) -> int:
    from durable_agent.activities.compaction import context_policy

    policy = context_policy(config, config.default_model)
    assert policy is not None
    return policy.usable


async def test_elided_reads_keep_every_request_under_the_window(client: Client, tmp_path: Path) -> None:
    ws = files(tmp_path, 8)
    config = config_for(tmp_path, reads(8), 40_000, keep_recent=2)
    result, recorder, sink = await run_reads(client, tmp_path, config, ws)
    assert result.status == "completed", result.error
    limit = usable(config)
    for seen in recorder.calls:
        assert request_tokens(seen.system_prompt, seen.messages, seen.tools) <= limit
        well_formed(list(seen.messages))
    last = sink.exports[-1].open()
    outputs = [
        b.content for m in last.logical_resume.messages for b in m.content if isinstance(b, ToolResultBlock)
    ]
    assert len(outputs) == 8 and all(len(o) > 15_000 and "elided" not in o for o in outputs)
    events = last.source_run().events
    done = compactions(events)
    assert done and all(e.tier == "elide" for e in done)
    assert any(isinstance(r.event, ModelUsageEvent) for r in events)
    for export in sink.exports:
        SessionCheckpointExportV1.model_validate_json(export.model_dump_json()).open()
    assert [e.descriptor.turn for e in sink.exports] == list(range(1, 9))


async def test_a_summary_when_eliding_is_not_enough(client: Client, tmp_path: Path) -> None:
    ws = files(tmp_path, 8)
    config = config_for(tmp_path, reads(8), 40_000, summarizer=True, keep_recent=4)
    result, recorder, sink = await run_reads(client, tmp_path, config, ws, {"reads": 8})
    assert result.status == "completed", result.error
    events = sink.exports[-1].open().source_run().events
    summarized = [e for e in compactions(events) if e.tier == "summarize"]
    assert summarized and summarized[0].view.summary == "SUMMARY: the files held x's."
    limit = usable(config)
    later = [c for c in recorder.calls if SUMMARY_HEADER in canonical_bytes(c.messages[0]).decode()]
    assert later
    for seen in recorder.calls:
        assert request_tokens(seen.system_prompt, seen.messages, seen.tools) <= limit
        well_formed(list(seen.messages))
    first = later[0].messages[0]
    assert isinstance(first.content[0], TextBlock) and first.content[0].text == "read every file"


async def test_a_resumed_run_sends_the_same_next_request(client: Client, tmp_path: Path) -> None:
    ws = files(tmp_path, 8)
    config = config_for(tmp_path, reads(8), 40_000, keep_recent=2)
    result, recorder, sink = await run_reads(client, tmp_path, config, ws)
    assert result.status == "completed"
    # the first export whose snapshot holds a compaction: right after it
    export = next(e for e in sink.exports if compactions(e.open().source_run().events))
    asked = sum(1 for m in export.open().logical_resume.messages if m.role == "assistant")
    original_next = recorder.calls[asked]
    files_sink = FilesystemExportSink(tmp_path / "copy")
    await files_sink.deliver(export)
    sources: list[SessionCheckpointExportV1 | Path] = [export, files_sink.path_for(export)]
    for source in sources:
        acts = AgentActivities(config, sinks={"local": RecordingSink()})
        again = Recorder(acts.providers["scripted"])
        acts.providers["scripted"] = again
        async with running_worker(client, acts) as queue:
            handle = await resume_run(client, source, queue=queue, workspace=str(ws))
            resumed = await handle.result()
        assert resumed.status == "completed", resumed.error
        assert request_key(again.calls[0]) == request_key(original_next)


async def test_an_overflow_is_recovered_by_compacting_harder(client: Client, tmp_path: Path) -> None:
    ws = files(tmp_path, 5)
    config = config_for(tmp_path, reads(5), 100_000, summarizer=True, keep_recent=1)
    result, recorder, sink = await run_reads(client, tmp_path, config, ws, {"overflow_at": 4, "reads": 5})
    assert result.status == "completed", result.error
    done = compactions(sink.exports[-1].open().source_run().events)
    assert [e.reason for e in done][:1] == ["overflow"]
    assert request_tokens("", recorder.calls[4].messages, ()) < request_tokens(
        "", recorder.calls[3].messages, ()
    )


async def test_a_run_that_cannot_shrink_fails_saying_why(client: Client, tmp_path: Path) -> None:
    ws = files(tmp_path, 1)
    config = config_for(tmp_path, reads(1), 6_000)
    sink = RecordingSink()
    acts = AgentActivities(config, sinks={"local": sink})
    async with running_worker(client, acts) as queue:
        handle = await start(client, queue, ws, "x" * 30_000)
        result = await handle.result()
    assert result.status == "failed"
    assert result.error is not None and "context window" in result.error and "6000 tokens" in result.error
