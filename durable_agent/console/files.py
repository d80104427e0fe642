"""What a run did to its files, as the console shows them: a boundary's or a run's diff, an
export as a file, an ended run's rewind; and ``SinkFiles``, what reads them from the sink.

``durable-agent console`` hands the application its ``SinkFiles`` (``cli/console.py``): the
functions of ``durable-agent diff``, ``pack`` and ``rewind``, which are the CLI's (the top layer,
which the console below it does not import). Its methods are synchronous (a PostgreSQL sink
runs its own event loop), so the API calls them in a thread.
"""

from __future__ import annotations

from typing import Any, Protocol

from pydantic import BaseModel, ConfigDict


class FilesError(Exception):
    """The files cannot be shown or rewound; ``status`` is the HTTP status to answer with."""

    def __init__(self, message: str, status: int = 404) -> None:
        super().__init__(message)
        self.status = status


class FileRow(BaseModel):
    """One changed file: its path, and its lines added and deleted (None: a binary file)."""

    model_config = ConfigDict(frozen=True)

    path: str
    added: int | None
    deleted: int | None


class DiffView(BaseModel):
    """A boundary's change (``turn``), or the whole run's (``turn`` None)."""

    model_config = ConfigDict(frozen=True)

    run_id: str
    turn: int | None
    turns: int
    call_id: str | None = None
    tool: str | None = None
    before: str | None = None
    after: str | None = None
    files: tuple[FileRow, ...] = ()
    diff: str = ""
    truncated: bool = False
    note: str | None = None  # why there is nothing to show, or where the base came from


def span(trees: Any, turn: int | None) -> tuple[str | None, str | None, str | None]:
    """The trees to compare and a note, as ``durable-agent diff`` picks them.

    Args:
        trees: The run's ``RunTrees`` (``activities/workspaces/diff.py``).
        turn: The boundary (None: the whole run).

    Returns:
        The tree before (None: none), the tree after (None: nothing to compare), and a note.

    Raises:
        FilesError: The run has no such turn.
    """
    if turn is not None:
        if not 1 <= turn <= trees.turns:
            raise FilesError(f"the run has no turn {turn} (its turns: 1 to {trees.turns})")
        before, after = trees.at(turn - 1), trees.at(turn)
        if after is None:
            return None, None, f"no workspace tree was recorded by turn {turn}"
        if before is None:
            return None, None, f"turn {turn}'s call recorded the run's first tree; there is none before it"
        return before, after, None
    final, first = trees.final, trees.first_recorded()
    if final is None:
        return None, None, "the run recorded no workspace tree: its calls changed no file"
    if trees.base is None and first is not None:
        note = f"base not recorded: from turn {first.turn}'s tree (that call's own changes are not shown)"
        return first.recorded, final, note
    return trees.base, final, None


class SinkFiles(Protocol):
    """What reads a run's files from the sink for the console (``cli/console.py`` has the CLI's)."""

    def run_diff(self, session_id: str, run_id: str, turn: int | None) -> DiffView:
        """A boundary's diff against the boundary before it (None: the run's whole change)."""
        ...

    def export_events(self, session_id: str, run_id: str) -> list[Any]:
        """The run's ``EventRecord``s as its newest export holds them."""
        ...

    def export_file(self, session_id: str, run_id: str, turn: int) -> tuple[str, bytes]:
        """The export of ``turn`` as one portable file: its name and bytes."""
        ...

    def restore_ended(self, workflow_id: str, turn: int) -> tuple[Any, str, str]:
        """An ended run's workspace rebuilt here from ``turn``'s export: the export, the folder, the tree."""
        ...
