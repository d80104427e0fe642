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
from functools import lru_cache
from typing import Literal

from pydantic import field_validator

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


@lru_cache(maxsize=1024)
def _compile(pattern: str) -> re.Pattern[str]:
    prefix = pattern.endswith(":*")
    body = pattern[:-2] if prefix else pattern
    out: list[str] = []
    i = 0
    while i < len(body):
        c = body[i]
        if body.startswith("**/", i):
            out.append("(?:.*/)?")  # ``a/**/b`` also matches ``a/b``
            i += 3
        elif body.startswith("**", i):
            out.append(".*")
            i += 2
        elif c == "*":
            out.append("[^/]*")
            i += 1
        elif c == "?":
            out.append("[^/]")
            i += 1
        else:
            out.append(re.escape(c))
            i += 1
    if prefix:
        out.append(r"(?:[\s:].*)?")
    return re.compile("".join(out), re.DOTALL)


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
        for decision, rules in (("deny", self.deny), ("allow", self.allow), ("ask", self.ask)):
            if any(parse_rule(r).matches(tool, target) for r in rules):
                return decision  # type: ignore[return-value]
        return self.default

    def denies_outright(self, tool: str) -> bool:
        """True when no call of ``tool`` could ever run, so it is not offered at all."""
        if any(parse_rule(r).pattern is None and parse_rule(r).tool == tool.lower() for r in self.deny):
            return True
        if self.default != "deny":
            return False
        return not any(parse_rule(r).tool == tool.lower() for r in (*self.allow, *self.ask))
