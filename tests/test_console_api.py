"""The console's JSON API over real HTTP: uvicorn on a free port, a real dev server and worker.

Its guard (token, cookie, CSRF, CSP), and each action through the run's own update or signal.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from temporalio.client import Client

from durable_agent.activities import AgentActivities
from durable_agent.cli.console import CliSinkFiles
from durable_agent.client import run_result
from durable_agent.codec import data_converter, new_key
from durable_agent.config import CodecConfig
from durable_agent.console.api import ConsoleState
from durable_agent.console.app import codec_note, create_app, running_console
from durable_agent.console.auth import CSP, ConsoleAuthError, check_bind, console_token
from tests.helpers import awaiting_approval, final, running_worker, scripted_config, start, tool_call, until
from tests.test_rewind_update import AFTER, activities, awaiting_prompt
from tests.test_rewind_update import workspace as writing_workspace
from tests.test_subagents import TreeModel, agents_config, repository
from tests.test_workspace_checkpoints import cli_config, files_of

TOKEN = "console-test-token-" + "x" * 12
PERMISSIONS = {"allow": ["read(*)"], "ask": ["ls"], "default": "deny"}
BEARER = {"Authorization": f"Bearer {TOKEN}"}


@asynccontextmanager
async def console(client: Client, queue: str, tmp: Path | None = None) -> AsyncIterator[str]:
    """The console of ``queue`` on a free port; yields its URL. With ``tmp``: ``AGENT_CONFIG`` is a
    config with the test's sink (the diffs and exports are read from it, on "another machine")."""
    before = os.environ.get("AGENT_CONFIG")
    if tmp is not None:
        os.environ["AGENT_CONFIG"] = str(cli_config(tmp))
    state = ConsoleState(
        task_queue=queue,
        namespace=client.namespace,
        temporal_ui="http://localhost:8233",
        codec=codec_note(CodecConfig()),
    )
    try:
        async with running_console(create_app(client, TOKEN, state, files=CliSinkFiles())) as (url, _):
            yield url
    finally:
        if before is None:
            os.environ.pop("AGENT_CONFIG", None)
        else:
            os.environ["AGENT_CONFIG"] = before


def ls_workspace(tmp: Path) -> Path:
    ws = tmp / "ws"
    ws.mkdir()
    (ws / "a.txt").write_text("alpha\n")
    return ws


async def signed_in(http: httpx.AsyncClient) -> str:
    """Open the printed link: the cookies set; returns the CSRF cookie's value."""
    opened = await http.get(f"/?token={TOKEN}")
    assert opened.status_code == 303, opened.text
    return http.cookies["durable_console_csrf"]


async def test_every_request_needs_the_token(client: Client, tmp_path: Path) -> None:
    async with console(client, "nobody") as base, httpx.AsyncClient() as plain:
        for path in ("/api/runs", "/api/info", "/", "/runs/x", "/static/run.js", "/api/runs/x/events"):
            refused = await plain.get(base + path)
            assert refused.status_code == 401, path
            assert refused.headers["content-security-policy"] == CSP
        wrong = await plain.get(base + "/api/runs", headers={"Authorization": "Bearer not-the-token-at-all"})
        assert wrong.status_code == 401 and "token" in wrong.json()["error"]
        assert (await plain.get(base + "/?token=wrong")).status_code == 401
        assert (await plain.get(base + "/api/info", headers=BEARER)).json()["task_queue"] == "nobody"
        # the printed link: an HttpOnly, SameSite=Strict cookie, and the page without the token
        opened = await plain.get(base + f"/runs/abc?token={TOKEN}&x=1")
        assert opened.status_code == 303 and opened.headers["location"] == "/runs/abc?x=1"
        cookies = opened.headers.get_list("set-cookie")
        assert any(
            c.startswith("durable_console=") and "HttpOnly" in c and "SameSite=Strict" in c for c in cookies
        )
        page = await plain.get(base + "/runs/abc")
        assert page.status_code == 200 and "<script>" not in page.text and 'src="/static/run.js"' in page.text
        assert "script-src 'self'" in page.headers["content-security-policy"]
        assert "unsafe-inline" not in page.headers["content-security-policy"]
        assert (await plain.get(base + "/static/run.js")).status_code == 200


