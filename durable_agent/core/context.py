"""Context management, pure: how big the next model request is, what of the conversation
the model sees (a ``ContextView``), and what to take out of view when it grows too big.

The full transcript always stays in the run's log and in every export; a view only
changes what a model request holds. ``model_messages`` turns the transcript and the
newest view into the request's messages, for the model step and the summary step alike.

**The estimate** (deliberately on the safe side; real tokenizers give 3.5 to 4.5 bytes
of English or code per token):

- a text, a tool call's name and canonical JSON arguments, a tool result's content,
  an id, a model's thinking (its text, or a redacted block's data): 1 token per 3 UTF-8
  bytes, rounded up; an image: ``IMAGE_TOKENS`` (1,600);
- plus ``BLOCK_OVERHEAD`` (8) per content block and ``MESSAGE_OVERHEAD`` (8) per message;
- plus the request's fixed part: ``REQUEST_OVERHEAD`` (16), the system prompt, and each tool
  definition's canonical JSON (plus ``BLOCK_OVERHEAD`` each).

**The size of the next request**: the estimate of the whole view; and when the provider
reported the prompt tokens of the last request and the view has not changed since,
at least that report plus the estimate of what is new since (``size``). The larger wins.

**Compaction** (``plan_compaction``), before a request whose size passes
``compact_at`` x (window - reserve), down to a target (``compact_to`` of the usable window,
40 % by default; or less after the provider said the request overflowed). Large steps keep
the provider's prompt cache: every compaction changes the request from the first result it
elides on, so the fewer compactions, the more of each request is read from the cache
(``bench/prompt_cache.py``: 0.8 -> 0.6 read 74-77 % of prompt tokens from the cache over 200
boundaries in a 128k window, 0.9 -> 0.4 reads 85-87 %):

1. *elide*: the oldest tool results leave the view (never the newest ``keep_recent``,
   never those of the step the model has not answered yet); the model sees a stub that
   says what it was and how to get it back;
2. *summarize*, when that is not enough: older turns are replaced by a summary a model
   writes (``agent.compact``); the prompt, the user's own later messages and the newest
   turns stay verbatim, and the cut falls right before an assistant message, so roles
   still alternate and every tool result follows its call.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Final, Literal

from pydantic import Field

from durable_agent.core.canonical import canonical_bytes
from durable_agent.core.events import ContextCompactedEvent, EventRecord, ModelUsageEvent
from durable_agent.core.models import (
    ContentBlock,
    ContextView,
    Frozen,
    Message,
    RedactedThinkingBlock,
    TextBlock,
    ThinkingBlock,
    ToolDefinition,
    ToolResultBlock,
    ToolUseBlock,
)

BYTES_PER_TOKEN: Final = 3
BLOCK_OVERHEAD: Final = 8
MESSAGE_OVERHEAD: Final = 8
REQUEST_OVERHEAD: Final = 16
# An image, whatever its size: providers scale images down to about 1.15 megapixels, which
# Anthropic bills at about 1,600 tokens (width x height / 750) and OpenAI at fewer.
IMAGE_TOKENS: Final = 1_600

# Known context windows by model family, matched by the longest prefix of the model's name
# (the part after the last "/", lower case). Lower than the truth is safe: compaction starts early.
KNOWN_WINDOWS: Final[dict[str, int]] = {
    "gpt-3.5-turbo": 16_385,
    "gpt-4": 8_192,
    "gpt-4-turbo": 128_000,
    "gpt-4o": 128_000,
    "gpt-4o-mini": 128_000,
    "gpt-4.1": 1_047_576,
    "gpt-4.1-mini": 128_000,
    "gpt-4.1-nano": 128_000,
    "gpt-5": 400_000,
    "o1": 200_000,
    "o3": 200_000,
    "o4": 200_000,
    "claude-": 200_000,
    "qwen2.5": 32_768,
    "qwen3": 32_768,
    "llama3": 8_192,
    "llama3.1": 131_072,
    "llama3.2": 131_072,
    "llama3.3": 131_072,
    "llama-3.1": 131_072,
    "llama-3.2": 131_072,
    "llama-3.3": 131_072,
    "deepseek": 65_536,
    "mistral": 32_768,
}
# An HTTP model not in the table is taken to hold this much.
FALLBACK_WINDOW: Final = 32_000
# What is kept for the answer when the model's ``max_tokens`` is not set.
DEFAULT_RESERVE: Final = 4_096
# Compaction brings a request down to this fraction of the usable window in runs whose plan
# has no ``compact_to`` (those recorded before it; a change here would change their replay) ...
TARGET_FRACTION: Final = 0.6
# ... and, after the provider said a request overflowed, to these (one per retry).
OVERFLOW_TARGETS: Final = (0.4, 0.25, 0.12)
# A summary is at most this many tokens (and at most an eighth of the usable window).
SUMMARY_MAX_TOKENS: Final = 2_000
# A tool result this small (tokens) is not worth eliding: its stub would be about as big.
ELIDE_MIN_TOKENS: Final = 48

SUMMARY_HEADER: Final = (
    "[Context summary: the earlier part of this conversation was summarized to fit the model's "
    "context window; the full transcript is kept in the run's log and exports.]"
)
LATER_USER_HEADER: Final = "[A later message from the user, kept verbatim:]"


def known_window(model: str) -> int | None:
    """The context window of ``model`` by the table, or ``None`` if its family is unknown."""
    name = model.rsplit("/", 1)[-1].lower()
    best = ""
    for prefix in KNOWN_WINDOWS:
        if name.startswith(prefix) and len(prefix) > len(best):
            best = prefix
    return KNOWN_WINDOWS[best] if best else None


class ContextPolicy(Frozen):
    """A run's context management, resolved from the worker's config (on the ``RunPlan``)."""

    window: int = Field(ge=1)  # the model's context window, tokens
    reserve: int = Field(DEFAULT_RESERVE, ge=0)  # kept for the answer (the model's max_tokens)
    compact_at: float = Field(0.8, gt=0, le=1)  # of the usable window
    # a compaction's target, of the usable window (None: TARGET_FRACTION, runs from before it)
    compact_to: float | None = Field(None, gt=0, lt=1)
    keep_recent: int = Field(4, ge=0)  # newest tool results never elided
    compaction_model: str | None = None  # "provider/model" that writes summaries; None: the run's

    @property
    def usable(self) -> int:
        return max(1, self.window - self.reserve)

    @property
    def threshold(self) -> int:
        return int(self.compact_at * self.usable)

    def target(self, overflow: int = 0) -> int:
        """How small a compaction makes the request (``overflow``: retries after an overflow)."""
        if overflow > 0:
            return int(OVERFLOW_TARGETS[min(overflow, len(OVERFLOW_TARGETS)) - 1] * self.usable)
        fraction = TARGET_FRACTION if self.compact_to is None else self.compact_to
        return int(min(fraction, self.compact_at * 0.75) * self.usable)

    def summary_tokens(self) -> int:
        return max(64, min(SUMMARY_MAX_TOKENS, self.usable // 8))


# --- the estimate --------------------------------------------------------------------


def text_tokens(text: str) -> int:
    return math.ceil(len(text.encode("utf-8")) / BYTES_PER_TOKEN)


def block_tokens(block: ContentBlock) -> int:
    if isinstance(block, TextBlock):
        return BLOCK_OVERHEAD + text_tokens(block.text)
    if isinstance(block, ToolUseBlock):
        args = math.ceil(len(canonical_bytes(block.input)) / BYTES_PER_TOKEN)
        return BLOCK_OVERHEAD + text_tokens(block.id) + text_tokens(block.name) + args
    if isinstance(block, ThinkingBlock):
        return BLOCK_OVERHEAD + text_tokens(block.thinking)
    if isinstance(block, RedactedThinkingBlock):
        return BLOCK_OVERHEAD + text_tokens(block.data)
    images = len(block.images) * (BLOCK_OVERHEAD + IMAGE_TOKENS)
    return BLOCK_OVERHEAD + text_tokens(block.tool_use_id) + text_tokens(block.content) + images


def message_tokens(message: Message) -> int:
    return MESSAGE_OVERHEAD + sum(block_tokens(b) for b in message.content)


def fixed_tokens(system_prompt: str, tools: Iterable[ToolDefinition]) -> int:
    """The part of every request that does not change: the system prompt and the tools."""
    defs = sum(BLOCK_OVERHEAD + math.ceil(len(canonical_bytes(t)) / BYTES_PER_TOKEN) for t in tools)
    return REQUEST_OVERHEAD + text_tokens(system_prompt) + defs


def request_tokens(system_prompt: str, messages: Sequence[Message], tools: Iterable[ToolDefinition]) -> int:
    """The estimate of one whole request."""
    return fixed_tokens(system_prompt, tools) + sum(message_tokens(m) for m in messages)


# --- the view ------------------------------------------------------------------------


def arguments_gist(arguments: dict[str, Any], limit: int = 160) -> str:
    """A call's arguments in short: canonical JSON, long strings cut."""

    def cut(value: Any) -> Any:
        if isinstance(value, str) and len(value) > 60:
            return value[:60] + "…"
        return value

    text = canonical_bytes({k: cut(v) for k, v in arguments.items()}).decode()
    return text if len(text) <= limit else text[:limit] + "…"


