"""MCP tools in real runs: servers nobody here wrote (``mcp-server-time``, ``mcp-server-git``
over stdio) and one built with the SDK (``tests/mcp_servers/agent_tools.py``, stdio or
streamable HTTP): calls with exports, permission rules, a server killed mid-call, a server
that stays down, and a catalog change that refuses a resume."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from temporalio.client import Client, WorkflowFailureError
from temporalio.worker import Worker

from durable_agent import DurableAgentPlugin
from durable_agent.activities import AgentActivities
from durable_agent.activities.providers.from_config import build_providers
from durable_agent.activities.providers.model_provider import ModelProvider, TextSink
from durable_agent.client import resume_run, run_result, start_run
from durable_agent.config import AgentConfig
from durable_agent.core.activity_api import ModelCallInput
from durable_agent.core.events import EventRecord, ToolEndEvent, ToolsUnavailableEvent
from durable_agent.core.export import SessionCheckpointExportV1
from durable_agent.core.models import ModelResponse
from durable_agent.core.run_api import AgentRunInput, ApprovalDecision
from tests.helpers import (
    RecordingProvider,
    RecordingSink,
    awaiting_approval,
    final,
    running_worker,
    scripted_config,
    start,
    tool_call,
    until,
    workspace_with,
)
from tests.test_plugin import UserGreeting, greet, plugin_client

BIN = Path(sys.executable).parent
AGENT_TOOLS = Path(__file__).parent / "mcp_servers" / "agent_tools.py"


def stdio(*args: str, **extra: Any) -> dict[str, Any]:
    return {"command": sys.executable, "args": [str(AGENT_TOOLS), *args], **extra}


def git_repo(tmp: Path) -> Path:
    repo = tmp / "repo"
    repo.mkdir()
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@x", "GIT_COMMITTER_NAME": "t"}
    env["GIT_COMMITTER_EMAIL"] = "t@x"
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    (repo / "notes.txt").write_text("first note\n")
    subprocess.run(["git", "-C", str(repo), "add", "."], check=True, env=env)
    subprocess.run(["git", "-C", str(repo), "commit", "-qm", "initial commit of notes"], check=True, env=env)
    (repo / "notes.txt").write_text("first note\nsecond note\n")
    return repo


async def listed(acts: AgentActivities) -> None:
    """Wait until the worker has listed its MCP servers. A run's start waits at most 4 s for a
    listing (``STEP_WAIT_SECONDS``), and a loaded machine can take longer to start a server:
    the run would then be offered none of its tools, which these tests are not about."""
    await acts.mcp.refresh()


def mcp_config(
    tmp: Path, responses: list[dict[str, Any]], servers: dict[str, Any], **extra: Any
) -> AgentConfig:
    permissions = extra.pop("permissions", {"allow": ["mcp__*"], "default": "deny"})
    return scripted_config(tmp, responses, mcp=servers, permissions=permissions, **extra)


async def started(pid_file: Path) -> int:
    """The pid of the server process running the ``slow`` call, once it runs."""

    def pid() -> str | None:
        return pid_file.read_text() or None if pid_file.exists() else None

    return int(await until("the slow call to start", pid))


def tool_results(sink: RecordingSink) -> dict[str, str]:
    """Each call's tool result text in the last export."""
    run = sink.exports[-1].open().source_run()
    return {e.id: e.output for e in (r.event for r in run.events) if isinstance(e, ToolEndEvent)}


