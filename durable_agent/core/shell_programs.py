"""What a program on a bash line runs that the permission judge cannot see.

``shell_unseen`` finds where bash itself runs what the judge cannot see; this module, where a
program does (``shell_judge`` keeps the two apart, so that replays decide as they did):

- an interpreter given code inline (``python3 -c 'import os; os.system("git push")'``,
  ``perl -e``, ``ruby -e``, ``node -e``, ``deno eval``, ``bun -e``, ``php -r``, ``lua -e``,
  ``Rscript -e``, ``osascript -e``, ``julia -e``), or a script file, a module
  (``python3 -m x``) or stdin, which it runs as code the judge cannot read as commands: an
  unseen place with an empty start (the judge saw none of the words it runs), unless the
  interpreter only tells its version or help;
- ``awk`` (``gawk``, ``mawk``, ``nawk``), whose program runs commands only through
  ``system()``, a pipe (``print | "cmd"``, ``"cmd" | getline``) or gawk's ``@`` (extensions,
  indirect calls): unseen when its program has one of those or is read from a file;
- GNU ``sed``, which runs commands only through its ``e`` command and the ``e`` flag of ``s``:
  unseen when its script has one (``sed -i 's/a/b/' f`` is not) or is read from a file;
- git aliases, config, options and variables that name a command (``shell_git``).

An unseen place carries the words that name what runs (``Unseen.program``): the interpreter,
its options and its code, script or module (``python3 -m pytest``, ``python3 tools/gen.py``,
``awk -f x.awk``); all of its words when an option is not known; none for stdin.
``permissions`` lets an allow rule that names those words allow the line (``bash(python3 -m
pytest:*)``), and no rule that names only the interpreter (``bash(python3:*)``, ``bash``).

Runners that run a command given as words (``uv run``, ``npx``…) and scripts run by their path
(``./x.sh``) are ``shell_runners``'.

Not covered: programs that run the workspace's files without being given code or a script on
the line (``make``, ``pytest``, ``npm run``/``npm test``, git hooks); the docs say so.

Pure: no I/O.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from tree_sitter import Node

from durable_agent.core.shell_git import in_git, in_variable, words
from durable_agent.core.shell_runners import RUNNERS, by_path, in_path, in_runner, path_spellings
from durable_agent.core.shell_sed import sed_options, sed_runs
from durable_agent.core.shell_unseen import ASSIGNERS, Unseen
from durable_agent.core.shell_words import decided_when_run, word

_ASSIGNMENT = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)\+?=(.*)", re.DOTALL)


@dataclass(frozen=True)
class _Family:
    """How interpreters of one kind read their words: option names, by what they take."""

    code: frozenset[str]  # the value is code (``-c``, ``-e``)
    names: frozenset[str]  # the value names what runs (``-m``, ``-f``)
    valued: frozenset[str]  # the value is the rest of the word or the next one
    attached: frozenset[str]  # the value is the rest of the word, never empty (perl's ``-Ilib``)
    optional: frozenset[str]  # the value is the rest of the word, maybe empty (perl's ``-i.bak``)
    digits: frozenset[str]  # digits may follow in the word, then more letters (perl's ``-l0ne``)
    flags: frozenset[str]  # no value
    stops: frozenset[str]  # after its value, the interpreter reads no more options
    info: frozenset[str]  # alone, they run nothing: version and help
    script: bool  # the first word after the options is a script it runs

    def kind(self, option: str) -> str | None:
        for kind in ("code", "names", "valued", "attached", "optional", "digits", "flags"):
            if option in getattr(self, kind):
                return kind
        return None


def _family(
    code: str = "",
    names: str = "",
    valued: str = "",
    attached: str = "",
    optional: str = "",
    digits: str = "",
    flags: str = "",
    stops: str = "",
    info: str = "--version --help",
    script: bool = True,
) -> _Family:
    return _Family(
        code=words(code), names=words(names), valued=words(valued), attached=words(attached),
        optional=words(optional), digits=words(digits), flags=words(flags), stops=words(stops),
        info=words(info), script=script,
    )  # fmt: skip


_PYTHON = _family(
    code="-c",
    names="-m",
    valued="-W -X --check-hash-based-pycs",
    flags="-b -B -d -E -i -I -O -P -q -s -S -u -v -x -R",
    stops="-c -m",
    info="-V -VV --version -h --help --help-all --help-env --help-xoptions",
)
_PERL = _family(
    code="-e -E",
    attached="-F -I -m -M",
    optional="-C -d -D -i -x",
    digits="-0 -l",
    flags="-a -c -n -p -s -S -t -T -u -U -w -W -X",
    info="-v -V --version -h --help",
)
_RUBY = _family(
    code="-e",
    valued="-r -I -C -E --encoding --external-encoding --internal-encoding",
    attached="-F",
    optional="-x -T -W -K -i",
    digits="-0",
    flags="-a -c -d -l -n -p -s -S -w -y --verbose --disable-gems --jit --yjit",
    info="-v --version -h --help",
)
_NODE = _family(
    code="-e --eval -p --print",
    valued="-r --require --import --loader --experimental-loader -C --conditions --env-file --input-type "
    "--title",
    flags="-i --interactive -c --check --watch --inspect --inspect-brk --no-warnings --trace-warnings "
    "--enable-source-maps --expose-gc --no-deprecation --preserve-symlinks --experimental-strip-types",
    info="-v --version -h --help",
)
_PHP = _family(
    code="-r -B -R -E",
    names="-f -F",
    valued="-c -d -z -S -t",
    flags="-n -q -H -e -s -w -l -a",
    stops="-r",
    info="-v --version -h --help -m -i --ini",
)
_LUA = _family(code="-e", valued="-l", flags="-i -E -W", info="-v")
_R = _family(
    code="-e", names="-f --file", flags="--vanilla --no-save --save --slave --quiet -q --silent", script=False
)
_RSCRIPT = _family(code="-e", flags="--vanilla --no-save --verbose --slave")
_TCL = _family(code="-c", names="-f", info="")
_OSASCRIPT = _family(code="-e", valued="-l -s", flags="-i", info="")
_JULIA = _family(
    code="-e --eval -E --print",
    valued="-L --load -t --threads -p --procs --project --sysimage -J",
    flags="-q --quiet -i --banner=no --startup-file=no --history-file=no",
    info="-v --version -h --help",
)
_REPL = _family(info="-v --version -h --help")
_INTERPRETERS = (
    (re.compile(r"(?:python|pypy)(?:\d+(?:\.\d+)*)?"), _PYTHON),
    (re.compile(r"perl(?:\d+(?:\.\d+)*)?"), _PERL),
    (re.compile(r"ruby(?:\d+(?:\.\d+)*)?"), _RUBY),
    (re.compile(r"node|nodejs|ts-node|tsx"), _NODE),
    (re.compile(r"php(?:\d+(?:\.\d+)*)?(?:-cli)?"), _PHP),
    (re.compile(r"lua(?:jit|\d+(?:\.\d+)*)?"), _LUA),
    (re.compile(r"R"), _R),
    (re.compile(r"Rscript"), _RSCRIPT),
    (re.compile(r"(?:tclsh|wish)(?:\d+(?:\.\d+)*)?|expect"), _TCL),
    (re.compile(r"osascript"), _OSASCRIPT),
    (re.compile(r"julia"), _JULIA),
    (re.compile(r"irb|jshell|ghci"), _REPL),
)
# The first letters of the interpreters' names, to skip the search for most commands.
_FIRST = frozenset("pnrtlRweojig")

# deno and bun: their subcommands that run no code given on the line (``deno test`` and
# ``bun test`` run the workspace's tests, as ``pytest`` does, and are left alone with it).
_DENO_QUIET = words(
    "fmt lint check info doc test bench task compile install uninstall cache types completions coverage init "
    "publish add remove upgrade lsp outdated clean help"
)
_BUN_QUIET = words(
    "install i add a remove rm update upgrade test build pm init link unlink outdated publish patch "
    "patch-commit audit info why completions help"
)
# deno's and bun's global options, by what they take
_DENO_BUN = _family(
    code="-e --eval -p --print",
    valued="-c --config --import-map --lock --cert --location --seed --v8-flags --ext --env-file -L "
    "--log-level",
    flags="-A -q --quiet -r --reload --no-check --check --watch --allow-all --hot --smol --bun",
    script=True,
)
_AWKS = frozenset({"awk", "gawk", "mawk", "nawk", "busybox-awk"})
# awk's options: values in the next word or the rest of it, the optional ones only in the rest.
_AWK_VALUED = frozenset("FvfeEilW")
_AWK_OPTIONAL = frozenset("dDLop")
_AWK_FLAGS = frozenset("bcCghMnNOPrsStVy")
_AWK_LONG_VALUED = ("--field-separator", "--assign", "--file", "--source", "--exec", "--include", "--load")
_AWK_LONG = (*_AWK_LONG_VALUED, "--sandbox", "--version", "--help", "--posix", "--traditional", "--lint")
# ``-W`` words that run nothing (mawk's options, gawk's long ones): others (``exec``, ``source=``) may
_AWK_W = words("version v usage help dump interactive posix_space posix traditional")
# awk runs a command through these: ``system(``, ``@`` (gawk's extensions and indirect calls)...
_AWK_RUNS = re.compile(r"system|@")
# ...and a pipe (not ``||``) where something prints or reads a line
_AWK_PIPE = re.compile(r"(?<!\|)\|(?!\|)")
_AWK_PIPED = re.compile(r"print|getline")


def in_command(forms: tuple[tuple[str, ...], ...], dynamic: frozenset[str]) -> tuple[list[Unseen], list[str]]:
    """What the programs of one simple command run that the judge cannot see.

    Args:
        forms: the command's spellings (``shell_commands.command_forms``), words first.
        dynamic: the words whose value is decided when the line runs, by their text in ``forms``.

    Returns:
        The unseen places, and the literal scripts programs hand a shell (read for the rules).
    """
    unseen: list[Unseen] = in_path(forms, dynamic)
    ran: list[str] = []
    paths = path_spellings(forms) if unseen else {}
    for form in forms:
        name, before = form[0], len(unseen)
        if name in RUNNERS or name in ("nix", "nix-shell"):
            found, scripts = in_runner(form, dynamic)  # ``uv run git push`` (``shell_runners``)
            unseen += found
            ran += scripts
        elif "=" in name or name in ASSIGNERS:
            # ``sudo GIT_PAGER=x git log`` (a wrapper's words), ``env``, ``export``
            for w in form if "=" in name else form[1:]:
                if (match := _ASSIGNMENT.fullmatch(w)) is not None:
                    found, scripts = in_variable(match.group(1), None if w in dynamic else match.group(2))
                    unseen += found
                    ran += scripts
        elif name == "git":
            found, scripts = in_git(form, dynamic)
            unseen += found
            ran += scripts
        elif name in _AWKS:
            unseen += _awk(form, dynamic)
        elif name in ("sed", "gsed"):
            unseen += _sed(form, dynamic)
        elif name in ("deno", "bun"):
            unseen += _deno_or_bun(form, dynamic)
        elif name[:1] in _FIRST:
            family = next((f for pattern, f in _INTERPRETERS if pattern.fullmatch(name)), None)
            if family is not None:
                unseen += _interpreter(form, dynamic, family)
        if form in paths:
            unseen[before:] = by_path(unseen[before:], paths[form])
    return unseen, list(dict.fromkeys(ran))


def in_assignment(node: Node, data: bytes) -> tuple[list[Unseen], list[str]]:
    """A variable assignment on the line (``GIT_PAGER=x git log``, ``export PAGER=x``).

    Args:
        node: the ``variable_assignment`` node.
        data: the source it is in.

    Returns:
        The unseen places, and the scripts its value holds (``shell_git.in_variable``).
    """
    name, value = node.child_by_field_name("name"), node.child_by_field_name("value")
    if name is None or name.type != "variable_name":
        return [], []  # an array element: not a variable a program reads
    text, literal = word(value, data, is_name=False) if value is not None else ("", True)
    literal = literal and not (value is not None and decided_when_run(value, data))
    variable = data[name.start_byte : name.end_byte].decode(errors="replace")
    return in_variable(variable, text if literal else None)


def _interpreter(form: tuple[str, ...], dynamic: frozenset[str], family: _Family) -> list[Unseen]:
    args = form[1:]
    if args and all(w in family.info for w in args):
        return []
    program = _program(form, family)
    why = f"{form[0]} runs code the judge cannot see"
    return [Unseen("", why, () if any(w in dynamic for w in program) else program, form)]


def _program(form: tuple[str, ...], family: _Family, start: int = 1) -> tuple[str, ...]:
    """The words that name what an interpreter runs (see the module docstring); () for stdin."""
    i, named = start, False
    while i < len(form):
        w = form[i]
        if w == "--":
            i += 1
            break
        if w == "-" or not w.startswith("-"):
            break
        kind, takes_next = _option(w, family)
        if kind is None:
            return form  # an option not known: only the whole command names what runs
        i += 2 if takes_next else 1
        if kind in ("code", "names"):
            named = True
            if _option_name(w) in family.stops:
                return form[:i]
    if named:
        return form[:i]
    if family.script and i < len(form) and form[i] != "-":
        return form[: i + 1]
    return ()


def _option_name(word: str) -> str:
    return word.partition("=")[0] if word.startswith("--") else word[:2]


def _option(word: str, family: _Family) -> tuple[str | None, bool]:
    """An option word's kind (None when not known), and whether its value is the next word."""
    if word.startswith("--"):
        name, eq, _ = word.partition("=")
        kind = family.kind(name) or family.kind(word)
        return kind, kind in ("code", "names", "valued") and not eq
    j = 1
    while j < len(word):  # single letters, maybe in a cluster (``-Sc``, ``-lne``)
        kind = family.kind("-" + word[j])
        if kind is None:
            return (family.kind(word), False) if j == 1 else (None, False)
        j += 1
        if kind == "digits":  # perl's ``-0777``, ``-l0``
            j = len(word) - len(word[j:].lstrip("0123456789"))
        elif kind == "attached":
            return (kind, False) if j < len(word) else (None, False)
        elif kind == "optional":
            return kind, False
        elif kind != "flags":
            return kind, j == len(word)  # its value is the rest of the word, or the next one
    return "flags", False


