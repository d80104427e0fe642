"""The scripted model: responses from a JSON file, for offline demos and tests.

Response *n* answers the conversation's *n*-th model step, so retries, replays
and other workers get the same answer.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from durable_agent.activities.providers.model_provider import (
    ProviderError,
    TextSink,
    assistant_step,
    read_credential,
    thinking_sink,
)
from durable_agent.config import ConfigError, ScriptedProviderConfig
from durable_agent.core import json_limits
from durable_agent.core.activity_api import ModelCallInput
from durable_agent.core.errors import validation_message
from durable_agent.core.models import (
    ModelResponse,
    TextBlock,
    ThinkingBlock,
    TokenUsage,
    ToolUseBlock,
)


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ScriptedToolCall(_Strict):
    id: str | None = None
    name: str
    input: dict[str, object] = Field(default_factory=dict)
    # The arguments as the text a model writes (JSON, or not): to play a model whose
    # output is malformed. Parsed at call time, as the HTTP providers parse theirs.
    arguments: str | None = None

    @model_validator(mode="after")
    def _input_or_arguments(self) -> ScriptedToolCall:
        if self.input and self.arguments is not None:
            raise ValueError("give input or arguments, not both")
        return self


class ScriptedResponse(_Strict):
    # The model's reasoning before its answer (kept, passed back, shown as thinking).
    thinking: str | None = None
    text: str | None = None
    tool_calls: list[ScriptedToolCall] = Field(default_factory=list)
    usage: TokenUsage = TokenUsage(prompt_tokens=1, completion_tokens=1, total_tokens=2)
    # Simulated model latency; the call heartbeats meanwhile, so it can be cancelled.
    delay_ms: int = Field(0, ge=0)


class Script(_Strict):
    responses: list[ScriptedResponse] = Field(min_length=1)


def load_script(path: Path) -> Script:
    """The script in ``path``; ``ConfigError`` (one line) if it is missing, not JSON or invalid."""
    where = f"scripted model file {str(path)!r}"
    try:
        return Script.model_validate(json_limits.loads(path.read_bytes()))
    except FileNotFoundError:
        raise ConfigError(f"{where} does not exist") from None
    except ValidationError as exc:
        raise ConfigError(f"{where} is invalid: {validation_message(exc)}") from None
    except ValueError as exc:  # not UTF-8, not JSON, or beyond json_limits
        raise ConfigError(f"{where} is not JSON we accept: {exc}") from None


class ScriptedProvider:
    """Answers from a script: response *n* for the conversation's *n*-th model step.

    The step is counted from the conversation itself (its assistant messages),
    so a retried call, a replayed run or another worker gets the same answer.
    """

    def __init__(self, name: str, script: Script, api_key: str | None = None) -> None:
        self.name = name
        self.script = script
        self._api_key = api_key

    @classmethod
    def from_config(cls, name: str, config: ScriptedProviderConfig) -> ScriptedProvider:
        key = read_credential(config.api_key_env, name) if config.api_key_env else None
        return cls(name, load_script(config.script), key)

    async def complete(self, call: ModelCallInput, model: str, on_text: TextSink) -> ModelResponse:
        # after a summary the request holds fewer turns than the run has made: the step says
        step = call.step if call.step is not None else sum(1 for m in call.messages if m.role == "assistant")
        if call.purpose == "summary" and not self._answers_summaries(step):
            return self._summary(call)
        if step >= len(self.script.responses):
            raise ProviderError(
                f"scripted model {self.name}/{model} has {len(self.script.responses)} "
                f"responses and was asked for response {step + 1}",
                retryable=False,
            )
        scripted = self.script.responses[step]
        if scripted.thinking:
            # streamed whole, before the text, as a reasoning model's comes: the delay is the text's
            thinking_sink(on_text)(scripted.thinking)
        await self._stream(scripted.text or "", scripted.delay_ms / 1000, on_text)
        blocks: list[ThinkingBlock | TextBlock | ToolUseBlock] = []
        if scripted.thinking:
            blocks.append(ThinkingBlock(thinking=scripted.thinking))
        if scripted.text:
            blocks.append(TextBlock(text=scripted.text))
        for i, tc in enumerate(scripted.tool_calls):
            arguments = self._arguments(tc, model)
            blocks.append(ToolUseBlock(id=tc.id or f"call-{step + 1}-{i + 1}", name=tc.name, input=arguments))
        if not blocks:
            blocks.append(TextBlock(text=""))
        return assistant_step(blocks, scripted.usage, "tool_use" if scripted.tool_calls else "end_turn")

    def _answers_summaries(self, step: int) -> bool:
        """Whether the script has a text-only answer for this summary request (a script
        written for a ``compaction_model``); a script of tool steps does not."""
        responses = self.script.responses
        return step < len(responses) and bool(responses[step].text) and not responses[step].tool_calls

    @staticmethod
    def _summary(call: ModelCallInput) -> ModelResponse:
        """A script of tool steps answers a summary request with a fixed summary that says so."""
        text = f"Scripted summary of a request of {len(call.messages)} message(s)."
        return assistant_step([TextBlock(text=text)], TokenUsage(), None)

    def _arguments(self, call: ScriptedToolCall, model: str) -> dict[str, Any]:
        """The call's arguments within ``json_limits``; a script answers the same way every
        time, so what is refused is not retried."""
        where = f"scripted model {self.name}/{model}: the model's arguments for tool {call.name!r}"
        limit = json_limits.TOOL_ARGUMENTS_MAX_DEPTH
        text = call.arguments
        try:
            if text is None:
                json_limits.check_value(call.input, max_depth=limit)
                arguments: Any = dict(call.input)
            else:
                arguments = json_limits.loads(text, max_depth=limit)
        except json_limits.JsonLimitError as exc:
            raise ProviderError(f"{where} are refused (not retried): {exc}", retryable=False) from None
        except ValueError:
            arguments = None
        if not isinstance(arguments, dict):
            text = text or ""
            shown = text if len(text) <= 200 else text[:200] + "…"
            raise ProviderError(f"{where} are not a JSON object: {shown}", retryable=False)
        return arguments

    @staticmethod
    async def _stream(text: str, seconds: float, on_text: TextSink) -> None:
        """Hand the text out word by word over ``seconds``, as a streaming model would."""
        words = text.split(" ")
        if not seconds or not text:
            if text:
                on_text(text)
            await asyncio.sleep(seconds)
            return
        pause = seconds / len(words)
        for i, word in enumerate(words):
            on_text(word if i == 0 else " " + word)
            await asyncio.sleep(pause)
