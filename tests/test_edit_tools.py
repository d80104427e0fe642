"""``multi_edit`` and ``apply_patch``: edits as models make them, all or none, confined,
judged by the permission rules path by path, and idempotent when a call runs again."""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from temporalio.client import Client

from durable_agent.activities import AgentActivities
from durable_agent.activities.tools import ToolFailure, builtin_tools
from durable_agent.activities.tools.patch import apply_patch
from durable_agent.activities.tools.path_guard import OPENED_JUDGE, check_resolved
from durable_agent.activities.tools.tool import text_of
from durable_agent.core.activity_api import ToolCallInput
from durable_agent.core.builtin_catalog import BUILTIN_TOOLS
from durable_agent.core.events import PermissionDeniedEvent
from durable_agent.core.models import ToolResultBlock
from durable_agent.core.patch_format import PatchError, parse_patch
from durable_agent.core.permissions import PermissionPolicy
from durable_agent.core.tool_args import ApplyPatchArgs
from durable_agent.core.tool_specs import (
    ToolCallError,
    offered_tools,
    permission_target,
    permission_targets,
    validate_args,
)
from durable_agent.workflows.shell_gate import decide_targets
from tests.helpers import RecordingSink, final, running_worker, scripted_config, start, tool_call

TOOLS = builtin_tools()


async def run(ws: Path, name: str, **args: Any) -> str:
    """Validate like the activity does, then run the tool."""
    return text_of(await TOOLS[name].run(validate_args(TOOLS[name].spec, args), ws))


@pytest.fixture(autouse=True)
def no_judge_left_behind() -> Iterator[None]:
    """``check_resolved`` arms the opened-path judge in the caller's context (an activity's own, in
    a worker); here that is the test thread's, so it is disarmed before the next test."""
    yield
    OPENED_JUDGE.set(None)


def patch(*lines: str) -> str:
    return "\n".join(["*** Begin Patch", *lines, "*** End Patch"]) + "\n"


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    workspace = tmp_path / "ws"
    (workspace / "src").mkdir(parents=True)
    (workspace / "src" / "app.py").write_text(
        "import os\n\n\ndef main():\n    name = 'x'\n    return name\n\n\ndef other():\n    return 2\n"
    )
    (workspace / "notes.txt").write_text("alpha\nbeta\ngamma\n")
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_text("TOP SECRET\n")
    os.symlink(outside, workspace / "linkdir")
    return workspace


# --- multi_edit ----------------------------------------------------------------


async def test_multi_edit_applies_every_edit_in_order(ws: Path) -> None:
    edits = [
        {"old_string": "alpha", "new_string": "ALPHA"},
        {"old_string": "ALPHA\nbeta", "new_string": "ALPHA\nBETA"},  # sees the first edit's text
        {"old_string": "A\n", "new_string": "A!\n", "replace_all": True},
    ]
    out = await run(ws, "multi_edit", file_path="notes.txt", edits=edits)
    assert out.startswith("edited notes.txt: 3 of 3 edits made")
    assert "edit 3: replaced 2 occurrences" in out
    assert (ws / "notes.txt").read_text() == "ALPHA!\nBETA!\ngamma\n"


@pytest.mark.parametrize(
    ("edits", "message"),
    [
        (
            [{"old_string": "alpha", "new_string": "A"}, {"old_string": "delta", "new_string": "D"}],
            "edit 2 of 2 failed, so nothing was written: its old_string was not found in notes.txt after",
        ),
        (
            [{"old_string": "beta", "new_string": "B"}, {"old_string": "a\n", "new_string": "x\n"}],
            "edit 2 of 2 failed, so nothing was written: its old_string occurs 2 times in notes.txt "
            "(lines 1, 3)",
        ),
        (
            [{"old_string": "gamma", "new_string": "G"}, {"old_string": "gamma", "new_string": "g"}],
            "edit 2 of 2 failed",
        ),
    ],
)
async def test_one_failing_edit_leaves_the_file_untouched(
    ws: Path, edits: list[dict[str, Any]], message: str
) -> None:
    before = (ws / "notes.txt").read_bytes()
    with pytest.raises(ToolFailure, match=re.escape(message)):
        await run(ws, "multi_edit", file_path="notes.txt", edits=edits)
    assert (ws / "notes.txt").read_bytes() == before


