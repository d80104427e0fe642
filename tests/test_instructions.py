"""Project instructions: ``AGENTS.md`` (or ``CLAUDE.md``) from the repository's root down to the
workspace, and a run's own ``instructions``, in the system prompt the model receives; what was
read is in the plan, the run's binding and its ``run_start`` event."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError
from temporalio.client import Client, WorkflowFailureError
from temporalio.testing import ActivityEnvironment

from durable_agent.activities import AgentActivities
from durable_agent.activities.instructions import (
    MAX_FILE_BYTES,
    MAX_PROJECT_BYTES,
    PROJECT_HEADING,
    RUN_HEADING,
    ProjectInstructions,
    json_size,
    read_project_files,
    repository_root,
    system_prompt,
)
from durable_agent.activities.providers import TextSink, build_providers
from durable_agent.cli.commands import build_parser
from durable_agent.client import resume_run
from durable_agent.config import AgentConfig, InstructionsConfig
from durable_agent.core.activity_api import ModelCallInput, ResolveInput
from durable_agent.core.canonical import digest_of, sha256_digest
from durable_agent.core.capability_binding import CapabilityBinding, binding_differences
from durable_agent.core.events import EventRecord, RunStartEvent
from durable_agent.core.models import InstructionFile, ModelResponse, ToolDefinition
from durable_agent.core.permissions import PermissionPolicy
from durable_agent.core.plan import RunPlan
from durable_agent.core.run_api import MAX_INSTRUCTIONS_BYTES, QUERY_EVENTS, AgentRunInput, RunSettings
from durable_agent.core.tool_specs import capability_binding
from tests.helpers import (
    RecordingProvider,
    RecordingSink,
    final,
    read_call,
    running_worker,
    scripted_config,
    start,
)

NAMES = ("AGENTS.md", "CLAUDE.md")


def tree(root: Path, files: dict[str, str | bytes]) -> Path:
    """``files`` written under ``root`` (``.git/`` marks the repository); returns ``root``."""
    for name, content in files.items():
        path = root / name
        if name.endswith("/"):  # a folder
            path.mkdir(parents=True, exist_ok=True)
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content if isinstance(content, bytes) else content.encode())
    return root


def no_git_above(path: Path) -> None:
    if any((p / ".git").exists() for p in path.parents):
        pytest.skip("the test's temporary folder is inside a git repository")


def paths(project: ProjectInstructions) -> list[str]:
    return [f.record.path for f in project.files]


# --- discovery ---------------------------------------------------------------------


def test_files_are_read_from_the_repository_root_down_to_the_workspace(tmp_path: Path) -> None:
    repo = tree(
        tmp_path / "outer" / "repo",
        {
            ".git/": "",
            "AGENTS.md": "root rules\n",
            "CLAUDE.md": "not read: the root has AGENTS.md\n",
            "pkg/CLAUDE.md": "pkg rules (CLAUDE.md: pkg has no AGENTS.md)\n",
            "pkg/svc/AGENTS.md": "svc rules\n",
            "pkg/other/AGENTS.md": "a sibling folder: not on the way\n",
        },
    )
    (tmp_path / "outer" / "AGENTS.md").write_text("above the repository: not read\n")
    workspace = repo / "pkg" / "svc"
    assert repository_root(workspace) == repo
    project = read_project_files(workspace, NAMES)
    assert paths(project) == ["AGENTS.md", "pkg/CLAUDE.md", "pkg/svc/AGENTS.md"]
    assert [f.text for f in project.files] == [
        "root rules\n",
        "pkg rules (CLAUDE.md: pkg has no AGENTS.md)\n",
        "svc rules\n",
    ]
    assert project.workspace == "pkg/svc" and project.skipped == ()
    first = project.files[0].record
    assert first == InstructionFile(path="AGENTS.md", digest=sha256_digest(b"root rules\n"), bytes=11)
    # the names, in their order, are the config's
    assert paths(read_project_files(workspace, ("CLAUDE.md",))) == ["CLAUDE.md", "pkg/CLAUDE.md"]


def test_a_git_file_marks_a_root_too(tmp_path: Path) -> None:
    # a worktree's or submodule's .git is a file
    repo = tree(tmp_path / "wt", {".git": "gitdir: /elsewhere\n", "AGENTS.md": "worktree\n", "src/": ""})
    assert repository_root(repo / "src") == repo
    assert paths(read_project_files(repo / "src", NAMES)) == ["AGENTS.md"]


def test_without_a_repository_only_the_workspace_is_read(tmp_path: Path) -> None:
    no_git_above(tmp_path)
    tree(tmp_path, {"AGENTS.md": "the folder above: not read\n", "ws/AGENTS.md": "workspace rules\n"})
    workspace = tmp_path / "ws"
    assert repository_root(workspace) == workspace
    project = read_project_files(workspace, NAMES)
    assert paths(project) == ["AGENTS.md"] and project.workspace == "."
    assert project.files[0].text == "workspace rules\n"


def test_a_link_out_of_the_repository_is_not_followed(tmp_path: Path) -> None:
    repo = tree(tmp_path / "repo", {".git/": "", "CLAUDE.md": "the fallback\n", "docs/agents.md": "linked\n"})
    secret = tmp_path / "secret.txt"
    secret.write_text("SECRET outside the repository\n")
    (repo / "AGENTS.md").symlink_to(secret)
    project = read_project_files(repo, NAMES)
    # the link is refused, and the folder's next name is read instead
    assert paths(project) == ["CLAUDE.md"]
    assert "SECRET" not in system_prompt("", project, None)
    assert project.skipped == ("AGENTS.md: path 'AGENTS.md' is outside the repository",)
    # a link to a file of the repository is followed, and a file reached twice is read once
    (repo / "AGENTS.md").unlink()
    (repo / "AGENTS.md").symlink_to("docs/agents.md")
    (repo / "docs" / "AGENTS.md").symlink_to("agents.md")
    project = read_project_files(repo / "docs", NAMES)
    assert paths(project) == ["AGENTS.md"] and project.files[0].text == "linked\n"
    assert project.skipped == ("docs/AGENTS.md: the same file as docs/agents.md, read once",)


def test_what_is_not_a_file_is_skipped(tmp_path: Path) -> None:
    repo = tree(tmp_path / "repo", {".git/": "", "AGENTS.md/": "", "CLAUDE.md": "", "sub/AGENTS.md": "x"})
    project = read_project_files(repo / "sub", NAMES)
    assert paths(project) == ["sub/AGENTS.md"]
    assert project.skipped == ("AGENTS.md: not a regular file", "CLAUDE.md: empty")


def test_a_long_file_is_cut_with_a_note(tmp_path: Path) -> None:
    # 3-byte characters: the cut falls inside one, which is left out rather than garbled
    body = "a" + "€" * MAX_FILE_BYTES
    repo = tree(tmp_path / "repo", {".git/": "", "AGENTS.md": body})
    [read] = read_project_files(repo, NAMES).files
    data = body.encode()[:MAX_FILE_BYTES]
    assert read.record.bytes == MAX_FILE_BYTES and read.record.digest == sha256_digest(data)
    text, _, note = read.text.partition("\n\n[…")
    assert text == data.decode("utf-8", "ignore") and "\ufffd" not in text
    assert f"AGENTS.md is cut here: it is {len(body.encode())} bytes" in note
    assert f"the first {MAX_FILE_BYTES} are read" in note


def test_the_files_together_are_bounded(tmp_path: Path) -> None:
    chunk = "x" * 30_000
    repo = tree(
        tmp_path / "repo",
        {
            ".git/": "",
            "AGENTS.md": chunk,
            "a/AGENTS.md": chunk,
            "a/b/AGENTS.md": chunk,
            "a/b/c/AGENTS.md": chunk,
        },
    )
    project = read_project_files(repo / "a" / "b" / "c", NAMES)
    # the third is cut to what is left; the fourth is left out
    assert paths(project) == ["AGENTS.md", "a/AGENTS.md", "a/b/AGENTS.md"]
    cut = project.files[2]
    assert "a/b/AGENTS.md is cut here" in cut.text
    assert sum(json_size(f.text.partition("\n\n[…")[0]) for f in project.files) == MAX_PROJECT_BYTES
    assert cut.record.bytes == MAX_PROJECT_BYTES - 2 * (30_000 + 2) - 2
    assert project.skipped == (
        f"a/b/c/AGENTS.md: left out, the project files reached {MAX_PROJECT_BYTES} bytes",
    )


def test_bytes_that_are_not_utf8_are_replaced(tmp_path: Path) -> None:
    repo = tree(tmp_path / "repo", {".git/": "", "AGENTS.md": b"\xef\xbb\xbfok \xff\xfe end\n"})
    [read] = read_project_files(repo, NAMES).files
    assert read.text == "ok \ufffd\ufffd end\n" and read.record.bytes == 13


# --- the system prompt -----------------------------------------------------------


def test_the_system_prompt_is_the_config_s_then_the_files_then_the_run_s(tmp_path: Path) -> None:
    repo = tree(tmp_path / "repo", {".git/": "", "AGENTS.md": "root rules\n\n", "pkg/AGENTS.md": "pkg rules"})
    project = read_project_files(repo / "pkg", NAMES)
    assert system_prompt("Be careful.", project, "Answer in French.") == (
        "Be careful.\n\n"
        f"{PROJECT_HEADING} The workspace is `pkg` in the repository.\n\n"
        "## AGENTS.md\n\nroot rules\n\n"
        "## pkg/AGENTS.md\n\npkg rules\n\n"
        f"{RUN_HEADING}\n\nAnswer in French."
    )
    # without files or instructions it is the config's, unchanged
    assert system_prompt("Be careful.", ProjectInstructions(), None) == "Be careful."
    assert (
        system_prompt("Be careful.", ProjectInstructions(), "Short.")
        == f"Be careful.\n\n{RUN_HEADING}\n\nShort."
    )


def test_run_input_instructions_are_optional_and_bounded() -> None:
    # an input from before the field still parses
    assert AgentRunInput.model_validate({"prompt": "hi"}).instructions is None
    run = AgentRunInput(prompt="hi", instructions="Answer in French.")
    assert run.settings().instructions == "Answer in French."  # the resolve activity gets them
    with pytest.raises(ValidationError, match="instructions must not be blank"):
        AgentRunInput(prompt="hi", instructions="  \n")
    with pytest.raises(ValidationError, match=f"over {MAX_INSTRUCTIONS_BYTES}: put the text in a file"):
        AgentRunInput(prompt="hi", instructions="é" * (MAX_INSTRUCTIONS_BYTES // 2))
    AgentRunInput(prompt="hi", instructions="x" * (MAX_INSTRUCTIONS_BYTES - 2))  # 2 bytes of quotes


def test_config_names_plain_file_names() -> None:
    assert InstructionsConfig().file_names == NAMES and InstructionsConfig().project_files
    for bad in ("docs/AGENTS.md", "..", ""):
        with pytest.raises(ValidationError, match="is not a file name"):
            InstructionsConfig(file_names=(bad,))


async def resolve(config: AgentConfig, workspace: Path, **settings: Any) -> RunPlan:
    """The plan the resolve activity makes of a run in ``workspace``."""
    planner = AgentActivities(config).planner
    inp = ResolveInput(session_id="s", run_id="r", settings=RunSettings(workspace=str(workspace), **settings))
    return await ActivityEnvironment().run(planner.resolve_run, inp)


async def test_the_plan_carries_the_files_and_the_switch_turns_them_off(tmp_path: Path) -> None:
    repo = tree(tmp_path / "repo", {".git/": "", "AGENTS.md": "root rules\n"})
    config = scripted_config(tmp_path, [final()], system_prompt="Base.")
    plan = await resolve(config, repo, instructions="Run rules.")
    assert plan.instruction_files == plan.capability_binding.instruction_files
    assert [f.path for f in plan.instruction_files] == ["AGENTS.md"]
    assert (
        plan.system_prompt.startswith("Base.\n\n# Project instructions")
        and "root rules" in plan.system_prompt
    )
    assert plan.system_prompt.endswith(f"{RUN_HEADING}\n\nRun rules.")
    off = scripted_config(tmp_path, [final()], system_prompt="Base.", instructions={"project_files": False})
    plan = await resolve(off, repo)
    assert plan.system_prompt == "Base." and plan.instruction_files == ()
    assert "instruction_files" not in plan.capability_binding.model_dump(mode="json")


# --- the binding and the event -----------------------------------------------------


def test_the_binding_names_the_files_and_says_what_changed() -> None:
    tools = [ToolDefinition(name="read", description="Read a file.", input_schema={"type": "object"})]
    policy = PermissionPolicy(allow=("read(**)",))
    before = capability_binding(tools, policy)
    # without files: the digest and the JSON are what they were before files were read
    legacy = {
        "tools": [t.model_dump(mode="json") for t in tools],
        "permissions": policy.model_dump(mode="json"),
    }
    assert before.catalog_digest == digest_of(legacy)
    assert "instruction_files" not in before.model_dump(mode="json")
    root = InstructionFile(path="AGENTS.md", digest="sha256:" + "a" * 64, bytes=10)
    pkg = InstructionFile(path="pkg/AGENTS.md", digest="sha256:" + "b" * 64, bytes=20)
    with_files = capability_binding(tools, policy, (root, pkg))
    assert with_files.catalog_digest != before.catalog_digest
    assert with_files.catalog_generation == before.catalog_generation
    assert CapabilityBinding.model_validate_json(with_files.model_dump_json()) == with_files
    changed = capability_binding(tools, policy, (root.model_copy(update={"digest": "sha256:" + "c" * 64}),))
    assert binding_differences(with_files, changed) == [
        "instruction files no longer read: pkg/AGENTS.md",
        "instruction files changed since: AGENTS.md",
    ]
    assert binding_differences(before, changed) == ["instruction files read here only: AGENTS.md"]
    assert binding_differences(with_files, capability_binding(tools, policy, (root, pkg))) == []


def test_the_run_start_event_names_the_files_only_when_there_are_some() -> None:
    plain = RunStartEvent(prompt="hi", model="scripted/static")
    assert json.loads(plain.model_dump_json()) == {
        "type": "run_start",
        "prompt": "hi",
        "model": "scripted/static",
        "resumed_from": None,
    }
    read = InstructionFile(path="AGENTS.md", digest="sha256:" + "a" * 64, bytes=3)
    event = RunStartEvent(prompt="hi", model="scripted/static", instruction_files=(read,))
    assert json.loads(event.model_dump_json())["instruction_files"] == [read.model_dump(mode="json")]
    assert RunStartEvent.model_validate_json(event.model_dump_json()) == event


def test_the_cli_sends_instructions(tmp_path: Path) -> None:
    parser = build_parser()
    args = parser.parse_args(["run", "--prompt", "hi", "--instructions", "Be brief."])
    assert args.instructions == "Be brief."
    given = tmp_path / "rules.md"
    given.write_text("From a file.\n")
    args = parser.parse_args(["run", "--prompt", "hi", "--instructions-file", str(given)])
    assert args.instructions == "From a file.\n"
    assert parser.parse_args(["run", "--prompt", "hi"]).instructions is None
    with pytest.raises(SystemExit):
        parser.parse_args(["run", "--prompt", "hi", "--instructions-file", str(tmp_path / "missing.md")])


# --- through a worker --------------------------------------------------------------


class SystemPrompts(RecordingProvider):
    """Keeps the system prompt of every model call besides its conversation."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.system: list[str] = []

    async def complete(self, call: ModelCallInput, model: str, on_text: TextSink) -> ModelResponse:
        self.system.append(call.system_prompt)
        return await super().complete(call, model, on_text)


