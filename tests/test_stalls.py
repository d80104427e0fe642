"""No tool call can stall a worker: hostile patterns, names and trees finish, and cancel gets through.

Each adversarial case would take hours with a backtracking engine (Python's
``re``, or a glob translated for it); here each must finish under a generous
``asyncio.wait_for``, with the exact result. No test measures time.
"""

from __future__ import annotations

import asyncio
import json
import os
import threading
import uuid
from pathlib import Path
from typing import Any

import pytest
from temporalio.client import Client

from durable_agent.activities import AgentActivities
from durable_agent.activities.tools import Tool, ToolFailure, builtin_tools, tree_walk
from durable_agent.activities.tools import search as tools_search
from durable_agent.activities.tools.tool import stoppable, text_of
from durable_agent.client import run_result
from durable_agent.core.models import ToolResultBlock
from durable_agent.core.run_api import RunStatusView
from durable_agent.core.tool_args import GrepArgs, grep_regex
from durable_agent.core.tool_specs import ToolCallError, validate_args
from tests.helpers import RecordingSink, final, read_call, running_worker, scripted_config, start, tool_call

TOOLS = builtin_tools()
DONE_WITHIN = 10  # seconds: a backtracking engine needs hours for these


async def run(ws: Path, name: str, **args: Any) -> str:
    """Validate like the activity does, then run the tool, under the generous bound."""
    call = TOOLS[name].run(validate_args(TOOLS[name].spec, args), ws)
    return text_of(await asyncio.wait_for(call, DONE_WITHIN))


def files(tmp_path: Path, content: dict[str, str]) -> Path:
    ws = tmp_path / "ws"
    for name, text in content.items():
        (ws / name).parent.mkdir(parents=True, exist_ok=True)
        (ws / name).write_text(text)
    ws.mkdir(exist_ok=True)
    return ws


# --- catastrophic regular expressions ----------------------------------------------------

EVIL = "a" * 41 + "b"  # (a+)+$ on this takes Python's re about 2**41 steps


@pytest.mark.parametrize(
    ("pattern", "lines", "expected"),
    [
        ("(a+)+$", [EVIL], []),
        ("(a+)+$", [EVIL, "a" * 41], [2]),
        ("(a|aa)+$", [EVIL], []),
        ("(a|aa)+$", ["b" + "a" * 60], [1]),
        ("(.*a){25}", ["a" * 24 + "b" * 40], []),
        ("(.*a){25}", ["x" * 30, "a" * 25 + "b"], [2]),
        ("^(([a-z])+.)+[A-Z]([a-z])+$", ["a" * 40 + "!"], []),
        ("^(([a-z])+.)+[A-Z]([a-z])+$", ["aaaa Bbbb", "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaa1"], [1]),
        (r"(\w+\s?)*$", ["word " * 20 + "!"], [1]),  # $ with an empty repeat: every line matches
        (r"^(\w+\s?)+$", ["word " * 20 + "!"], []),
    ],
)
async def test_catastrophic_patterns_finish_with_the_right_lines(
    tmp_path: Path, pattern: str, lines: list[str], expected: list[int]
) -> None:
    ws = files(tmp_path, {"evil.txt": "\n".join(lines) + "\n"})
    out = await run(ws, "grep", pattern=pattern)
    if expected:
        assert out.splitlines() == [f"evil.txt:{n}: {lines[n - 1]}" for n in expected]
    else:
        assert out == f"no matches for {pattern!r} (1 file(s) searched)"


async def test_a_catastrophic_pattern_over_many_adversarial_files(tmp_path: Path) -> None:
    ws = files(tmp_path, {f"f{i:03}.txt": (EVIL + "\n") * 200 for i in range(50)})
    assert await run(ws, "grep", pattern="(a+)+$", case_insensitive=True) == (
        "no matches for '(a+)+$' (50 file(s) searched)"
    )


