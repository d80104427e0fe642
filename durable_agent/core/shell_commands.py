"""What a simple command's words mean to the permission rules: the other spellings of the
same command a deny rule sees (a path's last part, a wrapper's command, git without its
global options, ``find -exec``'s command, an expansion in the name left out), and the
commands that run or change text the rules do not see (``eval``, ``sh -c``, ``printf -v``).
Runners (``uv run``, ``npx``…) are read since ``shell_runners``, apart, so that these
spellings stay as every era read them.

Pure: no I/O.
"""

from __future__ import annotations

import re

# Characters of command words (and of their spellings) read in all, per line: four times the
# longest line the judge parses (``shell_judge.MAX_CHARS``), since nested substitutions repeat
# their text in every enclosing word, which grows as a square.
MAX_VOLUME = 4 * 65_536
MAX_FORMS = 256
# Commands that run the rest of their words as a command (after options of
# their own, which are not parsed: every later suffix is a spelling).
WRAPPERS = frozenset(
    {
        "command", "builtin", "exec", "env", "nohup", "time", "nice", "ionice", "sudo", "doas",
        "timeout", "stdbuf", "setsid", "chrt", "taskset", "xargs", "unbuffer", "flock", "chroot",
        "strace", "ltrace", "watch", "fakeroot", "firejail", "nsenter", "unshare", "runuser",
        "systemd-run", "caffeinate", "busybox", "coproc",
    }
)  # fmt: skip
# git's options before the subcommand that take the next word as their value.
_GIT_VALUE_OPTIONS = frozenset(
    {"-C", "-c", "--git-dir", "--work-tree", "--namespace", "--config-env", "--super-prefix"}
)
# An expansion in a command name, which may stand for nothing at all.
EXPANSION = re.compile(
    r"\$(?:\{[^{}]*\}|\([^()]*\)|[A-Za-z_][A-Za-z0-9_]*|[0-9@*#?$!-]|(?=[\"']))|`[^`]*`|[\"']"
)
_QUOTES = re.compile(r"[\"']")
_FIND_EXEC = frozenset({"-exec", "-execdir", "-ok", "-okdir"})


def command_forms(
    words: tuple[str, ...], *, dynamic_name: bool = False
) -> tuple[tuple[tuple[str, ...], ...], bool]:
    """``words`` first, then the other spellings of the same command, for the deny rules.

    A path names the same command as its last part (``/usr/bin/git`` is also
    ``git``); a wrapper's later words are the command it runs (``sudo -u x git
    push`` is also ``git push``), as are ``find -exec``'s; git's global options
    go (``git -C . --no-pager push`` is also ``git push``). A name that is an
    expansion may be empty or part of the name (``$x git push``, ``git$x push``).
    The flag is false when some went unseen, past ``MAX_FORMS`` spellings or
    ``MAX_VOLUME`` characters.
    """
    seen: dict[tuple[str, ...], None] = {}
    queue = [words]
    volume = 0
    while queue:
        form = queue.pop()
        if not form or form in seen:
            continue
        seen[form] = None
        volume += sum(map(len, form))
        if volume > MAX_VOLUME:
            return tuple(seen), False
        name = form[0]
        found: list[tuple[str, ...]] = []
        if "/" in name and (base := name.rsplit("/", 1)[1]):
            found.append((base, *form[1:]))
        if dynamic_name and form is words:
            # the name without its expansions, and its literal start (``git$(…)``)
            for bare in (EXPANSION.sub("", name), _QUOTES.sub("", re.split(r"[$`]", name)[0])):
                if bare and bare != name:
                    found.append((bare, *form[1:]))
        if name in WRAPPERS or (dynamic_name and form is words):
            found.extend(form[i:] for i in range(1, min(len(form), MAX_FORMS + 1)))
        elif name == "git":
            found.append(_without_git_options(form))
        elif name == "find":
            found.extend(form[i + 1 :] for i, w in enumerate(form) if w in _FIND_EXEC)
        if len(seen) + len(queue) + len(found) > MAX_FORMS:
            return tuple(seen), False
        queue.extend(reversed(found))
    return tuple(seen), True


def _without_git_options(form: tuple[str, ...]) -> tuple[str, ...]:
    i = 1
    while i < len(form) and form[i].startswith("-"):
        i += 2 if form[i] in _GIT_VALUE_OPTIONS else 1
    return ("git", *form[i:])


# --- commands whose words the rules cannot see through ---------------------

# Commands that run text the rules do not see, or change how later words are read.
OPAQUE_NAMES = frozenset(
    {
        "eval", "source", ".", "exec", "alias", "unalias", "trap", "enable", "hash", "shopt",
        "let", "fc", "bind", "coproc", "declare", "typeset", "local", "export", "readonly",
        "unset", "mapfile", "readarray", "read", "getopts",
    }
)  # fmt: skip
# ``set`` options that change nothing the rules read (``set -euo pipefail``).
_PLAIN_SET = re.compile(r"[-+][euxvEo]+|pipefail|errexit|nounset|xtrace|verbose|errtrace")
SHELLS = frozenset({"sh", "bash", "dash", "zsh", "ksh", "mksh", "ash", "su"})


def assigns(form: tuple[str, ...]) -> bool:
    """``printf -v NAME`` and unusual ``set`` options change what later words mean."""
    if form[0] == "printf":
        return any(w.startswith("-v") for w in form[1:])
    return form[0] == "set" and not all(_PLAIN_SET.fullmatch(w) for w in form[1:])


def shell_script(form: tuple[str, ...]) -> str | None:
    """The string ``sh -c STRING`` (also ``bash -lc``, ``su -c``) runs, if any."""
    for i, word in enumerate(form[1:], 1):
        if word.startswith("-") and not word.startswith("--") and "c" in word:
            rest = [w for w in form[i + 1 :] if not w.startswith("-")]
            return rest[0] if rest else None
    return None