def how_to_get_back(name: str) -> str:
    lowered = name.lower()
    if lowered == "read":
        return "read the file again if you need it"
    if lowered in ("grep", "glob", "search", "find"):
        return "run the search again if you need it"
    if lowered == "ls":
        return "list the folder again if you need it"
    if lowered == "bash":
        return "run the command again only if it is safe to repeat (it changes nothing)"
    if lowered in ("write", "edit"):
        return "the change was made; read the file to see it"
    return "call the tool again if you need it and it is safe to repeat"


def stub_text(name: str, gist: str, chars: int, is_error: bool) -> str:
    """What the model sees instead of an elided tool result."""
    what = "an error" if is_error else "output"
    return (
        f"[{what} elided to fit the context window: {name} {gist} returned {chars} characters; "
        f"{how_to_get_back(name)}]"
    )


def _stub_for(call: ToolUseBlock | None, block: ToolResultBlock) -> str:
    name = call.name if call is not None else "a tool"
    gist = arguments_gist(call.input) if call is not None else ""
    return stub_text(name, gist, len(block.content), block.is_error)


def is_human(message: Message) -> bool:
    """A user message of a person's own words (the prompt, a follow-up, a steer)."""
    return message.role == "user" and any(isinstance(b, TextBlock) for b in message.content)


