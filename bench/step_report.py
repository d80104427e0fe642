"""The figures of ``bench/step_cost.py``, summarized and printed (its docstring explains each)."""

from __future__ import annotations

import argparse
import json
import os
import statistics
from typing import Any

from bench.step_phases import PHASES
from bench.takeover import print_takeover
from bench.text_table import padded


def median(values: list[Any]) -> Any:
    seen = [v for v in values if v is not None]
    return statistics.median(seen) if seen else None


def naive_outcome(runs: list[dict[str, Any]]) -> str:
    """``ok``, or where the runs died (``dies at b=K``; every K when the repeats differ)."""
    dead = [r for r in runs if r["outcome"] != "ok"]
    if not dead:
        return "ok"
    ks = sorted({r["completed"] for r in dead})
    where = "/".join(str(k) for k in ks)
    word = "dies" if all(r["outcome"].startswith("terminated") for r in dead) else "fails"
    return f"{word} at b={where}" + (f" ({len(dead)} of {len(runs)} runs)" if len(dead) < len(runs) else "")


def summarize(args: argparse.Namespace, results: dict[str, Any]) -> dict[str, Any]:
    rows: list[dict[str, Any]] = results["rows"]
    steps: list[dict[str, Any]] = []
    sink: list[dict[str, Any]] = []
    for n in args.boundaries:
        ours = [r for r in rows if r["design"] == "ours" and r["boundaries"] == n]
        naive = [r for r in rows if r["design"] == "naive" and r["boundaries"] == n]
        floor = [r for r in rows if r["design"] == "floor" and r["boundaries"] == n]
        ours_ms = median([r["ms_per_step"] for r in ours])
        naive_ms = median([r["ms_per_step"] for r in naive])
        steps.append(
            {
                "boundaries": n,
                "ours_runs": len(ours),
                "ours_ms_per_step": ours_ms,
                "ours_outcome": "ok" if all(r["outcome"] == "ok" for r in ours) else ours[-1]["outcome"],
                "naive_runs": len(naive),
                "naive_ms_per_step": naive_ms,
                "naive_completed": median([r["completed"] for r in naive]),
                "naive_outcome": naive_outcome(naive) if naive else None,
                "ours_to_naive": round(ours_ms / naive_ms, 2) if ours_ms and naive_ms else None,
                "floor_ms_per_step": median([r["ms_per_step"] for r in floor]),
            }
        )
        sink.append(
            {
                "boundaries": n,
                "sink_bytes": median([r["sink_bytes"] for r in ours]),
                "sink_bytes_per_step": median([r["sink_bytes_per_step"] for r in ours]),
                "final_export_bytes": median([r["final_export_bytes"] for r in ours]),
                "sink_to_final": median([r["sink_to_final"] for r in ours]),
            }
        )
    flat = next((r for r in reversed(rows) if "flat" in r), None)
    tp = throughput_summary(results["throughput"])
    ratio = None
    if "ours" in tp and "naive" in tp and tp["naive"]["steps_per_s"]:
        ratio = round(tp["ours"]["steps_per_s"] / tp["naive"]["steps_per_s"], 2)
    return {
        "steps": {"group": "steps", "file_bytes": args.file_bytes, "repeat": args.repeat, "per_n": steps},
        "throughput": {"group": "throughput", "ours_to_naive": ratio, **tp} if tp else None,
        "sink": {"group": "sink", "per_n": sink},
        "flat": None if flat is None else {"group": "flat", **pick(flat), **flat["flat"]},
        "takeover": results["takeover"],
    }


