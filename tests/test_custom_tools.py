"""Tools of your own: ``@tool`` makes a typed function a tool the worker runs like its own."""

from __future__ import annotations

import asyncio
import threading
import uuid
from pathlib import Path
from typing import Annotated, Any, Literal

import pytest
from pydantic import BaseModel, Field
from temporalio.client import Client
from temporalio.worker import Worker

from durable_agent import (
    AgentActivities,
    DurableAgentPlugin,
    ToolContent,
    ToolContext,
    ToolDefinitionError,
    ToolFailure,
    tool,
)
from durable_agent.activities.tools.builtin import builtin_tools
from durable_agent.activities.tools.custom import parse_docstring
from durable_agent.activities.tools.tool import Tool
from durable_agent.client import run_result, start_run
from durable_agent.core.canonical import CanonicalJsonError, canonical_bytes
from durable_agent.core.events import ConfirmationRequiredEvent, PermissionDeniedEvent, ToolEndEvent
from durable_agent.core.images import image_block
from durable_agent.core.models import ToolResultBlock
from durable_agent.core.run_api import AgentRunInput, ApprovalDecision
from durable_agent.core.tool_specs import ToolCallError, validate_args
from tests.helpers import (
    RecordingSink,
    awaiting_approval,
    final,
    running_worker,
    scripted_config,
    start,
    tool_call,
    workspace_with,
)

PNG = bytes.fromhex(
    "89504e470d0a1a0a0000000d4948445200000001000000010806000000"
    "1f15c4890000000d49444154789c6300010000050001d3e6d8850000000049454e44ae426082"
)


class Where(BaseModel):
    """A place (the model's own docstring stays in its schema's ``$defs``)."""

    city: str = Field(description="The city's name.")
    country: str = "NL"


class Forecast(BaseModel):
    city: str
    days: int
    degrees: list[int]


@tool(read_only=True)
async def forecast(
    where: Where,
    days: Annotated[int, Field(ge=1, le=7, description="Days ahead, 1 to 7.")] = 3,
    unit: Literal["c", "f"] = "c",
    note: str | None = None,
) -> Forecast:
    """Tell the weather ahead for a place.

    The forecast is made up.

    Args:
        where: Where to forecast.
        days: Overridden by the Field's description.
        unit: Degrees Celsius or
            Fahrenheit.

    Returns:
        The forecast, day by day.
    """
    return Forecast(city=where.city, days=days, degrees=[20 + i for i in range(days)])


def run_tool(t: Any, workspace: Path, **arguments: Any) -> str | ToolContent:
    """One call, as the activity makes it: arguments validated, then ``run``."""
    result: str | ToolContent = asyncio.run(t.run(validate_args(t.spec, arguments), workspace))
    return result


# --- the schema -----------------------------------------------------------------------------------


def test_the_schema_comes_from_the_type_hints_and_the_docstring() -> None:
    offer = forecast.spec.offer()
    schema = offer.definition.input_schema
    assert offer.definition.name == "forecast"
    assert offer.definition.description == "Tell the weather ahead for a place.\n\nThe forecast is made up."
    assert schema["required"] == ["where"] and schema["additionalProperties"] is False
    props = schema["properties"]
    assert props["where"] == {"$ref": "#/$defs/Where", "description": "Where to forecast."}
    assert schema["$defs"]["Where"]["properties"]["city"]["description"] == "The city's name."
    assert schema["$defs"]["Where"]["required"] == ["city"]
    # Annotated's Field wins over the docstring; constraints and defaults are kept
    assert props["days"] | {} == {
        "default": 3,
        "description": "Days ahead, 1 to 7.",
        "maximum": 7,
        "minimum": 1,
        "title": "Days",
        "type": "integer",
    }
    assert props["unit"]["enum"] == ["c", "f"] and props["unit"]["default"] == "c"
    assert props["unit"]["description"] == "Degrees Celsius or Fahrenheit."
    assert props["note"]["default"] is None and "description" not in props["note"]
    assert "title" not in schema and "description" not in schema
    assert (forecast.spec.target_arg, forecast.spec.repeatable, forecast.read_only) == (None, True, True)