def summary_message(prompt: Message, summary: str, humans: Sequence[Message]) -> Message:
    """The first message of a summarized view: the prompt, the summary, the user's later words."""
    blocks: list[ContentBlock] = list(prompt.content)
    blocks.append(TextBlock(text=f"{SUMMARY_HEADER}\n{summary}"))
    for human in humans:
        blocks.append(TextBlock(text=f"{LATER_USER_HEADER}\n{human.text()}"))
    return Message(role="user", content=tuple(blocks))


def model_messages(messages: Sequence[Message], view: ContextView | None) -> list[Message]:
    """The messages of a model request: the transcript as ``view`` shows it."""
    if view is None or (not view.elided and view.summary is None):
        return list(messages)
    calls = {c.id: c for m in messages if m.role == "assistant" for c in m.tool_uses()}
    elided = set(view.elided)

    def shown(message: Message) -> Message:
        if not elided or message.role != "user":
            return message
        content = tuple(
            b.model_copy(update={"content": _stub_for(calls.get(b.tool_use_id), b), "images": ()})
            if isinstance(b, ToolResultBlock) and b.tool_use_id in elided
            else b
            for b in message.content
        )
        return message if content == message.content else Message(role="user", content=content)

    if view.summary is None or not messages:
        return [shown(m) for m in messages]
    cut = 1 + view.summarized
    humans = [m for m in messages[1:cut] if is_human(m)]
    first = summary_message(messages[0], view.summary, humans)
    return [first, *(shown(m) for m in messages[cut:])]


def view_of(events: Iterable[EventRecord]) -> ContextView | None:
    """The newest view among ``events`` (the last ``context_compacted``), or ``None``."""
    found: ContextView | None = None
    for record in events:
        if isinstance(record.event, ContextCompactedEvent):
            found = record.event.view
    return found


def last_view(events: Sequence[EventRecord]) -> ContextView | None:
    """As ``view_of``, reading from the end."""
    for record in reversed(events):
        if isinstance(record.event, ContextCompactedEvent):
            return record.event.view
    return None


def last_usage(events: Sequence[EventRecord]) -> ModelUsageEvent | None:
    for record in reversed(events):
        if isinstance(record.event, ModelUsageEvent):
            return record.event
    return None


# --- the ledger ----------------------------------------------------------------------


class MessageSize(Frozen):
    role: Literal["user", "assistant"]
    tokens: int
    human: bool = False


class ResultSize(Frozen):
    """One tool result: where it is, its estimate, and its stub's."""

    id: str
    message: int
    tokens: int
    stub: int


class CallGist(Frozen):
    """A call of the last assistant message: what its result's stub says."""

    id: str
    name: str
    gist: str