async def test_a_retried_multi_edit_is_reported_applied_and_changes_nothing(ws: Path) -> None:
    edits = [
        {"old_string": "alpha", "new_string": "one"},
        {"old_string": "one", "new_string": "uno"},  # changes what the first put in
        {"old_string": "beta", "new_string": "beta()"},  # new_string contains old_string
        {"old_string": "gamma\n", "new_string": ""},  # a deletion, shown done by the others
    ]
    first = await run(ws, "multi_edit", file_path="notes.txt", edits=edits)
    assert first.startswith("edited notes.txt: 4 of 4 edits made")
    after = (ws / "notes.txt").read_text()
    assert after == "uno\nbeta()\n"
    again = await run(ws, "multi_edit", file_path="notes.txt", edits=edits)
    assert again.startswith("already applied: every edit is in place in notes.txt")
    assert (ws / "notes.txt").read_text() == after


async def test_an_edit_already_in_place_is_skipped_as_edit_would(ws: Path) -> None:
    (ws / "notes.txt").write_text("alpha\nBETA\n")
    edits = [{"old_string": "alpha", "new_string": "ALPHA"}, {"old_string": "beta", "new_string": "BETA"}]
    out = await run(ws, "multi_edit", file_path="notes.txt", edits=edits)
    assert "1 of 2 edits made" in out and "edit 2: already applied" in out
    assert (ws / "notes.txt").read_text() == "ALPHA\nBETA\n"


async def test_multi_edit_matches_windows_line_ends_and_refuses_what_edit_refuses(ws: Path) -> None:
    (ws / "dos.txt").write_bytes(b"one\r\ntwo\r\nthree\r\n")
    edits = [{"old_string": "one\ntwo", "new_string": "1\n2"}]
    await run(ws, "multi_edit", file_path="dos.txt", edits=edits)
    assert (ws / "dos.txt").read_bytes() == b"1\r\n2\r\nthree\r\n"
    assert (await run(ws, "multi_edit", file_path="dos.txt", edits=edits)).startswith("already applied")
    with pytest.raises(ToolFailure, match="outside the workspace"):
        await run(ws, "multi_edit", file_path="linkdir/secret.txt", edits=edits)
    with pytest.raises(ToolCallError, match="the edit would change nothing"):
        validate_args(
            BUILTIN_TOOLS["multi_edit"], {"file_path": "a", "edits": [{"old_string": "x", "new_string": "x"}]}
        )
    with pytest.raises(ToolCallError, match="edits"):
        validate_args(BUILTIN_TOOLS["multi_edit"], {"file_path": "a", "edits": []})


def test_the_offered_schemas_are_flat() -> None:
    for name in ("multi_edit", "apply_patch"):
        schema = BUILTIN_TOOLS[name].offer().definition.input_schema
        assert "$defs" not in schema and "$ref" not in str(schema), name
        assert schema["additionalProperties"] is False
    item = BUILTIN_TOOLS["multi_edit"].offer().definition.input_schema["properties"]["edits"]["items"]
    assert item["additionalProperties"] is False and item["required"] == ["old_string", "new_string"]


# --- apply_patch ---------------------------------------------------------------

ALL_KINDS = patch(
    "*** Add File: pkg/new.py",
    "+def new():",
    "+    return 'new'",
    "*** Update File: src/app.py",
    "*** Move to: src/main.py",
    "@@ def main():",
    "-    name = 'x'",
    "+    name = 'y'",
    "     return name",
    "@@ def other():",
    "-    return 2",
    "+    return 3",
    "*** Delete File: notes.txt",
)


async def test_apply_patch_adds_updates_moves_and_deletes(ws: Path) -> None:
    out = await run(ws, "apply_patch", patch=ALL_KINDS)
    assert out == (
        "applied the patch (4 files changed)\nA pkg/new.py\nM src/app.py -> src/main.py\nD notes.txt"
    )
    assert (ws / "pkg/new.py").read_text() == "def new():\n    return 'new'\n"
    assert (ws / "src/main.py").read_text() == (
        "import os\n\n\ndef main():\n    name = 'y'\n    return name\n\n\ndef other():\n    return 3\n"
    )
    assert not (ws / "src/app.py").exists() and not (ws / "notes.txt").exists()
    # a repeat (the activity run again after a crash) finds every change in place
    again = await run(ws, "apply_patch", patch=ALL_KINDS)
    assert again.startswith("already applied: every change in the patch is in place; nothing changed")
    assert "M src/app.py -> src/main.py (already in place)" in again and "D notes.txt (already gone)" in again


