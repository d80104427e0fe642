"""What a program on a bash line runs keeps a broad allow off while a deny rule could match it.

Pure but for the checks against the ``sed`` and ``git`` installed. Each hidden case was allowed
by the rules before (``era="unseen"``, which a replay of a run recorded then still takes, and
``legacy``) and is refused now: ``ask`` where the config has an ask path, the default otherwise.
The end-to-end case, a real push kept from a real remote, is ``test_shell_programs_push``.
"""

from __future__ import annotations

import random
import shutil
import subprocess

import pytest

from durable_agent.core.permissions import PermissionPolicy
from durable_agent.core.shell_git import GIT_COMMANDS
from durable_agent.core.shell_judge import judge
from durable_agent.core.shell_sed import sed_commands, sed_options
from tests.test_shell_fail_closed import HIDDEN, STAY_ALLOWED

DENY = ("bash(git push:*)",)
BROAD = PermissionPolicy(allow=("bash",), deny=DENY)  # default deny
BROAD_ASKING = PermissionPolicy(allow=("bash",), deny=DENY, default="ask")
BROAD_ASK_RULE = PermissionPolicy(allow=("bash",), deny=DENY, ask=("bash",))
PUSH = """python3 -c 'import os; os.system("git push")'"""  # the case, verbatim

# Lines that run (or may run) `git push` through a program the judge cannot see into.
HIDDEN_BY_PROGRAMS = [
    PUSH,
    # interpreters given code inline, by name, path, wrapper and version
    "python -c 'import os'",
    "python2 -c 'import os'",
    "python3.11 -c 'import os'",
    "pypy3 -c 'import os'",
    "/usr/bin/python3 -c 'import os'",
    "env python3 -c 'import os'",
    "sudo -u x python3 -c 'import os'",
    "nohup python3 -Sc 'import os' &",
    "echo | xargs python3 -c 'import os'",
    """perl -e 'system("git push")'""",
    """perl -lne 'system("git push")' f""",
    "perl -MPOSIX -e 1",
    """ruby -e 'system("git push")'""",
    """node -e 'require("child_process").execSync("git push")'""",
    "nodejs -p 1",
    "deno eval 'Deno.Command'",
    "deno run -A x.ts",
    "deno x.ts",
    "bun -e 'Bun.spawn'",
    "bun run x.ts",
    """php -r 'system("git push");'""",
    """lua -e 'os.execute("git push")'""",
    """luajit -e 'os.execute("git push")'""",
    """Rscript -e 'system("git push")'""",
    """R -e 'system("git push")'""",
    "tclsh x.tcl",
    "wish",
    """osascript -e 'do shell script "git push"'""",
    """julia -e 'run(`git push`)'""",
    # a script file, a module, stdin
    "python3 x.py",
    "python3 -m x",
    "python3",
    "python3 -",
    "python3 - <<'EOF'\nimport os\nEOF",
    "echo 'import os' | python3",
    "perl x.pl",
    "node x.js",
    "ruby x.rb",
    "php x.php",
    # awk: system(), pipes, gawk's @, a program from a file
    """awk 'BEGIN { system("git push") }'""",
    """gawk 'BEGIN { system("git push") }'""",
    """mawk 'BEGIN { system("git push") }'""",
    """nawk 'BEGIN { system("git push") }'""",
    """awk '{ print | "sh" }'""",
    """awk 'BEGIN { "git push" | getline }'""",
    """gawk 'BEGIN { "sh" |& getline }'""",
    """gawk 'BEGIN { f = "sys" "tem"; @f("git push") }'""",
    "awk -f x.awk",
    "awk -F: -f x.awk f",
    """awk -v x=1 'BEGIN { system("git push") }'""",
    """gawk -e 'BEGIN { system("git push") }'""",
    """gawk --source='BEGIN { system("git push") }'""",
    "awk -W exec x.awk",
    """awk 'BEGIN { sys\\\ntem("git push") }'""",
    # GNU sed: the e command and the e flag, a script from a file
    "sed 's/.*/git push/e' f",
    "sed e f",
    "sed '1e git push' f",
    "sed -n -e p -e '$e git push' f",
    "sed -ne 's/x/y/ge' f",
    "sed --expression='1e git push' f",
    "sed -f x.sed f",
    "sed 's/[/]/x/' f",  # a delimiter in brackets: sed versions disagree, so it is not read
    # git: an alias, config that runs a command, its executables
    "git config alias.p push; git p",
    "git -c alias.p=push p",
    """git -c alias.x='!sh -c "git push"' x""",
    "git p origin main",
    "git -c include.path=x status",
    "git -c core.hooksPath=h commit -m x",
    "git -c protocol.ext.allow=always fetch x",
    "git --config-env=core.pager=X log",
    "git --exec-path=. status",
    'git -c core.pager="$x" log',
    "git clone --template=t x y",
    'git submodule foreach "$x"',
    "GIT_EXEC_PATH=. git status",
    "GIT_CONFIG_PARAMETERS=\"'alias.p=push'\" git p",
    "GIT_CONFIG_COUNT=1 git status",
    "env GIT_TEMPLATE_DIR=t git init",
    'GIT_PAGER="$x" git log',
    "LD_PRELOAD=./x.so ls",
    "NODE_OPTIONS='--import=data:text/javascript,x' npm test",
]

