"""``durable-agent console``: the web console (``durable_agent/console/``) on this machine, and
what it reads of the runs' files (``CliSinkFiles``: the CLI's own diff, export and rewind).

The parser (``cli/commands.py``) imports this module only when ``console`` runs.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import io
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from durable_agent.cli.common import err, network
from durable_agent.client import connect
from durable_agent.client import task_queue as default_task_queue
from durable_agent.config import load_config
from durable_agent.console.files import DiffView, FileRow, FilesError, span
from durable_agent.core.errors import DurableAgentError

# The most of a diff the console sends a page; the rest is said to be left out (`durable-agent diff`).
MAX_DIFF_BYTES = 2_000_000


async def _console(args: argparse.Namespace) -> int:
    from durable_agent.console.api import ConsoleState
    from durable_agent.console.app import create_app, running_console
    from durable_agent.console.auth import ConsoleAuthError, check_bind, console_token

    host, port = args.bind
    try:
        token, given = console_token(os.environ)
        check_bind(host, given)
    except ConsoleAuthError as exc:
        err(f"console: {exc}")
        return 2
    config = load_config()  # its [codec] keys decode the runs' payloads, as the workers' do
    client = await connect(config)
    from durable_agent.console.app import codec_note

    state = ConsoleState(
        task_queue=args.task_queue or default_task_queue(),
        namespace=client.namespace,
        temporal_ui=args.temporal_ui,
        codec=codec_note(config.codec),
        sink=args.sink,
    )
    app = create_app(client, token, state, files=CliSinkFiles(args.sink))
    async with running_console(app, host, port) as (url, done):
        # printed once it listens: the link opens at once
        link = f"{url}/" + ("" if given else f"?token={token}")
        print(f"durable-agent console on task queue {state.task_queue!r}: {link}", flush=True)
        if given:
            print(f"the token is AGENT_CONSOLE_TOKEN's: open {link}?token=<it>, or send it as a bearer token")
        print(state.codec, flush=True)
        await done
    return 0


cmd_console = network(_console)


@contextlib.contextmanager
def _sink_read() -> Iterator[None]:
    """What reading a run's files from the sink fails with, as the console answers it: an export
    the sink does not hold (404, ``DiffError``), a sink that lacks or refuses what is read (502)."""
    from durable_agent.cli.diff import DiffError

    try:
        yield
    except DiffError as exc:
        raise FilesError(str(exc), 404) from None
    except (DurableAgentError, OSError, ValueError) as exc:
        raise FilesError(f"{type(exc).__name__}: {exc}", 502) from None


class CliSinkFiles:
    """The console's ``SinkFiles``: the runs' files read as ``durable-agent diff``, ``pack`` and
    ``rewind`` read them (their functions: ``cli/diff.py``, ``cli/exports.py``, ``cli/rewind.py``),
    from the sink of this machine's config (``AGENT_CONFIG``); a diff is read in a shadow
    repository of this machine, never in a workspace.

    Args:
        sink: The sink's name (None: the config's ``default_sink``).
    """

    def __init__(self, sink: str | None = None) -> None:
        self.sink = sink

    def run_diff(self, session_id: str, run_id: str, turn: int | None) -> DiffView:
        """A boundary's diff against the boundary before it, or the run's whole change.

        Args:
            session_id: The run's session.
            run_id: The run (its exports' run id).
            turn: The boundary (None: the whole run, from its base to its last tree).

        Returns:
            The diff, its files' line counts, and a note when there is nothing to compare.

        Raises:
            FilesError: No export of the run, no such turn, or the sink cannot be read.
        """
        from durable_agent.activities.workspaces.diff import diff_stat, reading_repo, run_trees, write_diff
        from durable_agent.activities.workspaces.shadow import default_shadow_root
        from durable_agent.cli.diff import object_sink
        from durable_agent.config import load_config

        ref, events = self._newest(session_id, run_id)
        with _sink_read():
            trees = run_trees(events)
            before, after, note = span(trees, turn)
            call = trees.boundaries[turn - 1] if turn is not None else None
            view: dict[str, Any] = {
                "run_id": run_id,
                "turn": turn,
                "turns": trees.turns,
                "call_id": call.call_id if call else None,
                "tool": call.tool if call else None,
                "before": before,
                "after": after,
                "note": note,
            }
            if after is None:
                return DiffView(**view)
            _, sink = object_sink(ref, self.sink)
            repo = reading_repo(load_config().workspace_checkpoints.path or default_shadow_root())

            async def read() -> tuple[bytes, list[Any]]:
                out = io.BytesIO()
                try:
                    await write_diff(repo, sink, before, after, out)
                    return out.getvalue(), await diff_stat(repo, sink, before, after)
                finally:
                    close = getattr(sink, "aclose", None)  # a PostgreSQL sink's pool
                    if close is not None:
                        await close()

            raw, rows = asyncio.run(read())
        view["files"] = tuple(FileRow(path=r.path, added=r.added, deleted=r.deleted) for r in rows)
        view["diff"] = raw[:MAX_DIFF_BYTES].decode("utf-8", "replace")
        view["truncated"] = len(raw) > MAX_DIFF_BYTES
        if not raw:
            view["note"] = "no change"
        return DiffView(**view)

    def export_events(self, session_id: str, run_id: str) -> list[Any]:
        """The run's events as its newest export in the sink holds them: every event up to that
        boundary (a run that continued as new holds only its newest events itself).

        Returns:
            The ``EventRecord``s, in order.

        Raises:
            FilesError: The sink holds no export of the run, or it cannot be read.
        """
        return self._newest(session_id, run_id)[1]

    def _newest(self, session_id: str, run_id: str) -> tuple[str, list[Any]]:
        """The run's newest export in the sink, and the events it holds.

        Raises:
            FilesError: The sink holds no export of the run (404), or it cannot be read (502).
        """
        from durable_agent.cli.diff import newest_export
        from durable_agent.cli.exports import read_export_ref

        with _sink_read():
            ref = newest_export(self.sink, session_id, run_id)
            return ref, list(read_export_ref(ref, self.sink).open().source_run().events)

    def export_ref(self, session_id: str, run_id: str, turn: int) -> str:
        """The reference of the run's export of ``turn`` in the sink (a file, or ``pg:``).

        Raises:
            FilesError: The sink holds no such export, or cannot be read.
        """
        from durable_agent.cli.exports import session_exports

        with _sink_read():
            name, rows = session_exports(self.sink, session_id)
        found = [where for where, d in rows if d.run_id == run_id and d.turn == turn]
        if not found:
            raise FilesError(f"sink {name!r} holds no export of turn {turn} of run {run_id!r}")
        return found[-1]

    def export_file(self, session_id: str, run_id: str, turn: int) -> tuple[str, bytes]:
        """The run's export of ``turn`` as one portable file (as ``durable-agent pack`` writes it).

        Returns:
            The file's name and its bytes.

        Raises:
            FilesError: No such export, or it does not validate.
        """
        from durable_agent.activities.sink_files import whole_document
        from durable_agent.cli.exports import read_export_ref

        ref = self.export_ref(session_id, run_id, turn)
        with _sink_read():
            export = read_export_ref(ref, self.sink)
            export.open()  # every digest checked: a file handed out is one that resumes
        return f"{run_id}-turn-{turn:06d}.json", whole_document(export)

    def restore_ended(self, workflow_id: str, turn: int) -> tuple[Any, str, str]:
        """An ended run's workspace rebuilt here from its export of ``turn`` (``durable-agent rewind``).

        Returns:
            The export, the workspace folder, and the tree restored.

        Raises:
            FilesError: The run is running, has no export of that turn, or the files cannot be rebuilt.
        """
        from durable_agent.cli.exports import read_export_ref
        from durable_agent.cli.rewind import RewindError, locate, restore_workspace

        args = argparse.Namespace(workflow_id=workflow_id, turn=turn, sink=self.sink, workspace=None)
        with _sink_read():
            try:
                path, workspace = asyncio.run(locate(args))
                export = read_export_ref(path, self.sink)
                tree = restore_workspace(export, Path(workspace), self.sink)
            except RewindError as exc:
                raise FilesError(str(exc), 409) from None
        return export, workspace, tree