async def test_a_patch_half_written_before_a_crash_is_finished_not_redone(ws: Path) -> None:
    # as if the worker died after writing the new file and the moved one, before the deletions
    (ws / "pkg").mkdir()
    (ws / "pkg/new.py").write_text("def new():\n    return 'new'\n")
    (ws / "src/main.py").write_text(
        "import os\n\n\ndef main():\n    name = 'y'\n    return name\n\n\ndef other():\n    return 3\n"
    )
    out = await run(ws, "apply_patch", patch=ALL_KINDS)
    assert out.startswith("applied the patch (2 files changed)")
    assert "A pkg/new.py (already in place)" in out
    assert not (ws / "src/app.py").exists() and not (ws / "notes.txt").exists()
    assert "name = 'y'" in (ws / "src/main.py").read_text()


async def test_an_update_already_in_place_is_left_alone_in_a_patch_that_does_more(ws: Path) -> None:
    insert = patch(
        "*** Update File: notes.txt",
        "@@",
        " alpha",
        "+inserted",  # the old lines stay in the new ones: only the new ones show it was done
        " beta",
        "*** Add File: more.txt",
        "+more",
    )
    await run(ws, "apply_patch", patch=insert)
    assert (ws / "notes.txt").read_text() == "alpha\ninserted\nbeta\ngamma\n"
    (ws / "more.txt").unlink()  # only the other file is missing its change
    out = await run(ws, "apply_patch", patch=insert)
    assert out.startswith("applied the patch (1 files changed)") and "M notes.txt (already in place)" in out
    assert (ws / "notes.txt").read_text() == "alpha\ninserted\nbeta\ngamma\n"


async def test_hunks_are_found_with_the_reference_fallbacks(ws: Path) -> None:
    (ws / "fuzz.py").write_text("def f():   \n        x = 1\n\treturn x\n")
    fuzzy = patch(
        "*** Update File: fuzz.py",
        "@@ def f():",  # trailing spaces in the file
        "-    x = 1",  # other indentation in the file
        "+    x = 2",
        "     return x",
    )
    await run(ws, "apply_patch", patch=fuzzy)
    assert (ws / "fuzz.py").read_text() == "def f():   \n    x = 2\n    return x\n"
    # a change of whitespace alone is made, not taken for done because the lines match loosely
    indent = patch("*** Update File: fuzz.py", "@@ def f():", "-    x = 2", "+        x = 2", "     return x")
    assert (await run(ws, "apply_patch", patch=indent)).startswith("applied the patch")
    assert (ws / "fuzz.py").read_text() == "def f():   \n        x = 2\n    return x\n"
    assert (await run(ws, "apply_patch", patch=indent)).startswith("already applied")


async def test_several_hunks_end_of_file_insertions_and_windows_line_ends(ws: Path) -> None:
    (ws / "dos.txt").write_bytes(b"a\r\nb\r\nc\r\nd\r\ne\r\n")
    edits = patch(
        "*** Update File: dos.txt",
        "@@",
        " a",
        "-b",
        "+B",
        "@@ c",
        "+after c",
        "@@",
        "-e",
        "+E",
        "*** End of File",
    )
    await run(ws, "apply_patch", patch=edits)
    assert (ws / "dos.txt").read_bytes() == b"a\r\nB\r\nc\r\nafter c\r\nd\r\nE\r\n"
    assert (await run(ws, "apply_patch", patch=edits)).startswith("already applied")