async def test_a_run_calls_mcp_tools_of_reference_servers_with_exports(
    client: Client, tmp_path: Path
) -> None:
    repo = git_repo(tmp_path)
    servers = {
        "time": {"command": str(BIN / "mcp-server-time"), "retry": "safe"},
        "git": {"command": str(BIN / "mcp-server-git"), "args": ["--repository", str(repo)]},
    }
    responses = [
        tool_call("t1", "mcp__time__get_current_time", timezone="UTC"),
        tool_call("g1", "mcp__git__git_status", repo_path=str(repo)),
        tool_call("g2", "mcp__git__git_log", repo_path=str(repo)),
        final("it is late and notes.txt changed"),
    ]
    config = mcp_config(tmp_path, responses, servers)
    sink = RecordingSink()
    acts = AgentActivities(config, sinks={"local": sink})
    try:
        async with running_worker(client, acts) as queue:
            await listed(acts)
            handle = await start(
                client, queue, workspace_with(tmp_path, {}), "what time is it, what changed?"
            )
            result = await handle.result()
    finally:
        await acts.aclose()
    assert result.status == "completed", result
    assert [e.turn for e in result.exports] == [1, 2, 3]
    results = tool_results(sink)
    assert '"timezone": "UTC"' in results["t1"] or "UTC" in results["t1"]
    assert "notes.txt" in results["g1"]
    assert "initial commit of notes" in results["g2"]
    binding = sink.exports[-1].open().logical_resume.capability_binding
    assert binding is not None
    assert {"mcp__time__get_current_time", "mcp__git__git_status"} <= set(binding.tools)
    assert binding.catalog_generation != 0  # MCP tools are part of the catalog


async def test_mcp_permissions_deny_ask_and_argument_patterns(client: Client, tmp_path: Path) -> None:
    servers = {"db": stdio(permission_args={"query": "sql"}), "tools": stdio()}
    permissions = {
        "allow": ["mcp__db__query(select *)", "mcp__tools__echo"],
        "ask": ["mcp__tools__count"],
        "deny": ["mcp__tools__slow"],
        "default": "deny",
    }
    responses = [
        tool_call("q1", "mcp__db__query", sql="select * from runs"),
        tool_call("q2", "mcp__db__query", sql="drop table runs"),
        tool_call("s1", "mcp__tools__slow", seconds=0, pid_file=str(tmp_path / "pid")),
        tool_call("c1", "mcp__tools__count"),
        tool_call("e1", "mcp__tools__echo", text="hello"),
        final("done"),
    ]
    config = mcp_config(tmp_path, responses, servers, permissions=permissions)
    sink = RecordingSink()
    acts = AgentActivities(config, sinks={"local": sink})
    try:
        async with running_worker(client, acts) as queue:
            await listed(acts)
            handle = await start(client, queue, workspace_with(tmp_path, {}), "use the tools")
            waiting = await awaiting_approval(handle)
            assert [p.tool for p in waiting.pending_approvals] == ["mcp__tools__count"]
            await handle.execute_update("approve", ApprovalDecision(call_id="c1", approved=True))
            result = await handle.result()
    finally:
        await acts.aclose()
    assert result.status == "completed", result
    results = tool_results(sink)
    assert results["q1"] == "rows for 'select * from runs': 1"
    assert "permission denied" in results["q2"]
    assert "unknown tool 'mcp__tools__slow'" in results["s1"]  # denied outright: never offered
    binding = sink.exports[-1].open().logical_resume.capability_binding
    assert binding is not None
    assert "mcp__tools__slow" not in binding.tools and "mcp__db__echo" not in binding.tools
    assert results["c1"] == "2" or results["c1"].isdigit()
    assert results["e1"] == "echo: hello"


@pytest.mark.parametrize("retry", ["safe", "never"])
async def test_a_server_killed_mid_call_is_retried_only_when_safe(
    client: Client, tmp_path: Path, retry: str
) -> None:
    pid_file = tmp_path / "pid"
    responses = [
        tool_call("s1", "mcp__tools__slow", seconds=3, pid_file=str(pid_file)),
        tool_call("n1", "mcp__tools__count"),
        final("done"),
    ]
    config = mcp_config(tmp_path, responses, {"tools": stdio(retry=retry)})
    sink = RecordingSink()
    acts = AgentActivities(config, sinks={"local": sink})
    try:
        async with running_worker(client, acts) as queue:
            await listed(acts)
            handle = await start(client, queue, workspace_with(tmp_path, {}), "sleep a little")
            first = int(
                await until("the slow call to start", lambda: pid_file.exists() and pid_file.read_text())
            )
            os.kill(first, signal.SIGKILL)
            result = await asyncio.wait_for(handle.result(), 60)
    finally:
        await acts.aclose()
    assert result.status == "completed", result
    results = tool_results(sink)
    if retry == "safe":
        # Temporal ran the call again, on a fresh server process
        assert results["s1"].startswith("slept 3")
        assert int(pid_file.read_text()) != first
    else:
        assert "stopped during the call" in results["s1"] and 'retry = "never"' in results["s1"]
        assert int(pid_file.read_text()) == first  # never started again
    assert results["n1"].isdigit()  # the next call reached a fresh server: the run went on


