"""Where tree-sitter-bash 0.25 puts a simple command's words and redirections, read as bash does.

tree-sitter hangs the words after a redirection on the redirection (``git >/dev/null
push``), and the redirections after a list on the list (``a && b >/dev/null c``); bash
gives both to the command; and where it reads a here-doc's backticks or a ``$'…'`` string
otherwise than bash, the text to read again. Used by ``shell_judge``.

Pure: no I/O.
"""

from __future__ import annotations

from tree_sitter import Node

_CHAINS = frozenset({"list", "pipeline", "negated_command"})


def plain_variable(node: Node) -> bool:
    """``$x``, ``${x}``, ``$1``, ``$@``, also in double quotes: a variable and no operator."""
    if node.type == "string":
        return node.child_count == 3 and node.children[1].is_named and plain_variable(node.children[1])
    if node.type == "simple_expansion":
        return True
    kinds = [child.type for child in node.children]
    return (
        node.type == "expansion"
        and len(kinds) == 3
        and kinds[1] in ("variable_name", "special_variable_name")
    )


def command_redirects(node: Node) -> list[Node]:
    """A command's redirections: its own, and those of a statement it ends.

    Args:
        node: a ``command`` node.

    Returns:
        The redirection nodes that apply to it, its own first.
    """
    found = [child for child in node.children if child.type.endswith("_redirect")]
    # ``a && b >/dev/null c`` parses as a list redirected: ``c`` is the last command's
    child, parent = node, node.parent
    while parent is not None and parent.type in _CHAINS and parent.named_children[-1] == child:
        child, parent = parent, parent.parent
    if parent is not None and parent.type == "redirected_statement" and parent.children[0] == child:
        found += [child for child in parent.children[1:] if child.type.endswith("_redirect")]
    return found


def command_parts(node: Node, redirects: list[Node]) -> list[tuple[Node, str | None]]:
    """A command's children but its redirections, with their roles, in source order.

    tree-sitter-bash hangs the words after a redirection on it (``git >/dev/null
    push``, ``git <<EOF push``); bash gives them to the command.
    """
    parts: list[tuple[Node, str | None]] = []
    for i, child in enumerate(node.children):
        if not child.type.endswith("_redirect"):
            parts.append((child, node.field_name_for_child(i)))
    for redirect in redirects:
        for child, role in redirect_parts(redirect)[1]:
            parts.append((child, role))
    return sorted(parts, key=lambda part: part[0].start_byte)


def redirect_parts(redirect: Node) -> tuple[int, list[tuple[Node, str | None]]]:
    """Where a redirection's own text ends, and the command's words hung on it."""
    end = redirect.end_byte
    extra: list[tuple[Node, str | None]] = []
    seen_target = False
    for i, child in enumerate(redirect.children):
        role = redirect.field_name_for_child(i)
        if role == "argument" or (role == "destination" and seen_target):
            extra.append((child, "argument"))
            end = min(end, child.start_byte)
        seen_target = seen_target or role == "destination" or child.type in (">&-", "<&-")
    return end, extra


def heredoc_again(body: Node, data: bytes) -> str | None:
    """tree-sitter-bash 0.25 leaves backticks in a here-doc as text; bash runs them.

    Returns:
        None when the body has no backtick or its delimiter is quoted; else the body as a
        double-quoted string, where backticks run alike, for the judge to read again.
    """
    if b"`" not in data[body.start_byte : body.end_byte]:
        return None
    parent = body.parent
    starts = [c for c in (parent.children if parent is not None else []) if c.type == "heredoc_start"]
    delimiter = data[starts[0].start_byte : starts[0].end_byte] if starts else b"'"
    if any(quote in delimiter for quote in (b"'", b'"', b"\\")):
        return None
    text = data[body.start_byte : body.end_byte].replace(b'"', b'\\"')
    return (b': "' + text + b'"').decode(errors="replace")


def ansi_c_again(node: Node, data: bytes) -> tuple[str, ...] | None:
    """Whether tree-sitter ended ``$'…'`` where bash does.

    tree-sitter-bash 0.25 takes ``\\'`` in ``$'\\' ; curl x #'`` for an escaped
    quote and runs the string on; bash ends it after ``\\``.

    Returns:
        None when it did; else the line as bash reads it, for the judge to read again (none
        when the string does not end).
    """
    i = node.start_byte + 2
    while i < len(data) and data[i] != ord("'"):
        i += 2 if data[i] == ord("\\") else 1
    if i + 1 == node.end_byte:
        return None
    if i >= len(data):
        return ()
    # what bash reads after the string, behind a harmless stand-in for it
    return ((data[: node.start_byte] + b"''" + data[i + 1 :]).decode(errors="replace"),)
