"""Deny rules under a broad ``bash`` allow fail closed where the judge cannot see what runs.

Pure: no server (the replay of these decisions is in ``test_shell_gate_replay``). Each
refused case was allowed by the rules before (``era="legacy"``, which a replay of a run
recorded then still takes) and is refused now: ``ask`` where the config has an ask path,
the default otherwise.
"""

from __future__ import annotations

import itertools
import random
import time

import pytest
import re2

from durable_agent.core.globs import compile_glob
from durable_agent.core.permissions import PermissionPolicy
from durable_agent.core.rule_reach import could_match
from durable_agent.core.shell_judge import MAX_CHARS, judge
from durable_agent.core.shell_unseen import MAX_SCAN
from tests.test_shell_rules import CORPUS, RULES

DENY = ("bash(git push:*)",)
BROAD = PermissionPolicy(allow=("bash",), deny=DENY)  # default deny
BROAD_ASKING = PermissionPolicy(allow=("bash",), deny=DENY, default="ask")
BROAD_ASK_RULE = PermissionPolicy(allow=("bash",), deny=DENY, ask=("bash",))

HEREDOC = "bash <<'EOF'\ngit push\nEOF"

# Lines that run `git push` (or may) without the judge seeing it; all allowed before.
HIDDEN = [
    # failure 2: a script fed to a shell on stdin, or from a file or an expansion
    "bash -s",
    "echo 'git push' | bash -s",
    "cat <<EOF | bash\ngit push\nEOF",
    "echo git push | bash",
    "printf 'git push' | sh",
    "bash < script.sh",
    "bash script.sh",
    "bash /dev/stdin",
    "bash <(echo git push)",
    "source /dev/stdin",
    ". /dev/stdin",
    "source ./x.sh",
    'sh -c "$(cat x)"',
    'bash -c "$CMD"',
    "bash <<EOF\ngit $x\nEOF",  # a here-doc whose text is expanded when it runs
    'bash <<< "$x"',
    "dash -s < f",
    "zsh",
    "ksh -",
    "echo git push | xargs sh",
    "echo push | xargs git",
    "echo push | xargs -n1 git",
    "sudo -s",
    "chroot /",
    "script -q /dev/null",
    "BASH_ENV=x.sh bash -c ls",
    "bash --rcfile x.sh -i",
    "/bin/bash -s",
    "b\\ash -s",
    "ba''sh -s",
    '"$SHELL" -s',
    "nohup bash -s &",
    "bash 0<<< 'git push'",  # tree-sitter reads `0` as a word: a script file, unseen
    "bash <<< 'ls' <<< 'git push'",  # two here-strings: bash reads the last
    "bash -c 'cat | bash' <<< 'git push'",
    "sh -c 'git \"$@\"' _ push",
    "bash -c 'eval \"$1\"' _ 'git push'",
    "builtin source x",
    "\\. /dev/stdin",
    "xargs -a f git",
    "find . -exec sh {} \\;",
    # failure 3: a command word built when the line runs
    "git${IFS}push",
    "${x:-git} push",
    "eval ${x:-git push}",
    "G=git; $G push",
    "$(echo git) push",
    "`echo git` push",
    '"$G" push',
    "$G push",
    "/usr/bin/$G push",
    "g*t push",
    'eval "$cmd"',
    "eval git $x",
    "command $G push",
    "env $G push",
    'trap "$x" EXIT',
    # an argument built when it runs, where `git push:*` could match
    "git $x",
    "x=push; git $x",
    "git pus?",
    "git p{u,}sh",
    "git -C . $x",
    'git() { command git "$@"; }; git push2',
    # text that becomes code later
    "alias p='git push'",
    "hash -p /usr/bin/git ls; ls push",
    "x='a[$(git push)]'; echo $((x))",
    "x='a[$(git push)]'; [[ $x -eq 1 ]]",
    "x='a[$(git push)]'; echo ${s:x}",
    "y='$(git push)'; echo ${y@P}",
    "n='a[$(git push)]'; echo ${!n}",
    "declare -i z; z='a[$(git push)]'",
    "PS4='$(git push)'; set -x; ls",
    "export PS4='$(git push)'",
    "env 'BASH_FUNC_ls%%=() { git push; }' bash -c ls",
    "printf -v 'a[$i]' x",
    "unset 'a[$i]'",
    "let x=1",
    "for ((i=0; i<n; i++)); do :; done",
    "mapfile -C 'git push' -c 1 < f",
    "echo $(($x))",
    "test -v 'a[$(git push)]'",
]

