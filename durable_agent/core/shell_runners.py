"""Runners that run a command given as words, and scripts run by their path, for the judge.

For ``shell_programs`` (the ``programs`` era only; the eras before read these lines as they did):

- a runner (``uv run``, ``uvx``, ``npx``, ``poetry run``, ``pipx run``, ``pdm run``, ``hatch
  run``, ``rye run``, ``conda``/``mamba``/``micromamba run``, ``bunx``, ``pnpm exec``/``dlx``,
  ``yarn exec``/``dlx``, ``npm exec``/``x``, ``direnv exec DIR``, ``nix develop``/``shell``
  ``-c``, ``nix-shell --run``, ``flock … -c``) runs the words after its options: they are
  handed back as a script, read for the deny rules and for what they run in turn (``uv run git
  push`` is ``git push``; ``uv run python -c …`` an interpreter's code; ``uv run x.py`` and
  ``uv run -m x``, python's). Where its options are not all known, or ``nix develop`` starts
  a shell on stdin, the place is unseen with an empty start. (``flock``, ``setsid``,
  ``stdbuf``, ``ionice``, ``chrt``, ``taskset`` are wrappers in every era too:
  ``shell_commands.WRAPPERS``.)
- a script run by its path (``./x.sh``, ``bin/deploy``, ``/tmp/x.sh``: a command word with a
  ``/`` that is not in a system directory such as ``/usr/bin``) runs a file the judge cannot
  show, which the model may have just written: an unseen place with an empty start, named by
  its path (``bash(./gradlew:*)``). Through a wrapper (``sudo ./x.sh``) only ``./`` and
  ``../`` paths count, since a wrapper's other words are read as commands only in case.

Not covered: what a runner's project defines (``pdm run test``, ``hatch run cov``, a
``.envrc``, a flake's ``shellHook``), as ``npm run`` is not.

Pure: no I/O.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

from durable_agent.core.shell_git import words
from durable_agent.core.shell_unseen import Unseen


@dataclass(frozen=True)
class _Runner:
    subs: frozenset[str]  # the subcommands that run a command; empty: the name itself does
    flags: frozenset[str]
    valued: frozenset[str]  # the value is the next word, or after ``=`` (short: the rest)
    scripts: frozenset[str] = frozenset()  # the value is a shell string (``npx -c``)
    shell: frozenset[str] = frozenset()  # flags that make the command words a shell line
    python: bool = False  # a first word ``x.py`` (or ``-``) runs python
    module: frozenset[str] = frozenset()  # python's ``-m``: the rest is a module and its words
    script: frozenset[str] = frozenset()  # the command is a python script (``uv run --script``)
    skip: int = 0  # words after the options before the command (``direnv exec DIR``)
    joined: bool = False  # the command words are a shell line (``yarn exec``)


def _runner(
    subs: str,
    flags: str,
    valued: str,
    *,
    scripts: str = "",
    shell: str = "",
    python: bool = False,
    module: str = "",
    script: str = "",
    skip: int = 0,
    joined: bool = False,
) -> _Runner:
    return _Runner(
        words(subs), words(flags), words(valued), scripts=words(scripts), shell=words(shell), python=python,
        module=words(module), script=words(script), skip=skip, joined=joined,
    )  # fmt: skip


_UV_FLAGS = (
    "-q --quiet -v --verbose -n --no-cache --offline --no-progress --native-tls --no-config --preview "
    "--no-python-downloads --managed-python --no-managed-python --no-sync --frozen --locked --isolated "
    "--no-project --all-extras --no-dev --dev --only-dev --all-packages --active --no-active --exact "
    "--no-editable --compile-bytecode --refresh -U --upgrade --reinstall --no-build-isolation --no-build "
    "--no-sources --no-env-file --no-default-groups --all-groups --no-binary"
)
_UV_VALUED = (
    "--with --with-editable --with-requirements -p --python --package --extra --group --only-group "
    "--no-group --env-file --directory --project --index --default-index --index-url -i "
    "--extra-index-url -f --find-links --cache-dir --config-file --color --index-strategy "
    "--keyring-provider --resolution --prerelease --exclude-newer --link-mode -C --config-setting "
    "--python-platform -P --upgrade-package --reinstall-package --from"
)
_CONDA = _runner(
    "run", "-v --verbose -q --quiet --dev --no-capture-output --live-stream -s --no-banner",
    "-n --name -p --prefix --cwd -r --root-prefix",
)  # fmt: skip
_NPM = "-y --yes --no -q --quiet --silent --ignore-existing --workspaces -ws --include-workspace-root"
# read-only: core modules keep no state between runs (tests/test_layers.py)
RUNNERS: Mapping[str, _Runner] = MappingProxyType(
    {
        "uv": _runner(
            "run",
            _UV_FLAGS,
            _UV_VALUED,
            python=True,
            module="-m --module",
            script="-s --script --gui-script",
        ),
        "uvx": _runner("", _UV_FLAGS, _UV_VALUED),
        "npx": _runner("", _NPM, "-p --package", scripts="-c --call"),
        "poetry": _runner(
            "run",
            "-q --quiet -v -vv -vvv --verbose -n --no-interaction --no-ansi --ansi --no-plugins --no-cache",
            "-C --directory -P --project",
        ),
        "pipx": _runner(
            "run",
            "--no-cache --pypackages --system-site-packages -v --verbose -q --quiet --path",
            "--spec --python --index-url -i --pip-args",
            python=True,
        ),
        "pdm": _runner(
            "run",
            "-g --global -v --verbose -q --quiet -s --site-packages --recreate",
            "-p --project --venv --skip",
            python=True,
        ),
        "hatch": _runner(
            "run", "-v --verbose -q --quiet --no-interactive --no-color --color", "-e --env -p --project"
        ),
        "rye": _runner("run", "-v --verbose -q --quiet", "--pyproject"),
        "conda": _CONDA,
        "mamba": _CONDA,
        "micromamba": _CONDA,
        "bunx": _runner("", "--bun -q --quiet", "-p --package"),
        "pnpm": _runner(
            "exec dlx",
            "-r --recursive --parallel -w --workspace-root -s --silent --no-reporter-hide-prefix",
            "-C --dir -F --filter --reporter --package",
            shell="-c --shell-mode",
        ),
        "yarn": _runner("exec dlx", "-q --quiet", "-p --package", joined=True),
        "npm": _runner("exec x", _NPM, "-p --package -w --workspace --prefix", scripts="-c --call"),
        "direnv": _runner("exec", "", "", skip=1),
        "flock": _runner(
            "",
            "-s --shared -x -e --exclusive -u --unlock -n --nb --nonblock -o --close -F --no-fork --verbose",
            "-w --timeout -E --conflict-exit-code",
            scripts="-c --command",
            skip=1,
        ),
    }
)
# A system directory: a command there is named by its last part, as in the eras before.
_SYSTEM = (
    "/bin/",
    "/sbin/",
    "/usr/bin/",
    "/usr/sbin/",
    "/usr/local/bin/",
    "/usr/local/sbin/",
    "/usr/libexec/",
)


def in_path(forms: tuple[tuple[str, ...], ...], dynamic: frozenset[str]) -> list[Unseen]:
    """A script run by its path (see the module docstring), in the command or a wrapper's."""
    found = []
    for at, form in enumerate(forms):
        if _script(at, form[0]):
            program = () if form[0] in dynamic else (form[0],)
            found.append(Unseen("", f"{form[0]} runs a file the judge cannot see", program, form))
    return found