def test_arguments_are_validated_against_the_schema(tmp_path: Path) -> None:
    with pytest.raises(ToolCallError, match="invalid arguments for 'forecast'"):
        validate_args(forecast.spec, {"where": {"city": "Delft"}, "days": 9})
    with pytest.raises(ToolCallError, match="invalid arguments"):
        validate_args(forecast.spec, {"where": {"city": "Delft"}, "colour": "red"})
    out = run_tool(forecast, tmp_path, where={"city": "Delft"}, days=2)
    assert out == '{"city":"Delft","days":2,"degrees":[20,21]}'


def test_options_name_the_tool_and_say_what_it_does() -> None:
    @tool(name="get-page", description="Fetch a page.", permission_target="url")
    def fetch(url: str, timeout: float = Field(10.0, description="Seconds.")) -> str:
        """Not this.

        Args:
            url: The page's address.
            timeout: Not this either.
        """
        return url

    offer = fetch.spec.offer()
    assert (offer.definition.name, offer.definition.description) == ("get-page", "Fetch a page.")
    props = offer.definition.input_schema["properties"]
    assert props["url"]["description"] == "The page's address."
    assert props["timeout"]["description"] == "Seconds." and props["timeout"]["default"] == 10.0
    # not read-only, not said to be idempotent: not retried after an unexpected error
    assert (offer.target_arg, offer.target_is_path, fetch.spec.repeatable) == ("url", False, False)
    assert fetch("x") == "x"  # still the function, for the host's tests

    @tool(permission_target="file", idempotent=True)
    def stat(file: Path) -> str:
        return str(file)

    assert (stat.spec.target_is_path, stat.spec.repeatable) == (True, True)
    assert tool(permission_target="file", target_is_path=False)(stat.function).spec.target_is_path is False


def test_a_plain_docstring_is_parsed_google_style() -> None:
    summary, args = parse_docstring(
        "Summary line.\n\nMore.\n\nArgs:\n    a (int): First,\n        continued.\n    b: Second.\n"
        "\nReturns:\n    c: not an argument.\n"
    )
    assert summary == "Summary line.\n\nMore."
    assert args == {"a": "First, continued.", "b": "Second."}
    assert parse_docstring("") == ("", {})


# --- running ------------------------------------------------------------------------------------


def test_sync_functions_run_in_a_thread_and_async_ones_on_the_loop(tmp_path: Path) -> None:
    threads: list[str] = []

    @tool
    def blocking(n: int) -> str:
        threads.append(threading.current_thread().name)
        return str(n * 2)

    @tool
    async def awaiting(n: int) -> int:
        threads.append(threading.current_thread().name)
        await asyncio.sleep(0)
        return n * 3

    assert run_tool(blocking, tmp_path, n=2) == "4"
    assert run_tool(awaiting, tmp_path, n=2) == "6"
    assert threads[0] != threading.main_thread().name and threads[1] == threading.main_thread().name


def test_the_context_is_the_first_parameter(tmp_path: Path) -> None:
    seen: list[ToolContext] = []

    @tool
    def where_am_i(ctx: ToolContext, name: str) -> str:
        seen.append(ctx)
        return ctx.path(name).read_text()

    (tmp_path / "a.txt").write_text("alpha")
    assert list(where_am_i.spec.offer().definition.input_schema["properties"]) == ["name"]
    assert run_tool(where_am_i, tmp_path, name="a.txt") == "alpha"
    # outside the tool activity (here) the ids are empty
    assert seen[0] == ToolContext(workspace=tmp_path, run_id="", call_id="", tool="where_am_i")
    with pytest.raises(ToolFailure, match="outside the workspace"):
        run_tool(where_am_i, tmp_path, name="../etc/passwd")