async def test_a_cancel_stops_an_mcp_call_in_flight(client: Client, tmp_path: Path) -> None:
    pid_file = tmp_path / "pid"
    responses = [tool_call("s1", "mcp__tools__slow", seconds=60, pid_file=str(pid_file)), final()]
    config = mcp_config(tmp_path, responses, {"tools": stdio()})
    acts = AgentActivities(config, sinks={"local": RecordingSink()})
    try:
        async with running_worker(client, acts) as queue:
            await listed(acts)
            handle = await start(client, queue, workspace_with(tmp_path, {}), "sleep a minute")
            await started(pid_file)
            began = time.monotonic()
            await handle.signal("cancel", "enough")
            result = await asyncio.wait_for(run_result(client, handle.id), 20)
            took = time.monotonic() - began
            # the session survives a cancelled call: the next one is answered at once
            assert (
                await acts.mcp.servers["tools"].call_tool("echo", {"text": "after"})
            ).text == "echo: after"
    finally:
        await acts.aclose()
    assert (result.status, result.error) == ("cancelled", "enough")
    assert took < 15  # the 60 s call was stopped, not waited out


async def test_a_server_that_stays_down_keeps_its_tools_offered_and_the_run_goes_on(
    client: Client, tmp_path: Path
) -> None:
    down, pid_file = tmp_path / "down", tmp_path / "pid"
    responses = [
        tool_call("s1", "mcp__tools__slow", seconds=30, pid_file=str(pid_file)),
        tool_call("e2", "mcp__tools__echo", text="two"),
        final("went on without the tools"),
    ]
    config = mcp_config(tmp_path, responses, {"tools": stdio("--down-if", str(down))})
    model = SeeingProvider(build_providers(config)["scripted"])
    seen = model.requests
    sink = RecordingSink()
    acts = AgentActivities(config, providers={"scripted": model}, sinks={"local": sink})
    try:
        async with running_worker(client, acts) as queue:
            handle = await start(client, queue, workspace_with(tmp_path, {}), "sleep, then echo")
            pid = int(
                await until("the slow call to start", lambda: pid_file.exists() and pid_file.read_text())
            )
            down.write_text("")  # from now on the server cannot start
            os.kill(pid, signal.SIGKILL)
            result = await asyncio.wait_for(handle.result(), 60)
    finally:
        await acts.aclose()
    assert result.status == "completed", result
    results = tool_results(sink)
    assert "stopped during the call" in results["s1"]
    assert "unavailable" in results["e2"]  # the model called it anyway: a tool error, the run goes on
    # the catalog and the system prompt the same at every step: the prompt cache survives
    assert "mcp__tools__echo" in seen[0][1]
    assert all(request == seen[0] for request in seen), seen
    events = [r.event for r in sink.exports[-1].open().source_run().events]
    gone = [e for e in events if isinstance(e, ToolsUnavailableEvent)]
    assert gone and gone[0].server == "tools" and "mcp__tools__echo" in gone[0].tools


class SeeingProvider(RecordingProvider):
    """Keeps each request's system prompt and offered tools too."""

    def __init__(self, inner: ModelProvider) -> None:
        super().__init__(inner)
        self.requests: list[tuple[str, tuple[str, ...]]] = []

    async def complete(self, call: ModelCallInput, model: str, on_text: TextSink) -> ModelResponse:
        self.requests.append((call.system_prompt, tuple(t.name for t in call.tools)))
        return await super().complete(call, model, on_text)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def http_server() -> Iterator[Any]:
    """``agent_tools.py --http PORT`` in a subprocess; a function that (re)starts it."""
    procs: list[subprocess.Popen[bytes]] = []

    def serve(*args: str, port: int | None = None) -> str:
        for proc in procs:
            proc.terminate()
            proc.wait(10)
        port = port or free_port()
        proc = subprocess.Popen(
            [sys.executable, str(AGENT_TOOLS), "--http", str(port), *args],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        procs.append(proc)
        deadline = time.monotonic() + 20
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), 0.2).close()
                break
            except OSError:
                assert time.monotonic() < deadline, "the MCP HTTP server did not start"
                time.sleep(0.1)
        return f"http://127.0.0.1:{port}/mcp"

    yield serve
    for proc in procs:
        proc.terminate()
        proc.wait(10)


