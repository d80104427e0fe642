"""The permission language: ``tool(pattern)`` rules in allow / deny / ask lists.

Precedence: deny wins over allow, allow over ask, ask over the default. The
pattern is matched against what a call touches (a path, a pattern, a command):
``*`` does not cross ``/``, ``**`` does, ``?`` is one character, and a trailing
``:*`` matches a command prefix (``bash(git:*)``). Tool names match
case-insensitively, and ``*`` in a tool name matches any run of characters
(``mcp__github__*`` is every tool of the MCP server ``github``). A rule without
a pattern covers every call of the tools it names.

A ``bash`` line is parsed (``durable_agent.core.shell_judge``) into its simple
commands, wherever they are: in lists and pipelines, subshells, ``$(…)``,
backticks, process substitutions, function bodies, control structures, after a
comment's newline, inside ``bash -c '…'`` and ``eval``. Each command is its
words after quote removal, joined by single spaces (``'git'  "status"`` is
``git status``).

- A deny rule denies the line when it matches the line's text or any spelling
  of any command in it: the words as written; a path's last part
  (``/usr/bin/git push`` is ``git push``); what a wrapper runs (``command``,
  ``builtin``, ``exec``, ``env``, ``nohup``, ``time``, ``nice``, ``sudo``,
  ``timeout``, ``xargs``, ``watch`` … : every later suffix of its words, so
  ``env -i A=b git push`` and ``sudo -u root git push`` are ``git push``);
  ``find -exec``'s command; git without its global options (``git -C . -c x=y
  --no-pager push`` is ``git push``); the words as if every expansion were
  empty (``$x git push``, ``git push$x``).
- An allow rule allows the line only when the line is *transparent* (nothing
  in it is decided when it runs, see ``shell_judge``) and it matches the plain
  words of every command. Spellings never allow: ``bash(pytest:*)`` allows
  ``pytest -q`` but not ``env pytest`` nor ``/usr/bin/pytest``.
- Otherwise an ask rule that matches a command's plain words asks, and the
  default decides what is left: opaque lines (a comment, ``$VAR``, ``$(…)``, a
  redirection to a file, ``A=b cmd``, ``if``/``for``, …) never reach allow.
- A rule without a pattern (``bash``) allows every line, except one the judge
  could not read (it does not parse, is longer than 64 KiB, is nested too
  deeply, or tree-sitter reads it otherwise than bash) while a deny rule with a
  pattern is in force: then ask and the default decide, since the deny rule
  might have matched what went unseen.

What a rule cannot promise: it judges the text of a line, not its effects.
``bash(pytest:*)`` allows ``pytest -p plugin`` and ``pytest --rootdir …``,
which import code from the workspace, and ``pytest`` itself runs the
workspace's ``conftest.py``; ``bash(git status)`` runs no hooks, but a
repository's config can name commands (``core.fsmonitor``, ``core.pager``)
and git aliases are not expanded, so ``deny bash(git push:*)`` does not see
``git -c alias.p=push p``. Globs in arguments are left to bash
(``rm *`` can expand to ``-rf``); deny rules see spellings, not option orders
(``rm -fr`` is not ``rm -rf``); a program may run another (``make``,
``npm run``, a script). Rules decide what runs without a person; the sandbox
is the boundary.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache
from typing import Literal

import re2
from pydantic import field_validator

from durable_agent.core.globs import GlobError, compile_glob
from durable_agent.core.models import Frozen
from durable_agent.core.shell_judge import judge

Decision = Literal["allow", "deny", "ask"]

_RULE = re.compile(r"^\s*([A-Za-z_*][A-Za-z0-9_\-*]*)\s*(?:\((.*)\))?\s*$", re.DOTALL)


class InvalidRule(ValueError):
    pass


@dataclass(frozen=True)
class Rule:
    tool: str  # lower-cased; ``*`` matches any run of characters
    pattern: str | None

    def names(self, tool: str) -> bool:
        """Whether the rule is about ``tool`` (its name, or a name its ``*`` covers)."""
        name = tool.lower()
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

    def matches(self, text: str) -> bool:
        return self.every or any(p.fullmatch(text) is not None for p in self.patterns)


@lru_cache(maxsize=256)
def _matcher(rules: tuple[str, ...], tool: str) -> _Matcher:
    parsed = [rule for rule in map(parse_rule, rules) if rule.names(tool)]
    return _Matcher(
        every=any(rule.pattern is None for rule in parsed),
        patterns=tuple(_compile(rule.pattern) for rule in parsed if rule.pattern is not None),
    )


# Tools whose target is a shell command line.
COMMAND_TOOLS = frozenset({"bash"})


class PermissionPolicy(Frozen):
    """Rules in force for a run. Part of the capability binding's digest."""

    allow: tuple[str, ...] = ()
    deny: tuple[str, ...] = ()
    ask: tuple[str, ...] = ()
    default: Decision = "deny"

    @field_validator("allow", "deny", "ask")
    @classmethod
    def _valid_rules(cls, rules: tuple[str, ...]) -> tuple[str, ...]:
        for rule in rules:
            parse_rule(rule)
        return rules

    def decide(self, tool: str, target: str | None) -> Decision:
        """The decision for one call of ``tool`` touching ``target``."""
        if tool.lower() in COMMAND_TOOLS and target is not None:
            return self._decide_line(tool, target)
        for decision, rules in (("deny", self.deny), ("allow", self.allow), ("ask", self.ask)):
            if any(parse_rule(r).matches(tool, target) for r in rules):
                return decision  # type: ignore[return-value]
        return self.default

    def _decide_line(self, tool: str, line: str) -> Decision:
        """A shell line, judged by every simple command in it (see the module docstring)."""
        reading = judge(line)
        name = tool.lower()
        deny, allow, ask = (_matcher(rules, name) for rules in (self.deny, self.allow, self.ask))
        # dict.fromkeys: each spelling is matched once, however often the line repeats it
        spellings = dict.fromkeys(" ".join(form) for command in reading.commands for form in command.forms)
        if deny.matches(line) or any(deny.matches(text) for text in spellings):
            return "deny"
        if allow.every and (reading.readable or not deny.patterns):
            return "allow"
        plain = list(dict.fromkeys(command.text for command in reading.commands))
        if reading.transparent and all(allow.matches(text) for text in plain):
            return "allow"
        if any(ask.matches(text) for text in plain or [line]):
            return "ask"
        return self.default

    def denies_outright(self, tool: str) -> bool:
        """True when no call of ``tool`` could ever run, so it is not offered at all."""
        if any(parse_rule(r).pattern is None and parse_rule(r).names(tool) for r in self.deny):
            return True
        if self.default != "deny":
            return False
        return not any(parse_rule(r).names(tool) for r in (*self.allow, *self.ask))