class ContextLedger(Frozen):
    """The estimate of every message and tool result of the run's transcript, the view, and
    the last request's report. Kept by the run's ``RunJournal``, carried through continue-as-new, and
    built from an export's messages for a run resumed from it."""

    messages: tuple[MessageSize, ...] = ()
    results: tuple[ResultSize, ...] = ()
    calls: tuple[CallGist, ...] = ()
    view: ContextView = ContextView()
    steps: int = 0  # model requests answered
    compactions: int = 0  # this run's
    reported: int | None = None  # the provider's prompt tokens for the last request
    reported_estimate: int = 0  # our estimate of that request
    reported_view: int = 0  # the view version it was sent with

    @classmethod
    def seeded(cls, messages: Sequence[Message], events: Sequence[EventRecord] = ()) -> ContextLedger:
        """The ledger of a run that goes on from ``messages``, with the newest view and usage
        report among ``events`` (an export's snapshot of the source run)."""
        view = last_view(events) or ContextView()
        ledger = cls(view=view)
        usage = last_usage(events)
        if usage is not None:
            ledger = ledger.model_copy(
                update={
                    "reported": usage.usage.prompt_tokens,
                    "reported_estimate": usage.estimated_tokens,
                    "reported_view": usage.view_version,
                }
            )
        return ledger.applied((), messages)

    def applied(
        self, extend_last: Sequence[ToolResultBlock | TextBlock], messages: Sequence[Message]
    ) -> ContextLedger:
        """This ledger with a log delta added: tool results (and a person's text) for the last
        message, then new messages."""
        sizes = list(self.messages)
        results = list(self.results)
        calls = {c.id: c for c in self.calls}
        last_calls = self.calls

        def result(block: ToolResultBlock, index: int) -> None:
            gist = calls.get(block.tool_use_id)
            text = stub_text(
                gist.name if gist else "a tool", gist.gist if gist else "", len(block.content), block.is_error
            )
            stub = block.model_copy(update={"content": text})
            results.append(
                ResultSize(
                    id=block.tool_use_id, message=index, tokens=block_tokens(block), stub=block_tokens(stub)
                )
            )

        if extend_last and sizes:
            index = len(sizes) - 1
            for block in extend_last:
                if isinstance(block, ToolResultBlock):
                    result(block, index)
            added = sum(block_tokens(b) for b in extend_last)
            human = sizes[index].human or any(isinstance(b, TextBlock) for b in extend_last)
            sizes[index] = sizes[index].model_copy(
                update={"tokens": sizes[index].tokens + added, "human": human}
            )
        for message in messages:
            index = len(sizes)
            sizes.append(
                MessageSize(role=message.role, tokens=message_tokens(message), human=is_human(message))
            )
            if message.role == "assistant":
                last_calls = tuple(
                    CallGist(id=c.id, name=c.name, gist=arguments_gist(c.input)) for c in message.tool_uses()
                )
                calls = {c.id: c for c in last_calls}
            for part in message.content:
                if isinstance(part, ToolResultBlock):
                    result(part, index)
        return self.model_copy(
            update={"messages": tuple(sizes), "results": tuple(results), "calls": last_calls}
        )

    def answered(self, prompt_tokens: int, estimate: int) -> ContextLedger:
        """A request estimated at ``estimate`` was answered; the provider counted ``prompt_tokens``."""
        return self.model_copy(
            update={
                "steps": self.steps + 1,
                "reported": prompt_tokens if prompt_tokens > 0 else None,
                "reported_estimate": estimate,
                "reported_view": self.view.version,
            }
        )

    def compacted(self, view: ContextView) -> ContextLedger:
        return self.model_copy(update={"view": view, "compactions": self.compactions + 1})

    def estimate(self, fixed: int, view: ContextView | None = None) -> int:
        """The estimate of the request with ``view`` (default: the ledger's)."""
        view = view or self.view
        elided = set(view.elided)
        saved = [0] * len(self.messages)
        for r in self.results:
            if r.id in elided and r.message < len(saved):
                saved[r.message] += r.tokens - r.stub
        cut = 1 + view.summarized if view.summary is not None else 1
        total = fixed
        if self.messages:
            total += self.messages[0].tokens
        for index in range(1, len(self.messages)):
            size = self.messages[index]
            if index < cut:
                if size.human:  # its text moves into the first message
                    total += size.tokens + text_tokens(LATER_USER_HEADER) + 1
                continue
            total += size.tokens - saved[index]
        if view.summary is not None:
            total += BLOCK_OVERHEAD + text_tokens(f"{SUMMARY_HEADER}\n{view.summary}")
        return total

    def size(self, fixed: int) -> int:
        """The size of the next request by the documented rule (see the module's docstring)."""
        estimate = self.estimate(fixed)
        if self.reported is not None and self.reported_view == self.view.version:
            return max(estimate, self.reported + estimate - self.reported_estimate)
        return estimate


