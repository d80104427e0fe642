"""How bash reads the text of words, for the permission judge: a word's value after quote
removal (backslashes, single and double quotes, ``$'…'`` decoded as bash does, ASCII only)
and whether that value is exact (no expansion; for a command name no glob, tilde or brace
expansion); and the backslashes between words (backslash-newlines, escaped blanks) that
tree-sitter-bash 0.25 takes for blanks where bash does not.

Pure: no I/O.
"""

from __future__ import annotations

import re

from tree_sitter import Node

_ANSI_C = {"a": "\a", "b": "\b", "e": "\x1b", "E": "\x1b", "f": "\f", "n": "\n", "r": "\r"}
_ANSI_C |= {"t": "\t", "v": "\v", "\\": "\\", "'": "'", '"': '"', "?": "?"}
_BRACES = re.compile(r"\{[^{}]*(?:,|\.\.)[^{}]*\}")
CONTINUATION = b"\\\n"  # a backslash-newline: bash removes it, in a word or between words
_SPECIAL = re.compile(r"[\\$`'\"\s]")
_NOT_A_NAME = re.compile(r"\s")
_EXPANDS = re.compile(r"[*?\[~=]")
_GLOB = re.compile(r"[*?]|\[.+\]")  # a lone ``[`` (the ``[`` command) is no glob
_MAY_CHANGE = re.compile(rb"[\\$`'\"*?\[{\s]")


def _text(data: bytes, node: Node) -> str:
    return data[node.start_byte : node.end_byte].decode(errors="replace")


def word(node: Node, data: bytes, *, is_name: bool) -> tuple[str, bool]:
    """A word's value after quote removal, and whether that value is exact.

    A word that is not exact keeps its source text, for the deny rules.
    """
    target = node
    if node.type == "command_name":
        if node.named_child_count != 1 or node.child_count != 1:
            return _text(data, node), False
        target = node.children[0]
    pieces = _pieces(target, data)
    if pieces is None:
        return _text(data, node), False
    value = "".join(text for text, _ in pieces)
    if not is_name and "{" not in value:
        return value, True
    unquoted = "".join(text if not quoted else "q" * len(text) for text, quoted in pieces)
    if _BRACES.search(unquoted):
        return _text(data, node), False  # brace expansion rewrites the words
    if is_name and (not value or _NOT_A_NAME.search(value) or _EXPANDS.search(unquoted)):
        return value, False  # a glob, a tilde, or a name no rule should read as words
    return value, True


def decided_when_run(node: Node, data: bytes) -> bool:
    """Whether a word's value is decided only when the line runs, whatever the judge decodes.

    True for an expansion or substitution anywhere in it, a ``$'…'`` or ``$"…"`` not
    decoded exactly, brace expansion and an unquoted glob (``git pus?`` runs ``git push``
    where a file ``push`` exists). A tilde is not: it changes a path, not its last part.
    """
    target = node
    if node.type == "command_name":
        if node.named_child_count != 1 or node.child_count != 1:
            return True
        target = node.children[0]
    if target.type == "word" and not _MAY_CHANGE.search(data, target.start_byte, target.end_byte):
        return False  # the common case, without splitting the word into pieces
    pieces = _pieces(target, data)
    if pieces is None:
        return True
    unquoted = "".join(text if not quoted else "q" * len(text) for text, quoted in pieces)
    return bool(_BRACES.search(unquoted) or _GLOB.search(unquoted))


def _pieces(node: Node, data: bytes) -> list[tuple[str, bool]] | None:
    """The (text, quoted) pieces of a literal word, or None when it is not a literal."""
    text = _text(data, node)
    kind = node.type
    if kind in ("word", "number"):
        return _unquoted(text)
    if kind == "raw_string" and len(text) >= 2 and text[0] == text[-1] == "'":
        return [(text[1:-1], True)]
    if kind == "string" and len(text) >= 2 and text[0] == text[-1] == '"':
        if any(child.type not in ('"', "string_content") for child in node.children):
            return None  # an expansion inside double quotes
        return [(re.sub(r'\\([$`"\\])|\\\n', lambda m: m.group(1) or "", text[1:-1]), True)]
    if kind == "ansi_c_string" and text.startswith("$'") and text.endswith("'") and len(text) >= 3:
        decoded = _ansi_c(text[2:-1])
        return None if decoded is None else [(decoded, True)]
    if kind == "concatenation":
        pieces: list[tuple[str, bool]] = []
        end = node.start_byte
        for child in node.children:
            gap = data[end : child.start_byte]
            part = _pieces(child, data)
            if part is None or gap.replace(CONTINUATION, b""):
                return None
            pieces += part
            end = child.end_byte
        return pieces
    return None


def _unquoted(text: str) -> list[tuple[str, bool]] | None:
    """An unquoted word: a backslash quotes the next character, backslash-newline vanishes."""
    if not _SPECIAL.search(text):
        return [(text, False)]
    pieces: list[tuple[str, bool]] = []
    i = 0
    while i < len(text):
        c = text[i]
        if c == "\\" and i + 1 < len(text):
            if text[i + 1] != "\n":
                pieces.append((text[i + 1], True))
            i += 2
            continue
        if c in "$`'\"" or c.isspace():
            return None  # an expansion or a quote tree-sitter left in a word: not ours to guess
        pieces.append((c, False))
        i += 1
    return pieces


def _ansi_c(body: str) -> str | None:
    """``$'…'`` decoded as bash does, or None for what bash decodes by locale or truncates.

    Only ASCII results are decoded: ``\\u``, ``\\U``, ``\\c`` and bytes past 0x7f
    depend on the locale, and a NUL ends the string early.
    """
    out: list[str] = []
    i = 0
    while i < len(body):
        c = body[i]
        if c != "\\":
            out.append(c)
            i += 1
            continue
        escape = body[i + 1 : i + 2]
        if escape in _ANSI_C:
            out.append(_ANSI_C[escape])
            i += 2
            continue
        match = re.match(r"[0-7]{1,3}", body[i + 1 : i + 4]) or (
            re.match(r"x([0-9A-Fa-f]{1,2})", body[i + 1 : i + 4])
        )
        if match is None:
            return None
        digits = match.group(1) if escape == "x" else match.group(0)
        value = int(digits, 16 if escape == "x" else 8)
        if not 0 < value < 0x80:
            return None
        out.append(chr(value))
        i += 1 + match.end()
    return "".join(out)


# --- backslashes between words, which tree-sitter-bash 0.25 reads otherwise than bash -------


def gap_edits(data: bytes, start: int, end: int) -> list[tuple[int, int, bytes]]:
    """Text between two tokens, which tree-sitter took for blanks, as bash reads it."""
    rest = data[start:end].replace(CONTINUATION, b"")
    if not rest:  # only backslash-newlines: bash joins the two tokens
        return [(start, end - start, b"")] if start and end < len(data) else []
    edits = []
    i = start
    while b"\\" in rest and i < end:
        if data[i] == ord("\\"):
            if data[i + 1 : i + 2] != b"\n":
                edits.append((i, 2, b"'" + data[i + 1 : i + 2] + b"'"))
            i += 2
        else:
            i += 1
    return edits


def unescaped_newlines(data: bytes, start: int, end: int) -> list[int]:
    """Offsets just after each newline in ``data[start:end]`` that no backslash escapes."""
    found = []
    i = start
    while i < end:
        if data[i] == ord("\\"):
            i += 2
            continue
        if data[i] == ord("\n"):
            found.append(i + 1)
        i += 1
    return found
