"""``bench/workspace_cost.py`` on a small repository: the generator is seeded, the report has
its shape, and a restore on a machine that has nothing gives machine A's files (so the bench
cannot rot quietly). No timed assertion: the figures are the bench's to print."""

from __future__ import annotations

from pathlib import Path

from bench.workspace_cost import (
    MAX_SIZE,
    MIN_SIZE,
    folder_files,
    generate_repository,
    measure,
    report_lines,
    spread,
)


def test_the_repository_is_the_same_for_a_seed(tmp_path: Path) -> None:
    one = generate_repository(tmp_path / "one", 120, seed=7)
    two = generate_repository(tmp_path / "two", 120, seed=7)
    other = generate_repository(tmp_path / "other", 120, seed=8)
    assert one == two != other and len(one) == len(set(one)) == 120
    assert folder_files(tmp_path / "one") == folder_files(tmp_path / "two")
    sizes = [(tmp_path / "one" / name).stat().st_size for name in one]
    assert min(sizes) >= MIN_SIZE and max(sizes) <= MAX_SIZE
    assert any(name.count("/") >= 2 for name in one)  # nested, not one flat folder


def test_spread_is_a_median_with_deciles_or_the_extremes() -> None:
    assert spread([3.0, 1.0, 2.0]) == {"median": 2.0, "low": 1.0, "high": 3.0, "n": 3}
    many = spread([float(v) for v in range(1, 12)])
    assert many["median"] == 6.0 and many["low"] == 2.0 and many["high"] == 10.0 and many["n"] == 11


async def test_the_bench_reports_every_section_and_restores_the_same_files(tmp_path: Path) -> None:
    report, restored = await measure(tmp_path, files=200, repeat=3, restores=1, boundaries=(1, 3))
    assert report["files"] == 200 and report["first_record_ms"] > 0
    assert set(report["fast_path"]) == {"read_only", "unchanged"}
    assert report["fast_path"]["read_only"]["n"] == 30
    one = report["one_file"]
    assert one["boundary"]["n"] == one["record"]["n"] == one["record_whole"]["n"] == 3
    assert one["record_nothing"]["n"] == one["record_whole_nothing"]["n"] == 3
    # one scan (``status``), then only the paths it listed: no ``git add -A``, no ``ls-files``
    assert {"git status", "git update-index", "git write-tree", "sink put_objects"} <= set(one["phases"])
    assert not {"git add", "git ls-files"} & set(one["phases"])
    assert abs(sum(one["phases"].values()) - one["timed_boundary_mean"]) < 1e-6
    assert [r["boundaries"] for r in report["restore"]] == [1, 3]
    for figures, r in zip(report["restore"], restored, strict=True):
        assert figures["same_files"] is True
        assert {"sink get_objects", "git read-tree"} <= set(figures["phases"])
        assert figures["objects"] > 200 and figures["bytes"] > 0 and figures["clone_git_bytes"] > 0
        # the folders themselves: machine B's restore and the clone of machine A's repository
        files = folder_files(r.machine_b)
        assert len(files) == 201  # the files and the .gitignore
        assert files == folder_files(r.clone)
        assert (r.clone / ".git").is_dir() and not (r.machine_b / ".git").exists()
    # the two restores are of different trees: the later one holds the later boundaries' changes
    assert restored[0].tree != restored[1].tree
    assert folder_files(restored[0].machine_b) != folder_files(restored[1].machine_b)
    lines = report_lines(report)
    assert lines[0].startswith("repository: 200 files")
    assert sum("goal <=" in line for line in lines) == 2
    assert sum("same files: yes" in line for line in lines) == 2