# --- syntax RE2 does not have ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("pattern", "message"),
    [
        (
            r"(a)\1",
            r"grep patterns use RE2 syntax: a backreference is not supported: invalid escape sequence: \1",
        ),
        (
            "foo(?=bar)",
            "grep patterns use RE2 syntax: lookahead (?=...) is not supported: invalid perl operator: (?=",
        ),
        (
            "foo(?!bar)",
            "grep patterns use RE2 syntax: negative lookahead (?!...) is not supported: "
            "invalid perl operator: (?!",
        ),
        (
            "(?<=a)b",
            "grep patterns use RE2 syntax: lookbehind (?<=...) is not supported: invalid perl operator: (?<=",
        ),
        (
            "(?<!a)b",
            "grep patterns use RE2 syntax: negative lookbehind (?<!...) is not supported: "
            "invalid perl operator: (?<!",
        ),
        (
            "(?P<w>x)(?P=w)",
            "grep patterns use RE2 syntax: a named backreference (?P=name) is not supported: "
            "invalid perl operator: (?P",
        ),
        (
            "a{1001}",
            "grep patterns use RE2 syntax: a repetition count over 1000 is not supported: "
            "invalid repetition size: {1001}",
        ),
        ("(unclosed", "invalid regular expression: missing ): (unclosed"),
        (
            r"\pL{100}",
            "grep pattern is too large: it compiles to 119604 instructions, at most 10000 instructions "
            "are allowed; use fewer or smaller repetitions",
        ),
        ("x" * 1001, "String should have at most 1000 characters"),
    ],
)
def test_patterns_re2_cannot_run_are_clear_tool_errors(pattern: str, message: str) -> None:
    with pytest.raises(ToolCallError) as caught:
        validate_args(TOOLS["grep"].spec, {"pattern": pattern})
    # ``tool_call`` hands the model exactly this text as the tool's error
    prefix = "invalid arguments for 'grep': pattern: "
    assert str(caught.value) == prefix + ("Value error, " if "String" not in message else "") + message


async def test_the_tool_itself_refuses_a_pattern_that_skipped_validation(tmp_path: Path) -> None:
    args = GrepArgs.model_construct(pattern="(?=x)", path=".", glob=None, case_insensitive=False)
    with pytest.raises(ToolFailure, match=r"lookahead \(\?=\.\.\.\) is not supported"):
        await asyncio.wait_for(TOOLS["grep"].run(args, files(tmp_path, {})), DONE_WITHIN)


# --- long lines and the whole-file search ------------------------------------------------------


