"""The figures of ``bench/scale.py``, printed as tables (its docstring explains each)."""

from __future__ import annotations

from typing import Any

from bench.text_table import Column, formatted, padded

STEPS: list[Column] = [
    ("design", "design", "{}"), ("C", "runs", "{}"), ("slots", "slots", "{}"), ("steps", "steps", "{}"),
    ("local", "local_steps", "{}"), ("failed", "failed", "{}"), ("steps/s", "steps_per_s", "{:.1f}"),
    ("p50 ms", "p50_ms", "{:.0f}"), ("p99 ms", "p99_ms", "{:.0f}"), ("RSS MB", "rss_before_mb", "{:.0f}"),
    ("peak", "rss_peak_mb", "{:.0f}"), ("after", "rss_after_mb", "{:.0f}"),
    ("KB/run", "kb_per_run", "{:.0f}"),
]  # fmt: skip
CPU: list[Column] = [
    ("design", "design", "{}"), ("C", "runs", "{}"), ("workers", "workers", "{}"),
    ("worker ms/step", "worker_ms", "{:.1f}"), ("cores", "worker_cores", "{:.2f}"),
    ("server ms/step", "server_ms", "{:.1f}"), ("cores", "server_cores", "{:.2f}"),
    ("pg ms/step", "postgres_ms", "{:.1f}"), ("bench ms/step", "bench_ms", "{:.1f}"),
    ("machine cores", "busy_cores", "{:.2f}"), ("others", "others_cores", "{:.2f}"),
]  # fmt: skip
PG: list[Column] = [
    ("workers", "workers", "{}"), ("runs", "runs", "{}"), ("steps", "steps", "{}"),
    ("local", "local_steps", "{}"), ("failed", "failed", "{}"), ("steps/s", "steps_per_s", "{:.1f}"),
    ("p50 ms", "p50_ms", "{:.0f}"), ("p99 ms", "p99_ms", "{:.0f}"), ("ratio", "ratio", "{:.2f}"),
]  # fmt: skip


def flat(row: dict[str, Any]) -> dict[str, Any]:
    """The row with its CPU figures on top: ``<group>_ms`` (ms per step) and ``<group>_cores``."""
    out = dict(row)
    cpu = row.get("cpu", {})
    for name, figures in cpu.items():
        if isinstance(figures, dict) and "cpu_s" in figures:
            out[f"{name}_ms"] = figures["ms_per_step"] if figures["cpu_s"] or name != "server" else None
            out[f"{name}_cores"] = figures["cores"]
    out["busy_cores"], out["others_cores"] = cpu.get("busy_cores"), cpu.get("others_cores")
    return out


def table(rows: list[dict[str, Any]], columns: list[Column]) -> None:
    lines = [[c[0] for c in columns]] + [formatted(flat(r), columns) for r in rows]
    for line in padded(lines, left={0}):
        print("  ".join(line))


def print_profile(profile: dict[str, Any]) -> None:
    if "error" in profile:
        print(f"\npy-spy: {profile['error']}")
        return
    print(
        f"\npy-spy of ours' worker (the thread holding the GIL): {profile['samples']} samples, "
        f"gil busy ~{profile['gil_busy']:.2f}, py-spy's own CPU {profile['py_spy_cpu_s']} s"
    )
    for kind in ("own", "total", "ours"):
        print(f"  top functions ({kind}):")
        for name, share in profile[kind]:
            print(f"    {share * 100:5.1f} %  {name}")


def print_report(out: dict[str, Any]) -> None:
    """Everything ``bench/scale.py`` measured, as tables."""
    args = out["args"]
    rows: list[dict[str, Any]] = out["phase1"]
    size = f"{args['file_bytes']:,} B"
    print(f"\nphase 1: one worker process, C runs of {args['steps']} steps at once (a read of {size} a step)")
    table(rows, STEPS)
    for r in rows:
        if r["trouble"]:
            print(f"  {r['design']} C={r['runs']}: trouble: {r['trouble']}")
    failures = [f for r in rows for f in r["failures"]]
    if failures:
        print("  failures (first of each row):", "; ".join(failures[:6]))
    print("\nCPU between the first start and the last result (cores = CPU s / wall s)")
    table(rows, CPU)
    for r in rows:
        threads = ", ".join(f"{k} {v:.1f}s" for k, v in r["cpu"].get("thread_cpu_s", {}).items())
        print(f"  {r['design']} C={r['runs']}: worker CPU by thread: {threads}")
    for r in rows:
        if "profile" in r:
            print_profile(r["profile"])
    two = out["phase2"]
    if "skipped" in two:
        print(f"\nphase 2 skipped: {two['skipped']}")
    else:
        runs = two["rows"]
        print(
            f"\nphase 2: ours on the PostgreSQL store and sink, {runs[0]['runs']} runs spread over N workers"
        )
        table(runs, PG)
        table(runs, CPU)
        for r in runs:
            print(f"  {r['workers']} worker(s): workflow tasks by worker: {r['wft_by_worker']}")
            if r["trouble"]:
                print(f"  {r['workers']} worker(s): trouble: {r['trouble']}")
    before, after = out["load_before"], out["load_after"]
    print(f"\nload average before {before[0]:.2f} {before[1]:.2f} {before[2]:.2f}, after "
          f"{after[0]:.2f} {after[1]:.2f} {after[2]:.2f} ({out['cores']} cores)")  # fmt: skip
