"""Runners given a command as words (``uv run git push``) and scripts run by their path
(``./x.sh``) under a broad allow and a deny rule (issue 38, ``shell_runners``).

Pure. Today's decisions (``era="programs"``) read what a runner runs for the deny rules and keep
the allow off where the judge cannot show it; the eras before decide these lines as they did
(the same decisions on the code before ``shell_runners``: ``test_the_eras_before_decide_as_they_did``
passes there too). The end-to-end cases are in ``test_shell_programs_push``.
"""

from __future__ import annotations

import random

import pytest

from durable_agent.core.permissions import PermissionPolicy
from durable_agent.core.shell_judge import judge

DENY = ("bash(git push:*)",)
BROAD = PermissionPolicy(allow=("bash",), deny=DENY)  # default deny
BROAD_ASKING = PermissionPolicy(allow=("bash",), deny=DENY, default="ask")
NO_CURL = PermissionPolicy(allow=("bash",), deny=("bash(curl:*)",), default="ask")

# A runner given ``git push`` as words: today it is ``git push`` for the deny rules.
RUNNERS_PUSH = [
    "uv run git push",
    "uv run --frozen --with x -- git push origin main",
    "uv --directory d run git push",
    "uv run sudo git push",
    "uv run bash -c 'git push'",
    "uv tool run git push",
    "uvx --from x git push",
    "npx git push",
    "npx -y -- git push",
    "npx -c 'git push'",
    "poetry run git push",
    "poetry -C d run git push",
    "pipx run --spec x git push",
    "pdm run git push",
    "hatch run git push",
    "hatch run dev:git push",
    "rye run git push",
    "conda run -n env git push",
    "mamba run -p /x git push",
    "micromamba run -n e git push",
    "bunx git push",
    "pnpm exec git push",
    "pnpm -C d exec git push",
    "pnpm dlx git push",
    "pnpm exec -c 'git push'",
    "yarn exec git push",
    "yarn dlx git push",
    "npm exec -- git push",
    "npm exec --no -- git push",
    "npm x git push",
    "npm exec -c 'git push'",
    "direnv exec . git push",
    "nix develop -c git push",
    "nix develop .#dev --command git push",
    "nix shell nixpkgs#git -c git push",
    "nix-shell --run 'git push'",
    "flock /tmp/l -c 'git  push'",
]
# Wrappers that were already read as such in every era.
WRAPPED_PUSH = [
    "flock /tmp/l git push",
    "setsid git push",
    "setsid -f git push",
    "stdbuf -oL git push",
    "ionice -c3 git push",
    "chrt 1 git push",
    "taskset 1 git push",
]
# A runner whose command runs nothing a deny rule could match: allowed as before.
RUNNERS_HARMLESS = [
    "uv run pytest -q",
    "uv run --frozen ruff check .",
    "uvx ruff check",
    "npx prettier --check .",
    "poetry run pytest",
    "pnpm exec tsc",
    "npm exec -- eslint .",
    "conda run -n e pytest",
    "nix develop -c make",
    "direnv exec . pytest",
    "hatch run test:cov",
    "uv run pytest -q && git status",
]
# What the judge cannot show: options not known, a shell on stdin, python's code, a script.
RUNNERS_UNSEEN = [
    "uv run --frobnicate git status",
    "npx --registry=x git status",
    "nix develop",
    "nix-shell",
    "uv run python -c 'import os'",
    "uv run x.py",
    "uv run -m mod",
    "uv run -",
    "pnpm exec ./x.sh",
    'npx -c "$X"',
]
# A script run by its path: a file the judge cannot show.
PATHS = [
    "./x.sh",
    "bin/deploy",
    "scripts/push.py",
    "../x.sh",
    "/tmp/x.sh",
    "/usr/bin/../../tmp/x",
    "~/bin/x",
    "sudo ./x.sh",
    "timeout 10 ./x.sh",
    "find . -exec ./x.sh {} +",
    ".venv/bin/pytest -q",
    "ls && ./x.sh",
]
SYSTEM = ["/usr/bin/git status", "/bin/ls -la", "/usr/local/bin/pytest -q", "timeout 10 pytest tests/x.py"]
ALL = RUNNERS_PUSH + WRAPPED_PUSH + RUNNERS_HARMLESS + RUNNERS_UNSEEN + PATHS + SYSTEM


@pytest.mark.parametrize("line", RUNNERS_PUSH)
def test_a_runner_given_git_push_is_git_push(line: str) -> None:
    assert BROAD.decide("bash", line) == "deny"
    assert BROAD_ASKING.decide("bash", line) == "deny"  # a deny rule's match is not asked about
    assert NO_CURL.decide("bash", line) == "allow"  # no deny rule could match it


@pytest.mark.parametrize("line", WRAPPED_PUSH)
def test_wrappers_were_denied_in_every_era(line: str) -> None:
    assert BROAD.decide_eras("bash", line) == ("deny", "deny", "deny")


@pytest.mark.parametrize("line", RUNNERS_HARMLESS)
def test_a_runner_of_a_harmless_command_stays_allowed(line: str) -> None:
    assert BROAD.decide_eras("bash", line) == ("allow", "allow", "allow")
    assert NO_CURL.decide_eras("bash", line) == ("allow", "allow", "allow")
    assert not judge(line).programs


