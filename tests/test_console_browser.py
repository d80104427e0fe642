"""The console in a real browser: Debian's Chromium driven through chromium-driver by Selenium,
the console served by uvicorn, a real dev server and worker.

Selenium's calls block: each runs in a thread (``Browser``), so the worker and the console, which
share this event loop, go on meanwhile. ``CONSOLE_SCREENSHOTS=1`` saves the runs list and a run
page into ``docs/img/`` (the docs' screenshots).
"""

from __future__ import annotations

import asyncio
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from temporalio.client import Client

from durable_agent.activities import AgentActivities
from tests.helpers import awaiting_approval, final, running_worker, scripted_config, start, tool_call, until
from tests.test_console_api import PERMISSIONS, TOKEN, console, ls_workspace
from tests.test_rewind_update import AFTER, activities, awaiting_prompt
from tests.test_rewind_update import workspace as writing_workspace
from tests.test_subagents import TreeModel, agents_config, repository
from tests.test_workspace_checkpoints import files_of

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
DRIVER = shutil.which("chromedriver")
pytestmark = pytest.mark.skipif(
    CHROMIUM is None or DRIVER is None,
    reason="no chromium or chromedriver (apt-get install chromium chromium-driver; .ci/run does as root)",
)
DOCS_IMG = Path(__file__).resolve().parents[1] / "docs" / "img"


class Browser:
    """A headless Chromium; every call runs in a thread."""

    def __init__(self) -> None:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service

        options = webdriver.ChromeOptions()
        options.binary_location = str(CHROMIUM)
        for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"):
            options.add_argument(flag)
        options.add_argument("--window-size=1400,1000")
        options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
        self.driver = webdriver.Chrome(service=Service(str(DRIVER)), options=options)

    async def get(self, url: str) -> None:
        await asyncio.to_thread(self.driver.get, url)

    async def js(self, script: str, *args: Any) -> Any:
        return await asyncio.to_thread(self.driver.execute_script, script, *args)

    async def until(self, what: str, script: str, *args: Any, timeout: float = 30) -> Any:
        """The script's value once truthy (``what`` says what was awaited, at the timeout)."""
        return await until(what, lambda: self.js(script, *args), timeout, interval=0.2)

    async def texts(self, selector: str) -> list[str]:
        """The text of every element ``selector`` finds."""
        found: list[str] = await self.js(
            "return [...document.querySelectorAll(arguments[0])].map(e => e.textContent)", selector
        )
        return found

    async def click(self, selector: str) -> None:
        def click() -> None:
            self.driver.find_element("css selector", selector).click()

        await asyncio.to_thread(click)

    async def type(self, selector: str, text: str) -> None:
        def type_() -> None:
            self.driver.find_element("css selector", selector).send_keys(text)

        await asyncio.to_thread(type_)

    async def answer_prompt(self, text: str) -> None:
        """Type ``text`` into the page's ``window.prompt`` and accept it."""

        def answer() -> None:
            from selenium.webdriver.support.ui import WebDriverWait

            alert = WebDriverWait(self.driver, 10).until(lambda d: d.switch_to.alert)
            alert.send_keys(text)
            alert.accept()

        await asyncio.to_thread(answer)

    async def screenshot(self, name: str) -> None:
        if os.environ.get("CONSOLE_SCREENSHOTS"):
            DOCS_IMG.mkdir(parents=True, exist_ok=True)
            await asyncio.to_thread(self.driver.save_screenshot, str(DOCS_IMG / name))

    def errors(self) -> list[str]:
        """The page's console errors (a CSP violation among them)."""
        logs: list[dict[str, Any]] = self.driver.get_log("browser")  # type: ignore[no-untyped-call]
        return [e["message"] for e in logs if e["level"] == "SEVERE"]


@pytest.fixture
def browser() -> Iterator[Browser]:
    b = Browser()
    try:
        yield b
    finally:
        b.driver.quit()


async def signed_in(browser: Browser, base: str) -> None:
    await browser.get(f"{base}/?token={TOKEN}")


