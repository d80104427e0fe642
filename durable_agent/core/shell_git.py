"""What git, and a variable a program reads, runs that a line's words do not show.

For ``shell_programs``. git runs more than its words say:

- an alias: a subcommand that is not one of git's own commands may be an alias, which runs
  what git's config says (``git config alias.p push; git p``): unseen, with start ``git`` (a
  deny rule ``git push:*`` could match it, ``curl:*`` could not), and named by ``git p``;
- config given on the line (``git -c KEY=VALUE``, ``--config-env``): a key outside a list of
  harmless ones may run a command (``alias.*``, ``core.pager``, ``core.sshCommand``,
  ``include.path``, ``filter.*.clean``, ``credential.helper``, …). Where the value is a
  command git hands a shell (a pager, an editor, a diff driver…), it is read as a script
  (``ran``: ``git -c core.pager=cat log`` is judged as ``cat``); any other key is unseen;
  ``--exec-path=DIR`` too (git runs its commands from there);
- options and subcommands that run a command (``rebase --exec``, ``bisect run``, ``submodule
  foreach``, ``clone --upload-pack``, ``filter-branch --tree-filter``, …): read as scripts;
  ``--template`` (hooks to copy) is unseen;
- variables: a command in ``GIT_EDITOR``, ``GIT_PAGER``, ``GIT_SSH_COMMAND``, ``PAGER``,
  ``EDITOR`` … is read as a script (with ``"$@"`` after it, as git runs an editor); other
  ``GIT_*`` variables but harmless ones (``GIT_AUTHOR_NAME``, ``GIT_DIR`` …) and
  ``LD_PRELOAD``, ``NODE_OPTIONS``, ``PERL5OPT``, ``RUBYOPT`` are unseen.

What the repository's own config, hooks or a crafted ``--git-dir`` hold is not read: a file
written by one call and run by the next is beyond any reading of the line.

Pure: no I/O.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping
from types import MappingProxyType

from durable_agent.core.shell_unseen import Unseen


def words(text: str) -> frozenset[str]:
    """The words of ``text``: long lists of names, written as text."""
    return frozenset(text.split())


# git's own commands: ``git help -a`` on git 2.39.5 (Debian), the commands that its git package
# installs (``git --list-cmds=main``), and ``git --list-cmds=builtins``. git ignores an alias
# whose name is one of its commands, so none of these is an alias. Commands packaged apart
# (``send-email``, ``svn``, ``gui``, ``citool``, ``gitk``, ``p4``, ``cvs*``, ``scalar``) are
# left out: where one is not installed, an alias of its name runs. A command added to git
# later reads as a possible alias, which fails closed.
GIT_COMMANDS = words(
    """
    add am annotate apply archive bisect bisect--helper blame branch bugreport bundle cat-file
    check-attr check-ignore check-mailmap check-ref-format checkout checkout--worker
    checkout-index cherry cherry-pick clean clone column commit commit-graph commit-tree config
    count-objects credential credential-cache credential-cache--daemon credential-store daemon
    describe diagnose diff diff-files diff-index diff-tree difftool env--helper fast-export
    fast-import fetch fetch-pack filter-branch fmt-merge-msg for-each-ref for-each-repo
    format-patch fsck fsck-objects fsmonitor--daemon gc get-tar-commit-id grep hash-object help
    hook http-backend http-fetch http-push imap-send index-pack init init-db instaweb
    interpret-trailers log ls-files ls-remote ls-tree mailinfo mailsplit maintenance merge
    merge-base merge-file merge-index merge-octopus merge-one-file merge-ours merge-recursive
    merge-recursive-ours merge-recursive-theirs merge-resolve merge-subtree merge-tree mergetool
    mktag mktree multi-pack-index mv name-rev notes pack-objects pack-redundant pack-refs
    patch-id pickaxe prune prune-packed pull push quiltimport range-diff read-tree rebase
    receive-pack reflog remote remote-ext remote-fd remote-ftp remote-ftps remote-http
    remote-https repack replace request-pull rerere reset restore rev-list rev-parse revert rm
    send-pack shell shortlog show show-branch show-index show-ref sparse-checkout stage stash
    status stripspace submodule submodule--helper subtree switch symbolic-ref tag unpack-file
    unpack-objects update-index update-ref update-server-info upload-archive
    upload-archive--writer upload-pack var verify-commit verify-pack verify-tag version
    whatchanged worktree write-tree
    """
)
# git's global options that take the next word as their value.
_VALUE_OPTIONS = words("-C -c --git-dir --work-tree --namespace --config-env --super-prefix")

# Config keys git -c may set without running anything: every key of these sections...
_SAFE_SECTIONS = words(
    """
    user author committer color advice column i18n status log blame grep pull push fetch commit
    tag rebase branch gc feature index pack transfer checkout clone am apply format notes pretty
    reset stash worktree versionsort rerere repack http safe
    """
)
# ...these keys without a subsection, but the listed ones...
_PLAIN_SECTIONS = frozenset({"diff", "merge", "init", "submodule"})
_NOT_PLAIN = words("diff.external diff.tool diff.guitool merge.tool merge.guitool init.templatedir")
# ...and these.
_SAFE_KEYS = words(
    """
    core.quotepath core.autocrlf core.safecrlf core.filemode core.ignorecase core.abbrev core.eol
    core.longpaths core.symlinks core.precomposeunicode core.untrackedcache core.commentchar
    core.commentstring core.whitespace core.preloadindex core.excludesfile core.logallrefupdates
    core.trustctime core.checkstat core.splitindex core.compression core.bigfilethreshold
    core.warnambiguousrefs core.sparsecheckout core.multipackindex core.commitgraph
    protocol.version
    """
)
# Keys whose value is a command git hands a shell, by (section, name), any subsection.
_COMMAND_KEYS = frozenset(
    {
        ("core", "pager"), ("core", "editor"), ("core", "sshcommand"), ("core", "askpass"),
        ("core", "gitproxy"), ("core", "fsmonitor"), ("sequence", "editor"), ("diff", "external"),
        ("diff", "textconv"), ("diff", "command"), ("merge", "driver"), ("filter", "clean"),
        ("filter", "smudge"), ("filter", "process"), ("gpg", "program"),
        ("interactive", "difffilter"), ("difftool", "cmd"), ("mergetool", "cmd"),
    }
)  # fmt: skip

# Options of a subcommand whose value is a command git runs (long options also abbreviated,
# as git's option parser takes them), and subcommands that run their words as a command.
_COMMAND_OPTIONS: Mapping[str, tuple[str, tuple[str, ...]]] = MappingProxyType({
    "rebase": ("x", ("--exec",)),
    "clone": ("u", ("--upload-pack",)),
    "fetch": ("", ("--upload-pack",)),
    "pull": ("", ("--upload-pack",)),
    "ls-remote": ("", ("--upload-pack",)),
    "push": ("", ("--receive-pack", "--exec")),
    "archive": ("", ("--exec",)),
    "difftool": ("x", ("--extcmd",)),
    "grep": ("O", ("--open-files-in-pager",)),
    "send-email": ("", ("--to-cmd", "--cc-cmd", "--header-cmd", "--sendmail-cmd")),
    "filter-branch": (
        "",
        ("--setup", "--env-filter", "--tree-filter", "--index-filter", "--parent-filter",
         "--msg-filter", "--commit-filter", "--tag-name-filter"),
    ),
})  # fmt: skip
_COMMAND_WORDS: Mapping[str, str] = MappingProxyType({"bisect": "run", "submodule": "foreach"})

# Variables whose value is a command a program hands a shell (git, man, less, ssh…).
_COMMAND_VARIABLES = words(
    """
    GIT_EDITOR GIT_SEQUENCE_EDITOR GIT_PAGER GIT_SSH_COMMAND GIT_SSH GIT_ASKPASS GIT_EXTERNAL_DIFF
    GIT_PROXY_COMMAND SSH_ASKPASS EDITOR VISUAL PAGER MANPAGER LESSOPEN LESSCLOSE
    """
)
# ``GIT_*`` variables that run nothing; the other ones may (``GIT_CONFIG_*``, ``GIT_EXEC_PATH``,
# ``GIT_TEMPLATE_DIR``).
_SAFE_GIT_VARIABLES = re.compile(
    r"GIT_(?:AUTHOR|COMMITTER)_(?:NAME|EMAIL|DATE)|GIT_TRACE\w*|GIT_TERMINAL_PROMPT|GIT_OPTIONAL_LOCKS"
    r"|GIT_CURL_VERBOSE|GIT_SSL_NO_VERIFY|GIT_MERGE_AUTOEDIT|GIT_FLUSH|GIT_DIFF_OPTS|GIT_ADVICE"
    r"|GIT_NO_REPLACE_OBJECTS|GIT_(?:LITERAL|GLOB|NOGLOB|ICASE)_PATHSPECS|GIT_REFLOG_ACTION"
    r"|GIT_PROGRESS_DELAY|GIT_HTTP_\w+|GIT_LFS_SKIP_SMUDGE|GIT_DIR|GIT_WORK_TREE|GIT_INDEX_FILE"
    r"|GIT_CEILING_DIRECTORIES|GIT_DISCOVERY_ACROSS_FILESYSTEM|GIT_OBJECT_DIRECTORY|GIT_NAMESPACE"
    r"|GIT_ALTERNATE_OBJECT_DIRECTORIES|GIT_COMMON_DIR|GIT_DEFAULT_HASH|GIT_PAGER_IN_USE"
)
# Other variables that make a program load code the line does not show.
_CODE_VARIABLES = words("LD_PRELOAD LD_AUDIT DYLD_INSERT_LIBRARIES NODE_OPTIONS PERL5OPT RUBYOPT")
# A shell hands a command's words after it as ``"$@"`` (an editor's file, an alias' words).
_ARGUMENTS = ' "$@"'


def in_git(form: tuple[str, ...], dynamic: frozenset[str]) -> tuple[list[Unseen], list[str]]:
    """What one spelling of a ``git`` command runs beyond its words.

    Args:
        form: the spelling, ``git`` first.
        dynamic: the words whose value is decided when the line runs.

    Returns:
        The unseen places, and the literal scripts git hands a shell (read for the rules).
    """
    unseen: list[Unseen] = []
    ran: list[str] = []
    i = 1
    while i < len(form) and form[i].startswith("-") and form[i] != "--":
        option, _, attached = form[i].partition("=")
        value = form[i + 1] if option in _VALUE_OPTIONS and not attached and i + 1 < len(form) else None
        if option == "-c" and value is not None:
            found, scripts = _config(value, literal=value not in dynamic, form=form)
            unseen += found
            ran += scripts
        elif option == "--config-env":
            key = (attached if "=" in form[i] else value or "").split("=", 1)[0]
            unseen += _config(key + "=", literal=False, form=form)[0]  # its value is the environment's
        elif option == "--exec-path" and "=" in form[i]:
            unseen.append(Unseen("", "git --exec-path= runs git's commands from a folder", form, form))
        i += 2 if value is not None else 1
    if i >= len(form) or form[i] in dynamic:
        return unseen, ran  # no subcommand, or one built when the line runs (``shell_unseen``)
    sub = form[i]
    if sub not in GIT_COMMANDS:
        why = f"git {sub!r} is not a git command: an alias runs what git's config says"
        unseen.append(Unseen("git", why, form[: i + 1], form))
    found, scripts = _subcommand(sub, form[i + 1 :], dynamic, form)
    return unseen + found, ran + scripts


def _config(setting: str, *, literal: bool, form: tuple[str, ...]) -> tuple[list[Unseen], list[str]]:
    """``-c KEY=VALUE``: nothing for a harmless key; a script for a command key; else unseen."""
    key, has_value, value = setting.partition("=")
    parts = key.split(".")
    section, name = parts[0].lower(), parts[-1].lower()
    subsection = len(parts) > 2
    plain = f"{section}.{name}"
    if len(parts) >= 2 and (
        section in _SAFE_SECTIONS
        or (section in _PLAIN_SECTIONS and not subsection and plain not in _NOT_PLAIN)
        or (not subsection and plain in _SAFE_KEYS)
        or (section == "protocol" and subsection and parts[1].lower() != "ext" and name == "allow")
    ):
        return [], []
    if literal and has_value and value and (section, name) in _COMMAND_KEYS:
        return [], [value + _ARGUMENTS]
    start = "git" if section == "alias" and literal and not value.startswith("!") else ""
    return [Unseen(start, f"git -c {key} may run a command the judge cannot see", form, form)], []


def _subcommand(
    sub: str, args: tuple[str, ...], dynamic: frozenset[str], form: tuple[str, ...]
) -> tuple[list[Unseen], list[str]]:
    """The commands a subcommand's options or words hand a shell, and its unseen options."""
    values: list[str] = []
    ran: list[str] = []
    letters, longs = _COMMAND_OPTIONS.get(sub, ("", ()))
    for i, w in enumerate(args):
        if w == "--":
            break
        following = args[i + 1] if i + 1 < len(args) else ""
        name, eq, attached = w.partition("=")
        value = attached if eq else following
        if sub in ("clone", "init") and _abbreviates(name, "--template"):
            return [Unseen("", f"git {sub} --template copies hooks the judge cannot see", form, form)], []
        if sub == "clone" and (name == "-c" or _abbreviates(name, "--config")):
            found, scripts = _config(value, literal=value not in dynamic, form=form)
            if found:
                return found, []
            ran += scripts
        elif any(_abbreviates(name, option) for option in longs):
            values.append(value)
        elif w.startswith("-") and not w.startswith("--") and letters:
            # a short option, maybe in a cluster (``-ix CMD``): its value is the rest, or the next word
            at = next((w.index(c, 1) for c in letters if c in w[1:]), None)
            if at is not None:
                values.append(w[at + 1 :] or following)
    after = _COMMAND_WORDS.get(sub)
    if after in args:
        # ``git bisect run CMD ARGS``: git hands a shell ``CMD "$@"``, with ARGS as its words
        words = [w for w in args[args.index(after) + 1 :] if w not in ("--recursive", "--quiet", "-q")]
        if any(w in dynamic for w in words):
            return [Unseen("", f"git {sub} {after} runs words decided when the line runs", form, form)], []
        if words:
            values.append(" ".join([words[0], *map(shlex.quote, words[1:])]))
    if any(v in dynamic for v in values):
        return [Unseen("", f"git {sub} runs a command decided when the line runs", form, form)], []
    return [], ran + [v + _ARGUMENTS for v in values if v]


def _abbreviates(name: str, option: str) -> bool:
    """Whether ``name`` is ``option`` or a start of it that git's option parser may take for it."""
    return len(name) >= 3 and name.startswith("--") and option.startswith(name)


def in_variable(name: str, value: str | None) -> tuple[list[Unseen], list[str]]:
    """A variable set on the line that a program runs, or that makes it load code.

    Args:
        name: the variable's name.
        value: its literal value, or None when it is decided when the line runs.

    Returns:
        The unseen places, and the scripts its value holds (read for the rules).
    """
    if name in _COMMAND_VARIABLES:
        if value is None:
            return [Unseen("", f"{name} holds a command decided when the line runs")], []
        return [], [value + _ARGUMENTS] if value else []
    if name in _CODE_VARIABLES or (name.startswith("GIT_") and not _SAFE_GIT_VARIABLES.fullmatch(name)):
        return [Unseen("", f"{name} makes a program run code the judge cannot see")], []
    return [], []