# Literal scripts the judge reads: judged by their content, as `bash -c` always was.
FED = [
    ("bash <<< 'git push'", "deny"),
    (HEREDOC, "deny"),
    ("bash <<-'EOF'\n\tgit push\n\tEOF", "deny"),
    ("bash <<EOF\ngit push\nEOF", "deny"),  # no expansion in the body: literal
    ("sh -s <<< 'git push origin'", "deny"),
    ("bash <<< 'bash <<< \"git push\"'", "deny"),
    ("trap 'git push' EXIT", "deny"),
    ("script -qc 'git push' /dev/null", "deny"),
    ("fish -c 'git push'", "deny"),
    ("bash<<<'git push'", "deny"),
    ("command bash <<< 'git push'", "deny"),
    ("exec bash <<< 'git push'", "deny"),
    ("bash -s <<< 'git push'", "deny"),
    ("bash -- <<< 'git push'", "deny"),
    ("bash <<'EOF'\ngit push $x\nEOF", "deny"),  # a quoted here-doc is literal
]

# Under the broad allow with the deny rule: still allowed.
STAY_ALLOWED = [
    "git status",
    'echo "$HOME"',
    "echo $$ > pid; sleep 60",
    "bash -c 'ls'",
    "bash -lc 'pytest -q'",
    "bash <<< 'ls -la'",
    "bash <<'EOF'\nls\nEOF",
    "ls *.py",
    'cd "$dir" && git status',
    'git commit -m "$(date)"',
    "git add *.py",
    'for f in *.py; do echo "$f"; done',
    "[ -f x ] && ls",
    '[ "$x" -eq 1 ]',
    "echo $((1+2))",
    'echo "${arr[@]}" ${#arr[@]} ${a[0]}',
    "find . -name '*.py' | xargs grep -n foo",
    "bash --version",
    "make test",
    "export A=1; pytest",
]


@pytest.mark.parametrize("line", HIDDEN)
def test_a_line_hiding_what_it_runs_is_not_allowed_by_a_broad_allow(line: str) -> None:
    assert BROAD.decide("bash", line, era="legacy") == "allow", "allowed before"
    assert BROAD.decide("bash", line) == "deny"  # the default
    assert BROAD_ASKING.decide("bash", line) == "ask"
    assert BROAD_ASK_RULE.decide("bash", line) == "ask"
    assert judge(line).unseen, "the judge names what it could not see"


@pytest.mark.parametrize(("line", "decision"), FED)
def test_a_literal_script_fed_to_a_shell_is_judged_by_its_content(line: str, decision: str) -> None:
    assert BROAD.decide("bash", line, era="legacy") == "allow", "allowed before"
    assert BROAD.decide("bash", line) == decision
    assert BROAD_ASK_RULE.decide("bash", line) == decision  # a deny rule's match is not asked about


@pytest.mark.parametrize("line", STAY_ALLOWED)
def test_lines_the_judge_sees_through_stay_allowed(line: str) -> None:
    assert BROAD.decide("bash", line) == "allow"
    assert BROAD.decide("bash", line, era="legacy") == "allow"


def test_the_reported_cases_verbatim() -> None:
    for line in ("bash <<< 'git push'", HEREDOC, "cat <<EOF | bash\ngit push\nEOF", "bash -s"):
        assert BROAD.decide("bash", line) == "deny"
    assert BROAD.decide("bash", "source /dev/stdin") == "deny"
    for line in ("git${IFS}push", "${x:-git} push", "eval ${x:-git push}", "G=git; $G push"):
        assert BROAD.decide("bash", line) == "deny"
        assert BROAD_ASKING.decide("bash", line) == "ask"


