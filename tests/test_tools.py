"""The coding tools: behaviour, limits, escapes, repeats, and bash's process handling."""

from __future__ import annotations

import asyncio
import os
import stat
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from temporalio import activity
from temporalio.client import Client

from durable_agent.activities import AgentActivities
from durable_agent.activities.tools import Tool, ToolFailure, builtin_tools, tree_walk
from durable_agent.activities.tools import process as tools_process
from durable_agent.activities.tools import search as tools_search
from durable_agent.activities.tools.tool import text_of
from durable_agent.client import run_result
from durable_agent.config import SandboxConfig
from durable_agent.core.builtin_catalog import BUILTIN_TOOLS
from durable_agent.core.models import ToolResultBlock
from durable_agent.core.tool_args import (
    BASH_OUTPUT_HEAD_BYTES,
    BASH_OUTPUT_TAIL_BYTES,
    GREP_MAX_LINE_CHARS,
    READ_MAX_BYTES,
    READ_MAX_LINE_CHARS,
)
from durable_agent.core.tool_specs import ToolCallError, permission_target, validate_args
from tests.helpers import RecordingSink, final, running_worker, scripted_config, start, tool_call, until
from tests.test_sandbox import marker, processes_with

TOOLS = builtin_tools()
# The process-group tests below follow the shell's pids, which a sandbox's own PID
# namespace renumbers; tests/test_sandbox.py has the sandboxed counterparts.
UNSANDBOXED = builtin_tools(SandboxConfig(kind="none"))


async def run(ws: Path, name: str, *, tools: dict[str, Tool] = TOOLS, **args: Any) -> str:
    """Validate like the activity does, then run the tool."""
    return text_of(await tools[name].run(validate_args(tools[name].spec, args), ws))


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    """A workspace with a folder, a secret file beside it and links leading out."""
    workspace = tmp_path / "ws"
    (workspace / "src").mkdir(parents=True)
    (workspace / "src" / "app.py").write_text("def main():\n    return 1\n")
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_text("TOP SECRET token\n")
    os.symlink(outside, workspace / "linkdir")
    os.symlink(outside / "secret.txt", workspace / "linkfile")
    os.symlink(outside / "new.txt", workspace / "dangling")
    return workspace


