"""``bench/step_report.py``'s throughput figure: the median of its rounds, with each round's ratios."""

from __future__ import annotations

from typing import Any

from bench.step_report import each_round, throughput_summary


def phase(design: str, steps_per_s: float, round_: int) -> dict[str, Any]:
    return {"design": design, "steps_per_s": steps_per_s, "completed": 1000, "wall_s": 1000 / steps_per_s,
            "failed_runs": 0, "failures": [], "round": round_}  # fmt: skip


def test_each_design_is_its_median_round_and_ours_keeps_each_round_s_ratio() -> None:
    phases = [
        phase("ours", 20.0, 1), phase("naive", 18.0, 1), phase("naive-unsandboxed", 16.0, 1),
        phase("naive", 20.0, 2), phase("naive-unsandboxed", 25.0, 2), phase("ours", 22.0, 2),
        phase("naive-unsandboxed", 20.0, 3), phase("ours", 17.0, 3), phase("naive", 10.0, 3),
    ]  # fmt: skip
    tp = throughput_summary(phases)
    medians = {d: t["steps_per_s"] for d, t in tp.items()}
    assert medians == {"ours": 20.0, "naive": 18.0, "naive-unsandboxed": 20.0}
    assert tp["ours"]["rounds"] == [20.0, 22.0, 17.0]
    assert tp["ours"]["round_ratios_to_naive-unsandboxed"] == [1.25, 0.88, 0.85]
    assert each_round(tp, "naive") == "; rounds: 1.11, 1.10, 1.70"


def test_one_round_prints_as_before() -> None:
    tp = throughput_summary([phase("ours", 20.0, 1), phase("naive", 10.0, 1)])
    assert tp["ours"]["rounds"] == [20.0] and tp["ours"]["wall_s"] == 50.0
    assert each_round(tp, "naive") == ""