async def test_a_hunk_that_does_not_match_writes_nothing(ws: Path) -> None:
    bad = patch(
        "*** Add File: first.txt",
        "+written only if everything applies",
        "*** Update File: src/app.py",
        "@@ def main():",
        "-    name = 'not there'",
        "+    name = 'z'",
    )
    before = (ws / "src/app.py").read_bytes()
    with pytest.raises(ToolFailure) as caught:
        await run(ws, "apply_patch", patch=bad)
    message = str(caught.value)
    assert message.startswith(
        "the patch cannot be applied, nothing was written: in '*** Update File: src/app.py'"
    )
    assert "the hunk at patch line 5: its lines to change were not found:\n    name = 'not there'" in message
    assert not (ws / "first.txt").exists() and (ws / "src/app.py").read_bytes() == before
    missing = patch("*** Update File: nowhere.py", "@@", "-a", "+b")
    with pytest.raises(ToolFailure, match=r"nowhere.py' \(patch line 2\): the file does not exist"):
        await run(ws, "apply_patch", patch=missing)
    context = patch("*** Update File: notes.txt", "@@ class Missing:", "-alpha", "+A")
    with pytest.raises(ToolFailure, match="its context line '@@ class Missing:' was not found"):
        await run(ws, "apply_patch", patch=context)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            "*** Add File: a\n+x\n*** End Patch",
            "line 1: the first line of the patch must be '*** Begin Patch'",
        ),
        (
            "*** Begin Patch\n*** Add File: a\n+x\n",
            "line 3: the last line of the patch must be '*** End Patch'",
        ),
        (patch("*** Update File: a.py"), "line 2: '*** Update File: a.py' has no hunk"),
        (patch("*** Change File: a.py"), "line 2: '*** Change File: a.py' is not a file operation"),
        (patch("*** Add File: a", "+x", "y"), "line 4: in '*** Add File: a', every line must start with '+'"),
        (patch("*** Update File: a", "@@", "-x", "oops"), "line 5: expected a hunk starting with '@@'"),
        (patch("*** Update File: a", "@@"), "line 3: a hunk needs lines"),
        (patch("*** Delete File: "), "line 2: '*** Delete File:' needs a path"),
        ("*** Begin Patch\n*** End Patch", "line 2: the patch changes no file"),
    ],
)
def test_a_malformed_patch_is_an_error_naming_the_line(text: str, message: str) -> None:
    with pytest.raises(PatchError, match=re.escape(message)):
        parse_patch(text)
    with pytest.raises(ToolCallError, match="invalid arguments for 'apply_patch'"):
        validate_args(BUILTIN_TOOLS["apply_patch"], {"patch": text})
    with pytest.raises(ToolCallError, match="invalid arguments for 'apply_patch'"):
        permission_targets(BUILTIN_TOOLS["apply_patch"].offer(), {"patch": text})


def test_the_parser_is_as_lenient_as_the_reference() -> None:
    wrapped = (
        "<<'EOF'\n  *** Begin Patch  \n*** Update File: a.py\n x\n+y\n@@ -3,2 +3,3 @@\n-z\n"
        "*** End Patch\nEOF\n"
    )
    [op] = parse_patch(wrapped)
    assert op.path == "a.py" and [h.context for h in op.hunks] == [(), ()]  # type: ignore[union-attr]
    [rename] = parse_patch(patch("*** Update File: a.py", "*** Move to: b.py"))
    assert rename.move_to == "b.py" and rename.hunks == ()  # type: ignore[union-attr]
    [nested] = parse_patch(patch("*** Update File: a.py", "@@ class A:", "@@     def f(self):", "-x", "+y"))
    assert nested.hunks[0].context == ("class A:", "    def f(self):")  # type: ignore[union-attr]


@pytest.mark.parametrize(
    "path", ["../escape.txt", "/etc/escape.txt", "linkdir/secret.txt", "linkdir/new.txt"]
)
async def test_paths_outside_the_workspace_are_refused_before_anything_is_written(
    ws: Path, tmp_path: Path, path: str
) -> None:
    outside = patch("*** Add File: inside.txt", "+fine", f"*** Add File: {path}", "+escaped")
    with pytest.raises(ToolFailure, match="outside the workspace"):
        await run(ws, "apply_patch", patch=outside)
    assert not (ws / "inside.txt").exists()
    assert sorted(os.listdir(tmp_path / "outside")) == ["secret.txt"]
    assert (tmp_path / "outside" / "secret.txt").read_text() == "TOP SECRET\n"


async def test_an_absolute_path_inside_the_workspace_is_fine(ws: Path) -> None:
    inside = patch(f"*** Update File: {ws / 'notes.txt'}", "@@", "-beta", "+BETA")
    await run(ws, "apply_patch", patch=inside)
    assert (ws / "notes.txt").read_text() == "alpha\nBETA\ngamma\n"


