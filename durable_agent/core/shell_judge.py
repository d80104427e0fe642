"""What a bash line runs, read from a real parse tree, for the permission rules.

The line is parsed by tree-sitter-bash, not split by hand: a hand-written
splitter does not know comments, ``$'…'`` strings or here-docs, and a hostile
model hides a second command behind exactly those (``pytest #'`` + newline +
``curl …``). tree-sitter-bash rather than bashlex: it is maintained, it covers
ANSI-C strings, here-docs, process substitution, arithmetic, ``case`` / ``if``
/ ``for`` and functions, and it marks what it cannot parse with ERROR and
MISSING nodes, so the judge can fail closed. bashlex, an old port of bash's
parser, raises on ``[[ … ]]``, ``case`` and ``$((…))``, reads ``((x++))`` as
two subshells running ``x++`` and ``$'…'`` as a ``$`` then a quoted string.

``judge`` returns every simple command of the line, wherever it is (in a
pipeline, a list, a subshell, a substitution, a function body, a control
structure, after a comment), as literal words after bash's quote removal, and
says whether the line is *transparent*: whether those words are all it runs.
Opaque, so never allowed by a pattern: comments; expansions (``$x``, ``${…}``,
``$((…))``), substitutions (``$(…)``, backticks, ``<(…)``); here-docs and
here-strings; redirections but descriptor copies and ``/dev/null``;
assignments (``A=b cmd``, ``export``, ``read``, ``printf -v``, …); functions,
control structures, ``[[ … ]]``, ``((…))``; ``eval``, ``source``, ``exec``,
``alias``, ``trap``, ``coproc`` and the like; ``sh -c`` strings; a glob, brace
or tilde in a command name and brace expansion anywhere; ``$'…'`` that does not
decode to plain ASCII, ``$"…"``; control characters and unusual blanks.

``unseen`` are the places where the line runs what no reading can show (a
shell's script on stdin or in a file, a command word built when it runs, …;
see ``shell_unseen``) and ``fed`` the commands of literal scripts the line
feeds a shell on stdin, ``trap`` or ``script -c``, read for the deny rules.
Both are apart from the rest, which reads as it did before them, for replays;
and so are ``programs`` and ``ran``, the same for what programs run (an
interpreter's code, awk's ``system()``, sed's ``e``, a git alias, a pager in
``git -c`` or ``GIT_PAGER``, a runner's command, a script run by its path; see
``shell_programs`` and ``shell_runners``), read since them.

``readable`` is false when the judge may not have seen every command (the line
does not parse, is too long or too deep), so that not even a rule without a
pattern allows it while a deny rule could have matched. Where tree-sitter-bash
0.25 reads otherwise than bash (``$'\\'``, a newline before a backslash, a
backslash before a blank, words after a redirection, backticks nested or in a
here-doc), the judge notices, and reads the line again as bash would so that
deny rules still see the commands.

Pure: no I/O, and the grammar is pinned, so a workflow replay decides alike.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass, field

import tree_sitter_bash
from tree_sitter import Language, Node, Parser

from durable_agent.core import shell_programs
from durable_agent.core.shell_commands import (
    EXPANSION,
    MAX_VOLUME,
    OPAQUE_NAMES,
    SHELLS,
    assigns,
    command_forms,
    shell_script,
)
from durable_agent.core.shell_tree import (
    ansi_c_again,
    command_parts,
    command_redirects,
    heredoc_again,
    plain_variable,
    redirect_parts,
)
from durable_agent.core.shell_unseen import OTHER_SHELLS, Unseen, in_command, in_node, stdin_script
from durable_agent.core.shell_words import CONTINUATION, decided_when_run, gap_edits, unescaped_newlines, word

# A Language is immutable and shared; a Parser is not thread-safe but costs
# under a microsecond to make, so each call makes its own (workflows run on threads).
_LANGUAGE = Language(tree_sitter_bash.language())

MAX_CHARS = 65_536  # longer lines are not parsed at all
MAX_DEPTH = 2_000  # parse-tree depth (a chain of `&&` nests too); deeper is not walked
MAX_NESTING = 3  # ``bash -c`` / ``eval`` strings parsed inside one another

# Node types whose meaning is exactly "run these simple commands in order".
_PLAIN = frozenset(
    {
        "program", "list", "pipeline", "subshell", "compound_statement", "negated_command",
        "redirected_statement", "command", "command_name", "word", "number", "string",
        "string_content", "raw_string", "ansi_c_string", "concatenation", "file_redirect",
        "file_descriptor",
    }
)  # fmt: skip
_ALL_SHELLS = SHELLS | OTHER_SHELLS
# Redirections that touch no file: descriptor copies and /dev/null.
_HARMLESS_REDIRECT = re.compile(r"\d*[<>]&(?:\d+|-)|(?:\d*>>?|&>>?|\d*<)\s*/dev/null")
# bash separates words only at spaces, tabs and newlines; tree-sitter also at
# CR and others, so a line with another blank or a control character is unread.
_ODD_CHARACTER = re.compile(
    r"[\x00-\x08\x0b-\x1f\x7f\x85\xa0\u1680\u2000-\u200b\u2028\u2029\u202f\u205f\u3000\ufeff]"
)


@dataclass(frozen=True)
class SimpleCommand:
    """One simple command: its words after quote removal, and the spellings a deny rule sees.

    ``exact`` is false when a word is not a literal (an expansion, an
    undecodable ``$'…'``) or the name is not a plain name; such a word keeps
    its source text, so a deny rule still sees ``git push "$b"``.
    """

    words: tuple[str, ...]
    exact: bool
    forms: tuple[tuple[str, ...], ...]
    # per word: read exactly (a literal), and one plain variable (``$x``, ``"${x}"``, ``"$@"``)
    literal: tuple[bool, ...] = ()
    variables: tuple[bool, ...] = ()

    @property
    def text(self) -> str:
        """The command as allow and ask rules see it: its words joined by single spaces."""
        return " ".join(self.words)


@dataclass(frozen=True)
class ShellLine:
    """The judge's reading of a line; ``reasons`` say why it is not transparent.

    ``unseen`` and ``fed`` (see the module docstring) are kept apart from the rest,
    which reads as it did before them, so that a replay can decide as it did.
    """

    commands: tuple[SimpleCommand, ...]
    transparent: bool
    readable: bool
    reasons: tuple[str, ...]
    unseen: tuple[Unseen, ...] = ()
    fed: tuple[SimpleCommand, ...] = ()
    programs: tuple[Unseen, ...] = ()
    ran: tuple[SimpleCommand, ...] = ()


@dataclass
class _Reading:
    commands: list[SimpleCommand] = field(default_factory=list)
    reasons: list[str] = field(default_factory=list)
    readable: bool = True
    nested: list[tuple[str, int]] = field(default_factory=list)
    # offsets in the source being read where bash ends a command and tree-sitter does not
    breaks: list[int] = field(default_factory=list)
    volume: int = 0  # see MAX_VOLUME
    unseen: list[Unseen] = field(default_factory=list)
    fed: list[tuple[str, int]] = field(default_factory=list)
    programs: list[Unseen] = field(default_factory=list)
    ran: list[tuple[str, int]] = field(default_factory=list)

    def opaque(self, reason: str) -> None:
        if reason not in self.reasons:
            self.reasons.append(reason)

    def unreadable(self, reason: str) -> None:
        self.readable = False
        self.opaque(reason)


def judge(line: str) -> ShellLine:
    """Read ``line`` as ``bash -c`` would; never raises, whatever the input."""
    reading = _Reading()
    reading.nested.append((line, 0))
    _read_nested(reading)
    commands = tuple(reading.commands)
    if not commands:
        reading.opaque("no command")
    # Scripts fed to a shell are read apart, so that what the line itself runs reads as before;
    # scripts programs run (``shell_programs``) apart from both, for the same reason.
    fed, later = _read_apart(reading.fed, programs_too=False)
    ran, _ = _read_apart(reading.ran + later, programs_too=True)
    unseen = reading.unseen + fed.unseen
    if not fed.readable:
        unseen.append(Unseen("", "a script fed to a shell could not be read: " + ", ".join(fed.reasons)))
    programs = reading.programs + fed.programs + ran.unseen + ran.programs
    if not ran.readable:
        programs.append(Unseen("", "a script a program runs could not be read: " + ", ".join(ran.reasons)))
    return ShellLine(
        commands,
        not reading.reasons,
        reading.readable,
        tuple(reading.reasons),
        tuple(dict.fromkeys(unseen)),
        tuple(fed.commands),
        tuple(dict.fromkeys(programs)),
        tuple(ran.commands),
    )


def _read_apart(
    pending: list[tuple[str, int]], *, programs_too: bool
) -> tuple[_Reading, list[tuple[str, int]]]:
    """Scripts read apart from the line, and the scripts they feed a shell in turn; with
    ``programs_too``, the scripts programs run in them too, else those are returned."""
    apart, later = _Reading(), []
    while pending:
        apart.nested, apart.fed, apart.ran = pending, [], []
        _read_nested(apart)
        pending = apart.fed + apart.ran if programs_too else apart.fed
        later += [] if programs_too else apart.ran
    return apart, later


def _read_nested(reading: _Reading) -> None:
    while reading.nested:
        source, level = reading.nested.pop()
        if level > MAX_NESTING:
            reading.unreadable("shell strings nested too deeply")
        else:
            _read_source(source, level, reading)


def _read_source(source: str, level: int, reading: _Reading) -> None:
    if len(source) > MAX_CHARS:
        reading.unreadable(f"longer than {MAX_CHARS} characters")
        return
    try:
        data = source.encode()
    except UnicodeEncodeError:
        reading.unreadable("not valid text")
        return
    if _ODD_CHARACTER.search(source):
        reading.unreadable("control character or unusual blank")
    root = Parser(_LANGUAGE).parse(data).root_node
    if root.has_error:
        reading.unreadable("does not parse")
    if level:
        reading.opaque("runs a shell string")
    # tree-sitter skips a backslash-newline, and a backslash before a blank, as
    # if they were blanks; bash joins the words around the first and keeps the
    # blank of the second (``\<space>``, ``\<CR>`` before a newline) in a word.
    escapes = b"\\" in data
    checked = root.has_error  # without an error anywhere, no node is ERROR or MISSING
    last_end = 0
    reading.breaks = []
    edits: list[tuple[int, int, bytes]] = []  # (offset, length, replacement) to read as bash does
    for node in _walk(root, reading):
        if checked and (node.is_error or node.is_missing):
            reading.unreadable("does not parse")
        _check_node(node, data, level, reading)
        if node.type == "word" and b"\n" in data[node.start_byte : node.end_byte]:
            reading.breaks += unescaped_newlines(data, node.start_byte, node.end_byte)
        if escapes and node.child_count == 0:
            if node.start_byte > last_end:
                edits += gap_edits(data, last_end, node.start_byte)
            last_end = max(last_end, node.end_byte)
    if escapes and last_end < len(data):
        edits += gap_edits(data, last_end, len(data))
    edits += [(b - 1, 1, b"\n ") for b in reading.breaks]
    if edits:
        # Read the line again as bash reads it, in tokens tree-sitter reads alike:
        # words joined, a blank after a newline that ends a command, a quoted
        # blank for an escaped one.
        reading.unreadable("does not parse")
        parts, pos = [], 0
        for at, length, text in sorted(edits):
            if at >= pos:
                parts += [data[pos:at], text]
                pos = at + length
        fixed = b"".join([*parts, data[pos:]])
        reading.nested.append((fixed.decode(errors="replace"), level + 1))


def _walk(root: Node, reading: _Reading) -> Iterator[Node]:
    """Every node, in source order, without recursion; below ``MAX_DEPTH`` the line is unreadable."""
    cursor = root.walk()
    depth = 0
    while True:
        node = cursor.node
        assert node is not None
        yield node
        if depth < MAX_DEPTH and cursor.goto_first_child():
            depth += 1
            continue
        if depth >= MAX_DEPTH and node.child_count:
            reading.unreadable("nested too deeply")
        while not cursor.goto_next_sibling():
            if not cursor.goto_parent():
                return
            depth -= 1


def _check_node(node: Node, data: bytes, level: int, reading: _Reading) -> None:
    """What one node adds to the reading: a command, or a reason the line is opaque."""
    kind = node.type
    if kind not in _PLAIN and node.is_named:
        reading.opaque(kind)
        if (unseen := in_node(node, data)) is not None:
            reading.unseen.append(unseen)
        if kind == "variable_assignment":
            unseen_too, ran = shell_programs.in_assignment(node, data)
            reading.programs += unseen_too
            reading.ran += [(script, level + 1) for script in ran]
    if kind == "command":
        heredoc = any(child.type == "heredoc_redirect" for child in node.children)
        redirects = command_redirects(node)
        _read_command(command_parts(node, redirects), heredoc, redirects, data, level, reading)
    elif kind == "redirected_statement" and node.children[0].type.endswith("_redirect"):
        # ``>x 2>&1 git push``: tree-sitter hangs the whole command on the redirections
        parts = [part for child in node.children for part in redirect_parts(child)[1]]
        if parts:
            redirects = [child for child in node.children if child.type.endswith("_redirect")]
            _read_command([(parts[0][0], "name"), *parts[1:]], True, redirects, data, level, reading)
    elif kind == "file_redirect":
        if (
            node.start_byte
            and chr(data[node.start_byte - 1]).isdigit()
            and node.children[0].is_named is False
        ):
            # ``pb\<newline> 2>&1``: bash reads ``2`` as the descriptor, tree-sitter as a word
            reading.unreadable("does not parse")
        end = redirect_parts(node)[0]
        if not _HARMLESS_REDIRECT.fullmatch(data[node.start_byte : end].decode(errors="replace").rstrip()):
            reading.opaque("redirection")
    elif kind == "compound_statement" and node.children[0].type == "((":
        reading.opaque("arithmetic")
    elif kind == "compound_statement" and not data[node.start_byte + 1 : node.start_byte + 2].isspace():
        reading.unreadable("does not parse")  # a ``{`` group: bash reads ``{pa;}`` as a command ``{pa``
    elif kind == "ansi_c_string" and (again := ansi_c_again(node, data)) is not None:
        reading.unreadable("does not parse")
        reading.nested += [(text, level + 1) for text in again]
    elif kind == "heredoc_body" and (body := heredoc_again(node, data)) is not None:
        reading.unreadable("does not parse")
        reading.nested.append((body, level + 1))
    elif kind == "command_substitution" and node.children[0].type == "`":
        # bash unescapes \` \\ \$ in backticks and parses the rest again
        inner = data[node.children[0].end_byte : node.children[-1].start_byte]
        if b"\\" in inner:
            reading.nested.append((re.sub(rb"\\([\\`$])", rb"\1", inner).decode(errors="replace"), level + 1))


def _read_command(
    parts: list[tuple[Node, str | None]],
    heredoc: bool,
    redirects: list[Node],
    data: bytes,
    level: int,
    reading: _Reading,
) -> None:
    """One simple command from its parts (words with their roles, in source order)."""
    words: list[str] = []
    decided: list[bool] = []  # per word: its value is decided when the line runs
    literals: list[bool] = []
    variables: list[bool] = []
    exact = name_literal = True
    last_end: int | None = None
    for child, role in parts:
        gap = b"" if last_end is None else data[last_end : child.start_byte]
        last_end = child.end_byte
        if b"\n" in gap and not heredoc:
            # tree-sitter-bash 0.25 runs a command on past a newline followed by
            # a backslash-newline; bash ends it there
            reading.breaks += unescaped_newlines(data, child.start_byte - len(gap), child.start_byte)
        if role not in ("name", "argument"):
            exact = False  # ``A=b cmd`` and anything unexpected
            continue
        text, literal = word(child, data, is_name=role == "name")
        exact = exact and literal
        name_literal = literal if not words else name_literal
        if words and not gap.replace(CONTINUATION, b""):
            words[-1] += text  # bash reads ``pu\<newline>sh`` (and ``a"b"``) as one word
            decided[-1] = decided[-1] or decided_when_run(child, data)
            literals[-1] = literals[-1] and literal
            variables[-1] = False
            exact = False
        else:
            words.append(text)
            decided.append(decided_when_run(child, data))
            literals.append(literal)
            variables.append(plain_variable(child))
    if not words:
        return
    reading.volume += sum(map(len, words))
    if reading.volume > MAX_VOLUME:
        reading.unreadable("too much to read")
        return
    forms, complete = command_forms(tuple(words), dynamic_name=not name_literal)
    if not exact:  # and as if every expansion were empty: ``git push$x`` is ``git push``
        bare = tuple(word for word in (EXPANSION.sub("", word) for word in words) if word)
        more, complete_too = command_forms(bare, dynamic_name=not name_literal) if bare else ((), True)
        forms, complete = tuple(dict.fromkeys(forms + more)), complete and complete_too
    if not complete:
        reading.unreadable("too many spellings to check")
    if not exact:
        reading.opaque("not a literal command")
    for form in forms:
        if form[0] in OPAQUE_NAMES or assigns(form):
            reading.opaque(form[0])
            if form[0] == "eval":
                reading.nested.append((" ".join(form[1:]), level + 1))
        if form[0] in SHELLS and (script := shell_script(form)) is not None:
            reading.nested.append((script, level + 1))
    reading.commands.append(SimpleCommand(tuple(words), exact, forms, tuple(literals), tuple(variables)))
    dynamic = frozenset(w for w, d in zip(words, decided, strict=True) if d) if any(decided) else frozenset()
    stdin = stdin_script(redirects, data) if any(form[0] in _ALL_SHELLS for form in forms) else None
    unseen, fed = in_command(forms, dynamic, stdin)
    reading.unseen += unseen
    reading.fed += [(script, level + 1) for script in fed]
    unseen, ran = shell_programs.in_command(forms, dynamic)
    reading.programs += unseen
    reading.ran += [(script, level + 1) for script in ran]
