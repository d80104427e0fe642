"""``[workspaces] setup``: the command a copy of a run's workspace gets on each machine before its
first call there (install the dependencies), and again when its key files change.

The command runs in the sandbox, in the copy, as the ``bash`` tool runs its commands
(``tools/command_run.py``), once a call's copy is at the run's tree (``WorkspaceCopies.enter``).
Its key is the command and the contents of the files ``setup_key`` names (a lockfile): this
machine keeps, in the copy's shadow repository, the key of the last setup that succeeded there,
and runs the command again only when the key differs, so a copy restored on a new machine, or
whose lockfile a call changed, is set up, and the next calls are not. What it makes (``node_modules``,
a virtualenv) is the machine's cache: the workspace's ``.gitignore`` should leave it out, or the
next boundary records it. A failure is told to the model with the call's output, and the
command runs again before the next call.
"""

from __future__ import annotations

import hashlib
import subprocess
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from durable_agent.activities.tools.command_run import run_command
from durable_agent.activities.tools.tool import ToolFailure
from durable_agent.activities.workspaces.shadow import ShadowRepo
from durable_agent.config import SandboxConfig, WorkspacesConfig

__all__ = ["WorkspaceSetup"]

_KEY = "durable-agent-setup"  # in the shadow's git folder: the key of the last setup that succeeded
_SHOWN = 2000  # the most of the command's stderr the model is shown


@dataclass(frozen=True)
class WorkspaceSetup:
    """The worker's ``[workspaces] setup`` (see the module's docstring).

    Args:
        config: ``[workspaces]``.
        sandbox: Where the command runs (the ``bash`` tool's ``[sandbox]``).
        redact: The worker's credentials, kept out of what the model is told.
    """

    config: WorkspacesConfig
    sandbox: SandboxConfig
    redact: Callable[[str], str] = field(default=str)

    def key(self, workspace: Path) -> str:
        """The command and its key files' contents, as one digest (a file that is not there counts too)."""
        digest = hashlib.sha256((self.config.setup or "").encode())
        for name in self.config.setup_key:
            digest.update(b"\0" + name.encode() + b"\0")
            try:
                digest.update(hashlib.sha256((workspace / name).read_bytes()).digest())
            except OSError:
                digest.update(b"absent")
        return digest.hexdigest()

    async def ensure(self, repo: ShadowRepo, workspace: Path) -> str | None:
        """Run the command in ``workspace`` unless this machine did for its key.

        Args:
            repo: The copy's shadow repository (where the key is kept).
            workspace: The copy.

        Returns:
            What the model is told (a paragraph, starting with a blank line), or None: nothing ran.
        """
        command = self.config.setup
        if command is None:
            return None
        key = self.key(workspace)
        mark = repo.git_dir / _KEY
        try:
            if mark.read_text(encoding="ascii").strip() == key:
                return None
        except (OSError, UnicodeDecodeError):
            pass
        try:
            ran = await run_command(
                command, self.sandbox, workspace, self.config.setup_seconds, head=_SHOWN, tail=_SHOWN
            )
        except (ToolFailure, OSError, subprocess.SubprocessError) as exc:  # told, not raised
            why = self.redact(str(exc))
            return f"\n\n[The workspace's setup `{command}` could not run on this machine: {why}]"
        if ran.code == 0:
            mark.write_text(key + "\n", encoding="ascii")
            return (
                f"\n\n[The workspace's setup `{command}` ran on this machine first (the copy is new here, "
                "or its key files changed).]"
            )
        why = f"timed out after {ran.timeout:g} s" if ran.timed_out else f"exit code {ran.code}"
        said = self.redact(ran.stderr.strip() or ran.stdout.strip())[-_SHOWN:]
        return (
            f"\n\n[The workspace's setup `{command}` failed on this machine ({why}); it runs again "
            f"before the next call. Its output:\n{said}]"
        )