def throughput_summary(phases: list[dict[str, Any]]) -> dict[str, Any]:
    """Each design's throughput phases as one figure: the median round's, with every round's
    steps/s (``rounds``) and, beside ours, each round's ratios to the two naive designs."""
    by_design: dict[str, list[dict[str, Any]]] = {}
    for phase in phases:
        by_design.setdefault(phase["design"], []).append(phase)
    out: dict[str, Any] = {}
    for design, runs in by_design.items():
        ranked = sorted(runs, key=lambda r: r["steps_per_s"])
        middle = ranked[(len(ranked) - 1) // 2]
        out[design] = {**middle, "rounds": [r["steps_per_s"] for r in runs]}
    ours = out.get("ours")
    for other in ("naive", "naive-unsandboxed"):
        if ours is not None and other in out:
            pairs = zip(ours["rounds"], out[other]["rounds"], strict=False)
            ours[f"round_ratios_to_{other}"] = [round(a / b, 2) if b else None for a, b in pairs]
    return out


def each_round(tp: dict[str, Any], other: str) -> str:
    """``; rounds: a, b, c``: ours' ratio to ``other`` in each round, when there were several."""
    ratios = tp.get("ours", {}).get(f"round_ratios_to_{other}") or []
    if len(ratios) < 2:
        return ""
    return "; rounds: " + ", ".join("—" if r is None else f"{r:.2f}" for r in ratios)


def pick(row: dict[str, Any]) -> dict[str, Any]:
    return {k: row[k] for k in ("boundaries", "executions", "outcome", "workflow_id")}


def fmt(value: Any, spec: str = "{:,}") -> str:
    return "—" if value is None else spec.format(value)


def table(header: list[str], lines: list[list[str]]) -> None:
    for cells in padded([header, *lines]):
        print("  " + "  ".join(cells).rstrip())


def print_phases(args: argparse.Namespace, rows: list[dict[str, Any]]) -> None:
    """Where the step's time goes (``bench/step_phases.py``), per design at the largest N: the
    median over its runs of each phase's ms/step."""
    n = max(args.boundaries)
    print(f"  where a step's time goes at N={n} (ms/step from the history's event times, median of runs):")
    lines = []
    local = sorted(
        {k for r in rows if r["boundaries"] == n for k in r.get("phases", {}) if k.startswith("local ")}
    )
    for design in ("ours", "naive", "floor"):
        runs = [r["phases"] for r in rows if r["design"] == design and r["boundaries"] == n and "phases" in r]
        if runs:
            keys = (*PHASES, "total", *local)
            lines.append([design, *(fmt(median([p.get(k, 0.0) for p in runs]), "{:.1f}") for k in keys)])
    table(["design", *PHASES, "total", *(k.replace("agent.", "") for k in local)], lines)
    if local:
        print("  (local: the local activities' own time, inside task work)")


def report(args: argparse.Namespace, summary: dict[str, Any], results: dict[str, Any]) -> None:
    where = os.environ.get("TEMPORAL_ADDRESS") or "dev server (in memory)"
    print(f"\nstep cost: a read of a {args.file_bytes:,}-byte file a step, no context window; "
          f"server: {where}")  # fmt: skip
    print(f"\n1. ms per step (wall time to result / steps completed; median of {args.repeat} run(s) "
          "for N <= 200, one run above); ours exports every boundary to the filesystem sink")  # fmt: skip
    lines = []
    for s in summary["steps"]["per_n"]:
        naive = "—" if s["naive_outcome"] is None else fmt(s["naive_ms_per_step"], "{:.0f}")
        ours = fmt(s["ours_ms_per_step"], "{:.0f}") + ("" if s["ours_outcome"] == "ok" else " (!)")
        floor = fmt(s.get("floor_ms_per_step"), "{:.0f}")
        lines.append([str(s["boundaries"]), ours, naive, fmt(s["ours_to_naive"], "{:.2f}"),
                      s["naive_outcome"] or "not run", floor])  # fmt: skip
    table(["N", "ours ms/step", "naive ms/step", "ours/naive", "naive outcome", "floor ms/step"], lines)
    print("  goal: ours/naive <= 0.5")
    print("  floor: a loop of one empty activity and its workflow task a step (bench/floor.py), same server")
    print("  and worker options: no design that makes an activity a step goes below it")
    print_phases(args, results["rows"])
    for r in results["rows"]:
        if r["design"] == "ours" and r["outcome"] != "ok":
            print(f"  (!) ours N={r['boundaries']}: {r['outcome']}")

    tp = summary["throughput"]
    if tp is not None:
        print(f"\n2. throughput: {args.throughput_runs} concurrent runs x {args.throughput_steps} steps "
              "on one worker, each design in its own phase")  # fmt: skip
        for design in ("ours", "naive", "naive-unsandboxed"):
            t = tp.get(design)
            if t is not None:
                failed = f", {t['failed_runs']} runs failed: {t['failures']}" if t["failed_runs"] else ""
                rounds = ", ".join(f"{r:.2f}" for r in t["rounds"])
                spread = f" (median of {len(t['rounds'])} rounds: {rounds})" if len(t["rounds"]) > 1 else ""
                print(f"  {design:<17}: {t['completed']:,} steps in {t['wall_s']:.1f} s = "
                      f"{t['steps_per_s']:.2f} steps/s{spread}{failed}")  # fmt: skip
        print(f"  ours/naive: {fmt(tp['ours_to_naive'], '{:.2f}')}{each_round(tp, 'naive')}")
        if tp.get("naive-unsandboxed") and tp["naive-unsandboxed"]["steps_per_s"]:
            same = tp["ours"]["steps_per_s"] / tp["naive-unsandboxed"]["steps_per_s"]
            print(f"  ours/naive-unsandboxed: {same:.2f}   goal: >= 1.2{each_round(tp, 'naive-unsandboxed')}")

    print("\n3. sink bytes (ours; all bytes under the run's sink folder; median over repeats)")
    lines = [
        [str(s["boundaries"]), fmt(s["sink_bytes"]), fmt(s["sink_bytes_per_step"]),
         fmt(s["final_export_bytes"]), fmt(s["sink_to_final"], "{:.2f}")]
        for s in summary["sink"]["per_n"]
    ]  # fmt: skip
    table(["N", "sink bytes", "sink B/step", "final export B", "sink/final"], lines)
    print("  goal: sink/final <= ~2")

    f = summary["flat"]
    if f is not None:
        print(f"\n4. flat in length: the N={f['boundaries']} run ({f['executions']} executions, "
              f"{f['outcome']}), boundary = time between two agent.tool_call completions "
              "(server event times)")  # fmt: skip
        print(f"  mean of the first {f['window']}: {fmt(f['first_mean_ms'], '{:.1f}')} ms; of the last "
              f"{f['window']}: {fmt(f['last_mean_ms'], '{:.1f}')} ms; last/first "
              f"{fmt(f['last_to_first'], '{:.2f}')}   goal: <= 1.2")  # fmt: skip
        print(f"  history {f['history_bytes']:,} B / conversation {fmt(f['conversation_bytes'])} B = "
              f"{fmt(f['history_to_conversation'], '{:.2f}')}   goal: <= 1.5")  # fmt: skip

    if summary["takeover"] is not None:
        print_takeover(summary["takeover"])
    if args.json:
        print()
        for key in ("steps", "throughput", "sink", "flat"):
            if summary[key] is not None:
                print(json.dumps(summary[key]))
        if summary["takeover"] is not None:
            print(json.dumps(summary["takeover"]))
        print(json.dumps({"group": "runs", "runs": results["rows"]}))