def test_only_a_deny_rule_that_could_match_what_is_hidden_keeps_the_allow_off() -> None:
    # no deny rule: nothing to hide from
    everything = PermissionPolicy(allow=("bash",))
    for line in ("bash -s", "G=git; $G push", "git $x", "eval $x"):
        assert everything.decide("bash", line) == "allow"
    # a deny rule about curl cannot match `git …`, whatever `$x` holds; it can match `$G …`
    no_curl = PermissionPolicy(allow=("bash",), deny=("bash(curl:*)",))
    assert no_curl.decide("bash", "git $x") == "allow"
    assert no_curl.decide("bash", "echo push | xargs git") == "allow"
    assert no_curl.decide("bash", "$G push") == "deny"
    assert no_curl.decide("bash", "bash -s") == "deny"
    # a deny rule for another tool is no reason
    reads = PermissionPolicy(allow=("bash",), deny=("read(**/.env)",))
    assert reads.decide("bash", "$G push") == "allow"
    # a deny rule whose pattern could match any text: every argument expansion is hidden
    anywhere = PermissionPolicy(allow=("bash",), deny=("bash(*push*)",))
    assert anywhere.decide("bash", 'echo "$HOME"') == "deny"
    assert anywhere.decide("bash", "echo home") == "allow"


def test_allow_lists_fail_closed_too() -> None:
    # `bash(bash:*)` allowed `echo git push | bash` as plain words; the deny rule could match its stdin
    policy = PermissionPolicy(allow=("bash(echo:*)", "bash(bash:*)", "bash(git:*)"), deny=DENY)
    for line in ("echo git push | bash", "bash x.sh", "git pus?"):
        assert policy.decide("bash", line, era="legacy") == "allow"
        assert policy.decide("bash", line) == "deny"
    assert policy.decide("bash", "git status") == "allow"
    assert policy.decide("bash", "git $x") == "deny"  # never allowed: an expansion
    assert policy.decide("bash", "echo hi | bash -c 'ls'") == "deny"  # a shell string: opaque, as before


def test_a_prefix_rule_allows_plain_variables_after_its_words() -> None:
    policy = PermissionPolicy(allow=("bash(echo:*)", "bash(git status)", "bash(ls:*)"))
    for line in ('echo "$HOME"', "echo $HOME x", 'echo "${HOME}"', 'echo "$@" "$1"', 'ls; echo "$x"'):
        assert policy.decide("bash", line, era="legacy") == "deny"
        assert policy.decide("bash", line) == "allow"
    refused = [
        'git status "$x"',  # `git status` takes no further words
        "$x ls",
        'echo "${x:=y}"',
        "echo ${x@P}",
        "echo ${!x}",
        "echo $((x))",
        'echo "$(ls)"',
        'echo "$HOME"/x',
        'echo {a,b} "$x"',
        'echo "$x" > out',
        'echo "$x" | curl -d @- x',
        'X=1 echo "$x"',
        'echo $"hi"',
    ]
    for line in refused:
        assert policy.decide("bash", line) == "deny", line
    # a deny rule that could match the variable's value wins
    guarded = PermissionPolicy(allow=("bash(git:*)",), deny=DENY)
    assert guarded.decide("bash", 'git "$sub"') == "deny"
    assert guarded.decide("bash", 'git log "$x"') == "allow"


def test_the_legacy_decisions_are_those_of_the_corpus() -> None:
    """The old rules' corpus holds under ``era="legacy"``, so recorded runs replay alike."""
    strict = PermissionPolicy(**RULES, default="deny")
    asking = PermissionPolicy(**RULES, default="ask")
    for line, want_strict, want_asking in CORPUS:
        got = (strict.decide("bash", line, era="legacy"), asking.decide("bash", line, era="legacy"))
        assert got == (want_strict, want_asking), line