# Lines whose program or variable hands a shell a command the judge reads: judged by it.
RAN = [
    ("git -c core.pager='git push' log", "deny"),
    ("git -c core.editor='git push' commit", "deny"),
    ("git -c diff.x.textconv='git push' diff", "deny"),
    ("git rebase -x 'git push' main", "deny"),
    ("git rebase --exec='git push' main", "deny"),
    ("git rebase --exe 'git push' main", "deny"),  # git takes an abbreviated long option
    ("git rebase -ix 'git push' main", "deny"),
    ("git submodule foreach 'git push'", "deny"),
    ("git submodule --quiet foreach --recursive git push", "deny"),
    ("git bisect run git push", "deny"),
    ("git clone -u 'git push' x", "deny"),
    ("git fetch --upload-pack='git push' x", "deny"),
    ("GIT_PAGER='git push' git log", "deny"),
    ("PAGER='git push' git log", "deny"),
    ("GIT_EDITOR='bash <<< \"git push\"' git commit", "deny"),
    ("export EDITOR='git push'", "deny"),
    ("sudo GIT_SSH_COMMAND='git push' git fetch", "deny"),
    ("git -c core.pager='git $x' log", "deny"),  # what it reads hides `git $x`: unseen
    ("git -c core.pager=cat log", "allow"),
    ("git -c core.sshCommand='ssh -i key' fetch", "allow"),
    ("GIT_PAGER=cat git log", "allow"),
    ("PAGER=cat git log", "allow"),
    ("GIT_EDITOR=true git rebase --continue", "allow"),
    ("GIT_SEQUENCE_EDITOR=: git rebase -i HEAD~3", "allow"),
    ("git rebase -x 'pytest -q' main", "allow"),
    ("git submodule foreach 'git status'", "allow"),
    ("git bisect run pytest -x", "allow"),
]

# Under the broad allow with the deny rule: still allowed.
STAY_ALLOWED_TOO = [
    "python3 --version",
    "python3 -V",
    "python --help",
    "node --version",
    "perl -v",
    "deno fmt",
    "deno test",
    "bun install",
    "bun",
    "sed -i 's/a/b/' f",
    "sed -n '1,5p' f",
    "sed 's/hello/world/g' f",
    "sed -E 's/(a|b)+/e/g; /x/d' f",
    "sed -i.bak -e 's/e/E/' f",
    "sed --sandbox 's/x/y/e' f",  # sed refuses e there
    "sed '/end/I,+2{s/e/f/;p}' f",
    "sed 'y/abe/xyz/' f",
    "sed '1i\\\nheader e' f",
    "sed -e 'a\\' -e 'e git push'",  # sed joins -e scripts by a newline: the text of `a`
    "awk '{print $1}' f",
    "awk -F'|' '{print $2}' f",
    """awk -v 'OFS=|' '{ $1 = $1; print }' f""",
    """awk '$1 == "a" || $2 == "b"' f""",
    "awk '/a|b/ {n++} END {exit n > 0}' f",
    "gawk --sandbox 'BEGIN { system(\"x\") }'",
    "git status",
    "git log --oneline -5",
    "git diff HEAD~1",
    "git commit -am 'fix the thing'",
    "git add -A",
    "git checkout -b topic",
    "git stash pop",
    "git -C sub status",
    "git --no-pager log",
    "git -c user.name=a -c user.email=b@c commit -m x",
    "git -c core.quotepath=off status",
    "git -c color.ui=never log",
    "git -c advice.detachedHead=false checkout x",
    "git -c protocol.file.allow=always submodule update",
    "GIT_AUTHOR_NAME=a git commit -m x",
    "GIT_DIR=.git git status",
    "git help -a",
    "git --version",
    "make test",
    "pytest -q",
    "npm run build",
    "X=1 ls",
]