async def test_a_cross_site_post_is_refused(client: Client) -> None:
    async with console(client, "nobody") as base, httpx.AsyncClient(base_url=base) as http:
        csrf = await signed_in(http)
        target = "/api/runs/no-such-run/cancel"
        cross = await http.post(
            target, json={}, headers={"Origin": "https://evil.example", "X-CSRF-Token": csrf}
        )
        assert cross.status_code == 403 and "evil.example" in cross.json()["error"]
        fetched = await http.post(
            target, json={}, headers={"Sec-Fetch-Site": "cross-site", "X-CSRF-Token": csrf}
        )
        assert fetched.status_code == 403 and "cross-site" in fetched.json()["error"]
        unpaired = await http.post(target, json={})  # the cookie alone: no CSRF header
        assert unpaired.status_code == 403 and "x-csrf-token" in unpaired.json()["error"]
        forged = await http.post(target, json={}, headers={"X-CSRF-Token": "guessed"})
        assert forged.status_code == 403
        # the page's own request gets through the guard (and the run is not there)
        own = await http.post(target, json={}, headers={"X-CSRF-Token": csrf, "Origin": base})
        assert own.status_code == 404, own.text
        # an API client with the token: no cookie, so no CSRF token needed; a cross-site one still refused
        async with httpx.AsyncClient(base_url=base, headers=BEARER) as api:
            assert (await api.post(target, json={})).status_code == 404
            assert (
                await api.post(target, json={}, headers={"Origin": "https://evil.example"})
            ).status_code == 403


async def test_approve_over_the_api_and_the_run_goes_on(client: Client, tmp_path: Path) -> None:
    config = scripted_config(
        tmp_path, [tool_call("l1", "ls", path="."), final("listed")], permissions=PERMISSIONS
    )
    async with running_worker(client, AgentActivities(config)) as queue:
        handle = await start(client, queue, ls_workspace(tmp_path), "list the files")
        await awaiting_approval(handle)
        async with (
            console(client, queue, tmp_path) as base,
            httpx.AsyncClient(base_url=base, headers=BEARER) as api,
        ):

            async def waiting() -> list[dict[str, Any]]:
                answer = await api.get("/api/runs", params={"status": "awaiting_approval"})
                assert answer.status_code == 200, answer.text
                runs: list[dict[str, Any]] = answer.json()["runs"]
                return runs

            # visibility follows the run's search attributes a moment later
            listed = await until("the waiting run in the console's list", waiting, 30, interval=0.2)
            assert [(r["workflow_id"], r["waiting_for_person"]) for r in listed] == [(handle.id, True)]
            assert listed[0]["summary"] == "list the files" and listed[0]["pending_approvals"] == 1
            searched = (await api.get("/api/runs", params={"q": "no such words"})).json()["runs"]
            assert searched == []
            view = (await api.get(f"/api/runs/{handle.id}")).json()
            [pending] = view["status"]["pending_approvals"]
            assert (pending["call_id"], pending["tool"]) == ("l1", "ls")
            assert view["temporal_ui"].endswith(f"/workflows/{handle.id}")
            bad = await api.post(f"/api/runs/{handle.id}/approve", json={"call_id": "l1"})
            assert bad.status_code == 400 and "approved" in bad.json()["error"]
            decided = await api.post(
                f"/api/runs/{handle.id}/approve", json={"call_id": "l1", "approved": True, "reason": "fine"}
            )
            assert decided.status_code == 200, decided.text
            assert decided.json() == {"call_id": "l1", "tool": "ls", "approved": True}
            result = await handle.result()
            assert result.status == "completed" and result.text == "listed"
            # the run's own refusal, as it gave it
            again = await api.post(f"/api/runs/{handle.id}/approve", json={"call_id": "l1", "approved": True})
            assert again.status_code in (404, 409, 502), again.text