def test_results_are_text_json_or_content(tmp_path: Path) -> None:
    image = image_block(PNG, "image/png")

    @tool
    def as_dict() -> dict[str, Any]:
        return {"b": [1, 2], "a": None}

    @tool
    def as_content() -> ToolContent:
        return ToolContent("a dot", (image,))

    @tool
    def as_nothing() -> None:
        return None

    assert run_tool(as_dict, tmp_path) == '{"b":[1,2],"a":null}'
    assert run_tool(as_content, tmp_path) == ToolContent("a dot", (image,))
    assert run_tool(as_nothing, tmp_path) == "null"
    assert as_dict.spec.offer().definition.input_schema["properties"] == {}


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: tool(_star), "cannot be offered"),
        (lambda: tool(name="two words")(lambda: ""), "use letters"),
        (lambda: tool(name="mcp__x__y")(lambda: ""), "MCP servers' tools"),
        (lambda: tool(name="9lives")(lambda: ""), "use letters"),
        (lambda: tool(name="x" * 65)(lambda: ""), "use letters"),
        (lambda: tool(permission_target="nope")(_two), "not one of its arguments"),
        (lambda: tool(permission_target="count")(_two), "must be a string argument"),
        (lambda: tool(_context_second), "ToolContext must be the first parameter"),
        (lambda: tool(_private), "starts with '_'"),
        (lambda: tool(_unresolved), "signature cannot be read"),
        (lambda: tool(_generator), "a generator cannot be a tool"),
    ],
)
def test_functions_that_cannot_be_tools_are_refused_when_made(make: Any, message: str) -> None:
    with pytest.raises(ToolDefinitionError, match=message):
        make()


def test_a_keyword_tool_does_not_take_is_refused() -> None:
    # a misspelt keyword must not pass silently: a tool meant read-only would not be
    with pytest.raises(TypeError, match="readonly"):
        tool(readonly=True)  # type: ignore[call-overload]


def _star(*texts: str) -> str:
    return "".join(texts)


def _two(text: str, count: int) -> str:
    return text * count


def _context_second(text: str, ctx: ToolContext) -> str:
    return text


def _private(_hidden: str) -> str:
    return _hidden


def _unresolved(x: NoSuchType) -> str:  # type: ignore[name-defined]  # noqa: F821
    return ""


def _generator(n: int) -> Any:
    yield n


# --- registration -------------------------------------------------------------------------------


def test_tools_join_the_built_in_ones(tmp_path: Path) -> None:
    def plain(text: str) -> str:
        """Echo the text."""
        return text

    config = scripted_config(tmp_path, [final()])
    acts = AgentActivities(config, tools=[forecast, plain])
    assert set(acts.tools) == {*builtin_tools(), "forecast", "plain"}
    assert acts.tools["plain"].spec.description == "Echo the text."
    # a dict is still the whole table, as before
    only: dict[str, Tool] = {"forecast": forecast}
    assert AgentActivities(config, tools=only).tools is only


@pytest.mark.parametrize("name", ["read", "Bash", "forecast"])
def test_a_name_clash_is_refused_at_construction(tmp_path: Path, name: str) -> None:
    config = scripted_config(tmp_path, [final()])
    clash = tool(name=name)(lambda: "")
    with pytest.raises(ToolDefinitionError, match=f"tool '{name}'"):
        AgentActivities(config, tools=[forecast, clash])
    with pytest.raises(ToolDefinitionError, match=f"tool '{name}'"):
        DurableAgentPlugin(config, tools=[forecast, clash])


def test_the_plugin_takes_tools_or_activities_not_both(tmp_path: Path) -> None:
    config = scripted_config(tmp_path, [final()])
    with pytest.raises(ValueError, match="give the tools to the AgentActivities"):
        DurableAgentPlugin(config, activities=AgentActivities(config), tools=[forecast])


# --- through a worker ---------------------------------------------------------------------------


class Calls:
    """The tools of the end-to-end runs, noting what reached them."""

    def __init__(self) -> None:
        self.contexts: list[ToolContext] = []
        self.tickets: list[str] = []

        @tool(permission_target="title")
        async def open_ticket(ctx: ToolContext, title: str, body: str = "") -> dict[str, Any]:
            """Open a ticket in the tracker.

            Args:
                title: The ticket's title.
                body: What it is about.
            """
            self.contexts.append(ctx)
            self.tickets.append(title)
            return {"ticket": len(self.tickets), "title": title, "token": "s3cr3t-token-value-42"}

        @tool(read_only=True)
        def refuse(reason: str) -> str:
            """Fail on purpose."""
            raise ToolFailure(f"refused: {reason}")

        self.tools: list[Tool] = [open_ticket, refuse]