@pytest.mark.parametrize("line", HIDDEN_BY_PROGRAMS)
def test_a_program_hiding_what_it_runs_is_not_allowed_by_a_broad_allow(line: str) -> None:
    assert BROAD.decide("bash", line, era="unseen") == "allow", "allowed before"
    assert BROAD.decide("bash", line) == "deny"  # the default
    assert BROAD_ASKING.decide("bash", line) == "ask"
    assert BROAD_ASK_RULE.decide("bash", line) == "ask"
    assert judge(line).programs, "the judge names what it could not see"


@pytest.mark.parametrize(("line", "decision"), RAN)
def test_a_command_a_program_hands_a_shell_is_judged_by_its_content(line: str, decision: str) -> None:
    assert BROAD.decide("bash", line, era="unseen") == "allow", "allowed before"
    assert BROAD.decide("bash", line) == decision
    if decision == "deny":
        assert BROAD_ASK_RULE.decide("bash", line) in ("deny", "ask")


@pytest.mark.parametrize("line", STAY_ALLOWED_TOO + STAY_ALLOWED)
def test_lines_whose_programs_the_judge_sees_through_stay_allowed(line: str) -> None:
    assert BROAD.decide("bash", line) == "allow"
    assert not judge(line).programs, judge(line).programs


def test_the_reported_case() -> None:
    assert BROAD.decide("bash", PUSH, era="unseen") == "allow"  # the push ran
    assert BROAD.decide("bash", PUSH, era="legacy") == "allow"
    assert BROAD.decide("bash", PUSH) == "deny"
    assert BROAD_ASKING.decide("bash", PUSH) == "ask"
    [unseen] = judge(PUSH).programs
    assert unseen.start == "" and unseen.program == ("python3", "-c", 'import os; os.system("git push")')


def test_only_a_deny_rule_that_could_match_what_a_program_runs_keeps_the_allow_off() -> None:
    everything = PermissionPolicy(allow=("bash",))
    assert everything.decide("bash", PUSH) == "allow"  # no deny rule: nothing to hide from
    no_curl = PermissionPolicy(allow=("bash",), deny=("bash(curl:*)",))
    assert no_curl.decide("bash", PUSH) == "deny"  # the code may run curl
    assert no_curl.decide("bash", "git p") == "allow"  # an alias runs git, not curl
    assert no_curl.decide("bash", "git -c alias.x='!curl x' x") == "deny"
    assert no_curl.decide("bash", "GIT_PAGER='curl x' git log") == "deny"
    assert BROAD.decide("bash", "git p") == "deny"  # `git push:*` could match the alias
    reads = PermissionPolicy(allow=("bash",), deny=("read(**/.env)",))
    assert reads.decide("bash", PUSH) == "allow"  # a deny rule of another tool is no reason


# --- an allow rule that names what the program runs ------------------------------------------


def test_an_allow_rule_naming_the_module_or_script_allows_it() -> None:
    tests = PermissionPolicy(allow=("bash(python3 -m pytest:*)", "bash(python3 tools/gen.py)"), deny=DENY)
    assert tests.decide("bash", "python3 -m pytest -q tests/", era="unseen") == "allow"
    assert tests.decide("bash", "python3 -m pytest -q tests/") == "allow"
    assert tests.decide("bash", "python3 -m pytest") == "allow"
    assert tests.decide("bash", "python3 tools/gen.py") == "allow"
    # what the rules do not name, or do not allow
    for line in (
        "python3 -m pytest_evil",
        "python3 tools/gen.py --out x",  # the rule has no `:*`
        "python3 -m pytest && python3 -c 'import os'",
        "python3 -c 'import os'",
        "python3 tools/other.py",
        "env python3 -m pytest",  # spellings never allow
    ):
        assert tests.decide("bash", line) == "deny", line


def test_the_realistic_block_of_the_docs_still_runs_its_tests() -> None:
    """docs/permissions.md: ``bash(python -m pytest:*)`` under ``deny bash(git push:*)``."""
    block = PermissionPolicy(
        allow=("read", "bash(pytest:*)", "bash(python -m pytest:*)"),
        deny=("bash(git push:*)", "bash(sudo:*)"),
        default="ask",
    )
    assert block.decide("bash", "python -m pytest -q tests/") == "allow"
    assert block.decide("bash", "pytest -q") == "allow"
    assert block.decide("bash", "python -c 'import os'") == "ask"


