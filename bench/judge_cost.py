"""What the shell judge costs a ``bash`` call: the permission decision of one line, by era.

``python -m bench.judge_cost [REPEATS]`` prints, for lines short and long (about 50 to 65 KB),
the best of ``REPEATS`` times (default 3) of ``PermissionPolicy.decide_eras``, which judges the
line once and decides it by today's rules (the ``programs`` era) and by the two before. The
rules are a broad allow with a ``git push`` deny: the case where what a line hides matters.
The tests check what is decided; this prints how long it takes (a shared machine moves these
figures more than the code does: run it twice).
"""

from __future__ import annotations

import sys
import time

from durable_agent.core.permissions import PermissionPolicy

RULES = PermissionPolicy(allow=("bash",), deny=("bash(git push:*)",), default="ask")

LINES = {
    "short: git status": "git status",
    "short: python3 -c": "python3 -c 'import os; os.system(\"git push\")'",
    "short: a pipeline": "cat a.txt | grep -n foo | sort | uniq -c",
    "long: plain commands": "; ".join(["ls -la", "cat a.txt | grep foo", "echo done"] * 1400),
    "long: sed, awk, git -c": "; ".join(
        ["sed -e 's/a/b/g' -e 'y/abc/xyz/' f", "awk '{print $1}' f", "git -c color.ui=never log"] * 700
    ),
    "long: runners": "; ".join(
        ["uv run pytest -q", "npx prettier --check .", "./x.sh", "pnpm exec tsc"] * 1000
    ),
}


def best_ms(line: str, repeats: int) -> float:
    """The best time of ``repeats`` decisions of ``line``, in ms."""
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        RULES.decide_eras("bash", line)
        best = min(best, time.perf_counter() - start)
    return best * 1000


def main(argv: list[str]) -> int:
    repeats = int(argv[1]) if len(argv) > 1 else 3
    print(f"{'line':<24} {'bytes':>7} {'decisions':<22} {'ms (best of ' + str(repeats) + ')':>16}")
    for name, line in LINES.items():
        decisions = "/".join(RULES.decide_eras("bash", line))
        print(f"{name:<24} {len(line):>7} {decisions:<22} {best_ms(line, repeats):>16.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv))