def path_spellings(forms: tuple[tuple[str, ...], ...]) -> dict[tuple[str, ...], tuple[str, ...]]:
    """The spellings by last part of the scripts run by their path (``python -m x`` for
    ``.venv/bin/python -m x``), to the spelling with the path."""
    return {(f[0].rsplit("/", 1)[1], *f[1:]): f for at, f in enumerate(forms) if _script(at, f[0])}


def by_path(unseen: list[Unseen], form: tuple[str, ...]) -> list[Unseen]:
    """What a program reached by a path runs is named by that path (``bash(.venv/bin/python -m
    pytest:*)``), as the path itself is: its last part names a file the judge cannot see."""
    return [Unseen(u.start, u.why, (form[0], *u.program[1:]) if u.program else (), form) for u in unseen]


def _script(at: int, name: str) -> bool:
    if "/" not in name or (at and not name.startswith(("./", "../"))):
        return False
    return not (name.startswith(_SYSTEM) and "/." not in name and "//" not in name)


def in_runner(form: tuple[str, ...], dynamic: frozenset[str]) -> tuple[list[Unseen], list[str]]:
    """What a runner runs: unseen places, and the scripts it runs (see the module docstring)."""
    name = form[0]
    if name in ("nix", "nix-shell"):
        return _nix(form, dynamic)
    runner = RUNNERS[name]
    i, known = 1, True
    if runner.subs:  # ``uv [options] run``, ``uv tool run``
        i, known, _, _ = _options(form, i, runner)
        if name == "uv" and form[i : i + 2] == ("tool", "run"):
            i, runner = i + 2, RUNNERS["uvx"]
        elif i >= len(form) or form[i] not in runner.subs:
            if known or not any(w in runner.subs for w in form):
                return [], []
            return [_unknown(form)], []
        else:
            i += 1
    start = i
    i, known_too, scripts, mode = _options(form, i, runner)
    if not known or not known_too:
        return [_unknown(form)], []
    i += runner.skip
    if name == "flock" and i < len(form) and not scripts:  # ``flock FILE -c CMD``: options after the file
        i, known_too, scripts, mode = _options(form, i, runner)
        if not known_too:
            return [_unknown(form)], []
    if any(w in dynamic for w in form[start:i]):
        return [Unseen("", f"{name} runs what is decided when the line runs", (), form)], []
    command = form[i:] if i < len(form) else ()
    if name == "flock" and scripts:
        command = ()  # ``flock FILE -c CMD``: the string is all it runs
    elif mode in ("module", "script") or (runner.python and command[:1] and _python_script(command[0])):
        command = ("python", *(("-m",) if mode == "module" else ()), *command)
    elif name == "hatch" and command and ":" in command[0]:
        command = (command[0].split(":", 1)[1], *command[1:])  # ``hatch run ENV:SCRIPT``
    unseen = []
    if (at := next((k for k, w in enumerate(command) if w in dynamic), None)) is not None:
        unseen.append(Unseen(" ".join(command[:at]), f"{command[at]!r} is decided when it runs"))
    if command:
        joined = runner.joined or mode == "shell"
        scripts.append(" ".join(command) if joined else shlex.join(command))
    return unseen, scripts


