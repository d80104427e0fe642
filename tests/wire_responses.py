"""A local server that speaks OpenAI's Responses API, strict about reasoning as OpenAI is.

``ResponsesModel`` is a ``WireServer(respond=...)`` callback: a model scripted by
``Step``s, whose next answer is read from the request (the number of model turns
its input holds), so a retried request gets the same answer. Like OpenAI under
``store: false`` it keeps nothing between requests but what it signs:

- each answer of a reasoning model starts with a ``reasoning`` item whose
  ``encrypted_content`` (sent when ``include`` asks for it) is the item's id,
  summary and hidden thought, signed with an HMAC under the server's secret;
- a request is refused (400, OpenAI's error body and wording) when it passes a
  ``function_call`` the server produced without the reasoning item that came
  before it in the same answer, passes a reasoning item without (or with
  altered, forged or moved) encrypted content, a reasoning item with no item
  after it, a ``function_call_output`` without its call, items or tools not in
  the protocol's shape, or asks a model without reasoning for encrypted
  reasoning or an effort;
- usage counts each accepted prompt with ``tests.wire_cache.OpenAICache`` per
  ``prompt_cache_key`` and reports its cache reads as
  ``input_tokens_details.cached_tokens``.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import secrets
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from tests.wire_cache import CacheUsage, OpenAICache, openai_responses_pieces
from tests.wire_servers import Call, Received, Reply, split, sse

PATH = "/responses"
# The items a model's answer consists of; any other input item is the caller's.
OUTPUT_TYPES = frozenset({"reasoning", "function_call"})
_USER_PARTS = frozenset({"input_text", "input_image", "input_file"})
_ASSISTANT_PARTS = frozenset({"output_text", "refusal"})


def provider_entry(base_url: str, api_key_env: str | None, **extra: Any) -> dict[str, Any]:
    """A config entry for this server: the ``openai`` kind on the Responses API."""
    entry: dict[str, Any] = {"kind": "openai", "api": "responses", "base_url": base_url, **extra}
    if api_key_env:
        entry["api_key_env"] = api_key_env
    return entry


def error_reply(status: int, message: str, *, param: str | None = "input", code: str | None = None) -> Reply:
    """OpenAI's error body."""
    error = {"message": message, "type": "invalid_request_error", "param": param, "code": code}
    return Reply.json(status, {"error": error})


@dataclass
class Step:
    """One scripted answer: reasoning summary parts, text pieces, function calls, how it ends.

    ``finish``: ``completed``, or the ``incomplete_details.reason`` of an incomplete answer.
    """

    text: Sequence[str] = ()
    calls: Sequence[Call] = ()
    summary: Sequence[str] = ()
    finish: Literal["completed", "max_output_tokens", "content_filter"] = "completed"
    output_tokens: int = 20
    reasoning_tokens: int = 12


@dataclass
class Served:
    """One request the model answered: its turn, and what its prompt cost."""

    turn: int
    cache: CacheUsage


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode("ascii")


def is_output(item: dict[str, Any]) -> bool:
    """Whether an input item is one a model's answer holds (reasoning, call, assistant message)."""
    return item.get("type") in OUTPUT_TYPES or item.get("role") == "assistant"


def model_turns(items: list[dict[str, Any]]) -> int:
    """How many of the model's answers ``items`` hold: runs of output items."""
    turns, inside = 0, False
    for item in items:
        if is_output(item) and not inside:
            turns += 1
        inside = is_output(item)
    return turns


