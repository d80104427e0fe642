"""What the console costs: loading a run of 1,000 boundaries, and its memory with 100 runs listed.
Run from the repository root (about a minute and a half on 2 cores; figures in docs/console.md):

    python bench/console_cost.py
    python bench/console_cost.py --boundaries 200 --runs 20

It starts an in-memory dev server and a worker (the scripted model: one run of ``--boundaries``
``read`` calls, each a boundary with its export, and ``--runs`` one-answer runs), then
``durable-agent console`` in a process of its own, as a person starts it. It prints:

1. **the console's memory** (its resident set, ``VmRSS``): listening, after the runs list of
   ``--runs`` runs is read once (cold: every row read from Temporal) and again (warm: the ended
   runs' rows kept), with each read's time.
2. **a run of N boundaries** through the API: the run's view and its events (time, bytes, how
   many events the run holds).
3. **in Chromium** (when ``chromium`` and ``chromedriver`` are installed): the run page's first
   paint (``first-contentful-paint``) and the time until every boundary is on the page, the same
   for a boundary's own link (``/runs/ID/turns/N``), and the runs list's.

It prints numbers and never judges them.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import socket
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout

import httpx

from bench.proc_sample import rss_mb
from durable_agent.activities import AgentActivities
from durable_agent.client import start_run
from durable_agent.config import parse_config
from durable_agent.core.run_api import AgentRunInput
from durable_agent.devserver import start_ephemeral_server
from durable_agent.worker import build_worker

TOKEN = "console-bench-token-0123456789"


def _config(tmp: Path, boundaries: int) -> tuple[Any, Path]:
    """The worker's config (a script of ``boundaries`` reads, then an answer) and the console's file."""
    script = tmp / "script.json"
    calls = [
        {"tool_calls": [{"id": f"r{i}", "name": "read", "input": {"file_path": "a.txt"}}]}
        for i in range(boundaries)
    ]
    script.write_text(json.dumps({"responses": [*calls, {"text": "done reading"}]}))
    short = tmp / "short.json"
    short.write_text(json.dumps({"responses": [{"text": "a short answer"}]}))
    data: dict[str, Any] = {
        "default_model": "scripted/long",
        "providers": {
            "scripted": {"kind": "scripted", "script": str(script)},
            "short": {"kind": "scripted", "script": str(short)},
        },
        "store": {"path": str(tmp / "store")},
        "sinks": {"local": {"kind": "filesystem", "path": str(tmp / "exports")}},
        "permissions": {"allow": ["read(*)"], "default": "deny"},
        "max_tool_rounds": min(boundaries + 10, 10_000),
    }
    console = tmp / "console.toml"
    console.write_text(f'[sinks.local]\nkind = "filesystem"\npath = "{tmp / "exports"}"\n')
    return parse_config(data, tmp), console


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


async def _timed(http: httpx.AsyncClient, path: str) -> tuple[float, httpx.Response]:
    began = time.perf_counter()
    answer = await http.get(path)
    answer.raise_for_status()
    return (time.perf_counter() - began) * 1000, answer


def _browser(base: str, run_id: str, boundaries: int, shown: int) -> list[tuple[str, str]]:
    """First paint and full load of the run page (``shown`` boundaries on it), a boundary's page
    and the runs list."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = shutil.which("chromium") or ""
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(shutil.which("chromedriver") or ""), options=options)
    rows: list[tuple[str, str]] = []
    try:
        driver.get(f"{base}/?token={TOKEN}")
        for label, path, ready in (
            ("run page", f"/runs/{run_id}", f"document.querySelectorAll('.boundary[id]').length >= {shown}"),
            (
                f"boundary {boundaries}'s page",
                f"/runs/{run_id}/turns/{boundaries}",
                f"!!document.querySelector('#turn-{boundaries}.focused')",
            ),
            ("runs list", "/", "document.querySelectorAll('#runs tbody tr').length > 0"),
        ):
            began = time.perf_counter()
            driver.get(base + path)
            while not driver.execute_script(f"return {ready}"):
                if time.perf_counter() - began > 120:
                    break
                time.sleep(0.02)
            loaded = (time.perf_counter() - began) * 1000
            paint = driver.execute_script(
                "const p = performance.getEntriesByName('first-contentful-paint')[0];"
                "return p ? p.startTime : null"
            )
            nodes = driver.execute_script("return document.getElementsByTagName('*').length")
            phases = driver.execute_script(
                "return performance.getEntriesByType('mark').filter(m => m.name.startsWith('console:'))"
                ".map(m => [m.name.slice(8), Math.round(m.startTime)])"
            )
            rows.append((f"{label}: first paint", f"{paint:,.0f} ms" if paint is not None else "n/a"))
            rows.append((f"{label}: loaded (all its content)", f"{loaded:,.0f} ms, {nodes:,} elements"))
            if phases:  # when the page's script reached each phase, from the navigation's start
                rows.append(
                    (f"{label}: its phases", ", ".join(f"{name} at {ms:,} ms" for name, ms in phases))
                )
    finally:
        driver.quit()
    return rows


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--boundaries", type=int, default=1000)
    parser.add_argument("--runs", type=int, default=100)
    args = parser.parse_args()
    rows: list[tuple[str, str]] = []
    env = await start_ephemeral_server()
    client = env.client
    with tempfile.TemporaryDirectory() as folder:
        tmp = Path(folder)
        ws = tmp / "ws"
        ws.mkdir()
        (ws / "a.txt").write_text("alpha\n")
        config, console_config = _config(tmp, args.boundaries)
        queue = "console-bench"
        async with build_worker(client, AgentActivities(config), queue):
            began = time.perf_counter()
            long = await start_run(
                client, AgentRunInput(prompt="read a.txt many times", workspace=str(ws)), queue=queue
            )
            result = await long.result()
            rows.append(
                (
                    f"the run of {args.boundaries} boundaries",
                    f"{result.status} in {time.perf_counter() - began:,.1f} s, {len(result.exports)} exports",
                )
            )
            short = AgentRunInput(prompt="answer briefly", workspace=str(ws), model="short/one")
            handles = [await start_run(client, short, queue=queue) for _ in range(args.runs - 1)]
            await asyncio.gather(*(h.result() for h in handles))
            port = _free_port()
            process = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "durable_agent.cli",
                "console",
                "--bind",
                f"127.0.0.1:{port}",
                "--task-queue",
                queue,
                env={
                    **os.environ,
                    "AGENT_CONSOLE_TOKEN": TOKEN,
                    "AGENT_CONFIG": str(console_config),
                    "TEMPORAL_ADDRESS": client.service_client.config.target_host,
                    "TEMPORAL_NAMESPACE": client.namespace,
                },
                stdout=asyncio.subprocess.PIPE,
            )
            try:
                assert process.stdout is not None
                await process.stdout.readline()  # the line with its link: it listens
                base = f"http://127.0.0.1:{port}"
                headers = {"Authorization": f"Bearer {TOKEN}"}
                rows.append(("console: listening, resident set", f"{rss_mb(process.pid) or 0:,.1f} MB"))
                async with httpx.AsyncClient(base_url=base, headers=headers, timeout=300) as http:
                    for when in ("cold", "warm"):
                        ms, answer = await _timed(http, f"/api/runs?limit={args.runs}")
                        listed = len(answer.json()["runs"])
                        rss = rss_mb(process.pid) or 0
                        rows.append(
                            (f"console: {listed} runs listed ({when})", f"{ms:,.0f} ms, {rss:,.1f} MB")
                        )
                    ms, answer = await _timed(http, f"/api/runs/{long.id}")
                    rows.append(("API: the long run's view", f"{ms:,.0f} ms, {len(answer.content):,} bytes"))
                    ms, answer = await _timed(http, f"/api/runs/{long.id}/events?after=0")
                    held = answer.json()["events"]
                    shown = sum(1 for r in held if r["event"]["type"] == "tool_end")
                    rows.append(
                        (
                            "API: its events (cold)",
                            f"{ms:,.0f} ms, {len(held):,} events, {shown:,} boundaries, "
                            f"{len(answer.content):,} bytes",
                        )
                    )
                    ms, answer = await _timed(http, f"/api/runs/{long.id}/events?after=0")
                    rows.append(("API: its events (warm)", f"{ms:,.0f} ms"))
                if shutil.which("chromium") and shutil.which("chromedriver"):
                    rows += await asyncio.to_thread(_browser, base, long.id, args.boundaries, shown)
                else:
                    rows.append(("in Chromium", "skipped: no chromium or chromedriver"))
                rows.append(("console: resident set at the end", f"{rss_mb(process.pid) or 0:,.1f} MB"))
            finally:
                process.terminate()
                await process.wait()
    await env.shutdown()
    wide = max(len(label) for label, _ in rows)
    for label, value in rows:
        print(f"{label:<{wide}}  {value}")


if __name__ == "__main__":
    asyncio.run(main())