async def test_a_waiting_run_is_listed_and_approved_by_a_click(
    client: Client, tmp_path: Path, browser: Browser
) -> None:
    todos = [
        {"id": "look", "content": "List the files", "status": "in_progress"},
        {"content": "Say what they are", "status": "pending"},
    ]
    script = [
        {"thinking": "A plan first, then the files.", **tool_call("t1", "todo_write", todos=todos)},
        tool_call("r1", "read", file_path="long.txt"),
        {**final("Looking at the files first."), **tool_call("l1", "ls", path=".")},
        final("Two files: a.txt and b.txt. <script>alert(1)</script> <b>not bold</b>"),
    ]
    config = scripted_config(tmp_path, script, permissions=PERMISSIONS)
    async with running_worker(client, AgentActivities(config)) as queue:
        ws = ls_workspace(tmp_path)
        (ws / "long.txt").write_text("".join(f"line {i} of a long file\n" for i in range(200)))
        handle = await start(client, queue, ws, "list the files, then say what they are")
        await awaiting_approval(handle)
        async with console(client, queue, tmp_path) as base:
            await signed_in(browser, base)
            # the runs list: the waiting run stands out
            row = f'#runs tr.waiting[data-workflow-id="{handle.id}"]'
            await browser.until("the waiting run, highlighted", f"return !!document.querySelector('{row}')")
            badge = await browser.js(f"return document.querySelector('{row} .badge').textContent")
            assert badge == "waits for an approval"
            await browser.screenshot("console-runs.png")
            await browser.click(f"{row} a")
            await browser.until("the run's page", "return location.pathname.startsWith('/runs/')")
            # the approval: a reason typed, then a click
            await browser.until(
                "the call to decide", "return !!document.querySelector('.approval button.approve')"
            )
            assert "ls" in await browser.js("return document.querySelector('.approval .label').textContent")
            # thinking and a long output folded, the plan in the todo list
            assert await browser.texts("#conversation .ev.thinking details:not([open]) pre") == [
                "A plan first, then the files."
            ]
            folded = await browser.texts("#conversation .ev.tool-out details:not([open]) summary")
            assert any(f.startswith("read output") for f in folded), folded
            assert await browser.texts("#todos li") == ["▶ List the files", "☐ Say what they are"]
            await browser.type(".approval input", "fine by me")
            await browser.screenshot("console-run.png")
            await browser.click(".approval button.approve")
            result = await handle.result()
            assert result.status == "completed"
            # the run's answer, on the same page (no reload), as text
            await browser.until("the run's end", "return !!document.querySelector('#conversation .ev.end')")
            shown = await browser.texts("#conversation .ev.assistant pre")
            assert "Two files: a.txt and b.txt. <script>alert(1)</script> <b>not bold</b>" in shown
            scripts = await browser.js(
                "return document.querySelectorAll('#conversation script, #conversation b').length"
            )
            assert scripts == 0
            html = await browser.js("return document.getElementById('conversation').innerHTML")
            assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html
            received = await browser.texts("#conversation .ev.ask")
            assert any("approved: fine by me" in r for r in received), received
            assert browser.errors() == []  # no script error, no CSP violation