@dataclass
class ResponsesModel:
    """The ``respond`` callback of a ``WireServer``: a Responses API model, scripted.

    ``reasoning``: a reasoning model (it refuses ``include`` and ``reasoning.effort``
    otherwise). The step for a request is ``script[turns]``, ``turns`` being the
    model answers its input holds.
    """

    script: Sequence[Step]
    reasoning: bool = True
    rechunk: int | None = None
    secret: bytes = field(default_factory=lambda: secrets.token_bytes(32))
    cache: OpenAICache = field(default_factory=OpenAICache)
    served: list[Served] = field(default_factory=list)
    refused: list[str] = field(default_factory=list)  # the messages of the 400s sent
    # call_id -> (the function_call item's id, the id of the reasoning item before it)
    issued: dict[str, tuple[str, str | None]] = field(default_factory=dict)
    _nonce: str = field(default_factory=lambda: secrets.token_hex(6))

    # --- signing -----------------------------------------------------------------

    def seal(self, item_id: str, summary: str, thought: str) -> str:
        """The encrypted content of reasoning item ``item_id``: its contents, signed."""
        payload = json.dumps({"id": item_id, "summary": summary, "thought": thought}).encode()
        mac = hmac.new(self.secret, payload, hashlib.sha256).digest()
        return f"{_b64(payload)}.{_b64(mac)}"

    def verified(self, item: dict[str, Any]) -> bool:
        """Whether a reasoning item's encrypted content is one this server sealed for it, as it is."""
        sealed = item.get("encrypted_content")
        if not isinstance(sealed, str) or sealed.count(".") != 1:
            return False
        try:
            payload, mac = (base64.urlsafe_b64decode(p.encode("ascii")) for p in sealed.split("."))
            contents = json.loads(payload)
        except (ValueError, UnicodeError):
            return False
        if not hmac.compare_digest(mac, hmac.new(self.secret, payload, hashlib.sha256).digest()):
            return False
        summary = "\n\n".join(s.get("text", "") for s in item.get("summary") or [])
        return bool(contents.get("id") == item.get("id") and contents.get("summary") == summary)

    # --- answering ---------------------------------------------------------------

    def __call__(self, request: Received) -> Reply:
        body = request.body
        problem = self.problem(body)
        if problem is not None:
            self.refused.append(problem.body.decode() if problem.body else "")
            return problem
        turn = model_turns(body["input"])
        if turn >= len(self.script):
            return Reply.json(500, {"error": {"message": f"wire server: no step scripted for turn {turn}"}})
        usage = self.cache.account(openai_responses_pieces(body), body.get("prompt_cache_key"))
        self.served.append(Served(turn, usage))
        return Reply.sse(self.events(self.script[turn], turn, body, usage), rechunk=self.rechunk)

    def problem(self, body: Any) -> Reply | None:
        """The 400 OpenAI would answer this request with, or None when it is fine."""
        if body.get("store") is not False:
            return error_reply(400, "wire server: this server serves only store: false", param="store")
        include = body.get("include") or []
        if "reasoning.encrypted_content" in include and not self.reasoning:
            return error_reply(400, "Encrypted content is not supported with this model.", param="include")
        if (body.get("reasoning") or {}).get("effort") is not None and not self.reasoning:
            message = "Unsupported parameter: 'reasoning.effort' is not supported with this model."
            return error_reply(400, message, param="reasoning.effort", code="unsupported_parameter")
        for i, tool in enumerate(body.get("tools") or []):
            if tool.get("type") != "function" or not isinstance(tool.get("name"), str):
                message = f"Missing required parameter: 'tools[{i}].name'."
                return error_reply(400, message, param=f"tools[{i}].name", code="missing_required_parameter")
        items = body.get("input")
        if not isinstance(items, list):
            return error_reply(400, "wire server: input must be a list of items")
        return self.items_problem(items)

    def items_problem(self, items: list[dict[str, Any]]) -> Reply | None:
        calls: set[str] = set()
        reasoning_in_turn: set[str] = set()
        for i, item in enumerate(items):
            kind = item.get("type", "message")
            if not is_output(item):
                reasoning_in_turn.clear()
            if kind == "reasoning":
                problem = self._reasoning_problem(item, items[i + 1] if i + 1 < len(items) else None)
                if problem is not None:
                    return problem
                reasoning_in_turn.add(item["id"])
            elif kind == "function_call":
                calls.add(item.get("call_id", ""))
                fc_id, rs_id = self.issued.get(item.get("call_id", ""), ("", None))
                if rs_id is not None and rs_id not in reasoning_in_turn:
                    message = (
                        f"Item '{fc_id}' of type 'function_call' was provided without its required "
                        f"'reasoning' item: '{rs_id}'."
                    )
                    return error_reply(400, message)
            elif kind == "function_call_output":
                if item.get("call_id") not in calls:
                    message = (
                        f"No tool call found for function call output with call_id {item.get('call_id')}."
                    )
                    return error_reply(400, message)
            elif kind == "message":
                allowed = _ASSISTANT_PARTS if item.get("role") == "assistant" else _USER_PARTS
                for part in item.get("content") or []:
                    if part.get("type") not in allowed:
                        message = (
                            f"Invalid value: '{part.get('type')}'. Supported values are: "
                            + ", ".join(f"'{p}'" for p in sorted(allowed))
                            + "."
                        )
                        return error_reply(400, message, param=f"input[{i}].content", code="invalid_value")
            else:
                return error_reply(
                    400, f"Invalid value: '{kind}'.", param=f"input[{i}]", code="invalid_value"
                )
        return None

    def _reasoning_problem(self, item: dict[str, Any], following: dict[str, Any] | None) -> Reply | None:
        rs_id = item.get("id")
        if "encrypted_content" not in item:
            message = (
                f"Item with id '{rs_id}' not found. Items are not persisted when `store` is set to false. "
                "Try again with `store` set to true, or remove this item from your input."
            )
            return error_reply(404, message)
        if not self.verified(item):
            return error_reply(400, f"The encrypted content for item {rs_id} could not be verified.")
        if following is None or not is_output(following):
            message = f"Item '{rs_id}' of type 'reasoning' was provided without its required following item."
            return error_reply(400, message)
        return None

    def events(self, step: Step, turn: int, body: dict[str, Any], cache: CacheUsage) -> list[bytes]:
        """The answer's event stream, as OpenAI writes it."""
        stream = _Stream(f"resp_{self._nonce}{turn:02d}", str(body.get("model")))
        stream.emit("response.created", response=stream.response("in_progress"))
        stream.emit("response.in_progress", response=stream.response("in_progress"))
        rs_id: str | None = None
        if self.reasoning:
            rs_id = f"rs_{self._nonce}{turn:02d}"
            asked = (body.get("reasoning") or {}).get("summary") is not None
            summary = list(step.summary) if asked else []
            item: dict[str, Any] = {"id": rs_id, "type": "reasoning", "summary": []}
            stream.item_added(item)
            for n, part in enumerate(summary):
                where = {"item_id": rs_id, "output_index": stream.index, "summary_index": n}
                stream.emit("response.reasoning_summary_part.added", **where, part={"type": "summary_text"})
                for piece in split(part, 7):
                    stream.emit("response.reasoning_summary_text.delta", **where, delta=piece)
                stream.emit("response.reasoning_summary_text.done", **where, text=part)
            item["summary"] = [{"type": "summary_text", "text": part} for part in summary]
            if "reasoning.encrypted_content" in (body.get("include") or []):
                item["encrypted_content"] = self.seal(rs_id, "\n\n".join(summary), f"thought {turn}")
            stream.item_done(item)
        if step.text:
            msg_id = f"msg_{self._nonce}{turn:02d}"
            message: dict[str, Any] = {"id": msg_id, "type": "message", "status": "in_progress"}
            message |= {"role": "assistant", "content": []}
            stream.item_added(message)
            where = {"item_id": msg_id, "output_index": stream.index, "content_index": 0}
            for piece in step.text:
                stream.emit("response.output_text.delta", **where, delta=piece)
            text = {"type": "output_text", "text": "".join(step.text), "annotations": []}
            stream.emit("response.output_text.done", **where, text=text["text"])
            stream.item_done({**message, "status": "completed", "content": [text]})
        for n, call in enumerate(step.calls):
            fc_id = f"fc_{self._nonce}{turn:02d}{n}"
            self.issued[call.id] = (fc_id, rs_id)
            start = {"id": fc_id, "type": "function_call", "status": "in_progress", "call_id": call.id}
            start |= {"name": call.name, "arguments": ""}
            stream.item_added(start)
            pieces = call.pieces()
            for piece in pieces:
                where = {"item_id": fc_id, "output_index": stream.index}
                stream.emit("response.function_call_arguments.delta", **where, delta=piece)
            stream.emit("response.function_call_arguments.done", item_id=fc_id, arguments="".join(pieces))
            stream.item_done({**start, "status": "completed", "arguments": "".join(pieces)})
        usage = {
            "input_tokens": cache.total,
            "input_tokens_details": {"cached_tokens": cache.read},
            "output_tokens": step.output_tokens,
            "output_tokens_details": {"reasoning_tokens": step.reasoning_tokens if self.reasoning else 0},
            "total_tokens": cache.total + step.output_tokens,
        }
        if step.finish == "completed":
            stream.emit("response.completed", response=stream.response("completed", usage))
        else:
            final = stream.response("incomplete", usage, incomplete_details={"reason": step.finish})
            stream.emit("response.incomplete", response=final)
        return stream.events


class _Stream:
    """Writes one answer's events: numbered, each named in its ``event:`` line and its ``type``."""

    def __init__(self, response_id: str, model: str) -> None:
        self.response_id = response_id
        self.model = model
        self.events: list[bytes] = []
        self.output: list[dict[str, Any]] = []
        self.index = -1

    def emit(self, kind: str, **fields: Any) -> None:
        data = {"type": kind, "sequence_number": len(self.events), **fields}
        self.events.append(sse(data, kind))

    def item_added(self, item: dict[str, Any]) -> None:
        self.index += 1
        self.emit("response.output_item.added", output_index=self.index, item=item)

    def item_done(self, item: dict[str, Any]) -> None:
        self.output.append(item)
        self.emit("response.output_item.done", output_index=self.index, item=item)

    def response(self, status: str, usage: dict[str, Any] | None = None, **more: Any) -> dict[str, Any]:
        return {
            "id": self.response_id,
            "object": "response",
            "created_at": 1_700_000_000,
            "status": status,
            "model": self.model,
            "output": list(self.output) if status != "in_progress" else [],
            "usage": usage,
            "store": False,
            **more,
        }
