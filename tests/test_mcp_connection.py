"""The MCP connection layer against real servers: ``mcp-server-time`` and ``mcp-server-git``
over stdio (servers nobody here wrote), and ``tests/mcp_servers/probe_server.py`` (built with
the SDK) over stdio and streamable HTTP: calls, errors, timeouts, cancels, a server killed
mid-call and the reconnect after it, concurrency on one session, and no process left behind."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from mcp import types

from durable_agent.activities.mcp import session as mcp_session
from durable_agent.activities.mcp.connection import (
    McpCallResult,
    McpCrashed,
    McpServer,
    McpUnavailable,
)
from durable_agent.activities.mcp.model_text import render_result, tool_info
from durable_agent.config import ConfigError, McpServerConfig

BIN = Path(sys.executable).parent
PROBE = Path(__file__).parent / "mcp_servers" / "probe_server.py"
WAIT = 15.0  # the most any awaited condition may take before the test fails


def probe_stdio(**extra: Any) -> McpServerConfig:
    return McpServerConfig(command=sys.executable, args=(str(PROBE),), **extra)


def python_c(code: str, **extra: Any) -> McpServerConfig:
    """A stdio "server" that is only this bit of Python (never an MCP server)."""
    return McpServerConfig(command=sys.executable, args=("-c", code), **extra)


def gone(pid: int) -> bool:
    """No such process, not even a zombie waiting to be reaped."""
    return not Path(f"/proc/{pid}").exists()


def children() -> set[int]:
    """The pids of this process's children."""
    found: set[int] = set()
    for task in Path("/proc/self/task").iterdir():
        found.update(int(pid) for pid in (task / "children").read_text().split())
    return found


async def until(condition: Callable[[], Awaitable[bool]], what: str) -> None:
    """Wait until ``condition()`` holds (checked every 20 ms), at most ``WAIT`` seconds."""
    try:
        async with asyncio.timeout(WAIT):
            while not await condition():
                await asyncio.sleep(0.02)
    except TimeoutError:
        raise AssertionError(f"not within {WAIT} s: {what}") from None


async def counts(server: McpServer) -> dict[str, int]:
    result = await server.call_tool("counts", {})
    assert not result.is_error, result.text
    parsed: dict[str, int] = json.loads(result.text)
    return parsed


async def pid_of(server: McpServer) -> int:
    result = await server.call_tool("pid", {})
    assert not result.is_error, result.text
    return int(result.text)