async def echo_export(
    client: Client, tmp_path: Path, url: str, responses: list[dict[str, Any]]
) -> SessionCheckpointExportV1:
    """The first export of a run that calls the `web` server at ``url``."""
    config = mcp_config(tmp_path, responses, {"web": {"url": url}})
    sink = RecordingSink()
    acts = AgentActivities(config, sinks={"local": sink})
    try:
        async with running_worker(client, acts) as queue:
            await listed(acts)
            handle = await start(client, queue, workspace_with(tmp_path, {}), "echo")
            assert (await handle.result()).status == "completed"
    finally:
        await acts.aclose()
    return sink.exports[0]


async def test_a_catalog_change_refuses_a_resume_unless_forced(
    client: Client, tmp_path: Path, http_server: Any
) -> None:
    responses = [tool_call("e1", "mcp__web__echo", text="before"), final("one")]
    # the server offers one tool more than it will later
    export = await echo_export(client, tmp_path, http_server("--extra-tool"), responses)
    before = export.open().logical_resume.capability_binding
    assert before is not None and "mcp__web__extra_tool" in before.tools

    url = http_server()  # the server no longer offers `extra`
    # the scripted model answers by step: the export ends after the first call
    config = mcp_config(tmp_path, [responses[0], final("resumed")], {"web": {"url": url}})
    acts = AgentActivities(config)
    try:
        async with running_worker(client, acts) as queue:
            await listed(acts)
            refused = await resume_run(client, export, queue=queue, workspace=str(tmp_path / "workspace"))
            with pytest.raises(WorkflowFailureError) as why:
                await refused.result()
            forced = await resume_run(
                client, export, queue=queue, workspace=str(tmp_path / "workspace"), force_resume=True
            )
            result = await forced.result()
    finally:
        await acts.aclose()
    message = str(why.value.cause)
    assert "capability binding differs" in message
    assert "tools no longer offered: mcp__web__extra_tool" in message
    assert "catalog generation" in message
    assert result.status == "completed"


async def test_a_server_offering_a_tool_more_still_resumes_with_the_checkpoints_tools(
    client: Client, tmp_path: Path, http_server: Any
) -> None:
    responses = [tool_call("e1", "mcp__web__echo", text="before"), final("one")]
    export = await echo_export(client, tmp_path, http_server(), responses)

    url = http_server("--extra-tool")  # the server now offers one more tool
    again = tool_call("e2", "mcp__web__echo", text="after")  # step 2: the resumed run's first
    config = mcp_config(tmp_path, [responses[0], again, final("resumed")], {"web": {"url": url}})
    resumed = RecordingSink()
    acts = AgentActivities(config, sinks={"local": resumed})
    try:
        async with running_worker(client, acts) as queue:
            await listed(acts)
            handle = await resume_run(client, export, queue=queue, workspace=str(tmp_path / "workspace"))
            result = await handle.result()
    finally:
        await acts.aclose()
    assert result.status == "completed", result.error
    # the resumed run was offered what the checkpoint bound, not the tool added since
    binding = resumed.exports[0].open().logical_resume.capability_binding
    assert binding == export.open().logical_resume.capability_binding
    assert "mcp__web__extra_tool" not in binding.tools


