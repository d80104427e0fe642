"""The permission language: ``tool(pattern)`` rules in allow / deny / ask lists.

Precedence: deny wins over allow, allow over ask, ask over the default. The
pattern is matched against what a call touches (a path, a pattern, a command):
``*`` does not cross ``/``, ``**`` does, ``?`` is one character, and a trailing
``:*`` matches a command prefix (``bash(git:*)``). Tool names match
case-insensitively, and ``*`` in a tool name matches any run of characters
(``mcp__github__*`` is every tool of the MCP server ``github``). A rule without
a pattern covers every call of the tools it names.

``multi_edit`` and ``apply_patch`` change files as ``edit`` does, so the rules
that name ``edit`` judge them as well as the rules that name them
(``RULED_AS_EDIT``): ``edit(src/**)`` in ``allow`` allows a ``multi_edit`` of
``src/a.py``, ``edit(.env)`` in ``deny`` denies an ``apply_patch`` touching
``.env``, and ``deny multi_edit`` denies it whatever the ``edit`` rules say.
``apply_patch`` touches every path its patch names: each is decided, and the
strictest decision stands (``strictest``: a deny denies the call, else an ask
asks).

A ``bash`` line is parsed (``durable_agent.core.shell_judge``) into its simple
commands, wherever they are: in lists and pipelines, subshells, ``$(…)``,
backticks, process substitutions, function bodies, control structures, after a
comment's newline, inside ``bash -c '…'`` and ``eval``, and in the literal
script a line feeds a shell (``bash <<< '…'``, a quoted here-doc), ``trap`` or
``script -c``. Each command is its words after quote removal, joined by single
spaces (``'git'  "status"`` is ``git status``).

- A deny rule denies the line when it matches the line's text or any spelling
  of any command in it: the words as written; a path's last part
  (``/usr/bin/git push`` is ``git push``); what a wrapper runs (``command``,
  ``builtin``, ``exec``, ``env``, ``nohup``, ``time``, ``nice``, ``sudo``,
  ``timeout``, ``xargs``, ``watch`` … : every later suffix of its words, so
  ``env -i A=b git push`` and ``sudo -u root git push`` are ``git push``);
  ``find -exec``'s command; git without its global options (``git -C . -c x=y
  --no-pager push`` is ``git push``); the words as if every expansion were
  empty (``$x git push``, ``git push$x``).
- Where the line runs what the judge cannot see, no allow rule allows it while
  a deny rule could match what is hidden (``shell_unseen``, ``rule_reach``):
  ask and the default decide. Hidden are a shell's script read from stdin, a
  pipe, a file or an expansion (``bash -s``, ``cat x | sh``, ``bash x.sh``,
  ``source f``, ``sh -c "$(cat x)"``); a command word built when the line runs
  (``$G push``, ``git${IFS}push``, ``$(echo git) push``, ``eval $x``); an
  argument so built, after the words seen (``git $x``, ``git pus?``: a deny
  rule ``git push:*`` could match, ``curl:*`` could not); ``xargs``' words
  from stdin; ``alias``, ``hash -p``, ``PS4``/``BASH_ENV``/``BASH_FUNC_*``;
  arithmetic on a variable (``$((x))``, ``[[ $x -eq 1 ]]``, ``${s:n}``),
  ``${x@P}`` and ``${!x}``, which run the ``$(…)`` a value holds.
- So is what a program runs that its words do not show (``shell_programs``;
  ``docs/shell-rules.md`` lists it): an interpreter's code, script, module or
  stdin (``python3 -c …``, ``perl -e``, ``node -e``, ``python3 -m x``), awk's
  ``system()``, sed's ``e``, a git alias (start ``git``), ``git -c`` config and
  variables that may run a command, a script run by its path (``./x.sh``, not
  ``/usr/bin/git``); where the line holds that command (``GIT_PAGER=…``, ``git
  rebase --exec …``, a runner's: ``uv run git push``, ``npx …``), it is read for
  the deny rules instead (``shell_runners``). Except where an allow rule names what the program runs: its
  pattern, without ``:*``, is the unseen place's ``program`` words or begins
  with them then a blank, and it matches the command (``bash(python3 -m
  pytest:*)``, ``bash(python3 tools/gen.py)``); ``bash(python3:*)`` and
  ``bash`` name nothing.
- An allow rule allows the line only when the line is *transparent* (nothing
  in it is decided when it runs, see ``shell_judge``) and it matches the plain
  words of every command. Spellings never allow: ``bash(pytest:*)`` allows
  ``pytest -q`` but not ``env pytest`` nor ``/usr/bin/pytest``. One exception
  to transparency: a rule ending in ``:*`` takes any words after its own, so
  it also allows plain variables there (``bash(echo:*)`` allows ``echo
  "$HOME"``; not ``${x:=y}``, ``$(…)`` nor ``$((…))``).
- Otherwise an ask rule that matches a command's plain words asks, and the
  default decides what is left: opaque lines (a comment, ``$VAR``, ``$(…)``, a
  redirection to a file, ``A=b cmd``, ``if``/``for``, …) never reach allow.
- A rule without a pattern (``bash``) allows every line, except one the judge
  could not read (it does not parse, is longer than 64 KiB, is nested too
  deeply, or tree-sitter reads it otherwise than bash) while a deny rule with a
  pattern is in force: then ask and the default decide, since the deny rule
  might have matched what went unseen.

``web_fetch`` is judged by the host of its URL, as ``domain:HOST`` (lower
case, no port): ``web_fetch(domain:docs.python.org)`` allows that host,
``web_fetch(domain:*.python.org)`` its subdomains (not ``python.org``
itself), a bare ``web_fetch`` every host. It is denied by default whatever
``default`` says: only an allow or ask rule that names it (not a ``*`` in a
tool name) lets a call run, so a run that does not mention it is never
offered it. Deny rules apply as to any tool.

Replays decide as the run first did (``decide(era=…)``, ``workflows.shell_gate``):
a run recorded before the hidden places above and the ``:*`` rule's variables
takes the ``legacy`` decisions; one recorded before what programs run, the
``unseen`` ones.

What a rule cannot promise: it judges the text of a line, not its effects.
``bash(pytest:*)`` allows ``pytest -p plugin`` and ``pytest --rootdir …``,
which import code from the workspace, and ``pytest`` itself runs the
workspace's ``conftest.py``; ``bash(git status)`` runs no hooks, but a
repository's config can name commands (``core.fsmonitor``, ``core.pager``),
and an alias in it runs what it says. Globs in arguments are left to bash
(``rm *`` can expand to ``-rf``); deny rules see spellings, not option orders
(``rm -fr`` is not ``rm -rf``); a program may run the workspace's files without
being given code or a script on the line (``make``, ``npm run``, ``pytest``, a
git hook), which no reading of the line sees. So deny rules under a broad
``bash`` allow are a blocklist that data flow defeats (a file written by one
call and run by the next, a git alias or hook in the repository's config);
allow-lists (``bash(pytest:*)``, ``bash(git status)``) are the safe form. Rules
decide what runs without a person; the sandbox is the boundary (with its
network off, no push leaves it).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from functools import lru_cache
from typing import Literal

import re2
from pydantic import field_validator

from durable_agent.core.errors import DurableAgentError
from durable_agent.core.globs import GlobError, compile_glob
from durable_agent.core.models import Sparse
from durable_agent.core.rule_reach import could_match, names_program
from durable_agent.core.shell_judge import ShellLine, judge
from durable_agent.core.shell_unseen import Unseen

Decision = Literal["allow", "deny", "ask"]
# The judges of a shell line, oldest first (see the module docstring): a replay decides by the
# one its run was recorded with (``workflows.shell_gate``).
Era = Literal["legacy", "unseen", "programs"]

_RULE = re.compile(r"^\s*([A-Za-z_*][A-Za-z0-9_\-*]*)\s*(?:\((.*)\))?\s*$", re.DOTALL)


class InvalidRule(DurableAgentError, ValueError):
    pass


# Tools whose target is a web address's host, ``domain:HOST``: never allowed by ``default`` or by a
# ``*`` in a rule's tool name, only by a rule that names them (see the module docstring).
DOMAIN_TOOLS = frozenset({"web_fetch"})
DOMAIN_PREFIX = "domain:"


# Tools judged by the rules that name ``edit`` as well as by their own (see the module docstring).
RULED_AS_EDIT = frozenset({"multi_edit", "apply_patch"})
_STRICTNESS: tuple[Decision, ...] = ("allow", "ask", "deny")


def strictest(decisions: Iterable[Decision]) -> Decision:
    """The strictest of the decisions for the targets of one call: ``deny``, then ``ask``, then
    ``allow`` (``allow`` when there are none)."""
    return max(decisions, key=_STRICTNESS.index, default="allow")


@dataclass(frozen=True)
class Rule:
    tool: str  # lower-cased; ``*`` matches any run of characters
    pattern: str | None

    def names(self, tool: str) -> bool:
        """Whether the rule is about ``tool`` (its name, or a name its ``*`` covers); a rule about
        ``edit`` is about the tools in ``RULED_AS_EDIT`` too."""
        name = tool.lower()
        if name in RULED_AS_EDIT and self._names("edit"):
            return True
        return self._names(name)

    def _names(self, name: str) -> bool:
        if "*" not in self.tool:
            return name == self.tool
        return _tool_glob(self.tool).fullmatch(name) is not None

    def matches(self, tool: str, target: str | None) -> bool:
        if not self.names(tool):
            return False
        if self.pattern is None:
            return True
        if target is None:
            return False
        return _compile(self.pattern).fullmatch(target) is not None


@lru_cache(maxsize=1024)
def parse_rule(text: str) -> Rule:
    """Parse ``tool`` or ``tool(pattern)``; raise ``InvalidRule`` with the reason."""
    m = _RULE.match(text)
    if not m:
        raise InvalidRule(f"invalid permission rule {text!r}: expected 'tool' or 'tool(pattern)'")
    tool, pattern = m.group(1).lower(), m.group(2)
    if pattern is not None:
        if pattern == "":
            raise InvalidRule(f"invalid permission rule {text!r}: empty pattern")
        if tool in DOMAIN_TOOLS and not pattern.startswith(DOMAIN_PREFIX):
            raise InvalidRule(
                f"invalid permission rule {text!r}: {tool} patterns are {DOMAIN_PREFIX}HOST "
                f"(e.g. {tool}({DOMAIN_PREFIX}docs.python.org))"
            )
        _compile(pattern)
    return Rule(tool, pattern)


@lru_cache(maxsize=256)
def _tool_glob(name: str) -> re.Pattern[str]:
    return re.compile(".*".join(re.escape(part) for part in name.split("*")))


def _compile(pattern: str) -> re2._Regexp[str]:
    prefix = pattern.endswith(":*")
    body = pattern[:-2] if prefix else pattern
    try:
        return compile_glob(body, extended=False, suffix=r"(?:[\s:].*)?" if prefix else "")
    except GlobError as exc:
        raise InvalidRule(str(exc)) from None


@dataclass(frozen=True)
class _Matcher:
    """The rules of one list that name one tool, compiled."""

    every: bool  # a rule without a pattern: it matches every call
    patterns: tuple[re2._Regexp[str], ...]
    sources: tuple[str, ...]  # the patterns as written, for ``could_match``

    def matches(self, text: str) -> bool:
        return self.every or any(p.fullmatch(text) is not None for p in self.patterns)

    def could_match(self, start: str) -> bool:
        """Whether a rule could match a command starting with ``start`` (see ``rule_reach``)."""
        return self.every or any(could_match(source, start) for source in self.sources)

    def names(self, unseen: Unseen) -> bool:
        """Whether a rule names what a program runs (see ``rule_reach.names_program``)."""
        return any(names_program(source, unseen.program, unseen.command) for source in self.sources)


@lru_cache(maxsize=256)
def _matcher(rules: tuple[str, ...], tool: str) -> _Matcher:
    parsed = [rule for rule in map(parse_rule, rules) if rule.names(tool)]
    return _Matcher(
        every=any(rule.pattern is None for rule in parsed),
        patterns=tuple(_compile(rule.pattern) for rule in parsed if rule.pattern is not None),
        sources=tuple(rule.pattern for rule in parsed if rule.pattern is not None),
    )


# Tools whose target is a shell command line.
COMMAND_TOOLS = frozenset({"bash"})
# The reasons a line whose only opaque words are plain variables is not transparent.
_VARIABLE_REASONS = frozenset(
    {"not a literal command", "simple_expansion", "expansion", "variable_name", "special_variable_name"}
)


def _variables_after_prefix(reading: ShellLine, rules: tuple[str, ...], tool: str) -> bool:
    """Whether the allow rules allow every command, a ``:*`` rule those with variables after its words.

    ``bash(echo:*)`` allows ``echo`` then any words, so ``echo "$HOME"`` too: a
    variable's value is words, and the rule takes any. Only plain variables (no
    ``${x:=y}``, ``${x@P}``, arithmetic or substitution, which act or run code),
    only after a command's literal words, and only under a rule ending in ``:*``.
    """
    if not reading.readable or not set(reading.reasons) <= _VARIABLE_REASONS:
        return False
    every_rule = _matcher(rules, tool)
    prefix_rules = _matcher(tuple(rule for rule in rules if rule.rstrip().endswith(":*)")), tool)
    for command in reading.commands:
        words, literal, variable = command.words, command.literal, command.variables
        at = next((i for i, v in enumerate(variable) if v), len(words))
        # the words before are literal; those after, literal or plain variables
        if at == 0 or not all(literal[i] or variable[i] for i in range(len(words))):
            return False
        if any(variable[i] for i in range(at)) or not all(literal[:at]):
            return False
        matcher = every_rule if at == len(words) else prefix_rules
        if not matcher.matches(" ".join(words[:at])):
            return False
    return True


class PermissionPolicy(Sparse):
    """Rules in force for a run. Part of the capability binding's digest."""

    allow: tuple[str, ...] = ()
    deny: tuple[str, ...] = ()
    ask: tuple[str, ...] = ()
    default: Decision = "deny"
    # A subagent's rules hold its parent's here (``durable_agent.core.subagents.child_policy``):
    # each call is decided by these too, and the strictest decision stands, so a child never
    # does what its parent may not. Left out of the JSON when empty: other rules keep their bytes.
    within: tuple[PermissionPolicy, ...] = ()

    left_out_at_default = ("within",)

    @field_validator("allow", "deny", "ask")
    @classmethod
    def _valid_rules(cls, rules: tuple[str, ...]) -> tuple[str, ...]:
        for rule in rules:
            parse_rule(rule)
        return rules

    def decide(self, tool: str, target: str | None, *, era: Era = "programs") -> Decision:
        """The decision for one call of ``tool`` touching ``target``.

        Args:
            tool: the tool's name.
            target: what the call touches (a path, a pattern, a shell line), if anything.
            era: decide a shell line as the rules did before lines that hide what they
                run failed closed (``legacy``), or before what programs run did
                (``unseen``; see the module docstring); only for replaying runs that
                decided so (``workflows.shell_gate``).

        Returns:
            ``allow``, ``deny`` or ``ask``.
        """
        own = self._decide_own(tool, target, era=era)
        if not self.within:
            return own
        return strictest([own, *(rules.decide(tool, target, era=era) for rules in self.within)])

    def _decide_own(self, tool: str, target: str | None, *, era: Era) -> Decision:
        """``decide`` by these rules alone (not those ``within``)."""
        if tool.lower() in COMMAND_TOOLS and target is not None:
            return self._decide_line(tool, target, judge(target), era=era)
        if tool.lower() in DOMAIN_TOOLS:
            return self._decide_domain(tool, target)
        for decision, rules in (("deny", self.deny), ("allow", self.allow), ("ask", self.ask)):
            if any(parse_rule(r).matches(tool, target) for r in rules):
                return decision  # type: ignore[return-value]
        return self.default

    def decide_eras(self, tool: str, target: str | None) -> tuple[Decision, Decision, Decision]:
        """``decide`` in every era, judging a shell line once.

        Returns:
            Today's decision, the ``unseen`` one and the ``legacy`` one (equal but for a
            shell line).
        """
        if tool.lower() not in COMMAND_TOOLS or target is None:
            decision = self.decide(tool, target)
            return decision, decision, decision
        reading = judge(target)
        eras = (
            self._decide_line(tool, target, reading, era="programs"),
            self._decide_line(tool, target, reading, era="unseen"),
            self._decide_line(tool, target, reading, era="legacy"),
        )
        if not self.within:
            return eras
        outer = [rules.decide_eras(tool, target) for rules in self.within]
        now, unseen, legacy = (strictest([eras[i], *(o[i] for o in outer)]) for i in range(3))
        return now, unseen, legacy

    def decide_both(self, tool: str, target: str | None) -> tuple[Decision, Decision]:
        """``decide_eras`` but today's, as runs recorded before ``shell-judge-programs`` decided
        (``workflows.call_batch`` tells from them whether a call may be asked about)."""
        _, unseen, legacy = self.decide_eras(tool, target)
        return unseen, legacy

    def _decide_line(self, tool: str, line: str, reading: ShellLine, *, era: Era) -> Decision:
        """A shell line, judged by every simple command in it (see the module docstring)."""
        name = tool.lower()
        legacy, programs = era == "legacy", era == "programs"
        deny, allow, ask = (_matcher(rules, name) for rules in (self.deny, self.allow, self.ask))
        commands = reading.commands if legacy else reading.commands + reading.fed
        commands += reading.ran if programs else ()
        # dict.fromkeys: each spelling is matched once, however often the line repeats it
        spellings = dict.fromkeys(" ".join(form) for command in commands for form in command.forms)
        if deny.matches(line) or any(deny.matches(text) for text in spellings):
            return "deny"
        plain = list(dict.fromkeys(command.text for command in reading.commands))
        # a deny rule that could match what the line hides keeps every allow rule off; what a
        # program runs, unless an allow rule names it
        unseen = reading.unseen + tuple(u for u in reading.programs if programs and not allow.names(u))
        starts = {u.start for u in unseen} if deny.patterns else set()
        if not legacy and any(deny.could_match(start) for start in starts):
            return self._ask_or_default(ask, plain, line)
        if allow.every and (reading.readable or not deny.patterns):
            return "allow"
        if reading.transparent and all(allow.matches(text) for text in plain):
            return "allow"
        if not legacy and _variables_after_prefix(reading, self.allow, name):
            return "allow"
        return self._ask_or_default(ask, plain, line)

    def _decide_domain(self, tool: str, target: str | None) -> Decision:
        """A web address's host (``domain:HOST``): deny rules as for any tool, then only the allow
        and ask rules that name the tool itself; none matching: ``deny``, whatever ``default``."""
        name = tool.lower()

        def matching(rules: tuple[str, ...], *, named: bool) -> bool:
            for rule in map(parse_rule, rules):
                if not rule.names(name) or (named and rule.tool != name):
                    continue
                if rule.pattern is None:
                    return True
                # hosts are lower case; so is a rule's host, however it was written
                if target is not None and _compile(rule.pattern.lower()).fullmatch(target) is not None:
                    return True
            return False

        if matching(self.deny, named=False):
            return "deny"
        if matching(self.allow, named=True):
            return "allow"
        if matching(self.ask, named=True):
            return "ask"
        return "deny"

    def _ask_or_default(self, ask: _Matcher, plain: list[str], line: str) -> Decision:
        if any(ask.matches(text) for text in plain or [line]):
            return "ask"
        return self.default

    def denies_outright(self, tool: str) -> bool:
        """True when no call of ``tool`` could ever run, so it is not offered at all."""
        if any(rules.denies_outright(tool) for rules in self.within):
            return True
        if any(parse_rule(r).pattern is None and parse_rule(r).names(tool) for r in self.deny):
            return True
        if tool.lower() in DOMAIN_TOOLS:
            # denied by default: offered only to a run whose allow or ask rules name it
            return not any(parse_rule(r).tool == tool.lower() for r in (*self.allow, *self.ask))
        if self.default != "deny":
            return False
        return not any(parse_rule(r).names(tool) for r in (*self.allow, *self.ask))
