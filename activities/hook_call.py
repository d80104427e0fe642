"""The ``agent.hook`` activity: one ``[hooks]`` command, run as the ``bash`` tool runs its commands.

The command runs as ``/bin/bash -c COMMAND`` in the run's workspace, in the sandbox
``[sandbox]`` configures (``tools/command_run.py``, as ``tools/bash.py`` runs its own: the same
allowlisted environment, scratch HOME and TMPDIR, bounds, and a process tree that dies with
the call), with the hook's JSON document (``durable_agent.core.hooks.HookDocument``) on stdin
and ``CLAUDE_PROJECT_DIR`` and ``AGENT_PROJECT_DIR`` naming the workspace. Its stdout and
stderr are kept apart, each bounded to its first and last bytes, and redacted.

A hook's own failure (an exit code other than 0 and 2, a timeout) is an outcome, never a
failure of the activity: ``"error"``, recorded, and the run goes on. Only what keeps the hook
from running at all on this worker (a sandbox that cannot start, a workspace that is gone)
fails the activity, which Temporal tries again (``[timeouts] hook_max_attempts``); a repeat
runs the command again, as for ``bash``. A cancel stops the command and everything it
started before the activity ends.
"""

from __future__ import annotations

import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from temporalio import activity
from temporalio.exceptions import ApplicationError

from durable_agent.activities.redact import Redactor
from durable_agent.activities.support import heartbeating
from durable_agent.activities.tools.command_run import run_command
from durable_agent.activities.tools.tool import ToolFailure
from durable_agent.activities.workspace_tree import WorkspaceTooLarge
from durable_agent.activities.workspaces.copies import Held, WorkspaceCopies
from durable_agent.activities.workspaces.holds import entered, left
from durable_agent.config import SandboxConfig
from durable_agent.core.activity_api import HOOK
from durable_agent.core.hooks import (
    HOOK_OUTPUT_HEAD_BYTES,
    HOOK_OUTPUT_TAIL_BYTES,
    HookInput,
    HookOutcome,
    decide,
)


@dataclass(eq=False)
class HookCalls:
    """Runs the run's hooks in this worker's sandbox.

    Args:
        sandbox: Where the commands run (``sandbox_settings(config)``, as the ``bash`` tool's).
        redact: The worker's credentials, kept out of the outcome.
    """

    sandbox: SandboxConfig
    redact: Redactor = field(default_factory=Redactor)
    # keeps this machine's copy of a run's workspace at the run's tree (None: never followed)
    copies: WorkspaceCopies | None = None

    @activity.defn(name=HOOK.name)
    async def hook(self, inp: HookInput) -> HookOutcome:
        """Run one hook with its document on stdin; its exit code decides (``core.hooks.decide``).

        Args:
            inp: The hook, its document and its time limit.

        Returns:
            The outcome: "continue", "block" (with the hook's stderr as the reason) or "error".

        Raises:
            ApplicationError: The hook could not be run on this worker (retried by Temporal).
        """
        started = time.monotonic()
        copies = self.copies if inp.expect_tree is not None else None
        held: Held | None = None
        if copies is not None:
            assert inp.expect_tree is not None
            held = await entered(copies, inp.workspace, inp.expect_tree, inp.sink, inp.host, inp.take_over)
            if held is None:
                return HookOutcome(decision="continue", elsewhere=True, host=copies.host)
        try:
            outcome = await heartbeating(self._run(inp))
        except BaseException as exc:
            if copies is not None and held is not None:
                await copies.leave(held, None, record=False)
            if not isinstance(exc, (ToolFailure, OSError, subprocess.SubprocessError)):
                raise
            activity.logger.warning(
                "hook %s[%d] of run %s not run: %s", inp.event, inp.index, inp.run_id, exc
            )
            raise ApplicationError(self.redact(f"the hook could not be run: {exc}")) from None
        update: dict[str, Any] = {}
        if copies is not None and held is not None:
            # a hook may change files: the tree it left, its objects in the sink, before it returns
            try:
                state = await left(copies, held, inp.sink, self.redact)
            except WorkspaceTooLarge as exc:  # the hook's changes undone: recorded as its error
                update.update(decision="error", reason=f"{exc}: the hook's changes to files were undone")
                state = None
            update.update(workspace=state, host=copies.host, restored=held.restored)
        return outcome.model_copy(
            update={
                **update,
                "duration_ms": int((time.monotonic() - started) * 1000),
                "completed_at_ms": int(time.time() * 1000),
            }
        )

    async def _run(self, inp: HookInput) -> HookOutcome:
        ran = await run_command(
            inp.hook.command,
            self.sandbox,
            Path(inp.workspace),
            inp.timeout_seconds,
            stdin=inp.document.model_dump_json().encode(),
            folder_vars=("CLAUDE_PROJECT_DIR", "AGENT_PROJECT_DIR"),
            head=HOOK_OUTPUT_HEAD_BYTES,
            tail=HOOK_OUTPUT_TAIL_BYTES,
        )
        stdout, stderr = self.redact(ran.stdout), self.redact(ran.stderr)
        if ran.timed_out:
            reason = f"timed out after {ran.timeout:g} s; it and every process it started were stopped"
            return HookOutcome(decision="error", stdout=stdout, stderr=stderr, reason=reason, timed_out=True)
        code = ran.code
        assert code is not None
        if code < 0:
            reason = f"killed by signal {-code}"
            return HookOutcome(decision="error", exit_code=code, stdout=stdout, stderr=stderr, reason=reason)
        decision, why = decide(code, stderr)
        return HookOutcome(decision=decision, exit_code=code, stdout=stdout, stderr=stderr, reason=why)
