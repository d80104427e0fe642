"""Prompt caching over a long run, on the Anthropic and OpenAI chat wires, compaction included.

Run it from the repository root:

    python bench/prompt_cache.py                    # the old policy and the default one, both wires
    python bench/prompt_cache.py --wires openai --policy 0.8:0.3
    python bench/prompt_cache.py --policy 0.8:0.6 0.9:0.4 --window 200000 --json

It starts its own Temporal dev server (unless ``TEMPORAL_ADDRESS`` is set) and
runs the real ``AgentRun`` on an in-process worker against a local wire server
per run (``bench/cache_wire.py``): the model reads a ``--file-bytes`` file
(20,000 bytes) once a boundary, ``--boundaries`` times (200), then answers,
within a ``--window`` of 128,000 tokens that the server enforces (the worker
knows it as the provider's ``context_window``; 4,096 tokens are kept for the
answer). The providers are the project's own with prompt caching on (their
default): ``kind = "anthropic"`` with ``cache_control`` breakpoints,
``kind = "openai"`` (chat) with ``prompt_cache_key``. The server accounts each
request as the vendor's cache does (``tests/wire_cache.py``) and says so in
its usage.

Compaction is the run's own (``durable_agent/core/context.py``): before a
request past ``compact_at`` of the usable window (``[context] compact_at``,
default 0.9) it elides the oldest tool results down to ``compact_to`` of it
(default 0.4), and summarizes when eliding is not enough. A ``--policy``
``C:T`` runs with ``compact_at = C`` and ``compact_to = T`` in the worker's
config. The default runs the policy before issue 21 (0.8 -> 0.6, which read
74-77 % of prompt tokens from the cache) and today's default; every policy
runs on every wire.

Printed per policy and wire:

* ``share``: the share of prompt tokens read from the cache, over every
  request of the run (summary requests included); the goal is 0.85 or more;
* ``read`` / ``written`` / ``uncached``: prompt tokens read from the cache,
  written to it (Anthropic only: OpenAI bills no writes), and neither;
* ``reqs``: model requests (tool steps, the answer and summaries);
  ``cmp``: compactions (``context_compacted`` events of the run's record);
  ``breaks``: tool-step requests whose messages were not the previous one's
  plus new ones (each compaction makes one; more would mean something else
  rewrites the conversation);
* ``cost $`` and ``no cache $``: the run at list prices, as the project prices
  the ``AgentRunResult``'s usage (``usage_cost_usd``): with the cache prices,
  and with every prompt token at the input price (the same requests, not
  cached). Prices, USD per million tokens: Anthropic (Sonnet-class) input
  3.00, cache write 3.75, cache read 0.30, output 15.00; OpenAI (GPT-5-class)
  input 1.25, cached input 0.125, output 10.00 (no cache writes). Every answer
  is ``ANSWER_TOKENS`` (20) output tokens.

Below the table, anything that breaks caching is named: tools or system prompt
changed between requests, prefix breaks without a compaction, requests the
server refused, more than four breakpoints, and usage the provider reported
otherwise than the server said. Numbers are printed, never asserted; wall time
is for information only.

Each boundary adds a new 20 KB result (about 5,600 tokens) that no cache can
hold yet, and each compaction re-sends everything after the first result it
elides: the share is bounded by 1 - (new + re-sent) / average prompt, which
with a 128,000-token window stays under about 0.88 whatever the policy.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
import uuid
from contextlib import AsyncExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout

from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter

from bench.boundary_cost import free_port
from bench.cache_wire import CachingReader, WireKind, server_figures, trace
from bench.digest_sink import DigestSink
from bench.reader_setup import make_file
from bench.runs import settle
from bench.text_table import Column, formatted, padded
from bench.tokens import ANSWER_TOKENS
from durable_agent.activities import AgentActivities
from durable_agent.client import connect, ensure_search_attributes, exit_process, start_run
from durable_agent.config import ContextConfig, parse_config
from durable_agent.core import context
from durable_agent.core.context import DEFAULT_RESERVE
from durable_agent.core.events import ContextCompactedEvent
from durable_agent.core.export import RunRecord
from durable_agent.core.models import TokenUsage, usage_cost_usd
from durable_agent.core.run_api import AgentRunInput
from durable_agent.devserver import start_dev_server, stop_dev_server
from durable_agent.worker import build_worker
from tests.wire_servers import AnthropicWire, OpenAIWire, WireServer

KEY_ENV = "BENCH_CACHE_KEY"  # a key for the local servers only, so the providers have one to send
MODELS: dict[WireKind, str] = {"anthropic": "claude-sonnet-bench", "openai": "gpt-5-bench"}


@dataclass(frozen=True)
class Prices:
    """List prices, USD per million tokens."""

    label: str
    input: float
    output: float
    cache_read: float
    cache_write: float


PRICES: dict[WireKind, Prices] = {
    "anthropic": Prices("Sonnet-class", input=3.00, output=15.00, cache_read=0.30, cache_write=3.75),
    # OpenAI bills no cache writes: written tokens are input (there are none on this wire).
    "openai": Prices("GPT-5-class", input=1.25, output=10.00, cache_read=0.125, cache_write=1.25),
}


@dataclass(frozen=True)
class Policy:
    """When compaction starts (``compact_at``) and how far it goes (``compact_to``)."""

    compact_at: float
    target_fraction: float

    @property
    def label(self) -> str:
        return f"{self.compact_at:g} -> {self.target_fraction:g}"

    @classmethod
    def parse(cls, text: str) -> Policy:
        """``"C:T"``: ``compact_at`` C, ``compact_to`` T, each in (0, 1]."""
        compact_at, _, target = text.partition(":")
        try:
            policy = cls(float(compact_at), float(target))
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"a policy is compact_at:target_fraction, got {text!r}"
            ) from None
        if not (0 < policy.target_fraction <= 1 and 0 < policy.compact_at <= 1):
            raise argparse.ArgumentTypeError(f"both fractions must be in (0, 1], got {text!r}")
        return policy


# Before issue 21: compact often, in small steps (each one throws the cached prefix away).
BEFORE = Policy(0.8, context.TARGET_FRACTION)
# The default now: compact later and elide further.
DEFAULT = Policy(ContextConfig().compact_at, ContextConfig().compact_to)


def run_config(kind: WireKind, server: WireServer, tmp: Path, window: int, policy: Policy) -> Any:
    wire = AnthropicWire() if kind == "anthropic" else OpenAIWire()
    provider = wire.provider(server.base_url, KEY_ENV, context_window=window, max_tokens=DEFAULT_RESERVE)
    return parse_config(
        {
            "default_model": f"{kind}/{MODELS[kind]}",
            "providers": {kind: provider},
            "context": {"compact_at": policy.compact_at, "compact_to": policy.target_fraction},
            "store": {"path": str(tmp / "store")},
            "default_sink": "bench",  # a name for the config; the bench's DigestSink takes its place
            "sinks": {"bench": {"kind": "filesystem", "path": str(tmp / "exports-unused")}},
            "permissions": {"allow": ["read(*)"], "default": "deny"},
        },
        tmp,
    )


def compactions_of(records: list[RunRecord]) -> dict[str, Any]:
    """The run's compactions, from its record's event log (the store keeps it when the run ends)."""
    found = [e.event for r in records for e in r.events if isinstance(e.event, ContextCompactedEvent)]
    elided = [len(e.elided_now) for e in found if e.tier == "elide"]
    return {
        "compactions": len(found) if records else None,
        "elisions": len(elided),
        "summaries": sum(e.tier == "summarize" for e in found),
        "results_per_elision": round(sum(elided) / len(elided), 1) if elided else 0,
        "compaction_tokens": [(e.tokens_before, e.tokens_after) for e in found[:3]],
    }


def costs(kind: WireKind, usage: TokenUsage) -> dict[str, Any]:
    p = PRICES[kind]
    cached = usage_cost_usd(usage, p.input, p.output, p.cache_read, p.cache_write)
    plain = usage_cost_usd(usage, p.input, p.output)
    return {"cost_usd": cached, "no_cache_cost_usd": plain}


async def measure(
    client: Client, base: Path, kind: WireKind, policy: Policy, args: argparse.Namespace
) -> dict[str, Any]:
    tmp = base / f"{kind}-{uuid.uuid4().hex[:6]}"
    tmp.mkdir()
    reader = CachingReader(kind, args.boundaries)
    wire = AnthropicWire() if kind == "anthropic" else OpenAIWire()
    sink = DigestSink()
    n = args.boundaries
    run = AgentRunInput(
        prompt=f"read data.txt {n} times",
        workspace=str(base / "workspace"),
        model=f"{kind}/{MODELS[kind]}",
        max_tool_rounds=n + 1,
    )
    started = time.perf_counter()
    async with AsyncExitStack() as stack:
        server = await stack.enter_async_context(WireServer(wire, context_window=args.window, respond=reader))
        acts = AgentActivities(run_config(kind, server, tmp, args.window, policy), sinks={"bench": sink})
        stack.push_async_callback(acts.aclose)
        queue = f"bench-cache-{uuid.uuid4().hex[:8]}"
        await stack.enter_async_context(build_worker(client, acts, queue))
        handle = await start_run(
            client, run, queue=queue, workflow_id=f"bench-cache-{kind}-{uuid.uuid4().hex[:8]}"
        )
        problem = await settle(handle, 120 + 2 * n)
        wall = time.perf_counter() - started
        overflowed = sum(r.overflowed for r in server.requests)
        usage, records = TokenUsage(), []
        if problem is None:
            result = await handle.result()
            usage = result.usage
            records = await acts.store.load_run_records(result.session_id)
            if result.status != "completed":
                problem = f"{result.status}: {result.error}"
    row = server_figures(reader)
    return {
        "wire": kind,
        "policy": policy.label,
        "compact_at": policy.compact_at,
        "target_fraction": policy.target_fraction,
        "outcome": problem or "ok",
        "wall_s": round(wall, 1),
        "overflowed": overflowed,
        **row,
        **compactions_of(records),
        **costs(kind, usage),
        "reported": usage.model_dump(),
        "trace": trace(reader.seen) if args.trace else None,
    }


# --- the report -------------------------------------------------------------------------

COLUMNS: list[Column] = [
    ("share", "share", "{:.3f}"),
    ("read", "read", "{:,}"),
    ("written", "written", "{:,}"),
    ("uncached", "uncached", "{:,}"),
    ("reqs", "requests", "{}"),
    ("cmp", "compactions", "{}"),
    ("breaks", "prefix_breaks", "{}"),
    ("cost $", "cost_usd", "{:.2f}"),
    ("no cache $", "no_cache_cost_usd", "{:.2f}"),
    ("wall s", "wall_s", "{:.0f}"),
]


def print_table(rows: list[dict[str, Any]]) -> None:
    header = ["compact_at -> target", "wire", *(h for h, _, _ in COLUMNS), "outcome"]
    table = [header] + [[r["policy"], r["wire"], *formatted(r, COLUMNS), r["outcome"]] for r in rows]
    for cells in padded(table, left={0, 1, len(header) - 1}):
        print("  ".join(cells).rstrip())


def problems(r: dict[str, Any]) -> list[str]:
    """What in this run broke caching, or could have: each a sentence."""
    found: list[str] = []
    where = f"{r['wire']} {r['policy']}"
    if r["fixed_changes"]:
        found.append(f"{where}: the tools or system prompt changed in {r['fixed_changes']} requests")
    if r["compactions"] is not None and r["prefix_breaks"] > r["compactions"]:
        found.append(
            f"{where}: {r['prefix_breaks']} prefix breaks for {r['compactions']} compactions: "
            "something other than compaction rewrote earlier messages"
        )
    if r["overflowed"]:
        found.append(f"{where}: {r['overflowed']} requests over the window, refused by the server")
    if r["refusals"]:
        found.append(f"{where}: requests refused by the server: {r['refusals']}")
    if r["max_breakpoints"] > 4:
        found.append(f"{where}: up to {r['max_breakpoints']} cache_control breakpoints (the API takes 4)")
    reported = r["reported"]
    if r["outcome"] == "ok":
        if reported["cache_read_tokens"] != r["read"]:
            found.append(f"{where}: the run's usage says {reported['cache_read_tokens']:,} tokens read from "
                         f"the cache, the server {r['read']:,}")  # fmt: skip
        if reported["cache_write_tokens"] != r["written"]:
            found.append(f"{where}: the run's usage says {reported['cache_write_tokens']:,} tokens "
                         f"written to the cache, the server {r['written']:,}")  # fmt: skip
        if reported["prompt_tokens"] != r["prompt_tokens"]:
            found.append(f"{where}: the run's usage says {reported['prompt_tokens']:,} prompt tokens, "
                         f"the server {r['prompt_tokens']:,}")  # fmt: skip
    return found


def report(args: argparse.Namespace, rows: list[dict[str, Any]]) -> None:
    usable = args.window - DEFAULT_RESERVE
    print(
        f"\nprompt caching: {args.boundaries} boundaries, a read of a {args.file_bytes:,}-byte file each, "
        f"a {args.window:,}-token window ({DEFAULT_RESERVE:,} kept for the answer: {usable:,} usable)"
    )
    print("policy C -> T: compact past C x usable ([context] compact_at), elide down to T x usable "
          f"([context] compact_to); default {DEFAULT.label}, before issue 21 {BEFORE.label}")  # fmt: skip
    for kind, p in PRICES.items():
        print(f"prices, {kind} ({p.label}), USD/Mtok: input {p.input:.2f}, cache read {p.cache_read:.3f}, "
              + (f"cache write {p.cache_write:.2f}, " if kind == "anthropic" else "no cache writes, ")
              + f"output {p.output:.2f}; output {args.answer_tokens} tokens an answer")  # fmt: skip
    print()
    print_table(rows)
    print()
    for r in rows:
        saved = (
            f"{1 - r['cost_usd'] / r['no_cache_cost_usd']:.0%} cheaper than without caching"
            if r["cost_usd"] and r["no_cache_cost_usd"]
            else "cost unknown"
        )
        print(
            f"{r['wire']:<9} {r['policy']}: {r['share']:.1%} of {r['prompt_tokens']:,} prompt tokens read "
            f"from the cache; {r['elisions']} elisions ({r['results_per_elision']} results each), "
            f"{r['summaries']} summaries; largest request {r['largest_request']:,}; {saved}"
        )
    found = [p for r in rows for p in problems(r)]
    fine = (
        "nothing broke caching: fixed parts stable, one prefix break per compaction, usage as the server said"
    )
    print("\n" + ("\n".join(found) if found else fine))


async def run_all(client: Client, tmp: Path, args: argparse.Namespace) -> list[dict[str, Any]]:
    workspace = tmp / "workspace"
    workspace.mkdir()
    make_file(workspace / "data.txt", args.file_bytes)
    os.environ[KEY_ENV] = "bench-local-key"
    rows = []
    for policy in dict.fromkeys(args.policy):  # each once, in order
        for kind in args.wires:
            row = await measure(client, tmp, kind, policy, args)
            print(f"{kind} {row['policy']}: {row['outcome']} in {row['wall_s']:.0f} s, share "
                  f"{row['share']:.3f}", file=sys.stderr)  # fmt: skip
            rows.append(row)
    return rows


async def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--boundaries", type=int, default=200)
    parser.add_argument("--file-bytes", type=int, default=20_000, help="size of the file each read returns")
    parser.add_argument("--window", type=int, default=128_000, help="the model's context window, tokens")
    parser.add_argument(
        "--wires", nargs="+", choices=["anthropic", "openai"], default=["anthropic", "openai"]
    )
    parser.add_argument(
        "--policy",
        type=Policy.parse,
        nargs="+",
        default=[BEFORE, DEFAULT],
        metavar="C:T",
        help=f"compact_at:compact_to (default: before issue 21 {BEFORE.label}, and today's {DEFAULT.label})",
    )
    parser.add_argument("--json", action="store_true", help="also print one JSON line per run")
    parser.add_argument("--trace", action="store_true", help="also print each request's cache accounting")
    args = parser.parse_args()
    args.answer_tokens = ANSWER_TOKENS
    if args.boundaries < 1 or args.window < 2 * DEFAULT_RESERVE:
        parser.error(f"--boundaries must be at least 1 and --window at least {2 * DEFAULT_RESERVE}")
    with tempfile.TemporaryDirectory(prefix="bench-cache-") as tmp_name:
        tmp = Path(tmp_name)
        server = None
        if os.environ.get("TEMPORAL_ADDRESS"):
            client = await connect()
            await ensure_search_attributes(client)
        else:
            port = free_port()
            server = start_dev_server(port=port, ui_port=free_port(), log_file=tmp / "server.log")
            client = await Client.connect(f"127.0.0.1:{port}", data_converter=pydantic_data_converter)
        try:
            rows = await run_all(client, tmp, args)
        finally:
            if server is not None:
                stop_dev_server(server)
    report(args, rows)
    for row in rows:
        for line in row.pop("trace") or []:
            print(f"{row['wire']} {row['policy']} {line}")
    if args.json:
        print()
        for row in rows:
            print(json.dumps(row))
    return 0


if __name__ == "__main__":
    exit_process(asyncio.run(main()))