# --- permissions ---------------------------------------------------------------


def test_edit_rules_judge_multi_edit_and_apply_patch_as_well_as_their_own() -> None:
    policy = PermissionPolicy(allow=("edit(src/**)",), deny=("edit(.env)",), default="deny")
    assert policy.decide("multi_edit", "src/a.py") == "allow"
    assert policy.decide("apply_patch", "src/a.py") == "allow"
    assert policy.decide("apply_patch", ".env") == "deny"
    assert policy.decide("multi_edit", "README.md") == "deny"
    own = PermissionPolicy(allow=("edit(src/**)",), deny=("multi_edit",), default="deny")
    assert own.decide("multi_edit", "src/a.py") == "deny" and own.decide("edit", "src/a.py") == "allow"
    offered = {s.name for s in offered_tools(BUILTIN_TOOLS.values(), policy)}
    assert {"edit", "multi_edit", "apply_patch"} <= offered
    no_edits = PermissionPolicy(allow=("read", "edit(src/**)"), deny=("edit",))
    assert not {"edit", "multi_edit", "apply_patch"} & {
        s.name for s in offered_tools(BUILTIN_TOOLS.values(), no_edits)
    }


def test_every_path_of_a_patch_is_decided_and_the_strictest_stands() -> None:
    offer = BUILTIN_TOOLS["apply_patch"].offer()
    text = patch(
        "*** Add File: src/new.py", "+x", "*** Update File: /repo/src/a.py", "*** Move to: ./docs/../b.py"
    )
    targets = permission_targets(offer, {"patch": text}, "/repo")
    assert targets == ("src/new.py", "src/a.py", "b.py")
    policy = PermissionPolicy(allow=("edit(src/**)",), ask=("edit(*.py)",), deny=("apply_patch(b.py)",))
    assert decide_targets(policy, "apply_patch", targets) == ("deny", "b.py")
    policy = PermissionPolicy(allow=("edit(src/**)",), ask=("edit(*.py)",), default="deny")
    assert decide_targets(policy, "apply_patch", targets) == ("ask", "src/new.py, src/a.py, b.py")
    policy = PermissionPolicy(allow=("edit(src/**)", "edit(*.py)"), default="deny")
    assert decide_targets(policy, "apply_patch", targets) == ("allow", "src/new.py, src/a.py, b.py")
    # one target: decided exactly as before
    edit = BUILTIN_TOOLS["edit"].offer()
    assert permission_targets(edit, {"file_path": "/repo/src/a.py"}, "/repo") == ("src/a.py",)
    assert decide_targets(policy, "edit", ("x.md",)) == ("deny", "x.md")
    assert decide_targets(PermissionPolicy(allow=("glob",)), "glob", ("**",)) == ("allow", "**")
    # the one-target question has no one answer for a patch: refused rather than guessed
    with pytest.raises(ToolCallError, match="touches several paths"):
        permission_target(offer, {"patch": text})
    assert "targets_from" not in edit.model_dump() and offer.model_dump()["targets_from"] == "patch"


def linked(tmp_path: Path) -> Path:
    ws = tmp_path / "linked"
    (ws / ".git" / "hooks").mkdir(parents=True)
    (ws / "src").mkdir()
    (ws / "config").mkdir()
    (ws / "src" / "a.py").write_text("x = 1\n")
    os.symlink("../.git/hooks", ws / "src" / "hooks")
    os.symlink("../config", ws / "src" / "cfg")
    return ws


def patch_call(ws: Path, policy: PermissionPolicy, text: str, approved: str | None = None) -> ToolCallInput:
    return ToolCallInput(
        run_id="r",
        workspace=str(ws),
        call_id="c",
        name="apply_patch",
        arguments={"patch": text},
        permissions=policy,
        approved_target=approved,
    )


