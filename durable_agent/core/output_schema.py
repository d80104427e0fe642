"""Typed results: a run's ``output_schema``, the ``final_result`` tool it offers, and the check of
what the model answers with (pure; the workflow's half is ``workflows/final_result.py``).

As Pydantic AI's "tool output" mode: a run started with a JSON Schema is offered one more tool,
``final_result``, whose input schema is that schema. The run's answer is the arguments of a
``final_result`` call that validates; one that does not is answered with the validation errors
and the model tries again, a bounded number of times.

A schema is checked when the run's input is: a JSON object of ``"type": "object"`` (a tool's
arguments are an object), valid JSON Schema 2020-12 (the dialect Pydantic writes), of bounded
size, whose references are all inside the schema (a validation never fetches anything). Its
``pattern`` keywords are matched with RE2, in time linear in the text the model wrote, so no
answer can stall the workflow; ``patternProperties`` (matched by a backtracking engine) is
refused.
"""

from __future__ import annotations

from collections.abc import Iterator
from functools import lru_cache
from typing import Any, TypeVar

import re2
from jsonschema import validators
from jsonschema.exceptions import SchemaError, ValidationError
from pydantic import TypeAdapter
from pydantic import ValidationError as PydanticValidationError

from durable_agent.core.canonical import canonical_bytes
from durable_agent.core.errors import DurableAgentError, validation_message
from durable_agent.core.models import ToolDefinition
from durable_agent.core.tool_specs import ToolOffer

T = TypeVar("T")

# The tool the model ends a typed run with (Pydantic AI's name for it).
FINAL_RESULT_TOOL = "final_result"
FINAL_RESULT_DESCRIPTION = (
    "Call this with your final answer: its arguments are the answer, in the form the input schema "
    "gives. Call it once, when you are done, instead of answering with text."
)
# The most an output schema may be, as canonical JSON: it is the ``final_result`` tool's schema,
# which the run's plan and its header carry (within ``Limits.max_tool_catalog_bytes``).
MAX_OUTPUT_SCHEMA_BYTES = 65_536
# How many times the model may try again after an answer that is not a valid final result.
DEFAULT_OUTPUT_RETRIES = 3
# A non-object type's schema is wrapped, as Pydantic AI does, under this one property.
WRAPPED_KEY = "response"
# What the model is told of an invalid answer: this many problems, each cut to this many characters.
MAX_LISTED_ERRORS = 20
MAX_ERROR_CHARS = 300
DIALECTS = frozenset(
    {"https://json-schema.org/draft/2020-12/schema", "https://json-schema.org/draft/2020-12/schema#"}
)

_RE2 = re2.Options()
_RE2.log_errors = False  # a bad pattern is reported to the caller, not printed to stderr


class OutputSchemaError(DurableAgentError, ValueError):
    """An output schema that a run cannot take (the run's input is refused with it)."""


class OutputSchemaUnusable(Exception):
    """The schema could not check an answer (a reference that loops, say): the workflow's own
    control flow, never a host's (the run fails, with this message)."""


class RunOutputError(DurableAgentError):
    """A run gave no typed result: it did not complete, or its output does not fit the type."""


# --- the schema ---------------------------------------------------------------------------


def _re2_pattern(
    validator: Any, pattern: str, instance: object, schema: dict[str, Any]
) -> Iterator[ValidationError]:
    """The ``pattern`` keyword in linear time (jsonschema's own uses ``re``, which backtracks)."""
    if validator.is_type(instance, "string") and not _compiled(pattern).search(str(instance)):
        yield ValidationError(f"{instance!r} does not match {pattern!r}")


@lru_cache(maxsize=256)
def _compiled(pattern: str) -> re2._Regexp[str]:
    return re2.compile(pattern, _RE2)


# Draft 2020-12 with ``pattern`` in RE2 (jsonschema's ``extend`` has no annotations)
Validator: Any = validators.extend(  # type: ignore[no-untyped-call]
    validators.Draft202012Validator, {"pattern": _re2_pattern}
)