@pytest.mark.parametrize("line", RUNNERS_UNSEEN + PATHS)
def test_what_a_runner_or_a_path_runs_unseen_keeps_the_allow_off(line: str) -> None:
    assert BROAD.decide("bash", line) == "deny"  # the default
    assert BROAD_ASKING.decide("bash", line) == "ask"
    assert NO_CURL.decide("bash", line) == "ask"  # an empty start: any deny rule could match
    assert "" in {u.start for u in judge(line).programs}


@pytest.mark.parametrize("line", SYSTEM)
def test_a_system_binary_by_its_path_is_as_before(line: str) -> None:
    assert BROAD.decide_eras("bash", line) == ("allow", "allow", "allow")
    assert not judge(line).programs
    assert BROAD.decide("bash", "/usr/bin/git push") == "deny"


def test_an_argument_decided_when_it_runs_is_seen_after_the_runner() -> None:
    # ``git $x`` could be ``git push``: the start is the runner's command, not ``uv run git``
    assert BROAD.decide_eras("bash", "uv run git $x") == ("deny", "allow", "allow")
    assert NO_CURL.decide("bash", "uv run git $x") == "allow"


def test_an_allow_rule_naming_the_script_allows_it() -> None:
    def policy(*allow: str) -> PermissionPolicy:
        return PermissionPolicy(allow=("bash", *allow), deny=DENY)

    assert policy("bash(./x.sh)").decide("bash", "./x.sh") == "allow"
    assert PermissionPolicy(allow=("bash(./x.sh)",), deny=DENY).decide("bash", "./x.sh") == "allow"
    assert policy("bash(./gradlew:*)").decide("bash", "./gradlew build") == "allow"
    assert policy("bash(./configure)").decide("bash", "./configure") == "allow"
    assert policy("bash(./configure)").decide("bash", "./configure --prefix=/x") == "deny"
    assert policy("bash(x.sh)").decide("bash", "./x.sh") == "deny"
    assert policy("bash(./x.sh)").decide("bash", "./y.sh") == "deny"
    # an interpreter reached by a path is named by that path
    line = ".venv/bin/python -m pytest -q"
    assert policy("bash(.venv/bin/python -m pytest:*)").decide("bash", line) == "allow"
    assert policy("bash(python -m pytest:*)").decide("bash", line) == "deny"
    # what a runner runs is named as the command itself is
    assert policy("bash(python -m pytest:*)").decide("bash", "uv run -m pytest -q") == "allow"
    assert policy("bash(python -m pytest:*)").decide("bash", "uv run python -m pytest") == "allow"


def test_the_eras_before_decide_as_they_did() -> None:
    """Checked against the code before ``shell_runners`` too: the same decisions there."""
    strict = PermissionPolicy(
        allow=("bash(pytest:*)", "bash(uv run:*)", "bash(./x.sh)", "bash(ls:*)"),
        deny=("bash(git push:*)", "bash(curl:*)"),
        ask=("bash(make:*)",),
    )
    for line in ALL:
        wrapped = line in WRAPPED_PUSH or line.startswith("/usr/bin/git push")
        for era in ("unseen", "legacy"):
            assert BROAD.decide("bash", line, era=era) == ("deny" if wrapped else "allow"), (line, era)
            assert NO_CURL.decide("bash", line, era=era) == "allow", (line, era)
        uv = line.startswith("uv run ") and not any(c in line for c in "$;&|")
        want = "allow" if uv or line in ("./x.sh", "ls && ./x.sh") else "deny"
        assert strict.decide("bash", line, era="unseen") == want, line


def test_random_runner_lines_only_refuse_more() -> None:
    rng = random.Random(5)
    words = [
        "uv",
        "run",
        "npx",
        "git",
        "push",
        "status",
        "./x.sh",
        "bin/d",
        "/usr/bin/git",
        "-c",
        "'git push'",
    ]
    words += [
        "sudo",
        "env",
        "--",
        "python3",
        "-m",
        "pytest",
        "poetry",
        "pnpm",
        "exec",
        "nix",
        "develop",
        "flock",
    ]
    words += [
        "f",
        "|",
        ";",
        "&&",
        "$x",
        "conda",
        "-n",
        "e",
        "yarn",
        "dlx",
        "npm",
        "x",
        "direnv",
        ".",
        "x.py",
        "-",
    ]
    for _ in range(3000):
        line = " ".join(rng.choice(words) for _ in range(rng.randrange(1, 9)))
        for policy in (BROAD, NO_CURL):
            now, unseen, _ = policy.decide_eras("bash", line)
            if unseen != "allow":
                assert now != "allow", line  # today's rules only ever refuse more


def test_many_runners_on_a_long_line_are_each_judged() -> None:
    line = "; ".join(["uv run pytest -q", "npx prettier --check .", "./x.sh", "pnpm exec tsc"] * 1000)
    assert BROAD.decide("bash", line) == "deny"
    assert NO_CURL.decide("bash", line.replace("./x.sh", "ls")) == "allow"
    # how long it takes: python -m bench.judge_cost (a wedged judge meets the test timeout)
