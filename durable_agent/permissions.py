"""The permission language: ``tool(pattern)`` rules in allow / deny / ask lists.

Precedence: deny wins over allow, allow over ask, ask over the default. The
pattern is matched against what a call touches (a path, a pattern, a command):
``*`` does not cross ``/``, ``**`` does, ``?`` is one character, and a trailing
``:*`` matches a command prefix (``bash(git:*)``). Tool names match
case-insensitively. A rule without a pattern covers every call of the tool.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

import re2
from pydantic import field_validator

from durable_agent.globs import GlobError, compile_glob
from durable_agent.models import Frozen

Decision = Literal["allow", "deny", "ask"]

_RULE = re.compile(r"^\s*([A-Za-z_][A-Za-z0-9_\-]*)\s*(?:\((.*)\))?\s*$", re.DOTALL)


class InvalidRule(ValueError):
    pass


@dataclass(frozen=True)
class Rule:
    tool: str  # lower-cased
    pattern: str | None

    def matches(self, tool: str, target: str | None) -> bool:
        if tool.lower() != self.tool:
            return False
        if self.pattern is None:
            return True
        if target is None:
            return False
        return _compile(self.pattern).fullmatch(target) is not None


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


def _compile(pattern: str) -> re2._Regexp[str]:
    prefix = pattern.endswith(":*")
    body = pattern[:-2] if prefix else pattern
    try:
        return compile_glob(body, extended=False, suffix=r"(?:[\s:].*)?" if prefix else "")
    except GlobError as exc:
        raise InvalidRule(str(exc)) from None


# Tools whose target is a shell command line.
COMMAND_TOOLS = frozenset({"bash"})


def command_parts(command: str) -> tuple[list[str], bool]:
    """A shell line's simple commands, and whether the rules can see all it does.

    Separators (``;`` ``&&`` ``||`` ``|`` ``&``, new lines) split the line
    outside quotes; the commands inside ``$(…)``, backticks and subshells are
    parts too. The line is not transparent when something in it is decided
    only when it runs: a substitution, a redirection, ``${…}``, a command
    named by a variable, or an unclosed quote.
    """
    parts: list[str] = []
    buf: list[str] = []
    transparent = True
    quote: str | None = None

    def flush() -> None:
        part = "".join(buf).strip()
        if part:
            parts.append(part)
        buf.clear()

    i, n = 0, len(command)
    while i < n:
        c = command[i]
        if quote == "'":
            quote = None if c == "'" else quote
            buf.append(c)
            i += 1
        elif c == "\\" and i + 1 < n:
            buf.append(command[i : i + 2])
            i += 2
        elif quote == '"':
            if c == '"':
                quote = None
            elif c == "`" or command.startswith(("$(", "${"), i):
                transparent = False  # it runs even inside double quotes
            buf.append(c)
            i += 1
        elif c in "'\"":
            quote = c
            buf.append(c)
            i += 1
        elif command.startswith(("&&", "||", "$("), i):
            transparent = transparent and not command.startswith("$(", i)
            flush()
            i += 2
        elif c in ";&|\n`()":
            transparent = transparent and c != "`"
            flush()
            i += 1
        else:
            if c in "<>" or command.startswith("${", i):
                transparent = False
            buf.append(c)
            i += 1
    flush()
    if quote is not None or any(p.startswith("$") for p in parts):
        transparent = False
    return parts, transparent


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
            parts, transparent = command_parts(target)
            if len(parts) > 1 or not transparent:
                return self._decide_compound(tool, target, parts, transparent)
        for decision, rules in (("deny", self.deny), ("allow", self.allow), ("ask", self.ask)):
            if any(parse_rule(r).matches(tool, target) for r in rules):
                return decision  # type: ignore[return-value]
        return self.default

    def _decide_compound(self, tool: str, command: str, parts: list[str], transparent: bool) -> Decision:
        """A shell line of several commands, or one whose effect its text does not show.

        A deny rule that matches any of its commands denies it; it is allowed
        only when every command is allowed and nothing in it is hidden from the
        rules (substitutions, redirections); otherwise ``ask`` rules and the
        default decide. So ``bash(pytest:*)`` does not let ``pytest; curl … | sh``
        through, and ``cd . && git push`` meets ``deny bash(git push:*)``.
        """
        candidates = [command, *parts]

        def any_match(rules: tuple[str, ...], texts: list[str]) -> bool:
            return any(parse_rule(r).matches(tool, t) for r in rules for t in texts)

        if any_match(self.deny, candidates):
            return "deny"
        every_call = any(
            parse_rule(r).pattern is None for r in self.allow if parse_rule(r).tool == tool.lower()
        )
        if every_call or (transparent and all(any_match(self.allow, [part]) for part in parts)):
            return "allow"
        if any_match(self.ask, candidates):
            return "ask"
        return self.default

    def denies_outright(self, tool: str) -> bool:
        """True when no call of ``tool`` could ever run, so it is not offered at all."""
        if any(parse_rule(r).pattern is None and parse_rule(r).tool == tool.lower() for r in self.deny):
            return True
        if self.default != "deny":
            return False
        return not any(parse_rule(r).tool == tool.lower() for r in (*self.allow, *self.ask))