class LogWatch(logging.Handler):
    """The ``durable_agent.mcp`` log, with a way to await a line."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []
        self._changed = asyncio.Event()

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())
        self._changed.set()

    async def wait_for(self, text: str) -> str:
        async with asyncio.timeout(WAIT):
            while True:
                for line in self.lines:
                    if text in line:
                        return line
                self._changed.clear()
                await self._changed.wait()


@pytest.fixture
def mcp_log() -> Iterator[LogWatch]:
    logger = logging.getLogger("durable_agent.mcp")
    watch = LogWatch()
    logger.addHandler(watch)
    level = logger.level
    logger.setLevel(logging.DEBUG)
    try:
        yield watch
    finally:
        logger.removeHandler(watch)
        logger.setLevel(level)


class HttpProbe:
    """``probe_server.py --port`` in a process of its own."""

    def __init__(self, process: asyncio.subprocess.Process, port: int) -> None:
        self.process = process
        self.port = port
        self.url = f"http://127.0.0.1:{port}/mcp"

    @classmethod
    async def start(cls, port: int = 0) -> HttpProbe:
        process = await asyncio.create_subprocess_exec(
            sys.executable, str(PROBE), "--port", str(port), stdout=asyncio.subprocess.PIPE
        )
        assert process.stdout is not None
        async with asyncio.timeout(WAIT):
            line = (await process.stdout.readline()).decode()
        assert line.startswith("listening "), line
        return cls(process, int(line.split()[1]))

    async def stop(self) -> None:
        if self.process.returncode is None:
            self.process.kill()
        await self.process.wait()


@pytest.fixture(scope="module")
async def http_probe() -> AsyncIterator[HttpProbe]:
    probe = await HttpProbe.start()
    try:
        yield probe
    finally:
        await probe.stop()


@pytest.fixture
async def servers() -> AsyncIterator[list[McpServer]]:
    """Servers a test makes: closed after it, whatever happened."""
    made: list[McpServer] = []
    yield made
    for server in made:
        await server.aclose()


@pytest.fixture(params=["stdio", "http"])
async def probe(
    request: pytest.FixtureRequest, servers: list[McpServer], http_probe: HttpProbe
) -> Callable[..., McpServer]:
    """A factory of ``McpServer``s for the probe server, over each transport in turn."""
    transport = request.param

    def make(**extra: Any) -> McpServer:
        if transport == "stdio":
            config = probe_stdio(**extra)
        else:
            config = McpServerConfig(url=http_probe.url, **extra)
        server = McpServer(f"probe_{transport}", config)
        servers.append(server)
        return server

    return make


# --- servers nobody here wrote ----------------------------------------------------------


async def test_time_server_lists_and_calls_its_tools(servers: list[McpServer]) -> None:
    server = McpServer("time", McpServerConfig(command=str(BIN / "mcp-server-time")))
    servers.append(server)
    tools = {tool.name: tool for tool in await server.list_tools()}
    assert {"get_current_time", "convert_time"} <= set(tools)
    now = tools["get_current_time"]
    assert now.read_only is True and now.idempotent is True
    assert now.input_schema["type"] == "object" and "timezone" in now.input_schema["properties"]
    assert now.description

    result = await server.call_tool("get_current_time", {"timezone": "UTC"})
    assert not result.is_error, result.text
    assert json.loads(result.text)["timezone"] == "UTC"

    wrong = await server.call_tool("get_current_time", {"timezone": "Nowhere/Atlantis"})
    assert wrong.is_error
    assert "Invalid timezone" in wrong.text and "Nowhere/Atlantis" in wrong.text
    assert server.available and server.problem is None

    # an unknown tool is a JSON-RPC error (-32602), which comes back as an error result
    unknown = await server.call_tool("no_such_tool", {})
    assert unknown == McpCallResult("Unknown tool: no_such_tool", is_error=True)


async def test_git_server_on_a_temporary_repository(tmp_path: Path, servers: list[McpServer]) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@x"}
    env |= {"GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@x"}
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    (repo / "notes.txt").write_text("first\n")
    subprocess.run(["git", "-C", str(repo), "add", "."], check=True, env=env)
    subprocess.run(["git", "-C", str(repo), "commit", "-qm", "the first note"], check=True, env=env)
    (repo / "notes.txt").write_text("first\nsecond\n")

    config = McpServerConfig(command=str(BIN / "mcp-server-git"), args=("--repository", str(repo)))
    server = McpServer("git", config)
    servers.append(server)
    names = {tool.name for tool in await server.list_tools()}
    assert {"git_status", "git_log", "git_diff_unstaged"} <= names

    status = await server.call_tool("git_status", {"repo_path": str(repo)})
    assert not status.is_error and "notes.txt" in status.text
    log = await server.call_tool("git_log", {"repo_path": str(repo)})
    assert not log.is_error and "the first note" in log.text
    outside = await server.call_tool("git_status", {"repo_path": str(tmp_path)})
    assert outside.is_error and "outside the allowed repository" in outside.text


# --- the probe server, over stdio and streamable HTTP ---------------------------------------


async def test_calls_results_and_errors(probe: Callable[..., McpServer]) -> None:
    server = probe()
    tools = {tool.name: tool for tool in await server.list_tools()}
    assert tools["echo"].read_only is True and tools["pid"].read_only is None
    assert tools["pid"].input_schema["type"] == "object"

    assert await server.call_tool("echo", {"text": "héllo"}) == McpCallResult("héllo", is_error=False)
    failed = await server.call_tool("fail", {"message": "the disk is on fire"})
    assert failed.is_error and "the disk is on fire" in failed.text
    # arguments the server's schema refuses: an error result, not an exception
    bad = await server.call_tool("echo", {"text": 3, "extra": True})
    assert bad.is_error
    assert server.available


async def test_five_concurrent_calls_share_one_session(probe: Callable[..., McpServer]) -> None:
    server = probe()
    before = await pid_of(server)
    # the barrier opens only with all five calls in it at once: calls one by one would hang
    results = await asyncio.gather(*(server.call_tool("barrier", {"parties": 5}) for _ in range(5)))
    assert [r.text for r in results] == ["through"] * 5
    assert await pid_of(server) == before


async def test_a_call_that_times_out_is_an_error_and_cancelled_at_the_server(
    probe: Callable[..., McpServer],
) -> None:
    server = probe(timeout_seconds=0.5)
    start = await counts(server)
    result = await server.call_tool("sleep", {"seconds": 30})
    assert result == McpCallResult("timed out after 0.5 s", is_error=True)

    async def cancelled() -> bool:
        return (await counts(server))["cancelled"] > start["cancelled"]

    await until(cancelled, "the server cancels the call")
    assert server.available
    assert (await server.call_tool("echo", {"text": "still here"})).text == "still here"


async def test_cancelling_the_caller_cancels_the_call(probe: Callable[..., McpServer]) -> None:
    server = probe()
    start = await counts(server)
    call = asyncio.create_task(server.call_tool("sleep", {"seconds": 30}))

    async def started() -> bool:
        return (await counts(server))["started"] > start["started"]

    await until(started, "the call reaches the server")
    call.cancel()
    with pytest.raises(asyncio.CancelledError):
        await call

    async def cancelled() -> bool:
        return (await counts(server))["cancelled"] > start["cancelled"]

    await until(cancelled, "the server cancels the call")
    assert server.available


# --- stdio: the process ------------------------------------------------------------------


async def test_a_killed_server_crashes_the_call_and_the_next_call_starts_a_fresh_one(
    mcp_log: LogWatch, servers: list[McpServer], capfd: pytest.CaptureFixture[str]
) -> None:
    server = McpServer("probe", probe_stdio())
    bystander = McpServer("bystander", probe_stdio())
    servers += [server, bystander]
    first, other = await asyncio.gather(pid_of(server), pid_of(bystander))

    call = asyncio.create_task(server.call_tool("sleep", {"seconds": 30}))
    # the server's stderr arrives in the worker's log, prefixed with its name
    assert await mcp_log.wait_for("[probe] sleep started") == "[probe] sleep started (1)"
    os.kill(first, signal.SIGKILL)
    with pytest.raises(McpCrashed, match="connection lost"):
        await call
    assert not server.available
    assert server.problem is not None and "the server process ended" in server.problem
    assert gone(first)  # reaped, not a zombie

    second = await pid_of(server)
    assert second != first
    assert server.available and server.problem is None
    # one server's death is not another's
    assert await pid_of(bystander) == other and bystander.available

    out, err = capfd.readouterr()
    assert "sleep started" not in out and "sleep started" not in err


async def test_aclose_leaves_no_process_behind(servers: list[McpServer]) -> None:
    time_server = McpServer("time", McpServerConfig(command=str(BIN / "mcp-server-time")))
    probe = McpServer("probe", probe_stdio())
    servers += [time_server, probe]
    before = children()
    _, pid = await asyncio.gather(time_server.list_tools(), pid_of(probe))
    assert len(children() - before) == 2 and pid in children()
    await asyncio.gather(time_server.aclose(), probe.aclose())
    assert children() <= before and gone(pid)
    with pytest.raises(McpUnavailable, match="closed"):
        await probe.call_tool("pid", {})
    assert not [t for t in asyncio.all_tasks() if t.get_name().startswith("mcp ")]


async def test_a_command_that_does_not_exist_is_unavailable(servers: list[McpServer]) -> None:
    server = McpServer("ghost", McpServerConfig(command="/nonexistent/mcp-server-ghost"))
    servers.append(server)
    assert server.available  # nothing is known against it yet
    with pytest.raises(McpUnavailable) as raised:
        await server.list_tools()
    assert str(raised.value) == "could not start '/nonexistent/mcp-server-ghost': No such file or directory"
    assert not server.available and server.problem == str(raised.value)
    with pytest.raises(McpUnavailable):
        await server.call_tool("anything", {})


async def test_a_server_that_exits_while_starting_says_why(servers: list[McpServer]) -> None:
    code = "import os, sys; print('bad token', os.environ['TOKEN'], file=sys.stderr); sys.exit(2)"
    config = python_c(code, env={"TOKEN": "PROBE_TOKEN_SOURCE"})
    server = McpServer("broken", config, environ={"PROBE_TOKEN_SOURCE": "hunter2-secret"})
    servers.append(server)
    with pytest.raises(McpUnavailable) as raised:
        await server.list_tools()
    message = str(raised.value)
    assert "closed the connection while starting" in message and "bad token ***" in message
    assert "hunter2" not in message and "hunter2" not in (server.problem or "")


async def test_a_server_that_never_answers_times_out_connecting(servers: list[McpServer]) -> None:
    # reads its stdin until it closes, and never answers
    server = McpServer("mute", python_c("import sys; sys.stdin.read()", connect_timeout_seconds=0.5))
    servers.append(server)
    before = children()
    with pytest.raises(McpUnavailable, match=r"^no answer within 0\.5 s$"):
        await server.call_tool("anything", {})
    assert children() <= before


async def test_the_server_gets_its_env_and_not_the_workers(
    servers: list[McpServer], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("WORKER_ONLY_SECRET", "not for servers")
    environ = {"PROBE_SOURCE": "given value"}
    server = McpServer("probe", probe_stdio(env={"PROBE_GIVEN": "PROBE_SOURCE"}), environ=environ)
    servers.append(server)
    assert (await server.call_tool("env", {"name": "PROBE_GIVEN"})).text == "given value"
    assert (await server.call_tool("env", {"name": "WORKER_ONLY_SECRET"})).text == "(unset)"
    assert (await server.call_tool("env", {"name": "PATH"})).text == os.environ["PATH"]


def test_a_missing_variable_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match=r"\[mcp\.db\] env\.DB_TOKEN .* MISSING_DB_TOKEN") as raised:
        McpServer("db", probe_stdio(env={"DB_TOKEN": "MISSING_DB_TOKEN"}), environ={})
    assert "hunter2" not in str(raised.value)
    config = McpServerConfig(url="http://127.0.0.1:1/mcp", headers={"Authorization": "MISSING_AUTH"})
    with pytest.raises(ConfigError, match=r"\[mcp\.api\] headers\.Authorization .* MISSING_AUTH"):
        McpServer("api", config, environ={"OTHER": "x"})


# --- streamable HTTP -------------------------------------------------------------------


async def test_http_headers_come_from_their_variables(
    http_probe: HttpProbe, servers: list[McpServer]
) -> None:
    config = McpServerConfig(url=http_probe.url, headers={"Authorization": "PROBE_AUTH"})
    server = McpServer("web", config, environ={"PROBE_AUTH": "Bearer tok-123"})
    servers.append(server)
    assert (await server.call_tool("whoami", {})).text == "Bearer tok-123"


async def test_an_http_server_that_is_not_there_is_unavailable(servers: list[McpServer]) -> None:
    probe = await HttpProbe.start()
    await probe.stop()  # a port nobody listens on now
    server = McpServer("web", McpServerConfig(url=probe.url, connect_timeout_seconds=5))
    servers.append(server)
    with pytest.raises(McpUnavailable, match="ConnectError"):
        await server.list_tools()
    assert not server.available


async def test_an_http_server_that_dies_mid_call_crashes_it_and_is_reached_again_later(
    servers: list[McpServer],
) -> None:
    probe = await HttpProbe.start()
    try:
        server = McpServer("web", McpServerConfig(url=probe.url, connect_timeout_seconds=5))
        servers.append(server)
        assert (await server.call_tool("echo", {"text": "up"})).text == "up"
        with pytest.raises(McpCrashed):
            await server.call_tool("die", {})
        assert not server.available
        with pytest.raises(McpUnavailable):
            await server.call_tool("echo", {"text": "down"})
        await probe.stop()
        probe = await HttpProbe.start(probe.port)  # back, on the same address
        assert (await server.call_tool("echo", {"text": "up again"})).text == "up again"
        assert server.available
    finally:
        await probe.stop()


async def test_an_http_server_that_forgot_the_session_gets_a_new_one(
    servers: list[McpServer], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A 2025-era server keeps sessions; after its restart it answers the old session's id with
    404, which refused the call before it ran: the call goes again, on a new session."""
    monkeypatch.setattr(mcp_session, "CONNECT_MODE", "legacy")
    probe = await HttpProbe.start()
    try:
        server = McpServer("web", McpServerConfig(url=probe.url, connect_timeout_seconds=5))
        servers.append(server)
        assert (await server.call_tool("echo", {"text": "one"})).text == "one"
        await probe.stop()
        probe = await HttpProbe.start(probe.port)
        assert (await server.call_tool("echo", {"text": "two"})).text == "two"
        await probe.stop()
        probe = await HttpProbe.start(probe.port)
        assert "echo" in {tool.name for tool in await server.list_tools()}
        assert server.available
    finally:
        await probe.stop()