def alive(pid: int) -> bool:
    """Whether ``pid`` still runs; an exited process not yet reaped by its parent does not."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except OSError:
        return False
    return state not in ("Z", "X")


async def gone(pid: int, within: float = 3.0) -> bool:
    """True once process ``pid`` has ended; fails after ``within`` seconds."""
    return await until(f"process {pid} to end", lambda: not alive(pid), within)


# --- schemas and validation ---------------------------------------------------


def test_all_the_tools_are_built_in_with_clean_schemas() -> None:
    assert sorted(TOOLS) == [
        "apply_patch",
        "bash",
        "edit",
        "glob",
        "grep",
        "ls",
        "multi_edit",
        "read",
        "todo_write",  # answered by the workflow itself (tests/test_todo_write.py)
        "web_fetch",
        "write",
    ]
    for name, tool in TOOLS.items():
        schema = tool.spec.offer().definition.input_schema
        assert "title" not in schema and "description" not in schema, name
        assert schema.get("additionalProperties") is False, name


@pytest.mark.parametrize(
    ("name", "args", "message"),
    [
        ("write", {"file_path": "a", "content": "x", "mode": "w"}, "mode: Extra inputs"),
        ("write", {"file_path": "a"}, "content: Field required"),
        ("edit", {"file_path": "a", "old_string": "x", "new_string": "x"}, "the edit would change nothing"),
        ("edit", {"file_path": "a", "old_string": "", "new_string": "x"}, "old_string"),
        ("grep", {"pattern": "(unclosed"}, "invalid regular expression"),
        ("glob", {"pattern": ""}, "pattern"),
        ("bash", {"command": "true", "timeout_seconds": 601}, "timeout_seconds"),
        ("bash", {"command": "true", "timeout_seconds": 0}, "timeout_seconds"),
        ("bash", {"cmd": "true"}, "command: Field required"),
    ],
)
def test_invalid_input_is_a_tool_error(name: str, args: dict[str, Any], message: str) -> None:
    with pytest.raises(ToolCallError, match=message):
        validate_args(BUILTIN_TOOLS[name], args)


def test_permission_targets_normalise_paths_but_not_commands_or_regexes() -> None:
    offers = {name: spec.offer() for name, spec in BUILTIN_TOOLS.items()}
    assert permission_target(offers["write"], {"file_path": "./src/../src/a.py"}) == "src/a.py"
    assert permission_target(offers["edit"], {"file_path": "/repo/src/a.py"}, "/repo") == "src/a.py"
    assert permission_target(offers["edit"], {"file_path": "/repo"}, "/repo") == "."
    assert permission_target(offers["edit"], {"file_path": "/repository/a.py"}, "/repo") == "/repository/a.py"
    assert permission_target(offers["read"], {"file_path": "/etc/passwd"}, "/repo") == "/etc/passwd"
    assert permission_target(offers["glob"], {"pattern": "./src/**/*.py"}) == "src/**/*.py"
    assert permission_target(offers["bash"], {"command": "ls src/ && cd a/../b"}) == "ls src/ && cd a/../b"
    assert permission_target(offers["grep"], {"pattern": "a//b/"}) == "a//b/"


# --- read and ls --------------------------------------------------------------


async def test_read_pages_past_the_byte_cap_and_cuts_long_lines(ws: Path) -> None:
    line = "z" * 99
    count = READ_MAX_BYTES // 100 * 3
    (ws / "big.txt").write_text((line + "\n") * count)
    first = await run(ws, "read", file_path="big.txt")
    assert len(first.encode()) < READ_MAX_BYTES + 500
    note = first.splitlines()[-1]
    assert note.startswith(f"[output cut at {READ_MAX_BYTES} bytes;")
    shown = len(first.splitlines()) - 1
    assert f"{count - shown} more lines; use offset={shown} to read on" in note
    # the rest of the file is reachable, beyond the first cap
    last = await run(ws, "read", file_path="big.txt", offset=count - 2)
    assert last.splitlines() == [f"{count - 1:>6}\t{line}", f"{count:>6}\t{line}"]
    (ws / "wide.txt").write_text("a\n" + "b" * (READ_MAX_LINE_CHARS * 10) + "\nc\n")
    wide = (await run(ws, "read", file_path="wide.txt")).splitlines()
    assert wide[1].endswith(f"[… line cut at {READ_MAX_LINE_CHARS} characters]")
    assert wide[2] == "     3\tc" and "1 line(s) longer than" in wide[3]


async def test_read_edges(ws: Path) -> None:
    (ws / "empty.txt").write_text("")
    assert await run(ws, "read", file_path="empty.txt") == "[empty.txt is empty]"
    assert "offset 9 is past the end" in await run(ws, "read", file_path="src/app.py", offset=9)
    (ws / "crlf.txt").write_bytes(b"one\r\ntwo\r\n")
    assert await run(ws, "read", file_path="crlf.txt") == "     1\tone\n     2\ttwo"
    os.mkfifo(ws / "pipe")
    with pytest.raises(ToolFailure, match="not a regular file"):
        await asyncio.wait_for(run(ws, "read", file_path="pipe"), 5)
    with pytest.raises(ToolFailure, match="does not exist"):
        await run(ws, "read", file_path="nope.txt")


async def test_ls_is_bounded(ws: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for i in range(5):
        (ws / "src" / f"m{i}.py").write_text("")
    monkeypatch.setattr("durable_agent.activities.tools.fs.LS_MAX_ENTRIES", 3)
    out = (await run(ws, "ls", path="src")).splitlines()
    shown = ["file  app.py  (25 bytes)", "file  m0.py  (0 bytes)", "file  m1.py  (0 bytes)"]
    assert out == [*shown, "[3 more entries not shown]"]


# --- write ------------------------------------------------------------------------


async def test_write_creates_replaces_and_repeats(ws: Path) -> None:
    out = await run(ws, "write", file_path="new/deep/f.txt", content="héllo\n")
    assert out == "created new/deep/f.txt (7 bytes written)"
    assert (ws / "new/deep/f.txt").read_text() == "héllo\n"
    os.chmod(ws / "new/deep/f.txt", 0o754)
    out = await run(ws, "write", file_path="new/deep/f.txt", content="bye\n")
    assert out == "replaced new/deep/f.txt (4 bytes written; it had 7 bytes)"
    assert stat.S_IMODE((ws / "new/deep/f.txt").stat().st_mode) == 0o754  # permissions kept
    # a repeat (Temporal retried the activity) changes nothing and says so
    assert "already had this content (4 bytes); nothing changed" in await run(
        ws, "write", file_path="new/deep/f.txt", content="bye\n"
    )
    assert sorted(os.listdir(ws / "new/deep")) == ["f.txt"]  # no temporary file left
    with pytest.raises(ToolFailure, match="is a folder"):
        await run(ws, "write", file_path="src", content="x")
    with pytest.raises(ToolFailure, match="part of its folder path is a file"):
        await run(ws, "write", file_path="src/app.py/x.txt", content="x")


# --- edit ---------------------------------------------------------------------------


async def test_edit_replaces_one_occurrence_and_shows_where(ws: Path) -> None:
    out = await run(ws, "edit", file_path="src/app.py", old_string="return 1", new_string="return 2")
    assert out.splitlines()[0] == "edited src/app.py: replaced 1 occurrence (first at line 2)"
    assert "     2\t    return 2" in out
    assert (ws / "src/app.py").read_text() == "def main():\n    return 2\n"


async def test_edit_refuses_missing_and_ambiguous_text(ws: Path) -> None:
    (ws / "f.py").write_text("x = 1\ny = 1\nz = 1\n")
    with pytest.raises(ToolFailure, match=r"old_string was not found in f\.py"):
        await run(ws, "edit", file_path="f.py", old_string="w = 1", new_string="w = 2")
    with pytest.raises(ToolFailure, match=r"occurs 3 times in f\.py \(lines 1, 2, 3\).*replace_all"):
        await run(ws, "edit", file_path="f.py", old_string="= 1", new_string="= 2")
    assert (ws / "f.py").read_text() == "x = 1\ny = 1\nz = 1\n"
    out = await run(ws, "edit", file_path="f.py", old_string="= 1", new_string="= 2", replace_all=True)
    assert "replaced 3 occurrences" in out
    assert (ws / "f.py").read_text() == "x = 2\ny = 2\nz = 2\n"
    (ws / "bin.dat").write_bytes(b"\0\1abc")
    with pytest.raises(ToolFailure, match="binary file"):
        await run(ws, "edit", file_path="bin.dat", old_string="abc", new_string="d")
    (ws / "latin.txt").write_bytes("café".encode("latin-1"))
    with pytest.raises(ToolFailure, match="not UTF-8 text"):
        await run(ws, "edit", file_path="latin.txt", old_string="caf", new_string="tea")


@pytest.mark.parametrize(
    ("old", "new", "replace_all"),
    [
        ("return 1", "return 2", False),
        ("main", "main_entry", False),  # new_string contains old_string: must not apply twice
        ("1", "11", True),
    ],
)
async def test_a_repeated_edit_reports_already_applied(
    ws: Path, old: str, new: str, replace_all: bool
) -> None:
    args: dict[str, Any] = {
        "file_path": "src/app.py",
        "old_string": old,
        "new_string": new,
        "replace_all": replace_all,
    }
    first = await run(ws, "edit", **args)
    after = (ws / "src/app.py").read_text()
    assert first.startswith("edited")
    again = await run(ws, "edit", **args)
    assert again.startswith("already applied") and "nothing changed" in again
    assert (ws / "src/app.py").read_text() == after


async def test_edit_matches_windows_line_ends(ws: Path) -> None:
    (ws / "w.txt").write_bytes(b"a\r\nb\r\nc\r\n")
    await run(ws, "edit", file_path="w.txt", old_string="a\nb", new_string="a\nB")
    assert (ws / "w.txt").read_bytes() == b"a\r\nB\r\nc\r\n"


# --- confinement ---------------------------------------------------------------------

ESCAPES = [
    ("read", {"file_path": "../outside/secret.txt"}),
    ("read", {"file_path": "linkfile"}),
    ("read", {"file_path": "linkdir/secret.txt"}),
    ("read", {"file_path": "src/../../outside/secret.txt"}),
    ("ls", {"path": "linkdir"}),
    ("ls", {"path": ".."}),
    ("write", {"file_path": "../outside/x.txt", "content": "x"}),
    ("write", {"file_path": "linkdir/new.txt", "content": "x"}),  # a linked parent folder
    ("write", {"file_path": "linkdir/sub/new.txt", "content": "x"}),
    ("write", {"file_path": "linkfile", "content": "x"}),
    ("write", {"file_path": "dangling", "content": "x"}),  # a link to a file not there yet
    ("edit", {"file_path": "linkfile", "old_string": "TOP", "new_string": "x"}),
    ("edit", {"file_path": "linkdir/secret.txt", "old_string": "TOP", "new_string": "x"}),
    ("glob", {"pattern": "../outside/*"}),
    ("glob", {"pattern": "linkdir/*"}),
    ("grep", {"pattern": "SECRET", "path": "linkdir"}),
    ("grep", {"pattern": "SECRET", "path": "linkfile"}),
    ("grep", {"pattern": "SECRET", "path": ".."}),
]


@pytest.mark.parametrize(("name", "args"), ESCAPES)
async def test_every_escape_is_refused(ws: Path, name: str, args: dict[str, Any]) -> None:
    with pytest.raises(ToolFailure, match="outside the workspace"):
        await run(ws, name, **args)
    outside = ws.parent / "outside"
    assert sorted(os.listdir(outside)) == ["secret.txt"]
    assert (outside / "secret.txt").read_text() == "TOP SECRET token\n"


@pytest.mark.parametrize("name", ["read", "ls", "write", "glob", "grep"])
async def test_absolute_paths_outside_are_refused(ws: Path, name: str) -> None:
    target = str(ws.parent / "outside" / ("secret.txt" if name != "glob" else "*"))
    args: dict[str, Any] = {
        "read": {"file_path": target},
        "ls": {"path": str(ws.parent / "outside")},
        "write": {"file_path": target, "content": "x"},
        "glob": {"pattern": target},
        "grep": {"pattern": "x", "path": target},
    }[name]
    with pytest.raises(ToolFailure, match="outside the workspace"):
        await run(ws, name, **args)


async def test_links_inside_the_workspace_still_work(ws: Path) -> None:
    os.symlink("src/app.py", ws / "inner-link")
    assert "def main" in await run(ws, "read", file_path="inner-link")
    assert "def main" in await run(ws, "read", file_path=str(ws / "src" / "app.py"))  # absolute, inside


# --- glob -------------------------------------------------------------------------------


async def test_glob_matches_sorted_relative_paths(ws: Path) -> None:
    for name in ("src/b.py", "src/a.ts", "src/pkg/c.py", "src/pkg/d.tsx", "README.md", ".git/config"):
        (ws / name).parent.mkdir(parents=True, exist_ok=True)
        (ws / name).write_text("")
    assert (await run(ws, "glob", pattern="**/*.py")).splitlines() == [
        "src/app.py",
        "src/b.py",
        "src/pkg/c.py",
    ]
    assert (await run(ws, "glob", pattern="src/*.py")).splitlines() == ["src/app.py", "src/b.py"]
    assert (await run(ws, "glob", pattern="src/**/*.{ts,tsx}")).splitlines() == ["src/a.ts", "src/pkg/d.tsx"]
    assert (await run(ws, "glob", pattern="src/[ab].*")).splitlines() == ["src/a.ts", "src/b.py"]
    assert (await run(ws, "glob", pattern="src/*/")).splitlines() == ["src/pkg/"]
    assert await run(ws, "glob", pattern="README.md") == "README.md"
    assert await run(ws, "glob", pattern=str(ws / "src" / "b.py")) == "src/b.py"
    assert (await run(ws, "glob", pattern="*.nothing")).startswith("no paths match")
    # .git is not searched; links out of the workspace are neither listed nor entered
    everything = (await run(ws, "glob", pattern="**")).splitlines()
    assert ".git/" in everything and ".git/config" not in everything
    assert not any(p.startswith(("linkdir", "linkfile", "dangling")) for p in everything)
    assert not any("secret" in p for p in everything)


async def test_glob_is_bounded(ws: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for i in range(12):
        (ws / f"f{i:02}.txt").write_text("")
    monkeypatch.setattr(tools_search, "GLOB_MAX_RESULTS", 10)
    out = (await run(ws, "glob", pattern="*.txt")).splitlines()
    assert out[:10] == [f"f{i:02}.txt" for i in range(10)]
    assert out[10] == "[2 more paths not shown; narrow the pattern]"
    monkeypatch.setattr(tree_walk, "WALK_MAX_ENTRIES", 5)
    assert "search stopped after 5 entries" in await run(ws, "glob", pattern="**/*.txt")


# --- grep -------------------------------------------------------------------------------


async def test_grep_reports_file_line_and_text(ws: Path) -> None:
    (ws / "src/util.py").write_text("import os\n\ndef Main_helper():\n    return os.sep\n")
    (ws / "notes.md").write_text("main idea\n")
    (ws / "src/blob.bin").write_bytes(b"\0main\0")
    out = await run(ws, "grep", pattern=r"def \w+\(")
    assert out.splitlines() == [
        "src/app.py:1: def main():",
        "src/util.py:3: def Main_helper():",
        "[skipped 1 binary file(s)]",
    ]
    out = await run(ws, "grep", pattern="main", case_insensitive=True, glob="*.py")
    assert out.splitlines() == ["src/app.py:1: def main():", "src/util.py:3: def Main_helper():"]
    assert (await run(ws, "grep", pattern="main", glob="src/**")).splitlines()[
        0
    ] == "src/app.py:1: def main():"
    assert (await run(ws, "grep", pattern="main", path="notes.md")) == "notes.md:1: main idea"
    assert (await run(ws, "grep", pattern="main", path="src", glob="*.md")).startswith("no matches")
    with pytest.raises(ToolFailure, match="does not exist"):
        await run(ws, "grep", pattern="x", path="nowhere")


async def test_grep_never_reads_outside_through_links(ws: Path) -> None:
    out = await run(ws, "grep", pattern="SECRET")
    assert out.startswith("no matches") and "TOP" not in out


async def test_grep_is_bounded(ws: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (ws / "many.txt").write_text("hit\n" * 50 + "x" * 1000 + " hit\n")
    monkeypatch.setattr(tools_search, "GREP_MAX_MATCHES", 10)
    out = (await run(ws, "grep", pattern="hit")).splitlines()
    assert len(out) == 11 and out[-1].startswith("[stopped at 10 matches")
    monkeypatch.setattr(tools_search, "GREP_MAX_MATCHES", 100)
    long_line = (await run(ws, "grep", pattern="x hit")).splitlines()[0]
    assert long_line == "many.txt:51: " + "x" * GREP_MAX_LINE_CHARS + " [… line cut]"
    monkeypatch.setattr(tools_search, "GREP_MAX_FILE_BYTES", 100)
    assert "[skipped 1 file(s) over 100 bytes]" in await run(ws, "grep", pattern="hit", path="many.txt")
    os.mkfifo(ws / "pipe")  # skipped, not waited on
    assert (await asyncio.wait_for(run(ws, "grep", pattern="nothing-here"), 5)).startswith("no matches")


# --- bash ---------------------------------------------------------------------------------


async def test_bash_reports_output_and_exit_code(ws: Path) -> None:
    out = await run(ws, "bash", command="pwd; echo to-stderr >&2; cat; exit 3")
    # stdin is /dev/null: cat ends at once; stderr comes with stdout
    assert out.splitlines() == [str(ws.resolve()), "to-stderr", "[exit code 3]"]
    assert await run(ws, "bash", command="true") == "(no output)\n[exit code 0]"
    killed = await run(ws, "bash", command="kill -SEGV $$", tools=UNSANDBOXED)
    assert killed.endswith("[killed by signal SIGSEGV]")


async def test_bash_environment_carries_no_worker_secret(ws: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AGENT_FAKE_API_KEY", "sk-do-not-leak")
    monkeypatch.setenv("LC_ALL", "C.UTF-8")
    out = await run(ws, "bash", command="env")
    assert "sk-do-not-leak" not in out and "AGENT_FAKE_API_KEY" not in out
    env = dict(line.split("=", 1) for line in out.splitlines()[:-1] if "=" in line)
    assert env["LC_ALL"] == "C.UTF-8" and env["PATH"] == os.environ["PATH"]
    assert env["HOME"] != os.environ.get("HOME") and not Path(env["HOME"]).exists()  # removed after
    assert env["TMPDIR"].startswith(str(Path(env["HOME"]).parent))
    allowed = {"PATH", "HOME", "TMPDIR", "USER", "SHELL", "TERM", "LANG", "LANGUAGE", "PAGER", "GIT_PAGER"}
    allowed |= {"GIT_TERMINAL_PROMPT", "PWD", "SHLVL", "_"}  # the last three bash sets itself
    assert {k for k in env if not k.startswith("LC_")} <= allowed


async def test_bash_output_keeps_its_start_and_end(ws: Path) -> None:
    total = BASH_OUTPUT_HEAD_BYTES + BASH_OUTPUT_TAIL_BYTES + 50_000
    out = await run(ws, "bash", command=f"echo START; head -c {total} /dev/zero | tr '\\0' x; echo; echo END")
    assert out.startswith("START\n") and out.endswith("END\n[exit code 0]")
    assert (
        f"[… {total + 11 - BASH_OUTPUT_HEAD_BYTES - BASH_OUTPUT_TAIL_BYTES} bytes of output cut here …]"
        in out
    )
    assert len(out) < BASH_OUTPUT_HEAD_BYTES + BASH_OUTPUT_TAIL_BYTES + 200


async def test_bash_timeout_kills_the_whole_process_group(ws: Path) -> None:
    started = time.monotonic()
    with pytest.raises(ToolFailure) as failure:
        await run(
            ws,
            "bash",
            command="sleep 300 & echo $! > child; echo waiting; sleep 300",
            timeout_seconds=1,
            tools=UNSANDBOXED,
        )
    assert time.monotonic() - started < 5
    message = str(failure.value)
    assert message.startswith("command timed out after 1 s") and "waiting" in message
    assert await gone(int((ws / "child").read_text()))


async def test_bash_stops_what_the_command_leaves_running(ws: Path) -> None:
    out = await run(
        ws, "bash", command="sleep 300 > /dev/null 2>&1 & echo $! > child; echo started", tools=UNSANDBOXED
    )
    assert out == "started\n[exit code 0]"
    assert await gone(int((ws / "child").read_text()))
    # a background process holding the output open does not hold the call up either
    started = time.monotonic()
    out = await run(ws, "bash", command="sleep 300 & echo $! > child; echo started", tools=UNSANDBOXED)
    assert out == "started\n[exit code 0]" and time.monotonic() - started < 5
    assert await gone(int((ws / "child").read_text()))


async def test_bash_does_not_wait_for_a_process_that_left_its_group(ws: Path) -> None:
    started = time.monotonic()
    out = await run(ws, "bash", command="setsid sleep 30 & echo $! > child; echo started", tools=UNSANDBOXED)
    child = int((ws / "child").read_text())
    try:
        assert time.monotonic() - started < 5
        assert out.splitlines() == [
            "started",
            "[output still open after the command ended (a process left its group); not read on]",
            "[exit code 0]",
        ]
    finally:
        os.kill(child, 9)  # out of the tool's reach by design: the test cleans up after itself


async def test_bash_cancel_kills_the_whole_process_group(ws: Path) -> None:
    command = "echo $$ > pid; sleep 300 & echo $! > child; wait"
    task = asyncio.create_task(run(ws, "bash", command=command, tools=UNSANDBOXED))
    await until(
        "the background child to start",
        lambda: (ws / "child").exists() and (ws / "child").read_text().strip(),
    )
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    shell = int((ws / "pid").read_text())
    # SIGTERM, then SIGKILL after the grace. (It failed twice under CI, the child left running:
    # the cancel had come while asyncio still connected the pipes; see the next test.)
    within = tools_process.KILL_GRACE_SECONDS + 3
    assert await gone(shell, within) and await gone(int((ws / "child").read_text()), within)
    assert not tools_process.group_alive(shell)


@pytest.mark.parametrize("tools", [UNSANDBOXED, TOOLS], ids=["unsandboxed", "sandboxed"])
async def test_a_cancel_while_the_command_starts_stops_all_it_started(
    ws: Path, tools: dict[str, Tool], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A cancel that lands while asyncio still connects the new process's pipes (slow on a
    loaded machine): asyncio alone would kill that one process, and its children live on."""
    real_exec = asyncio.create_subprocess_exec
    connected = asyncio.Event()

    async def slow_to_connect(*argv: Any, **options: Any) -> asyncio.subprocess.Process:
        proc = await real_exec(*argv, **options)
        await connected.wait()  # the command runs meanwhile, as it would on a busy loop
        return proc

    monkeypatch.setattr(asyncio, "create_subprocess_exec", slow_to_connect)
    mark = marker()  # this test's own child, whatever else runs
    command = f"echo $$ > pid; sleep {mark} & echo $! > child; wait"
    task = asyncio.create_task(run(ws, "bash", command=command, tools=tools))
    await until(
        "the background child to start", lambda: (ws / "child").exists() and (ws / "child").read_text()
    )
    assert not task.done()  # still starting
    task.cancel()
    await asyncio.sleep(0.1)
    connected.set()
    with pytest.raises(asyncio.CancelledError):
        await task
    left = processes_with(mark)  # the child, its shell, and in the sandbox bwrap too
    assert not left, f"left running: {left}"