async def test_streamed_text_appears_without_a_reload(
    client: Client, tmp_path: Path, browser: Browser
) -> None:
    words = " ".join(f"word{i}" for i in range(200))
    config = scripted_config(
        tmp_path,
        [{**final(words), "thinking": "<b>pondering</b> first", "delay_ms": 8000}],
        timeouts={"heartbeat_seconds": 1},
    )
    async with running_worker(client, AgentActivities(config)) as queue:
        handle = await start(client, queue, ls_workspace(tmp_path), "say many words")
        async with console(client, queue, tmp_path) as base:
            await signed_in(browser, base)
            await browser.get(f"{base}/runs/{handle.id}")
            await browser.js("window.__same_page = true")
            live = await browser.until(
                "the model's text while it streams",
                "const l = document.getElementById('live'); return !l.hidden && l.textContent",
            )
            assert live.startswith("word0") and len(live) < len(words)
            # its thinking beside it, folded and as text, never in the answer
            thinking = await browser.js(
                "const t = document.getElementById('live-thinking');"
                "return [t.hidden, t.open, t.querySelector('pre').textContent]"
            )
            assert thinking == [False, False, "<b>pondering</b> first"], thinking
            assert "pondering" not in live
            assert not await browser.js("return !!document.querySelector('#conversation .ev.assistant')")
            await until(
                "the answer, whole",
                lambda: browser.texts("#conversation .ev.assistant pre"),
                30,
                interval=0.2,
            )
            assert await browser.texts("#conversation .ev.assistant pre") == [words]
            assert await browser.js("return window.__same_page === true")  # never reloaded
        await handle.result()


async def test_a_boundarys_diff_and_rewind_to_here(client: Client, tmp_path: Path, browser: Browser) -> None:
    ws = writing_workspace(tmp_path)
    acts, _ = activities(tmp_path)
    async with running_worker(client, acts) as queue:
        handle = await start(client, queue, ws, "write, then build", follow_ups=True)
        await awaiting_prompt(handle)
        assert files_of(ws)["a.txt"][0] == b"changed\n"
        async with console(client, queue, tmp_path) as base:
            await signed_in(browser, base)
            # the boundary's own link: its diff shown on arrival
            await browser.get(f"{base}/runs/{handle.id}/turns/2")
            await browser.until("boundary 2's diff", "return !!document.querySelector('#turn-2 .patch')")
            added = await browser.js(
                "return [...document.querySelectorAll('#turn-2 .patch .add')].map(e => e.textContent)"
            )
            deleted = await browser.js(
                "return [...document.querySelectorAll('#turn-2 .patch .del')].map(e => e.textContent)"
            )
            assert "+changed\n" in added and "+beta\n" in added and "-alpha\n" in deleted
            assert await browser.js("return document.getElementById('turn-2').classList.contains('focused')")
            await browser.screenshot("console-boundary.png")
            # rewind to boundary 1: the confirmation (with the message the run goes on with), the outcome
            await browser.click("#turn-1 button.danger")
            await browser.answer_prompt(AFTER)
            outcome = await browser.until(
                "the rewind's outcome",
                "const t = document.getElementById('outcome').textContent; return t.includes('rewound') && t",
            )
            assert "rewound to turn 1" in outcome and "restored" in outcome
            assert "b.txt" not in files_of(ws) and files_of(ws)["a.txt"][0] == b"alpha\n"
            await awaiting_prompt(handle)
            await browser.until(
                "the answer after the rewind",
                "return document.getElementById('conversation').textContent.includes('answered from turn 1')",
            )
            assert browser.errors() == []
            await handle.signal("end")
        await handle.result()


async def test_the_children_tree_links_each_child_and_back(
    client: Client, tmp_path: Path, browser: Browser
) -> None:
    acts = AgentActivities(agents_config(tmp_path), providers={"scripted": TreeModel()})
    async with running_worker(client, acts) as queue:
        handle = await start(client, queue, repository(tmp_path), "fan out: alpha beta")
        await handle.result()
        async with console(client, queue) as base:
            await signed_in(browser, base)
            await browser.get(f"{base}/runs/{handle.id}")
            await browser.until(
                "the children", "return document.querySelectorAll('#children a').length === 2"
            )
            assert sorted(await browser.texts("#children a")) == ["read alpha", "read beta"]
            await browser.click("#children a")
            await browser.until("the child's page", "return location.pathname.includes('/task-')")
            await browser.until(
                "its parent's link",
                "return !!document.querySelector('#links a[href$=\"' + arguments[0] + '\"]')",
                f"/runs/{handle.id}",
            )
            await browser.until(
                "the child's answer",
                "return document.getElementById('conversation').textContent.includes('SUMMARY-')",
            )
            assert browser.errors() == []