def test_a_rule_naming_only_the_interpreter_or_nothing_does_not() -> None:
    for allow in (("bash(python3:*)",), ("bash",), ("bash(python3 -c:*)",), ("bash(python3 *:*)",)):
        policy = PermissionPolicy(allow=allow, deny=DENY)
        for line in (PUSH, "python3 x.py", "python3 -m x", "python3"):
            if policy.decide("bash", line, era="unseen") == "allow":
                assert policy.decide("bash", line) == "deny", (allow, line)
        assert policy.decide("bash", PUSH, era="unseen") == "allow"
    # under a broad allow, a rule that names the module excuses it; `bash` allows the rest
    both = PermissionPolicy(allow=("bash", "bash(python3 -m pytest:*)"), deny=DENY)
    assert both.decide("bash", "python3 -m pytest -q") == "allow"
    assert both.decide("bash", "env python3 -m pytest -q") == "allow"
    assert both.decide("bash", "python3 -m pytest_evil") == "deny"


def test_a_rule_must_name_all_the_code() -> None:
    one = PermissionPolicy(allow=("bash(perl -e print:*)",), deny=DENY)
    assert one.decide("bash", "perl -e print") == "allow"
    assert one.decide("bash", "perl -e print file.txt") == "allow"  # its arguments are data
    assert one.decide("bash", "perl -e print -e 'system(1)'") == "deny"  # perl reads both -e
    node = PermissionPolicy(allow=("bash(node -e 1:*)",), deny=DENY)
    assert node.decide("bash", "node -e 1 --import=data:x") == "deny"
    unknown = PermissionPolicy(allow=("bash(node --frob 1 x.js:*)",), deny=DENY)
    assert [u.program for u in judge("node --frob 1 x.js").programs] == [("node", "--frob", "1", "x.js")]
    assert unknown.decide("bash", "node --frob 1 x.js") == "allow"  # an unknown option: the whole line
    assert unknown.decide("bash", "node --frob 1 x.js y") == "deny"


def test_a_rule_naming_a_git_alias_or_awk_file_allows_it() -> None:
    policy = PermissionPolicy(allow=("bash(git lg:*)", "bash(awk -f report.awk:*)"), deny=DENY)
    assert policy.decide("bash", "git lg -5") == "allow"
    assert policy.decide("bash", "awk -f report.awk data.txt") == "allow"
    assert policy.decide("bash", "git lgx") == "deny"
    # config on the line is named only by a rule naming the whole command
    config = PermissionPolicy(allow=("bash(git:*)",), deny=DENY)
    assert config.decide("bash", "git -c alias.p=push p") == "deny"


# --- what the judge reports ------------------------------------------------------------------


def test_what_the_judge_reports() -> None:
    reading = judge("git -c core.pager=less log && GIT_EDITOR=vim git commit")
    assert {c.words for c in reading.ran} == {("less", '"$@"'), ("vim", '"$@"')}
    # the fields of the eras before read as they did
    assert not reading.unseen and not reading.fed
    assert [u.start for u in judge("git p").programs] == ["git"]
    assert {u.start for u in judge("git -c alias.p=push p").programs} == {"git"}
    assert [u.start for u in judge("bash <<< 'python3 -c 1'").programs] == [""]  # in a fed script
    assert [u.start for u in judge("bash -c 'perl x.pl'").programs] == [""]
    assert "" in {u.start for u in judge("GIT_PAGER='echo \"x' git log").programs}  # unreadable


def test_decide_eras_judges_once_and_agrees() -> None:
    lines = [*HIDDEN_BY_PROGRAMS, *(line for line, _ in RAN), *STAY_ALLOWED_TOO, *HIDDEN, *STAY_ALLOWED]
    for policy in (BROAD, BROAD_ASKING, PermissionPolicy(allow=("bash(python3 -m pytest:*)",), deny=DENY)):
        for line in lines:
            assert policy.decide_eras("bash", line) == (
                policy.decide("bash", line),
                policy.decide("bash", line, era="unseen"),
                policy.decide("bash", line, era="legacy"),
            )
            assert policy.decide_both("bash", line) == policy.decide_eras("bash", line)[1:]
    assert BROAD.decide_eras("read", "a.txt") == ("deny", "deny", "deny")