RESPONSES: list[dict[str, Any]] = [read_call("r1", "a.txt"), final("done")]


async def test_the_model_receives_the_files_and_the_run_s_instructions(
    client: Client, tmp_path: Path
) -> None:
    repo = tree(tmp_path / "repo", {".git/": "", "AGENTS.md": "Root rules.\n", "ws/a.txt": "alpha\n"})
    config = scripted_config(tmp_path, RESPONSES, system_prompt="Base prompt.")
    model = SystemPrompts(build_providers(config)["scripted"])
    sink = RecordingSink()
    acts = AgentActivities(config, providers={"scripted": model}, sinks={"local": sink})
    async with running_worker(client, acts) as queue:
        handle = await start(client, queue, repo / "ws", "read a.txt", instructions="Answer in French.")
        result = await handle.result()
    assert result.status == "completed"
    [expected] = set(model.system)
    assert expected.startswith("Base prompt.\n\n# Project instructions")
    assert "## AGENTS.md\n\nRoot rules." in expected and expected.endswith("\n\nAnswer in French.")
    binding = sink.exports[0].open().logical_resume.capability_binding
    assert [(f.path, f.digest) for f in binding.instruction_files] == [
        ("AGENTS.md", sha256_digest(b"Root rules.\n"))
    ]


async def test_the_run_start_event_names_the_files_read(client: Client, tmp_path: Path) -> None:
    repo = tree(tmp_path / "repo", {".git/": "", "AGENTS.md": "Root rules.\n", "a.txt": "alpha\n"})
    config = scripted_config(tmp_path, RESPONSES)
    sink = RecordingSink()
    async with running_worker(client, AgentActivities(config, sinks={"local": sink})) as queue:
        handle = await start(client, queue, repo, "read a.txt")
        assert (await handle.result()).status == "completed"
        events = await handle.query(QUERY_EVENTS, 0, result_type=list[EventRecord])
    exported = sink.exports[0].open().source_run().events
    for started in (events[0].event, exported[0].event):
        assert isinstance(started, RunStartEvent)
        assert [(f.path, f.bytes) for f in started.instruction_files] == [("AGENTS.md", 12)]


async def test_a_resume_after_the_files_changed_says_so(client: Client, tmp_path: Path) -> None:
    repo = tree(tmp_path / "repo", {".git/": "", "AGENTS.md": "Root rules.\n", "ws/a.txt": "alpha\n"})
    config = scripted_config(tmp_path, RESPONSES)
    sink = RecordingSink()
    async with running_worker(client, AgentActivities(config, sinks={"local": sink})) as queue:
        assert (await (await start(client, queue, repo / "ws", "read a.txt")).result()).status == "completed"
        export = sink.exports[0]
        (repo / "AGENTS.md").write_text("Other rules.\n")
        (repo / "ws" / "AGENTS.md").write_text("New rules.\n")
        refused = await resume_run(client, export, queue=queue, workspace=str(repo / "ws"))
        with pytest.raises(WorkflowFailureError) as caught:
            await refused.result()
        forced = await resume_run(client, export, queue=queue, workspace=str(repo / "ws"), force_resume=True)
        assert (await forced.result()).status == "completed"
    message = str(caught.value.cause)
    assert "capability binding differs" in message
    assert "instruction files read here only: ws/AGENTS.md" in message
    assert "instruction files changed since: AGENTS.md" in message
    assert "the tool definitions differ" not in message