async def test_a_running_worker_offers_a_servers_new_tools_to_the_next_run(
    client: Client, tmp_path: Path, http_server: Any
) -> None:
    """A server's tool list changes while the worker runs: the next run's binding says so."""
    port_url = http_server()
    responses = [tool_call("e1", "mcp__web__echo", text="hi"), final("one")]
    config = mcp_config(tmp_path, responses, {"web": {"url": port_url}})
    sink = RecordingSink()
    acts = AgentActivities(config, sinks={"local": sink})
    try:
        async with running_worker(client, acts) as queue:
            first = await start(client, queue, workspace_with(tmp_path, {}), "echo")
            assert (await first.result()).status == "completed"
            # the same address, now with one more tool (a deploy of the server)
            http_server("--extra-tool", port=int(port_url.rsplit(":", 1)[1].split("/")[0]))
            second = await start(client, queue, workspace_with(tmp_path, {}), "echo again")
            assert (await second.result()).status == "completed"
    finally:
        await acts.aclose()
    bindings = [e.open().logical_resume.capability_binding for e in sink.exports]
    assert bindings[0] is not None and bindings[-1] is not None
    assert "mcp__web__extra_tool" not in bindings[0].tools
    assert "mcp__web__extra_tool" in bindings[-1].tools
    assert bindings[0].catalog_generation != bindings[-1].catalog_generation
    assert bindings[0].catalog_digest != bindings[-1].catalog_digest


async def test_a_hanging_server_never_holds_up_a_runs_start(client: Client, tmp_path: Path) -> None:
    """A server that starts and never answers: the run starts with the others' tools."""
    hang = {"command": sys.executable, "args": ["-c", "import time; time.sleep(120)"]}
    servers = {"tools": stdio(), "stuck": {**hang, "connect_timeout_seconds": 60}}
    responses = [tool_call("e1", "mcp__tools__echo", text="hi"), final("done")]
    config = mcp_config(tmp_path, responses, servers)
    sink = RecordingSink()
    acts = AgentActivities(config, sinks={"local": sink})
    try:
        async with running_worker(client, acts) as queue:
            began = time.monotonic()
            handle = await start(client, queue, workspace_with(tmp_path, {}), "echo")
            result = await asyncio.wait_for(handle.result(), 30)
            took = time.monotonic() - began
    finally:
        await acts.aclose()
    assert result.status == "completed", result
    assert tool_results(sink)["e1"] == "echo: hi"
    assert took < 15  # not the stuck server's 60 s, nor a timed-out resolve


async def test_mcp_list_shows_servers_tools_and_permissions(tmp_path: Path, http_server: Any) -> None:
    url = http_server()
    config = {
        "permissions": {
            "allow": ["mcp__web__echo", "mcp__web__query(select *)"],
            "ask": ["mcp__web__count"],
            "default": "deny",
        },
        "mcp": {
            "web": {"url": url, "permission_args": {"query": "sql"}},
            "gone": {"command": str(tmp_path / "no-such-server")},
        },
    }
    path = tmp_path / "agent.toml"
    path.write_text(toml(config))
    env = {**os.environ, "AGENT_CONFIG": str(path)}
    done = subprocess.run(
        [sys.executable, "-m", "durable_agent.cli", "mcp", "list"], env=env, capture_output=True, text=True
    )
    assert done.returncode == 1, done.stdout + done.stderr  # one server did not answer
    assert "web  (http " in done.stdout and "available" in done.stdout
    lines = {line.split()[0]: line for line in done.stdout.splitlines() if line.startswith("  ")}
    assert lines["mcp__web__echo"].endswith("allowed")
    assert lines["mcp__web__count"].endswith("asks a person")
    assert "denied (not offered)" in lines["mcp__web__slow"]
    assert "by its 'sql' argument" in lines["mcp__web__query"]
    assert "gone  (stdio " in done.stdout and "unavailable:" in done.stdout
    as_json = subprocess.run(
        [sys.executable, "-m", "durable_agent.cli", "mcp", "list", "--json"],
        env=env,
        capture_output=True,
        text=True,
    )
    servers = {s["server"]: s for s in json.loads(as_json.stdout)}
    assert servers["web"]["available"] and not servers["gone"]["available"]