def test_subagent_rules_decide_in_every_era() -> None:
    child = PermissionPolicy(allow=("bash",), within=(BROAD,))
    assert child.decide_eras("bash", PUSH) == ("deny", "allow", "allow")


def test_random_lines_never_raise_and_only_refuse_more() -> None:
    rng = random.Random(7)
    words = ["python3", "-c", "-m", "'x'", "perl", "-e", "awk", "'{system(1)}'", "sed", "'s/a/b/e'", "git"]
    words += ["-c", "alias.p=push", "p", "status", "GIT_PAGER=cat", "PAGER='git push'", "|", ";", "&&", "$x"]
    words += ["env", "sudo", "node", "deno", "run", "bun", "-f", "x", "'e'", "--", "-i", "gawk", "--sandbox"]
    for _ in range(3000):
        line = " ".join(rng.choice(words) for _ in range(rng.randrange(1, 10)))
        now, unseen, legacy = BROAD.decide_eras("bash", line)
        assert {now, unseen, legacy} <= {"allow", "deny", "ask"}
        if unseen != "allow":
            assert now != "allow", line  # today's rules only ever refuse more


def test_many_programs_on_a_long_line_are_each_judged() -> None:
    line = "; ".join(
        ["sed -e 's/a/b/g' -e 'y/abc/xyz/' f", "awk '{print $1}' f", "git -c color.ui=never log"] * 700
    )
    assert BROAD.decide("bash", line) == "allow"
    assert BROAD.decide("bash", line + "; python3 -c 1") == "deny"
    # how long it takes: python -m bench.judge_cost (a wedged judge meets the test timeout)


# --- against the programs installed ----------------------------------------------------------


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
def test_every_git_builtin_is_known() -> None:
    """git ignores an alias that names one of its commands: the list must hold every builtin."""
    builtins = subprocess.run(["git", "--list-cmds=builtins"], capture_output=True, text=True, check=True)
    assert set(builtins.stdout.split()) <= GIT_COMMANDS


def gnu_sed() -> bool:
    if shutil.which("sed") is None:
        return False
    return "GNU" in subprocess.run(["sed", "--version"], capture_output=True, text=True).stdout


def sandbox_refuses(script: str) -> bool:
    """Whether GNU sed's --sandbox refuses the script (it holds e, r or w), as sed reads it."""
    run = subprocess.run(["sed", "--sandbox", "-n", "-e", script], input="", capture_output=True, text=True)
    return "disabled in sandbox mode" in run.stderr


@pytest.mark.skipif(not gnu_sed(), reason="needs GNU sed")
def test_the_sed_reading_never_misses_what_gnu_sed_runs() -> None:
    """Random scripts: whenever GNU sed finds ``e``, ``r`` or ``w``, the reading does, or doubts."""
    rng = random.Random(3)
    pieces = ["s", "/", "|", "[", "]", "^", "\\", "e", "w", "r", "y", "a", "i", "c", "b", ":", ";", "\n"]
    pieces += [" ", "p", "g", "1", ",", "$", "!", "{", "}", "#", "x", "I", "[:alpha:]", "+", "~", "q", "n"]
    scripts = ["".join(rng.choice(pieces) for _ in range(rng.randrange(1, 12))) for _ in range(1500)]
    scripts += ["s/[/]/e/e", "s/a/[/]/", "/[/]/e", "s/[[:alpha:]/]/x/e", "s/a/b/ e", "a\\\ne", "b e", ":a;e"]
    missed, doubted = [], 0
    for script in scripts:
        found = sed_commands(script)
        doubted += found is None
        if sandbox_refuses(script) and found is not None and not set(found) & set("erwRW"):
            missed.append(script)
    assert not missed, missed
    assert doubted < len(scripts)  # most are read, not doubted


def test_sed_options() -> None:
    assert sed_options(("sed", "-n", "-e", "p", "-e", "1d", "f")) == ("p\n1d", 6, False, False, False)
    assert sed_options(("sed", "-ie", "s/a/b/", "f")) == ("s/a/b/", 3, False, False, False)  # -i's suffix "e"
    assert sed_options(("sed", "f", "-n", "--expression=p")) == ("p", 4, False, False, False)
    assert sed_options(("sed", "-f", "x.sed", "f"))[2]
    assert sed_options(("sed", "--frob", "p"))[3]
    assert sed_options(("sed", "--sand", "s/x/y/e"))[4]