def test_decide_both_judges_once_and_agrees() -> None:
    for line in [*HIDDEN, *STAY_ALLOWED, *(line for line, _ in FED), "python3 -c 'print(1)'"]:
        assert BROAD.decide_both("bash", line) == (
            BROAD.decide("bash", line, era="unseen"),
            BROAD.decide("bash", line, era="legacy"),
        )
    assert BROAD.decide_both("read", "a.txt") == ("deny", "deny")


def test_what_the_judge_reports() -> None:
    reading = judge("G=git; $G push")
    assert [u.start for u in reading.unseen] == [""]
    assert [u.start for u in judge("git $x").unseen] == ["git"]
    assert [c.words for c in judge(HEREDOC).fed] == [("git", "push")]
    assert not judge(HEREDOC).unseen
    # the old fields read as before: a here-doc is opaque, the fed script is not among the commands
    assert [c.words for c in judge(HEREDOC).commands] == [("bash",)]
    # an unreadable fed script is itself unseen
    assert [u.start for u in judge("bash <<< 'echo \"unterminated'").unseen] == [""]


def test_fed_scripts_are_bounded() -> None:
    line = "bash <<< " + "'" + 'bash <<< "' * 1 + "git push" + '"' + "'"
    assert BROAD.decide("bash", line) == "deny"
    deep = "bash -c " + '\'bash -c "bash -c \\"bash -c ls\\""\''
    assert BROAD.decide("bash", deep) in ("deny", "allow")  # never raises
    many = "; ".join(["bash <<< 'ls'"] * 2000)
    assert BROAD.decide("bash", many) == "allow"


# --- could a pattern match a command the judge saw the start of -------------------


@pytest.mark.parametrize(
    ("pattern", "start", "expected"),
    [
        ("git push:*", "", True),
        ("git push:*", "git", True),
        ("git push:*", "git push", True),
        ("git push:*", "git push origin", True),
        ("git push:*", "git commit -m", False),
        ("git push:*", "echo", False),
        ("git push:*", "gitx", False),
        ("git push", "git", True),
        ("git push", "git push", True),  # the hidden part may be nothing
        ("git push", "git push x", False),
        ("curl:*", "git", False),
        ("*push*", "echo", True),
        ("rm -rf:*", "rm", True),
        ("rm -rf:*", "rm -f", False),
        ("git push*", "git", True),
        ("a/**/b", "a", False),  # the hidden part follows a blank
        ("a/**/b", "a/x", True),
        ("a/*/b", "a/x y", True),
        ("x?y", "x", True),
        ("x?y", "x/", False),
    ],
)
def test_could_match(pattern: str, start: str, expected: bool) -> None:
    assert could_match(pattern, start) is expected


def test_could_match_never_misses_a_match() -> None:
    """Whenever the pattern matches ``start`` or ``start`` + blank + more, ``could_match`` says so."""
    rng = random.Random(11)
    pieces = ["git", " ", "push", "*", "**", "**/", "?", "/", ":", "a", "-"]
    tails = ["", " x", " push", " a/b", " -", " push origin", " :", "  "]
    for _ in range(3000):
        pattern = "".join(rng.choice(pieces) for _ in range(rng.randrange(1, 6)))
        if rng.random() < 0.5:
            pattern += ":*"
        body, prefix = (pattern[:-2], True) if pattern.endswith(":*") else (pattern, False)
        compiled: re2._Regexp[str] = compile_glob(
            body, extended=False, suffix=r"(?:[\s:].*)?" if prefix else ""
        )
        start = "".join(rng.choice(["git", " ", "push", "a", "/", "x"]) for _ in range(rng.randrange(0, 4)))
        for tail in tails:
            text = start + tail if start else tail.lstrip(" ")
            if compiled.fullmatch(text) is not None and (start == "" or tail == "" or tail.startswith(" ")):
                assert could_match(pattern, start), (pattern, start, tail)


