"""The bench's model: reads ``data.txt`` N times, then answers, and counts what it is sent.

``ReaderModel`` is a ``ModelProvider`` for both designs. Model ``nN`` reads the
file N times: which read comes next is taken from the request itself (the id
of its newest tool result), so it answers right whatever of the conversation a
compaction took out of view; a request without tools asks for a summary and
gets one. Every request is counted as the test wire servers count it
(``tests/wire_servers.py``: the request as the ``openai`` provider would send
it, its text's UTF-8 bytes / 4 plus the ``max_tokens`` it asks room for), and
one over ``window`` is refused with OpenAI's own ``context_length_exceeded``
answer, classified by the HTTP providers' ``http_errors`` (a
``ProviderError`` with ``context_overflow``): what a real server would do to
the naive design. Usage reports the counted prompt tokens.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import httpx

from durable_agent.activities.providers.http_errors import Failures
from durable_agent.activities.providers.model_provider import TextSink
from durable_agent.activities.providers.openai import request_body
from durable_agent.config import OpenAIProviderConfig
from durable_agent.core import models
from durable_agent.core.activity_api import ModelCallInput
from durable_agent.core.models import Message, ModelResponse, TextBlock, ToolResultBlock, ToolUseBlock
from tests.wire_servers import OpenAIWire

ANSWER_TOKENS = 20  # what each answer is said to cost
CALL_PREFIX = "b-"


@dataclass
class Tally:
    """What one run sent the model."""

    requests: list[int] = field(default_factory=list)  # tokens of each answered request (prompt)
    asked: list[int] = field(default_factory=list)  # the same with the max_tokens asked for
    summaries: int = 0  # of the requests, those for a summary
    refused: list[int] = field(default_factory=list)  # tokens of each request over the window

    @property
    def sent(self) -> int:
        return sum(self.requests)

    @property
    def largest(self) -> int:
        return max(self.asked, default=0)


class ReaderModel:
    """A ``ModelProvider``: model ``nN`` reads ``data.txt`` N times, then answers."""

    def __init__(self, window: int | None, max_tokens: int) -> None:
        self.window = window
        self.config = OpenAIProviderConfig(
            kind="openai", base_url="http://bench.invalid", max_tokens=max_tokens
        )
        self.wire = OpenAIWire()
        self.tally = Tally()

    def take(self) -> Tally:
        """The tally since the last ``take``, forgotten here (runs go one at a time)."""
        tally, self.tally = self.tally, Tally()
        return tally

    async def complete(self, call: ModelCallInput, model: str, on_text: TextSink) -> ModelResponse:
        body = request_body(call, model, self.config.settings_for(model))
        prompt, room = self.wire.count_tokens(body)
        if self.window is not None and prompt + room > self.window:
            self.tally.refused.append(prompt + room)
            reply = self.wire.overflow(prompt, room, self.window)
            assert reply.body is not None
            raise Failures("reader", model, None).status(
                reply.status, httpx.Headers(reply.headers), reply.body
            )
        self.tally.requests.append(prompt)
        self.tally.asked.append(prompt + room)
        usage = models.TokenUsage(
            prompt_tokens=prompt, completion_tokens=ANSWER_TOKENS, total_tokens=prompt + ANSWER_TOKENS
        )
        if not call.tools:
            self.tally.summaries += 1
            text = f"Summary: data.txt was read again and again ({len(self.tally.requests)} requests so far)."
            on_text(text)
            return ModelResponse(
                message=_assistant(TextBlock(text=text)), usage=usage, stop_reason="end_turn"
            )
        reads = int(model.removeprefix("n"))
        done = _reads_done(call.messages)
        if done < reads:
            use = ToolUseBlock(
                id=f"{CALL_PREFIX}{done + 1:05d}", name="read", input={"file_path": "data.txt"}
            )
            return ModelResponse(message=_assistant(use), usage=usage, stop_reason="tool_use")
        text = f"read data.txt {reads} times"
        on_text(text)
        return ModelResponse(message=_assistant(TextBlock(text=text)), usage=usage, stop_reason="end_turn")


def _assistant(block: TextBlock | ToolUseBlock) -> Message:
    return Message(role="assistant", content=(block,))


def _reads_done(messages: tuple[Message, ...]) -> int:
    """The number of the newest read whose result the request holds (0: none yet)."""
    for message in reversed(messages):
        for block in reversed(message.content):
            if isinstance(block, ToolResultBlock) and block.tool_use_id.startswith(CALL_PREFIX):
                return int(block.tool_use_id.removeprefix(CALL_PREFIX))
    return 0