def results(sink: RecordingSink) -> dict[str, ToolResultBlock]:
    messages = sink.exports[-1].open().logical_resume.messages
    return {b.tool_use_id: b for m in messages for b in m.content if isinstance(b, ToolResultBlock)}


async def test_a_run_calls_tools_of_its_own(
    client: Client, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TRACKER_TOKEN", "s3cr3t-token-value-42")  # a credential the worker holds
    calls = Calls()
    script = [
        tool_call("t1", "open_ticket", title="flaky test", body="it fails on Tuesdays"),
        tool_call("t2", "refuse", reason="no"),
        tool_call("t3", "open_ticket", title=7),
        final("opened"),
    ]
    config = scripted_config(tmp_path, script, permissions={"allow": ["open_ticket", "refuse"]})
    sink = RecordingSink()
    acts = AgentActivities(config, tools=calls.tools, sinks={"local": sink})
    async with running_worker(client, acts) as queue:
        handle = await start(client, queue, workspace_with(tmp_path, {}), "open a ticket")
        result = await handle.result()
    assert (result.status, result.text, result.tool_calls_count) == ("completed", "opened", 3)
    assert calls.tickets == ["flaky test"]
    [ctx] = calls.contexts
    assert (ctx.call_id, ctx.tool) == ("t1", "open_ticket")
    assert ctx.workspace == (tmp_path / "workspace").resolve()
    assert ctx.run_id and ctx.run_id == sink.exports[-1].open().logical_resume.run_id
    done = results(sink)
    assert not done["t1"].is_error
    assert done["t1"].content == '{"ticket":1,"title":"flaky test","token":"[redacted: $TRACKER_TOKEN]"}'
    assert done["t2"].is_error and done["t2"].content == "refused: no"
    assert done["t3"].is_error and "invalid arguments for 'open_ticket'" in done["t3"].content
    # the plan offered them, and the capability binding pins them
    binding = sink.exports[-1].open().logical_resume.capability_binding
    # the rules deny the rest outright; todo_write touches nothing, and only a deny rule removes it
    assert set(binding.tools) == {"open_ticket", "refuse", "todo_write"}


async def test_permission_rules_deny_and_ask_about_tools_of_ones_own(client: Client, tmp_path: Path) -> None:
    calls = Calls()
    script = [
        tool_call("d1", "open_ticket", title="secret plans"),
        tool_call("a1", "open_ticket", title="public bug"),
        tool_call("r1", "refuse", reason="denied outright"),
        final(),
    ]
    permissions = {
        "deny": ["open_ticket(secret*)", "refuse"],
        "ask": ["open_ticket"],
        "default": "deny",
    }
    config = scripted_config(tmp_path, script, permissions=permissions)
    sink = RecordingSink()
    acts = AgentActivities(config, tools=calls.tools, sinks={"local": sink})
    async with running_worker(client, acts) as queue:
        handle = await start(client, queue, workspace_with(tmp_path, {}), "open tickets")
        [waiting] = (await awaiting_approval(handle)).pending_approvals
        assert (waiting.call_id, waiting.tool, waiting.target) == ("a1", "open_ticket", "public bug")
        assert calls.tickets == []
        await handle.execute_update("approve", ApprovalDecision(call_id="a1", approved=True))
        result = await handle.result()
    assert result.status == "completed"
    assert calls.tickets == ["public bug"]
    events = [r.event for r in sink.exports[-1].open().source_run().events]
    assert [e.id for e in events if isinstance(e, PermissionDeniedEvent)] == ["d1"]
    assert [e.id for e in events if isinstance(e, ConfirmationRequiredEvent)] == ["a1"]
    done = results(sink)
    assert done["d1"].is_error and "permission denied" in done["d1"].content
    assert not done["a1"].is_error
    # a tool denied outright is not offered: the model's call of it is an unknown tool
    assert done["r1"].is_error and "unknown tool 'refuse'" in done["r1"].content
    assert "refuse" not in sink.exports[-1].open().logical_resume.capability_binding.tools
    assert [e.id for e in events if isinstance(e, ToolEndEvent) and not e.is_error] == ["a1"]


async def test_the_plugin_adds_tools_of_ones_own(client: Client, tmp_path: Path) -> None:
    calls = Calls()
    config = scripted_config(
        tmp_path,
        [tool_call("t1", "open_ticket", title="via the plugin"), final("done")],
        permissions={"allow": ["open_ticket"]},
    )
    plugin = DurableAgentPlugin(config, tools=calls.tools)
    own = await Client.connect(
        client.service_client.config.target_host, namespace=client.namespace, plugins=[plugin]
    )
    queue = f"custom-{uuid.uuid4().hex[:8]}"
    async with Worker(own, task_queue=queue):
        ws = workspace_with(tmp_path, {})
        handle = await start_run(own, AgentRunInput(prompt="open one", workspace=str(ws)), queue=queue)
        result = await handle.result()
    assert (result.status, result.tool_calls_count) == ("completed", 1)
    assert calls.tickets == ["via the plugin"]
    assert "open_ticket" in plugin.agent_activities.tools


async def test_an_unexpected_error_is_not_retried_unless_idempotent(client: Client, tmp_path: Path) -> None:
    attempts: list[int] = []

    @tool
    def charge_card(amount: int) -> str:
        """Charge the card (not safe to repeat)."""
        attempts.append(amount)
        raise RuntimeError("the gateway hung up")

    config = scripted_config(
        tmp_path, [tool_call("c1", "charge_card", amount=5), final()], permissions={"allow": ["charge_card"]}
    )
    sink = RecordingSink()
    acts = AgentActivities(config, tools=[charge_card], sinks={"local": sink})
    async with running_worker(client, acts) as queue:
        result = await (await start(client, queue, workspace_with(tmp_path, {}), "pay")).result()
    assert result.status == "completed" and attempts == [5]
    done = results(sink)
    assert done["c1"].is_error and "charge_card failed: the gateway hung up" in done["c1"].content


async def test_a_cancel_reaches_an_async_tool(client: Client, tmp_path: Path) -> None:
    started, cancelled = asyncio.Event(), asyncio.Event()

    @tool
    async def wait_for_build(minutes: int) -> str:
        """Wait for the build to finish."""
        started.set()
        try:
            await asyncio.sleep(minutes * 60)
        except asyncio.CancelledError:
            cancelled.set()
            raise
        return "built"

    config = scripted_config(
        tmp_path,
        [tool_call("w1", "wait_for_build", minutes=5), final()],
        permissions={"allow": ["wait_for_build"]},
    )
    async with running_worker(client, AgentActivities(config, tools=[wait_for_build])) as queue:
        handle = await start(client, queue, workspace_with(tmp_path, {}), "wait")
        await asyncio.wait_for(started.wait(), 10)
        await handle.signal("cancel", "no time")
        result = await asyncio.wait_for(run_result(client, handle.id), 15)
    assert (result.status, result.error) == ("cancelled", "no time") and cancelled.is_set()


async def test_a_lone_surrogate_in_a_tools_text_is_replaced_not_a_failure(
    client: Client, tmp_path: Path
) -> None:
    """A tool's text (a tool of your own, an MCP server's) may hold a lone surrogate, which has
    no UTF-8 form: the run records U+FFFD in its place, as it does for model output."""

    @tool(read_only=True)
    def odd(kind: str) -> str:
        """Answer with a broken string."""
        if kind == "fail":
            raise ToolFailure("failed \ud83d here")
        return "half an emoji: \ud83d."

    script = [tool_call("o1", "odd", kind="ok"), tool_call("o2", "odd", kind="fail"), final("ok")]
    config = scripted_config(tmp_path, script, permissions={"allow": ["odd"]})
    sink = RecordingSink()
    async with running_worker(client, AgentActivities(config, tools=[odd], sinks={"local": sink})) as queue:
        result = await (await start(client, queue, workspace_with(tmp_path, {}), "odd")).result()
    assert result.status == "completed", result.error
    done = results(sink)
    assert done["o1"].content == "half an emoji: \ufffd." and not done["o1"].is_error
    assert done["o2"].content == "failed \ufffd here" and done["o2"].is_error


def test_canonical_bytes_of_a_lone_surrogate_is_a_typed_error() -> None:
    with pytest.raises(CanonicalJsonError, match="lone surrogate"):
        canonical_bytes({"text": "a \udc80 b"})