def _walk(node: object, path: str = "") -> Iterator[tuple[str, dict[str, Any]]]:
    """Every object in the schema, with where it is (``/``-separated, as a JSON pointer)."""
    if isinstance(node, dict):
        yield path, node
        for key, value in node.items():
            yield from _walk(value, f"{path}/{key}")
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield from _walk(value, f"{path}/{i}")


def _points_into(schema: dict[str, Any], ref: str) -> bool:
    """Whether the local reference ``#/a/b`` names a place in ``schema``."""
    node: object = schema
    for raw in ref[2:].split("/") if ref != "#" else ():
        part = raw.replace("~1", "/").replace("~0", "~")
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            return False
    return True


def check_output_schema(schema: dict[str, Any]) -> dict[str, Any]:
    """Check that a run can ask for answers of this schema.

    Args:
        schema: The run's ``output_schema``.

    Returns:
        ``schema`` itself.

    Raises:
        OutputSchemaError: It is too large, not of ``"type": "object"``, not valid JSON Schema
            2020-12, refers outside itself, or has a pattern RE2 cannot take; the message says which.
    """
    size = len(canonical_bytes(schema))
    if size > MAX_OUTPUT_SCHEMA_BYTES:
        raise OutputSchemaError(
            f"output_schema is {size} bytes as JSON, over {MAX_OUTPUT_SCHEMA_BYTES}: ask for a smaller answer"
        )
    if schema.get("type") != "object":
        raise OutputSchemaError(
            'output_schema must have "type": "object" at its top (it is the final_result tool\'s '
            f"arguments), not {schema.get('type')!r}: put another type under a property"
        )
    dialect = schema.get("$schema")
    if dialect is not None and dialect not in DIALECTS:
        raise OutputSchemaError(f"output_schema: $schema {dialect!r} is not JSON Schema 2020-12")
    try:
        Validator.check_schema(schema)
    except SchemaError as exc:
        where = "/".join(str(p) for p in exc.absolute_path) or "(top level)"
        raise OutputSchemaError(
            f"output_schema is not valid JSON Schema: at {where}: {_cut(exc.message)}"
        ) from None
    for where, node in _walk(schema):
        for key in ("$ref", "$dynamicRef"):
            ref = node.get(key)
            if isinstance(ref, str) and not (ref.startswith("#/") or ref == "#"):
                raise OutputSchemaError(
                    f"output_schema: {key} {ref!r} at {where or '/'} is not a reference inside the "
                    "schema (#/...): the schema must hold its definitions"
                )
            if isinstance(ref, str) and not _points_into(schema, ref):
                raise OutputSchemaError(f"output_schema: {key} {ref!r} at {where or '/'} names nothing")
        if isinstance(node.get("patternProperties"), dict):
            raise OutputSchemaError(
                f"output_schema: patternProperties (at {where or '/'}) is not supported: "
                "name the properties, or use additionalProperties"
            )
        pattern = node.get("pattern")
        if isinstance(pattern, str):
            try:
                _compiled(pattern)
            except re2.error as exc:
                reason = exc.args[0].decode(errors="replace") if exc.args else str(exc)
                raise OutputSchemaError(
                    f"output_schema: pattern {pattern!r} at {where or '/'} is not a linear-time (RE2) "
                    f"regular expression: {reason}"
                ) from None
    return schema


def final_result_offer(schema: dict[str, Any]) -> ToolOffer:
    """The ``final_result`` tool offered to the model of a run with ``schema`` as its output schema.

    Args:
        schema: The run's (checked) output schema.

    Returns:
        The offer: no permission target (the tool is not subject to the run's rules).
    """
    definition = ToolDefinition(
        name=FINAL_RESULT_TOOL, description=FINAL_RESULT_DESCRIPTION, input_schema=schema
    )
    return ToolOffer(definition=definition, target_arg=None, target_is_path=False)


# --- an answer ------------------------------------------------------------------------------


def _cut(text: str) -> str:
    return text if len(text) <= MAX_ERROR_CHARS else text[: MAX_ERROR_CHARS - 1] + "…"