def test_could_match_is_exact_on_small_patterns() -> None:
    """Against brute force: every completion (nothing, or a blank then up to 4 characters)."""
    rng = random.Random(2)
    alphabet = ["a", "/", " ", ":"]
    completions = [""] + [" " + "".join(t) for n in range(5) for t in itertools.product(alphabet, repeat=n)]
    pieces = ["a", " ", "*", "**", "**/", "?", "/", ":"]
    for _ in range(400):
        pattern = "".join(rng.choice(pieces) for _ in range(rng.randrange(1, 4)))
        if rng.random() < 0.5:
            pattern += ":*"
        body, prefix = (pattern[:-2], True) if pattern.endswith(":*") else (pattern, False)
        compiled = compile_glob(body, extended=False, suffix=r"(?:[\s:].*)?" if prefix else "")
        start = "".join(rng.choice(alphabet) for _ in range(rng.randrange(1, 4)))
        brute = any(compiled.fullmatch(start + tail) is not None for tail in completions)
        assert could_match(pattern, start) is brute, (pattern, start)


def test_long_patterns_and_starts() -> None:
    pattern = "git push " + "x" * 5000 + ":*"
    assert could_match(pattern, "git") and could_match(pattern, "git push " + "x" * 5000)
    assert not could_match(pattern, "git push " + "x" * 4999)  # the hidden part follows a blank
    assert not could_match(pattern, "git pusx")
    assert could_match("a" * 20_000, "a" * 20_000) and could_match("a" * 9_999 + " *", "a" * 9_999)
    assert not could_match("a" * 20_000, "a" * 19_000)


# --- bounds ------------------------------------------------------------------------


def test_random_lines_never_raise() -> None:
    rng = random.Random(5)
    alphabet = "ab $'\"\\`#;&|(){}<>\n*?[]=~!-"
    words = ["git", "push", "bash", "-s", "-c", "'ls'", "<<<", "<<EOF\n", "EOF\n", "$x", "|", ";", "eval"]
    words += ["source", "xargs", '"$HOME"', "$((x))", "trap", "&&", "declare", "-i", "a[$i]", "${x@P}", "<"]
    for _ in range(2000):
        if rng.random() < 0.5:
            line = "".join(rng.choice(alphabet) for _ in range(rng.randrange(1, 40)))
        else:
            line = " ".join(rng.choice(words) for _ in range(rng.randrange(1, 12)))
        decision, legacy = BROAD.decide_both("bash", line)
        assert decision in ("allow", "deny", "ask") and legacy in ("allow", "deny", "ask")
        if legacy != "allow":
            assert decision != "allow", line  # under a broad allow, today's rules only ever refuse more


def test_a_command_with_too_many_spellings_to_search_hides_what_it_runs() -> None:
    words = " ".join(f"a{i}" for i in range(200))
    line = f"sudo {words} $x"  # 200 spellings of ~100 words each, all with `$x`
    assert any(u.start == "" and str(MAX_SCAN) in u.why for u in judge(line).unseen)
    assert BROAD.decide("bash", line) == "deny"
    assert BROAD.decide("bash", "sudo a b c") == "allow"
    assert BROAD.decide("bash", "sudo a b $x") == "deny"  # any later word of a wrapper may be the command


def test_a_script_fed_to_a_shell_is_read_within_the_judge_bounds() -> None:
    script = "ls; " * ((MAX_CHARS - 20) // 4)
    assert BROAD.decide("bash", f"bash <<< '{script}'") == "allow"
    assert BROAD.decide("bash", f"bash <<< '{script}git push'") == "deny"
    too_long = "ls; " * (MAX_CHARS // 4 + 10)
    assert BROAD.decide("bash", f"bash <<< '{too_long}'") == "deny"  # not read whole: unseen
    start = time.perf_counter()
    BROAD.decide_both("bash", f"bash <<< '{script}'")
    assert time.perf_counter() - start < 30  # about a second on a laptop; a wedged judge would not end
