"""Run workspaces a worker makes from a source (docs/workspaces.md): a folder of the run's own
under ``[workspaces] root``, holding a git repository's ref or a tree of an earlier run.

``workspace = {git = "<url or path>", ref = "main"}``: the repository is fetched into a cache of
bare mirrors on this machine (``<root>/.git-cache/<digest of the url>.git``: cloned once, fetched
again for each run, its objects shared by every run from it), and the ref's tree is written into
the run's folder with ``git read-tree -u`` on an index of its own, so the folder holds the files
and no ``.git``. ``workspace = {tree = "<tree id>"}``: the tree is restored from the run's sink,
as any machine restores a run's copy (a fork of an earlier run: its final tree, or any
boundary's).

Only the protocols ``GIT_ALLOW_PROTOCOL`` names are fetched (file, git, http, https, ssh: never
``ext::``, which runs a command), a url is never read as an option, git asks for no password and
reads no user or system settings: credentials come from the worker's environment alone.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

from durable_agent.activities.store.session_store import name_under
from durable_agent.activities.workspaces.errors import WorkspaceTreeError
from durable_agent.config import WorkspacesConfig
from durable_agent.core.run_workspace import GitSource

__all__ = ["branch_name", "checkout_ref", "commit_and_push", "default_root", "fetched", "run_folder"]

_ENV = {
    "GIT_CONFIG_GLOBAL": os.devnull,
    "GIT_CONFIG_NOSYSTEM": "1",
    "GIT_TERMINAL_PROMPT": "0",
    "GIT_ALLOW_PROTOCOL": "file:git:http:https:ssh",
    "LC_ALL": "C",
}


def default_root(config: WorkspacesConfig) -> Path:
    """``[workspaces] root``, or ``$XDG_STATE_HOME/durable-agent/workspaces``."""
    if config.root is not None:
        return config.root
    state = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    return Path(state) / "durable-agent" / "workspaces"


def branch_name(template: str, session_id: str) -> str:
    """``[workspaces] branch`` for a session: ``{session}`` replaced, and what a branch's name may
    not hold (spaces, ``..``, ``~^:?*[\\``, a leading ``-``) made ``-``.

    Args:
        template: ``[workspaces] branch`` (``agent/{session}``).
        session_id: The run's session.

    Returns:
        The branch's name.
    """
    name = template.replace("{session}", session_id)
    name = re.sub(r"[^A-Za-z0-9._/-]+", "-", name).replace("..", "-").strip("/-.")
    return re.sub(r"/+", "/", name) or "agent"


def run_folder(root: Path, session_id: str, run_id: str) -> Path:
    """A run's own folder under ``root`` (``<session>/<run>``; its children's below its own).

    Args:
        root: ``[workspaces] root``.
        session_id: The run's session.
        run_id: The run.

    Returns:
        The folder, made.
    """
    folder = root / name_under(root, session_id) / name_under(root, run_id)
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def _git(*args: str, git_dir: Path | None = None, env: dict[str, str] | None = None) -> str:
    full = {k: v for k, v in os.environ.items() if k not in ("GIT_DIR", "GIT_WORK_TREE", "GIT_INDEX_FILE")}
    full.update(_ENV)
    full.update(env or {})
    command = ["git", *([f"--git-dir={git_dir}"] if git_dir is not None else []), *args]
    try:
        done = subprocess.run(command, capture_output=True, env=full, check=False)
    except OSError as exc:
        raise WorkspaceTreeError(f"cannot run git: {exc}") from None
    if done.returncode != 0:
        message = done.stderr.decode("utf-8", "replace").strip().splitlines()
        raise WorkspaceTreeError(f"git {args[0]} failed: {message[-1] if message else done.returncode}")
    return done.stdout.decode("utf-8", "replace").strip()


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    """One fetch of a mirror at a time on this machine, whatever process asks."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def fetched(root: Path, source: GitSource) -> Path:
    """The machine's mirror of ``source``'s repository, fetched now (cloned the first time).

    Args:
        root: ``[workspaces] root``.
        source: The repository and ref.

    Returns:
        The mirror's folder.

    Raises:
        WorkspaceTreeError: git could not clone or fetch it (the message says why).
    """
    key = hashlib.sha256(source.git.encode("utf-8")).hexdigest()[:32]
    cache = root / ".git-cache" / f"{key}.git"
    with _locked(cache.with_suffix(".lock")):
        if (cache / "HEAD").exists():
            _git("fetch", "--quiet", "--prune", "origin", git_dir=cache)
        else:
            partial = Path(tempfile.mkdtemp(prefix=f"{key}.", suffix=".partial", dir=cache.parent))
            try:
                _git("clone", "--quiet", "--mirror", "--", source.git, str(partial / "repo.git"))
                (partial / "repo.git").rename(cache)  # whole or not at all, for the next run
            finally:
                shutil.rmtree(partial, ignore_errors=True)
    return cache