def output_errors(schema: dict[str, Any], value: dict[str, Any]) -> list[str]:
    """What is wrong with ``value`` as an answer of ``schema``, in a fixed order (empty: valid).

    Deterministic: the same schema and value give the same list, so a workflow may call it.

    Args:
        schema: The run's output schema (checked by ``check_output_schema``).
        value: A ``final_result`` call's arguments.

    Returns:
        One line per problem, ``path: message``, sorted, at most ``MAX_LISTED_ERRORS`` (and a last
        line saying how many more).

    Raises:
        OutputSchemaUnusable: The schema cannot check the value (a reference that loops, say).
    """
    try:
        found = list(Validator(schema).iter_errors(value))
    except Exception as exc:  # jsonschema's own errors, and a recursion with no end
        raise OutputSchemaUnusable(
            f"the output schema cannot check an answer: {type(exc).__name__}: {_cut(str(exc))}"
        ) from None
    lines = sorted(
        f"{'.'.join(str(p) for p in e.absolute_path) or '(top level)'}: {_cut(e.message)}" for e in found
    )
    if len(lines) > MAX_LISTED_ERRORS:
        more = len(lines) - MAX_LISTED_ERRORS
        lines = [*lines[:MAX_LISTED_ERRORS], f"... and {more} more"]
    return lines


def invalid_answer_message(errors: list[str], tries_left: int) -> str:
    """The tool result of a ``final_result`` call whose arguments do not validate; ``tries_left``:
    the model's next answer included."""
    listed = "\n".join(f"- {e}" for e in errors)
    return (
        f"invalid final result: the arguments do not match the output schema:\n{listed}\n"
        f"Fix them and call {FINAL_RESULT_TOOL} again ({_tries(tries_left)})."
    )


def text_answer_message(tries_left: int) -> str:
    """The user message a model that answered with text is sent when an output schema is set;
    ``tries_left``: the model's next answer included."""
    return (
        f"Your answer must be a call of the {FINAL_RESULT_TOOL} tool, with the answer as its arguments: "
        f"call {FINAL_RESULT_TOOL} now ({_tries(tries_left)})."
    )


def _tries(tries_left: int) -> str:
    return "this is your last try" if tries_left == 1 else f"{tries_left} tries left"


ACCEPTED_MESSAGE = "Final result accepted."
NOT_RUN_MESSAGE = (
    f"not run: the step ended the run with its {FINAL_RESULT_TOOL} call; call other tools before "
    f"{FINAL_RESULT_TOOL}, in an earlier step"
)
SECOND_FINAL_MESSAGE = f"not used: this step called {FINAL_RESULT_TOOL} more than once; the first call counts"


# --- a host's types ---------------------------------------------------------------------------


def schema_of(output_type: Any) -> dict[str, Any]:
    """The output schema that asks for an answer of ``output_type`` (a pydantic model, a dataclass,
    a ``TypedDict``, ``list[int]``, ...).

    A type whose JSON Schema is not an object's is wrapped, as Pydantic AI does, in an object with
    one property, ``response``; ``typed_output`` unwraps it.

    Args:
        output_type: Any type pydantic's ``TypeAdapter`` takes.

    Returns:
        The JSON Schema, checked by ``check_output_schema``.

    Raises:
        OutputSchemaError: The type's schema is one a run cannot take.
    """
    schema: dict[str, Any] = TypeAdapter(output_type).json_schema()
    if schema.get("type") != "object":
        defs = schema.pop("$defs", None)
        schema = {
            "type": "object",
            "properties": {WRAPPED_KEY: schema},
            "required": [WRAPPED_KEY],
            **({"$defs": defs} if defs is not None else {}),
        }
    return check_output_schema(schema)


def typed_output(output: dict[str, Any], output_type: type[T]) -> T:
    """A run's ``output`` as an ``output_type`` (unwrapped when ``schema_of`` wrapped the type).

    Args:
        output: ``AgentRunResult.output``.
        output_type: The type the run was started with.

    Returns:
        The validated object.

    Raises:
        RunOutputError: The output does not validate as ``output_type``.
    """
    wrapped = TypeAdapter(output_type).json_schema().get("type") != "object"
    value = output.get(WRAPPED_KEY) if wrapped else output
    try:
        return TypeAdapter(output_type).validate_python(value)
    except PydanticValidationError as exc:
        name = getattr(output_type, "__name__", str(output_type))
        raise RunOutputError(f"the run's output is not a {name}: {validation_message(exc)}") from None