def test_bash_timeout_fits_inside_the_activity_time_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    """Past the activity's own limit Temporal would retry, running the command again: stop first."""
    now = datetime.now(UTC)
    info = SimpleNamespace(
        started_time=now - timedelta(seconds=20),
        start_to_close_timeout=timedelta(seconds=300),
        schedule_to_close_timeout=None,
        current_attempt_scheduled_time=now,
    )
    monkeypatch.setattr(activity, "in_activity", lambda: True)  # the module the bash tool asks
    monkeypatch.setattr(activity, "info", lambda: info)
    assert tools_process.time_limit(120) == (120, None)
    timeout, note = tools_process.time_limit(600)
    assert timeout == pytest.approx(300 - 20 - tools_process.ACTIVITY_MARGIN_SECONDS, abs=1)
    assert note == "[timeout lowered from 600 s to 270 s: the worker's tool time limit]"


# --- through Temporal -----------------------------------------------------------------


async def test_cancel_while_bash_runs_kills_its_process_group(client: Client, tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    config = scripted_config(
        tmp_path,
        [tool_call("b1", "bash", command="echo $$ > pid; sleep 60"), final("never reached")],
        permissions={"allow": ["bash"]},
        sandbox={"kind": "none"},  # the pid is the worker's; test_sandbox.py cancels a sandboxed one
    )
    async with running_worker(client, AgentActivities(config)) as queue:
        handle = await start(client, queue, ws, "sleep a minute")
        await until(
            "the command to start", lambda: (ws / "pid").exists() and (ws / "pid").read_text().strip(), 10
        )
        shell = int((ws / "pid").read_text())
        assert alive(shell)
        await handle.signal("cancel", "stop the sleep")
        result = await asyncio.wait_for(run_result(client, handle.id), 15)
    assert result.status == "cancelled" and result.error == "stop the sleep"
    assert await gone(shell)
    assert not tools_process.group_alive(shell)  # the shell's process group: sleep included


async def test_a_run_writes_edits_greps_and_runs_bash(client: Client, tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    script = [
        tool_call("w1", "write", file_path="notes/todo.txt", content="buy milk\ncall bob\n"),
        tool_call("e1", "edit", file_path="notes/todo.txt", old_string="call bob", new_string="call alice"),
        tool_call("g1", "grep", pattern="alice|milk", glob="*.txt"),
        tool_call(
            "b1",
            "bash",
            command="python3 -c 'import sys; print(open(sys.argv[1]).read().upper())' notes/todo.txt",
        ),
        tool_call("x1", "bash", command="python3 -c 'raise SystemExit(7)'"),
        final("done"),
    ]
    config = scripted_config(
        tmp_path,
        script,
        permissions={"allow": ["write(notes/*)", "edit(notes/**)", "grep", "bash(python3:*)"]},
    )
    sink = RecordingSink()
    async with running_worker(client, AgentActivities(config, sinks={"local": sink})) as queue:
        result = await (await start(client, queue, ws, "keep my notes")).result()
    assert result.status == "completed" and result.text == "done" and result.tool_calls_count == 5
    assert (ws / "notes/todo.txt").read_text() == "buy milk\ncall alice\n"
    messages = sink.exports[-1].open().logical_resume.messages
    results = {b.tool_use_id: b for m in messages for b in m.content if isinstance(b, ToolResultBlock)}
    assert results["w1"].content == "created notes/todo.txt (18 bytes written)"
    assert results["e1"].content.startswith("edited notes/todo.txt: replaced 1 occurrence (first at line 2)")
    assert results["g1"].content == "notes/todo.txt:1: buy milk\nnotes/todo.txt:2: call alice"
    assert results["b1"].content == "BUY MILK\nCALL ALICE\n[exit code 0]"
    # a non-zero exit is reported to the model, not turned into a tool error
    assert results["x1"].content == "(no output)\n[exit code 7]"
    assert not any(r.is_error for r in results.values())