async def test_the_event_stream_delivers_the_runs_events_and_html_comes_back_as_text(
    client: Client, tmp_path: Path
) -> None:
    hostile = "<script>alert(1)</script><b>bold</b>"
    config = scripted_config(tmp_path, [{**final(hostile), "delay_ms": 1500}])
    async with running_worker(client, AgentActivities(config)) as queue:
        handle = await start(client, queue, ls_workspace(tmp_path), "say something")
        async with console(client, queue) as base, httpx.AsyncClient(base_url=base, headers=BEARER) as api:
            kinds: list[str] = []
            texts: list[str] = []
            async with api.stream("GET", f"/api/runs/{handle.id}/events/stream", timeout=30) as answer:
                assert answer.headers["content-type"].startswith("text/event-stream")
                kind = ""
                async for line in answer.aiter_lines():
                    if line.startswith("event: "):
                        kind = line[7:]
                        kinds.append(kind)
                    elif line.startswith("data: ") and kind == "event":
                        event = json.loads(line[6:])["event"]
                        texts.append(event.get("text", ""))
                    if kind == "closed":
                        break
            assert "event" in kinds and kinds[-1] == "closed"
            assert hostile in texts  # the model's text, byte for byte: the page shows it as text
            events = (await api.get(f"/api/runs/{handle.id}/events", params={"after": 0})).json()["events"]
            assert events[0]["event"]["type"] == "run_start"
            assert events[-1]["event"] == {**events[-1]["event"], "type": "end", "text": hostile}
            later = (await api.get(f"/api/runs/{handle.id}/events", params={"after": len(events) - 1})).json()
            assert [e["sequence"] for e in later["events"]] == [events[-1]["sequence"]]
        await handle.result()


async def test_files_diff_export_steer_rewind_prompt_and_end(client: Client, tmp_path: Path) -> None:
    ws = writing_workspace(tmp_path)
    acts, _ = activities(tmp_path)
    async with running_worker(client, acts) as queue:
        handle = await start(client, queue, ws, "write, then build", follow_ups=True)
        await awaiting_prompt(handle)
        async with (
            console(client, queue, tmp_path) as base,
            httpx.AsyncClient(base_url=base, headers=BEARER) as api,
        ):
            run = f"/api/runs/{handle.id}"
            second = (await api.get(f"{run}/diff", params={"turn": 2})).json()
            assert "-alpha\n+changed\n" in second["diff"] and second["tool"] == "bash"
            assert {f["path"] for f in second["files"]} == {"a.txt", "b.txt"}
            whole = (await api.get(f"{run}/diff")).json()
            assert whole["turn"] is None and "+beta" in whole["diff"]
            beyond = await api.get(f"{run}/diff", params={"turn": 9})
            assert beyond.status_code == 404 and "no turn 9" in beyond.json()["error"]
            view = (await api.get(run)).json()
            [first] = [e for e in view["exports"] if e["turn"] == 1]
            download = await api.get(f"{run}/exports/1")
            assert download.status_code == 200 and "attachment" in download.headers["content-disposition"]
            assert json.loads(download.content)["descriptor"]["content_digest"] == first["content_digest"]
            # steer is for a working run: the run's own refusal comes back
            steered = await api.post(f"{run}/steer", json={"text": "hurry"})
            assert steered.status_code == 409 and steered.json()["refused"], steered.text
            blank = await api.post(f"{run}/prompt", json={"text": "  "})
            assert blank.status_code == 400
            rewound = await api.post(f"{run}/rewind", json={"turn": 1, "prompt": AFTER})
            assert rewound.status_code == 200, rewound.text
            assert rewound.json()["turn"] == 1 and "restored" in rewound.json()["outcome"]
            assert "b.txt" not in files_of(ws) and files_of(ws)["a.txt"][0] == b"alpha\n"
            await awaiting_prompt(handle)
            prompted = await api.post(f"{run}/prompt", json={"text": "and now?"})
            assert prompted.status_code == 200 and "after_sequence" in prompted.json()
            await awaiting_prompt(handle)
            ended = await api.post(f"{run}/end")
            assert ended.status_code == 200
            result = await handle.result()
            assert result.status == "completed"
            closed = await api.post(f"{run}/cancel", json={"reason": "late"})
            assert closed.status_code in (404, 502) and closed.json()["error"]