def checkout_ref(cache: Path, ref: str, folder: Path) -> tuple[str, str]:
    """Write the files of ``ref``'s tree into ``folder`` (an index of its own, no ``.git``).

    Args:
        cache: The mirror (``fetched``).
        ref: A branch, a tag or a commit.
        folder: The run's folder.

    Returns:
        The ref's commit and its tree.

    Raises:
        WorkspaceTreeError: The mirror has no such ref.
    """
    if ref.startswith("-"):
        raise WorkspaceTreeError(f"ref {ref!r} is not a branch, a tag or a commit")
    try:
        commit = _git(
            "rev-parse", "--verify", "--quiet", "--end-of-options", f"{ref}^{{commit}}", git_dir=cache
        )
        tree = _git("rev-parse", "--verify", "--quiet", f"{commit}^{{tree}}", git_dir=cache)
    except WorkspaceTreeError:
        raise WorkspaceTreeError(f"the repository has no ref {ref!r}") from None
    with tempfile.TemporaryDirectory(prefix="index-") as scratch:
        env = {"GIT_INDEX_FILE": str(Path(scratch) / "index"), "GIT_WORK_TREE": str(folder)}
        _git("read-tree", "--reset", "-u", tree, git_dir=cache, env=env)
    return commit, tree


def commit_and_push(
    shadow: Path, cache: Path, url: str, parent: str, tree: str, branch: str, message: str, at_seconds: int
) -> str:
    """A commit of ``tree`` on ``parent``, made in the run's shadow repository (which reads the
    parent through the mirror's objects), pushed to ``branch`` of the repository at ``url``.

    Args:
        shadow: The run's shadow repository (its git folder), which holds ``tree``'s objects.
        cache: The repository's mirror on this machine (``fetched``), which holds ``parent``.
        url: The repository, as the run's source named it.
        parent: The commit the run's workspace was made from.
        tree: The run's final tree.
        branch: The branch to push to (made, or moved on: never forced). Where it is already
            there and went on from ``parent`` (an earlier run of the session pushed it), the
            commit is made on it instead.
        message: The commit's message.
        at_seconds: The commit's time (epoch seconds): the same commit for the same change.

    Returns:
        The commit's id.

    Raises:
        WorkspaceTreeError: git could not make or push it (the message says why: a branch that
            moved meanwhile, refused credentials).
    """
    alternates = shadow / "objects" / "info" / "alternates"
    alternates.parent.mkdir(parents=True, exist_ok=True)
    wanted = str((cache / "objects").resolve())
    held = alternates.read_text().splitlines() if alternates.exists() else []
    if wanted not in held:
        alternates.write_text("\n".join([*held, wanted]) + "\n")
    who = {
        "GIT_AUTHOR_NAME": "durable-agent",
        "GIT_AUTHOR_EMAIL": "durable-agent@localhost",
        "GIT_COMMITTER_NAME": "durable-agent",
        "GIT_COMMITTER_EMAIL": "durable-agent@localhost",
        "GIT_AUTHOR_DATE": f"{at_seconds} +0000",
        "GIT_COMMITTER_DATE": f"{at_seconds} +0000",
    }
    head = _branch_head(cache, branch)
    if head is not None and _git("rev-parse", f"{head}^{{tree}}", git_dir=cache) == tree:
        return head  # already there: an attempt again after one whose push went through
    if head is not None and _descends(cache, head, parent):
        # the session's branch, pushed by an earlier run of it (one a rewind or a resume went on
        # from): this change follows it, with the run's files, as a fast-forward
        parent = head
    commit = _git("commit-tree", tree, "-p", parent, "-m", message, git_dir=shadow, env=who)
    _git("push", "--quiet", "--", url, f"{commit}:refs/heads/{branch}", git_dir=shadow)
    return commit


def _branch_head(cache: Path, branch: str) -> str | None:
    """``branch``'s commit in the mirror as last fetched (None: no such branch)."""
    try:
        return _git("rev-parse", "--verify", "--quiet", f"refs/heads/{branch}", git_dir=cache)
    except WorkspaceTreeError:
        return None


def _descends(cache: Path, commit: str, ancestor: str) -> bool:
    try:
        _git("merge-base", "--is-ancestor", ancestor, commit, git_dir=cache)
    except WorkspaceTreeError:
        return False
    return True