# --- rendering ---------------------------------------------------------------------------


def test_results_render_as_text_for_the_model() -> None:
    blocks: list[types.ContentBlock] = [
        types.TextContent(text="first"),
        types.ImageContent(data="iVBORw0KGgo=", mime_type="image/png"),
        types.AudioContent(data="AAAA", mime_type="audio/wav"),
        types.EmbeddedResource(resource=types.TextResourceContents(uri="file:///notes.txt", text="a note")),
        types.EmbeddedResource(resource=types.BlobResourceContents(uri="file:///x.bin", blob="AAE=")),
        types.ResourceLink(uri="file:///big.log", name="big.log"),
    ]
    text = render_result(types.CallToolResult(content=blocks))
    assert text.split("\n") == [
        "first",
        "[image image/png, 8 bytes]",
        "[audio audio/wav, 3 bytes]",
        "[resource file:///notes.txt]",
        "a note",
        "[resource file:///x.bin, application/octet-stream, 2 bytes]",
        "file:///big.log",
    ]
    structured = types.CallToolResult(content=[], structured_content={"b": [1, 2], "a": "é"})
    assert render_result(structured) == '{"a":"é","b":[1,2]}'
    assert render_result(types.CallToolResult(content=[])) == ""


def test_a_tool_without_a_schema_type_gets_an_object_schema() -> None:
    info = tool_info(types.Tool(name="t", input_schema={}))
    assert info.input_schema == {"type": "object"} and info.description == ""
    assert info.read_only is None and info.idempotent is None