def _deno_or_bun(form: tuple[str, ...], dynamic: frozenset[str]) -> list[Unseen]:
    """deno and bun: code given inline, a script, a REPL; not their other subcommands."""
    name = form[0]
    if all(w in ("--version", "-v", "-V", "--help", "-h") for w in form[1:]):
        return [] if len(form) > 1 or name == "bun" else [Unseen("", "deno starts a REPL on stdin", (), form)]
    at, code = 1, False  # the subcommand (or script): the first word after the global options
    while at < len(form) and form[at].startswith("-"):
        kind, takes_next = _option(form[at], _DENO_BUN)
        code = code or kind == "code"
        at += 2 if takes_next else 1
    sub = form[at] if at < len(form) else None
    quiet = _DENO_QUIET if name == "deno" else _BUN_QUIET
    if not code and (sub in quiet or (sub is None and name == "bun")):
        return []
    if code or sub is None:
        program = _program(form, _DENO_BUN) if code else ()
    elif sub in ("eval", "run", "serve", "x", "exec", "repl"):
        program = _program(form, _DENO_BUN, at + 1)
    else:
        program = form[: at + 1]  # ``deno main.ts``: a script
    why = f"{name} runs code the judge cannot see"
    return [Unseen("", why, () if any(w in dynamic for w in program) else program, form)]