def toml(data: dict[str, Any]) -> str:
    """Enough TOML for the test's config: tables of strings, lists and inline tables."""
    lines: list[str] = []

    def value(v: Any) -> str:
        if isinstance(v, dict):
            return "{ " + ", ".join(f"{k} = {value(x)}" for k, x in v.items()) + " }"
        return json.dumps(v)

    for key, table in data.items():
        if key == "mcp":
            for name, server in table.items():
                lines.append(f"[mcp.{name}]")
                lines += [f"{k} = {value(v)}" for k, v in server.items()]
        else:
            lines.append(f"[{key}]")
            lines += [f"{k} = {value(v)}" for k, v in table.items()]
    return "\n".join(lines) + "\n"


def test_a_server_cannot_flood_the_plan_or_the_conversation() -> None:
    """Every run's plan holds the offered tools, and a result enters the conversation: bounds."""
    from durable_agent.activities.mcp.catalog import (
        DESCRIPTION_MAX_CHARS,
        OUTPUT_MAX_BYTES,
        TOOLS_MAX,
        admitted,
        bounded,
    )
    from durable_agent.activities.mcp.connection import McpToolInfo

    deep: dict[str, Any] = {"type": "object"}
    for _ in range(500):
        deep = {"type": "object", "properties": {"x": deep}}
    infos = [
        McpToolInfo("huge", "", {"type": "object", "description": "x" * 100_000}),
        McpToolInfo("deep", "", deep),
        McpToolInfo("wordy", "w" * 50_000, {"type": "object"}),
        *(McpToolInfo(f"t{i}", "", {"type": "object"}) for i in range(300)),
    ]
    kept = admitted("flood", infos)
    names = [i.name for i in kept]
    assert "huge" not in names and "deep" not in names
    assert len(kept) <= TOOLS_MAX
    [wordy] = [i for i in kept if i.name == "wordy"]
    assert len(wordy.description) <= DESCRIPTION_MAX_CHARS + 1
    text = bounded("é" * OUTPUT_MAX_BYTES)
    assert len(text.encode()) < OUTPUT_MAX_BYTES + 100
    assert text.endswith(f"[output cut at {OUTPUT_MAX_BYTES} of {2 * OUTPUT_MAX_BYTES} bytes]")
    assert bounded("short") == "short"


async def test_a_bare_command_is_found_in_the_workers_virtualenv(monkeypatch: pytest.MonkeyPatch) -> None:
    """``command = "mcp-server-time"`` works from a worker whose virtualenv is not activated."""
    from durable_agent.activities.mcp.connection import McpServer
    from durable_agent.config import McpServerConfig

    path = [p for p in os.environ.get("PATH", "").split(os.pathsep) if Path(p) != BIN]
    monkeypatch.setenv("PATH", os.pathsep.join(path))
    server = McpServer("time", McpServerConfig(command="mcp-server-time"))
    try:
        names = [t.name for t in await server.list_tools()]
    finally:
        await server.aclose()
    assert "get_current_time" in names


async def test_a_plugin_whose_worker_runs_again_still_has_its_mcp_tools(
    client: Client, tmp_path: Path
) -> None:
    """A worker run ends with the plugin's ``aclose``, which stops the MCP servers; a second
    worker run on the same plugin starts them again (``connect`` reopens them)."""
    responses = [tool_call("e1", "mcp__tools__echo", text="hi"), final("echoed")]
    config = mcp_config(tmp_path, responses, {"tools": stdio()})
    plugin = DurableAgentPlugin(config)
    own = await plugin_client(client, plugin)
    for attempt in range(2):
        queue = f"plugin-mcp-{uuid.uuid4().hex[:8]}"
        async with Worker(own, task_queue=queue, workflows=[UserGreeting], activities=[greet]):
            (tmp_path / str(attempt)).mkdir()
            run = AgentRunInput(prompt="echo", workspace=str(workspace_with(tmp_path / str(attempt), {})))
            handle = await start_run(own, run, queue=queue)
            result = await handle.result()
            records: list[EventRecord] = await handle.query("events", 0, result_type=list[EventRecord])
        assert result.status == "completed", (attempt, result.error)
        [end] = [r.event for r in records if isinstance(r.event, ToolEndEvent)]
        assert (end.output, end.is_error) == ("echo: hi", False), (attempt, end)