def test_the_activity_judges_where_each_path_of_a_patch_leads(tmp_path: Path) -> None:
    ws = linked(tmp_path)
    spec = BUILTIN_TOOLS["apply_patch"]
    policy = PermissionPolicy(allow=("edit(src/**)",), deny=("edit(.git/**)",), ask=("edit(config/**)",))
    hook = patch("*** Add File: src/ok.py", "+y", "*** Add File: src/hooks/pre-commit", "+#!/bin/sh")
    refused = check_resolved(patch_call(ws, policy, hook), spec, {"patch": hook})
    assert refused is not None and refused.permission == "denied"
    assert (
        refused.resolved_target == ".git/hooks/pre-commit"
        and "resolves to .git/hooks/pre-commit" in refused.content
    )
    asks = patch("*** Add File: src/cfg/x.toml", "+a = 1", "*** Add File: src/ok.py", "+y")
    asked = check_resolved(patch_call(ws, policy, asks), spec, {"patch": asks})
    assert asked is not None and (asked.permission, asked.resolved_target) == ("ask", "config/x.toml")
    approved = patch_call(ws, policy, asks, approved="config/x.toml")
    assert check_resolved(approved, spec, {"patch": asks}) is None
    plain = patch("*** Add File: src/ok.py", "+y")
    assert check_resolved(patch_call(ws, policy, plain), spec, {"patch": plain}) is None


def test_a_link_planted_after_the_check_is_judged_where_the_patch_opens_it(tmp_path: Path) -> None:
    ws = linked(tmp_path)
    (ws / "src" / "plain").mkdir()
    policy = PermissionPolicy(allow=("edit(src/**)",), deny=("edit(.git/**)",))
    text = patch("*** Add File: src/ok.py", "+y", "*** Add File: src/plain/pre-commit", "+#!/bin/sh")
    assert check_resolved(patch_call(ws, policy, text), BUILTIN_TOOLS["apply_patch"], {"patch": text}) is None
    (ws / "src" / "plain").rmdir()
    os.symlink("../.git/hooks", ws / "src" / "plain")  # flipped between the check and the open
    with pytest.raises(ToolFailure, match=r"permission denied: apply_patch reaches \.git/hooks/pre-commit"):
        apply_patch(ApplyPatchArgs(patch=text), ws)
    assert not (ws / ".git" / "hooks" / "pre-commit").exists() and not (ws / "src" / "ok.py").exists()


async def test_a_run_edits_by_the_edit_rules_and_a_deny_on_one_path_refuses_the_whole_patch(
    client: Client, tmp_path: Path
) -> None:
    ws = tmp_path / "repo"
    (ws / "src").mkdir(parents=True)
    (ws / "src" / "app.py").write_text("def main():\n    return 1\n")
    (ws / ".env").write_text("TOKEN=keep\n")
    good = patch("*** Update File: src/app.py", "@@ def run(argv):", "-    return 1", "+    return 2")
    touches_env = patch("*** Add File: src/extra.py", "+x = 1", "*** Delete File: .env")
    script = [
        tool_call(
            "m1",
            "multi_edit",
            file_path="src/app.py",
            edits=[
                {"old_string": "main", "new_string": "run"},
                {"old_string": "run()", "new_string": "run(argv)"},
            ],
        ),
        tool_call("p1", "apply_patch", patch=good),
        tool_call("p2", "apply_patch", patch=touches_env),
        final("done"),
    ]
    config = scripted_config(
        tmp_path, script, permissions={"allow": ["edit(src/**)", "edit(.env)"], "deny": ["apply_patch(.env)"]}
    )
    sink = RecordingSink()
    async with running_worker(client, AgentActivities(config, sinks={"local": sink})) as queue:
        result = await (await start(client, queue, ws, "change the app")).result()
    assert result.status == "completed" and result.text == "done"
    assert (ws / "src/app.py").read_text() == "def run(argv):\n    return 2\n"
    assert (ws / ".env").read_text() == "TOKEN=keep\n" and not (ws / "src/extra.py").exists()
    export = sink.exports[-1]
    messages = export.open().logical_resume.messages
    results = {b.tool_use_id: b for m in messages for b in m.content if isinstance(b, ToolResultBlock)}
    assert results["m1"].content.startswith("edited src/app.py: 2 of 2 edits made")
    assert results["p1"].content == "applied the patch (1 files changed)\nM src/app.py"
    assert results["p2"].is_error
    assert (
        results["p2"].content == "permission denied: apply_patch .env is not allowed by the run's permissions"
    )
    events = [r.event for r in export.open().source_run().events]
    assert [e.id for e in events if isinstance(e, PermissionDeniedEvent)] == ["p2"]