# --- deciding what to compact ------------------------------------------------------------


@dataclass(frozen=True)
class Compaction:
    """What a compaction takes out of view; ``summarize_upto``: summarize ``messages[1:upto]``."""

    elide: tuple[str, ...]
    summarize_upto: int | None
    estimate_after: int  # with a summary of the policy's full summary size


def protected_results(ledger: ContextLedger, keep_recent: int) -> set[str]:
    """Tool results never elided: the newest ``keep_recent`` and those of the step the model
    has not answered yet (the results after the last assistant message)."""
    results = ledger.results
    keep = {r.id for r in results[len(results) - keep_recent :]} if keep_recent > 0 else set()
    last_assistant = max((i for i, m in enumerate(ledger.messages) if m.role == "assistant"), default=-1)
    keep.update(r.id for r in results if r.message > last_assistant)
    return keep


def plan_compaction(
    ledger: ContextLedger, policy: ContextPolicy, fixed: int, target: int, *, force_summary: bool = False
) -> Compaction | None:
    """How to bring the request to ``target`` tokens: elide first, then summarize if that is
    not enough (or ``force_summary``). ``None``: nothing can be taken out of view."""
    view = ledger.view
    cut = 1 + view.summarized if view.summary is not None else 1
    keep = protected_results(ledger, policy.keep_recent) | set(view.elided)
    estimate = ledger.estimate(fixed)
    elide: list[str] = []
    for r in ledger.results:
        if estimate <= target:
            break
        if r.id in keep or r.message < cut or r.tokens - r.stub < ELIDE_MIN_TOKENS:
            continue
        elide.append(r.id)
        estimate -= r.tokens - r.stub
    if estimate <= target and not force_summary:
        return Compaction(tuple(elide), None, estimate) if elide else None
    elided_view = view.model_copy(update={"elided": (*view.elided, *elide)})
    best: tuple[int, int] | None = None
    placeholder = "x" * (policy.summary_tokens() * BYTES_PER_TOKEN)
    # cuts fall right before an assistant message, after the current cut; the last assistant
    # message (the step whose results the model is about to read) always stays
    for upto in range(cut + 1, len(ledger.messages)):
        if ledger.messages[upto].role != "assistant":
            continue
        trial = elided_view.model_copy(update={"summary": placeholder, "summarized": upto - 1})
        after = ledger.estimate(fixed, trial)
        best = (upto, after)
        if after <= target:
            break
    if best is None or best[1] >= estimate:
        return Compaction(tuple(elide), None, estimate) if elide else None
    return Compaction(tuple(elide), best[0], best[1])


def next_view(
    ledger: ContextLedger, compaction: Compaction, summary: str | None
) -> tuple[ContextView, tuple[str, ...]]:
    """The view after ``compaction`` (with the summary written for it), and the tool results it
    took out of view."""
    view = ledger.view
    elided = [*view.elided, *compaction.elide]
    gone = list(compaction.elide)
    if compaction.summarize_upto is not None and summary is not None:
        upto = compaction.summarize_upto
        inside = {r.id for r in ledger.results if r.message < upto}
        gone += [r.id for r in ledger.results if r.id in inside and r.id not in set(elided)]
        elided = [i for i in elided if i not in inside]  # the summary stands for them now
        return (
            ContextView(version=view.version + 1, elided=tuple(elided), summary=summary, summarized=upto - 1),
            tuple(gone),
        )
    return view.model_copy(update={"version": view.version + 1, "elided": tuple(elided)}), tuple(gone)


def cannot_fit(ledger: ContextLedger, policy: ContextPolicy, fixed: int, model: str, estimate: int) -> str:
    """Why the run stops: the window, the estimate, and what is left in view."""
    view = ledger.view
    cut = 1 + view.summarized if view.summary is not None else 1
    kept = len(ledger.messages) - cut
    kept_tokens = sum(m.tokens for m in ledger.messages[cut:])
    prompt = ledger.messages[0].tokens if ledger.messages else 0
    return (
        f"the conversation no longer fits {model}'s context window: {policy.window} tokens, "
        f"{policy.reserve} of them kept for the answer, and the next request is estimated at "
        f"{estimate} tokens after compaction (system prompt and tools {fixed}, the prompt {prompt}, "
        f"a summary of {view.summarized} messages, the newest {kept} messages that stay verbatim "
        f"{kept_tokens}); nothing more can be elided or summarized"
    )