def _awk(form: tuple[str, ...], dynamic: frozenset[str]) -> list[Unseen]:
    """awk's program, from its words or a file, when it may run a command."""
    texts: list[str] = []
    last, i = 0, 1  # ``last``: the index after the last word that holds program or names a file
    sandbox = files = unknown = False
    while i < len(form) and form[i].startswith("-") and form[i] != "-":
        w = form[i]
        if w == "--":
            i += 1
            break
        if w.startswith("--"):
            name, eq, attached = w.partition("=")
            option = next((o for o in _AWK_LONG if o.startswith(name)), None) if len(name) > 2 else None
            valued = option in _AWK_LONG_VALUED
            value = attached if eq else (form[i + 1] if valued and i + 1 < len(form) else "")
            i += 2 if valued and not eq else 1
            letter = {"--source": "e", "--file": "f", "--exec": "f", "--include": "i", "--load": "l"}.get(
                option or "", ""
            )
            sandbox = sandbox or option == "--sandbox"
            unknown = unknown or option is None
        else:
            rest = w[1:].lstrip("".join(_AWK_FLAGS))
            letter, value = rest[:1], ""
            if letter in _AWK_VALUED and letter:
                value = rest[1:] or (form[i + 1] if i + 1 < len(form) else "")
                i += 1 if rest[1:] else 2
            else:
                i += 1
                unknown = unknown or (letter != "" and letter not in _AWK_OPTIONAL)
            if letter == "W":  # mawk's options, gawk's long ones; ``-W exec``, ``-W source=`` run a program
                option = value.split("=", 1)[0].lower()
                sandbox = sandbox or option == "sandbox"
                unknown = unknown or option not in (*_AWK_W, "sandbox")
        if letter in ("e", "f", "E", "i", "l"):
            texts += [value] if letter == "e" else []
            files = files or letter != "e"
            last = i
    if sandbox:
        return []  # gawk --sandbox runs no command; an awk without it refuses the option
    if not texts and not files and not unknown:
        if i >= len(form):
            return []  # no program: awk says how to use it
        texts, last = [form[i]], i + 1
    words = form if unknown or not last else form[:last]
    if any(w in dynamic for w in words):
        return [Unseen("", f"{form[0]} runs a program decided when the line runs", (), form)]
    if files or unknown or any(_awk_runs(text) for text in texts):
        return [Unseen("", f"{form[0]}'s program may run a command the judge cannot see", words, form)]
    return []


def _awk_runs(text: str) -> bool:
    """Whether an awk program may run a command (a backslash-newline joins what it splits)."""
    text = text.replace("\\\n", "")
    return _AWK_RUNS.search(text) is not None or (
        _AWK_PIPE.search(text) is not None and _AWK_PIPED.search(text) is not None
    )


def _sed(form: tuple[str, ...], dynamic: frozenset[str]) -> list[Unseen]:
    """GNU sed's script, from its words or a file, when it may run a command (``e``)."""
    script, last, files, unknown, sandbox = sed_options(form)
    if sandbox:
        return []  # --sandbox refuses e, r and w
    words = form[:last] if last and not unknown else form
    if any(w in dynamic for w in words):
        return [Unseen("", "sed runs a script decided when the line runs", (), form)]
    if files or unknown or sed_runs(script):
        return [Unseen("", "sed's script may run a command the judge cannot see (e)", words, form)]
    return []