def test_no_bind_beyond_loopback_without_a_token_of_ones_own() -> None:
    assert console_token({})[1] is False and len(console_token({})[0]) >= 24
    assert console_token({"AGENT_CONSOLE_TOKEN": TOKEN}) == (TOKEN, True)
    with pytest.raises(ConsoleAuthError, match="at least"):
        console_token({"AGENT_CONSOLE_TOKEN": "short"})
    check_bind("127.0.0.1", False)
    check_bind("::1", False)
    check_bind("0.0.0.0", True)
    with pytest.raises(ConsoleAuthError, match="AGENT_CONSOLE_TOKEN"):
        check_bind("0.0.0.0", False)
    env = {k: v for k, v in os.environ.items() if k != "AGENT_CONSOLE_TOKEN"}
    done = subprocess.run(
        [sys.executable, "-m", "durable_agent.cli", "console", "--bind", "0.0.0.0:0"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert done.returncode == 2 and "AGENT_CONSOLE_TOKEN" in done.stderr, done.stderr


async def test_with_a_codec_the_console_decodes_with_the_workers_keys_and_says_so(
    client: Client, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CONSOLE_TEST_KEY", new_key())
    config = scripted_config(
        tmp_path,
        [tool_call("l1", "ls", path="."), final("listed")],
        permissions=PERMISSIONS,
        codec={"keys": {"k1": "CONSOLE_TEST_KEY"}, "encrypt_with": "k1"},
    )
    options = client.config()
    options["data_converter"] = data_converter(config.codec)
    codec_client = Client(**options)  # the same connection, with the workers' keys
    async with running_worker(codec_client, AgentActivities(config)) as queue:
        handle = await start(codec_client, queue, ls_workspace(tmp_path), "an encrypted prompt")
        await awaiting_approval(handle)
        state = ConsoleState(
            task_queue=queue,
            namespace=client.namespace,
            temporal_ui="http://ui",
            codec=codec_note(config.codec),
        )
        assert "decrypted here with the workers' [codec] keys" in state.codec and "k1" in state.codec
        # without the keys: the console says what is missing, it does not fail
        async with (
            running_console(create_app(client, TOKEN, state, files=CliSinkFiles())) as (base, _),
            httpx.AsyncClient(base_url=base, headers=BEARER) as api,
        ):
            blind = await api.get(f"/api/runs/{handle.id}/events")
            assert blind.status_code == 500 and "[codec]" in blind.json()["error"], blind.text
        async with (
            running_console(create_app(codec_client, TOKEN, state, files=CliSinkFiles())) as (base, _),
            httpx.AsyncClient(base_url=base, headers=BEARER) as api,
        ):
            assert "k1" in (await api.get("/api/info")).json()["codec"]
            events = (await api.get(f"/api/runs/{handle.id}/events")).json()["events"]
            assert events[0]["event"]["prompt"] == "an encrypted prompt"
            # the decision goes encrypted with the key, as the run requires
            decided = await api.post(
                f"/api/runs/{handle.id}/approve", json={"call_id": "l1", "approved": True}
            )
            assert decided.status_code == 200, decided.text
            result = await handle.result()
    assert result.status == "completed" and result.text == "listed"


async def test_the_command_prints_a_link_that_opens_the_console(client: Client, tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "AGENT_CONSOLE_TOKEN"}
    env["TEMPORAL_ADDRESS"] = client.service_client.config.target_host
    env["TEMPORAL_NAMESPACE"] = client.namespace
    env["AGENT_CONFIG"] = str(cli_config(tmp_path))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    command = [sys.executable, "-m", "durable_agent.cli", "console", "--bind", f"127.0.0.1:{port}"]
    process = await asyncio.create_subprocess_exec(*command, env=env, stdout=asyncio.subprocess.PIPE)
    try:
        assert process.stdout is not None
        line = (await asyncio.wait_for(process.stdout.readline(), 60)).decode()
        link = line.split(": ", 1)[1].strip()
        assert link.startswith(f"http://127.0.0.1:{port}/?token=")
        assert "not encrypted" in (await asyncio.wait_for(process.stdout.readline(), 10)).decode()
        async with httpx.AsyncClient(follow_redirects=True) as browser:
            page = await browser.get(link)
            assert page.status_code == 200 and "/static/runs.js" in page.text
            assert str(page.url) == f"http://127.0.0.1:{port}/"  # the token left the address
            assert (await browser.get(f"http://127.0.0.1:{port}/api/runs")).status_code == 200
    finally:
        process.terminate()
        await process.wait()


async def test_a_run_that_continued_as_new_shows_its_whole_conversation(
    client: Client, tmp_path: Path
) -> None:
    reads = [tool_call(f"r{i}", "read", file_path="a.txt") for i in range(40)]
    config = scripted_config(tmp_path, [*reads, final("done")], limits={"continue_as_new_events": 50})
    async with running_worker(client, AgentActivities(config)) as queue:
        handle = await start(
            client, queue, ls_workspace(tmp_path), "read a.txt forty times", max_tool_rounds=45
        )
        result = await handle.result()
        assert result.status == "completed"
        held = await handle.query("events", 0, result_type=list[dict[str, Any]])
        assert held[0]["sequence"] > 1  # the run itself holds only its newest events
        async with (
            console(client, queue, tmp_path) as base,
            httpx.AsyncClient(base_url=base, headers=BEARER) as api,
        ):
            events = (await api.get(f"/api/runs/{handle.id}/events")).json()["events"]
            assert [e["sequence"] for e in events] == list(range(1, len(events) + 1))
            assert events[0]["event"]["type"] == "run_start" and events[-1]["event"]["type"] == "end"
            assert sum(e["event"]["type"] == "tool_end" for e in events) == 40
            later = (await api.get(f"/api/runs/{handle.id}/events", params={"after": 10})).json()["events"]
            assert later[0]["sequence"] == 11 and len(later) == len(events) - 10
            bogus = await api.get("/api/runs", params={"status": "bogus"})
            assert bogus.status_code == 400 and "status must be one of" in bogus.json()["error"]


async def test_rewind_of_an_ended_run_restores_here_and_goes_on_as_a_new_run(
    client: Client, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the console's own connection, as `durable-agent rewind` makes it (it finds the run's workspace)
    monkeypatch.setenv("TEMPORAL_ADDRESS", client.service_client.config.target_host)
    monkeypatch.setenv("TEMPORAL_NAMESPACE", client.namespace)
    ws = writing_workspace(tmp_path)
    acts, _ = activities(tmp_path)
    async with running_worker(client, acts) as queue:
        handle = await start(client, queue, ws, "write, then build")
        assert (await handle.result()).status == "completed"
        assert files_of(ws)["a.txt"][0] == b"changed\n"
        async with (
            console(client, queue, tmp_path) as base,
            httpx.AsyncClient(base_url=base, headers=BEARER) as api,
        ):
            rewound = await api.post(f"/api/runs/{handle.id}/rewind", json={"turn": 1, "prompt": AFTER})
            assert rewound.status_code == 200, rewound.text
            answer = rewound.json()
            assert answer["turn"] == 1 and answer["tree"] and answer["workflow_id"] != handle.id
            assert "restored to turn 1" in answer["outcome"]
            assert "b.txt" not in files_of(ws) and files_of(ws)["a.txt"][0] == b"alpha\n"
            resumed = await run_result(client, answer["workflow_id"])
            assert resumed.status == "completed" and resumed.text == "answered from turn 1"
            beyond = await api.post(f"/api/runs/{handle.id}/rewind", json={"turn": 9})
            assert beyond.status_code == 409 and "no export at turn 9" in beyond.json()["error"]


async def test_a_runs_children_each_have_their_own_url(client: Client, tmp_path: Path) -> None:
    model = TreeModel()
    acts = AgentActivities(agents_config(tmp_path), providers={"scripted": model})
    async with running_worker(client, acts) as queue:
        handle = await start(client, queue, repository(tmp_path), "fan out: alpha beta")
        assert (await run_result(client, handle.id)).status == "completed"
        async with console(client, queue) as base, httpx.AsyncClient(base_url=base, headers=BEARER) as api:
            parent = (await api.get(f"/api/runs/{handle.id}")).json()
            children = parent["status"]["children"]
            assert sorted(c["description"] for c in children) == ["read alpha", "read beta"]
            for child in children:
                assert child["workflow_id"].startswith(f"{handle.id}/")  # an id with a "/" in it
                view = await api.get(f"/api/runs/{child['workflow_id']}")
                assert view.status_code == 200, view.text
                assert view.json()["parent_workflow_id"] == handle.id
                assert view.json()["result"]["status"] == "completed"
                events = (await api.get(f"/api/runs/{child['workflow_id']}/events")).json()["events"]
                assert events[0]["event"]["prompt"] == f"read {child['description'][5:]}/notes.txt"
                page = await api.get(f"/runs/{child['workflow_id']}/turns/1")
                assert page.status_code == 200 and "/static/run.js" in page.text