async def test_a_line_too_long_for_the_budget_is_searched_in_its_first_part(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ws = files(tmp_path, {"long.txt": "needle" + "x" * 2000 + "haystack\nshort needle\n"})
    monkeypatch.setattr(tools_search, "GREP_LINE_BUDGET", 10_000)
    note = "[1 line(s) longer than {0} characters were searched in their first {0} characters only]"
    chars = 10_000 // grep_regex("haystack").programsize
    assert await run(ws, "grep", pattern="haystack") == (
        "no matches for 'haystack' (1 file(s) searched)\n" + note.format(chars)
    )
    chars = 10_000 // grep_regex("needle|haystack").programsize
    out = (await run(ws, "grep", pattern="needle|haystack")).splitlines()
    assert out == [
        "long.txt:1: needle" + "x" * 294 + " [… line cut]",
        "long.txt:2: short needle",
        note.format(chars),
    ]


TEXT = "alpha\n\nbeta gamma\r\n  \nalpha beta\nend"


@pytest.mark.parametrize(
    ("pattern", "numbers"),
    [
        ("^$", [2]),
        (r"^\s*$", [2, 4]),
        ("a$", [1, 5]),
        (r"\Aalpha", [1, 5]),  # \A is a line's start, as in a line-by-line search
        (r"beta\z", [5]),
        ("(?-m:^)beta", [3]),
        (r"\bbeta\b", [3, 5]),
        (r"gamma\r$", [3]),
        (r"alpha\s+beta", [5]),  # never across a line end
        ("[^x]+$", [1, 3, 4, 5, 6]),
        ("d", [6]),
    ],
)
async def test_whole_file_search_finds_exactly_the_lines_a_line_search_would(
    tmp_path: Path, pattern: str, numbers: list[int]
) -> None:
    ws = files(tmp_path, {"t.txt": TEXT})
    lines = TEXT.split("\n")
    out = await run(ws, "grep", pattern=pattern)
    assert out.splitlines() == [f"t.txt:{n}: {lines[n - 1].rstrip(chr(13))}" for n in numbers]


# --- globs and walks ---------------------------------------------------------------------------


async def test_a_glob_with_many_stars_on_a_long_name(tmp_path: Path) -> None:
    ws = files(tmp_path, {"a" * 200: "x", "a" * 199 + "c": "x"})
    assert await run(ws, "glob", pattern="*a*a*a*a*a*a*c") == "a" * 199 + "c"
    assert await run(ws, "glob", pattern="*a*a*a*a*a*a*d") == "no paths match '*a*a*a*a*a*a*d'"


async def test_stacked_double_stars_on_a_deep_tree(tmp_path: Path) -> None:
    deep = "/".join(["d"] * 150)
    ws = files(tmp_path, {f"{deep}/zz": "bottom", f"{deep}/other": "x"})
    assert await run(ws, "glob", pattern="**/**/**/**/zz") == f"{deep}/zz"
    assert await run(ws, "grep", pattern="bottom") == f"{deep}/zz:1: bottom"
    assert await run(ws, "glob", pattern="**/**/**/**/nothing") == "no paths match '**/**/**/**/nothing'"


async def test_links_in_a_deep_tree_are_judged_by_where_they_lead(tmp_path: Path) -> None:
    deep = "/".join(["d"] * 100)
    ws = files(tmp_path, {f"{deep}/target.txt": "inside", "top.txt": "top"})
    outside = tmp_path / "outside.txt"
    outside.write_text("outside")
    bottom = ws / deep
    os.symlink("target.txt", bottom / "in-link")
    os.symlink(ws, bottom / "up-link")  # a folder inside: listed, never entered
    os.symlink(outside, bottom / "out-link")
    os.symlink("missing.txt", bottom / "dangling-link")
    assert (await run(ws, "glob", pattern="**/*link*")).splitlines() == [
        f"{deep}/in-link",
        f"{deep}/up-link/",
    ]
    # a folder's own entries come before those of its subfolders
    assert (await run(ws, "grep", pattern="inside|outside|top")).splitlines() == [
        "top.txt:1: top",
        f"{deep}/in-link:1: inside",
        f"{deep}/target.txt:1: inside",
    ]


async def test_a_huge_folder_is_read_no_further_than_the_bound(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ws = files(tmp_path, {f"f{i:04}": "" for i in range(300)})
    monkeypatch.setattr(tree_walk, "WALK_MAX_ENTRIES", 20)
    walk = tree_walk.Walk(ws.resolve(), threading.Event())
    assert len(list(walk.entries(ws.resolve()))) == 20
    assert walk.cut and walk.visited == 20


async def test_a_search_out_of_time_says_so(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ws = files(tmp_path, {"a.txt": "hit\n"})
    monkeypatch.setattr(tree_walk, "SEARCH_MAX_SECONDS", -1)
    note = "[search stopped after -1 s; results are incomplete: narrow it down]"
    assert await run(ws, "grep", pattern="hit") == f"no matches for 'hit' (0 file(s) searched)\n{note}"
    assert await run(ws, "glob", pattern="*.txt") == f"no paths match '*.txt'\n{note}"


def test_a_stopped_search_returns_at_once(tmp_path: Path) -> None:
    ws = files(tmp_path, {f"f{i}.txt": EVIL + "\n" for i in range(20)})
    stop = threading.Event()
    stop.set()
    args = validate_args(TOOLS["grep"].spec, {"pattern": "(a+)+$"})
    assert tools_search.grep(args, ws, stop) == "no matches for '(a+)+$' (0 file(s) searched)"  # type: ignore[arg-type]


# --- end to end: one worker, a hostile run and a quiet one -------------------------------------

# A DFA-hostile pattern: RE2 falls back to its slow matcher on random a/b text (about half a
# second a line here), and Python's re backtracks quadratically on each line (hours).
HOSTILE = "[ab]*a[ab]{999}x"


def hostile_files(ws: Path, count: int = 3, lines: int = 40, width: int = 90_000) -> None:
    table = bytes((ord("a"), ord("b"))[i % 2] for i in range(256))
    for i in range(count):
        rows = [os.urandom(width).translate(table) for _ in range(lines)]
        (ws / f"hostile-{i}.txt").write_bytes(b"\n".join(rows) + b"\n")


class RecordedGrep:
    """The real grep, noting when its thread starts and when it returns."""

    def __init__(self) -> None:
        self.starts = 0
        self.started = threading.Event()
        self.returned = threading.Event()
        self.result: str | None = None

    def grep(self, args: GrepArgs, workspace: Path, stop: threading.Event) -> str:
        self.starts += 1
        self.started.set()
        try:
            self.result = tools_search.grep(args, workspace, stop)
            return self.result
        finally:
            self.returned.set()

    def tools(self) -> dict[str, Tool]:
        tools = builtin_tools()
        return {**tools, "grep": Tool(tools["grep"].spec, stoppable(self.grep))}


def second_script(tmp_path: Path, responses: list[dict[str, Any]]) -> dict[str, Any]:
    script = tmp_path / f"script-{uuid.uuid4().hex[:8]}.json"
    script.write_text(json.dumps({"responses": responses}))
    return {"kind": "scripted", "script": str(script)}


async def test_a_hostile_grep_neither_stalls_the_worker_nor_outlives_its_cancel(
    client: Client, tmp_path: Path
) -> None:
    ws = files(tmp_path, {"notes.txt": "quiet run\n"})
    hostile_files(ws)
    grep = RecordedGrep()
    config = scripted_config(
        tmp_path,
        [tool_call("g1", "grep", pattern=HOSTILE), final("never reached")],
        providers={
            "quiet": second_script(tmp_path, [*(read_call(f"r{i}", "notes.txt") for i in range(3)), final()])
        },
        permissions={"allow": ["read(*)", "grep"]},
    )
    sink = RecordingSink()
    acts = AgentActivities(config, tools=grep.tools(), sinks={"local": sink})
    async with running_worker(client, acts) as queue:
        hostile = await start(client, queue, ws, "search everything")
        await asyncio.to_thread(grep.started.wait, 20)
        quiet = await start(client, queue, ws, "read the notes", model="quiet/static")
        quiet_result = await asyncio.wait_for(quiet.result(), 30)
        # the hostile search is still going, yet the other run read its way to the end ...
        assert not grep.returned.is_set()
        status = await asyncio.wait_for(hostile.query("status", result_type=RunStatusView), 5)
        assert status.status == "executing"  # ... and its own queries are answered
        await hostile.signal("cancel", "enough searching")
        hostile_result = await asyncio.wait_for(run_result(client, hostile.id), 15)
        # the search's thread noticed the cancel and returned early, not after the whole file set
        assert await asyncio.to_thread(grep.returned.wait, DONE_WITHIN)
    assert quiet_result.status == "completed" and quiet_result.tool_calls_count == 3
    reads = [
        b.content
        for m in sink.exports[-1].open().logical_resume.messages
        for b in m.content
        if isinstance(b, ToolResultBlock)
    ]
    assert reads == ["     1\tquiet run"] * 3  # the last export is the quiet run's: the other never got one
    assert hostile_result.status == "cancelled" and hostile_result.error == "enough searching"
    assert hostile_result.tool_calls_count == 0
    # heartbeats went on throughout: the activity was never timed out and started again
    assert grep.starts == 1
    assert grep.result is not None and grep.result.startswith(f"no matches for {HOSTILE!r}")
    assert "(3 file(s) searched)" not in grep.result