def _python_script(word: str) -> bool:
    return word == "-" or word.endswith((".py", ".pyw"))


def _unknown(form: tuple[str, ...]) -> Unseen:
    return Unseen("", f"{form[0]}'s options are not all known: what it runs is unseen", form, form)


def _options(form: tuple[str, ...], i: int, runner: _Runner) -> tuple[int, bool, list[str], str]:
    """Read options from ``i``: where they end, whether all were known, the shell strings they
    give, and how the command runs: ``""``, as python's ``"module"`` or ``"script"``, or ``"shell"``."""
    scripts: list[str] = []
    mode = ""
    while i < len(form) and form[i].startswith("-") and form[i] != "-":
        w = form[i]
        if w == "--":
            return i + 1, True, scripts, mode
        name, eq, value = w.partition("=") if w.startswith("--") else (w[:2], "", w[2:])
        if name in runner.valued or name in runner.scripts:
            if not value and not eq:
                value = form[i + 1] if i + 1 < len(form) else ""
                i += 1
            if name in runner.scripts:
                scripts.append(value)
        elif w in runner.module:
            return i + 1, True, scripts, "module"
        elif w in runner.script:
            mode = "script"
        elif w in runner.shell:
            mode = "shell"
        elif w not in runner.flags and (
            w.startswith("--") or not all("-" + c in runner.flags for c in w[1:])
        ):
            return i, False, scripts, mode
        i += 1
    return i, True, scripts, mode


def _nix(form: tuple[str, ...], dynamic: frozenset[str]) -> tuple[list[Unseen], list[str]]:
    """``nix develop``/``shell`` ``-c CMD…``, ``nix-shell --run CMD``; without, a shell on stdin."""
    if form[0] == "nix":
        if len(form) < 2 or form[1] not in ("develop", "shell"):
            return [], []
        at = next((k for k, w in enumerate(form) if w in ("-c", "--command")), None)
        if at is None:
            return [Unseen("", f"nix {form[1]} starts a shell on stdin", (), form)], []
        command = form[at + 1 :]
        unseen = (
            [Unseen("", "nix runs a command decided when the line runs")] if dynamic & set(command) else []
        )
        return unseen, [shlex.join(command)] if command else []
    for k, w in enumerate(form[:-1]):
        if w in ("--run", "--command"):
            return [], [form[k + 1]]
    return [Unseen("", "nix-shell starts a shell on stdin", (), form)], []
