"""What a bash line runs that the permission judge cannot see, so a deny rule cannot be checked.

A deny rule under a broad allow (``allow = ["bash"]``, ``deny = ["bash(git push:*)"]``) is a
blocklist: it holds only while the judge sees every command word. It does not when:

- a shell reads its script from stdin, a here-doc or here-string, a pipe or a file
  (``bash -s``, ``cat x | sh``, ``bash x.sh``, ``source /dev/stdin``): a literal here-string
  or here-doc is read instead (``fed``), as a ``-c`` string is;
- a word is built when the line runs (``$G push``, ``git${IFS}push``, ``$(echo git) push``,
  ``git $x``, ``git pus?``): what the judge saw is the words before it;
- text becomes code later (``eval $x``, ``trap``, ``alias``, ``hash -p``, ``xargs``' words from
  stdin, ``PS4``/``BASH_ENV``/``BASH_FUNC_*`` set, arithmetic on a variable, which runs the
  ``$(…)`` a variable holds: ``x='a[$(cmd)]'; echo $((x))``; ``${x@P}``; ``${!x}``).

Each such place is an ``Unseen``: the words the judge saw before it (empty when it saw no
command word at all). ``permissions`` denies the broad allow when a deny rule could match a
command starting with those words (``rule_reach.could_match``). The checks are syntactic and
conservative. What a program runs that its words do not show (``python -c``, ``awk``'s
``system()``, a git alias) is ``shell_programs``, kept apart for replays; neither follows data
through files (``make``, a script, a hook): the docs say allow-lists are the safe form.

Pure: no I/O.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from tree_sitter import Node

from durable_agent.core.shell_commands import SHELLS
from durable_agent.core.shell_words import word


@dataclass(frozen=True)
class Unseen:
    """A place where the judge cannot see what runs.

    ``start`` is the words it saw before that place, joined by blanks: what runs
    begins so. Empty when no command word was seen at all.
    """

    start: str
    why: str
    # Since ``shell_programs``: the words that name what runs (an interpreter and its code,
    # script or module; a git alias), for an allow rule to name, and the spelling they begin.
    # Empty when no rule may name it.
    program: tuple[str, ...] = ()
    command: tuple[str, ...] = ()


# Words of a command's spellings searched for one decided when it runs; past it, a command
# hides what it runs (a real command has a few dozen words and a handful of spellings).
MAX_SCAN = 8_192
# Shells the old judge did not read ``-c`` of (their strings are read as bash for deny rules).
OTHER_SHELLS = frozenset({"rbash", "fish", "csh", "tcsh", "yash", "posh", "pwsh", "elvish", "xonsh"})
# Commands that start an interactive shell (on stdin) when given no command of their own.
_SHELL_STARTERS = frozenset({"chroot", "unshare", "nsenter", "firejail", "fakeroot", "runuser"})
# Variables bash runs as code: the startup file of non-interactive shells, prompts
# (``PS4`` under ``set -x``), exported functions.
_CODE_VARIABLE = re.compile(
    r"BASH_ENV|ENV|PS[0-4]|PROMPT_COMMANDS?|SHELLOPTS|BASHOPTS|BASH_FUNC_.*", re.DOTALL
)
# Commands whose words set variables named ``NAME=value``.
ASSIGNERS = frozenset({"env", "export", "declare", "typeset", "local", "readonly"})
# A reference to a variable's value inside arithmetic (``$#``, ``$?``, ``$$``, ``$!`` are numbers).
_VARIABLE_REFERENCE = re.compile(r"[A-Za-z_]|\$(?![#?$!])")
_ARITHMETIC_TESTS = frozenset({"-eq", "-ne", "-lt", "-le", "-gt", "-ge"})
_SUBSTRING = re.compile(r"\$\{#?[A-Za-z_0-9@*]+(?:\[[^\]]*\])?:(?![-=?+])(.*)\}", re.DOTALL)
_INDIRECT = re.compile(r"\$\{!.*[^*@]\}", re.DOTALL)


def _text(node: Node, data: bytes) -> str:
    return data[node.start_byte : node.end_byte].decode(errors="replace")


def in_command(
    forms: tuple[tuple[str, ...], ...], dynamic: frozenset[str], stdin: str | None
) -> tuple[list[Unseen], list[str]]:
    """What one simple command hides, and the scripts it feeds to a shell (to read for deny rules).

    Args:
        forms: the command's spellings (``shell_commands.command_forms``), words first.
        dynamic: the words whose value is decided when the line runs (expansions,
            substitutions, globs, brace expansion), by their text in ``forms``.
        stdin: the literal script on the command's own stdin (a here-string or
            here-doc), or None when its stdin is not a literal the judge read.

    Returns:
        The unseen places, and the literal scripts a shell, ``trap`` or ``script -c`` runs.
    """
    unseen: list[Unseen] = []
    fed: list[str] = []
    xargs = False
    budget = MAX_SCAN
    for form in forms:
        if dynamic and not dynamic.isdisjoint(form):
            budget -= len(form)
            if budget < 0:
                unseen.append(Unseen("", f"more than {MAX_SCAN} words of spellings to look through"))
                dynamic = frozenset()
            else:
                at = next(i for i, w in enumerate(form) if w in dynamic)
                unseen.append(Unseen(" ".join(form[:at]), f"{form[at]!r} is decided when it runs"))
        name, args = form[0], form[1:]
        if name in SHELLS or name in OTHER_SHELLS:
            how, script = _shell_input(args)
            if how == "stdin" and stdin is not None:
                fed.append(stdin)
            elif how in ("stdin", "file"):
                unseen.append(Unseen("", f"{name} reads a script the judge cannot see ({how})"))
            elif how == "string" and name in OTHER_SHELLS and script is not None:
                fed.append(script)
        elif name == "xargs" and not xargs:
            # xargs adds words read from stdin to its command: every spelling has unseen words after it
            unseen += [Unseen(" ".join(f), "xargs adds words from stdin") for f in forms]
            xargs = True
        elif name in ("source", ".", "fc", "let", "alias") or (name == "hash" and "-p" in args):
            unseen.append(Unseen("", f"{name} runs text the judge cannot see"))
        elif name == "enable" and any(w.startswith("-") and "f" in w for w in args):
            unseen.append(Unseen("", "enable -f loads a builtin"))
        elif name in ("mapfile", "readarray") and any(w.startswith("-") and "C" in w for w in args):
            unseen.append(Unseen("", f"{name} -C runs a callback"))
        elif name == "eval" and any(w in dynamic for w in args):
            unseen.append(Unseen("", "eval of text decided when it runs"))
        elif name == "trap":
            action = next((w for w in args if not w.startswith("-")), None)
            if action is not None and action in dynamic:
                unseen.append(Unseen("", "trap of text decided when it runs"))
            elif action is not None and not any(w in ("-p", "-l", "-P") for w in args):
                fed.append(action)
        elif name == "script":
            script = _script_command(args)
            if script is None:
                unseen.append(Unseen("", "script starts a shell on stdin"))
            else:
                fed.append(script)
        elif name in _SHELL_STARTERS or (name in ("sudo", "doas") and _starts_shell(args)):
            unseen.append(Unseen("", f"{name} may start a shell on stdin"))
        unseen += _variables(name, args)
    return unseen, fed


def _variables(name: str, args: tuple[str, ...]) -> list[Unseen]:
    """A variable bash runs as code set by ``name``, or an array element it names (its subscript
    is arithmetic, which runs the substitutions a variable holds)."""
    names = _named_variables(name, args)
    if name in ASSIGNERS:
        names += [w.split("=", 1)[0] for w in args if "=" in w]
    for variable in names:
        base = re.split(r"\+?=|\[|%%", variable, maxsplit=1)[0]
        if _CODE_VARIABLE.fullmatch(base):
            return [Unseen("", f"{name} sets {base}, which bash runs as code")]
        if "[" in variable and _VARIABLE_REFERENCE.search(variable.split("[", 1)[1]):
            return [Unseen("", f"{name} names an array element: its subscript is arithmetic")]
    return []


def _named_variables(name: str, args: tuple[str, ...]) -> list[str]:
    """The words of ``name`` that are variable names (crudely: options are not parsed exactly)."""
    if name in ("printf", "wait", "test", "[", "read", "mapfile", "readarray"):
        flag = {"printf": "-v", "wait": "-p", "test": "-v", "[": "-v"}.get(name)
        if flag is None:  # read, mapfile: the words but options and their values (``-p PROMPT``)
            valued = {"-a", "-d", "-i", "-n", "-N", "-p", "-t", "-u", "-c", "-C", "-O", "-s"}
            return [
                w
                for i, w in enumerate(args)
                if not w.startswith("-") and (i == 0 or args[i - 1] not in valued)
            ]
        found = [args[i + 1] for i, w in enumerate(args[:-1]) if w == flag]
        return found + [w[2:] for w in args if name == "printf" and w.startswith("-v") and len(w) > 2]
    if name == "getopts":
        return list(args)
    return []


def _shell_input(args: tuple[str, ...]) -> tuple[str, str | None]:
    """Where a shell reads its script: ("string", the -c string), "stdin", "file" or "none"."""
    string = stdin = False
    i = 0
    while i < len(args):
        w = args[i]
        if w in ("--", "-"):
            i += 1
            break
        if w in ("--version", "--help"):
            return "none", None
        if w.startswith(("--rcfile", "--init-file")):
            return "file", None  # a startup file the shell runs first
        if w.startswith("--"):
            i += 1
            continue
        if len(w) > 1 and w[0] in "-+":
            string = string or (w[0] == "-" and "c" in w)
            stdin = stdin or "s" in w
            i += 2 if ("o" in w or "O" in w) else 1
            continue
        break
    rest = args[i:]
    if string:
        return "string", rest[0] if rest else None
    return ("stdin", None) if stdin or not rest else ("file", None)


def _script_command(args: tuple[str, ...]) -> str | None:
    for i, w in enumerate(args):
        if w.startswith("--command="):
            return w.split("=", 1)[1]
        if w == "--command" or (w.startswith("-") and not w.startswith("--") and "c" in w):
            return args[i + 1] if i + 1 < len(args) else None
    return None


def _starts_shell(args: tuple[str, ...]) -> bool:
    """``sudo -s`` / ``sudo -i`` (also in a cluster) start a shell."""
    return any(w.startswith("-") and not w.startswith("--") and ("s" in w or "i" in w) for w in args) or any(
        w in ("--shell", "--login") for w in args
    )


def in_node(node: Node, data: bytes) -> Unseen | None:
    """What one syntax node hides, if anything (arithmetic, prompt expansion, code variables)."""
    kind = node.type
    text = _text(node, data)
    if (
        kind == "variable_assignment"
        and node.child_count
        and _CODE_VARIABLE.fullmatch(_text(node.children[0], data))
    ):
        return Unseen("", f"sets {_text(node.children[0], data)}, which bash runs as code")
    if kind == "arithmetic_expansion":
        inner = text[3:] if text.startswith("$((") else text[2:]
        if _VARIABLE_REFERENCE.search(inner):
            return Unseen("", "arithmetic on a variable runs the substitutions its value holds")
    elif kind == "compound_statement" and node.children and node.children[0].type == "((":
        if _VARIABLE_REFERENCE.search(text):
            return Unseen("", "arithmetic on a variable runs the substitutions its value holds")
    elif kind == "c_style_for_statement":
        header = "".join(
            _text(c, data) for c in node.children if c.type not in ("for", "do_group", "compound_statement")
        )
        if _VARIABLE_REFERENCE.search(header):
            return Unseen("", "arithmetic on a variable runs the substitutions its value holds")
    elif kind == "subscript":
        index = "".join(_text(c, data) for c in node.children[1:] if c.type not in ("[", "]"))
        if index not in ("@", "*") and _VARIABLE_REFERENCE.search(index):
            return Unseen("", "an array subscript is arithmetic on a variable")
    elif kind == "expansion":
        if text.endswith("@P}") or _INDIRECT.fullmatch(text):
            return Unseen("", "prompt expansion or indirection runs a variable's value")
        substring = _SUBSTRING.fullmatch(text)
        if substring and _VARIABLE_REFERENCE.search(substring.group(1)):
            return Unseen("", "a substring offset is arithmetic on a variable")
    elif kind == "test_operator" and _in_double_brackets(node):
        return _double_bracket_test(node, text, data)
    elif kind in ("declaration_command", "unset_command"):
        return _declaration(node, data)
    return None


def _in_double_brackets(node: Node) -> bool:
    parent = node.parent
    while parent is not None and parent.type != "test_command":
        parent = parent.parent
    return parent is not None and parent.child_count > 0 and parent.children[0].type == "[["


def _double_bracket_test(node: Node, operator: str, data: bytes) -> Unseen | None:
    """``[[ $x -eq 1 ]]`` evaluates ``$x`` as arithmetic; ``[[ -v a[$i] ]]`` a subscript."""
    parent = node.parent
    operands = "".join(_text(c, data) for c in (parent.children if parent is not None else []) if c != node)
    if operator in _ARITHMETIC_TESTS and _VARIABLE_REFERENCE.search(operands):
        return Unseen("", "[[ … -eq … ]] is arithmetic on a variable")
    if operator == "-v" and "[" in operands and _VARIABLE_REFERENCE.search(operands.split("[", 1)[1]):
        return Unseen("", "[[ -v … ]] of an array element is arithmetic")
    return None


def _declaration(node: Node, data: bytes) -> Unseen | None:
    """``declare -i`` / ``-n``, quoted or computed names, and subscripts, which run arithmetic."""
    for child in node.children[1:]:
        text = _text(child, data)
        if child.type in ("variable_assignment", "variable_name"):
            continue  # code variables and subscripts are checked on their own nodes
        if child.type == "word" and text[:1] in ("-", "+"):
            if "i" in text or "n" in text:
                return Unseen("", f"{text} makes later assignments arithmetic or references")
            continue
        if child.type == "word" and "[" not in text and "$" not in text:
            continue
        return Unseen("", "a declaration names a variable the judge cannot see")
    return None


def stdin_script(redirects: list[Node], data: bytes) -> str | None:
    """The literal script on a command's own stdin: its one here-string or here-doc, if literal.

    Args:
        redirects: the command's redirections (its own and those bash gives it).
        data: the source the nodes are in.

    Returns:
        The text a shell on that stdin reads, or None when stdin is a pipe, a file,
        inherited, or a here-doc with expansions.
    """
    inputs = [r for r in _flatten(redirects) if _reads_stdin(r, data)]
    if len(inputs) != 1:
        return None
    redirect = inputs[0]
    if redirect.type == "herestring_redirect":
        words = [c for c in redirect.named_children if c.type != "file_descriptor"]
        if len(words) != 1:
            return None
        text, literal = word(words[0], data, is_name=False)
        return text + "\n" if literal else None
    if redirect.type != "heredoc_redirect":
        return None
    start = next((c for c in redirect.children if c.type == "heredoc_start"), None)
    body = next((c for c in redirect.children if c.type == "heredoc_body"), None)
    if start is None:
        return None
    text = "" if body is None else _text(body, data)
    quoted = any(q in _text(start, data) for q in "'\"\\")
    if not quoted and any(c in text for c in "$`\\"):
        return None  # expanded when it runs
    if any(c.type == "<<-" for c in redirect.children):
        text = "\n".join(line.lstrip("\t") for line in text.split("\n"))
    return text


def _flatten(redirects: list[Node]) -> list[Node]:
    """Redirections, with those tree-sitter nests inside a here-doc's (``bash <<EOF <x``)."""
    out: list[Node] = []
    for redirect in redirects:
        out.append(redirect)
        if redirect.type == "heredoc_redirect":
            out += [c for c in redirect.children if c.type.endswith("_redirect")]
    return out


def _reads_stdin(redirect: Node, data: bytes) -> bool:
    descriptor = next((c for c in redirect.children if c.type == "file_descriptor"), None)
    if descriptor is not None and _text(descriptor, data) != "0":
        return False
    if redirect.type in ("herestring_redirect", "heredoc_redirect"):
        return True
    operators = [c.type for c in redirect.children if not c.is_named]
    return any(op.startswith("<") for op in operators)
